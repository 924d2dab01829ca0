"""Where a fit runs: the client it is given, the current one, a scheduler address (``connect``, with its
TLS settings checked first), or a LocalCluster sized to the machine and started for the fit; the backend
for it (``backend_for``)."""

import asyncio
import contextlib
import importlib.util
import logging
import multiprocessing
import os
import signal
import tempfile
import threading

import dask
import distributed

from .. import progress
from ..errors import InputError, SchedulerUnreachable, UnguardedScript, install_hint
from . import config, dashboard, tls
from .cluster import IN_PROCESS, ClusterBackend, InProcessBackend

logger = logging.getLogger("dask_clust")


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
        logger.info("dashboard: %s", link or f"(bokeh serves it: {install_hint('dashboard')})")
        if link and progress.enabled():
            progress.note(dashboard.shown_beside(client, link))
        yield client


# glibc's mmap threshold for worker processes. dask's nannies set MALLOC_TRIM_THRESHOLD_, which freezes the
# threshold at 128 KiB: every larger temporary (a halo's values, a step's (rows, k) arrays) is then a fresh
# mmap whose pages fault in on first touch, every call. On a 2-core VM that doubled SLK's time per bound
# update on 2 workers (mnist5k: 7.6-8.7 s -> 4.8-6.5 s with 16 MiB). Arrays below it are reused from the
# heap; larger ones, which amortise their faults over their work, still go back to the system when freed.
MMAP_THRESHOLD = 16 << 20
