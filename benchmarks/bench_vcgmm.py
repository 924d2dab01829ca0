"""vc-GMM (issue #3 acceptance), every figure measured in one run on this machine:

1. quality: blobs1m_d16, C = 1000, N' = 2^16, G = 5, chain length 2: mean QE over 3 seeds (target 6.06e7
   ± 2 %), iterations (43–46 ± 40 %), distance evaluations per EM iteration (0.7–0.9 M);
   blobs200k_d32, C = 400 (target 3.42e7 ± 2 %, 3 seeds) and C = 100 (≤ 5 % above 5.33e7, 5 seeds);
2. speed on LocalCluster(2 workers x 1 thread): the whole vcgmm fit (coreset, seeding, EM, final QE pass)
   against our Lloyd with greedy k-means++ run to convergence, same data, same client: wall ratio
   (target ≥ 100x), QE ratio (target ≤ +12 %), per-phase times and the engine's overhead share;
3. E-step cost: EM CPU time / distance evaluations, in-process, one thread (target ≤ 20 ns);
4. identical models on 1 and 2 workers.
"""

import argparse
import time

import dask
import numpy as np

import dask_clust
from dask_clust.engine import as_source, open_engine
from harness.common import blobs, emit, local_cluster

SETTING = dict(G=5, chain_length=2, coreset_size=2**16)


def quality(name, X, C, seeds, client):
    qes, iters, per_it = [], [], []
    for s in range(seeds):
        m = dask_clust.fit(X, algo="vcgmm", n_clusters=C, random_state=s, client=client, **SETTING)
        em = [h["distance_evals"] for h in m.history_]
        qes.append(m.objective_)
        iters.append(m.n_iter_)
        per_it.append(float(np.mean(em)))
        emit(
            "vcgmm_quality",
            {
                "data": name,
                "C": C,
                "seed": s,
                "qe": m.objective_,
                "n_iter": m.n_iter_,
                "evals_per_iter": per_it[-1],
                "phase_s": m.extras_["phase_s"],
                "sigma2": m.sigma2_,
            },
        )
    return float(np.mean(qes)), iters, float(np.mean(per_it))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="quality,speed,estep,workers", help="comma-separated subset to run")
    args = p.parse_args()
    parts = set(args.parts.split(","))
    X1m, _ = blobs(1_000_000, 16, 200, seed=0)
    out = []
    if "quality" in parts:
        X200k, _ = blobs(200_000, 32, 100, seed=0)
        for name, X, C, seeds, target, rule in (
            ("blobs1m_d16", X1m, 1000, 3, 6.06e7, "±2 %"),
            ("blobs200k_d32", X200k, 400, 3, 3.42e7, "±2 %"),
            ("blobs200k_d32", X200k, 100, 5, 5.33e7, "≤ +5 %"),
        ):
            qe, iters, per_it = quality(name, X, C, seeds, "in-process")
            out.append(
                f"{name} C={C}: mean QE {qe:.4g} ({100 * (qe / target - 1):+.2f} % vs {target:.3g}, target "
                f"{rule}); iterations {iters}; {per_it / 1e6:.3f} M distance evaluations per EM iteration"
            )
    if "estep" in parts:
        with dask.config.set({"dask_clust.in-process-threads": 1}):  # one thread: CPU time is the E-step's own
            m = dask_clust.fit(X1m, algo="vcgmm", n_clusters=1000, random_state=0, client="in-process", **SETTING)
        em_evals = m.extras_["em_distance_evals"]
        ns = 1e9 * m.extras_["phase_s"]["em_cpu"] / em_evals
        emit(
            "vcgmm_estep",
            {
                "em_cpu_s": m.extras_["phase_s"]["em_cpu"],
                "em_wall_s": m.extras_["phase_s"]["em"],
                "em_distance_evals": em_evals,
                "ns_per_eval": ns,
            },
        )
        out.append(
            f"E-step cost: EM CPU {m.extras_['phase_s']['em_cpu']:.2f} s / {em_evals / 1e6:.1f} M evaluations "
            f"= {ns:.1f} ns per evaluation (target ≤ 20 ns)"
        )
    with local_cluster(2, 1) as client:
        if "speed" in parts:
            # warm workers (imports, compiled kernels loaded) for both fits, as in a running session
            for algo in ("vcgmm", "kmeans"):
                dask_clust.fit(X1m[:20_000], algo=algo, n_clusters=50, random_state=0, client=client, max_iter=2)
            t = time.perf_counter()
            vc = dask_clust.fit(X1m, algo="vcgmm", n_clusters=1000, random_state=0, client=client, **SETTING)
            vc_s = time.perf_counter() - t
            with open_engine(as_source(X1m), client, 0) as engine:
                overhead_ms = engine.overhead_ms()
            t = time.perf_counter()
            km = dask_clust.fit(X1m, n_clusters=1000, init="k-means++", random_state=0, client=client)
            km_s = time.perf_counter() - t
            # cluster round trips of the vcgmm fit: first pass, 2 coreset passes, final QE (EM runs in-process)
            share = 4 * overhead_ms / 1000 / vc_s
            emit(
                "vcgmm_speed",
                {
                    "vcgmm_s": vc_s,
                    "lloyd_s": km_s,
                    "speedup": km_s / vc_s,
                    "vcgmm_qe": vc.objective_,
                    "lloyd_qe": km.objective_,
                    "lloyd_iter": km.n_iter_,
                    "phases": vc.extras_["phase_s"],
                    "overhead_ms": overhead_ms,
                    "overhead_share": share,
                },
            )
            ph = ", ".join(f"{k} {v:.3f} s" for k, v in vc.extras_["phase_s"].items())
            out.append(
                f"speed, 2 workers x 1 thread, blobs1m_d16 C=1000: vcgmm {vc_s:.2f} s, Lloyd k-means++ "
                f"{km_s:.1f} s ({km.n_iter_} iterations): x{km_s / vc_s:.0f} (target ≥ 100); QE "
                f"{100 * (vc.objective_ / km.objective_ - 1):+.1f} % vs Lloyd (target ≤ +12 %)"
            )
            out.append(
                f"  phases: {ph}; engine overhead {overhead_ms:.1f} ms per round trip, {100 * share:.1f} % of the fit"
            )
        if "workers" in parts:
            kw = dict(n_clusters=1000, random_state=1, **SETTING)
            one = dask_clust.fit(X1m, algo="vcgmm", client="in-process", **kw)
            two = dask_clust.fit(X1m, algo="vcgmm", client=client, **kw)
            same = bool(np.array_equal(one.cluster_centers_, two.cluster_centers_) and one.objective_ == two.objective_)
            emit("vcgmm_workers", {"identical": same})
            out.append(f"identical model on 1 and 2 workers: {same}")
    print()
    print("\n".join(out))


if __name__ == "__main__":
    main()
