"""A row chunk as a step sees it, and where ``Engine.reorder`` sends each of its rows.

Rows are held in memory, or, for data larger than the cluster's memory (ARCHITECTURE.md, rule 4), a chunk
holds only its loader (``data.ChunkLoader``: slices of the input's stored blocks) and reads its rows
when a step first touches ``x`` (or its weights, ``w``), for the duration of that step: a step that reads no
rows loads none. A streamed chunk the partition's memory allows (``resident``) keeps what it read. Its state
stays in memory, or, where the fit's state would not fit the worker's memory (``files``), in local files
between calls, mapped back while a step runs (``rowfiles.state_from_files``).
"""

import threading

import numpy as np

from .._random import stream
from ..kernels.assign import densified
from .data import ChunkLoader
from .rowfiles import state_from_files, state_to_files
from .streaming import BlockCache


class Chunk:
    """One row chunk as a step sees it: rows ``x`` (n × d), weights ``w`` (n,), global rows
    ``start``..``stop``, its own ``state`` dict and random streams, and ``scratch``: a per-thread namespace
    for buffers a step reuses from chunk to chunk (a thread runs one chunk at a time), shared by the
    partition's chunks and gone with the partition."""

    __slots__ = (
        "index",
        "start",
        "stop",
        "_x",
        "_w",
        "state",
        "entropy",
        "loader",
        "cache",
        "resident",
        "halo",
        "ids",
        "scratch",
        "files",
        "_prefetch",
    )

    def __init__(self, index, start, stop, data, entropy, scratch=None, cache=None):
        """data: (x, w) or (x, w, input ids) rows held in memory, or a ``ChunkLoader``. Input ids are the
        rows' global ids in the input (``Engine.reorder``); by default start..stop. scratch: the partition's
        ``threading.local`` (a chunk of its own gets a new one); cache: the partition's ``BlockCache``, which
        decodes each stored block once per call for all of its chunks (a chunk of its own gets one)."""
        self.scratch = threading.local() if scratch is None else scratch
        self.index = int(index)
        self.start = int(start)
        self.stop = int(stop)
        self.state = {}
        self.halo = {}  # field -> the previous call's values of the rows this chunk reads (Engine.halo)
        self.entropy = entropy
        self.loader = data if isinstance(data, ChunkLoader) else None
        self.resident = False  # a streamed chunk that keeps the rows it read (set by its partition)
        self._prefetch = True
        self.files = None  # the directory holding the chunk's state between calls, when it is not in memory
        self._x = self._w = self.ids = None
        self.cache = None
        if self.loader is None:
            self._hold(*data)
        else:
            self.cache = BlockCache([(self.index, self.loader)]) if cache is None else cache

    def _hold(self, x, w, ids=None):
        self._x = x
        self._w = np.ones(x.shape[0]) if w is None else w
        self.ids = ids

    @property
    def n(self):
        """The chunk's number of rows, known without reading them."""
        return self.stop - self.start

    @property
    def x(self):
        """The rows (n × d, the input's float dtype); a streamed chunk reads them here, the first time a step
        asks."""
        if self._x is None and self.loader is not None:
            self._x = self.loader.rows(self.cache, self._prefetch, keep=self.resident)
        return self._x

    @property
    def loaded(self):
        """Whether the chunk holds its rows now (in memory, or read by the step running)."""
        return self._x is not None

    @property
    def w(self):
        """The rows' sample weights (n,) float64: ones when none were given, read without the rows."""
        if self._w is None and self.loader is not None:
            self._w = self.loader.weights(self.n)
        return self._w

    def rows(self, idx):
        """Rows ``idx`` (an index array or slice) as a dense array in the chunk's dtype, for a step that returns
        rows (draws, candidates, the farthest rows): a CSR chunk's few rows densified, so that what travels
        and what the driver holds is dense whatever the input."""
        return densified(self.x[idx])

    def input_ids(self):
        """The rows' ids in the input (their global ids unless the engine was reordered)."""
        return np.arange(self.start, self.stop, dtype=np.int64) if self.ids is None else self.ids

    def run(self, step, params):
        if self.files is None:
            return self._run(step, params)
        self.state, mapped = state_from_files(self.files)
        try:
            return self._run(step, params)
        finally:
            state, self.state = self.state, {}
            state_to_files(state, self.files, mapped)

    def _run(self, step, params):
        if self.loader is None:
            return step(self, params)
        # a step that reads a few chunks' rows (``take``) says so: the chunks after it are not read ahead
        self._prefetch = getattr(step, "prefetch", True)
        self.cache.started(self)
        try:
            return step(self, params)
        finally:
            if not self.resident:
                self._x = self._w = None
            self.cache.release(self)

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
