"""Partition: one per worker, holding its row chunks and their per-algorithm state (DESIGN rule 1-2).

Rows are held in memory, or, for data larger than the cluster's memory (rule 4), a chunk holds only
its loader (the chunk's pickled dask graph, e.g. a zarr or parquet read) and loads its rows for the
duration of each step; its state stays resident either way.

A step is a module-level function ``step(chunk, params)`` of an algorithm; it sees one ``Chunk`` (rows,
weights, global offset, its own state dict, its own random streams). The partition runs the step over
all of its chunks on the worker's threads and combines their partials with the declared combines
(``combine.py``). On a cluster the partitions form a tree of fan-in ``split-every``: a call reaches the
root straight from the driver (no scheduler hop), each partition passes it on to its children directly,
worker to worker, runs its own chunks meanwhile, adds its children's partials to its own, and only the
root's finished result goes back to the driver. A partition keeps its last call's own partial, so a call
repeated after a lost worker (same id) never applies a step's state change twice.
"""
import asyncio
import copy
import pickle
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from . import combine as combines
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




@dataclass(frozen=True)
class Call:
    """One round trip: ``step(chunk, params)`` on every chunk, fields combined by ``combine``, then
    ``at_root(fields, params)`` where the result is finished (see ``finished``).

    ``top`` is the fit's fixed-point grid (None before the first pass). ``state`` marks a state builder or
    a drop of state: nothing is combined or returned."""

    id: int
    step: object
    params: object = None
    combine: tuple = None
    top: int = None
    state: bool = False
    at_root: object = None

    def finished(self, acc):
        """The result of the combined partial ``acc``: what reaches the driver."""
        if self.state:
            return None
        fields = combines.finish(self.combine, acc, self.top)
        return fields if self.at_root is None else self.at_root(fields, self.params)


def pop_state(chunk, key):
    """Drop one kind of per-chunk state (the end of ``Engine.state``)."""
    chunk.state.pop(key, None)


class Partition:
    """Long-lived holder of row chunks on one worker (a Dask Actor on a cluster, a plain object in-process)."""

    def __init__(self, meta, *blocks):
        """meta: {"chunks": [(index, start, stop), ...], "entropy": int, "threads": int};
        blocks: per chunk, (x, w) rows or a loader (see ``Chunk``)."""
        self.chunks = [Chunk(i, a, b, data, meta["entropy"]) for (i, a, b), data in zip(meta["chunks"], blocks)]
        threads = max(1, int(meta.get("threads", 1)))
        self._pool = ThreadPoolExecutor(threads) if threads > 1 and len(self.chunks) > 1 else None
        self._runner = None   # the thread that drives this partition's chunks while the event loop serves calls
        self._last = (None, None)

    def _each(self, step, params):
        if self._pool is None:
            return [c.run(step, params) for c in self.chunks]
        return list(self._pool.map(lambda c: c.run(step, params), self.chunks))

    def local(self, call):
        """This partition's own combined partial of ``call`` (lifted, see ``combine.lift``); computed once
        per call id."""
        if self._last[0] == call.id:
            return self._last[1]
        parts = self._each(call.step, call.params)
        acc = None
        if not call.state:
            for c, part in zip(self.chunks, parts):
                acc = combines.add(call.combine, acc, combines.lift(call.combine, part, c.index, call.top))
        self._last = (call.id, acc)
        return acc

    async def run(self, call, children, root=False):
        """Actor entry point: pass ``call`` on to the ``children`` subtrees [(address, key, subtree)], run
        this partition's chunks, add the children's partials; the root returns the finished result."""
        from distributed import get_worker

        worker = get_worker()
        pending = [asyncio.ensure_future(remote_run(worker.rpc(addr), key, call, sub)) for addr, key, sub in children]
        if self._runner is None:
            self._runner = ThreadPoolExecutor(1)
        try:
            mine = await asyncio.get_running_loop().run_in_executor(self._runner, self.local, call)
        finally:
            got = await asyncio.gather(*pending, return_exceptions=True)
        for g in got:
            if isinstance(g, BaseException):
                raise g
        acc = copy.deepcopy(mine) if got else mine   # the kept partial must not absorb the children's
        for g in got:
            acc = combines.add(call.combine, acc, g)
        return call.finished(acc) if root else acc

    def close(self):
        for pool in (self._pool, self._runner):
            if pool is not None:
                pool.shutdown()


async def remote_run(rpc, key, call, children, root=False):
    """``Partition.run`` on the actor ``key`` behind ``rpc``, straight to its worker (distributed's comms)."""
    from distributed.protocol import to_serialize

    msg = await rpc.actor_execute(function="run", actor=key,
                                  args=[to_serialize(call), to_serialize(children), root], kwargs={})
    if msg["status"] != "OK":
        raise msg["exception"]
    return msg["result"]
