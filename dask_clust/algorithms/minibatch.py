"""Sculley's mini-batch k-means (``algo="minibatch"``), as scikit-learn's ``MiniBatchKMeans`` runs it: batches
of b rows drawn uniformly with replacement, each assigned to the centres of the start of its batch, and every
centre the running mean of the rows it was ever given (per-centre rate 1/v), with centres that stop
receiving rows moved onto rows of the batch.

D. Sculley, "Web-scale k-means clustering", WWW 2010, doi:10.1145/1772690.1772862 (Alg. 1: v starts at 0, so
a centre's first row replaces its seed); the baseline of Newling & Fleuret (NIPS 2016), Fig. 2. The seeding
on a sample, the reassignment and the stopping rule are scikit-learn's (``sklearn.cluster.MiniBatchKMeans``).

  1. seed on init_size rows drawn uniformly (k-means|| by default: on the image patches at k = 200, 0.5 %
     lower QE than scikit-learn's k-means++ on 3·b rows, in less time); v_j = 0
  repeat
  2. the batch: b rows drawn uniformly with replacement, keyed by step, several steps' rows in one gather (a
     round trip per gather, not per batch: a batch's arithmetic is far below a round trip's cost); on a
     streamed input the workers draw a window of about N / b steps' rows in one pass and hold them until
     used (``blocks/batches.py``); the seeding sample and the engine's first pass ride on the first gather
  3. minibatch_step: assign the batch to the current centres; v += Σ w, c += (Σ w x − Σ w c) / v
  4. reassign: every 10·k rows (and whenever a centre has v = 0), centres with v < reassignment_ratio ·
     max v jump to distinct random rows of the batch and take the smallest v of the others
  until the smoothed batch inertia has not improved for ``max_no_improvement`` batches, Σ ||Δc||² ≤ tol
  (scaled by the mean feature variance), or max_iter batches.

``metric="cosine"``: the rows are read on the unit sphere and step 3's updated centre is put back on it
(online spherical k-means with Sculley's per-centre rate: S. Zhong, "Efficient online spherical k-means
clustering", IJCNN 2005; the mean direction of Dhillon & Modha, Machine Learning 2001); the batch inertia
and the objective are Σ w (1 − cos).

Sparse rows (a CSR matrix of documents): the batches travel and are assigned as CSR (O(nnz·k) a batch, by
the centres' columns, ``kernels/sparse.py``), a centre moved by step 4 is its row densified, and the seeding
sample seeds as CSR rows (``init="auto"``: k-means++ on them).

The driver holds the centres, their counts and one gather of batches: O(k·D + gather·b·D), whatever N (a
gather is at most 64 MiB of rows; of CSR rows, their stored bytes: O(gather·b·nnz per row), not D), and a
window's strata counts (8 bytes per 65,536 rows). Passes over a
streamed input: one per window (⌈steps·b / N⌉; the first carries the engine's first pass), and the final QE.
"""

import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._params import FiniteArray, Interval, NoneOK, Options
from .._random import stream
from ..blocks.batches import Batches
from ..blocks.lloyd import to_sphere
from ..blocks.seeding import AUTO, ROW_BYTES, SEEDERS, sample_ids, seed, seed_rows
from ..kernels.assign import Prepared, accumulate, densified, nearest
from ..kernels.minibatch import running_means
from .registry import BIG, COUNT, MAYBE, METRIC, METRICS, AlgorithmSpec, centres, finish, register, spherical


@dataclass
class MiniBatchConfig:
    n_clusters: int = 8
    init: object = "auto"
    batch_size: int = 1024
    init_size: int | None = None
    max_iter: int = 100_000
    max_no_improvement: int | None = 10
    reassignment_ratio: float = 0.01
    tol: float = 0.0
    metric: str = "euclidean"

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "init": [Options((AUTO,) + SEEDERS), FiniteArray()],
        "batch_size": [Interval(numbers.Integral, 1, None)],
        "init_size": [Interval(numbers.Integral, 1, None), NoneOK()],
        "max_iter": [Interval(numbers.Integral, 1, None)],
        "max_no_improvement": [Interval(numbers.Integral, 1, None), NoneOK()],
        "reassignment_ratio": [Interval(numbers.Real, 0, None, "left")],
        "tol": [Interval(numbers.Real, 0, None, "left")],
        "metric": [Options(METRICS)],
    }

    docs: ClassVar = {
        "init": "As k-means' init ('auto': 'k-means||', or 'k-means++' on sparse rows), run on init_size sampled "
        "rows (scikit-learn's: 'k-means++').",
        "init_size": "Rows drawn (uniformly, with replacement) to seed on: None is scikit-learn's 3 * batch_size, "
        "at least 50 * n_clusters (scikit-learn's 3 * n_clusters left 15 rows per centre at k = 200); "
        "at most all rows.",
        "max_iter": "Most mini-batches (scikit-learn's max_iter counts passes over the data instead).",
        "max_no_improvement": "Stop when the smoothed batch inertia has not improved for this many batches "
        "(scikit-learn's rule); None disables the rule.",
        "reassignment_ratio": "Centres whose weight is below this fraction of the heaviest one's move to random "
        "rows of the batch (scikit-learn's rule); 0 never moves them.",
        "tol": "Stop when the centres' total squared shift over a batch is at most tol times the mean feature "
        "variance; 0 disables the rule.",
        "metric": METRIC,
    }


def assign_batch(x, w, centers):
    """Rows x (weights w) against ``Prepared`` centres: (Σ w x, Σ w per centre, Σ w d², evaluations)."""
    k, d = centers.C.shape
    sums, weights = np.zeros((k, d)), np.zeros(k)
    labels, mind, evals = nearest(x, centers)
    inertia = accumulate(x, w, labels, mind, sums, weights)
    return sums, weights, inertia, np.int64(evals)


def minibatch_step(x, w, centers, counts, dtype, unit=False):
    """Step 3: the batch assigned to the centres as they are, then each centre the mean of all the rows it
    was ever given (``unit``: put back on the unit sphere). Returns (centres, counts, the batch's Σ w d²
    before the update, evaluations)."""
    sums, weights, inertia, evals = assign_batch(x, w, Prepared(centers, dtype))
    total = counts + weights
    new = np.empty_like(centers)
    running_means(centers, sums, weights, total, new)
    if unit:
        got = weights > 0
        new[got] = to_sphere(new[got])
    return new, total, inertia, evals


def reassign(x, centers, counts, ratio, rng):
    """Step 4 (in place): centres lighter than ratio × the heaviest jump to distinct random rows of the batch
    (at most half of them, the lightest first) and take the smallest weight of the others, so that they are
    not moved again at once. Returns how many moved."""
    low = counts < ratio * counts.max()
    most = x.shape[0] // 2
    if low.sum() > most:
        low[np.argsort(counts, kind="stable")[most:]] = False
    moved = int(low.sum())
    if moved:
        centers[low] = densified(x[rng.choice(x.shape[0], moved, replace=False)])
        counts[low] = counts[~low].min()
    return moved


def partial_step(cfg, x, w, centers, counts, since, entropy, step, dtype):
    """The estimator's ``partial_fit`` on a batch it holds: steps 2-3 on the batch, then step 4 when
    ``10 k`` rows have passed since the last reassignment (``since``) or a centre has no weight yet.
    Returns (centers, counts, rows since the last reassignment)."""
    due = cfg.reassignment_ratio > 0 and (since + x.shape[0] >= 10 * cfg.n_clusters or not counts.all())
    centers, counts, _, _ = minibatch_step(x, w, centers, counts, dtype, spherical(cfg))
    if due:
        reassign(x, centers, counts, cfg.reassignment_ratio, stream(entropy, "minibatch", "reassign", "partial", step))
    return centers, counts, 0 if due else since + x.shape[0]


def seeding_rows(cfg, n_samples):
    """init_size, else scikit-learn's 3·batch_size (at least 50·k), at most all rows."""
    return min(n_samples, cfg.init_size or max(3 * cfg.batch_size, 50 * cfg.n_clusters))


class NoImprovement:
    """scikit-learn's stopping rule: an exponentially weighted average of the batch inertia per row (weight
    α = 2b/(N+1) per batch; the first batch, which only measures the seeds, left out) that has not reached a
    new minimum for ``patience`` batches; here not before the average has seen 1/α batches (half a pass over
    the rows, its own window). The batch inertia's noise is of the order of its late improvements, so with
    scikit-learn's rule a lucky second batch ends a fit a dozen batches later (3 of 8 seeds on blobs200k_d32,
    k = 100, +1 % QE)."""

    def __init__(self, b, n_samples, patience, ewa=None, best=np.inf, stale=0):
        self.alpha = min(1.0, 2.0 * b / (n_samples + 1))
        self.patience, self.ewa, self.best, self.stale = patience, ewa, best, stale

    def update(self, step, batch):
        if step == 0:
            return False
        self.ewa = batch if self.ewa is None else self.ewa * (1 - self.alpha) + batch * self.alpha
        self.stale = 0 if self.ewa < self.best else self.stale + 1
        self.best = min(self.best, self.ewa)
        return self.patience is not None and self.stale >= self.patience and step * self.alpha >= 1


def fit(engine, cfg, entropy, loop):
    N, k, dtype = engine.n_samples, cfg.n_clusters, engine.dtype
    unit = spherical(cfg)  # the engine holds the rows on the unit sphere (``api.fit``)
    b = min(cfg.batch_size, N)
    restored = loop.restored
    with Batches(engine, entropy, "minibatch", b, loop.max_iter, dense=False) as batches:
        if restored is None:  # the seeding sample comes in the first gather (a pass less when streamed)
            sampled = isinstance(cfg.init, str)
            ids = sample_ids(engine, entropy, seeding_rows(cfg, N), "minibatch") if sampled else ()
            rows, w = batches.start(0, ids)
            if sampled:
                centers, seed_evals = seed_rows(engine, rows, w, k, cfg.init, entropy)
            else:
                centers, seed_evals = seed(engine, k, cfg.init, entropy)
            centers = to_sphere(centers) if unit else centers
            counts, since, evals_total = np.zeros(k), 0, seed_evals
            rule = NoImprovement(b, N, cfg.max_no_improvement)
        else:  # a resumed fit: the centres, their counts and the rule's state; the batches are keyed by step
            centers, counts, seed_evals = (restored[name] for name in ("centers", "counts", "seed_evals"))
            since, evals_total = restored["since"], restored["evals"]
            rule = NoImprovement(b, N, cfg.max_no_improvement, restored["ewa"], restored["best"], restored["stale"])
        loop.keep(seed_evals=int(seed_evals))
        tol = cfg.tol * float(np.mean(engine.summary.var))
        for step in loop:
            x, wx = batches.get(step)
            # as scikit-learn: due every 10·k rows, or when a centre had no weight before this batch
            since += b
            due = cfg.reassignment_ratio > 0 and (since >= 10 * k or not counts.all())
            new, counts, inertia, evals = minibatch_step(x, wx, centers, counts, dtype, unit)
            moved = 0
            if due:
                since = 0
                moved = reassign(x, new, counts, cfg.reassignment_ratio, stream(entropy, "minibatch", "reassign", step))
            shift = float(((new - centers) ** 2).sum()) if tol > 0 else 0.0  # (two passes over k × D)
            centers = new
            batch = float(inertia / wx.sum()) * (0.5 if unit else 1.0)
            evals_total += int(evals)
            loop.converged = rule.update(step, batch) or (tol > 0 and shift <= tol)
            loop.record(batch, evals, moved, centers=centers, smoothed=rule.ewa)
            loop.save(
                lambda: {
                    "centers": centers,
                    "counts": counts,
                    "ewa": rule.ewa,
                    "best": rule.best,
                    "stale": rule.stale,
                    "since": since,
                    "evals": int(evals_total),
                }
            )
    return finish(
        engine,
        centers,
        loop,
        evals_total,
        {"seeding_distance_evals": int(seed_evals), "counts_": counts, "since_reassign": since},
        unit=unit,
    )


def saved(cfg, n_samples, n_features):
    """What a minibatch checkpoint holds: the centres, their counts, the stopping rule's state and the rows
    since the last reassignment (the batches are keyed by step)."""
    return {
        "centers": centres(cfg, n_features),
        "counts": ("floats", (cfg.n_clusters,)),
        "ewa": MAYBE,
        "best": ("float", -BIG, float("inf"), False),
        "stale": COUNT,
        "since": COUNT,
        "evals": COUNT,
        "seed_evals": COUNT,
    }


register(
    AlgorithmSpec(
        name="minibatch",
        config=MiniBatchConfig,
        fit=fit,
        estimator="MiniBatchKMeans",
        summary="Sculley's mini-batch k-means: uniform batches with replacement, per-centre rate 1/v, light centres "
        "moved to batch rows",
        reference="Sculley, WWW 2010, doi:10.1145/1772690.1772862",
        objective="the batch's mean squared distance to its centres, before the update (mean 1 − cos with "
        "metric='cosine')",
        partial_step=partial_step,
        state_bytes=lambda cfg: ROW_BYTES,  # the seeder's; streamed, the held draws besides, in files
        holds_draws=True,
        resumable=True,
        sparse=True,
        saved=saved,
    )
)
