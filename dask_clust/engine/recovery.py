"""Recovery of a cluster fit (ARCHITECTURE.md, rule 1): a call is watched while it runs (a worker of the fit
leaving the cluster, or one that stays connected and stops answering), a lost worker's partitions are
rebuilt on the survivors from their source, every declared state is rebuilt from the model, restored from a
buddy's copy or replayed, sharded models' shards are restored from their copies, and the call is repeated
(or, within ``Engine.rerun``, ``Restarted`` is raised)."""

import asyncio
import concurrent.futures
import contextlib
import logging
import time

import distributed
from dask.utils import parse_timedelta
from distributed.comm.core import CommClosedError
from distributed.protocol.pickle import dumps

from ..errors import ClusterLost
from . import config
from .backups import BACKUP_COPIES, buddies, restore_state
from .events import count
from .mailbox import remote_call
from .partition import remote_run
from .placement import GONE
from .sharded import restore_shards

_COMM_ERRORS = (
    OSError,
    CommClosedError,
    asyncio.CancelledError,
    concurrent.futures.CancelledError,
    distributed.scheduler.KilledWorker,
    asyncio.TimeoutError,
)

logger = logging.getLogger("dask_clust")


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


# lost workers in a row that one call, one partition's rebuild and one phase of ``Engine.rerun`` each outlast
# (each loss followed by a rebuild and a retry): past that, workers are lost faster than the fit recovers,
# and it ends in one line
LOSSES = 4

# how often a call that has not returned asks the scheduler whether one of the fit's workers has gone
WATCH_S = 0.5


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


# a worker that does not answer is busy, not frozen, when its process used at least BUSY_CPU of a core over
# BUSY_PROBE_S seconds: one compiling its kernels or starved on an overloaded node holds its event loop but
# runs (at a load of 16 on 2 cores, an eighth of a core); a stopped or cut-off one uses none
BUSY_PROBE_S = 1.0
BUSY_CPU = 0.02


def _process_cpu(dask_worker):
    """Run in a worker's nanny: the CPU seconds its worker process has used (user + system)."""
    import psutil

    return sum(psutil.Process(dask_worker.process.process.pid).cpu_times()[:2])


class Recovery:
    """The watch on a running call and the rebuild of lost partitions, of the partitions ``placement`` holds
    on the workers of ``scheduler`` (a ``workers.Scheduler``). ``slowest_call``: the longest call so far, in
    seconds (the caller's to set), since a call is not suspected of a frozen worker before 10 times it."""

    def __init__(self, scheduler, placement):
        self.scheduler = scheduler
        self.placement = placement
        self.slowest_call = 0.0
        self.n_rebuilds = 0

    @property
    def client(self):
        return self.scheduler.client

    def await_placement(self):
        """Wait until every partition runs. A partition's task is pinned to its worker: when that worker is lost
        before the partition starts, its task would wait for it forever (a kill during placement, or just before a
        coreset's engine opened), so the partition is placed again on a live worker, as after a loss
        in a call; so is one whose drawn rows a lost worker took (their futures cancelled: they are drawn again,
        ``Placement.load``), and one whose worker does not answer (``unresponsive``) once placement has taken
        ``unresponsive-worker-timeout``."""
        placement = self.placement
        check = time.monotonic() + 0.5
        limit = parse_timedelta(config.get("unresponsive-worker-timeout"))
        probe_at = time.monotonic() + limit
        while not all(f.status == "finished" for f in placement.futures):
            if time.monotonic() < check and not any(f.status in GONE for f in placement.futures):
                time.sleep(0.005)
                continue
            live = self.scheduler.live_workers()
            if time.monotonic() > probe_at:  # a worker that stopped answering never starts its partition
                waiting = {placement.where[pid][0] for pid, f in enumerate(placement.futures) if f.status != "finished"}
                live = {a: t for a, t in live.items() if a not in self.client.sync(self.unresponsive, waiting, limit)}
                probe_at = time.monotonic() + limit
            for pid, f in enumerate(placement.futures):
                if f.status == "finished":
                    continue
                if placement.where[pid][0] not in live or (f.status == "cancelled" and placement.remakes()):
                    f.cancel()
                    self.recover(pid, [], -1)
                elif f.status in GONE:
                    f.result()
            check = time.monotonic() + 0.5

    async def watched(self, running):
        """Await a call while ``_watch`` asks the scheduler whether a worker of the fit has gone. A partition
        that sends to a killed worker retries connecting to it for comm.timeouts.connect (30 s) before it fails;
        the scheduler knows at once, so the call is abandoned as lost and the caller rebuilds and repeats it."""
        task = asyncio.ensure_future(running)
        watch = asyncio.ensure_future(self._watch({addr for addr, _ in self.placement.where}))
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
                # a lost scheduler raises ClusterLost here: a call on workers relaying to a closing peer can
                # outlast it by comm.timeouts.connect (30 s)
                with contextlib.suppress(OSError, CommClosedError, asyncio.TimeoutError):
                    gone = placed - set(await self.scheduler.ask(self.client.scheduler.ncores()))
                if gone:
                    raise CommClosedError(f"worker(s) {sorted(gone)} of the fit left the cluster during a call")
                if probe is None and time.monotonic() > probe_at:
                    probe = asyncio.ensure_future(self.unresponsive(placed, limit))
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

    async def unresponsive(self, addrs, limit):
        """The workers of ``addrs`` that do not answer an identity request within ``limit`` seconds, restarted
        (``_watch``); a worker already gone counts as answering (the scheduler reports it)."""

        async def answers(addr):
            try:
                await asyncio.wait_for(self.client.rpc(addr).identity(), limit)
            except asyncio.TimeoutError:
                return await self._busy(addr, limit)
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
            self.scheduler.lost_workers.update(silent)
            with contextlib.suppress(Exception):  # (a nanny SIGKILLs a worker that does not stop within 4 s)
                await self.client.scheduler.restart_workers(
                    workers=silent,
                    timeout=max(limit, 10.0),
                    wait_for_workers=False,
                    on_error="return",
                    stimulus_id=f"dask-clust-unresponsive-{time.time()}",
                )
        return silent

    async def _busy(self, addr, limit):
        """Whether a worker that did not answer within ``limit`` is busy rather than frozen: its process, as its
        nanny sees it, used CPU over BUSY_PROBE_S (``BUSY_CPU``). Without a nanny, or one that does not answer
        either, it is taken for frozen."""

        async def cpu():
            msg = dict(op="run", function=dumps(_process_cpu), args=dumps(()), kwargs=dumps({}), wait=True)
            with contextlib.suppress(Exception):  # no nanny, a nanny gone or cut off: nothing to tell
                out = await asyncio.wait_for(
                    self.client.scheduler.broadcast(msg=msg, workers=[addr], nanny=True, on_error="return_pickle"),
                    limit,
                )
                reply = next(iter(out.values()), None)
                if isinstance(reply, dict) and reply.get("status") == "OK":
                    return float(reply["result"])
            return None

        before = await cpu()
        if before is None:
            return False
        await asyncio.sleep(BUSY_PROBE_S)
        after = await cpu()
        busy = after is not None and after - before >= BUSY_CPU * BUSY_PROBE_S
        if busy:
            count("busy", addr=addr)
            logger.info(
                "worker %s did not answer within %g s but its process is running (%.2f CPU s in %g s): busy, "
                "not frozen; left alone",
                addr,
                limit,
                after - before,
                BUSY_PROBE_S,
            )
        return busy

    def lost(self, exc):
        """The partitions whose worker the scheduler has dropped, after a communication error (waits up
        to ``lost-worker-timeout`` for the scheduler to confirm)."""
        if not _worker_gone(exc):
            return []
        deadline = time.monotonic() + parse_timedelta(config.get("lost-worker-timeout"))
        while True:
            live = self.scheduler.live_workers()
            where = self.placement.where
            lost = [pid for pid, (addr, _) in enumerate(where) if addr not in live]
            if not lost and time.monotonic() > deadline:  # found unresponsive, and still listed
                lost = [pid for pid, (addr, _) in enumerate(where) if addr in self.scheduler.lost_workers]
            if lost or time.monotonic() > deadline:
                return lost
            time.sleep(0.1)

    def recover(self, pid, builders, call_id, shards=()):
        """Partition ``pid``, whose worker was lost, placed again on a live worker: its rows loaded there, then
        every declared state rebuilt (``builders``, ``backups.restore_state``) and the shards of every sharded
        model in ``shards`` restored (``sharded.restore_shards``); ``call_id``: the call it was lost in."""
        placement, scheduler = self.placement, self.scheduler
        scheduler.lost_workers.add(placement.where[pid][0])
        count("lost", pid=pid)
        for attempt in range(LOSSES + 1):
            ids = placement.where[pid][1]
            workers = scheduler.live_workers() or scheduler.await_worker()
            if not workers:
                raise WorkerLost(
                    [pid],
                    f"the cluster has no worker left (it had {len(set(a for a, _ in placement.where))}; "
                    f"none came back within lost-worker-timeout)",
                )
            # (a worker found unresponsive may still be listed while its nanny kills it)
            addr = self.target(pid, {a: t for a, t in workers.items() if a not in scheduler.lost_workers} or workers)
            logger.warning("worker of partition %d lost; rebuilding its %d chunks on %s", pid, len(ids), addr)
            try:
                futs = placement.load(ids, addr)
                part_future = placement.spawn(pid, ids, addr, futs, workers[addr])
                self._started(part_future, addr)
                part = Rebuilding(placement, pid, addr, part_future.key)
                for order, declared in enumerate(builders):
                    why = restore_state(part, order, *declared, call_id)
                    if why is not None:
                        raise WorkerLost([pid], why)
                why = restore_shards(part, shards)
                if why is not None:
                    raise WorkerLost([pid], why)
            except Exception as exc:
                # KeyError: the scheduler dropped the chosen worker while rows were sent to it (all were lost)
                if attempt < LOSSES and isinstance(exc, (*_COMM_ERRORS, KeyError)):
                    continue  # (a cancelled future of drawn rows is made again by the next load)
                raise
            placement.moved(pid, addr, futs, part_future)
            scheduler.lost_workers.discard(addr)  # live again: a new worker may reuse a lost one's port
            self.n_rebuilds += 1
            count("rebuilt", pid=pid, addr=addr)
            return
        raise WorkerLost([pid])

    def target(self, pid, workers):
        """Where partition ``pid`` is rebuilt: the least-loaded live worker that holds none of the partitions
        keeping its backups or whose backups it keeps (one loss would otherwise take a state and its copy),
        unless every worker does."""
        where = self.placement.where
        n = len(where)
        near = {where[(pid + j) % n][0] for j in range(-BACKUP_COPIES, BACKUP_COPIES + 1) if j}
        load = {a: 0 for a in workers}
        for a, _ in where:
            if a in load:
                load[a] += 1
        apart = [a for a in sorted(load) if a not in near] or sorted(load)
        return min(apart, key=load.get)

    def _started(self, part_future, addr):
        """Wait for a rebuilt partition to run. Its task is pinned to ``addr``: once that worker has left (or
        stopped answering, ``_unresponsive``) its task would wait for it forever, so that raises a comm error
        and ``recover`` places the partition again."""
        limit = parse_timedelta(config.get("unresponsive-worker-timeout"))
        deadline = time.monotonic() + limit
        while True:
            try:
                return part_future.result(timeout=WATCH_S)
            except TimeoutError:
                pass
            gone = addr not in self.scheduler.live_workers()
            if not gone and time.monotonic() > deadline:
                gone = bool(self.client.sync(self.unresponsive, {addr}, limit))
                deadline = time.monotonic() + limit
            if gone:
                part_future.cancel()
                raise CommClosedError(f"worker {addr} left before the partition started on it")


class Rebuilding:
    """A lost partition being rebuilt on ``addr``, as each feature's recovery hook sees it
    (``backups.restore_state``, ``sharded.restore_shards``): its buddies asked, itself called, and the
    partitions around it told to send their copies again."""

    def __init__(self, placement, pid, addr, part_key):
        self.pid = pid
        self.ids = placement.where[pid][1]
        self._scheduler = placement.scheduler
        self._client = placement.client
        self._rpc = self._client.rpc(addr)
        self._key = part_key
        self._peers = placement.peers()
        self._peers[pid] = (addr, part_key, self.ids)

    def _reachable(self):
        """The workers a peer may be asked on: one that has left would be retried for comm.timeouts.connect
        (30 s)."""
        return set(self._scheduler.live_workers()) - self._scheduler.lost_workers

    def from_buddies(self, message):
        """The answer to ``message`` (a ``mailbox.peer_call`` type) of the first of the partition's buddies
        (``backups.buddies``) that answers something other than None; None when none does."""
        reachable = self._reachable()
        for addr, part_key, _ in buddies(self._peers, self.pid):
            if addr not in reachable:
                continue
            try:
                kept = self._client.sync(remote_call, self._client.rpc(addr), part_key, message)
            except Exception as exc:
                if _worker_gone(exc):
                    continue
                raise
            if kept is not None:
                return kept
        return None

    def call(self, message):
        """``message`` (a ``mailbox.peer_call`` type) on this partition: its answer."""
        return self._client.sync(remote_call, self._rpc, self._key, message)

    def run(self, call):
        """``call`` on this partition alone (a builder, a replay)."""
        self._client.sync(remote_run, self._rpc, self._key, call, [], True)

    def tell_keepers(self, message):
        """``message(peers)`` (a ``mailbox.peer_call`` type) on this partition and the ``BACKUP_COPIES`` before
        it (whose copies it kept), ``peers`` as they are now: a partition lost and not rebuilt yet is None, and
        gets its copies when it is."""
        reachable = self._reachable()
        peers = [p if j == self.pid or p[0] in reachable else None for j, p in enumerate(self._peers)]
        for j in range(min(BACKUP_COPIES, len(peers) - 1) + 1):  # itself (its buddies may be new too), then
            before = peers[(self.pid - j) % len(peers)]  # those whose copies it kept
            if before is None:
                continue
            try:
                self._client.sync(remote_call, self._client.rpc(before[0]), before[1], message(peers))
            except _COMM_ERRORS:  # that one is lost too: it is rebuilt next, and its next write copies again
                pass
