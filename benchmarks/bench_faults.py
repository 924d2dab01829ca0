"""Faults (issue #20), measured on this machine:
--parts memory   vargmm on a zarr store (32-d float32 blobs in 32 MiB zarr chunks) 4x the memory of a
                 LocalCluster (3 workers x 1 thread, --worker-mib each): refused before any work with one
                 line, or streamed within the limits; reported: the outcome, the time to it, each worker's peak
                 resident size against its limit. --kmeans adds Lloyd from random rows (2 iterations) on the
                 same store with the default 128 MiB chunks (refused when a worker cannot hold a chunk and its
                 input blocks) and with --chunk-mib chunks.
"""
import argparse
import os
import shutil
import tempfile
import time

import dask
import dask.array as da
from distributed import Client, LocalCluster

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.engine.cluster import worker_environ
from harness.common import emit
from harness.measure import Workers


def store(path, rows, d):
    X, _ = make_blobs(rows, d, 100, random_state=0, chunks=(32 << 20) // (4 * d))   # 32 MiB zarr chunks
    da.to_zarr(X.astype("float32"), path)
    return da.from_zarr(path)


def fit(X, client, algo, settings, **kw):
    workers = Workers(client)
    workers.reset()
    t = time.perf_counter()
    try:
        with dask.config.set(settings):
            m = dask_clust.fit(X, algo=algo, n_clusters=20, random_state=0, client=client, **kw)
        outcome = f"fitted ({'streamed' if m.engine_.get('streaming') else 'persisted'}, {m.n_iter_} iterations)"
    except dask_clust.InputError as exc:
        outcome = f"refused: {exc}"
    return {"algo": algo, "outcome": outcome, "s": time.perf_counter() - t, "peak_worker_bytes": workers.peak()}


def memory(args):
    limit = args.worker_mib << 20
    d = 32
    rows = 4 * 3 * limit // (d * 4)
    scratch = tempfile.mkdtemp(prefix="bench-faults-")
    try:
        t = time.perf_counter()
        X = store(os.path.join(scratch, "x.zarr"), rows, d)
        print(f"wrote {X.nbytes / 2**30:.2f} GiB ({rows:,} x {d} float32) in {time.perf_counter() - t:.0f} s")
        with dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ()}), \
                LocalCluster(n_workers=3, threads_per_worker=1, memory_limit=limit, dashboard_address="127.0.0.1:0") \
                as cluster, Client(cluster) as client:
            client.wait_for_workers(3)
            runs = [("vargmm", {}, {"max_iter": 3})]
            if args.kmeans:   # random rows: a seeding of one pass, then 2 Lloyd passes and the final QE pass
                lloyd = {"init": "random", "max_iter": 2, "tol": 0}
                runs += [("kmeans", {}, lloyd), ("kmeans", {"dask_clust.chunk-bytes": f"{args.chunk_mib}MiB"}, lloyd)]
            for algo, settings, kw in runs:
                row = {"rows": rows, "data_bytes": int(X.nbytes), "worker_limit": limit, "settings": settings,
                       **fit(X, client, algo, settings, **kw)}
                emit("faults_memory", row)
                peak = row["peak_worker_bytes"]
                print(f"{algo} {settings or ''}: {row['outcome']} after {row['s']:.1f} s; worker peak "
                      f"{'?' if peak is None else f'{peak / 2**20:.0f}'} MiB of {args.worker_mib} MiB")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="memory")
    # a worker process alone (Python, numpy, numba, distributed) is about 200 MiB
    p.add_argument("--worker-mib", type=int, default=1024)
    p.add_argument("--kmeans", action="store_true")
    p.add_argument("--chunk-mib", type=int, default=32, help="chunk-bytes of the second kmeans fit")
    args = p.parse_args()
    if "memory" in args.parts.split(","):
        memory(args)


if __name__ == "__main__":
    main()
