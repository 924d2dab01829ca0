"""Choosing the number of clusters (issue #55), every figure from one run on this machine, on 2 threads:

1. pick: blobs with a known number K of well-separated clusters (scikit-learn's ``make_blobs``, unit spread,
   centres uniform in a box of side 12·K^(1/D) so neighbours stay apart, 100k rows), five (K, D), ``--seeds`` seeds
   each (the data's and the sweep's), a sweep over k ∈ K·{1/4, 1/2, 3/4, 1, 5/4, 3/2, 2}: how often the
   default criterion picks K (target: >= 9 of 10), for kmeans (the simplified silhouette), vcgmm and
   GaussianMixture's fit (vargmm, diagonal covariances) (BIC).
2. speed: a sweep against the single fit of its largest k on the same data, in the same run: vc-GMM over
   C = 64, 128, ..., 8,192 and k-means over k = 8, 16, ..., 1,024 on blobs of ``--rows`` (1M) x 32 (targets:
   <= 2x and <= 3x), with each k's fit and criteria time; ``--unshared``: k-means' sweep again with
   ``shared_seeding=False`` (each k's own k-means|| rounds), for each k's QE against the shared seeding's.
3. steps: what a Lloyd iteration costs on the same blobs at k = 8, 32, 128, 512 and 1,024, from the same
   k-means|| seeds, ``tol=0`` and at most 60 iterations (a fit whose labels all stay stops sooner): ours over
   lazy bounds where it chooses them, ours with the eager step everywhere, and scikit-learn's ``KMeans``
   (float32, ``n_init=1``, its whole time over its iterations); ours as the mean of iterations 21 on (the
   steps a long fit is made of).

    python benchmarks/bench_sweep.py [--parts pick,speed,steps] [--seeds 10] [--rows 1000000]
        [--algos vcgmm,kmeans] [--unshared]
"""

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

import dask_clust
from harness.common import blobs, emit

PICK = ((4, 8), (8, 16), (16, 32), (32, 16), (64, 32))  # (K, D)
# (algorithm, parameters): GaussianMixture is var-GMM-S with its default, diagonal covariances
ALGOS = (("kmeans", {}), ("vcgmm", {}), ("vargmm", {"covariance_type": "diag"}))


def separated(K, D, seed, n=100_000):
    from sklearn.datasets import make_blobs

    side = 12.0 * K ** (1.0 / D)
    X, _ = make_blobs(n, n_features=D, centers=K, cluster_std=1.0, center_box=(-side, side), random_state=seed)
    return X.astype(np.float32)


def pick(seeds):
    for K, D in PICK:
        ks = sorted({max(2, round(K * f)) for f in (0.25, 0.5, 0.75, 1, 1.25, 1.5, 2)})
        for algo, params in ALGOS:
            hits = 0
            for seed in range(seeds):
                X = separated(K, D, seed)
                t = time.perf_counter()
                result = dask_clust.sweep(
                    X, algo, ks, random_state=seed, silhouette_size=None, client="in-process", **params
                )
                wall = time.perf_counter() - t
                hits += result.best_k_ == K
                emit(
                    "sweep_pick",
                    {
                        "K": K,
                        "D": D,
                        "algo": algo,
                        "seed": seed,
                        "ks": ks,
                        "criterion": result.criterion,
                        "picked": result.best_k_,
                        "wall_s": wall,
                    },
                )
            emit("sweep_pick", {"K": K, "D": D, "algo": algo, "hits": hits, "seeds": seeds})


def speed(rows, algos, unshared=False):
    X, _ = blobs(rows, 32, 1000, seed=0)
    grids = {"vcgmm": [64 * 2**i for i in range(8)], "kmeans": [8 * 2**i for i in range(8)]}
    for algo in algos:
        ks = grids[algo]
        t = time.perf_counter()
        alone = dask_clust.fit(X, algo, ks[-1], random_state=0, client="in-process")
        single = time.perf_counter() - t
        t = time.perf_counter()
        result = dask_clust.sweep(X, algo, ks, random_state=0, keep_models=True, client="in-process")
        whole = time.perf_counter() - t
        same = bool(np.array_equal(alone.cluster_centers_, result.models_[ks[-1]].cluster_centers_))
        qe = {}
        if unshared and algo == "kmeans":  # what sharing k-means||'s rounds does to each k's model
            own = dask_clust.sweep(X, algo, ks, random_state=0, shared_seeding=False, client="in-process")
            qe = {"qe_shared_over_own": (result.table["objective"] / own.table["objective"]).tolist()}
            qe["n_iter_own"] = own.table["n_iter"].tolist()
        emit(
            "sweep_speed",
            {
                "algo": algo,
                "rows": rows,
                "ks": ks,
                "single_s": single,
                "sweep_s": whole,
                "ratio": whole / single,
                "fit_s": result.table["fit_s"].tolist(),
                "wall_s": result.table["wall_s"].tolist(),
                "picked": result.best_k_,
                "largest_same_bits": same,
                "n_iter": result.table["n_iter"].tolist(),
                **qe,
            },
        )


def steps(rows, ks=(8, 32, 128, 512, 1024), iters=60, first=21):
    from sklearn.cluster import KMeans

    from dask_clust.blocks import lloyd
    from dask_clust.blocks.seeding import seed
    from dask_clust.engine import as_source, open_engine

    X, _ = blobs(rows, 32, 1000, seed=0)
    for k in ks:
        with open_engine(as_source(X), "in-process", 0) as engine:
            init, _ = seed(engine, k, "k-means||", 0)
        ms = {}
        for name, values in (("lazy", lloyd.LAZY_VALUES), ("eager", 0)):
            kept, lloyd.LAZY_VALUES = lloyd.LAZY_VALUES, values
            try:
                m = dask_clust.fit(X, "kmeans", k, init=init, tol=0, max_iter=iters, client="in-process")
            finally:
                lloyd.LAZY_VALUES = kept
            wall = [h["wall_s"] for h in m.history_]
            at = min(first, len(wall) // 2)
            ms[name] = 1000 * float(np.mean(wall[at:]))
            ms[f"{name}_iterations"] = m.n_iter_
        t = time.perf_counter()
        km = KMeans(k, init=init.astype(np.float32), n_init=1, tol=0, max_iter=iters).fit(X)
        ms["sklearn"] = 1000 * (time.perf_counter() - t) / km.n_iter_
        ms["sklearn_iterations"] = int(km.n_iter_)
        emit("lloyd_step_ms", {"rows": rows, "k": k, **ms, "lazy_chosen": k * 32 <= lloyd.LAZY_VALUES})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="pick,speed")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--algos", default="vcgmm,kmeans", help="speed's sweeps")
    p.add_argument("--unshared", action="store_true", help="and k-means' sweep without shared seeding, for QE")
    a = p.parse_args()
    with threadpool_limits(a.threads):
        if "pick" in a.parts:
            pick(a.seeds)
        if "speed" in a.parts:
            speed(a.rows, a.algos.split(","), a.unshared)
        if "steps" in a.parts:
            steps(a.rows)


if __name__ == "__main__":
    main()
