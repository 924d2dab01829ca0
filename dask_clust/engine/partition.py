"""Partition: one per worker, holding its row chunks and their per-algorithm state (DESIGN rule 1-2).

Rows are held in memory, or, for data larger than the cluster's memory (rule 4), a chunk holds only
its loader (the chunk's pickled dask graph, e.g. a zarr or parquet read) and loads its rows for the
duration of each step; its state stays resident either way.

A step is a module-level function ``step(chunk, params)`` of an algorithm; it sees one ``Chunk`` (rows,
weights, global offset, its own state dict, its own random streams). The partition runs the step over
all of its chunks on the worker's threads and returns either one combined partial (``reduce``) or the
per-chunk results (``map``).
"""
import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..kernels.stats import N_WORDS, fixed_add, to_fixed
from .data import stream


class Chunk:
    """One row chunk as a step sees it: rows ``x`` (n × d), weights ``w`` (n,), global rows
    ``start``..``stop``, its own ``state`` dict and random streams."""

    __slots__ = ("index", "start", "stop", "x", "w", "state", "entropy", "loader")

    def __init__(self, index, start, stop, data, entropy):
        """data: (x, w) rows held in memory, or bytes: a pickled dask object computing (x, w)."""
        self.index = int(index)
        self.start = int(start)
        self.stop = int(stop)
        self.state = {}
        self.entropy = entropy
        self.loader = data if isinstance(data, bytes) else None
        self.x = self.w = None
        if self.loader is None:
            self._hold(*data)

    def _hold(self, x, w):
        self.x = x
        self.w = np.ones(x.shape[0]) if w is None else w

    def run(self, step, params):
        if self.loader is None:
            return step(self, params)
        self._hold(*pickle.loads(self.loader).compute(scheduler="sync"))
        try:
            return step(self, params)
        finally:
            self.x = self.w = None

    def rng(self, *tag):
        """This chunk's random stream for ``tag``: independent of which worker holds the chunk."""
        return stream(self.entropy, *tag, self.index)


# ---------------------------------------------------------------- exact partial encoding

def encode(partial, top):
    """A step's partial (tuple of arrays/scalars; float fields are sums) in exact form.

    Float fields become fixed-point words (``kernels.stats``), integer fields int64; both then add
    associatively, so any combine order gives the same bits.
    """
    out = []
    for field in partial:
        a = np.asarray(field)
        if a.dtype.kind == "f":
            flat = np.ascontiguousarray(a, dtype=np.float64).ravel()
            words = np.empty((flat.size, N_WORDS), dtype=np.int64)
            if to_fixed(flat, top, words):
                raise FloatingPointError(
                    f"a partial sum is not finite or exceeds 2^{top}; the data's scale was misjudged"
                )
            out.append(("f", a.shape, words))
        else:
            out.append(("i", a.shape, a.astype(np.int64, copy=True)))
    return out


def add_encoded(acc, other):
    """acc += other (both from ``encode``); returns acc."""
    if acc is None:
        return other
    for (kind, _, a), (_, _, b) in zip(acc, other):
        if kind == "f":
            fixed_add(a, b)
        else:
            a += b
    return acc


class Partition:
    """Long-lived holder of row chunks on one worker (a Dask Actor on a cluster, a plain object in-process)."""

    def __init__(self, meta, *blocks):
        """meta: {"chunks": [(index, start, stop), ...], "entropy": int, "threads": int};
        blocks: per chunk, (x, w) rows or a loader (see ``Chunk``)."""
        self.chunks = [Chunk(i, a, b, data, meta["entropy"]) for (i, a, b), data in zip(meta["chunks"], blocks)]
        threads = max(1, int(meta.get("threads", 1)))
        self._pool = ThreadPoolExecutor(threads) if threads > 1 and len(self.chunks) > 1 else None

    def _each(self, step, params):
        if self._pool is None:
            return [c.run(step, params) for c in self.chunks]
        return list(self._pool.map(lambda c: c.run(step, params), self.chunks))

    def reduce(self, step, params, top):
        """Run ``step`` on every chunk and return the exact sum of the partials."""
        acc = None
        for part in self._each(step, params):
            acc = add_encoded(acc, encode(part, top))
        return acc

    def map(self, step, params):
        """Run ``step`` on every chunk; return [(chunk index, result), ...]."""
        return [(c.index, r) for c, r in zip(self.chunks, self._each(step, params))]

    def init_state(self, step, params):
        """Run a state-building step on every chunk (its result is discarded)."""
        self._each(step, params)

    def ping(self):
        return len(self.chunks)
