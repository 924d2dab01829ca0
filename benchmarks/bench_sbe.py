"""Stochastic backward Euler (issue #6 acceptance), every figure measured in one run on this machine:
1. Iris (scikit-learn's load_iris), k = 3, 100 runs from 3 random rows each, batch 30, (omaxit, imaxit) =
   (100, 10), step_size 1.0, decay 0.95: runs ending with f = QE/(2N) in [0.2628, 0.2640] (target ≥ 95),
   and Lloyd from the same starts: runs ending near 0.476–0.485 (the paper: about 18 %);
2. digit-like 784-d data (``dask_clust.datasets.make_digitlike``, f = 15.68 at the true centres), k = 6, 8,
   10, 10 runs each from the same random rows, batch 500, (100, 5): mean f of SBE, Lloyd and Sculley's
   mini-batch (batch 500) (target: SBE below both at every k);
3. blobs1m_d16, k = 200, SBE's defaults on LocalCluster(2 workers x 1 thread): QE and wall time next to our
   Lloyd from the same random rows.
Parts 1 and 2 are the paper suite's experiments (``harness.paper.sbe_iris``, ``sbe_digitlike``), run here at
full size, their rows in results/sbe_iris.jsonl and results/sbe_digitlike.jsonl.
"""

import argparse
import time

import numpy as np

import dask_clust
from harness import paper
from harness.common import Rows, blobs, emit, local_cluster


def iris(out, runs):
    rows = Rows("sbe_iris")
    paper.sbe_iris(rows, runs)
    good, stuck = paper.iris_counts(rows.rows)
    out.append(
        f"Iris: SBE ends with f in [{paper.IRIS_GLOBAL[0]}, {paper.IRIS_GLOBAL[1]}] in {good}/{runs} runs "
        f"(target ≥ 95 of 100); Lloyd from the same starts ends near 0.48 (f > {paper.IRIS_STUCK}) in "
        f"{stuck}/{runs} (the paper: about 18 %)"
    )


def digitlike(out, runs):
    rows = Rows("sbe_digitlike")
    paper.sbe_digitlike(rows, runs)
    for k in sorted({r["k"] for r in rows.rows}):
        f = {
            a: np.array([r["f"] for r in rows.rows if r["k"] == k and r["algo"] == a])
            for a in ("SBE", "Lloyd", "mini-batch")
        }
        mean = {a: v.mean() for a, v in f.items()}
        out.append(
            f"digit-like 784-d k={k}: mean f over {runs} runs SBE {mean['SBE']:.3f} (sd "
            f"{f['SBE'].std():.3f}), Lloyd {mean['Lloyd']:.3f} (sd {f['Lloyd'].std():.3f}), Sculley "
            f"mini-batch {mean['mini-batch']:.3f} (sd {f['mini-batch'].std():.3f}); SBE below both: "
            f"{mean['SBE'] < min(mean['Lloyd'], mean['mini-batch'])} (reconstruction: SBE 20.7 / 17.0 / "
            f"15.85, Lloyd 21.9 / 18.5 / 16.7 at k = 6 / 8 / 10)"
        )


def blobs1m(out):
    X, _ = blobs(1_000_000, 16, 200, seed=0)
    init = X[np.random.default_rng(0).choice(len(X), 200, replace=False)].astype(np.float64)
    with local_cluster(2, 1) as client:
        for algo in ("sbe", "kmeans"):  # warm the workers
            dask_clust.fit(X[:20_000], algo=algo, n_clusters=5, client=client, random_state=0)
        row = {}
        for algo in ("sbe", "kmeans"):
            t = time.perf_counter()
            m = dask_clust.fit(X, algo=algo, n_clusters=200, init=init, client=client, random_state=0)
            row[algo] = {"qe": m.objective_, "wall_s": time.perf_counter() - t, "n_iter": m.n_iter_}
    emit("sbe_blobs1m", row)
    s, ll = row["sbe"], row["kmeans"]
    out.append(
        f"blobs1m_d16 k=200 from the same random rows, 2 workers: SBE (defaults) QE {s['qe']:.5g} in "
        f"{s['wall_s']:.2f} s; Lloyd QE {ll['qe']:.5g} ({100 * (s['qe'] / ll['qe'] - 1):+.2f} %) in "
        f"{ll['wall_s']:.2f} s ({ll['n_iter']} iterations)"
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="iris,digitlike,blobs")
    p.add_argument("--iris-runs", type=int, default=100)
    p.add_argument("--digit-runs", type=int, default=10)
    args = p.parse_args()
    parts, out = set(args.parts.split(",")), []
    if "iris" in parts:
        iris(out, args.iris_runs)
    if "digitlike" in parts:
        digitlike(out, args.digit_runs)
    if "blobs" in parts:
        blobs1m(out)
    print()
    print("\n".join(out))


if __name__ == "__main__":
    main()
