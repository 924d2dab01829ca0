"""The engine's two backends. ``InProcessBackend``: rule 6, small in-memory problems in this process, one
``Partition`` running the same path as on a cluster. ``ClusterBackend``: one ``Partition`` per worker, placed
where its chunks are loaded; a call goes from the driver straight to the root partition and down the tree.
It is composed of parts, each with its own module and testable alone: the scheduler as the fit sees it
(``workers.Scheduler``), where the partitions live (``placement.Placement``), the watch on a call and the
rebuild of lost partitions (``recovery.Recovery``) and row moves (``rows.RowMoves``); streaming is
``streaming.py``, the partitions' home on a worker ``host.py``, and where a fit runs, ``local.py``.

The engine is the only layer of dask_clust that imports ``distributed`` (ARCHITECTURE.md, layers).
"""

import logging
import os
import time

import psutil
from threadpoolctl import threadpool_limits

from . import config
from .data import FutureSource
from .host import return_heap
from .partition import Partition, partition_meta, remote_run, tree
from .placement import Placement
from .recovery import LOSSES, Recovery, Restarted
from .rows import RowMoves
from .streaming import loaders, resident_bytes, should_stream, state_in_files, streaming_memory
from .workers import Scheduler

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


class ClusterBackend:
    """One Partition per worker (``PartitionHost``); chunks placed in contiguous ranges, loaded on their
    worker. A call goes straight from the driver to the root partition and down a tree of fan-in ``split-every``; the
    partials come back up it, so the driver receives one finished result whatever the number of workers.

    Its parts: ``scheduler`` (``workers.Scheduler``), ``placement`` (``placement.Placement``), ``recovery``
    (``recovery.Recovery``) and ``rows`` (``rows.RowMoves``: ``Engine.sample`` and ``Engine.reorder`` on a
    cluster)."""

    kind = "cluster"
    in_process = False

    def __init__(self, client, source, entropy, state=(0, "the fit")):
        self.client = client
        self.source = source
        self.scheduler = Scheduler(client)
        workers = self.scheduler.live_workers() or self.scheduler.first_workers()
        info = self.scheduler.worker_info()
        total = psutil.virtual_memory().total
        memory = sum(w.get("memory_limit") or total for w in info.values())
        self.streaming = should_stream(source, memory, state)
        self.state_files = self.streaming and state_in_files(source, memory, state, info)
        self.stream_estimate = None  # bytes the most loaded worker is estimated to need while streaming
        keep = {}
        if self.streaming:
            self.stream_estimate = streaming_memory(source, state, info, self.state_files)
            keep = resident_bytes(source, state, info, total, self.state_files)
            logger.info(
                "streaming %.3g GB from its source on every pass (cluster memory %.3g GB)",
                source.nbytes / 1e9,
                memory / 1e9,
            )
        self.placement = Placement(self.scheduler, source, entropy, self.streaming, keep, self.state_files)
        self.recovery = Recovery(self.scheduler, self.placement)
        self.rows = RowMoves(self.placement)
        self.placement.place(workers)
        self.recovery.await_placement()
        self.n_workers = len(self.placement.futures)
        n, cluster_threads = source.n_chunks, sum(workers.values())
        if n < 2 * cluster_threads and source.nbytes >= 2 * cluster_threads * config.get_bytes("min-chunk-bytes"):
            logger.warning(
                "%d chunks for %d worker threads: some threads will idle. The chunking follows the data's "
                "size, not the cluster, so that the model is the same on any cluster; set "
                "dask_clust.min-chunks to %d for this cluster",
                n,
                cluster_threads,
                2 * cluster_threads,
            )

    def publisher(self, algo, shape, figure):
        """The fit's progress onto the dashboard's page of fits (``dashboard.py``), or None."""
        from .dashboard import publisher

        return publisher(self.client, algo, shape, figure)

    def partitions(self, source):
        """Per partition: (rows, memory limit of its worker in bytes)."""
        return self.placement.partitions()

    @property
    def threads(self):
        """The worker threads serving the partitions, as each was last placed (a partition placed again on
        another worker, during placement or after a loss, counts that worker's)."""
        return sum(self.placement.threads.values())

    @property
    def n_rebuilds(self):
        return self.recovery.n_rebuilds

    def _direct(self, call):
        """One call: to the root partition, down the tree, back up; ``peers`` lets partitions reach each other."""
        peers = self.placement.peers()

        def spell(sub):
            return [(peers[j][0], peers[j][1], spell(below)) for j, below in sub]

        children = spell(tree([key for _, key, _ in peers], config.get("split-every")))
        t = time.monotonic()
        out = self.client.sync(
            self.recovery.watched, remote_run(self.client.rpc(peers[0][0]), peers[0][1], call, children, True, peers)
        )
        self.recovery.slowest_call = max(self.recovery.slowest_call, time.monotonic() - t)
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
            gone = self.scheduler.lost_workers
            lost = [pid for pid, (addr, _) in enumerate(self.placement.where) if addr in gone]
            if not lost:
                try:
                    return self._direct(call)
                except Exception as exc:
                    lost = self.recovery.lost(exc)
                    if not lost or attempt == LOSSES:
                        raise
            for pid in lost:
                self.recovery.recover(pid, builders() if builders else [], call.id, shards() if shards else [])
            if not repeat:
                raise Restarted(lost)
            for plan in plans() if plans else []:
                self._direct(plan)
        raise AssertionError("unreachable")

    def close(self):
        """Release the partitions and the rows loaded for them now: the workers drop them at once, whether
        the fit ended or failed, instead of when the driver's garbage collector reaches these futures. A
        ``FutureSource``'s rows belong to the engine that drew them, which releases them."""
        keys = self.placement.release(own_rows=not isinstance(self.source, FutureSource))
        # a lost scheduler: nothing to ask, and asking waits 30 s (comm.timeouts.connect); the fit can see the
        # loss before the client's status changes
        if self.client.status == "running" and not self.scheduler.lost:
            return_heap(self.client, keys, sorted({a for a, _ in self.placement.where} - self.scheduler.lost_workers))
