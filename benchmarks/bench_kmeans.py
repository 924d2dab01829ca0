"""Lloyd k-means on blobs1m_d16, k = 200 (issue #2 acceptance), everything measured in one run:

1. quality: mean QE over 3 seeds for init="k-means++" and init="k-means||" vs scikit-learn
   KMeans(init="k-means++", n_init=1) (target: within 1 %);
2. speed: wall time of one Lloyd iteration on 2 workers x 1 thread vs scikit-learn's Lloyd with 2
   threads on the same in-memory data (target: no slower), and dask-ml KMeans' time per iteration;
3. the same random_state and chunking give identical centres on 1 and 2 workers;
4. ``--parts seeds`` (issue #54 item 6): greedy k-means++ then Lloyd against scikit-learn's over many seeds on
   three kinds of data (50k x 16, k = 64): the QE at the seeds and after Lloyd, each mean's difference in
   standard errors, and Lloyd from scikit-learn's own seeds in both libraries (the iterations alone).
"""

import argparse
import math
import time

import numpy as np
from sklearn.datasets import make_blobs

import dask_clust
from harness.common import blobs, emit, local_cluster
from harness.measure import daskml_iteration_s, ours_iteration_s, sklearn_iteration_s

N, D, C_TRUE, K = 1_000_000, 16, 200, 200


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--parts", default="quality,speed,workers", help="comma-separated subset to run (or seeds)")
    args = p.parse_args()
    parts = set(args.parts.split(","))
    if "seeds" in parts:
        for kind in SEED_DATA:
            seed_parity(kind, args.seeds)
        parts.discard("seeds")
        if not parts:
            return
    X, _ = blobs(N, D, C_TRUE, seed=0)
    rows = {}
    with local_cluster(2, 1) as client:
        # 1. quality
        for init in ("k-means++", "k-means||") if "quality" in parts else ():
            qes = []
            for s in range(args.seeds):
                m = dask_clust.fit(X, n_clusters=K, init=init, random_state=s, client=client)
                qes.append(m.objective_)
                emit(
                    "kmeans_blobs1m_d16",
                    {
                        "tool": "dask_clust",
                        "init": init,
                        "seed": s,
                        "qe": m.objective_,
                        "n_iter": m.n_iter_,
                        "wall_s": m.engine_["wall_s"],
                        "distance_evals": m.n_distance_evals_,
                    },
                )
            rows[init] = float(np.mean(qes))
        from sklearn.cluster import KMeans

        sk = []
        for s in range(args.seeds if "quality" in parts else 0):
            t = time.perf_counter()
            km = KMeans(K, init="k-means++", n_init=1, random_state=s).fit(X)
            sk.append(km.inertia_)
            emit(
                "kmeans_blobs1m_d16",
                {
                    "tool": "scikit-learn",
                    "init": "k-means++",
                    "seed": s,
                    "qe": float(km.inertia_),
                    "n_iter": int(km.n_iter_),
                    "wall_s": time.perf_counter() - t,
                },
            )
        if sk:
            rows["sklearn"] = float(np.mean(sk))

        # 2. speed of one Lloyd iteration from the same centres
        if "speed" in parts:
            init = X[np.random.default_rng(0).choice(N, K, replace=False)].astype(np.float64)
            ours = ours_iteration_s(X, init, client)
            sk2 = sklearn_iteration_s(X, init.astype(np.float32), threads=2)
            dml = daskml_iteration_s(X, init.astype(np.float32))
            emit(
                "kmeans_iteration",
                {
                    "n": N,
                    "d": D,
                    "k": K,
                    "dask_clust_2x1_s": ours,
                    "sklearn_2threads_s": sk2,
                    "dask_ml_s": dml,
                    "speedup_vs_sklearn": sk2 / ours,
                },
            )

        # 3. 1 vs 2 workers
        if "workers" in parts:
            one = dask_clust.fit(X, n_clusters=K, init="k-means||", random_state=0, client="in-process", max_iter=20)
            two = dask_clust.fit(X, n_clusters=K, init="k-means||", random_state=0, client=client, max_iter=20)
            same = bool(np.array_equal(one.cluster_centers_, two.cluster_centers_))
            emit("kmeans_workers", {"identical_centres_1_vs_2_workers": same, "chunks": two.engine_["chunks"]})

    print()
    if "sklearn" in rows:
        print("blobs1m_d16, k = 200, mean QE over", args.seeds, "seeds:")
        for init in ("k-means++", "k-means||"):
            print(
                f"  dask_clust {init:10s} {rows[init]:.5e}  "
                f"({100 * (rows[init] / rows['sklearn'] - 1):+.2f} % vs scikit-learn)"
            )
        print(f"  scikit-learn k-means++ {rows['sklearn']:.5e}")
    if "speed" in parts:
        print(
            f"one Lloyd iteration: dask_clust 2 workers x 1 thread {1000 * ours:.0f} ms, scikit-learn 2 threads "
            f"{1000 * sk2:.0f} ms (x{sk2 / ours:.2f}), dask-ml " + (f"{1000 * dml:.0f} ms" if dml else "not installed")
        )
    if "workers" in parts:
        print(f"identical centres on 1 and 2 workers: {same}")


SEED_DATA = {
    # 2k blobs of spreads 0.5-3 (overlapping), k well-separated blobs, the uniform cube
    "overlapping": lambda rng, n, d, k: make_blobs(
        n, d, centers=2 * k, cluster_std=rng.uniform(0.5, 3, 2 * k), random_state=0
    )[0],
    "separated": lambda rng, n, d, k: make_blobs(n, d, centers=k, random_state=0)[0],
    "uniform": lambda rng, n, d, k: rng.random((n, d)),
}


def seed_parity(kind, seeds, n=50_000, d=16, k=64):
    """Greedy k-means++ seeding and the Lloyd fit after it, ours against scikit-learn's, ``seeds`` seeds each."""
    from sklearn.cluster import KMeans, kmeans_plusplus
    from sklearn.metrics import pairwise_distances_argmin_min
    from threadpoolctl import threadpool_limits

    from dask_clust.blocks.seeding import seed
    from dask_clust.engine import as_source, open_engine

    X = SEED_DATA[kind](np.random.default_rng(0), n, d, k).astype(np.float32)

    def qe(C):
        return float((pairwise_distances_argmin_min(X, C.astype(np.float32))[1].astype(np.float64) ** 2).sum())

    got = {p: ([], []) for p in ("seeding", "after Lloyd", "Lloyd from the same seeds")}
    for s in range(seeds):
        with open_engine(as_source(X), "in-process", s) as eng:
            got["seeding"][0].append(qe(seed(eng, k, "k-means++", s)[0]))
        ours = dask_clust.fit(X, n_clusters=k, init="k-means++", random_state=s, client="in-process")
        got["after Lloyd"][0].append(ours.objective_)
        with threadpool_limits(2):
            theirs, _ = kmeans_plusplus(X, k, random_state=s)
            got["seeding"][1].append(qe(theirs))
            got["after Lloyd"][1].append(KMeans(k, init="k-means++", n_init=1, random_state=s).fit(X).inertia_)
            got["Lloyd from the same seeds"][1].append(KMeans(k, init=theirs, n_init=1).fit(X).inertia_)
        same = dask_clust.fit(X, n_clusters=k, init=theirs.astype(np.float64), client="in-process")
        got["Lloyd from the same seeds"][0].append(same.objective_)
    for part, (ours, theirs) in got.items():
        ours, theirs = np.array(ours), np.array(theirs)
        se = math.sqrt(ours.var(ddof=1) / seeds + theirs.var(ddof=1) / seeds)
        emit(
            "kmeans_seed_parity",
            {
                "data": kind,
                "n": n,
                "d": d,
                "k": k,
                "seeds": seeds,
                "part": part,
                "ratio": float(ours.mean() / theirs.mean()),
                "standard_errors": float((ours.mean() - theirs.mean()) / se) if se else 0.0,
                "worst_seed_ratio": float(np.max(ours / theirs)),
            },
        )


if __name__ == "__main__":
    main()
