"""A new pod's first fits (issue #53): workers whose numba cache starts empty, as every pod of the image did,
against workers whose cache the image's entrypoint seeded from the kernels compiled at the image's build.

What the image does, step by step on this machine (no container runtime needed):
  build  ``dask-clust compile`` with NUMBA_CACHE_DIR set to a new directory and the CPU the Dockerfile names
         (NUMBA_CPU_NAME=x86-64-v3, NUMBA_CPU_FEATURES empty); that directory is then made read-only.
  cold   a process started with an empty NUMBA_CACHE_DIR (a pod before this issue).
  warm   the same process started through ``deploy/docker/entrypoint.sh`` with an empty NUMBA_CACHE_DIR and
         DASK_CLUST_BUILT_KERNELS pointing at the build's directory (a pod of the image now).
In each, a LocalCluster of 2 single-thread workers under nannies fits every registered algorithm (and a full
mixture) to 60k x 8 blobs, float32 as a dask array and float64 as numpy, and labels the rows.
Reported per case: the wall time of those fits, the kernels compiled in the workers and in the driver
(numba's cache misses, summed over every dispatcher of the package), those loaded from the cache (hits),
and whether the cache directory is still the build's (a kernel compiled there adds files or grows an index).

--parts cpu: what the CPU the image compiles for costs: k-means (Lloyd, k-means||, 20 iterations, k = 256)
and GaussianMixture (C = 256, diag) on 500k x 32 blobs, in-process on 2 threads, with kernels compiled for
this machine's own CPU, for x86-64-v3 (the image's default) and for "generic" (x86-64: SSE2 only); each in a
process of its own with a cache of its own, timed on a second fit after a first that compiles.

    python benchmarks/bench_cold_start.py [--parts image,cpu]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from harness.common import emit

HERE = os.path.dirname(os.path.abspath(__file__))
ENTRYPOINT = os.path.join(os.path.dirname(HERE), "deploy", "docker", "entrypoint.sh")
FITS = (
    ("kmeans", {}),
    ("nmbatch", {}),
    ("vcgmm", {}),
    ("slk", {}),
    ("minibatch", {}),
    ("vrkm", {}),
    ("sbe", {}),
    ("vargmm", {}),
    ("vargmm", {"covariance_type": "full"}),
)


def counts():
    """(hits, misses) of numba's cache over every dispatcher of dask_clust loaded in this process."""
    from numba.core.registry import CPUDispatcher

    hits = misses = 0
    for name, module in list(sys.modules.items()):
        if name.startswith("dask_clust"):
            for obj in vars(module).values():
                if isinstance(obj, CPUDispatcher):
                    hits += sum(obj.stats.cache_hits.values())
                    misses += sum(obj.stats.cache_misses.values())
    return hits, misses


def pod():
    """The fits, run in this process (started by ``main`` in the case's environment); prints one JSON line."""
    import numpy as np

    import dask_clust
    from dask_clust.datasets import make_blobs
    from dask_clust.engine.local import connect

    t = time.perf_counter()
    with connect(n_workers=2, threads_per_worker=1) as client:
        X, _ = make_blobs(60_000, 8, 20, random_state=0, chunks=10_000)
        started = time.perf_counter() - t
        for data in (X.astype(np.float32), X.astype(np.float64).compute()):
            for algo, params in FITS:
                n = 6000 if algo == "slk" else len(data)
                model = dask_clust.fit(data[:n], algo=algo, n_clusters=20, random_state=0, client=client, **params)
                np.asarray(model.predict(data[:n]))
        workers = client.run(counts)
    fits_s = time.perf_counter() - t - started
    driver_hits, driver_misses = counts()
    print(
        json.dumps(
            {
                "cluster_s": started,
                "fits_s": fits_s,
                "worker_hits": sum(h for h, _ in workers.values()),
                "worker_misses": sum(m for _, m in workers.values()),
                "driver_hits": driver_hits,
                "driver_misses": driver_misses,
            }
        ),
        flush=True,
    )


def listing(path):
    """Every file under ``path`` with its size: a kernel compiled there adds files and grows an index."""
    return sorted(
        (os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
        for d, _, files in os.walk(path)
        for f in files
    )


def timed_fits():
    """The --parts cpu fits in this process (its CPU set by its environment); prints one JSON line."""
    import dask_clust
    from harness.common import blobs

    X = blobs(500_000, 32, 256)[0]
    fits = {
        "kmeans": lambda: dask_clust.fit(
            X, "kmeans", 256, init="k-means||", tol=0, max_iter=20, random_state=0, client="in-process", progress=False
        ),
        "gmm": lambda: dask_clust.GaussianMixture(256, random_state=0).fit(X, client="in-process", progress=False),
    }
    times = {}
    for _ in range(2):  # the first round compiles, the second is timed
        for name, fit in fits.items():
            t = time.perf_counter()
            fit()
            times[name] = time.perf_counter() - t
    print(json.dumps(times), flush=True)


def cpu_costs(scratch):
    for cpu in ("host", "x86-64-v3", "generic"):
        env = {**os.environ, "NUMBA_CACHE_DIR": os.path.join(scratch, cpu), "OMP_NUM_THREADS": "2"}
        env["NUMBA_NUM_THREADS"] = "2"
        if cpu != "host":
            env.update(NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES="")
        out = subprocess.run([sys.executable, __file__, "--timed"], env=env, cwd=HERE, check=True, capture_output=True)
        emit("cold_start", {"case": "cpu", "cpu": cpu, **json.loads(out.stdout.decode().strip().splitlines()[-1])})


def image(scratch):
    cpu = {"NUMBA_CPU_NAME": "x86-64-v3", "NUMBA_CPU_FEATURES": ""}
    built = os.path.join(scratch, "built")
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "dask_clust.cli", "compile"],
        env={**os.environ, **cpu, "NUMBA_CACHE_DIR": built},
        check=True,
    )
    build_s = time.perf_counter() - t
    os.chmod(built, 0o555)
    try:
        emit("cold_start", {"case": "build", "compile_s": build_s, "files": len(listing(built))})
        for case in ("cold", "warm"):
            cache = os.path.join(scratch, case)
            env = {**os.environ, **cpu, "NUMBA_CACHE_DIR": cache, "DASK_CLUST_BUILT_KERNELS": built}
            command = [sys.executable, __file__, "--pod"]
            if case == "warm":
                command = ["sh", ENTRYPOINT, *command]
            t = time.perf_counter()
            out = subprocess.run(command, env=env, cwd=HERE, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            row.update(case=case, wall_s=time.perf_counter() - t, cache_as_built=listing(cache) == listing(built))
            emit("cold_start", row)
    finally:
        os.chmod(built, 0o755)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="image,cpu")
    parts = p.parse_args().parts.split(",")
    for part, run in (("image", image), ("cpu", cpu_costs)):
        if part in parts:
            scratch = tempfile.mkdtemp(prefix="bench-cold-start-")
            try:
                run(scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--pod"]:
        pod()
    elif sys.argv[1:] == ["--timed"]:
        timed_fits()
    else:
        main()
