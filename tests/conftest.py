import contextlib
import os
import time
from pathlib import Path

import dask
import numpy as np
import pytest

from tests.reference.make_blobs import blobs

ROOT = Path(__file__).resolve().parents[1]
# Subprocesses (the CLI, notebook kernels, the README's scripts) import this tree's dask_clust, as the tests
# and their clusters' workers do, rather than the installed copy: one copy of the code, so one numba cache
# that every process shares (the installed copy's own cache cost a fresh CI run minutes of compiling).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

# small test data still gets many chunks, so every multi-chunk path runs
dask.config.set({"dask_clust.min-chunk-bytes": "1KiB", "dask_clust.lost-worker-timeout": "20s"})
# A LocalCluster closes a worker's nanny for good when, deploy.lost-worker-timeout (15 s) after the worker's
# removal, no worker of the same name is registered: a worker the kill tests kill again within 15 s, caught
# while its nanny restarts it, never came back, and every later test waited 60 s for it (CI, 21 failures)
dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"})


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """On a fresh install, compile the kernels into numba's cache once, in parallel parts, before any test
    or worker process would compile them itself (``dask_clust.warmup``): the workers of one cluster reach
    each kernel at the same moment, so each kernel was compiled once per worker instead of once (about 3 of
    a CI run's 14 minutes). Runs in the xdist controller, before it starts its workers; skipped once the
    cache holds the kernels."""
    from dask_clust import kernels, warmup

    if hasattr(session.config, "workerinput") or any((Path(kernels.__file__).parent / "__pycache__").glob("*.nbi")):
        return
    # a part that fails leaves its kernels to be compiled where the tests need them
    with contextlib.suppress(RuntimeError):
        warmup.compile_kernels(cwd=ROOT)


@pytest.fixture(scope="session")
def small_blobs():
    X, y = blobs(3000, 4, 6, seed=1)
    return X, y


@pytest.fixture(scope="session")
def cluster():
    """A LocalCluster with worker processes: 2 workers x 1 thread (the acceptance layout)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc:
        with Client(lc, set_as_default=False) as client:
            yield client


@pytest.fixture
def input_chunks():
    """Keep a dask input's own row chunks (``dask_clust.chunking = "input"``): for tests of how the chunking
    itself changes, or does not change, a fit."""
    with dask.config.set({"dask_clust.chunking": "input"}):
        yield


@pytest.fixture(params=[np.float32, np.float64], ids=["float32", "float64"])
def dtype(request):
    return request.param


def rtol_for(dtype):
    return 1e-5 if np.dtype(dtype) == np.float32 else 1e-10


@pytest.fixture(scope="module")
def _three_worker_client():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0") as lc,
        Client(lc, set_as_default=False) as client,
    ):
        yield client


@pytest.fixture
def three_workers(_three_worker_client):
    """3 single-thread worker processes under nannies (a killed worker is restarted at a new address), all
    three back from the last test's kills and answering: just after a SIGKILL the scheduler can still list the
    dead worker, so ``wait_for_workers(3)`` alone can return at once and a fit meant to be undisturbed would
    then lose a partition; each listed worker must answer a call."""
    client, deadline = _three_worker_client, time.monotonic() + 60
    while True:
        client.wait_for_workers(3, timeout=max(1.0, deadline - time.monotonic()))
        answers = client.run(os.getpid, on_error="return")
        if len(answers) == 3 and all(isinstance(pid, int) for pid in answers.values()):
            return client
        if time.monotonic() > deadline:
            raise TimeoutError(f"3 answering workers not back within 60 s: {answers}")
        time.sleep(0.1)


@pytest.fixture
def lost():
    """The partitions whose worker every engine of this process found lost during the test, in order (the
    engine's ``lost`` event: a coreset's engine, which the fitted model does not describe, included)."""
    from dask_clust.engine import events

    found = []
    with events.watch("lost", lambda pid: found.append(pid)):
        yield found
