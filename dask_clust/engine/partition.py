"""Partition: one per worker, holding its row chunks and their per-algorithm state (ARCHITECTURE.md, rules 1-2).

A step is a module-level function ``step(chunk, params)`` of an algorithm; it sees one ``Chunk``
(``chunk.py``). The partition runs the step over all of its chunks on the worker's threads and combines
their partials with the declared combines (``combine.py``). On a cluster the partitions form a tree of
fan-in ``split-every``: a call reaches the root straight from the driver (no scheduler hop), each partition
passes it on to its children directly, worker to worker, runs its own chunks meanwhile, adds its children's
partials to its own, and only the root's finished result goes back to the driver. A partition keeps its last
call's own partial, so a call repeated after a lost worker (same id) never applies a step's state change
twice. In-process, the one partition runs the same ``run``, with no peers and no event loop.

The partition is the composition root of its features, each in a module of its own with its state:
``halo.py`` (gather plans and their per-call exchange), ``sharded.py`` (a sharded model's shards and the
reduce-scatter), ``backups.py`` (copies of state the model cannot rebuild), ``mailbox.py`` (the messages
between partitions).
"""

import asyncio
import copy
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from threadpoolctl import threadpool_limits

from . import combine as combines
from .backups import Backups, buddies
from .calls import Build, Gather, Plan, ShardApply, ShardDrop, ShardKeep, Step
from .chunk import Chunk
from .dashboard import worked
from .data import ChunkLoader
from .events import count
from .halo import HaloExchange
from .mailbox import Answer, Mailbox, drive, peer_call, remote_call
from .rowfiles import remove_dead_states, state_directory
from .sharded import ShardStore
from .streaming import BlockCache

_PINNED = []


def pin_blas():
    """BLAS at one thread in this worker process, once: the partition runs one chunk per worker thread, a
    multi-threaded BLAS inside each would oversubscribe the cores, and its split of a dot product would make
    the model depend on the worker's core count (rule 5). Dask's nanny already starts workers with
    OMP/MKL/OPENBLAS_NUM_THREADS = 1; a worker without a nanny gets the same here. Kept for the life of the
    process, as the nanny's setting is."""
    if not _PINNED:
        _PINNED.append(threadpool_limits(1, user_api="blas"))


class Partition:
    """Long-lived holder of row chunks on one worker (hosted by ``host.PartitionHost`` on a cluster, a plain
    object in-process)."""

    def __init__(self, meta, *blocks):
        """meta: {"chunks": [(index, start, stop), ...], "entropy": int, "threads": int, "partition": its
        index, "partitions": how many}; blocks: per chunk, (x, w) rows or a loader (see ``Chunk``)."""
        # steps' per-thread buffers live as long as the partition, not as long as its worker's threads (a
        # module-level threading.local kept vc-GMM's buffers in the driver's and workers' threads after every fit)
        scratch = threading.local()
        self.threads = max(1, int(meta.get("threads", 1)))
        streamed = [(i, data) for (i, _, _), data in zip(meta["chunks"], blocks) if isinstance(data, ChunkLoader)]
        self.cache = BlockCache(streamed, self.threads, meta.get("read_ahead", True)) if streamed else None
        self.chunks = [
            Chunk(i, a, b, data, meta["entropy"], scratch, self.cache)
            for (i, a, b), data in zip(meta["chunks"], blocks)
        ]
        keep = int(meta.get("resident", 0))  # bytes of streamed rows this partition may keep (rule 4)
        for c in self.chunks:
            if c.loader is not None and keep >= c.loader.nbytes:
                c.resident = True
                keep -= c.loader.nbytes
        # the chunks' state in local files between calls, when the fit's would not fit the memory (rule 4)
        self.scratch = meta.get("scratch")
        self.files = state_directory(self.scratch) if meta.get("state_files") else None
        for c in self.chunks if self.files else ():
            c.files = os.path.join(self.files, str(c.index))
        if meta.get("worker"):
            pin_blas()
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 and len(self.chunks) > 1 else None
        self._runner = None  # the thread that drives this partition's chunks while the event loop serves calls
        self._answer = Answer()  # this partition's own partial of the newest call
        self.pid = int(meta.get("partition", 0))
        self.n_parts = int(meta.get("partitions", 1))
        self.worker = None  # the distributed Worker hosting it, set by its host; None in-process
        self.mail = Mailbox()
        self.halo = HaloExchange(self)
        self.shards = ShardStore(self)
        self.backups = Backups(self)
        # (not itself: a partition holding itself would outlive its host's drop, its rows with it, until a
        # garbage collection ran on the worker)
        self._features = {HaloExchange: self.halo, ShardStore: self.shards, Backups: self.backups}
        count("partition", partition=self)

    def each(self, step, params):
        """``step(chunk, params)`` on every chunk, on the worker's threads; the results in chunk order."""
        if self.cache is not None:
            self.cache.begin()
        if self._pool is None:
            return [c.run(step, params) for c in self.chunks]
        return list(self._pool.map(lambda c: c.run(step, params), self.chunks))

    def tell(self, peer, message):
        """``message`` (a ``mailbox.peer_call`` type) to the partition ``peer`` = (address, key, chunk ids),
        straight to its worker: its answer."""
        return remote_call(self.worker.rpc(peer[0]), peer[1], message)

    def feature(self, cls):
        """The part of this partition a peer call of ``cls`` reaches: itself, its halo, shards or backups."""
        return self if cls is Partition else self._features[cls]

    async def offload(self, fn, *args):
        """``fn(*args)`` on this partition's runner thread, so the worker's event loop keeps serving calls;
        in-process (no event loop), here."""
        if self.worker is None:
            return fn(*args)
        if self._runner is None:
            self._runner = ThreadPoolExecutor(1)
        return await asyncio.get_running_loop().run_in_executor(self._runner, fn, *args)

    def answered(self, call):
        return self._answer.has(call.id)

    def local(self, call):
        """This partition's own combined partial of ``call`` (lifted, see ``combine.lift``); computed once
        per call id."""

        def compute():
            self.shards.wrote = None
            start = time.time()
            out = self.HANDLERS[type(call)](self, call)
            if self.worker is not None and isinstance(call, (Step, Build)):
                worked(self.worker, call, start, time.time())
            count("ran", partition=self, call=call)
            return out

        return self._answer.of(call.id, compute)

    def _accumulate(self, call):
        """The chunks' partials of a step, each added into this partition's lifted sum as soon as it is
        computed: a worker holds one partial per thread and one sum (at large C a partial is C x D), not a
        partial per chunk."""
        if self.cache is not None:
            self.cache.begin()
        if self._pool is None:
            acc = None
            for c in self.chunks:
                acc = combines.accumulate(call.combine, acc, c.run(call.step, call.params), c.index, call.top)
            return acc
        shared = combines.Shared(call.combine, call.top, self.threads)
        for _ in self._pool.map(lambda c: shared.add(c.run(call.step, call.params), c.index), self.chunks):
            pass
        return shared.result()

    def _build(self, call):
        self.each(call.step, call.params)

    # what a partition does with each kind of call (``local``); a plan's step ran in ``halo.plan``
    HANDLERS = {
        Step: _accumulate,
        Build: _build,
        Plan: lambda self, call: None,
        ShardKeep: lambda self, call: self.shards.keep(call),
        ShardDrop: lambda self, call: self.shards.drop(call),
        ShardApply: lambda self, call: self.shards.apply(call),
        Gather: lambda self, call: self.shards.gather(call),
    }

    async def run(self, call, children, root=False, peers=None):
        """Entry point of a call: pass ``call`` on to the ``children`` subtrees [(address, key, subtree)], run
        this partition's chunks, add the children's partials; the root returns the finished result.
        ``peers``: per partition (address, key, chunk ids), for the partition-to-partition messages."""
        pending = [
            asyncio.ensure_future(remote_run(self.worker.rpc(addr), key, call, sub, peers=peers))
            for addr, key, sub in children
        ]
        try:
            call = await self.shards.resolve(call, peers or [])
            if isinstance(call, Plan):
                await self.halo.plan(call, peers)
            elif call.halo is not None:
                await self.halo.exchange(call, peers)
            mine = await self.offload(self.local, call)
            keepers = buddies(peers, self.pid) if peers else []  # none: a rebuilt partition's own builds
            if call.scatter is not None:
                mine = await self.shards.scatter(call, mine, peers)
            if call.backup and keepers:
                await self.backups.copy(call, keepers)
            if self.shards.wrote is not None and keepers:
                await self.shards.copy_newest(keepers)
        finally:
            got = await asyncio.gather(*pending, return_exceptions=True) if pending else []
        for g in got:
            if isinstance(g, BaseException):
                raise g
        acc = copy.deepcopy(mine) if got else mine  # the kept partial must not absorb the children's
        for g in got:
            acc = combines.add(call.tree, acc, g)
        return call.finished(acc) if root else acc

    def run_here(self, call):
        """``run`` of the only partition, in this process (``cluster.InProcessBackend``): the same path, with
        no peer to wait for."""
        return drive(self.run(call, [], True, [(None, None, [c.index for c in self.chunks])]))

    def close(self):
        for pool in (self._pool, self._runner):
            if pool is not None:
                pool.shutdown()
        if self.cache is not None:
            self.cache.close()
        if self.files is not None:
            shutil.rmtree(self.files, ignore_errors=True)
            remove_dead_states(self.scratch)
        for c in self.chunks:  # the last references to the steps' per-thread buffers
            c.scratch = None


def partition_meta(
    chunk_ids, source, entropy, threads, partition=0, partitions=1, worker=False, resident=0, state_files=False
):
    """What a partition is made from (``Partition``); ``resident``: bytes of streamed rows it may keep;
    ``state_files``: whether its chunks keep their state in local files between calls."""
    return {
        "resident": int(resident),
        "state_files": bool(state_files),
        "chunks": [(int(i), int(source.starts[i]), int(source.starts[i + 1])) for i in chunk_ids],
        "entropy": entropy,
        "threads": threads,
        "partition": partition,
        "partitions": partitions,
        "worker": worker,
    }


def home(i, n_chunks, n_workers):
    """The worker (index into the sorted live addresses) that holds chunk i: contiguous ranges of chunks.
    A working set or reordering built for a new engine stacks each chunk where that engine will place it."""
    return (i * n_workers) // n_chunks


def tree(nodes, split_every):
    """The partitions as a tree of fan-in ``split_every`` rooted at node 0 (node i's children are
    i·s+1 .. i·s+s): for each node, [(node, its subtree), ...] of its children."""
    s = max(1, int(split_every))

    def below(i):
        return [(j, below(j)) for j in range(i * s + 1, min(len(nodes), i * s + s + 1))]

    return below(0)


@peer_call(Partition, Partition.run)
class Run(NamedTuple):
    call: object
    children: list
    root: bool = False
    peers: list | None = None


async def remote_run(rpc, key, call, children, root=False, peers=None):
    """``Partition.run`` on the partition ``key`` behind ``rpc``."""
    return await remote_call(rpc, key, Run(call, children, root, peers))
