"""The Engine: the handful of verbs an algorithm is written against (STYLE example 1).

    engine.summary                          n, Σw, per-feature mean and variance, max |x| (first pass)
    engine.reduce(step, params, combine)    run a step on every chunk; its fields combined as declared
                                            (``combine.py``: Sum by default, Fold, Rows, Min/Max,
                                            ArgMin/ArgMax, Top), on the workers; the driver gets the result
    engine.state(key, builder, model)       per-chunk state, built now, rebuilt from ``model()`` on any
                                            partition rebuilt after a lost worker, dropped at the end
    engine.take(ids)                        rows by global id
    engine.working_set(X, w, entropy)       an Engine over a small weighted set drawn from this one
    engine.overhead_ms()                    the cost of one empty iteration

A step is a module-level function ``step(chunk, params)`` (see ``partition.Chunk``). Every call is one
round trip: one message from the driver to the root partition, a tree of partitions on the workers, one
finished result back (rule 2). What the driver receives per call is the size of the combined result,
whatever the number of chunks or workers (a ``Rows`` or ``Fold`` field excepted: their size is what the
step makes it).
"""
import contextlib
import itertools
import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..kernels.stats import chunk_summary, fixed_top_exponent
from . import config
from .cluster import IN_PROCESS, backend_for
from .combine import Fold, Max, Min, Rows, Sum
from .data import InputError, as_source
from .partition import Call, pop_state


@dataclass(frozen=True)
class Summary:
    """What the first pass learns about the data (float64)."""

    n_samples: int
    total_weight: float
    mean: np.ndarray
    var: np.ndarray
    max_abs: float


NO_ROW = np.iinfo(np.int64).max
# the first pass: rows, Σx, Σx², Σw in chunk order (the bits every later tolerance is scaled by), max |x|,
# the first non-finite row and the first chunk with a bad weight
SUMMARY = (Sum(), Fold(), Fold(), Fold(), Max(), Min(), Min())


def _summary_step(chunk, params):
    d = chunk.x.shape[1]
    sums, sumsq = np.empty(d), np.empty(d)
    max_abs, bad = chunk_summary(chunk.x, sums, sumsq)
    w = chunk.w
    w_ok = bool(np.all(np.isfinite(w)) and np.all(w >= 0))
    return (np.int64(chunk.x.shape[0]), sums, sumsq, float(w.sum()) if w_ok else 0.0, max_abs,
            np.int64(NO_ROW if bad < 0 else chunk.start + bad), np.int64(NO_ROW if w_ok else chunk.index))


def _take_step(chunk, ids):
    lo, hi = np.searchsorted(ids, [chunk.start, chunk.stop])
    return ids[lo:hi], chunk.x[ids[lo:hi] - chunk.start]


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
        self._states = {}          # key -> (builder, model): replayed on a rebuilt partition
        self._ids = itertools.count()
        self.round_trips = 0  # calls to the partitions: with overhead_ms(), the fit's engine overhead
        self.top = None
        self.summary = self._first_pass()
        self.top = fixed_top_exponent(self.summary.total_weight, self.n_features, self.summary.max_abs)

    @property
    def n_workers(self):
        return self.backend.n_workers

    def _builders(self):
        return [(builder, model()) for builder, model in self._states.values()]

    def _call(self, step, params=None, combine=None, state=False):
        self.round_trips += 1
        return self.backend.call(Call(next(self._ids), step, params, combine, self.top, state), self._builders)

    def _first_pass(self):
        n, sums, sumsq, total_w, max_abs, bad, bad_w = self.reduce(_summary_step, combine=SUMMARY)
        if bad != NO_ROW:
            i = int(np.searchsorted(self.source.starts, bad, side="right")) - 1
            raise InputError(f"Input contains NaN or infinity at row {bad} (chunk {i}, row "
                             f"{bad - int(self.source.starts[i])} of the chunk)")
        if bad_w != NO_ROW:
            raise InputError(f"sample_weight has a negative, NaN or infinite value in chunk {bad_w} "
                             f"(rows {self.source.starts[bad_w]}..{self.source.starts[bad_w + 1] - 1})")
        if not total_w > 0:
            raise InputError("sample_weight must have a positive sum")
        mean = sums / n
        var = np.maximum(sumsq / n - mean * mean, 0.0)
        return Summary(n, total_w, mean, var, max_abs)

    # -- verbs
    def reduce(self, step, params=None, combine=None):
        """``step(chunk, params)`` on every chunk, its fields combined by ``combine`` (one per field; None:
        every field an exact ``Sum``); returns the tuple of combined fields."""
        return self._call(step, params, combine)

    @contextlib.contextmanager
    def state(self, key, builder, model=lambda: None, *, build=True):
        """Per-chunk state ``key`` for the block: ``builder(chunk, model())`` runs on every chunk now
        (``build``; else the first step makes it) and on the chunks of any partition rebuilt after a lost
        worker, with ``model()`` as it is then. The state is dropped everywhere when the block ends."""
        self._states[key] = (builder, model)
        try:
            if build:
                self._call(builder, model(), state=True)
            yield
        except BaseException:
            self._states.pop(key, None)
            raise
        self._states.pop(key, None)
        self._call(pop_state, key, state=True)

    def take(self, ids):
        """Rows at the given global ids (any order, repeats allowed), as a (len(ids), d) array."""
        ids = np.asarray(ids, dtype=np.int64)
        uniq, inverse = np.unique(ids, return_inverse=True)
        _, rows = self.reduce(_take_step, uniq, (Rows(), Rows()))
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
                "rebuilds": self.backend.n_rebuilds, "round_trips": self.round_trips}


@contextlib.contextmanager
def open_engine(source, client=None, entropy=0):
    """An Engine over ``source`` for the duration of a fit (see ``cluster.backend_for`` for ``client``)."""
    with backend_for(source, client, entropy) as backend:
        yield Engine(backend, source)
