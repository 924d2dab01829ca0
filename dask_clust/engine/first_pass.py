"""The engine's first pass over its rows: the checks every fit makes of its input (a NaN or inf named by row and
column, a bad weight by chunk, values whose sums would overflow float64), the summary later passes are
scaled by (n, Σw, the per-feature mean and variance, max |x|), per chunk Σ w, Σ w x and Σ w ||x||² (the
lightweight coreset's chunk shares), and the exponent of the fixed-point grid every exact float ``Sum`` is
made on. ``Engine.reduce`` runs it before the first call that needs it, or with one that reads every row."""

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..kernels.assign import is_csr
from ..kernels.sparse import csr_summary, csr_weighted_moments
from ..kernels.stats import chunk_summary, fixed_top_exponent, weighted_moments
from .combine import ArgMax, Fold, Min, Rows, Sum


@dataclass(frozen=True)
class Summary:
    """What the first pass learns about the data (float64)."""

    n_samples: int
    total_weight: float
    mean: np.ndarray
    var: np.ndarray
    max_abs: float


NO_ROW = np.iinfo(np.int64).max
# log2 of the largest sum a fit may form: float64's range (2^1023) less the fixed-point grid's headroom
MAX_EXPONENT = 960
# the first pass: rows, Σx, Σx², Σw in chunk order (the bits every later tolerance is scaled by), max |x|
# with its first row, the first non-finite value and the first chunk with a bad weight; per chunk, Σ w, Σ w x
# and Σ w ||x||² (``Engine.chunk_moments``)
SUMMARY = (Sum(), Fold(), Fold(), Fold(), ArgMax(), Min(), Min(), Rows(), Rows(), Rows())


def _moments(x, w, w_ok, sums, sumsq, wx):
    """``chunk_summary`` and ``weighted_moments`` (when the weights are ``w_ok``) of dense or CSR rows: (max |x|,
    its row, the first non-finite value's row and column, or -1s, Σ w ||x||²)."""
    if is_csr(x):
        max_abs, at, bad, column = csr_summary(x.indptr, x.indices, x.data, sums, sumsq)
        wxx = csr_weighted_moments(x.indptr, x.indices, x.data, w, wx) if bad < 0 and w_ok else 0.0
        return max_abs, at, bad, column, wxx
    max_abs, at, bad = chunk_summary(x, sums, sumsq)
    column = int(np.argmin(np.isfinite(x[bad]))) if bad >= 0 else -1
    return max_abs, at, bad, column, weighted_moments(x, w, wx) if bad < 0 and w_ok else 0.0


def summary_step(chunk, params):
    d = chunk.x.shape[1]
    sums, sumsq, wx = np.empty(d), np.empty(d), np.zeros(d)
    w = chunk.w
    w_ok = bool(np.all(np.isfinite(w)) and np.all(w >= 0))
    max_abs, at, bad, column, wxx = _moments(chunk.x, w, w_ok, sums, sumsq, wx)
    return (
        np.int64(chunk.x.shape[0]),
        sums,
        sumsq,
        float(w.sum()) if w_ok else 0.0,
        (np.array([max_abs]), np.array([chunk.start + at], np.int64)),
        # the first non-finite value as row·D + column: the least is the first row's first such column
        np.int64(NO_ROW if bad < 0 else (chunk.start + bad) * d + column),
        np.int64(NO_ROW if w_ok else chunk.index),
        np.array([w.sum()]),
        wx[None, :],
        np.array([wxx]),
    )


def carrying(chunk, params):
    """The first pass's fields, then ``step``'s, from one read of the chunk (``reduce(..., first_pass="with")``)."""
    step, step_params = params
    return summary_step(chunk, None) + tuple(step(chunk, step_params))


class FirstPass:
    """What the first pass learnt about ``source``'s rows, once it has run (``done``): ``summary``, the grid's
    exponent ``top`` and the chunks' ``moments``. An engine given a summary and grid (a reorder's, which
    keeps its origin's) makes none, and has no chunk moments."""

    def __init__(self, source, summary=None, top=None):
        self.source = source
        self.summary, self.top, self.moments = summary, top, None

    @property
    def done(self):
        return self.summary is not None

    def learn(self, fields):
        """The first pass's fields: the summary, the chunks' moments and the grid, after the checks every fit
        makes of its input (nothing else is trusted until they pass)."""
        n, sums, sumsq, total_w, (max_abs, at), bad, bad_w, *moments = fields
        max_abs, at = float(max_abs[0]), int(at[0])
        if bad != NO_ROW:
            row, column = divmod(int(bad), self.source.n_features)
            raise InputError(f"Input contains NaN or infinity at {self.where(row)}, column {column} (from 0)")
        if bad_w != NO_ROW:
            raise InputError(
                f"sample_weight has a negative, NaN or infinite value in chunk {bad_w} "
                f"(rows {self.source.starts[bad_w]}..{self.source.starts[bad_w + 1] - 1})"
            )
        if not total_w > 0:
            raise InputError("sample_weight must have a positive sum; got weights that are all zero")
        # every exact sum is bounded by W·D·(2 max|x| + 1)² (``fixed_top_exponent``): it must be a float64
        d = self.source.n_features
        if math.log2(max(total_w, 1.0)) + math.log2(d) + 2 * math.log2(2 * max_abs + 1) > MAX_EXPONENT:
            raise InputError(
                f"Input values reach {max_abs:.3g} in magnitude (at {self.where(at)}): sums of "
                "squared distances over these rows would overflow float64; rescale the data (e.g. "
                "scikit-learn's StandardScaler)"
            )
        mean = sums / n
        var = np.maximum(sumsq / n - mean * mean, 0.0)
        self.moments = tuple(moments)
        self.top = fixed_top_exponent(total_w, d, max_abs)
        self.summary = Summary(n, total_w, mean, var, max_abs)

    def where(self, row):
        """A global row as the user finds it: its index, its chunk and its row within the chunk."""
        i = int(np.searchsorted(self.source.starts, row, side="right")) - 1
        return f"row {row:,} (chunk {i}, row {row - int(self.source.starts[i]):,} of the chunk)"
