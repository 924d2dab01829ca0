"""The partitions' home on a worker (``PartitionHost``, a worker extension: not Dask actors), the task that
makes one, and the heap a finished fit leaves free returned to the system."""

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time

import distributed

from .mailbox import PEER_CALLS
from .partition import Partition

# how long a finished fit waits for its workers to be asked to return their free heap (``_return_heap``)
RETURN_HEAP_S = 2.0


async def _return_heap(keys, dask_worker=None):
    """On a worker, once a finished fit's partitions and rows are gone from it: the heap they leave free goes
    back to the system (``malloc_trim``). Arrays under the workers' 16 MiB mmap threshold (``MMAP_THRESHOLD``)
    are heap, kept for reuse; without this a worker's resident size grows fit after fit."""
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
    distributed's own ``actor_execute`` reaches an actor, with a typed message (``mailbox.peer_call``):
    coroutine methods on the event loop, the others on one thread of their own so that they never block it."""

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

    async def call(self, key=None, kind=None, fields=()):
        from distributed.protocol import to_serialize

        part = self.parts.get(key)
        try:
            if part is None or kind not in PEER_CALLS:
                raise LookupError(
                    f"partition {key} is not on worker {self.worker.address}: lost with an earlier "
                    f"process at this address, or released"
                    if part is None
                    else f"{getattr(kind, '__name__', kind)!r} is not a partition's call"
                )
            message = kind(*fields)
            fn = message.method.__get__(part.feature(message.feature))
            if asyncio.iscoroutinefunction(fn):
                result = await fn(*message)
            else:
                result = await asyncio.get_running_loop().run_in_executor(self._thread, fn, *message)
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
    # state files beside the node's worker directories (on HPC, the node's scratch that dask-jobqueue names), not
    # in this worker's, which distributed removes as it closes, while the partition removes its own
    part = Partition(dict(meta, scratch=os.path.dirname(worker.local_directory)), *blocks)
    part.worker = worker
    PartitionHost.of(worker).parts[worker.get_current_task()] = part


def _ask_quietly(client, fn, keys, addrs):
    with contextlib.suppress(Exception):
        client.run(fn, keys, workers=addrs, wait=False)


def return_heap(client, keys, addrs):
    """Ask the workers ``addrs`` to return the heap a finished fit's ``keys`` leave free, waiting at most
    ``RETURN_HEAP_S``: reaching a worker that stopped answering waits for ever (even with wait=False: the
    scheduler connects to each)."""
    asked = threading.Thread(target=_ask_quietly, args=(client, _return_heap, keys, addrs), daemon=True)
    asked.start()
    asked.join(RETURN_HEAP_S)
