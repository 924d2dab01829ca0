"""``--suite sweep``: wall time and QE against the number of clusters C on one data set, N fixed (issue #33):
vc-GMM, var-GMM-S and our Lloyd with their defaults, faiss's k-means with its defaults, and scikit-learn's
k-means++ Lloyd, the baseline of every row's eta and speedup.

scikit-learn runs in its own process while it finishes within ``SKLEARN_CAP_S``; at a C where it does not
(or beyond the first such C) its row is its time per Lloyd iteration there (``measure.sklearn_iteration_s``,
from random rows: its k-means++ seeding is left out) times its iteration count at the largest C it finished,
and at least the cap it ran past: a lower bound, marked ``extrapolated``, with no QE: such rows give
speedups, no eta.
Our Lloyd stops at ``KMEANS_MAX_C``: it took 101 s at C = 500 (scikit-learn 379 s), and its time grows with
C and its iteration count; its time per iteration is the scaling suite's business. The suite takes about
an hour, most of it scikit-learn's.
"""

import logging
import os

import numpy as np

from . import measure
from .measure import TINY_LOOP

logger = logging.getLogger("harness")

DATA = "blobs1m_d32"
SWEEP_C = (500, 1000, 2000, 4096)
TINY_C = (4, 16)
FITS = ("vcgmm", "vargmm", "kmeans")
KMEANS_MAX_C = 1000
SKLEARN_CAP_S = 900.0
BASELINE = "sklearn-lloyd"


def threads():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def extrapolated(X, C, n_iter, seed=0):
    """scikit-learn's row at a C it did not finish within its cap: per-iteration time × ``n_iter``, and at
    least the cap it ran past (without its seeding the product alone fell below it: 636 s at C = 4096)."""
    init = X[np.random.default_rng(seed).choice(len(X), C, replace=False)]
    per_iter = measure.sklearn_iteration_s(X, init, threads(), iters=2)
    return {
        "wall_s": max(per_iter * n_iter, SKLEARN_CAP_S),
        "s_per_iter": per_iter,
        "n_iter": n_iter,
        "extrapolated": True,
    }


def versus(got, base):
    """eta and speedup against the baseline row of this C (speedup alone against an extrapolated one)."""
    if base.get("extrapolated") and "wall_s" in got:
        return {"eta": None, "speedup": base["wall_s"] / got["wall_s"]}
    return measure.versus(got, base)


def run_all(run):

    path, X = run.data(DATA)
    overhead = measure.engine_overhead_ms(path, run.client)
    finished, capped = None, False  # scikit-learn's iterations at the largest C it finished; over its cap yet
    for C in TINY_C if run.tiny else SWEEP_C:
        logger.info("sweep %s C=%d", DATA, C)
        common = {"kind": "sweep", "data": DATA, "n": X.shape[0], "d": X.shape[1], "k": C, "seed": 0}
        base = {"status": "cap", "cap_s": SKLEARN_CAP_S}
        if not capped:  # a larger C would take longer still: once capped, extrapolate straight away
            base = run.competitor(BASELINE, path, X, C, 0, repeats=1, cap_s=SKLEARN_CAP_S)
            capped = "qe" not in base
            finished = finished if capped else base["n_iter"]
        if capped and finished is not None:
            base = extrapolated(X, C, finished)
        rows = [("scikit-learn", BASELINE, base)]
        for algo in FITS:
            if algo == "kmeans" and C > KMEANS_MAX_C:
                continue
            cut = {"max_iter": TINY_LOOP["max_iter"]} if run.tiny else {}
            rows.append(("dask_clust", algo, run.ours_row(path, X, algo, C, 0, cut, overhead, repeats=1)))
        # faiss gets the baseline's cap: at C = 4096 it trains on every row (256 per centre), past 120 s
        rows.append(("faiss", "faiss", run.competitor("faiss", path, X, C, 0, repeats=1, cap_s=SKLEARN_CAP_S)))
        for tool, algo, got in rows:
            run.emit({**common, "tool": tool, "algo": algo, **got, **versus(got, base)})
