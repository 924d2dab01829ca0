"""The Engine: the handful of verbs an algorithm is written against (STYLE example 1).

    engine.summary                      n, Σw, per-feature mean and variance, max |x| (first pass)
    engine.reduce(step, params)         run a step on every chunk; exact sum of the partials
    engine.map(step, params)            run a step on every chunk; the results in chunk order
    engine.init_state(step, params)     build per-chunk state, remembered to rebuild lost partitions
    engine.take(ids)                    rows by global id
    engine.working_set(X, w, entropy)   an Engine over a small weighted set drawn from this one
    engine.overhead_ms()                the cost of one empty iteration

A step is a module-level function ``step(chunk, params)`` (see ``partition.Chunk``). Every call is one
round trip, one call per worker (rule 2).
"""
import contextlib
import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..kernels.stats import chunk_summary, fixed_top_exponent, from_fixed
from . import config
from .cluster import IN_PROCESS, backend_for
from .data import InputError, as_source
from .partition import add_encoded


@dataclass(frozen=True)
class Summary:
    """What the first pass learns about the data (float64)."""

    n_samples: int
    total_weight: float
    mean: np.ndarray
    var: np.ndarray
    max_abs: float


def tree_combine(parts, add, split_every=None):
    """Combine partials with ``add`` in a tree of fan-in ``split_every`` (dask_clust config)."""
    split_every = int(split_every or config.get("split-every"))
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    while len(parts) > 1:
        nxt = []
        for g in range(0, len(parts), split_every):
            acc = parts[g]
            for p in parts[g + 1: g + split_every]:
                acc = add(acc, p)
            nxt.append(acc)
        parts = nxt
    return parts[0]


def decode(encoded, top):
    out = []
    for kind, shape, data in encoded:
        if kind == "f":
            flat = np.empty(data.shape[0])
            from_fixed(data, top, flat)
            out.append(flat.reshape(shape) if shape else flat[0])
        else:
            out.append(data.reshape(shape) if shape else int(data[0]) if data.ndim else int(data))
    return tuple(out)


def _summary_step(chunk, params):
    d = chunk.x.shape[1]
    sums, sumsq = np.empty(d), np.empty(d)
    max_abs, bad = chunk_summary(chunk.x, sums, sumsq)
    w = chunk.w
    w_ok = bool(np.all(np.isfinite(w)) and np.all(w >= 0))
    return chunk.x.shape[0], sums, sumsq, float(w.sum()) if w_ok else np.nan, max_abs, int(bad), w_ok


def _take_step(chunk, ids):
    lo, hi = np.searchsorted(ids, [chunk.start, chunk.stop])
    return ids[lo:hi], chunk.x[ids[lo:hi] - chunk.start]


def _pop_state(chunk, key):
    chunk.state.pop(key, None)


def _empty_step(chunk, params):
    return ()


class Engine:
    """Verbs over the partitions of one input; built by ``open_engine``."""

    def __init__(self, backend, source):
        self.backend = backend
        self.source = source
        self.n_samples = source.n_samples
        self.n_features = source.n_features
        self.dtype = source.dtype
        self.n_chunks = source.n_chunks
        self._builders = {}
        self.round_trips = 0  # calls to the partitions: with overhead_ms(), the fit's engine overhead
        self.summary = self._first_pass()
        self.top = fixed_top_exponent(self.summary.total_weight, self.n_features, self.summary.max_abs)

    @property
    def n_workers(self):
        return self.backend.n_workers

    def _call(self, method, *args):
        self.round_trips += 1
        return self.backend.call(method, *args, builders=list(self._builders.values()))

    def _first_pass(self):
        per_chunk = self.map(_summary_step)
        n = 0
        sums = np.zeros(self.n_features)
        sumsq = np.zeros(self.n_features)
        total_w, max_abs = 0.0, 0.0
        for i, (rows, s, s2, w, m, bad, w_ok) in enumerate(per_chunk):
            if bad >= 0:
                row = int(self.source.starts[i]) + bad
                raise InputError(f"Input contains NaN or infinity at row {row} (chunk {i}, row {bad} of the chunk)")
            if not w_ok:
                raise InputError(f"sample_weight has a negative, NaN or infinite value in chunk {i} "
                                 f"(rows {self.source.starts[i]}..{self.source.starts[i + 1] - 1})")
            n += rows
            sums += s
            sumsq += s2
            total_w += w
            max_abs = max(max_abs, m)
        if not total_w > 0:
            raise InputError("sample_weight must have a positive sum")
        mean = sums / n
        var = np.maximum(sumsq / n - mean * mean, 0.0)
        return Summary(n, total_w, mean, var, max_abs)

    # -- verbs
    def reduce(self, step, params=None):
        """Exact sum over all chunks of ``step(chunk, params)`` (a tuple of arrays / scalars)."""
        parts = self._call("reduce", step, params, self.top)
        return decode(tree_combine(parts, add_encoded), self.top)

    def map(self, step, params=None):
        """``step(chunk, params)`` for every chunk, in chunk order."""
        pairs = [pair for part in self._call("map", step, params) for pair in part]
        return [r for _, r in sorted(pairs, key=lambda p: p[0])]

    def init_state(self, step, params=None, key=None):
        """Run a state builder on every chunk and remember it, so a rebuilt partition gets the same state."""
        self.set_rebuild(step, params, key)
        self._call("init_state", step, params)

    def set_rebuild(self, step, params=None, key=None):
        """Remember how to rebuild one kind of per-chunk state from the model (rule 1), without running it."""
        self._builders[key or step.__name__] = (step, params)

    def clear_state(self, key):
        """Free one kind of per-chunk state everywhere and stop rebuilding it."""
        self._builders.pop(key, None)
        self._call("init_state", _pop_state, key)

    def take(self, ids):
        """Rows at the given global ids (any order, repeats allowed), as a (len(ids), d) array."""
        ids = np.asarray(ids, dtype=np.int64)
        uniq, inverse = np.unique(ids, return_inverse=True)
        got = self.map(_take_step, uniq)
        rows = np.concatenate([r for _, r in got]) if got else np.empty((0, self.n_features), self.dtype)
        return rows[inverse]

    @contextlib.contextmanager
    def working_set(self, X, weights, entropy):
        """An Engine over a weighted set drawn from this one (a coreset, a sample): in this process when it
        fits (rule 6: no cluster round trips; chunks of ``working-set-chunk-rows`` for the threads), else
        chunked on this engine's cluster."""
        small = X.nbytes <= config.get_bytes("in-process-bytes")
        source = as_source(X, weights, chunk_rows=int(config.get("working-set-chunk-rows")) if small else None)
        client = IN_PROCESS if small else getattr(self.backend, "client", IN_PROCESS)
        with open_engine(source, client, entropy) as engine:
            yield engine

    def empty_iteration_ms(self):
        """Wall time of one empty iteration (a reduce of an empty step over every partition), in ms."""
        t = time.perf_counter()
        self.reduce(_empty_step)
        return 1000.0 * (time.perf_counter() - t)

    def overhead_ms(self, repeats=20):
        """Median of ``repeats`` empty iterations after two warm-up ones, in milliseconds."""
        times = [self.empty_iteration_ms() for _ in range(repeats + 2)]
        return statistics.median(times[2:])

    def partitions(self):
        """Per partition: (rows, memory of the worker that holds it, bytes): what per-row state may cost."""
        return self.backend.partitions(self.source)

    def describe(self):
        return {"backend": self.backend.kind, "workers": self.n_workers, "threads": self.backend.threads,
                "chunks": self.n_chunks, "streaming": self.backend.streaming,
                "rebuilds": getattr(self.backend, "n_rebuilds", 0), "round_trips": self.round_trips}


@contextlib.contextmanager
def open_engine(source, client=None, entropy=0):
    """An Engine over ``source`` for the duration of a fit (see ``cluster.backend_for`` for ``client``)."""
    with backend_for(source, client, entropy) as backend:
        yield Engine(backend, source)
