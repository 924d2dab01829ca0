"""The fit's processes: nothing left on the workers after a fit, the library's LocalCluster on loopback only
with its mmap threshold, BLAS on one thread without a nanny, a scheduler and workers as separate
processes."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import dask_clust
from tests.engine_support import separate_cluster, worker_pids

# every test here starts processes (a cluster, its workers, a kernel): not in the fast tier
pytestmark = pytest.mark.cluster


def _held(dask_worker):
    """A worker's partitions, keys in memory and resident bytes."""
    import psutil

    host = dask_worker.extensions.get("dask_clust")
    return len(host.parts if host else ()), len(dask_worker.data), psutil.Process().memory_info().rss


def test_fits_leave_no_partition_or_rows_on_the_workers(cluster):
    """Issue #20: 18 fits in a row (6 algorithms; one fit fails in its callback, and its traceback is kept)
    each leave no partition and no rows on the workers once they return (within the scheduler's
    release round trip), with the driver's cyclic garbage collector off, so nothing waits for it; worker
    memory ends near where it was after a first fit of each (numba's compiled kernels and the first
    allocations are in the start)."""
    import gc

    import dask

    X = np.random.default_rng(0).standard_normal((400_000, 8)).astype(np.float32)
    loops = {"vrkm": {"max_epochs": 3}}

    def fit(algo, callback=None):
        return dask_clust.fit(
            X,
            algo=algo,
            n_clusters=8,
            random_state=0,
            client=cluster,
            callback=callback,
            **loops.get(algo, {"max_iter": 3}),
        )

    def boom(record):
        raise RuntimeError("the user's callback failed")

    def settled(want):
        deadline = time.monotonic() + 10
        while True:
            held = cluster.run(_held)
            if all(a == 0 and d <= want[w][1] for w, (a, d, _) in held.items()) or time.monotonic() > deadline:
                return held
            time.sleep(0.05)

    algos = ("kmeans", "vcgmm", "vargmm", "nmbatch", "minibatch", "vrkm")
    for algo in algos:  # numba compiles each algorithm's kernels on the workers at its first fit
        fit(algo)
    # the start may still hold keys of the last warm-up fit on their way out (a CI run under load saw 4): each
    # fit must end with no more than it, so a leak still grows past it within the 18 fits
    start = settled(cluster.run(_held))
    gc.disable()
    try:
        # vc-GMM's coreset stays on the workers, in an engine of its own
        with dask.config.set({"dask_clust.in-process-bytes": "1KiB", "dask_clust.working-set-chunk-rows": 4096}):
            for i in range(18):
                algo = algos[i % 6]
                if i == 7:  # its traceback kept, as Jupyter keeps sys.last_traceback: its frames hold the engines
                    with pytest.raises(RuntimeError, match="the user's callback failed") as failed:
                        fit(algo, callback=boom)
                else:
                    fit(algo)
                held = settled(start)
                assert held.keys() == start.keys(), (i, algo)
                assert all(h[0] == 0 and h[1] <= start[w][1] for w, h in held.items()), (i, algo, held, start)
    finally:
        gc.enable()
    # the leak check is the one above (no partition, no key beyond the start's); resident memory is the issue's
    # line: within 10 % of the start (the heap a fit frees is given back when it ends: before, glibc kept it,
    # +11 % here);
    # 18 fits' leaked rows would be 6.4 MB each, +51 %
    time.sleep(0.5)  # the last fit's heap is given back once its keys are gone
    held = cluster.run(_held)
    for w, (_, _, rss) in held.items():
        assert rss <= 1.10 * start[w][2], (w, rss / start[w][2])
    assert failed.traceback


_LIBRARY_CLUSTER = """
import json
import os

import psutil

from dask_clust.engine.local import connect


def threshold():
    return os.environ.get("MALLOC_MMAP_THRESHOLD_")


def listening():
    me = psutil.Process()
    procs = [me] + me.children(recursive=True)
    return sorted({c.laddr.ip for p in procs for c in p.net_connections(kind="inet") if c.status == "LISTEN"})


if __name__ == "__main__":
    with connect(n_workers=1, threads_per_worker=1) as client:
        first = list(client.run(threshold).values())
        ips = listening()
        client.restart()
        print(json.dumps({"mmap": [first, list(client.run(threshold).values())], "listening": ips}))
"""


@pytest.mark.parametrize("preset,dashboard", [(None, None), ("1048576", None), (None, ":0")])
def test_library_local_cluster_is_loopback_only_and_sets_the_mmap_threshold(tmp_path, preset, dashboard):
    """The LocalCluster dask_clust starts listens on 127.0.0.1 only: scheduler, dashboard pages, nannies and
    workers (issue #20: the dashboard answered on every interface), unless the user opens the dashboard with
    dask_clust.dashboard-address. It gives its worker processes glibc's MALLOC_MMAP_THRESHOLD_ before they
    start (dask's MALLOC_TRIM_THRESHOLD_ would pin it at 128 KiB), and again when a nanny restarts one; a
    value the user set wins. In a process of its own: a nanny writes its settings into the environment of
    the process that starts it."""
    from dask_clust.engine.local import MMAP_THRESHOLD

    script = tmp_path / "run.py"
    script.write_text(_LIBRARY_CLUSTER)
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    if preset:
        env["MALLOC_MMAP_THRESHOLD_"] = preset
    if dashboard:
        env["DASK_DASK_CLUST__DASHBOARD_ADDRESS"] = dashboard
    env["PYTHONPATH"] = os.getcwd()
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else out.stderr[-2000:]
    want = [preset or str(MMAP_THRESHOLD)]
    assert got["mmap"] == [want, want], got
    if dashboard:  # the dashboard on every interface, the rest still on loopback
        assert "127.0.0.1" in got["listening"] and set(got["listening"]) & {"0.0.0.0", "::"}, got
    else:
        assert got["listening"] == ["127.0.0.1"], got


@pytest.fixture(scope="module")
def loopback_cluster(tmp_path_factory):
    """A scheduler and 2 workers started as separate processes on 127.0.0.1."""
    with separate_cluster(tmp_path_factory.mktemp("sched")) as (client, _):
        yield client


def _blas_threads():
    from threadpoolctl import threadpool_info

    return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def test_workers_without_a_nanny_run_blas_on_one_thread(tmp_path):
    """Issue #20: a worker started without a nanny lacks the nanny's OMP/OPENBLAS_NUM_THREADS = 1, so its BLAS
    ran on every core and nmbatch's and VRKM's objectives differed from in-process in the last bit; a
    partition pins it to one thread, as the in-process backend does, and the models are the in-process ones,
    also when one of the 3 workers is killed mid-fit (nothing restarts it)."""
    X = np.random.default_rng(4).standard_normal((60_000, 24)).astype(np.float32)
    fits = {"nmbatch": {}, "vrkm": {"max_epochs": 4}}

    def models(client):
        return {
            algo: dask_clust.fit(X, algo=algo, n_clusters=40, random_state=2, client=client, **kw)
            for algo, kw in fits.items()
        }

    with separate_cluster(tmp_path, nanny=False, n_workers=3) as (client, _):
        remote = models(client)
        threads = client.run(_blas_threads)
        # no nanny brings a killed worker back: its partitions are rebuilt on the other two
        victim = sorted(worker_pids(client).values())[2]

        def kill_at_2(record):
            if record["iteration"] == 2:
                os.kill(victim, signal.SIGKILL)

        hit = dask_clust.fit(
            X, algo="vrkm", n_clusters=40, random_state=2, client=client, callback=kill_at_2, **fits["vrkm"]
        )
        assert hit.engine_["rebuilds"] >= 1 and len(client.scheduler_info()["workers"]) == 2
    local = models("in-process")
    assert set(threads.values()) == {1}, threads
    for algo in fits:
        np.testing.assert_array_equal(remote[algo].cluster_centers_, local[algo].cluster_centers_)
        assert remote[algo].objective_ == local[algo].objective_, algo
    np.testing.assert_array_equal(hit.cluster_centers_, local["vrkm"].cluster_centers_)
    assert hit.objective_ == local["vrkm"].objective_


def test_separate_scheduler_and_workers_on_loopback(loopback_cluster, small_blobs):
    X, _ = small_blobs
    addr = loopback_cluster.scheduler.address
    assert addr.startswith("tcp://127.0.0.1:")
    local = dask_clust.fit(X, n_clusters=6, random_state=2, client="in-process")
    remote = dask_clust.fit(X, n_clusters=6, random_state=2, client=addr)  # by address, as the CLI does
    assert remote.engine_["workers"] == 2
    np.testing.assert_array_equal(local.cluster_centers_, remote.cluster_centers_)
