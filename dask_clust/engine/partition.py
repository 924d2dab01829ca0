"""Partition: one per worker, holding its row chunks and their per-algorithm state (DESIGN rule 1-2).

A step is a module-level function ``step(chunk, params)`` of an algorithm; it sees one ``Chunk`` (rows,
weights, global offset, its own state dict, its own random streams). The partition runs the step over
all of its chunks on the worker's threads and returns either one combined partial (``reduce``) or the
per-chunk results (``map``).
"""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..kernels.stats import N_WORDS, fixed_add, to_fixed
from .data import stream


class Chunk:
    """One row chunk as a step sees it."""

    __slots__ = ("index", "start", "x", "w", "state", "entropy")

    def __init__(self, index, start, x, w, entropy):
        self.index = int(index)
        self.start = int(start)
        self.x = x
        self.w = np.ones(x.shape[0]) if w is None else w
        self.state = {}
        self.entropy = entropy

    @property
    def stop(self):
        return self.start + self.x.shape[0]

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
        """meta: {"chunks": [(index, start), ...], "entropy": int, "threads": int}; blocks: (x, w) pairs."""
        self.chunks = [Chunk(i, s, x, w, meta["entropy"]) for (i, s), (x, w) in zip(meta["chunks"], blocks)]
        threads = max(1, int(meta.get("threads", 1)))
        self._pool = ThreadPoolExecutor(threads) if threads > 1 and len(self.chunks) > 1 else None

    def _each(self, step, params):
        if self._pool is None:
            return [step(c, params) for c in self.chunks]
        return list(self._pool.map(lambda c: step(c, params), self.chunks))

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
