"""How good a partition is, without its labels: the criteria of the partition a set of centres makes (each
row labelled by its nearest centre), from one pass over the rows that sends the driver O(k·D).

One pass (``cluster_sums``) gives per cluster Σ w, Σ w (x − c) and Σ w ||x − c||², and the rows' Σ w s of
the simplified silhouette, and leaves each row's label in its chunk's state; a second, O(N·D), gives Σ w
||x − μ|| per cluster about the clusters' means μ from those labels. Then, on the driver:

- **inertia**: Σ w ||x − c||², the quantization error of the centres (k-means' objective);
- **Calinski–Harabasz** (Calinski & Harabasz 1974): [B / (K − 1)] / [W / (N − K)] with μ_c = c + Σ w (x − c)
  / Σ w the clusters' means, B = Σ_c n_c ||μ_c − μ||², W = Σ_c (Σ w ||x − c||² − n_c ||μ_c − c||²) (the
  within-cluster scatter about the means, taken about the centres so that nothing cancels where the
  centres are the means) and K the clusters that hold rows;
- **Davies–Bouldin** (Davies & Bouldin 1979): the mean over clusters of max_{j ≠ i} (s_i + s_j) / ||μ_i − μ_j||,
  s_i the mean distance of a cluster's rows to its mean (the second pass);
- **the simplified silhouette** (Hruschka et al. 2006, as Spark's ``ClusteringEvaluator``): the mean over
  rows of (b − a) / max(a, b) with a, b the distances to the nearest and second-nearest centre;
- **the silhouette** (Rousseeuw 1987) of a uniform sample of the rows, exact on it (``sample_silhouette``).

Each equals scikit-learn's score (``calinski_harabasz_score``, ``davies_bouldin_score``,
``silhouette_score``) of the labels the centres give, and a weight w counts a row w times.

What the driver holds: the sums, k·(D + 3) float64; Davies–Bouldin's pairwise centre distances a
block of rows at a time (O(k·block)); the silhouette's sample, its rows (size × D) and labels.
"""

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from .._random import stream
from ..errors import InputError
from ..kernels.assign import Prepared, is_csr, nearest
from ..kernels.criteria import (
    cluster_sums,
    csr_cluster_sums,
    csr_nearest_m,
    csr_spreads_about,
    distance_sums,
    nearest_log_likelihood,
    nearest_m,
    row_distances,
    spreads_about,
)

# rows of centres whose pairwise distances Davies–Bouldin holds at once
PAIR_ROWS = 1024
# rows of the silhouette's sample one thread scores at a time (their inner products with the whole sample: 4 MB a
# block at 2,000 rows, 40 MB at 20,000)
SILHOUETTE_ROWS = 256


# the chunk state holding each row's label between the two passes (4 bytes a row; rebuilt from the centres)
LABELS = "criteria_labels"


class ClusterSums(NamedTuple):
    """The sums per cluster of the partition some centres make (``partition_sums``)."""

    weights: np.ndarray  # (k,) Σ w
    offsets: np.ndarray  # (k, d) Σ w (x − c)
    squares: np.ndarray  # (k,) Σ w ||x − c||²
    silhouette: float  # Σ w (b − a) / max(a, b)
    spreads: np.ndarray | None  # (k,) Σ w ||x − μ|| about the clusters' means (None: not measured)
    log_likelihood: float | None  # an isotropic mixture's, over each row's nearest components (None: not asked)
    qe: float  # Σ w min_c ||x − c||², the bits of the fits' final pass (its sum by chunk)
    evals: int


def _labelled(chunk, centers):
    """State: each row's nearest centre (a rebuilt partition's, from the centres)."""
    chunk.state[LABELS] = nearest(chunk.x, centers)[0]


class SumsOf(NamedTuple):
    """``_sums_step``'s parameters: the centres (a ``Prepared``), and a mixture's nearest costs or None."""

    centers: Prepared
    nearest_costs: tuple | None


class SumsPartial(NamedTuple):
    """A chunk's part of ``ClusterSums`` (the silhouette's Σ w s, a mixture's log-likelihood terms)."""

    weights: np.ndarray
    offsets: np.ndarray
    squares: np.ndarray
    silhouette: float
    log_likelihood: float
    qe: float
    evals: np.int64


class Spreads(NamedTuple):
    """Σ w ||x − μ|| per cluster about the clusters' means."""

    spreads: np.ndarray


def _sums_step(chunk, params: SumsOf) -> SumsPartial:
    centers, nearest_costs = params.centers, params.nearest_costs
    X = chunk.x
    k, d = centers.C.shape
    n_terms = 0 if nearest_costs is None else min(k, nearest_costs[1])
    m = max(2, n_terms)
    ids, dists = np.empty((X.shape[0], m), np.int32), np.empty((X.shape[0], m))
    weights, offsets, squares = np.zeros(k), np.zeros((k, d)), np.zeros(k)
    if is_csr(X):
        evals = csr_nearest_m(X.indptr, X.indices, X.data, centers.CT, centers.cnorm, ids, dists)
        s = csr_cluster_sums(X.indptr, X.indices, X.data, chunk.w, centers.C, ids, dists, weights, offsets, squares)
    else:
        evals = nearest_m(X, centers.Cd, centers.cnorm, centers.C, centers.tol, centers.block, ids, dists)
        s = cluster_sums(X, chunk.w, centers.C, ids, dists, weights, offsets, squares)
    chunk.state[LABELS] = np.ascontiguousarray(ids[:, 0])
    ll = nearest_log_likelihood(chunk.w, dists, nearest_costs[0], n_terms) if n_terms else 0.0
    qe = float(np.dot(chunk.w, np.ascontiguousarray(dists[:, 0])))  # (as ``lloyd.quantization_error``'s step)
    return SumsPartial(weights, offsets, squares, s, ll, qe, np.int64(evals))


def _spreads_step(chunk, means) -> Spreads:
    spreads, X = np.zeros(means.shape[0]), chunk.x
    if is_csr(X):
        mnorm = np.einsum("ij,ij->i", means, means)
        csr_spreads_about(X.indptr, X.indices, X.data, chunk.w, means, mnorm, chunk.state[LABELS], spreads)
    else:
        spreads_about(X, chunk.w, means, chunk.state[LABELS], spreads)
    return Spreads(spreads)


def check_centers(engine, centers):
    """The centres as float64 (k, d), refused in one line where no criterion is defined."""
    centers = np.asarray(centers, dtype=np.float64)
    if centers.ndim != 2 or centers.shape[1] != engine.n_features:
        raise InputError(f"centers must have shape (k, {engine.n_features}); got {centers.shape}")
    if centers.shape[0] < 2:
        raise InputError(f"the criteria compare clusters: at least 2 centres are needed; got {centers.shape[0]}")
    if not np.isfinite(centers).all():
        raise InputError("centers hold NaN or inf")
    return centers


def partition_sums(engine, centers, spreads=True, nearest_costs=None):
    """The ``ClusterSums`` of the partition ``centers`` make: one pass with O(N·k·D) work, and with
    ``spreads`` one more with O(N·D), each row's label kept between them. ``nearest_costs`` = (h, offset,
    n_terms): a mixture whose every component costs offset + h ||x − μ_c||² (one variance, equal weights:
    its likeliest components are the nearest means), whose log-likelihood over each row's ``n_terms``
    nearest components the first pass sums too."""
    prepared = Prepared(centers, engine.dtype)
    costs = None if nearest_costs is None else (float(nearest_costs[0]), int(nearest_costs[2]))
    with engine.state(LABELS, _labelled, lambda: prepared, build=False):
        part = engine.reduce(_sums_step, SumsOf(prepared, costs))
        ll = part.log_likelihood
        if nearest_costs is not None:
            ll = float(ll) - float(nearest_costs[1]) * float(part.weights.sum())
        ll = None if costs is None else ll
        sums = ClusterSums(
            part.weights, part.offsets, part.squares, float(part.silhouette), None, ll, float(part.qe), int(part.evals)
        )
        if spreads:
            sums = sums._replace(spreads=engine.reduce(_spreads_step, cluster_means(sums, centers)).spreads)
    return sums


def cluster_means(sums, centers):
    """Each cluster's mean (its centre where it holds no row)."""
    held = sums.weights > 0
    means = centers.copy()
    means[held] += sums.offsets[held] / sums.weights[held, None]
    return means


def inertia(sums):
    """Σ w ||x − c||² over the rows, c their nearest centre."""
    return float(sums.squares.sum())


def calinski_harabasz(sums, centers):
    """The Calinski–Harabasz index of the partition (1.0 where every row sits on its cluster's mean, as
    scikit-learn's)."""
    held = sums.weights > 0
    n_k, n = sums.weights[held], sums.weights.sum()
    means = cluster_means(sums, centers)[held]
    shift = sums.offsets[held] / n_k[:, None]
    within = float((sums.squares[held] - n_k * np.einsum("ij,ij->i", shift, shift)).sum())
    mean = (n_k[:, None] * means).sum(axis=0) / n
    between = float((n_k * ((means - mean) ** 2).sum(axis=1)).sum())
    k = int(held.sum())
    if k < 2:
        raise InputError(f"the rows fall in {k} cluster: Calinski-Harabasz needs at least 2")
    return 1.0 if within == 0.0 else between * (n - k) / (within * (k - 1))


def davies_bouldin(sums, centers):
    """The Davies–Bouldin index of the partition (``sums`` with their spreads)."""
    means = cluster_means(sums, centers)
    held = sums.weights > 0
    if int(held.sum()) < 2:
        raise InputError(f"the rows fall in {int(held.sum())} cluster: Davies-Bouldin needs at least 2")
    s = sums.spreads[held] / sums.weights[held]
    mu = means[held]
    sq = np.einsum("ij,ij->i", mu, mu)
    if np.allclose(s, 0):
        return 0.0
    worst = np.empty(mu.shape[0])
    spaced = False
    for lo in range(0, mu.shape[0], PAIR_ROWS):
        hi = min(mu.shape[0], lo + PAIR_ROWS)
        dist = np.sqrt(np.maximum(sq[lo:hi, None] - 2.0 * (mu[lo:hi] @ mu.T) + sq[None, :], 0.0))
        dist[np.arange(hi - lo), np.arange(lo, hi)] = 0.0  # (the expansion's rounding)
        spaced = spaced or not np.allclose(dist, 0)
        dist[dist == 0] = np.inf
        worst[lo:hi] = ((s[lo:hi, None] + s[None, :]) / dist).max(axis=1)
    return float(worst.mean()) if spaced else 0.0


def simplified_silhouette(sums):
    """The mean over rows of (b − a) / max(a, b), a and b the distances to the nearest and second-nearest
    centre."""
    return sums.silhouette / float(sums.weights.sum())


def silhouette(X, labels):
    """Rousseeuw's mean silhouette of rows X (in memory) under ``labels``, exact (scikit-learn's
    ``silhouette_score``); see ``silhouettes``."""
    return silhouettes(X, [labels])[0]


def silhouettes(X, labelings):
    """The mean silhouette of rows X (in memory) under each of ``labelings`` (a sweep's, one a k): a block of
    rows at a time, their inner products with every row by BLAS and their distances (``row_distances``) once
    for every labeling, then each labeling's sums of them over its clusters (``distance_sums``), the blocks on
    this process's threads. O(n²·D + n²·labelings) work, O(block·(n + k)) memory a thread. A labeling with
    fewer than 2 or more than n − 1 clusters scores NaN (``silhouette`` raises)."""
    n = X.shape[0]
    found = [np.unique(np.asarray(labels), return_inverse=True) for labels in labelings]
    scored = [i for i, (present, _) in enumerate(found) if 2 <= present.size <= n - 1]
    if len(labelings) == 1 and not scored:
        raise InputError(f"the silhouette needs 2 to n - 1 clusters among its {n} rows; got {found[0][0].size}")
    labels = [found[i][1].ravel().astype(np.int64) for i in scored]
    counts = [np.bincount(lab) for lab in labels]
    rows = X.astype(np.float64) if is_csr(X) else np.asarray(X, dtype=np.float64)
    sq = np.asarray(rows.multiply(rows).sum(axis=1)).ravel() if is_csr(X) else np.einsum("ij,ij->i", rows, rows)
    out = np.empty((len(scored), n))

    def inner(lo, hi):  # (a CSR product is sparse: its block made dense, 8 bytes × block × n)
        block = rows[lo:hi] @ rows.T
        return block.toarray() if is_csr(X) else block

    def score(lo):
        hi = min(n, lo + SILHOUETTE_ROWS)
        dist = np.ascontiguousarray(inner(lo, hi))
        row_distances(dist, sq, lo)
        r = np.arange(hi - lo)
        for s, (lab, count) in enumerate(zip(labels, counts, strict=True)):
            sums = np.empty((hi - lo, count.size))
            distance_sums(dist, lab, sums)
            mine = lab[lo:hi]
            a = sums[r, mine] / np.maximum(count[mine] - 1, 1)
            means = sums / count
            means[r, mine] = np.inf
            b = means.min(axis=1)
            top = np.maximum(a, b)
            out[s, lo:hi] = np.where((count[mine] < 2) | (top == 0), 0.0, (b - a) / np.where(top == 0, 1.0, top))

    if scored:
        with ThreadPoolExecutor() as pool:
            list(pool.map(score, range(0, n, SILHOUETTE_ROWS)))
    means = np.full(len(labelings), np.nan)
    means[scored] = out.mean(axis=1)
    return [float(m) for m in means]


def silhouette_sample(engine, size, entropy):
    """``size`` rows drawn uniformly without replacement (all rows when there are no more), read from the
    chunks that hold them (from every chunk, in the engine's first pass, when that has not run yet): the
    silhouette's sample. The draw depends on ``entropy`` alone, not on the
    chunking."""
    if not engine.unweighted:
        raise InputError("the sampled silhouette counts rows, not weights: it is not defined for weighted rows")
    n = engine.n_samples
    ids = np.sort(stream(entropy, "silhouette").choice(n, size, replace=False)) if size < n else np.arange(n)
    return engine.take(ids, first_pass="with", dense=not engine.sparse)  # (a first pass not yet made comes along)


def sample_labels(rows, centers):
    """The labels of rows in memory (a ``silhouette_sample``): each row's nearest centre."""
    return nearest(rows, Prepared(centers, rows.dtype))[0]


def sample_silhouette(rows, centers):
    """The exact silhouette of rows in memory (a ``silhouette_sample``), each labelled by its nearest centre."""
    return silhouette(rows, sample_labels(rows, centers))
