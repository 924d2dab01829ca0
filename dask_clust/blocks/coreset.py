"""Lightweight coresets: a weighted sample on which any weighted algorithm runs.

O. Bachem, M. Lucic, A. Krause, "Scalable k-Means Clustering via Lightweight Coresets", KDD 2018,
doi:10.1145/3219819.3219973.

  1. u = the (weighted) mean of X                                   pass 1 (the engine's first pass)
  2. d²_n = ||x_n − u||², q_n = ½ w_n/Σw + ½ w_n d²_n/Σ w d²         pass 2: per-chunk masses
  3. N' rows i.i.d. ∝ q with replacement, weight w_n/(N' q_n)       per-chunk Multinomial counts,
                                                                    then local sampling per chunk
Duplicates stay separate rows; Σ weights ≈ Σw (unbiased). All rows equal (Σ w d² = 0): q = w/Σw.
Input sample weights generalise the paper's unit weights (w_n = 1 gives its q and 1/(N' q)).

``uniform_sample`` draws the same way with q = w/Σw (every row weighing Σw/size): vc-GMM re-estimates its
means on such a sample (``algorithms/vcgmm.py: refit_means``).
"""

import contextlib
import time

import numpy as np

from .. import progress
from .._random import stream
from ..engine.combine import Fold, Rows
from ..errors import InvalidParameterError
from ..kernels.assign import update_mind
from ..kernels.sampling import draw_proportional


def _weighted_sums(chunk, params):
    return chunk.w @ chunk.x.astype(np.float64), float(chunk.w.sum())


def _d2(chunk, u):
    d2 = np.full(chunk.x.shape[0], np.inf)
    update_mind(chunk.x, u, d2)
    return d2


def chunk_masses(s, w):
    """A chunk's Σ w d² and Σ w, per chunk (for the per-chunk counts) and summed in chunk order (MASSES)."""
    return np.array([s]), np.array([w]), s, w


MASSES = (Rows(), Rows(), Fold(), Fold())


def proposal_masses(s, w, S, W):
    """Each chunk's share of q = ½ w d²/Σ w d² + ½ w/Σ w (all of it ∝ w when Σ w d² = 0), from the
    chunks' Σ w d² (s), Σ w (w) and their totals: the proposal of the coreset and of AFK-MC2."""
    return 0.5 * s / S + 0.5 * w / W if S > 0 else w / W


def proposal(w, d2, S, W):
    """Per row, q = ½ w d²/S + ½ w/W (∝ w when S = Σ w d² is 0): the proposal of the lightweight coreset and
    of AFK-MC2's chains (Bachem et al., KDD 2018 and NeurIPS 2016), whose chunk shares are
    ``proposal_masses``."""
    return 0.5 * w * d2 / S + 0.5 * w / W if S > 0 else w / W


def _masses(chunk, u):
    """Pass 2: this chunk's Σ w d² and Σ w (MASSES)."""
    return chunk_masses(float(np.dot(chunk.w, _d2(chunk, u))), float(chunk.w.sum()))


def _sample(chunk, params):
    """Draw this chunk's count of rows ∝ q (S = 0: ∝ w); return (rows, their weights). Needs no state (d² is
    computed again), so it also runs as a one-shot task where the chunk's rows live."""
    u, counts, S, W, size, tag = params
    m = int(counts[chunk.index])
    if m == 0:
        return chunk.x[:0], np.empty(0)
    q = proposal(chunk.w, _d2(chunk, u) if S > 0 else None, S, W)
    idx = np.sort(draw_proportional(q, chunk.rng(tag), m))
    return chunk.x[idx], chunk.w[idx] / (size * q[idx])


def mean(engine):
    """Pass 1: the weighted mean of the rows (the engine's first pass already has it when unweighted)."""
    if getattr(engine.source, "weights", None) is None:
        return engine.summary.mean
    sx, sw = engine.reduce(_weighted_sums)
    return sx / sw


def coreset_draw(engine, size, entropy):
    """Passes 1 and 2: how many of the ``size`` rows each chunk draws, and the parameters of ``_sample``
    that draws them (the driver handles per-chunk counts, never rows)."""
    u = mean(engine)[None, :]
    s, w, S, W = engine.reduce(_masses, u, MASSES)
    masses = proposal_masses(s, w, S, W)
    counts = stream(entropy, "coreset", "counts").multinomial(size, masses / masses.sum())
    return (u, counts, S, W, size, "coreset"), counts


def _chunk_weight(chunk, _):
    return (np.array([float(chunk.w.sum())]),)


@contextlib.contextmanager
def uniform_sample(engine, size, entropy):
    """An engine over ``size`` rows drawn ∝ w with replacement, each weighing Σw/size (an unbiased sample
    of the rows' mass, like the coreset with q = w/Σw). The driver handles per-chunk Σw and counts."""
    (w,) = engine.reduce(_chunk_weight, None, (Rows(),))
    counts = stream(entropy, "uniform", "counts").multinomial(size, w / w.sum())
    sub_entropy = int(stream(entropy, "uniform", "engine").integers(2**63))
    with engine.sample(_sample, (None, counts, 0.0, float(w.sum()), size, "uniform"), counts, sub_entropy) as rows:
        yield rows


def lightweight_coreset(engine, size, entropy):
    """``size`` rows drawn ∝ q with replacement and their weights: (rows in the data's dtype, float64),
    brought to this process."""
    params, _ = coreset_draw(engine, size, entropy)
    return engine.reduce(_sample, params, (Rows(), Rows()))


def default_size(n_samples, n_clusters):
    """The vc-GMM paper's default N' = min(N, max(2^15, 64·C))."""
    return int(min(n_samples, max(2**15, 64 * n_clusters)))


@contextlib.contextmanager
def working_set(engine, size, entropy, n_clusters, phases=None):
    """The engine an algorithm iterates on: a lightweight coreset of ``size`` rows (one partition when it
    fits one worker), or ``engine`` itself when ``size`` is None. Records phases["coreset"] (seconds) when
    given a dict."""
    phases = {} if phases is None else phases
    if size is not None and n_clusters > size:
        raise InvalidParameterError(
            f"n_clusters={n_clusters} exceeds coreset_size={size}: a coreset needs "
            f"at least one row per cluster (use coreset_size >= n_clusters or None)"
        )
    if size is None:
        phases["coreset"] = 0.0
        yield engine
        return
    t = time.perf_counter()
    with contextlib.ExitStack() as stack:
        with progress.phase(f"coreset of {size:,} rows", 1, "draw") as shown:
            params, counts = coreset_draw(engine, size, entropy)
            sub_entropy = int(stream(entropy, "coreset", "engine").integers(2**63))
            work = stack.enter_context(engine.sample(_sample, params, counts, sub_entropy))
            shown.update()
        phases["coreset"] = time.perf_counter() - t
        yield work
