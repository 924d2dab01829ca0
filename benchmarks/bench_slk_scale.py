"""SLK at scale (issue #18, line 7): 1 M x 16 blobs (200 blobs, 10 % uniform background), K = 200, SLK-BO on
an IVF graph (nlist 4000, nprobe 16), on a 2-worker LocalCluster (1 thread each), then the same fit
in-process.

Reported per run: wall time, each worker's peak resident size and the driver's peak above its start (the
cluster run), the graph's recall@4 (1000 random rows against brute force), NMI on the non-background rows
against the nearest-seed partition's (the seeds SLK started from), and whether the two runs' labels are
equal. ``--rows`` scales the experiment down (nlist ≈ 4√N) for a quick look.
"""

import argparse
import time
import warnings

import numpy as np

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.metrics import nmi
from harness.common import emit, local_cluster
from harness.measure import Workers
from harness.scaling import PeakRSS


def nearest_seed(X, seeds):
    """Each row's nearest seed on the normalised rows, in blocks (the partition SLK starts from)."""
    cc = (seeds * seeds).sum(1)
    out = np.empty(len(X), np.int64)
    for s in range(0, len(X), 65536):
        x = np.asarray(X[s : s + 65536], np.float64)
        x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300)
        out[s : s + 65536] = (cc[None] - 2 * x @ seeds.T).argmin(1)
    return out


def fit(X, client, k, nlist, nprobe):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a lost cluster is reported below
        return dask_clust.fit(
            X,
            algo="slk",
            n_clusters=k,
            mode="bo",
            knn_method="ivf",
            nlist=nlist,
            nprobe=nprobe,
            random_state=0,
            client=client,
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--clusters", type=int, default=200)
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--skip-in-process", action="store_true")
    args = ap.parse_args()
    n, k = args.rows, args.clusters
    nlist = 4000 if n == 1_000_000 else int(round(4 * np.sqrt(n)))
    X, y = make_blobs(n, 16, 200, random_state=0)
    y = y.compute()
    rows = {}
    with local_cluster(2, 1) as client:
        workers = Workers(client)
        workers.reset()
        t = time.perf_counter()
        with PeakRSS() as driver:
            m = fit(X, client, k, nlist, args.nprobe)
        rows["cluster"] = (m, time.perf_counter() - t, workers.peak(), driver.extra)
    if not args.skip_in_process:
        Xl = X.compute()
        t = time.perf_counter()
        here = fit(Xl, "in-process", k, nlist, args.nprobe)
        rows["in-process"] = (here, time.perf_counter() - t, None, None)
    fg = y >= 0
    seeded = nearest_seed(X.compute(), m.seeds_)
    base = nmi(y[fg], seeded[fg])
    for where, (model, wall, worker_peak, driver_peak) in rows.items():
        row = {
            "where": where,
            "n": n,
            "k": k,
            "nlist": nlist,
            "nprobe": args.nprobe,
            "wall_s": wall,
            "worker_peak_bytes": worker_peak,
            "driver_peak_extra_bytes": driver_peak,
            "recall": model.graph_recall_,
            "nmi_fg": nmi(y[fg], model.labels_[fg]),
            "nmi_fg_nearest_seed": base,
            "outer": model.n_iter_,
            "inner": model.inner_iterations_,
            "lost": model.lost_cluster_,
            "labels_equal_cluster": bool(np.array_equal(model.labels_, rows["cluster"][0].labels_)),
        }
        emit("slk_scale", row)
        peaks = (
            ""
            if worker_peak is None
            else (f", worker peak {worker_peak / 2**30:.2f} GiB, driver peak +{driver_peak / 2**30:.2f} GiB")
        )
        print(
            f"{where}: {n:,} x 16, K = {k}: {wall:.0f} s{peaks}, recall@4 {row['recall']:.3f}, NMI (blobs) "
            f"{row['nmi_fg']:.4f} vs nearest-seed {base:.4f}, outer {row['outer']}, inner {sum(row['inner'])}, "
            f"lost {row['lost']}, labels equal the cluster run's: {row['labels_equal_cluster']}"
        )


if __name__ == "__main__":
    main()
