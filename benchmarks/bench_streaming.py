"""Beyond memory (issue #51): streamed fits on a zarr store several times the memory of a LocalCluster whose
workers' ``memory_limit`` is set low. Per fit: the passes it made over the store (stored bytes decoded ÷ the
store's size, ``model.engine_["passes"]``), its wall time and the wall time per pass against the floor measured
in the same run (one read and one decode of the whole store on the same workers: a dask sum of it), each
worker's peak resident size against its limit, and the "Pausing worker" events in the workers' logs.

    python benchmarks/bench_streaming.py [--times 2] [--workers 2] [--worker-mib 900] [--algos kmeans,vcgmm]

The store: 32-d float32 blobs in zarr chunks of --store-rows rows (zstd), fitted in chunks of --chunk-mib
(by default not a multiple of the store's: each stored block is still decoded once per pass). Before each
measurement the page cache is dropped where this process may (root on Linux), so a read is a cold one; the
summary says which.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import dask
import dask.array as da
from distributed import Client, LocalCluster

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.engine.local import worker_environ

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness.common import emit  # noqa: E402
from harness.measure import Workers  # noqa: E402

FITS = {
    "kmeans": dict(n_clusters=64, max_iter=3),
    "vcgmm": dict(n_clusters=256),
    "GaussianMixture": dict(n_clusters=32, covariance_type="diag", weights="learned", max_iter=3),
}


def drop_caches():
    """Drop the page cache (a cold read); False where this process may not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def pauses(client):
    logs = client.get_worker_logs()
    return sum(1 for lines in logs.values() for _, line in lines if "Pausing worker" in line)


def floor(X, client):
    """One read and one decode of the whole store on the workers: the least a pass can cost."""
    cold = drop_caches()
    t = time.perf_counter()
    client.compute(X.sum(axis=0)).result()
    return time.perf_counter() - t, cold


def run(args):
    d = 32
    limit = args.worker_mib << 20
    rows = int(args.times * args.workers * limit) // (4 * d)
    scratch = tempfile.mkdtemp(prefix="bench-streaming-", dir=args.scratch)
    try:
        path = os.path.join(scratch, "x.zarr")
        t = time.perf_counter()
        X, _ = make_blobs(rows, d, 100, random_state=0, chunks=args.store_rows)
        da.to_zarr(X.astype("float32"), path)
        X = da.from_zarr(path)
        print(f"wrote {X.nbytes / 2**30:.2f} GiB ({rows:,} x {d}) in {time.perf_counter() - t:.0f} s", flush=True)
        settings = {"dask_clust.chunk-bytes": f"{args.chunk_mib}MiB"}
        with (
            dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ()}),
            LocalCluster(
                n_workers=args.workers, threads_per_worker=1, memory_limit=limit, dashboard_address="127.0.0.1:0"
            ) as cluster,
            Client(cluster) as client,
            dask.config.set(settings),
        ):
            client.wait_for_workers(args.workers)
            base, cold = floor(X, client)
            print(f"floor: one {'cold' if cold else 'warm'} read and decode of the store: {base:.1f} s", flush=True)
            for algo in args.algos.split(","):
                kw = dict(FITS[algo])
                name = "vcgmm" if algo == "GaussianMixture" else algo
                workers = Workers(client)
                workers.reset()
                before = pauses(client)
                drop_caches()
                t = time.perf_counter()
                try:
                    m = dask_clust.fit(path, algo=name, random_state=0, client=client, **kw)
                    outcome, passes = "fitted", m.engine_.get("passes")
                except dask_clust.InputError as exc:
                    outcome, passes = f"refused: {exc}", None
                wall = time.perf_counter() - t
                peak = workers.peak()
                row = {
                    "algo": algo,
                    "params": kw,
                    "times_memory": args.times,
                    "data_bytes": int(X.nbytes),
                    "worker_limit": limit,
                    "workers": args.workers,
                    "outcome": outcome,
                    "wall_s": wall,
                    "passes": passes,
                    "bytes_read": None if passes is None else int(passes * X.nbytes),
                    "floor_pass_s": base,
                    "cold": cold,
                    "s_per_pass_vs_floor": None if not passes else wall / passes / base,
                    "peak_worker_bytes": peak,
                    "peak_of_limit": None if peak is None else peak / limit,
                    "pausing_events": pauses(client) - before,
                }
                emit("streaming", row)
                per_pass = passes and (
                    f"{passes:.2f} passes, {wall / passes:.1f} s a pass ({wall / passes / base:.2f}x floor), "
                )
                print(
                    f"{algo}: {outcome[:200]}; {wall:.1f} s, "
                    + (per_pass if passes else "")
                    + f"worker peak {peak / 2**20:.0f} of {args.worker_mib} MiB, {row['pausing_events']} pauses",
                    flush=True,
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--times", type=float, default=2.0, help="the store's size over the cluster's memory")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-mib", type=int, default=900)
    p.add_argument("--store-rows", type=int, default=240_000, help="rows per zarr chunk (30 MiB at 32-d)")
    p.add_argument("--chunk-mib", type=int, default=32, help="dask_clust.chunk-bytes, in MiB")
    p.add_argument("--algos", default="kmeans,vcgmm,GaussianMixture")
    p.add_argument("--scratch", default=None, help="where the store is written (default: the temp directory)")
    run(p.parse_args())


if __name__ == "__main__":
    main()
