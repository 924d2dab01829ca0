"""Faults (issue #20), measured on this machine:
--parts memory   vargmm on a zarr store 4x the memory of a LocalCluster (3 workers x 1 thread, --worker-mib
                 each): refused before any work with one line, or streamed within the limits; reported: the
                 outcome, the time to it, each worker's peak resident size against its limit. --kmeans adds
                 Lloyd (8 B of seeding state per row) on the same store, which streams.
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


def store(path, rows, d=16):
    X, _ = make_blobs(rows, d, 100, random_state=0, chunks=1 << 20)
    da.to_zarr(X.astype("float32"), path)
    return da.from_zarr(path)


def fit(X, client, algo, **kw):
    workers = Workers(client)
    workers.reset()
    t = time.perf_counter()
    try:
        m = dask_clust.fit(X, algo=algo, n_clusters=20, random_state=0, client=client, **kw)
        outcome = f"fitted ({'streamed' if m.engine_.get('streaming') else 'persisted'}, {m.n_iter_} iterations)"
    except dask_clust.InputError as exc:
        outcome = f"refused: {exc}"
    return {"algo": algo, "outcome": outcome, "s": time.perf_counter() - t, "peak_worker_bytes": workers.peak()}


def memory(args):
    limit = args.worker_mib << 20
    rows = 4 * 3 * limit // (16 * 4)
    scratch = tempfile.mkdtemp(prefix="bench-faults-")
    try:
        t = time.perf_counter()
        X = store(os.path.join(scratch, "x.zarr"), rows)
        print(f"wrote {X.nbytes / 2**30:.2f} GiB ({rows:,} x 16 float32) in {time.perf_counter() - t:.0f} s")
        with dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ()}), \
                LocalCluster(n_workers=3, threads_per_worker=1, memory_limit=limit, dashboard_address="127.0.0.1:0") \
                as cluster, Client(cluster) as client:
            runs = [("vargmm", {"max_iter": 3})] + ([("kmeans", {"max_iter": 3, "tol": 0})] if args.kmeans else [])
            for algo, kw in runs:
                row = {"rows": rows, "data_bytes": int(X.nbytes), "worker_limit": limit, **fit(X, client, algo, **kw)}
                emit("faults_memory", row)
                peak = row["peak_worker_bytes"]
                print(f"{algo}: {row['outcome']} after {row['s']:.1f} s; worker peak "
                      f"{'?' if peak is None else f'{peak / 2**20:.0f}'} MiB of {args.worker_mib} MiB")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="memory")
    p.add_argument("--worker-mib", type=int, default=256)
    p.add_argument("--kmeans", action="store_true")
    args = p.parse_args()
    if "memory" in args.parts.split(","):
        memory(args)


if __name__ == "__main__":
    main()
