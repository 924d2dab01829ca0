"""The Dask scheduler as a cluster fit sees it: its live workers, the wait for the first of them, the workers
this process has seen lost, and the rule that a lost scheduler ends the fit at once (``ClusterLost``)."""

import asyncio
import collections
import logging
import time

import distributed
from dask.utils import parse_timedelta

from .. import progress
from ..errors import ClusterLost, NoWorkers
from . import config

logger = logging.getLogger("dask_clust")

# the worker addresses this process has seen lost, per scheduler id (a restarted worker comes back at a new
# address; a new cluster's worker may be given a lost one's port, and must not be taken for it)
LOST_WORKERS = collections.defaultdict(set)

# how often a fit on a cluster without workers asks the scheduler whether one has come
WAIT_POLL_S = 0.5


class Scheduler:
    """What a fit asks of the scheduler behind ``client``. Every question is given up once the client has seen
    the scheduler go (``lost``: the client's status may still say "running" for a moment)."""

    def __init__(self, client):
        self.client = client
        self.lost = False
        self._lost_workers = None

    @property
    def lost_workers(self):
        """The addresses of the workers this process has seen lost on this scheduler (``LOST_WORKERS``)."""
        if self._lost_workers is None:
            self._lost_workers = LOST_WORKERS[self.identity()["id"]]
        return self._lost_workers

    def identity(self):
        self.check()
        try:
            return self.client.sync(self._identity)
        except OSError:
            self.check(lost=True)

    async def _identity(self):
        return await self.ask(self.client.scheduler.identity(**({"n_workers": -1} if _accepts_n_workers() else {})))

    async def ask(self, request):
        """A request to the scheduler, given up once the client has seen the scheduler go: a request sent just
        before a killed scheduler's connection broke retries connecting for comm.timeouts.connect (30 s), and
        the fit would wait that long for an answer that cannot come."""
        asked = asyncio.ensure_future(request)
        try:
            while not asked.done():
                self.check()
                await asyncio.wait({asked}, timeout=0.1)
            return asked.result()
        finally:
            asked.cancel()

    def check(self, lost=False):
        """A lost scheduler ends the fit at once: the workers close without their scheduler, the partitions
        with them, and a client that reconnects would find none of them."""
        if lost or self.client.status not in ("running", "newly-created"):
            self.lost = True
            raise ClusterLost(
                f"lost the Dask scheduler at {self.client.scheduler.address} (client status "
                f"{self.client.status!r}): the fit cannot continue; restart the cluster and fit again"
            )

    def worker_info(self):
        return self.identity()["workers"]

    def live_workers(self):
        """{address: threads} of the workers the scheduler has now."""
        return {addr: w.get("nthreads", 1) for addr, w in self.worker_info().items()}

    def await_worker(self):
        """Live workers once one is back (a nanny restarting the workers it killed), waiting up to
        ``lost-worker-timeout``; {} when none comes."""
        try:
            self.client.wait_for_workers(1, timeout=parse_timedelta(config.get("lost-worker-timeout")))
        except (TimeoutError, asyncio.TimeoutError):
            return {}
        return self.live_workers()

    def first_workers(self):
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
                workers = self.live_workers()
                if workers:
                    shown.update(len(workers))
                    return workers
        raise NoWorkers(
            f"the Dask cluster at {self.client.scheduler.address} has no workers: none came within {timeout:g} s "
            "(dask_clust.first-worker-timeout)"
        )


def _requested(client):
    """The workers the client's cluster object has asked for (a SpecCluster's: LocalCluster, dask-jobqueue's),
    or None (a client given a scheduler's address knows of none)."""
    requested = getattr(getattr(client, "cluster", None), "requested", None)
    return len(requested) if requested else None


def _accepts_n_workers():
    import inspect

    return "n_workers" in inspect.signature(distributed.Client.scheduler_info).parameters
