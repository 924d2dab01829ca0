"""Beyond memory (``--suite streaming``, and ``bench_streaming.py``): streamed fits on a zarr store several
times the memory of a LocalCluster whose workers' ``memory_limit`` is set low. Per fit: the passes it made
over the store (stored bytes decoded ÷ the store's size, ``model.engine_["passes"]``), its wall time and the
wall time per pass against the floor measured in the same run (the median of three reads and decodes of the
whole store on the same workers: a dask sum of it, the page cache dropped first where this process may), each
worker's peak resident size against its limit, and the "Pausing worker" events in the workers' logs.

The store: 32-d float32 blobs in zarr chunks of ``STORE_ROWS`` rows (30 MiB), fitted in 32 MiB chunks: not
a multiple of the store's, so most chunks are cut from two stored blocks.
"""

import logging
import os
import shutil
import statistics
import tempfile
import time

import dask
import dask.array as da

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.engine.local import worker_environ

from .measure import Workers

logger = logging.getLogger("dask_clust.bench")

FITS = {
    "kmeans": dict(n_clusters=64, max_iter=3),
    "vcgmm": dict(n_clusters=256),
    # as dask_clust.GaussianMixture fits it: no final QE pass (a mixture is judged by its likelihood)
    "GaussianMixture": dict(n_clusters=32, covariance_type="diag", weights="learned", max_iter=3, final_objective=None),
    "nmbatch": dict(n_clusters=64),
    "minibatch": dict(n_clusters=64),
}
# (the store's size over the cluster's memory, the fits): at 2x the state stays in memory, at 10x kmeans's and
# nmbatch's goes to the workers' files
CASES = ((2.0, ("kmeans", "vcgmm", "GaussianMixture", "minibatch")), (10.0, ("kmeans", "nmbatch")))
STORE_ROWS = 240_000
CHUNK_MIB = 32
WORKER_MIB = 700


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
    """ "Pausing worker" lines in the workers' logs so far."""
    return sum(1 for lines in client.get_worker_logs().values() for _, line in lines if "Pausing worker" in line)


def floor(X, client, repeats=3):
    """One read and one decode of the whole store on the workers, the least a pass can cost: the median of
    ``repeats`` cold reads (one moved between 5.7 and 8.5 s across runs at 2x); (s, cold, every read's s)."""
    times = []
    for _ in range(repeats):
        cold = drop_caches()
        t = time.perf_counter()
        client.compute(X.sum(axis=0)).result()
        times.append(time.perf_counter() - t)
    return statistics.median(times), cold, times


def store(path, rows, store_rows, d=32, kind="zarr"):
    """The blobs written at ``path`` as a zarr array, or a parquet dataset of float32 columns (a file per
    ``store_rows`` rows); the same rows read back as a dask array (the fits read the path)."""
    X, _ = make_blobs(rows, d, 100, random_state=0, chunks=store_rows)
    X = X.astype("float32")
    if kind == "zarr":
        da.to_zarr(X, path)
        return da.from_zarr(path)
    import dask.dataframe as dd

    dd.from_dask_array(X, columns=[f"f{i}" for i in range(d)]).to_parquet(path, write_index=False)
    return dd.read_parquet(path).to_dask_array(lengths=True)


def streamed(
    emit,
    times,
    algos,
    workers=2,
    worker_mib=WORKER_MIB,
    store_rows=STORE_ROWS,
    chunk_mib=CHUNK_MIB,
    scratch=None,
    settings=None,
    kind="zarr",
):
    """The fits ``algos`` on a store ``times`` the memory of ``workers`` workers of ``worker_mib`` MiB, one row
    each through ``emit``; ``settings``: more ``dask_clust`` settings; ``kind``: "zarr" or "parquet"."""
    from distributed import Client, LocalCluster

    limit = worker_mib << 20
    rows = int(times * workers * limit) // (4 * 32)
    where = tempfile.mkdtemp(prefix="bench-streaming-", dir=scratch)
    try:
        path = os.path.join(where, f"x.{kind}")
        t = time.perf_counter()
        X = store(path, rows, min(store_rows, rows), kind=kind)
        logger.info("wrote %.2f GiB (%d x 32) in %.0f s", X.nbytes / 2**30, rows, time.perf_counter() - t)
        with (
            dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ()}),
            LocalCluster(
                n_workers=workers, threads_per_worker=1, memory_limit=limit, dashboard_address="127.0.0.1:0"
            ) as cluster,
            Client(cluster) as client,
            dask.config.set({"dask_clust.chunk-bytes": f"{chunk_mib}MiB", **(settings or {})}),
        ):
            client.wait_for_workers(workers)
            base, cold, reads = floor(X, client)
            for algo in algos:
                kw = dict(FITS[algo])
                peaks = Workers(client)
                peaks.reset()
                before = pauses(client)
                drop_caches()
                t = time.perf_counter()
                try:
                    m = dask_clust.fit(
                        path,
                        algo="vcgmm" if algo == "GaussianMixture" else algo,
                        random_state=0,
                        client=client,
                        progress=False,
                        **kw,
                    )
                    outcome, passes, files = "fitted", m.engine_.get("passes"), m.engine_.get("state_files")
                except dask_clust.InputError as exc:
                    outcome, passes, files = f"refused: {exc}", None, None
                wall = time.perf_counter() - t
                peak = peaks.peak()
                emit(
                    {
                        "kind": "streaming",
                        "format": kind,
                        "algo": algo,
                        "params": kw,
                        "times_memory": times,
                        "data_bytes": int(X.nbytes),
                        "worker_limit": limit,
                        "workers": workers,
                        "outcome": outcome,
                        "state_files": files,
                        "wall_s": wall,
                        "passes": passes,
                        "bytes_read": None if passes is None else int(passes * X.nbytes),
                        "floor_pass_s": base,
                        "floor_reads_s": reads,
                        "cold": cold,
                        "pass_vs_floor": None if not passes else wall / passes / base,
                        "peak_worker_bytes": peak,
                        "peak_of_limit": None if peak is None else peak / limit,
                        "estimate_bytes": None if passes is None else m.engine_.get("stream_estimate_bytes"),
                        "pausing_events": pauses(client) - before,
                    }
                )
    finally:
        shutil.rmtree(where, ignore_errors=True)


def run_all(run):
    """Both cases (``CASES``); a smoke run (``run.tiny``): a store of a few MiB, one fit of each case."""
    for times, algos in CASES:
        if run.tiny:
            streamed(
                run.emit, times / 200, algos[:1], store_rows=20_000, chunk_mib=1, settings={"dask_clust.stream": True}
            )
        else:
            streamed(run.emit, times, algos)
