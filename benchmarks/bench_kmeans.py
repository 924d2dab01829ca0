"""Lloyd k-means on blobs1m_d16, k = 200 (issue #2 acceptance), everything measured in one run:

1. quality: mean QE over 3 seeds for init="k-means++" and init="k-means||" vs scikit-learn
   KMeans(init="k-means++", n_init=1) (target: within 1 %);
2. speed: wall time of one Lloyd iteration on 2 workers x 1 thread vs scikit-learn's Lloyd with 2
   threads on the same in-memory data (target: no slower), and dask-ml KMeans' time per iteration;
3. the same random_state and chunking give identical centres on 1 and 2 workers.
"""

import argparse
import time

import numpy as np

import dask_clust
from harness.common import blobs, emit, local_cluster
from harness.measure import daskml_iteration_s, ours_iteration_s, sklearn_iteration_s

N, D, C_TRUE, K = 1_000_000, 16, 200, 200


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--parts", default="quality,speed,workers", help="comma-separated subset to run")
    args = p.parse_args()
    parts = set(args.parts.split(","))
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


if __name__ == "__main__":
    main()
