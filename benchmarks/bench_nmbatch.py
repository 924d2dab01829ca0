"""Nested mini-batch k-means (issue #4 acceptance), every figure measured in one run on this machine.

Protocol of the paper: shuffle once, 90 % train / 10 % validation, the first k training rows as the
initial centres of every method, b0 = 5000, ρ = 100; energy = mean squared distance of the validation rows
to their nearest centre. All fits in-process (the data fits this machine: rule 6).

1. time to 1 %: wall time until each method's validation energy is within 1 % of its own final one, for
   nmbatch, our Lloyd (to convergence) and scikit-learn MiniBatchKMeans(batch_size=5000); distance
   evaluations to convergence; blobs200k_d32 and blobs1m_d16, k = 50 and k = 200;
2. final quality: over 5 shuffles of blobs200k_d32 at k = 50 and 200, mean full-data QE of nmbatch against
   our Lloyd from the same initial centres (target ±2 %).

Times exclude the validation-energy evaluations (measured inside the callbacks and subtracted).
"""

import argparse

import numpy as np

import dask_clust
from harness import paper
from harness.common import blobs, emit
from harness.paper import B0, RHO, Clock, energy, sklearn_minibatch_curve

DATA = {"blobs200k_d32": (200_000, 32, 100), "blobs1m_d16": (1_000_000, 16, 200)}


def split(name, shuffle_seed):
    return paper.split(blobs(*DATA[name], seed=0)[0], shuffle_seed)


def ours(Xtr, Xv, algo, init, **kw):
    clock = Clock(Xv)
    m = dask_clust.fit(
        Xtr, algo=algo, n_clusters=len(init), init=init, client="in-process", random_state=0, callback=clock, **kw
    )
    final = clock.points[-1][1]
    return {
        "to_1pct_s": clock.time_to(1.01 * final),
        "final_val_energy": final,
        "total_s": clock.points[-1][0],
        "n_iter": m.n_iter_,
        "distance_evals": m.n_distance_evals_,
        "qe_train": m.objective_,
    }, m


def sklearn_minibatch(Xtr, Xv, init):
    points, total, steps = sklearn_minibatch_curve(Xtr, Xv, init, B0)
    final = points[-1][1]
    return {
        "to_1pct_s": next(t for t, e in points if e <= 1.01 * final),
        "final_val_energy": final,
        "total_s": total,
        "n_steps": steps,
    }


def fmt(s):
    return "never" if s is None else f"{s:.3f} s"


def speed(out):
    for name in DATA:
        Xtr, Xv = split(name, 0)
        for k in (50, 200):
            init = Xtr[:k].astype(np.float64)
            nm, model = ours(Xtr, Xv, "nmbatch", init, batch_size=B0, rho=RHO)
            ll, _ = ours(Xtr, Xv, "kmeans", init)
            sk = sklearn_minibatch(Xtr, Xv, init)
            ratio = ll["to_1pct_s"] / nm["to_1pct_s"]
            emit(
                "nmbatch_speed",
                {
                    "data": name,
                    "k": k,
                    "nmbatch": nm,
                    "lloyd": ll,
                    "sklearn_minibatch": sk,
                    "speedup_vs_lloyd": ratio,
                    "bounds": model.extras_["bounds_"],
                },
            )
            out.append(
                f"{name} k={k}: to 1 % of own final validation energy: nmbatch {fmt(nm['to_1pct_s'])}, "
                f"Lloyd {fmt(ll['to_1pct_s'])} (x{ratio:.0f}; target ≥ 30 at k = 50), scikit-learn "
                f"MiniBatchKMeans {fmt(sk['to_1pct_s'])}"
            )
            out.append(
                f"  final validation energy: nmbatch {nm['final_val_energy']:.5g}, Lloyd "
                f"{ll['final_val_energy']:.5g}, scikit-learn {sk['final_val_energy']:.5g}; to convergence: "
                f"nmbatch {nm['total_s']:.2f} s / {nm['n_iter']} rounds, Lloyd {ll['total_s']:.2f} s / "
                f"{ll['n_iter']} iterations; distance evaluations nmbatch/Lloyd "
                f"{nm['distance_evals'] / ll['distance_evals']:.2f} (target ≤ 0.5 at k = 50)"
            )


def quality(out, shuffles):
    Xall = {}
    for k in (50, 200):
        rel = []
        for s in range(shuffles):
            if s not in Xall:
                Xall[s] = split("blobs200k_d32", s)
            Xtr, Xv = Xall[s]
            init = Xtr[:k].astype(np.float64)
            full = np.concatenate([Xtr, Xv])
            nm = dask_clust.fit(
                Xtr,
                algo="nmbatch",
                n_clusters=k,
                init=init,
                batch_size=B0,
                rho=RHO,
                client="in-process",
                random_state=s,
            )
            ll = dask_clust.fit(Xtr, n_clusters=k, init=init, client="in-process")
            q_nm, q_ll = energy(full, nm.cluster_centers_) * len(full), energy(full, ll.cluster_centers_) * len(full)
            rel.append(q_nm / q_ll - 1)
            emit(
                "nmbatch_quality",
                {
                    "data": "blobs200k_d32",
                    "k": k,
                    "shuffle": s,
                    "qe_nmbatch": q_nm,
                    "qe_lloyd": q_ll,
                    "rounds": nm.n_iter_,
                    "lloyd_iter": ll.n_iter_,
                },
            )
        out.append(
            f"blobs200k_d32 k={k}, {shuffles} shuffles: full-data QE nmbatch vs Lloyd from the same init "
            f"{100 * np.mean(rel):+.2f} % on average (per shuffle {', '.join(f'{100 * r:+.2f}' for r in rel)} %; "
            f"target ±2 %)"
        )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="speed,quality")
    p.add_argument("--shuffles", type=int, default=5)
    args = p.parse_args()
    parts, out = set(args.parts.split(",")), []
    # compile every kernel once outside the timings
    Xw = np.random.default_rng(0).normal(size=(6000, 4)).astype(np.float32)
    for algo in ("nmbatch", "kmeans"):
        dask_clust.fit(
            Xw, algo=algo, n_clusters=5, init=Xw[:5].astype(np.float64), client="in-process", callback=Clock(Xw[:10])
        )
    if "speed" in parts:
        speed(out)
    if "quality" in parts:
        quality(out, args.shuffles)
    print()
    print("\n".join(out))


if __name__ == "__main__":
    main()
