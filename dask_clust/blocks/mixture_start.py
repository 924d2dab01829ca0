"""Starts of a Gaussian mixture from responsibilities, as scikit-learn's ``GaussianMixture(init_params=...)``
makes them: "kmeans", each row's component its nearest k-means centre (k-means|| seeding, then Lloyd to
scikit-learn's KMeans rule); "random-responsibilities" (scikit-learn's "random"), each row's responsibilities
uniform random numbers, normalised. Either way the start is one M-step from those responsibilities: the
weights, means and variances of the covariance type (``truncated_em.mixture_m_step``), from exact sums over
the rows of the engine (the coreset, or every row), one pass after the centres are known.

The sums are taken about a point known before the pass (the k-means centre, the data's mean), so the
variances come from Q − U (μ − point)² without cancellation, as the EM's own M-step takes them.
"""

from typing import NamedTuple

import numpy as np

from ..kernels.assign import Prepared, accumulate, nearest
from .gaussian import component_scatter, covariance
from .lloyd import lloyd
from .seeding import seed
from .truncated_em import mixture_m_step, new_sigma2

STARTS = ("kmeans", "random-responsibilities")
# rows of a chunk given random responsibilities at a time: bounds the (rows × C) block
RESPONSIBILITY_ROWS = 4096
# scikit-learn's KMeans defaults, which its "kmeans" init runs
KMEANS_MAX_ITER = 300
KMEANS_TOL = 1e-4


def _moments(n_clusters, n_features, moments):
    """Σ w r x, Σ w r and Q as the covariance type's M-step reads it: per dimension, or the scatter (C, D, D)
    (``CovarianceType.moments``; the tied type reads none, and gets the per-dimension one, unread)."""
    q = (n_clusters, n_features, n_features) if moments == 2 else (n_clusters, n_features)
    return np.zeros((n_clusters, n_features)), np.zeros(n_clusters), np.zeros(q)


def _add_stats(x, w, resp, about, sums, U, Q):
    """Σ w r x, Σ w r and Σ w r (x − about_c)² (or its outer product) per component, for rows x with
    responsibilities resp."""
    wr = w[:, None] * resp
    U += wr.sum(axis=0)
    sums += wr.T @ x
    for c in range(len(U)):
        v = x - about[c]
        Q[c] += (v * wr[:, c, None]).T @ v if Q.ndim == 3 else wr[:, c] @ v**2


class HardStart(NamedTuple):
    """``_hard_stats``' parameters: the centres (a ``Prepared``) and the moments the covariance type needs."""

    centers: Prepared
    moments: int


class StartStats(NamedTuple):
    """A mixture's start statistics: Σ w x per component, the responsibilities' Σ w (U) and second moments
    (Q, as the covariance type keeps them); with a hard start, the distance evaluations."""

    sums: np.ndarray
    U: np.ndarray
    Q: np.ndarray
    evals: np.int64 = np.int64(0)


def _hard_stats(chunk, params: HardStart) -> StartStats:
    """Each row wholly its nearest centre's: the sums about the centres, and the evaluations."""
    centers, moments = params.centers, params.moments
    labels, mind, evals = nearest(chunk.x, centers)
    sums, U, Q = _moments(*centers.C.shape, moments)
    accumulate(chunk.x, chunk.w, labels, mind, sums, U)  # Lloyd's Σ w x and Σ w per centre
    x = chunk.x.astype(np.float64)
    if moments == 2:
        component_scatter(x, np.arange(chunk.n), labels, chunk.w, centers.C, Q)
    else:
        np.add.at(Q, labels, chunk.w[:, None] * (x - centers.C[labels]) ** 2)
    return StartStats(sums, U, Q, np.int64(evals))


class RandomStart(NamedTuple):
    """``_random_stats``' parameters: the components, the data's mean and the moments the type needs."""

    n_clusters: int
    mean: np.ndarray
    moments: int


def _random_stats(chunk, params: RandomStart) -> StartStats:
    """Responsibilities uniform random per row (the chunk's own stream), normalised: the sums about the
    data's mean, in blocks of RESPONSIBILITY_ROWS rows."""
    n_clusters, mean, moments = params.n_clusters, params.mean, params.moments
    D = len(mean)
    sums, U, Q = _moments(n_clusters, D, moments)
    about = np.broadcast_to(mean, (n_clusters, D))
    rng = chunk.rng("mixture start", "random-responsibilities")
    for b0 in range(0, chunk.n, RESPONSIBILITY_ROWS):
        b = slice(b0, min(chunk.n, b0 + RESPONSIBILITY_ROWS))
        resp = rng.random((b.stop - b.start, n_clusters))
        resp /= resp.sum(axis=1, keepdims=True)
        _add_stats(chunk.x[b].astype(np.float64), chunk.w[b], resp, about, sums, U, Q)
    return StartStats(sums, U, Q)


def mixture_start(engine, how, n_clusters, family, entropy):
    """The mixture ``how`` (one of STARTS) starts from on ``engine``'s rows, for the model ``family``
    (``truncated_em.Family``): (means (C, D), σ² (C, D), weights (C,), distance evaluations). A component no
    row chose keeps the point its sums were taken about, σ² of the data and weight 0 (scikit-learn's gets a
    weight of 10·eps and the same)."""
    s = engine.summary
    C, D = n_clusters, engine.n_features
    total = s.total_weight
    evals = 0
    if how == "kmeans":
        seeds, evals = seed(engine, C, "k-means||", entropy)
        result = lloyd(engine, seeds, max_iter=KMEANS_MAX_ITER, tol=KMEANS_TOL * float(np.mean(s.var)))
        about = result.centers
        stats = engine.reduce(_hard_stats, HardStart(Prepared(about, engine.dtype), family.cov.moments))
        evals += result.distance_evals + int(stats.evals)
    else:
        about = np.tile(s.mean, (C, 1))
        stats = engine.reduce(_random_stats, RandomStart(C, s.mean, family.cov.moments))
    var = family.cov.isotropic_var(1.0, C, D) * np.maximum(s.var, family.floor)
    mu, var, weights, resid = mixture_m_step(
        family, about, var, np.full(C, 1.0 / C), stats.sums, stats.U, stats.Q, total
    )
    if covariance(family.covariance_type).tied:  # one σ² from every component's residual
        var[:] = new_sigma2(resid, D, total, family.floor)
    return mu, var, weights, evals
