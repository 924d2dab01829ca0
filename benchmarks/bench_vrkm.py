"""Variance-reduced k-means (issue #5 acceptance), every figure measured in one run on this machine,
LocalCluster(2 workers x 1 thread):

1. chunk-local steps: blobs200k_d32, k = 100, 8 chunks against 1 chunk from the same initial centres:
   final QE (target within 1 %);
2. QE against wall time for our Lloyd and VRKM++ with η = k/N and η = 10 k/N, on blobs200k_d32 (k = 100)
   and blobs1m_d16 (k = 200), from random rows (the paper's protocol) and from k-means++ centres: the time
   each needs to reach Lloyd's final QE, or that it never does;
3. cost of one epoch in Lloyd iterations of wall time, blobs1m_d16, k = 200 (target ≤ 2.5).

An iteration's (epoch's) objective is the QE of the centres it starts from, so a curve's point i is
(wall time of iterations 1..i−1, objective of iteration i); both methods start from the same centres.
"""

import argparse

import dask
import dask.array as da
import numpy as np

import dask_clust
from harness.common import blobs, emit, local_cluster
from harness.paper import qe_curve as curve
from harness.paper import time_to

DATA = {"blobs200k_d32": ((200_000, 32, 100), 100), "blobs1m_d16": ((1_000_000, 16, 200), 200)}


def initial_centers(X, k, kind):
    if kind == "random":
        return X[np.random.default_rng(0).choice(len(X), k, replace=False)].astype(np.float64)
    from sklearn.cluster import kmeans_plusplus

    return kmeans_plusplus(X[:200_000], k, random_state=0)[0].astype(np.float64)


def curves(client, out):
    ratios = []
    for name, (shape, k) in DATA.items():
        X, _ = blobs(*shape, seed=0)
        N = len(X)
        for kind in ("random", "k-means++"):
            init = initial_centers(X, k, kind)
            lloyd = dask_clust.fit(X, n_clusters=k, init=init, client=client)
            target = lloyd.objective_
            rows = {"lloyd": (curve(lloyd), lloyd)}
            for scale in (1, 10):
                m = dask_clust.fit(
                    X, algo="vrkm", n_clusters=k, init=init, learning_rate=scale * k / N, client=client, random_state=0
                )
                rows[f"vrkm++ eta={scale}k/N"] = (curve(m), m)
            line = []
            for label, (pts, m) in rows.items():
                t = time_to(pts, target)
                emit(
                    "vrkm_curve",
                    {
                        "data": name,
                        "k": k,
                        "init": kind,
                        "method": label,
                        "points": pts,
                        "final_qe": m.objective_,
                        "iterations": m.n_iter_,
                        "time_to_lloyd_final_s": t,
                    },
                )
                line.append(
                    f"{label}: final QE {m.objective_:.5g} ({100 * (m.objective_ / target - 1):+.2f} %), "
                    f"{m.n_iter_} it, {pts[-1][0]:.2f} s, reaches Lloyd's final QE "
                    f"{'never' if t is None else f'after {t:.2f} s'}"
                )
            out.append(f"{name} k={k} init={kind}:\n    " + "\n    ".join(line))
            if name == "blobs1m_d16":
                epoch = np.median([h["wall_s"] for h in rows["vrkm++ eta=1k/N"][1].history_])
                it = np.median([h["wall_s"] for h in lloyd.history_])
                ratios.append(epoch / it)
                emit("vrkm_epoch_cost", {"init": kind, "epoch_s": epoch, "lloyd_iteration_s": it, "ratio": epoch / it})
    out.append(
        f"one epoch = {', '.join(f'{r:.2f}' for r in ratios)} Lloyd iterations of wall time on blobs1m_d16, "
        f"k = 200, 2 workers (median epoch / median iteration, random and k-means++ starts; target ≤ 2.5)"
    )


def chunks(out):
    (n, d, c), k = DATA["blobs200k_d32"]
    X, _ = blobs(n, d, c, seed=0)
    init = initial_centers(X, k, "random")
    qe = {}
    for parts in (1, 8):
        Xd = da.from_array(X, chunks=(-(-n // parts), d))
        with dask.config.set({"dask_clust.min-chunk-bytes": "1MiB"}):  # keep the 3.2 MB chunks as given
            m = dask_clust.fit(Xd, algo="vrkm", n_clusters=k, init=init, random_state=0, client="in-process")
        assert m.engine_["chunks"] == parts
        qe[parts] = m.objective_
        emit("vrkm_chunks", {"chunks": parts, "qe": m.objective_, "epochs": m.n_iter_})
    out.append(
        f"blobs200k_d32 k=100: final QE with 8 chunks {qe[8]:.6g} vs 1 chunk {qe[1]:.6g}: "
        f"{100 * (qe[8] / qe[1] - 1):+.3f} % (target within 1 %)"
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="chunks,curves")
    parts = set(p.parse_args().parts.split(","))
    out = []
    if "chunks" in parts:
        chunks(out)
    if "curves" in parts:
        with local_cluster(2, 1) as client:
            Xw = np.random.default_rng(0).normal(size=(20_000, 4)).astype(np.float32)
            for algo in ("vrkm", "kmeans"):  # warm the workers: imports and compiled kernels
                dask_clust.fit(Xw, algo=algo, n_clusters=5, client=client, random_state=0)
            curves(client, out)
    print()
    print("\n".join(out))


if __name__ == "__main__":
    main()
