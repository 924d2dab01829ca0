"""A row chunk as a step sees it, and where ``Engine.reorder`` sends each of its rows.

Rows are held in memory, or, for data larger than the cluster's memory (ARCHITECTURE.md, rule 4), a chunk
holds only its loader (the chunk's pickled dask graph, e.g. a zarr or parquet read) and loads its rows for
the duration of each step; its state stays resident either way.
"""

import pickle
import threading

import numpy as np

from .._random import stream


class Chunk:
    """One row chunk as a step sees it: rows ``x`` (n × d), weights ``w`` (n,), global rows
    ``start``..``stop``, its own ``state`` dict and random streams, and ``scratch``: a per-thread namespace
    for buffers a step reuses from chunk to chunk (a thread runs one chunk at a time), shared by the
    partition's chunks and gone with the partition."""

    __slots__ = ("index", "start", "stop", "x", "w", "state", "entropy", "loader", "halo", "ids", "scratch")

    def __init__(self, index, start, stop, data, entropy, scratch=None):
        """data: (x, w) or (x, w, input ids) rows held in memory, or bytes: a pickled dask object computing
        (x, w). Input ids are the rows' global ids in the input (``Engine.reorder``); by default
        start..stop. scratch: the partition's ``threading.local`` (a chunk of its own gets a new one)."""
        self.scratch = threading.local() if scratch is None else scratch
        self.index = int(index)
        self.start = int(start)
        self.stop = int(stop)
        self.state = {}
        self.halo = {}  # field -> the previous call's values of the rows this chunk reads (Engine.halo)
        self.entropy = entropy
        self.loader = data if isinstance(data, bytes) else None
        self.x = self.w = self.ids = None
        if self.loader is None:
            self._hold(*data)

    def _hold(self, x, w, ids=None):
        self.x = x
        self.w = np.ones(x.shape[0]) if w is None else w
        self.ids = ids

    def input_ids(self):
        """The rows' ids in the input (their global ids unless the engine was reordered)."""
        return np.arange(self.start, self.stop, dtype=np.int64) if self.ids is None else self.ids

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


def route(chunk, plan):
    """Where ``Engine.reorder`` sends each of the chunk's rows: its key's first position for this chunk plus
    the row's rank among the chunk's rows of that key (rows keep their order within a key)."""
    key_step, key_params, keys, chunks, first = plan
    k = np.asarray(key_step(chunk, key_params), dtype=np.int64)
    mine = chunks == chunk.index
    table, base = keys[mine], first[mine]  # np.unique order: ascending keys
    order = np.argsort(k, kind="stable")
    slot = np.searchsorted(table, k[order])
    pos = np.empty(len(k), np.int64)
    pos[order] = base[slot] + np.arange(len(k)) - np.searchsorted(k[order], table)[slot]
    return pos


def routed_rows(chunk, plan):
    """The chunk's rows with their new positions: (positions, x, w, input ids)."""
    return route(chunk, plan), chunk.x, chunk.w, chunk.input_ids()


def pop_state(chunk, key):
    """Drop one kind of per-chunk state (the end of ``Engine.state``)."""
    chunk.state.pop(key, None)
