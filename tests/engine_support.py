"""Helpers the engine's cluster tests share: worker pids, a fit with a fault injected at an iteration
(``churn_fit``), rebuild counting, a scheduler and workers as separate processes."""

import contextlib
import glob
import os
import signal
import time
from unittest import mock

import dask_clust
from dask_clust.engine import streaming


def worker_pids(client):
    return client.run(os.getpid)


KILL_PARAMS = {
    "kmeans": dict(tol=0),
    "nmbatch": dict(batch_size=4000, rho=10.0),
    "minibatch": dict(batch_size=500),
    "sbe": dict(omaxit=8, eval_every=2),
    "vrkm": dict(max_epochs=6),
    "vcgmm": dict(coreset_size=20_000, tol=0, max_iter=8),
    "vargmm": dict(tol=0, max_iter=8),
}


# "<algo>-diag": the algorithm fitting a diagonal mixture with learned weights
MODELS = {"diag": dict(covariance_type="diag", weights="learned")}


def churn_fit(client, algo, event, rebuilt=()):
    """The undisturbed fit (which rebuilds nothing: ``rebuilt`` stays empty) and the fit with ``event(pids by
    address)`` run after iteration 3, on 60,000 lazy 8-d blobs (a lost chunk is recomputed), vc-GMM's
    20k-row coreset on the workers in 5 chunks so that its partitions have buddies to keep their K^(n),
    "-sharded": the model sharded on the workers, "-diag": a diagonal mixture (``MODELS``), "-streamed": the
    rows streamed and the state in files; (calm, hit, hit's wall time)."""
    import dask

    from dask_clust.datasets import make_blobs

    X, _ = make_blobs(60_000, 8, 20, chunks=6000, random_state=5)
    name = algo.split("-")[0]
    kw = dict(algo=name, n_clusters=20, random_state=0, **KILL_PARAMS[name])
    for part in algo.split("-")[1:]:
        kw.update(MODELS.get(part, {}))
    settings = {"dask_clust.in-process-bytes": "1KiB", "dask_clust.working-set-chunk-rows": 4000}
    if algo.endswith("-sharded"):
        settings["dask_clust.model-bytes"] = "1"
    keep = streaming.KEEP_FRACTION
    if "-streamed" in algo:  # read from its source on every pass (no chunk kept), the state in the workers' files
        settings.update({"dask_clust.stream": True, "dask_clust.state-files": True})
        keep = 0.0
    with dask.config.set(settings), mock.patch.object(streaming, "KEEP_FRACTION", keep):
        calm = dask_clust.fit(X, client=client, **kw)
        assert not rebuilt
        pids = worker_pids(client)

        def at_3(rec):
            if rec["iteration"] == 3:
                event(pids)

        t = time.monotonic()
        hit = dask_clust.fit(X, client=client, callback=at_3, **kw)
    return calm, hit, time.monotonic() - t


def slowly_decoded(block):
    """A stored block that takes 0.1 s to decode (a streamed pass long enough to be hit in its middle)."""
    time.sleep(0.1)
    return block


def state_dirs(dask_worker):
    """This worker's partitions' state-file directories (``client.run``)."""
    scratch = os.path.dirname(dask_worker.local_directory)
    return glob.glob(os.path.join(scratch, f"dask_clust-state-{os.getpid()}-*"))


def kill_all(pids):
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def separate_cluster(d, n_workers=2, nanny=True):
    """A scheduler and ``n_workers`` workers (each with its nanny unless not ``nanny``) started as separate
    processes on 127.0.0.1: (client, [scheduler process, worker processes])."""
    sched_file = str(d / "scheduler.json")
    from harness.common import dask_process  # here: the workers import this module, not the harness

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [dask_process("scheduler", sched_file, env=env)]
    deadline = time.time() + 60
    while not os.path.exists(sched_file) and time.time() < deadline:
        time.sleep(0.2)
    procs += [dask_process("worker", sched_file, nanny, env) for _ in range(n_workers)]
    try:
        from distributed import Client

        with Client(scheduler_file=sched_file, set_as_default=False) as client:
            client.wait_for_workers(n_workers, timeout=60)
            yield client, procs
    finally:
        for p in procs[::-1]:
            p.kill() if p.poll() is None and p is procs[0] else p.terminate()
        for p in procs:
            p.wait(timeout=30)
