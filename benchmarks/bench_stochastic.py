"""The stochastic algorithms against what users would pick instead (issue #36), every figure from one run.

On the image patches (k = 50 and 200), blobs1m_d16 (k = 200) and blobs200k_d32 (k = 100), with defaults:
scikit-learn's k-means++ Lloyd (the η baseline, seed 0), its MiniBatchKMeans and faiss's Kmeans against our
nmbatch, minibatch, vrkm, sbe, kmeans and vcgmm. The stochastic fits vary with the seed more than they differ
from each other, so the fast ones run ``--seeds`` seeds and are compared by their medians; the slow ones (our
Lloyd and VRKM, scikit-learn's Lloyd) one. Our fits run on the suites' LocalCluster (2 workers × 1 thread),
each competitor in a fresh process on every core, as in ``run.py``.

Reported: per data set, each method's median wall time and QE, η, and whether a scikit-learn or faiss method
was both faster and better (dominated); nmbatch's η and time against MiniBatchKMeans's; minibatch's time and
QE against MiniBatchKMeans's; and on the image patches at k = 50, wall time per distance evaluation of nmbatch,
VRKM and SBE over our Lloyd's.
"""

import argparse
import statistics
from collections import defaultdict

from dask_clust.engine.local import connect
from harness import measure
from harness.common import HERE
from harness.suites import Run

CASES = (("imgpatches", 50), ("imgpatches", 200), ("blobs1m_d16", 200), ("blobs200k_d32", 100))
FAST = ("nmbatch", "minibatch", "sbe", "vcgmm")
SLOW = ("kmeans", "vrkm")
PEERS = ("sklearn-minibatch", "faiss")


def measure_case(run, name, k, seeds, algos):
    """Rows {method: [row per seed]} of one data set (ours: those of ``algos``)."""
    path, X = run.data(name)
    overhead = measure.engine_overhead_ms(path, run.client)
    got = defaultdict(list)
    got["sklearn-lloyd"].append(run.baseline(name, path, X, k, 0))
    for seed in range(seeds):
        for peer in PEERS:
            got[peer].append(run.competitor(peer, path, X, k, seed, repeats=1))
        for algo in [a for a in FAST + (SLOW if seed == 0 else ()) if a in algos]:
            got[algo].append(run.ours_row(path, X, algo, k, seed, {}, overhead, repeats=1))
    for method, rows in got.items():
        for seed, row in enumerate(rows):
            run.emit(
                {
                    "kind": "stochastic",
                    "data": name,
                    "k": k,
                    "n": X.shape[0],
                    "d": X.shape[1],
                    "seed": seed,
                    "method": method,
                    **row,
                }
            )
    return got


def medians(rows):
    ok = [r for r in rows if "qe" in r]
    if not ok:
        return None
    return {
        "wall_s": statistics.median(r["wall_s"] for r in ok),
        "qe": statistics.median(r["qe"] for r in ok),
        "evals": statistics.median(r.get("distance_evals") or 0 for r in ok),
        "runs": len(ok),
    }


def summary(name, k, got):
    med = {m: medians(rows) for m, rows in got.items()}
    base = med["sklearn-lloyd"]
    peers = {m: med[m] for m in ("sklearn-lloyd",) + PEERS if med.get(m)}
    out = [f"{name} k={k}:"]
    for method, m in med.items():
        if m is None:
            out.append(f"  {method}: {got[method][0].get('status')}")
            continue
        beaten = [p for p, v in peers.items() if p != method and v["wall_s"] < m["wall_s"] and v["qe"] < m["qe"]]
        mine = method not in peers
        out.append(
            f"  {method:18s} wall {m['wall_s']:8.3f} s  QE {m['qe']:.5g}  η {m['qe'] / base['qe'] - 1:+.2%}"
            + (f"  dominated by {', '.join(beaten)}" if mine and beaten else ("  not dominated" if mine else ""))
            + f"  ({m['runs']} seed{'s' if m['runs'] > 1 else ''})"
        )
    mbk, nm, mb = med.get("sklearn-minibatch"), med.get("nmbatch"), med.get("minibatch")
    if mbk and nm:
        out.append(
            f"  nmbatch: η {nm['qe'] / base['qe'] - 1:+.2%} (target ≤ +0.5 %) in {nm['wall_s']:.3f} s vs "
            f"MiniBatchKMeans {mbk['wall_s']:.3f} s ({'within' if nm['wall_s'] <= mbk['wall_s'] else 'over'})"
        )
    if mbk and mb:
        out.append(
            f"  minibatch: {mb['wall_s']:.3f} s vs {mbk['wall_s']:.3f} s, QE {mb['qe'] / mbk['qe'] - 1:+.2%} "
            "against MiniBatchKMeans's"
        )
    lloyd = med.get("kmeans")
    if name == "imgpatches" and k == 50 and lloyd and lloyd["evals"]:
        per = lloyd["wall_s"] / lloyd["evals"]
        for algo in ("nmbatch", "vrkm", "sbe"):
            m = med.get(algo)
            if m and m["evals"]:
                out.append(
                    f"  {algo}: {1e9 * m['wall_s'] / m['evals']:.1f} ns per distance evaluation, "
                    f"{m['wall_s'] / m['evals'] / per:.2f}× our Lloyd's {1e9 * per:.1f} ns (target ≤ 5×)"
                )
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--cases", default=",".join(f"{n}:{k}" for n, k in CASES), help="data:k,... (default: all four)")
    p.add_argument("--algos", default=",".join(FAST + SLOW), help="ours to fit (the peers always run)")
    args = p.parse_args()
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    lines = []
    with open(f"{HERE}/results/stochastic.jsonl", "w") as f, connect() as client:
        run = Run("stochastic", f, client, repeats=1, cap_s=600.0)
        try:
            for name, k in cases:
                case = summary(name, k, measure_case(run, name, k, args.seeds, args.algos.split(",")))
                print("\n".join(case), flush=True)
                lines += case
        finally:
            run.close()
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
