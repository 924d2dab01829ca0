"""The engine's two backends. ``InProcessBackend``: rule 6, small in-memory problems in this process, one
``Partition`` running the same path as on a cluster. ``ClusterBackend``: one ``Partition`` per worker, placed
where its chunks are loaded; a call goes from the driver straight to the root partition and down the tree.
Its other concerns live beside it: recovery (``recovery.py``), row moves (``rows.py``), streaming
(``streaming.py``); the partitions' home on a worker is ``host.py``, and where a fit runs, ``local.py``.

The engine is the only layer of dask_clust that imports ``distributed`` (ARCHITECTURE.md, layers).
"""

import asyncio
import logging
import os
import time
import uuid

import distributed
import psutil
from dask.utils import parse_timedelta
from threadpoolctl import threadpool_limits

from .. import progress
from ..errors import ClusterLost, NoWorkers
from . import config
from .data import ArraySource, FutureSource, file_stamp
from .events import count
from .host import host, return_heap
from .partition import Partition, home, partition_meta, remote_run, tree
from .recovery import GONE, LOSSES, LOST_WORKERS, Recovery, Restarted
from .rows import RowMoves
from .streaming import loaders, resident_bytes, should_stream, state_in_files, streaming_memory

logger = logging.getLogger("dask_clust")


IN_PROCESS = "in-process"


class InProcessBackend:
    """All chunks in one Partition in this process, run on this machine's threads."""

    kind = "in-process"
    in_process = True

    def __init__(self, source, entropy, state=(0, "the fit")):
        self.threads = int(config.get("in-process-threads") or os.cpu_count() or 1)
        ids = range(source.n_chunks)
        available = psutil.virtual_memory().available
        self.streaming = should_stream(source, available, state)
        self.state_files = self.streaming and state_in_files(source, available, state)
        blocks = loaders(source, ids) if self.streaming else [source.block(i) for i in ids]
        keep = 0
        if self.streaming:  # what fits stays, as on a worker whose limit is this machine's free memory
            me = {"memory_limit": available, "nthreads": self.threads}
            keep = resident_bytes(source, state, {"": me}, available, self.state_files)[""][0]
        meta = partition_meta(ids, source, entropy, self.threads, resident=keep, state_files=self.state_files)
        self.part = Partition(meta, *blocks)
        self.n_workers = 1
        self.n_rebuilds = 0
        # our pool runs one chunk per core; a multi-threaded BLAS inside each would oversubscribe them, and
        # its split of a dot product would make the model depend on BLAS's thread count (rule 5)
        self._blas = threadpool_limits(1, user_api="blas")

    def publisher(self, algo, shape, figure):
        """Nothing to publish to: a fit in this process shows only in this process."""
        return None

    def call(self, call, builders=None, plans=None, shards=None, repeat=True):
        return self.part.run_here(call)

    def partitions(self, source):
        """Per partition: (rows, memory of the process holding it in bytes)."""
        return [(source.n_samples, psutil.virtual_memory().total)]

    def close(self):
        self._blas.restore_original_limits()
        self.part.close()


# how often a fit on a cluster without workers asks the scheduler whether one has come
WAIT_POLL_S = 0.5


class ClusterBackend(Recovery, RowMoves):
    """One Partition per worker (``PartitionHost``); chunks placed in contiguous ranges, loaded on their
    worker. A call goes straight from the driver to the root partition and down a tree of fan-in ``split-every``; the
    partials come back up it, so the driver receives one finished result whatever the number of workers."""

    kind = "cluster"
    in_process = False

    def publisher(self, algo, shape, figure):
        """The fit's progress onto the dashboard's page of fits (``dashboard.py``), or None."""
        from .dashboard import publisher

        return publisher(self.client, algo, shape, figure)

    # set once the fit has seen its scheduler go (the client's status may still say "running" for a moment)
    scheduler_lost = False
    # the longest call so far, in seconds: a call is not suspected of a frozen worker before 10 times it
    slowest_call = 0.0

    def __init__(self, client, source, entropy, state=(0, "the fit")):
        self.client = client
        self.source = source
        self.entropy = entropy
        self.lost_workers = LOST_WORKERS[self._scheduler_identity()["id"]]
        workers = self._live_workers() or self._first_workers()
        addrs = sorted(workers)
        self._file_seen = {}  # worker address -> whether it sees the .npy file the source maps
        memory = sum(w.get("memory_limit") or psutil.virtual_memory().total for w in self._worker_info().values())
        self.streaming = should_stream(source, memory, state)
        self.state_files = self.streaming and state_in_files(source, memory, state, self._worker_info())
        self.stream_estimate = None  # bytes the most loaded worker is estimated to need while streaming
        self.keep = {}  # worker address -> (bytes of streamed rows its partition may keep, whether it reads ahead)
        if self.streaming:
            info, total = self._worker_info(), psutil.virtual_memory().total
            self.stream_estimate = streaming_memory(source, state, info, self.state_files)
            self.keep = resident_bytes(source, state, info, total, self.state_files)
            logger.info(
                "streaming %.3g GB from its source on every pass (cluster memory %.3g GB)",
                source.nbytes / 1e9,
                memory / 1e9,
            )
        n = source.n_chunks
        groups = [[i for i in range(n) if home(i, n, len(addrs)) == w] for w in range(len(addrs))]
        self.n_parts = sum(1 for ids in groups if ids)
        self.placement = []  # per partition: (worker address, chunk ids)
        self._threads = {}  # per partition: the threads of the worker it was last placed on
        self.data = []  # per partition: futures of its rows (kept so Dask keeps them) or loaders
        pending = []
        for addr, ids in zip(addrs, groups):
            if ids:
                self.placement.append((addr, ids))
                futs = self._load(ids, addr)
                self.data.append(futs)
                pending.append(self._spawn(len(pending), ids, addr, futs, workers[addr]))
        if progress.enabled() and not self.streaming:
            for _ in distributed.as_completed([f for futs in self.data for f in futs]):
                progress.advance()
        self._part_futures = pending  # held so that the workers keep the partitions
        self.n_rebuilds = 0
        self._await_placement()
        self.n_workers = len(pending)
        cluster_threads = sum(workers.values())
        if n < 2 * cluster_threads and source.nbytes >= 2 * cluster_threads * config.get_bytes("min-chunk-bytes"):
            logger.warning(
                "%d chunks for %d worker threads: some threads will idle. The chunking follows the data's "
                "size, not the cluster, so that the model is the same on any cluster; set "
                "dask_clust.min-chunks to %d for this cluster",
                n,
                cluster_threads,
                2 * cluster_threads,
            )

    def _first_workers(self):
        """The live workers once the first has come: a cluster still starting (jobs queued on HPC, pods pulling
        their image, a nanny restarting its worker) is waited for up to ``first-worker-timeout``, shown as the
        phase "waiting for workers" (of those the client's cluster object asked for, when it has one); then
        ``NoWorkers``, in one line."""
        timeout = parse_timedelta(config.get("first-worker-timeout"))
        deadline = time.monotonic() + timeout
        told = f"the Dask cluster has no workers yet: waiting up to {timeout:g} s for the first (first-worker-timeout)"
        logger.info(told)
        if progress.enabled():  # (a phase shown as lines says itself only once it ends)
            progress.note(told)
        with progress.phase("waiting for workers", _requested(self.client), "worker") as shown:
            while time.monotonic() < deadline:
                time.sleep(WAIT_POLL_S)
                workers = self._live_workers()
                if workers:
                    shown.update(len(workers))
                    return workers
        raise NoWorkers(
            f"the Dask cluster at {self.client.scheduler.address} has no workers: none came within {timeout:g} s "
            "(dask_clust.first-worker-timeout)"
        )

    def _await_placement(self):
        """Wait until every partition runs. A partition's task is pinned to its worker: when that worker is lost
        before the partition starts, its task would wait for it forever (a kill during placement, or just before a
        coreset's engine opened), so the partition is placed again on a live worker, as after a loss
        in a call; so is one whose drawn rows a lost worker took (their futures cancelled: they are drawn again,
        ``_load``), and one whose worker does not answer (``_unresponsive``) once placement has taken
        ``unresponsive-worker-timeout``."""
        check = time.monotonic() + 0.5
        limit = parse_timedelta(config.get("unresponsive-worker-timeout"))
        probe_at = time.monotonic() + limit
        while not all(f.status == "finished" for f in self._part_futures):
            if time.monotonic() < check and not any(f.status in GONE for f in self._part_futures):
                time.sleep(0.005)
                continue
            live = self._live_workers()
            if time.monotonic() > probe_at:  # a worker that stopped answering never starts its partition
                waiting = {self.placement[pid][0] for pid, f in enumerate(self._part_futures) if f.status != "finished"}
                live = {a: t for a, t in live.items() if a not in self.client.sync(self._unresponsive, waiting, limit)}
                probe_at = time.monotonic() + limit
            for pid, f in enumerate(self._part_futures):
                if f.status == "finished":
                    continue
                if self.placement[pid][0] not in live or (f.status == "cancelled" and self._remakes()):
                    f.cancel()
                    self._recover(pid, [], -1)
                elif f.status in GONE:
                    f.result()
            check = time.monotonic() + 0.5

    # -- placement
    def partitions(self, source):
        """Per partition: (rows, memory limit of its worker in bytes)."""
        info = self._worker_info()
        total = psutil.virtual_memory().total
        return [
            (
                int(sum(source.starts[i + 1] - source.starts[i] for i in ids)),
                int(info.get(addr, {}).get("memory_limit") or total),
            )
            for addr, ids in self.placement
        ]

    @property
    def threads(self):
        """The worker threads serving the partitions, as each was last placed (a partition placed again on
        another worker, during placement or after a loss, counts that worker's)."""
        return sum(self._threads.values())

    def _spawn(self, pid, ids, addr, futs, threads):
        """Start partition ``pid`` on ``addr`` over the rows ``futs`` of chunks ``ids``; its future."""
        self._threads[pid] = int(threads)
        # a worker given a lost worker's partition besides its own keeps none of the new one's rows
        alone = all(a != addr for p, (a, _) in enumerate(self.placement) if p != pid)
        keep, ahead = self.keep.get(addr, (0, True))
        keep = keep if alone else 0
        meta = partition_meta(ids, self.source, self.entropy, threads, pid, self.n_parts, True, keep, self.state_files)
        meta["read_ahead"] = ahead and alone
        future = self.client.submit(
            host,
            meta,
            *futs,
            key=f"dask_clust-partition-{pid}-{uuid.uuid4().hex}",
            workers=[addr],
            allow_other_workers=False,
            pure=False,
        )
        count("placed", pid=pid, addr=addr)
        return future

    def _worker_info(self):
        return self._scheduler_identity()["workers"]

    def _scheduler_identity(self):
        self._check_scheduler()
        try:
            return self.client.sync(self._identity)
        except OSError:
            self._check_scheduler(lost=True)

    async def _identity(self):
        return await self._ask_scheduler(
            self.client.scheduler.identity(**({"n_workers": -1} if _accepts_n_workers() else {}))
        )

    async def _ask_scheduler(self, request):
        """A request to the scheduler, given up once the client has seen the scheduler go: a request sent just
        before a killed scheduler's connection broke retries connecting for comm.timeouts.connect (30 s), and
        the fit would wait that long for an answer that cannot come."""
        ask = asyncio.ensure_future(request)
        try:
            while not ask.done():
                self._check_scheduler()
                await asyncio.wait({ask}, timeout=0.1)
            return ask.result()
        finally:
            ask.cancel()

    def _check_scheduler(self, lost=False):
        """A lost scheduler ends the fit at once: the workers close without their scheduler, the partitions
        with them, and a client that reconnects would find none of them."""
        if lost or self.client.status not in ("running", "newly-created"):
            self.scheduler_lost = True
            raise ClusterLost(
                f"lost the Dask scheduler at {self.client.scheduler.address} (client status "
                f"{self.client.status!r}): the fit cannot continue; restart the cluster and fit again"
            )

    def _live_workers(self):
        return {addr: w.get("nthreads", 1) for addr, w in self._worker_info().items()}

    def _remakes(self):
        return getattr(self.source, "remake", None) is not None

    def _load(self, ids, addr):
        """The chunks' data for a partition on ``addr``: futures of rows loaded there, or loaders. Rows drawn
        or moved on the cluster whose futures a lost worker cancelled are made again from their origin."""
        if self.streaming:
            return loaders(self.source, ids)
        if isinstance(self.source, FutureSource):
            if self._remakes() and any(self.source.futures[i].status in GONE for i in ids):
                logger.info("rows of chunks %s were lost with their worker; drawing them again", ids)
                for i, f in zip(ids, self.source.remake(ids)):
                    self.source.futures[i] = f
            return [self.source.futures[i] for i in ids]
        if isinstance(self.source, ArraySource):
            if self._reads_file(addr):
                # recomputable elsewhere, as a dask source's chunks are
                return [
                    self.client.submit(fn, *args, workers=[addr], allow_other_workers=True, pure=False)
                    for fn, args in map(self.source.file_block, ids)
                ]
            return self.client.scatter([self.source.block(i) for i in ids], workers=[addr], hash=False)
        blocks = [self.source.delayed_block(i) for i in ids]
        # placed on addr, but recomputable elsewhere: a working set drawn from these rows (its lineage) must
        # survive the loss of this worker
        return self.client.compute(blocks, workers=[addr], allow_other_workers=True)

    def _reads_file(self, addr):
        """Whether the worker at addr sees the driver's .npy file, so that it reads its chunks itself instead
        of the driver sending them (one small call per worker, asked once)."""
        if getattr(self.source, "path", None) is None:
            return False
        if addr not in self._file_seen:
            path, stamp = self.source.path, self.source.stamp
            seen = self.client.run(_sees_file, path, stamp, workers=[addr]).get(addr, False)
            if not seen:
                logger.info("worker %s does not see %s: the driver sends it its chunks", addr, path)
            self._file_seen[addr] = seen
        return self._file_seen[addr]

    def _direct(self, call):
        """One call: to the root partition, down the tree, back up; ``peers`` lets partitions reach each other."""
        keys = [f.key for f in self._part_futures]

        def spell(sub):
            return [(self.placement[j][0], keys[j], spell(below)) for j, below in sub]

        peers = [(addr, k, ids) for (addr, ids), k in zip(self.placement, keys)]
        children = spell(tree(keys, config.get("split-every")))
        t = time.monotonic()
        out = self.client.sync(
            self._watched, remote_run(self.client.rpc(peers[0][0]), keys[0], call, children, True, peers)
        )
        self.slowest_call = max(self.slowest_call, time.monotonic() - t)
        return out

    # -- calls with recovery
    def call(self, call, builders=None, plans=None, shards=None, repeat=True):
        """Run ``call`` over the tree of partitions; after a lost worker, rebuild its partitions elsewhere
        (reload the rows, run ``builders()`` (``backups.DeclaredStates.builders``) of the declared states,
        restore the shards of every sharded model in ``shards()`` from the buddy's copy), rebuild every halo
        plan (``plans()`` = [plan Call]) on all partitions, and repeat the call: the survivors answer from the
        partial they kept (and resend the halo values and scattered rows they sent), so no state changes twice. Unless
        ``repeat``: then, once the partitions are rebuilt, ``Restarted`` (``Engine.rerun``)."""
        for attempt in range(LOSSES + 1):
            # partitions on a worker this process already saw lost (by another engine: a coreset's): rebuilt
            # before the call, which would otherwise retry connecting to it for comm.timeouts.connect (30 s)
            lost = [pid for pid, (addr, _) in enumerate(self.placement) if addr in self.lost_workers]
            if not lost:
                try:
                    return self._direct(call)
                except Exception as exc:
                    lost = self._lost(exc)
                    if not lost or attempt == LOSSES:
                        raise
            for pid in lost:
                self._recover(pid, builders() if builders else [], call.id, shards() if shards else [])
            if not repeat:
                raise Restarted(lost)
            for plan in plans() if plans else []:
                self._direct(plan)
        raise AssertionError("unreachable")

    def close(self):
        """Release the partitions and the rows loaded for them now: the workers drop them at once, whether
        the fit ended or failed, instead of when the driver's garbage collector reaches these futures. A
        ``FutureSource``'s rows belong to the engine that drew them, which releases them."""
        mine = [] if isinstance(self.source, FutureSource) else [f for futs in self.data for f in futs]
        futures = [f for f in self._part_futures + mine if hasattr(f, "release")]  # (streamed: loaders)
        keys = [f.key for f in futures]
        for f in futures:
            f.release()
        self._part_futures = []
        self.data = []
        # a lost scheduler: nothing to ask, and asking waits 30 s (comm.timeouts.connect); the fit can see the
        # loss before the client's status changes
        if self.client.status == "running" and not self.scheduler_lost:
            return_heap(self.client, keys, sorted({a for a, _ in self.placement} - self.lost_workers))


def _requested(client):
    """The workers the client's cluster object has asked for (a SpecCluster's: LocalCluster, dask-jobqueue's),
    or None (a client given a scheduler's address knows of none)."""
    requested = getattr(getattr(client, "cluster", None), "requested", None)
    return len(requested) if requested else None


def _accepts_n_workers():
    import inspect

    return "n_workers" in inspect.signature(distributed.Client.scheduler_info).parameters


def _sees_file(path, stamp):
    try:
        return file_stamp(path) == stamp
    except OSError:
        return False
