"""Sculley's mini-batch k-means (``algo="minibatch"``): batches of b rows drawn uniformly with replacement,
each assigned to the centres of the start of its batch, and every centre the running mean of the rows it
was ever given (per-centre rate 1/v; the seed counts as its first row).

D. Sculley, "Web-scale k-means clustering", WWW 2010, doi:10.1145/1772690.1772862; as Alg. 2 + 4 of
Newling & Fleuret (NIPS 2016), the baseline of their Fig. 2. ALGORITHMS.md §2.

  1. seed (k-means++ by default); S_j = c_j, v_j = 1
  repeat
  2. draw_batch: b global row ids, uniform with replacement (one stream, so chunking does not matter)
  3. assign the batch to the current centres; S += Σ w x, v += Σ w per centre (one exact reduction)
  4. c = S/v
  until the smoothed batch inertia has not improved for ``max_no_improvement`` batches (scikit-learn's
  rule), Σ ||Δc||² ≤ tol (scaled by the mean feature variance), or max_iter batches.
"""
import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._params import ArrayOf2D, Interval, NoneOK, Options
from .._random import stream
from ..kernels.assign import Prepared, accumulate, nearest
from ..blocks.seeding import ROW_BYTES, SEEDERS, seed
from .registry import BIG, COUNT, MAYBE, AlgorithmSpec, centres, finish, register


@dataclass
class MiniBatchConfig:
    n_clusters: int = 8
    init: object = "k-means++"
    batch_size: int = 1024
    max_iter: int = 100
    max_no_improvement: int | None = 10
    tol: float = 0.0

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "init": [Options(SEEDERS), ArrayOf2D()],
        "batch_size": [Interval(numbers.Integral, 1, None)],
        "max_iter": [Interval(numbers.Integral, 1, None)],
        "max_no_improvement": [Interval(numbers.Integral, 1, None), NoneOK()],
        "tol": [Interval(numbers.Real, 0, None, "left")],
    }

    docs: ClassVar = {
        "max_iter": "Most mini-batches.",
        "max_no_improvement": "Stop when the smoothed batch inertia has not improved for this many batches "
                              "(scikit-learn's rule); None disables the rule.",
        "tol": "Stop when the centres' total squared shift over a batch is at most tol times the mean feature "
               "variance; 0 disables the rule.",
    }


def assign_batch(x, w, centers):
    """Step 3 on rows x (weights w) against ``Prepared`` centres: (Σ w x, Σ w per centre, Σ w d², evaluations)."""
    k, d = centers.C.shape
    sums, weights = np.zeros((k, d)), np.zeros(k)
    labels, mind, evals = nearest(x, centers)
    inertia = accumulate(x, w, labels, mind, sums, weights)
    return sums, weights, inertia, np.int64(evals)


def partial_step(chunk, centers):
    """Step 3 on every row of the chunk: ``partial_fit``'s batch is the rows it is given."""
    return assign_batch(chunk.x, chunk.w, centers)


def _batch_step(chunk, params):
    """Step 3 on the chunk's share of the batch (repeats counted)."""
    centers, ids = params
    lo, hi = np.searchsorted(ids, [chunk.start, chunk.stop])
    rows = ids[lo:hi] - chunk.start
    return assign_batch(chunk.x[rows], chunk.w[rows], centers)


def fit(engine, cfg, entropy, loop):
    N = engine.n_samples
    rng = stream(entropy, "minibatch", "batches")
    restored = loop.restored
    if restored is None:
        centers, seed_evals = seed(engine, cfg.n_clusters, cfg.init, entropy)
        S, v = centers.copy(), np.ones(cfg.n_clusters)
        ewa, best, stale, evals_total = None, np.inf, 0, seed_evals
    else:   # a resumed fit: the centres, the sums and the batch stream where the checkpoint left them
        centers, S, v, seed_evals = (restored[name] for name in ("centers", "S", "v", "seed_evals"))
        ewa, best, stale, evals_total = (restored[name] for name in ("ewa", "best", "stale", "evals"))
        rng.bit_generator.state = restored["rng"]
    loop.keep(seed_evals=int(seed_evals))
    b = min(cfg.batch_size, N)
    alpha = min(1.0, 2.0 * b / (N + 1))  # scikit-learn's smoothing of the batch inertia
    tol = cfg.tol * float(np.mean(engine.summary.var))
    for _ in loop:
        ids = np.sort(rng.integers(0, N, b))
        dS, dv, inertia, evals = engine.reduce(_batch_step, (Prepared(centers, engine.dtype), ids))
        S += dS
        v += dv
        new = S / v[:, None]
        shift = float(((new - centers) ** 2).sum())
        centers = new
        batch = float(inertia / dv.sum()) if dv.sum() > 0 else 0.0
        ewa = batch if ewa is None else ewa * (1 - alpha) + batch * alpha
        stale = 0 if ewa < best else stale + 1
        best = min(best, ewa)
        evals_total += int(evals)
        loop.record(batch, evals, None, centers=centers, smoothed=ewa)
        if (cfg.max_no_improvement is not None and stale >= cfg.max_no_improvement) or (tol > 0 and shift <= tol):
            loop.converged = True
        loop.save(lambda: {"centers": centers, "S": S, "v": v, "ewa": ewa, "best": best, "stale": stale,
                           "evals": int(evals_total), "rng": rng.bit_generator.state})
    return finish(engine, centers, loop, evals_total, {"seeding_distance_evals": int(seed_evals), "counts_": v})


def saved(cfg, n_samples, n_features):
    """What a minibatch checkpoint holds: the centres, their sums and counts, the smoothed inertia and the
    batch stream's state."""
    return {"centers": centres(cfg, n_features), "S": centres(cfg, n_features), "v": ("floats", (cfg.n_clusters,)),
            "ewa": MAYBE, "best": ("float", -BIG, float("inf"), False), "stale": COUNT, "evals": COUNT,
            "rng": ("rng", "PCG64"), "seed_evals": COUNT}


register(AlgorithmSpec(
    name="minibatch", config=MiniBatchConfig, fit=fit, estimator="MiniBatchKMeans",
    summary="Sculley's mini-batch k-means: uniform batches with replacement, per-centre rate 1/v",
    reference="Sculley, WWW 2010, doi:10.1145/1772690.1772862",
    objective="the batch's mean squared distance to its centres, before the update",
    state_bytes=lambda cfg: ROW_BYTES,   # the seeder's; the batches keep none
    resumable=True,
    saved=saved,
))
