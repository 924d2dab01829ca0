"""Client and LocalCluster handling, partition placement, lost-worker detection and rebuild.

The only module of dask_clust that imports ``distributed`` (ARCHITECTURE.md, layers). Two backends serve the
Engine: ``InProcessBackend`` (rule 6: small in-memory problems, no cluster) and ``ClusterBackend`` (one
``Partition`` per worker, created where its chunks are loaded, rebuilt elsewhere when its worker
is lost, rule 1).
"""

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import logging
import multiprocessing
import os
import signal
import tempfile
import threading
import time
import uuid

import cloudpickle
import dask
import distributed
import numpy as np
import psutil
from dask.utils import parse_timedelta
from distributed.comm.core import CommClosedError
from threadpoolctl import threadpool_limits

from .. import progress
from ..errors import ClusterLost, InputError, SchedulerUnreachable, UnguardedScript
from . import config, tls
from .backups import BACKUP_COPIES, buddies, replay
from .calls import Build
from .chunk import Chunk, routed_rows
from .data import ArraySource, FutureSource, file_stamp, row_starts
from .mailbox import remote_call, remote_run
from .partition import Partition

logger = logging.getLogger("dask_clust")

_COMM_ERRORS = (
    OSError,
    CommClosedError,
    asyncio.CancelledError,
    concurrent.futures.CancelledError,
    distributed.scheduler.KilledWorker,
    asyncio.TimeoutError,
)


def _worker_gone(exc):
    """Whether a call's failure says that a worker is gone or going: a communication error, a partition lost
    with its worker, or a worker's own connection pool closed under a call it was relaying to a peer (it is
    shutting down: a worker closes itself when its scheduler is lost, and returned this before the driver's
    client saw the scheduler go, in 2 of 6 scheduler kills under load)."""
    return (
        isinstance(exc, _COMM_ERRORS)
        or "lost" in str(exc).lower()
        or (isinstance(exc, RuntimeError) and "ConnectionPool is closed" in str(exc))
    )


IN_PROCESS = "in-process"
# glibc's mmap threshold for worker processes. dask's nannies set MALLOC_TRIM_THRESHOLD_, which freezes the
# threshold at 128 KiB: every larger temporary (a halo's values, a step's (rows, k) arrays) is then a fresh
# mmap whose pages fault in on first touch, every call. On a 2-core VM that doubled SLK's time per bound
# update on 2 workers (mnist5k: 7.6-8.7 s -> 4.8-6.5 s with 16 MiB). Arrays below it are reused from the
# heap; larger ones, which amortise their faults over their work, still go back to the system when freed.
MMAP_THRESHOLD = 16 << 20
# how often a call that has not returned asks the scheduler whether one of the fit's workers has gone
WATCH_S = 0.5
# how long a finished fit waits for its workers to be asked to return their free heap (``_return_heap``)
RETURN_HEAP_S = 2.0
# what a streaming worker needs beyond its chunks, state and buffers, measured on CPython 3.11 (one worker of
# one thread, zarr stores of 1 and 2 GiB in 32 MiB chunks, Lloyd; ``benchmarks/bench_faults.py --parts
# stream``): the process after its first fit (numpy, numba's compiled kernels, distributed; 315-344 MiB),
# and what a streamed pass holds besides its chunk, the input block and the fit's state (the loader's
# compute, the codec's buffers, the partials: 33-34 MiB over 16.1 B of state per row, Lloyd's 16)
WORKER_BASE = 340 << 20
STREAM_PASS = 48 << 20


class WorkerLost(ClusterLost):
    """Partitions that could not be rebuilt after their worker died (``why``: what was missing)."""

    def __init__(self, partition_ids, why="no worker could rebuild them"):
        super().__init__(f"lost the workers holding partitions {sorted(partition_ids)}: {why}")
        self.partition_ids = partition_ids


class Restarted(RuntimeError):
    """Partitions whose worker died were rebuilt within ``Engine.rerun``; the call was not repeated."""

    def __init__(self, partition_ids):
        super().__init__(f"lost the workers holding partitions {sorted(partition_ids)}: rebuilt, the phase restarts")
        self.partition_ids = partition_ids


def _meta(chunk_ids, source, entropy, threads, partition=0, partitions=1, worker=False):
    return {
        "chunks": [(int(i), int(source.starts[i]), int(source.starts[i + 1])) for i in chunk_ids],
        "entropy": entropy,
        "threads": threads,
        "partition": partition,
        "partitions": partitions,
        "worker": worker,
    }


def fit_state(state):
    """(bytes of state per row, who keeps them, bytes of buffers per worker thread) of the ``state`` a fit
    declares (``algorithms.state_of``); the last may be left out (none)."""
    row_bytes, who, *buffers = state
    return int(row_bytes), who, int(buffers[0]) if buffers else 0


def should_stream(source, memory_bytes, state=(0, "the fit")):
    """Rule 4: stream a dask source from where it lives each pass when it and the fit's per-row state would
    take more than ``stream-fraction`` of the memory available to hold them (``stream``: "auto", True or
    False). ``state`` = (bytes per row, who keeps them[, bytes per thread]), declared by the algorithm: the
    state stays in memory either way, so a fit whose state alone is over that share is refused before it
    starts."""
    row_bytes, who, _ = fit_state(state)
    fraction = float(config.get("stream-fraction"))
    held = source.n_samples * int(row_bytes)
    if held > fraction * memory_bytes:
        raise InputError(
            f"{who} keeps {int(row_bytes)} B of state per row: {held / 1e9:.3g} GB for "
            f"{source.n_samples:,} rows, over stream-fraction = {fraction:g} of the "
            f"{memory_bytes / 1e9:.3g} GB of memory it runs in; add workers or memory, or fit on a "
            "sample (an algorithm with a coreset, or its coreset_size where the algorithm takes one)"
        )
    mode = config.get("stream")
    if isinstance(source, (ArraySource, FutureSource)) or mode is False or mode == "never":
        return False
    if mode is True or mode == "always":
        return True
    return source.nbytes + held > fraction * memory_bytes


def loaders(source, ids):
    """Per chunk, its pickled dask graph: what a streaming partition computes on every pass."""
    return [cloudpickle.dumps(source.delayed_block(i)) for i in ids]


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


class InProcessBackend:
    """All chunks in one Partition in this process, run on this machine's threads."""

    kind = "in-process"
    in_process = True

    def __init__(self, source, entropy, state=(0, "the fit")):
        self.threads = int(config.get("in-process-threads") or os.cpu_count() or 1)
        ids = range(source.n_chunks)
        self.streaming = should_stream(source, psutil.virtual_memory().available, state)
        blocks = loaders(source, ids) if self.streaming else [source.block(i) for i in ids]
        self.part = Partition(_meta(ids, source, entropy, self.threads), *blocks)
        self.n_workers = 1
        self.n_rebuilds = 0
        # our pool runs one chunk per core; a multi-threaded BLAS inside each would oversubscribe them, and
        # its split of a dot product would make the model depend on BLAS's thread count (rule 5)
        self._blas = threadpool_limits(1, user_api="blas")

    def publisher(self, algo):
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


class ClusterBackend:
    """One Partition per worker (``PartitionHost``); chunks placed in contiguous ranges, loaded on their
    worker. A call goes straight from the driver to the root partition and down a tree of fan-in ``split-every``; the
    partials come back up it, so the driver receives one finished result whatever the number of workers."""

    kind = "cluster"
    in_process = False

    def publisher(self, algo):
        """The fit's progress onto the dashboard's page of fits (``dashboard.py``), or None."""
        from .dashboard import publisher

        return publisher(self.client, algo)

    # set once the fit has seen its scheduler go (the client's status may still say "running" for a moment)
    scheduler_lost = False
    # the longest call so far, in seconds: a call is not suspected of a frozen worker before 10 times it
    slowest_call = 0.0

    def __init__(self, client, source, entropy, state=(0, "the fit")):
        self.client = client
        self.source = source
        self.entropy = entropy
        workers = self._live_workers()
        if not workers:  # none yet, or a worker being restarted by its nanny: wait as for a lost worker
            timeout = parse_timedelta(config.get("lost-worker-timeout"))
            try:
                client.wait_for_workers(1, timeout=timeout)
            except (TimeoutError, asyncio.TimeoutError):
                raise RuntimeError(f"the Dask cluster has no workers (waited {timeout:g} s)") from None
            workers = self._live_workers()
        addrs = sorted(workers)
        self._file_seen = {}  # worker address -> whether it sees the .npy file the source maps
        memory = sum(w.get("memory_limit") or psutil.virtual_memory().total for w in self._worker_info().values())
        self.streaming = should_stream(source, memory, state)
        self.stream_estimate = None  # bytes the most loaded worker is estimated to need while streaming
        if self.streaming:
            self.stream_estimate = self._check_streaming_memory(source, state)
            logger.info(
                "streaming %.3g GB from its source on every pass (cluster memory %.3g GB)",
                source.nbytes / 1e9,
                memory / 1e9,
            )
        n = source.n_chunks
        groups = [[i for i in range(n) if home(i, n, len(addrs)) == w] for w in range(len(addrs))]
        self.n_parts = sum(1 for ids in groups if ids)
        self.placement = []  # per partition: (worker address, chunk ids)
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
        self.threads = sum(workers[a] for a, _ in self.placement)
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

    def _await_placement(self):
        """Wait until every partition runs. A partition's task is pinned to its worker: when that worker is lost
        before the partition starts, its task would wait for it forever (issue #20: a kill during placement or just
        before a coreset's engine opened hung), so the partition is placed again on a live worker, as after a loss
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

    def _check_streaming_memory(self, source, state):
        """A streamed chunk is computed from its source on every pass: a worker thread holds it and the input
        block(s) it is cut from meanwhile (a zarr chunk decoded whole), and the fit's buffers. With the
        worker's share of the fit's state and the process itself, that must stay under the memory its nanny
        allows, or the nanny restarts the worker in every pass: refused before any work instead, in one line.
        Returns the largest worker's estimate in bytes."""
        chunk = int(np.diff(source.starts).max()) * source.n_features * source.dtype.itemsize
        block = getattr(source, "input_chunk_bytes", 0)
        row_bytes, who, buffers = fit_state(state)
        per_thread = chunk + max(chunk, block) + buffers  # the chunk, the input it is cut from, the fit's buffers
        info = self._worker_info()
        share = source.n_samples * row_bytes / max(1, len(info))
        terminate = float(dask.config.get("distributed.worker.memory.terminate", 0.95) or 1.0)
        largest = 0
        for addr, w in sorted(info.items()):
            limit = w.get("memory_limit") or 0
            process = max(WORKER_BASE, w.get("metrics", {}).get("memory", 0)) + STREAM_PASS
            need = process + w.get("nthreads", 1) * per_thread + share
            largest = max(largest, need)
            if limit and need > terminate * limit:
                raise InputError(
                    f"{who} streams chunks of {chunk / 2**20:.0f} MiB cut from input blocks of up to "
                    f"{block / 2**20:.0f} MiB: worker {addr} would need about "
                    f"{need / 2**20:.0f} MiB ({w.get('nthreads', 1)} thread(s) x both"
                    f"{f' + {buffers / 2**20:.0f} MiB of buffers' if buffers else ''}, "
                    f"{share / 2**20:.0f} MiB of state, the process) of its {limit / 2**20:.0f} MiB limit; "
                    "store the input in smaller chunks, set dask_clust.chunk-bytes lower, or give "
                    "workers more memory"
                )
        return int(largest)

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

    def _worker_info(self):
        self._check_scheduler()
        try:
            return self.client.sync(self._identity)["workers"]
        except OSError:
            self._check_scheduler(lost=True)

    async def _identity(self):
        """The scheduler's identity, given up once the client has seen the scheduler go: a question sent just
        before a killed scheduler's connection broke retries connecting for comm.timeouts.connect (30 s), and
        a fit ended only with the client, 30.05 s after the kill (once in a loaded run of the suite)."""
        ask = asyncio.ensure_future(
            self.client.scheduler.identity(**({"n_workers": -1} if _accepts_n_workers() else {}))
        )
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

    def _spawn(self, pid, ids, addr, futs, threads):
        meta = _meta(ids, self.source, self.entropy, threads, pid, self.n_parts, worker=True)
        return self.client.submit(
            host,
            meta,
            *futs,
            key=f"dask_clust-partition-{pid}-{uuid.uuid4().hex}",
            workers=[addr],
            allow_other_workers=False,
            pure=False,
        )

    def _one_shot(self, c, fn, *args):
        """(worker, future of ``draw_chunk`` running ``fn`` on chunk c) where c's rows live: rows a lost
        worker took (scattered, so Dask cannot recompute them) are loaded again first."""
        for pid, (addr, ids) in enumerate(self.placement):
            if c in ids:
                break
        if not self.streaming and any(getattr(f, "status", None) in GONE for f in self.data[pid]):
            live = sorted(self._live_workers() or self._await_worker())
            if not live:
                raise WorkerLost([pid], "the cluster has no worker left to draw rows on")
            addr = addr if addr in live else live[0]
            self.data[pid] = self._load(ids, addr)  # the partition itself is rebuilt by its next call
        meta = (c, int(self.source.starts[c]), int(self.source.starts[c + 1]), self.entropy)
        return addr, self._near(addr, draw_chunk, self.data[pid][ids.index(c)], meta, fn, *args)

    def drawn(self, step, params, counts, chunk_rows):
        """A ``FutureSource`` of the rows ``step`` draws, chunk c drawing counts[c]: one task per chunk where
        its rows live, then the draws sliced and stacked into chunks of ``chunk_rows`` on the workers the
        new engine will place them on (Dask moves the slices worker to worker). Its chunks can be drawn
        again, each from the chunks that feed it (``FutureSource.remake``)."""
        ends = np.cumsum(counts)
        begins = ends - counts
        starts = row_starts(int(ends[-1]), chunk_rows)
        n_new = len(starts) - 1

        def make(new_ids):
            pieces, futures = {}, []
            addrs = sorted(self._live_workers())
            for j in new_ids:
                a, b = starts[j], starts[j + 1]
                parts = []
                for c in range(int(np.searchsorted(ends, a, side="right")), int(np.searchsorted(begins, b))):
                    if not counts[c]:
                        continue
                    if c not in pieces:
                        pieces[c] = self._one_shot(c, step, params)
                    lo, hi = max(a, begins[c]) - begins[c], min(b, ends[c]) - begins[c]
                    addr, fut = pieces[c]
                    whole = lo == 0 and hi == counts[c]
                    parts.append(fut if whole else self._near(addr, rows_of, fut, lo, hi))
                futures.append(self._near(addrs[home(j, n_new, len(addrs))], stack, *parts))
            return futures

        return FutureSource(make(range(n_new)), starts, self.source.n_features, self.source.dtype, make)

    def _near(self, addr, fn, *args):
        """A one-shot task placed on ``addr`` that Dask may run, or run again after a loss, elsewhere."""
        return self.client.submit(fn, *args, workers=[addr], allow_other_workers=True, pure=False)

    def reordered(self, plan, counts, first, chunks):
        """A ``FutureSource`` of the rows in ``reorder``'s order, in chunks of this source's sizes: one task
        per chunk where its rows live gives each row its position (``route``), then every new chunk gathers
        its rows from the chunks that feed it, on the worker the new engine will place it on."""
        starts = self.source.starts
        n_new = len(starts) - 1
        feeds = [set() for _ in range(n_new)]  # new chunk -> the old chunks holding some of its rows
        lo = np.searchsorted(starts, first, side="right") - 1
        hi = np.searchsorted(starts, first + counts - 1, side="right") - 1
        for c, a, b in zip(chunks, lo, hi):
            for j in range(a, b + 1):
                feeds[j].add(int(c))

        def make(new_ids):
            routed, futures = {}, []
            addrs = sorted(self._live_workers())
            for j in new_ids:
                for c in feeds[j] - set(routed):
                    routed[c] = self._one_shot(c, sorted_routed, plan)
                parts = [
                    self._near(routed[c][0], rows_at, routed[c][1], starts[j], starts[j + 1]) for c in sorted(feeds[j])
                ]
                futures.append(self._near(addrs[home(j, n_new, len(addrs))], place, *parts))
            return futures

        return FutureSource(make(range(n_new)), starts, self.source.n_features, self.source.dtype, make)

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

    async def _watched(self, running):
        """Await a call while ``_watch`` asks the scheduler whether a worker of the fit has gone. A partition
        that sends to a killed worker retries connecting to it for comm.timeouts.connect (30 s) before it fails;
        the scheduler knows at once, so the call is abandoned as lost and the caller rebuilds and repeats it."""
        task = asyncio.ensure_future(running)
        watch = asyncio.ensure_future(self._watch({addr for addr, _ in self.placement}))
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            return task.result() if task.done() else watch.result()
        finally:
            task.cancel()
            watch.cancel()

    async def _watch(self, placed):
        """Raises a comm error once a worker in ``placed`` has left the cluster (asked every ``WATCH_S``) or has
        stopped answering: once the call has run ``unresponsive-worker-timeout`` and 10 times the slowest call
        so far, every worker of the fit is asked its identity, and one that does not answer within that
        timeout (a frozen process, a partitioned node: connected, so the scheduler keeps it until its
        worker-ttl, 5 minutes) is restarted by the scheduler, as its worker-ttl would do: its nanny kills it,
        or without one the scheduler drops it. Its late answer, if any, is never read."""
        limit = parse_timedelta(config.get("unresponsive-worker-timeout"))
        probe_at = time.monotonic() + max(limit, 10 * self.slowest_call)
        probe = None
        try:
            while True:
                await asyncio.sleep(WATCH_S)
                gone = ()
                with contextlib.suppress(OSError, CommClosedError, asyncio.TimeoutError):  # a lost scheduler:
                    gone = placed - set(await self.client.scheduler.ncores())  # the caller reports it
                if gone:
                    raise CommClosedError(f"worker(s) {sorted(gone)} of the fit left the cluster during a call")
                if probe is None and time.monotonic() > probe_at:
                    probe = asyncio.ensure_future(self._unresponsive(placed, limit))
                if probe is not None and probe.done():
                    if probe.result():
                        raise CommClosedError(
                            f"worker(s) {probe.result()} of the fit did not answer within "
                            f"{limit:g} s (unresponsive-worker-timeout): restarted"
                        )
                    probe, probe_at = None, time.monotonic() + limit
        finally:
            if probe is not None:
                probe.cancel()

    async def _unresponsive(self, addrs, limit):
        """The workers of ``addrs`` that do not answer an identity request within ``limit`` seconds, restarted
        (``_watch``); a worker already gone counts as answering (the scheduler reports it)."""

        async def answers(addr):
            try:
                await asyncio.wait_for(self.client.rpc(addr).identity(), limit)
            except asyncio.TimeoutError:
                return False
            except (OSError, CommClosedError):
                pass
            return True

        addrs = sorted(addrs)
        silent = [a for a, ok in zip(addrs, await asyncio.gather(*map(answers, addrs))) if not ok]
        if silent:
            logger.warning(
                "worker(s) %s did not answer within %g s (unresponsive-worker-timeout): restarting them, "
                "and rebuilding their partitions elsewhere",
                silent,
                limit,
            )
            _LOST_WORKERS.update(silent)
            with contextlib.suppress(Exception):  # (a nanny SIGKILLs a worker that does not stop within 4 s)
                await self.client.scheduler.restart_workers(
                    workers=silent,
                    timeout=max(limit, 10.0),
                    wait_for_workers=False,
                    on_error="return",
                    stimulus_id=f"dask-clust-unresponsive-{time.time()}",
                )
        return silent

    # -- calls with recovery
    def call(self, call, builders=None, plans=None, shards=None, repeat=True):
        """Run ``call`` over the tree of partitions; after a lost worker, rebuild its partitions elsewhere
        (reload the rows, run ``builders()`` (``Engine._builders``) of the declared states, restore the shards
        of every sharded model in ``shards()`` from the buddy's copy), rebuild every halo plan (``plans()`` =
        [plan Call]) on all partitions, and repeat the call: the survivors answer from the partial they kept
        (and resend the halo values and scattered rows they sent), so no state changes twice. Unless
        ``repeat``: then, once the partitions are rebuilt, ``Restarted`` (``Engine.rerun``)."""
        for attempt in range(4):
            # partitions on a worker this process already saw lost (by another engine: a coreset's): rebuilt
            # before the call, which would otherwise retry connecting to it for comm.timeouts.connect (30 s)
            lost = [pid for pid, (addr, _) in enumerate(self.placement) if addr in _LOST_WORKERS]
            if not lost:
                try:
                    return self._direct(call)
                except Exception as exc:
                    lost = self._lost(exc)
                    if not lost or attempt == 3:
                        raise
            for pid in lost:
                self._recover(pid, builders() if builders else [], call.id, shards() if shards else [])
            if not repeat:
                raise Restarted(lost)
            for plan in plans() if plans else []:
                self._direct(plan)
        raise AssertionError("unreachable")

    def _await_worker(self):
        """Live workers once one is back (a nanny restarting the workers it killed), waiting up to
        ``lost-worker-timeout``; {} when none comes."""
        try:
            self.client.wait_for_workers(1, timeout=parse_timedelta(config.get("lost-worker-timeout")))
        except (TimeoutError, asyncio.TimeoutError):
            return {}
        return self._live_workers()

    def _lost(self, exc):
        """The partitions whose worker the scheduler has dropped, after a communication error (waits up
        to ``lost-worker-timeout`` for the scheduler to confirm)."""
        if not _worker_gone(exc):
            return []
        deadline = time.monotonic() + parse_timedelta(config.get("lost-worker-timeout"))
        while True:
            live = self._live_workers()
            lost = [pid for pid, (addr, _) in enumerate(self.placement) if addr not in live]
            if not lost and time.monotonic() > deadline:  # found unresponsive, and still listed
                lost = [pid for pid, (addr, _) in enumerate(self.placement) if addr in _LOST_WORKERS]
            if lost or time.monotonic() > deadline:
                return lost
            time.sleep(0.1)

    def _recover(self, pid, builders, call_id, shards=(), attempts=3):
        _LOST_WORKERS.add(self.placement[pid][0])
        for attempt in range(attempts):
            ids = self.placement[pid][1]
            workers = self._live_workers() or self._await_worker()
            if not workers:
                raise WorkerLost(
                    [pid],
                    f"the cluster has no worker left (it had {len(set(a for a, _ in self.placement))}; "
                    f"none came back within lost-worker-timeout)",
                )
            # (a worker found unresponsive may still be listed while its nanny kills it)
            addr = self._target(pid, {a: t for a, t in workers.items() if a not in _LOST_WORKERS} or workers)
            logger.warning("worker of partition %d lost; rebuilding its %d chunks on %s", pid, len(ids), addr)
            try:
                futs = self._load(ids, addr)
                part_future = self._spawn(pid, ids, addr, futs, workers[addr])
                self._started(part_future, addr)
                rpc = self.client.rpc(addr)
                for i, (key, step, params, backup, steps) in enumerate(builders):
                    kept = self._backup(pid, key, ids, call_id) if backup else None
                    if kept is not None:
                        logger.info("restoring state %r of partition %d from its buddy's copy", key, pid)
                        self.client.sync(remote_call, rpc, part_future.key, "backups.restore", key, kept)
                        continue
                    if backup:  # a step has changed it since it was built: the builder would make another
                        if steps is None:
                            raise WorkerLost(
                                [pid],
                                f"its state {key!r} and every copy of it were lost (its worker "
                                f"and those of the {BACKUP_COPIES} partitions after it), and its "
                                f"steps are not kept to replay (replay-bytes); the fit cannot "
                                f"continue to the same model: fit again, or resume from a "
                                f"checkpoint",
                            )
                        logger.warning(
                            "state %r of partition %d and every copy of it were lost: replaying its %d steps",
                            key,
                            pid,
                            len(steps),
                        )
                        step, params = replay, steps
                    build = Build(-1 - i, step, params)
                    self.client.sync(remote_run, rpc, part_future.key, build, [], True)
                self._restore_shards(pid, addr, part_future.key, shards)
            except Exception as exc:
                # KeyError: the scheduler dropped the chosen worker while rows were sent to it (all were lost)
                if attempt + 1 < attempts and isinstance(exc, (*_COMM_ERRORS, KeyError)):
                    continue  # (a cancelled future of drawn rows is made again by the next _load)
                raise
            self.placement[pid] = (addr, ids)
            _LOST_WORKERS.discard(addr)  # live again: a new worker may reuse a lost one's port
            self.data[pid] = futs
            self._part_futures[pid] = part_future
            self.n_rebuilds += 1
            return
        raise WorkerLost([pid])

    def _target(self, pid, workers):
        """Where partition ``pid`` is rebuilt: the least-loaded live worker that holds none of the partitions
        keeping its backups or whose backups it keeps (one loss would otherwise take a state and its copy),
        unless every worker does."""
        n = len(self.placement)
        near = {self.placement[(pid + j) % n][0] for j in range(-BACKUP_COPIES, BACKUP_COPIES + 1) if j}
        load = {a: 0 for a in workers}
        for a, _ in self.placement:
            if a in load:
                load[a] += 1
        apart = [a for a in sorted(load) if a not in near] or sorted(load)
        return min(apart, key=load.get)

    def _started(self, part_future, addr):
        """Wait for a rebuilt partition to run. Its task is pinned to ``addr``: once that worker has left (or
        stopped answering, ``_unresponsive``) its task would wait for it forever, so that raises a comm error
        and ``_recover`` places the partition again."""
        limit = parse_timedelta(config.get("unresponsive-worker-timeout"))
        deadline = time.monotonic() + limit
        while True:
            try:
                return part_future.result(timeout=WATCH_S)
            except TimeoutError:
                pass
            gone = addr not in self._live_workers()
            if not gone and time.monotonic() > deadline:
                gone = bool(self.client.sync(self._unresponsive, {addr}, limit))
                deadline = time.monotonic() + limit
            if gone:
                part_future.cancel()
                raise CommClosedError(f"worker {addr} left before the partition started on it")

    def _restore_shards(self, pid, addr, part_key, shards):
        """A rebuilt partition's shards of every sharded model, from the first of its buddies that kept a copy;
        then it sends them to its buddies again, and the partitions whose copies the lost one kept send theirs."""
        if not shards:
            return
        keys = [f.key for f in self._part_futures]
        peers = [(a, k, chunk_ids) for (a, chunk_ids), k in zip(self.placement, keys)]
        for key in shards:
            kept = self._ask_buddies(pid, peers, "shards.backup_get", key, pid)
            if kept is None:
                raise WorkerLost(
                    [pid],
                    f"its shard of the sharded model {key!r} and every copy of it were lost (its "
                    f"worker and those of the {BACKUP_COPIES} partitions after it)",
                )
            logger.info("restoring partition %d's shard of %r from its buddy's copy", pid, key)
            self.client.sync(remote_call, self.client.rpc(addr), part_key, "shards.restore", key, kept)
        peers[pid] = (addr, part_key, peers[pid][2])
        live = self._live_workers()  # partitions lost and not rebuilt yet get their copies when they are
        peers = [p if j == pid or (p[0] in live and p[0] not in _LOST_WORKERS) else None for j, p in enumerate(peers)]
        for j in range(min(BACKUP_COPIES, len(peers) - 1) + 1):  # itself (its buddies may be new too), then
            before = peers[(pid - j) % len(peers)]  # those whose copies it kept
            if before is None:
                continue
            try:
                self.client.sync(remote_call, self.client.rpc(before[0]), before[1], "shards.rebackup", peers)
            except _COMM_ERRORS:  # that one is lost too: it is rebuilt next, and its next write copies again
                pass

    def _ask_buddies(self, pid, peers, method, *args):
        """``method(*args)`` of the first of partition ``pid``'s buddies (``partition.buddies``) that answers
        something other than None; None when none does. A buddy whose worker has left is not asked: asking
        would retry connecting to it for comm.timeouts.connect (30 s)."""
        live = self._live_workers()
        for addr, part_key, _ in buddies(peers, pid):
            if addr not in live or addr in _LOST_WORKERS:
                continue
            try:
                kept = self.client.sync(remote_call, self.client.rpc(addr), part_key, method, *args)
            except Exception as exc:
                if _worker_gone(exc):
                    continue
                raise
            if kept is not None:
                return kept
        return None

    def _backup(self, pid, key, ids, call_id):
        """Partition ``pid``'s state ``key`` from the first of its buddies that kept a copy, as the last call
        before ``call_id`` left it; None when none did (a single partition, buddies lost or rebuilt since)."""
        keys = [f.key for f in self._part_futures]
        peers = [(a, k, chunk_ids) for (a, chunk_ids), k in zip(self.placement, keys)]
        return self._ask_buddies(pid, peers, "backups.get", key, ids, call_id)

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
        # loss before the client's status changes (a loaded suite run ended 30.04 s after the kill)
        if self.client.status == "running" and not self.scheduler_lost:
            # only on the fit's workers, and not waited on for long: reaching a worker that stopped answering
            # waits for ever (even with wait=False: the scheduler connects to each)
            addrs = sorted({a for a, _ in self.placement} - _LOST_WORKERS)
            asked = threading.Thread(target=_ask_quietly, args=(self.client, _return_heap, keys, addrs), daemon=True)
            asked.start()
            asked.join(RETURN_HEAP_S)


def _ask_quietly(client, fn, keys, addrs):
    with contextlib.suppress(Exception):
        client.run(fn, keys, workers=addrs, wait=False)


async def _return_heap(keys, dask_worker=None):
    """On a worker, once a finished fit's partitions and rows are gone from it: the heap they leave free goes
    back to the system (``malloc_trim``). Arrays under the workers' 16 MiB mmap threshold (``MMAP_THRESHOLD``)
    are heap, kept for reuse; without this a worker grew by 11 % over 18 fits (issue #20)."""
    import ctypes

    host = dask_worker.extensions.get(PartitionHost.NAME)
    if host is not None:  # released by the driver: not left for the next sweep
        host.drop(keys)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(k in dask_worker.data for k in keys):
        await asyncio.sleep(0.02)
    with contextlib.suppress(OSError, AttributeError):  # glibc only
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PartitionHost:
    """A worker's partitions. Not Dask actors: the scheduler will not retire a worker holding an actor (its
    RetireWorker policy refuses at once: actors cannot be moved), so while a fit ran none of its workers
    could be retired, scaled down by Kubernetes or Adaptive, or reach a graceful jobqueue lifetime (issue
    #35). A partition is made by a task (``host``) whose key names it; the scheduler keeps that key on this
    worker for as long as the driver holds its future, and moves it (it is small) when the worker retires.
    Once the worker has forgotten the key (released, or the worker left), the partition is dropped
    (``sweep``). The driver and the partitions reach one through the ``dask_clust_call`` handler, as
    distributed's own ``actor_execute`` reaches an actor: coroutine methods on the event loop, the others on
    one thread of their own so that they never block it."""

    NAME = "dask_clust"
    SWEEP_S = 1.0
    _made = threading.Lock()

    def __init__(self, worker):
        self.worker = worker
        self.parts = {}
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dask-clust-partitions")
        worker.handlers["dask_clust_call"] = self.call
        asyncio.run_coroutine_threadsafe(self._sweeping(), worker.loop.asyncio_loop)

    @classmethod
    def of(cls, worker):
        with cls._made:
            if cls.NAME not in worker.extensions:
                worker.extensions[cls.NAME] = cls(worker)
            return worker.extensions[cls.NAME]

    async def call(self, key=None, method=None, args=()):
        from distributed.protocol import to_serialize

        part = self.parts.get(key)
        try:
            if part is None or any(name.startswith("_") for name in method.split(".")):
                raise LookupError(
                    f"partition {key} is not on worker {self.worker.address}: lost with an earlier "
                    f"process at this address, or released"
                    if part is None
                    else f"{method!r} is not a partition's call"
                )
            fn = part
            for name in method.split("."):  # "halo.put": a method of one of the partition's parts
                fn = getattr(fn, name)
            if asyncio.iscoroutinefunction(fn):
                result = await fn(*args)
            else:
                result = await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)
            return {"status": "OK", "result": to_serialize(result)}
        except Exception as exc:
            return {"status": "error", "exception": to_serialize(exc)}

    def drop(self, keys):
        for key in keys:
            part = self.parts.pop(key, None)
            if part is not None:  # (its pools shut down off the event loop: a call may still be in one)
                self._thread.submit(part.close)

    def sweep(self):
        self.drop([k for k in self.parts if k not in self.worker.state.tasks])

    async def _sweeping(self):
        from distributed.core import Status

        while self.worker.status not in (Status.closing, Status.closed, Status.failed):
            await asyncio.sleep(self.SWEEP_S)
            self.sweep()
        self.drop(list(self.parts))


def host(meta, *blocks):
    """Task: the partition of ``meta`` over ``blocks``, kept on this worker under this task's key."""
    worker = distributed.get_worker()
    part = Partition(meta, *blocks)
    part.worker = worker
    PartitionHost.of(worker).parts[worker.get_current_task()] = part


# the worker addresses this process has seen lost (a restarted worker comes back at a new address)
_LOST_WORKERS = set()

# a future whose value is gone: its worker was lost and Dask cannot compute it again (scattered rows, or a
# task whose inputs were)
GONE = ("cancelled", "lost", "error")


def _sees_file(path, stamp):
    try:
        return file_stamp(path) == stamp
    except OSError:
        return False


def draw_chunk(data, meta, step, params):
    """``step`` on one chunk as a one-shot task: (rows, weights) it draws."""
    index, start, stop, entropy = meta
    return Chunk(index, start, stop, data, entropy).run(step, params)


def sorted_routed(chunk, plan):
    """The chunk's rows with their new positions, sorted by position."""
    pos, x, w, ids = routed_rows(chunk, plan)
    order = np.argsort(pos)
    return pos[order], x[order], w[order], ids[order]


def rows_at(routed, a, b):
    """The routed rows whose new position is in [a, b)."""
    lo, hi = np.searchsorted(routed[0], [a, b])
    return tuple(f[lo:hi] for f in routed)


def place(*parts):
    """One new chunk from its routed rows: (x, w, input ids) in position order."""
    pos, x, w, ids = (np.concatenate([p[i] for p in parts]) for i in range(4))
    order = np.argsort(pos)
    return x[order], w[order], ids[order]


def rows_of(piece, lo, hi):
    return piece[0][lo:hi], piece[1][lo:hi]


def stack(*pieces):
    return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])


def _accepts_n_workers():
    import inspect

    return "n_workers" in inspect.signature(distributed.Client.scheduler_info).parameters


def _current_client():
    try:
        return distributed.get_client()
    except ValueError:
        return None


def local_cluster_size():
    """Workers x threads for a LocalCluster on this machine: processes for the GIL-bound glue,
    threads for the nogil kernels."""
    cores = os.cpu_count() or 1
    workers = min(cores, 4)
    return workers, max(1, cores // workers)


@contextlib.contextmanager
def backend_for(source, client, entropy, state=(0, "the fit")):
    """The backend a fit runs on, closed again afterwards along with anything this call started.

    client: a ``distributed.Client``, a scheduler address, ``"in-process"``, or None (the current client
    if there is one; else in-process for in-memory data up to ``in-process-bytes``; else a LocalCluster
    for this fit). state: (bytes of per-row state, who keeps it), for ``should_stream``.
    """
    stack = contextlib.ExitStack()
    with stack:
        if client == IN_PROCESS:
            backend = InProcessBackend(source, entropy, state)
            stack.callback(backend.close)
            yield backend
            return
        if isinstance(client, str):
            client = stack.enter_context(connect(client))
        if client is None:
            client = _current_client()
        if client is None and source.in_memory and source.nbytes <= config.get_bytes("in-process-bytes"):
            backend = InProcessBackend(source, entropy, state)
        else:
            if client is None:
                client = stack.enter_context(connect())
            backend = ClusterBackend(client, source, entropy, state)
        stack.callback(backend.close)
        yield backend


UNGUARDED = (
    "dask_clust started a LocalCluster, whose worker processes re-run this script's top level (Python's "
    "multiprocessing 'spawn' rule): put the script's code under `if __name__ == \"__main__\":`"
)
_SPAWN_FLAG = "DASK_CLUST_UNGUARDED_FLAG"


def _leave_if_bootstrapping():
    """In a worker process that is importing an unguarded script as ``__mp_main__``, the script's call to
    dask_clust must not start another cluster: leave quietly, telling the parent why (it raises)."""
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    flag = os.environ.get(_SPAWN_FLAG)
    if flag:
        open(flag, "w").close()
    raise SystemExit(1)


def worker_environ():
    """dask's pre-spawn environment of a worker process, with ``MMAP_THRESHOLD`` (an explicit value in the
    environment or dask's config wins)."""
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    environ.setdefault("MALLOC_MMAP_THRESHOLD_", os.environ.get("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD)))
    return environ


@contextlib.contextmanager
def _local_cluster(n_workers, threads_per_worker):
    _leave_if_bootstrapping()
    with tempfile.TemporaryDirectory(prefix="dask-clust-") as tmp:
        flag = os.path.join(tmp, "unguarded")
        before = os.environ.get(_SPAWN_FLAG)
        os.environ[_SPAWN_FLAG] = flag
        quiet = logging.getLogger("distributed")
        level = quiet.level
        main = threading.current_thread() is threading.main_thread()
        # worker processes inherit an ignored SIGINT: Ctrl-C interrupts the driver, which shuts them down,
        # instead of every worker printing its own KeyboardInterrupt traceback
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            # the nannies' start-up errors are reported below, in one line, when the cause is known
            quiet.setLevel(logging.CRITICAL)
            try:
                # the nannies read it when they are made and use it for every (re)start of their worker
                with dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ()}):
                    cluster = distributed.LocalCluster(
                        n_workers=n_workers,
                        threads_per_worker=threads_per_worker,
                        processes=True,
                        dashboard_address=config.get("dashboard-address"),
                    )
            finally:
                quiet.setLevel(level)
                if main:
                    signal.signal(signal.SIGINT, handler)
        except Exception:
            if os.path.exists(flag):
                raise UnguardedScript(UNGUARDED) from None
            raise
        finally:
            if before is None:
                os.environ.pop(_SPAWN_FLAG, None)
            else:
                os.environ[_SPAWN_FLAG] = before
        with cluster:
            yield cluster


def dashboard_link(client):
    """The scheduler's dashboard address when its pages can be served (bokeh installed), else None."""
    if importlib.util.find_spec("bokeh") is None:
        return None
    return client.dashboard_link


def persisted(collection):
    """``collection.persist()`` once its pieces are in memory: on a distributed client ``persist`` returns at
    once (the estimators' ``labels_`` are documented as computed by ``fit``)."""
    collection = collection.persist()
    futures = distributed.futures_of(collection)  # none when dask's local scheduler computed it here
    if futures:
        distributed.wait(futures)
    return collection


@contextlib.contextmanager
def connect(address=None, n_workers=None, threads_per_worker=None):
    """A client made current for the block: to the scheduler at ``address``, or to a LocalCluster
    started here (sized to the machine unless given; scheduler and dashboard on loopback) and closed
    afterwards."""
    with contextlib.ExitStack() as stack:
        if address:
            timeout = config.get("connect-timeout")
            tls.check_settings(address)
            try:
                client = stack.enter_context(distributed.Client(address, timeout=timeout))
            except (ValueError, TypeError) as exc:  # not an address at all: say so, not dask's traceback
                hint = (
                    " (that is a dashboard's web address; the scheduler's is tcp://host:8786)"
                    if str(address).startswith(("http://", "https://"))
                    else ""
                )
                raise InputError(
                    f"{address!r} is not a Dask scheduler address: expected tcp://host:port, "
                    f"tls://host:port or host:port ({exc}){hint}"
                ) from None
            except (OSError, asyncio.TimeoutError) as exc:
                refused = tls.refusal(address, exc)
                if refused is not None:
                    raise refused from None
                raise SchedulerUnreachable(
                    f"no Dask scheduler answered at {address} within {timeout} ({type(exc).__name__})"
                ) from None
        else:
            workers, threads = local_cluster_size()
            logger.info("starting a LocalCluster with %d workers x %d threads", workers, threads)
            cluster = stack.enter_context(_local_cluster(n_workers or workers, threads_per_worker or threads))
            client = stack.enter_context(distributed.Client(cluster))
        link = dashboard_link(client)
        logger.info("dashboard: %s", link or "(pip install 'bokeh>=3.1' to serve it)")
        if link and progress.enabled():
            progress.note(f"dashboard: {link}")
        yield client
