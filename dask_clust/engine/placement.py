"""Where a cluster fit's partitions live: one ``Partition`` per worker over a contiguous range of chunks,
started by a task pinned to that worker (``host.host``) over its rows' futures (or, streaming, their loaders).
Recovery moves a partition by loading its rows and starting it again elsewhere (``Placement.moved``)."""

import logging
import uuid

import distributed
import psutil

from .. import progress
from .data import ArraySource, FutureSource, file_stamp
from .events import count
from .host import host
from .partition import home, partition_meta
from .streaming import loaders

logger = logging.getLogger("dask_clust")

# a future whose value is gone: its worker was lost and Dask cannot compute it again (scattered rows, or a
# task whose inputs were)
GONE = ("cancelled", "lost", "error")


class Placement:
    """Per partition: its worker and chunk ids (``where``), the future that keeps it running on that worker
    (``futures``: a released future drops the partition), its rows' futures or loaders (``data``) and the
    threads of its worker (``threads``). ``keep``: per worker address, (bytes of streamed rows its partition
    may keep, whether it reads ahead)."""

    def __init__(self, scheduler, source, entropy, streaming=False, keep=None, state_files=False):
        self.scheduler = scheduler
        self.source, self.entropy = source, entropy
        self.streaming, self.state_files = streaming, state_files
        self.keep = keep or {}
        self.where = []
        self.futures = []
        self.data = []
        self.threads = {}
        self.n_parts = 0
        self._file_seen = {}  # worker address -> whether it sees the .npy file the source maps

    @property
    def client(self):
        return self.scheduler.client

    def place(self, workers):
        """The chunks in contiguous ranges over ``workers`` ({address: threads}), each range's rows loaded on
        its worker and its partition started there (not yet running: ``Recovery.await_placement``)."""
        addrs = sorted(workers)
        n = self.source.n_chunks
        groups = [[i for i in range(n) if home(i, n, len(addrs)) == w] for w in range(len(addrs))]
        self.n_parts = sum(1 for ids in groups if ids)
        for addr, ids in zip(addrs, groups):
            if ids:
                self.where.append((addr, ids))
                futs = self.load(ids, addr)
                self.data.append(futs)
                self.futures.append(self.spawn(len(self.futures), ids, addr, futs, workers[addr]))
        if progress.enabled() and not self.streaming:
            for _ in distributed.as_completed([f for futs in self.data for f in futs]):
                progress.advance()

    def peers(self):
        """Per partition (worker address, key, chunk ids): how partitions reach each other."""
        return [(addr, f.key, ids) for (addr, ids), f in zip(self.where, self.futures)]

    def moved(self, pid, addr, futs, future):
        """Partition ``pid`` now runs on ``addr`` (``future``) over the rows ``futs``."""
        self.where[pid] = (addr, self.where[pid][1])
        self.data[pid] = futs
        self.futures[pid] = future

    def partitions(self):
        """Per partition: (rows, memory limit of its worker in bytes)."""
        info = self.scheduler.worker_info()
        total = psutil.virtual_memory().total
        starts = self.source.starts
        return [
            (
                int(sum(starts[i + 1] - starts[i] for i in ids)),
                int(info.get(addr, {}).get("memory_limit") or total),
            )
            for addr, ids in self.where
        ]

    def spawn(self, pid, ids, addr, futs, threads):
        """Start partition ``pid`` on ``addr`` over the rows ``futs`` of chunks ``ids``; its future."""
        self.threads[pid] = int(threads)
        # a worker given a lost worker's partition besides its own keeps none of the new one's rows
        alone = all(a != addr for p, (a, _) in enumerate(self.where) if p != pid)
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

    def remakes(self):
        """Whether the source's rows can be drawn again after a loss (a ``FutureSource`` of drawn rows)."""
        return getattr(self.source, "remake", None) is not None

    def load(self, ids, addr):
        """The chunks' data for a partition on ``addr``: futures of rows loaded there, or loaders. Rows drawn
        or moved on the cluster whose futures a lost worker cancelled are made again from their origin."""
        if self.streaming:
            return loaders(self.source, ids)
        if isinstance(self.source, FutureSource):
            if self.remakes() and any(self.source.futures[i].status in GONE for i in ids):
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

    def release(self, own_rows=True):
        """Release the partitions and (``own_rows``) the rows loaded for them: the workers drop them at once.
        Returns the released keys."""
        mine = [f for futs in self.data for f in futs] if own_rows else []
        futures = [f for f in self.futures + mine if hasattr(f, "release")]  # (streamed: loaders)
        keys = [f.key for f in futures]
        for f in futures:
            f.release()
        self.futures = []
        self.data = []
        return keys


def _sees_file(path, stamp):
    try:
        return file_stamp(path) == stamp
    except OSError:
        return False
