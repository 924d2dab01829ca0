"""vc-GMM (``algo="vcgmm"``) and var-GMM-S (``algo="vargmm"``): truncated variational EM for a Gaussian
mixture, on a lightweight coreset (vc-GMM) or on all rows with weight 1 (var-GMM-S). By default the paper's
model: isotropic, equal priors, one shared σ² (``covariance_type="tied-spherical"``, ``weights="equal"``);
with per-cluster variances σ²_c I ("spherical") or diag(σ²_c1 … σ²_cD) ("diag"), and weights π_c learned by
the M-step, the same EM with the cost −ℓ_c(x) = −log π_c N(x; μ_c, Σ_c) in place of d²/2σ² (below).

F. Hirschberger, D. Forster, J. Lücke, "A Variational EM Acceleration for Efficient Clustering at Very
Large Scales", IEEE TPAMI 44(12), 2022, doi:10.1109/TPAMI.2021.3133763 (arXiv:1810.00803, Alg. 1-2,
Suppl. D-F); D. Forster, J. Lücke, "Can clustering scale sublinearly with its clusters?", AISTATS 2018
(var-GMM-S). The steps below are the specification followed here.

  1. lightweight_coreset                 ``coreset.working_set`` (skipped by var-GMM-S)
  2. afkmc2_seed                         ``seeding.seed``: any seeder; by default k-means|| up to C²·D = 2^32,
                                         the paper's AFK-MC2 above (``seeding_method``)
  3. init_truncated_sets, init_neighbourhoods: K^(n) = C' random clusters (the paper's; after a greedy
     seeder by default the nearest initial mean + C'−1 random, ``truncated_init``, the coreset's rows then
     sorted by it, ``by_nearest_seed``), G_c = {c} + G−1 random
  repeat
  4. truncated_estep: S_n = ∪_{c ∈ K^(n)} G_c (+1); K^(n) ← its C' closest; σ² from eq. 8 the first
     time; posteriors over K^(n); free energy F
  5. update_neighbourhoods: G_c ← {c} + the G−1 clusters closest on average to the rows c won
  6. m_step: μ_c = Σ w s x / Σ w s, σ² = Σ w s ||x − μ_c||² / (D Σw) (one pass, see ``m_step``)
  until |ΔF/F| < tol (from the 2nd iteration; the last M-step is kept) or max_iter.

The other models (the paper's TPAMI version, Sec. 3, carries the truncated EM over to them): the first
iteration is the one above (σ² from eq. 8, equal weights); from its M-step on (``mixture_m_step``) each
cluster has its own variances and weight, U_c = Σ w s, π_c = U_c / Σw, σ²_cd = Σ w s (x_d − μ_cd)² / U_c +
reg_covar ("spherical": the mean over d; "tied-spherical": vc-GMM's one σ²), and every later search ranks
clusters by −ℓ_c(x) = −log π_c + ½ Σ_d [log 2πσ²_cd + (x_d − μ_cd)² / σ²_cd] (winner = largest ℓ, partners
ranked by mean −ℓ); s_nc = softmax of ℓ over K^(n), F = Σ w log Σ_{K^(n)} exp ℓ. A cluster no row reaches
keeps μ_c and σ²_c, with π_c = 0. What the coreset guarantees for these models: the lightweight coreset
(Bachem, Lucic, Krause, KDD 2018) is an importance sample of the rows, so for any fixed parameters its
weighted log-likelihood is an unbiased estimate of the data's, with a variance falling as 1/N'; its uniform
(ε, k) bound is proved for the k-means cost only. Uniform bounds for mixtures of Gaussians with variances
bounded below (here by reg_covar) are Lucic et al.'s (JMLR 2018), for coresets sampled by their
sensitivity bound, not by this one.
  7. refit_means (ours, ``refit_size``; vc-GMM only): one Lloyd step from the means on a fresh sample of
     2 N' rows, so that the centres returned are not limited by the coreset's ≈ 64 rows per cluster.

Passes over the data: the engine's first pass (the mean, and each chunk's share of the coreset's proposal),
one drawing the coreset and step 7's sample together (``coreset_and_sample``, when both come to the driver),
and the exact QE's: three, however large the data.

Departure from the paper's defaults: its AFK-MC2 approximates non-greedy D² sampling, which
leaves well-separated clusters without a mean (200k × 16, 10 blobs, k = 10: 4 of 10 seeds at 3.1-3.6 × the
k-means QE, m = 2000 no better, exact D² sampling misses in 3 of 10 as well); and with random K^(n) the first
M-step averages rows over random clusters, undoing most of any seeding. With k-means|| and K^(n) from the
nearest seed: 10 of 10 seeds at 1.000 × and -3 % against scikit-learn's Lloyd on blobs200k_d32 at k = 100
(benchmarks/bench_vcgmm_quality.py). ``init="afkmc2"`` gives the paper's pair back.

Where the means live (``means_for``): on the driver while C·D·8 fits ``model-bytes``; above, sharded on the
workers by cluster range (ARCHITECTURE.md, rule 1), the E-step's pair and posterior statistics reduce-scattered to
where each range lives and steps 5-6 run there, so the driver receives O(C·G) per iteration, not O(C·D).
Both give the same bits.

Clamping (documented, not an error): G ← min(G, C) and C' ← min(C', C); with C ≤ G every search space
holds all clusters, i.e. exact EM.
"""

import contextlib
import math
import numbers
import time
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from .. import progress
from .._params import COVARIANCE_TYPES, Boolean, FiniteArray, Interval, NoneOK, Options
from .._random import stream
from ..blocks.coreset import coreset_and_sample, default_size, uniform_sample
from ..blocks.knn import nearest_centre
from ..blocks.lloyd import lloyd_update
from ..blocks.seeding import ROW_BYTES, SEEDERS, seed
from ..engine import ReduceScatter, restored_rows
from ..engine.combine import KeyedSum, Max, Min, Rows, Scatter, Sum
from ..errors import InputError
from ..kernels.assign import Prepared, nearest
from ..kernels.truncated import (
    diagonal_metric,
    draw_distinct,
    pair_statistics,
    posterior_stats,
    select_neighbours,
    truncated_search,
)
from ..loop import FitResult
from .registry import BIG, COUNT, NUMBER, AlgorithmSpec, centres, final_pass, register

# rows per search block: bounds a chunk's search-space and pair buffers to about 40 MB
BLOCK_ROWS = 1 << 16
# σ² never falls below this fraction of the mean feature variance (keeps 1/σ² finite, as reg_covar)
SIGMA2_FLOOR = 1e-10
# the search's metric when its cost is the squared distance
NO_METRIC = (np.empty((0, 0)), np.empty(0))


@dataclass
class VarGMMConfig:
    n_clusters: int = 8
    G: int = 5
    n_truncated: int | None = None
    init: object = "auto"
    chain_length: int = 20
    extra_random: bool = False
    tol: float = 1e-4
    max_iter: int = 300
    n_init_esteps: int = 0
    truncated_init: str = "auto"
    covariance_type: str = "tied-spherical"
    weights: str = "equal"
    reg_covar: float = 1e-6
    weights_init: object = None
    precisions_init: object = None

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "G": [Interval(numbers.Integral, 1, None)],
        "n_truncated": [Interval(numbers.Integral, 1, None), NoneOK()],
        "init": [Options(("auto",) + SEEDERS), FiniteArray()],
        "chain_length": [Interval(numbers.Integral, 1, None)],
        "extra_random": [Boolean()],
        "tol": [Interval(numbers.Real, 0, None, "left")],
        "max_iter": [Interval(numbers.Integral, 1, None)],
        "n_init_esteps": [Interval(numbers.Integral, 0, None)],
        "truncated_init": [Options(("auto", "nearest", "random"))],
        "covariance_type": [Options(COVARIANCE_TYPES)],
        "weights": [Options(("equal", "learned"))],
        "reg_covar": [Interval(numbers.Real, 0, None, "left")],
        "weights_init": [FiniteArray((1,)), NoneOK()],
        "precisions_init": [Interval(numbers.Real, 0, None, "neither"), FiniteArray((1, 2)), NoneOK()],
    }

    docs: ClassVar = {
        "n_clusters": "Number of Gaussian components C.",
        "G": "Size of each cluster's neighbourhood G_c, from which the rows' search spaces are built.",
        "n_truncated": "C', the clusters each row's truncated posterior covers (None: G).",
        "init": "As k-means' init, or 'auto': k-means|| (ℓ = C/2) on the working set while C²·D ≤ 2^32 (its "
        "recluster runs on the driver in O(C²·D·log C)), else 'afkmc2', the paper's seeding (sublinear in N', but "
        "like non-greedy k-means++ it can leave well-separated clusters without a mean).",
        "extra_random": "Add one uniformly random cluster to every row's search space (the paper's variant "
        "that can escape poor neighbourhoods).",
        "tol": "Stop when the free energy changes by less than tol (relative), from the 2nd iteration.",
        "max_iter": "Most EM iterations.",
        "n_init_esteps": "E-steps run before the first M-step to settle the search spaces (paper, Suppl. F).",
        "truncated_init": "How each row's K^(n) starts: 'nearest' = its nearest initial mean plus C'-1 random "
        "clusters (one exact assignment pass over the working set, O(N'·C·D)), 'random' = C' "
        "random clusters, the paper's (the first M-step then averages rows over random "
        "clusters and undoes much of the seeding), 'auto' = 'random' with AFK-MC2 (both "
        "sublinear in C·N'), 'nearest' otherwise.",
        "covariance_type": "'tied-spherical': one σ²I shared by every component (the paper's vc-GMM); "
        "'spherical': σ²_c I per component; 'diag': diag(σ²_c1 … σ²_cD) per component.",
        "weights": "'equal': π_c = 1/C (the paper's); 'learned': π_c = Σ_n w_n s_nc / Σw from each M-step.",
        "reg_covar": "Added to every per-component variance (scikit-learn's meaning), so none collapses onto "
        "a few rows; 'tied-spherical' keeps vc-GMM's σ² (floored at 1e-10 of the mean feature variance).",
        "weights_init": "Initial π (n_clusters,), positive, summing to 1 (weights='learned' only; needs "
        "precisions_init). None: equal.",
        "precisions_init": "Initial 1/σ², as scikit-learn's: a positive float ('tied-spherical'), "
        "(n_clusters,) ('spherical') or (n_clusters, n_features) ('diag'). The first E-step then "
        "ranks clusters by −ℓ with these; None: σ² from the first search (vc-GMM's eq. 8).",
    }


@dataclass
class VCGMMConfig(VarGMMConfig):
    coreset_size: object = "auto"
    refit_size: object = "auto"
    final_objective: object = "exact"

    constraints: ClassVar = {
        **VarGMMConfig.constraints,
        "coreset_size": [Options(("auto",)), Interval(numbers.Integral, 1, None), NoneOK()],
        "refit_size": [Options(("auto",)), Interval(numbers.Integral, 1, None), NoneOK()],
        "final_objective": [Options(("exact", "coreset")), NoneOK()],
    }
    docs: ClassVar = {
        **VarGMMConfig.docs,
        "coreset_size": "Rows N' of the lightweight coreset the EM runs on: 'auto' is the paper's "
        "min(N, max(2^15, 64 C)), None runs on all rows (var-GMM-S).",
        "refit_size": "Rows of the fresh sample (drawn ∝ sample weight) on which one Lloyd step "
        "re-estimates the EM's means (``refit_means``): 'auto' = min(N, 2 N'), all rows "
        "when that is N; None keeps the EM's means, as the paper returns them. Costs "
        "one assignment pass over the sample (O(2 N'·C·D) by the GEMM kernel) and two "
        "light passes over N to draw it; no refit without a coreset, nor for a model other than "
        "the isotropic one with equal weights (a Lloyd step would move its means away from the "
        "variances and weights fitted with them).",
        "final_objective": "What objective_ is: 'exact' = the QE of all N rows (one more pass, "
        "O(N·C·D), the cost of one Lloyd iteration by the same blocked GEMM kernel: "
        "1 M x 32 at C = 1000 about 0.7 s on 2 cores, a quarter of the fit; at "
        "N = 78 M, C = 32,768, D = 3072 more than the whole EM), "
        "'coreset' = the weighted coreset's QE, an unbiased estimate (O(N'·C·D), "
        "no pass over N), None = not computed (objective_ is None).",
    }


# ---------------------------------------------------------------- per-chunk steps


def _init_truncated_sets(chunk, params):
    """State: K^(n) = C' distinct random clusters per row (the paper's init), or its first entry fixed: each
    row's seed from the working set's order (``cells``: rows sorted by nearest seed, so a row's cell follows
    from its position), or, for var-GMM-S's rows, the nearest of ``means`` (one assignment pass)."""
    n_truncated, n_clusters, key, means, cells = params
    n = chunk.n
    first = np.full(n, -1, np.int32)
    if cells is not None:
        starts, seeds = cells
        first = seeds[np.searchsorted(starts, np.arange(chunk.start, chunk.stop), side="right") - 1]
    elif means is not None:
        first = nearest(chunk.x, Prepared(means, chunk.x.dtype))[0]
    K = np.empty((n, n_truncated), np.int32)
    draw_distinct(first, chunk.start, n_clusters, key, K)
    chunk.state["vcgmm"] = {"K": K, "Kd2": np.empty((n, n_truncated)), "winner": np.full(n, -1, np.int32)}


def _buffers(scratch, rows, width):
    """Search-space and pair buffers for ``rows`` rows of ``width`` candidates, kept in the thread's
    ``scratch`` (``Chunk.scratch``) across searches (faulting them in each time costs): a thread searches
    one chunk at a time, so a worker holds threads × ~40 MB of them, not chunks × 40 MB (a copy per chunk
    ran a large input's workers out of memory), and only while the fit's partition lives."""
    m = rows * width
    have = getattr(scratch, "buffers", None)
    if have is None or len(have[0][0]) < rows + 1 or len(have[0][1]) < m:
        r, c = max(rows + 1, len(have[0][0]) if have else 0), max(m, len(have[0][1]) if have else 0)
        have = (
            (np.empty(r, np.int64), np.empty(c, np.int32), np.empty(c)),
            (np.empty(c, np.int64), np.empty(c, np.int32), np.empty(c, np.int64)),
        )
        scratch.buffers = have
    space, pairs = have
    return (space[0][: rows + 1], space[1][:m], space[2][:m]), tuple(p[:m] for p in pairs)


def buffer_bytes(rows, width):
    """What ``_buffers(scratch, rows, width)`` holds: an int64 offset per row, and per candidate an int32 and
    a float64 (the search space), an int64, an int32 and an int64 (the pairs)."""
    return 8 * (rows + 1) + (4 + 8 + 8 + 4 + 8) * rows * width


def _posteriors(x, w, K, Kd2, inv, mu, stats):
    """Adds a block's posterior statistics to stats = [Σ w s x, U, Q, F's data part]; ``inv``: 1/2σ² when the
    costs are squared distances, 1 when they are −ℓ; ``mu``: the means, for Q per dimension, or empty."""
    # K^(n) is sorted, so column 0 is the max-shift; numpy's SIMD exp is 8x numba's scalar one
    e = Kd2[:, :1] - Kd2
    e *= inv
    np.exp(e, out=e)
    stats[3] += posterior_stats(x, w, K, Kd2, e, inv, mu, *stats[:3])


def _row_blocks(n):
    """Slices of at most BLOCK_ROWS rows covering 0..n."""
    rows = max(1, min(n, BLOCK_ROWS))
    return [slice(b0, min(n, b0 + rows)) for b0 in range(0, n, rows)]


def _new_stats(n_clusters, n_features, per_dim):
    q = np.zeros((n_clusters, n_features if per_dim else 1))
    return [np.zeros((n_clusters, n_features)), np.zeros(n_clusters), q, 0.0]


class SearchParams(NamedTuple):
    """What step 4's search (``_estep``) reads: the means (or a ``ShardRef`` to them), G_c, the fit's key for
    the per-row random streams, how many random clusters fill S_n, the posteriors' scale (``_posteriors``;
    None before σ² is known: no posteriors), the pair statistics' grid (``pair_grid``), the costs' metric
    h = 1/2σ² and offset (each an array or a ShardRef; empty: squared distances), whether the M-step's Q is
    per dimension, and what a sharded M-step reads (``MStep``)."""

    mu: object
    Gc: np.ndarray
    key: int
    extra_random: int
    inv: float | None
    grid: tuple
    h: object = NO_METRIC[0]
    offset: object = NO_METRIC[1]
    per_dim: bool = False
    m_step: object = None


def _estep(chunk, params):
    """Step 4's search, step 5's statistics and (when σ² is known) the posteriors' statistics on one chunk,
    in blocks of rows (the search spaces of one block are buffered). Updates K^(n) in place; returns
    (evaluations, Σ w min d², changed winners, the blocks' pair statistics keyed by c_o·C + c~, then the
    posterior statistics when σ² is known), combined by ESTEP (+ STATS)."""
    mu, Gc, key, extra_random, inv, grid, h, offset, per_dim, _ = params
    st = chunk.state["vcgmm"]
    K, Kd2, winner = st["K"], st["Kd2"], st["winner"]
    n, n_clusters = K.shape[0], mu.shape[0]
    space, pairs = _buffers(chunk.scratch, min(n, BLOCK_ROWS), K.shape[1] * Gc.shape[1] + 1)
    stats = None if inv is None else _new_stats(n_clusters, mu.shape[1], per_dim)
    mark = np.full(n_clusters, -1, np.int64)
    evals, minsum, changed, blocks = 0, 0.0, 0, []
    for b in _row_blocks(n):
        e, s, ch = truncated_search(
            chunk.x[b],
            chunk.w[b],
            chunk.start + b.start,
            mu,
            h,
            offset,
            K[b],
            Kd2[b],
            winner[b],
            Gc,
            key,
            extra_random,
            mark,
            *space,
        )
        k = pair_statistics(winner[b], *space, n_clusters, *grid, *pairs)
        blocks.append(tuple(p[:k].copy() for p in pairs))
        if stats is not None:
            _posteriors(chunk.x[b], chunk.w[b], K[b], Kd2[b], inv, mu if per_dim else NO_METRIC[0], stats)
        evals, minsum, changed = evals + e, minsum + s, changed + ch
    found = (
        np.int64(evals),
        minsum,
        np.int64(changed),
        blocks[0] if len(blocks) == 1 else tuple(np.concatenate(f) for f in zip(*blocks)),
    )
    return found if stats is None else found + tuple(stats)


# the search's evaluations, Σ w min cost, changed winners and the pair statistics (each (c_o, c~) once per
# partition up the tree, turned into G_c where they meet, ``_neighbourhoods_at_root``); the posterior
# statistics (Σ w s x, U, Q, F): all exact sums, so any tree of partitions gives the same bits
ESTEP = (Sum(), Sum(), Sum(), KeyedSum())
STATS = (Sum(),) * 4


def _neighbourhoods_at_root(found, params):
    """Step 5 where the E-step's partials meet: the pair statistics (O(distinct pairs)) become G_c (C × G),
    the only part of them the driver receives."""
    Gc = params.Gc.copy()
    update_neighbourhoods(*found[3], Gc)
    return found[:3] + (Gc,) + found[4:]


def _posterior_step(chunk, params):
    """The posteriors' statistics of the first search (σ² was not known when it ran: its costs are squared
    distances), block by block; ``mu``: the means it searched, for Q per dimension, or None."""
    inv, n_clusters, mu = params[:3]
    st = chunk.state["vcgmm"]
    stats = _new_stats(n_clusters, chunk.x.shape[1], mu is not None)
    mu = NO_METRIC[0] if mu is None else mu
    for b in _row_blocks(st["K"].shape[0]):
        _posteriors(chunk.x[b], chunk.w[b], st["K"][b], st["Kd2"][b], inv, mu, stats)
    return tuple(stats)


# ---------------------------------------------------------------- driver

# init="auto" seeds with k-means|| while C²·D stays under this (its weighted recluster of ≈ 5ℓ candidates
# runs on the driver in O(C²·D)), with AFK-MC2 above
AUTO_KMEANS_PARALLEL_MAX = 2**32
# k-means|| on the working set samples ℓ = OVERSAMPLING·C candidates a round (Bahmani et al. find ℓ from k/2
# to 2k alike once the candidates are reclustered). Its rounds and its recluster both cost in proportion to
# the candidates, O(N'·ℓ·D) and O(ℓ·C·D) per round, i.e. O(C²) with N' = 64 C. With ℓ = C/2 (Lloyd's
# k-means|| takes 2C) blobs 1M x 32 seed in 3.7 s where ℓ = C took 10.7 s at C = 4096 (1.0 s against 2.2 s
# at C = 2000), the refitted QE within 0.1 % of ℓ = C's, and 10 of 10 separated-blob seeds are still found
# (benchmarks/bench_vcgmm_quality.py)
OVERSAMPLING = 0.5


def seeding_method(cfg, n_features):
    """The seeder ``init`` names ("auto" resolved as the config's docs say), or the given array."""
    if isinstance(cfg.init, str) and cfg.init == "auto":
        return "k-means||" if cfg.n_clusters**2 * n_features <= AUTO_KMEANS_PARALLEL_MAX else "afkmc2"
    return cfg.init


def truncated_init(cfg, seeder):
    """How K^(n) starts ("auto" resolved: the paper's random sets after AFK-MC2, the nearest mean otherwise)."""
    if cfg.truncated_init != "auto":
        return cfg.truncated_init
    return "random" if isinstance(seeder, str) and seeder == "afkmc2" else "nearest"


def init_neighbourhoods(n_clusters, G, key):
    """G_c = {c} + G−1 distinct random other clusters (c in slot 0)."""
    Gc = np.empty((n_clusters, G), np.int32)
    draw_distinct(np.arange(n_clusters, dtype=np.int32), 0, n_clusters, key, Gc)
    return Gc


def row_fields(n_clusters, n_truncated, signed=False):
    """The per-row state a checkpoint holds, as ``restored_rows`` checks it: K^(n) (cluster indices), their
    costs (squared distances; −ℓ, of either sign, when ``signed``) and the last winner (-1 before the first
    search)."""
    return {
        "K": ("int32", (n_truncated,), 0, n_clusters),
        "Kd2": ("float64", (n_truncated,), -math.inf if signed else 0.0, math.inf),
        "winner": ("int32", (), -1, n_clusters),
    }


def pair_grid(engine, metric_range=None):
    """(1/unit, low, cap) of the pair statistics (``pair_statistics``): each cost enters as min(cost − low, cap)
    and is summed as an integer count of the unit, a power of two such that a pair's sum over all rows is
    < 2^62. A squared distance is at most D·(2 max|x| + 1)² (the means stay in the rows' bounding box): low 0,
    no cap. The cost −ℓ, with ``metric_range`` = (max h, least and largest finite offset), lies in [least,
    largest + max h·D·(2 max|x| + 1)²]; a cluster of weight 0 (offset +∞) is capped at that bound."""
    s = engine.summary
    spread = (2.0 * float(s.max_abs) + 1.0) ** 2
    if metric_range is None:
        low, cap = 0.0, math.inf
        bound = engine.n_samples * engine.n_features * spread
    else:
        h_max, low, high = (float(v) for v in metric_range)
        cap = (high - low) + h_max * engine.n_features * spread
        bound = engine.n_samples * cap
    return math.ldexp(1.0, 62 - math.ceil(math.log2(max(1.0, bound)))), low, cap


def update_neighbourhoods(keys, count, dsum, Gc, lo=0, n_clusters=None):
    """Step 5 from the summed pair statistics, sorted by key c_o·C + c~ (so grouped by winner), for the
    clusters lo .. lo + len(Gc): all C of them, or one shard (then ``n_clusters`` = C)."""
    C = n_clusters or Gc.shape[0]
    start = np.searchsorted(keys, (lo + np.arange(Gc.shape[0] + 1, dtype=np.int64)) * C)
    select_neighbours(start[None, :], keys, lo, count, dsum, Gc, C)


def m_step(mu, sums, U, Q):
    """μ_c = Σ w s x / U_c (kept when U_c = 0: no re-seeding) and each cluster's part of σ² in one pass:
    with Q_c = Σ w s ||x − μ_c^old||² (a column), Σ w s ||x − μ_c^new||² = Q_c − U_c ||μ_c^new − μ_c^old||².
    Row-wise, so the clusters of a shard give the bits of the whole."""
    new = mu.copy()
    won = U > 0
    new[won] = sums[won] / U[won, None]
    shift = ((new - mu) ** 2).sum(axis=1)
    return new, np.maximum(Q[:, 0] - U * shift, 0.0)


def isotropic(cfg):
    """Whether a config (or a ``Family``) asks for vc-GMM's own model: one σ² and equal weights."""
    return (cfg.covariance_type, cfg.weights) == ("tied-spherical", "equal")


class Family(NamedTuple):
    """The mixture a fit learns (``VarGMMConfig``), and the floor of its variances."""

    covariance_type: str
    weights: str
    reg_covar: float
    floor: float

    @property
    def isotropic(self):
        """vc-GMM's own model (one σ², equal weights): its searches rank clusters by squared distance."""
        return isotropic(self)


def mixture_m_step(family, mu, var, weights, sums, U, Q, total_weight):
    """Step 6 of the other models, row-wise (a shard's clusters give the bits of the whole): μ_c as ``m_step``;
    σ²_cd = Σ w s (x_d − μ_cd)² / U_c + reg_covar, from Q_cd = Σ w s (x_d − μ^old_cd)² as Q − U (μ^new −
    μ^old)² (no cancellation), "spherical": the mean over d, "tied-spherical": left to ``new_sigma2``;
    π_c = U_c / Σw ("learned"). A cluster no row reaches (U_c = 0) keeps μ_c and σ²_c and gets π_c = 0, so
    the weights still sum to 1. Returns μ, σ² (C, D), π and each cluster's Σ_d residual."""
    won = U > 0
    new = mu.copy()
    new[won] = sums[won] / U[won, None]
    resid = np.maximum(Q - U[:, None] * (new - mu) ** 2, 0.0)
    var = var.copy()
    if family.covariance_type == "diag":
        var[won] = resid[won] / U[won, None] + family.reg_covar
    elif family.covariance_type == "spherical":
        var[won] = (resid[won].mean(axis=1) / U[won] + family.reg_covar)[:, None]
    np.maximum(var, family.floor, out=var)
    if family.weights == "learned":
        weights = U / total_weight
    return new, var, weights, resid.sum(axis=1)


def metric_range(h, offset):
    """(max h, least and largest finite offset): what ``pair_grid`` bounds the costs with (a shard's part;
    Max, Min, Max combine them)."""
    finite = offset[np.isfinite(offset)]
    return np.max(h, initial=0.0), np.min(finite, initial=np.inf), np.max(finite, initial=-np.inf)


def new_sigma2(resid, n_features, total_weight, floor):
    """σ² = Σ_c resid_c / (D Σw), floored."""
    return max(resid.sum() / (n_features * total_weight), floor)


def free_energy(data_f, sigma2, total_weight, n_features, n_clusters):
    """F = Σ w logsumexp_{K^(n)}(−d²/2σ²) − Σw (D/2) log(2πσ²) − Σw log C."""
    return data_f - total_weight * (0.5 * n_features * math.log(2 * math.pi * sigma2) + math.log(n_clusters))


class MStep(NamedTuple):
    """What a sharded M-step reads besides its statistics: the family, Σw, C, and σ² of the isotropic model
    the first search used (``first``: the per-cluster model starts from it)."""

    family: Family
    total_weight: float
    n_clusters: int
    sigma2: float | None
    first: bool


class PosteriorParams(NamedTuple):
    """What ``_posterior_step`` reads: 1/2σ², C, the means (for Q per dimension; None: not needed), and
    what the sharded M-step after it reads."""

    inv: float
    n_clusters: int
    mu: object
    m_step: MStep | None = None


class DriverMeans:
    """The model on the driver (C·D within ``model-bytes``): the E-step's statistics come to the driver
    finished, G_c selected where they meet (``_neighbourhoods_at_root``). Per iteration the driver receives
    Σ w s x (C·D·8 bytes), U (C·8), Q (C·8; C·D·8 for the per-cluster models) and G_c (C·G·4)."""

    def __init__(self, engine, mu, family, mixture=None):
        self.engine, self.mu, self.family, self.grid = engine, mu, family, pair_grid(engine)
        self.total_weight = engine.summary.total_weight
        self.var = self.weights = None  # the other models' σ² (C, D) and π, from their first M-step on
        self.metric = NO_METRIC
        if mixture is not None:
            self.var, self.weights = mixture
            self._set_metric()

    @property
    def scaled(self):
        """Whether the next search ranks by −ℓ (the other models after their first M-step), not d²."""
        return self.var is not None

    def search(self, Gc, key, extra_random, sigma2):
        """Step 4 (+ its posteriors when σ² is known), step 5, and step 6 when σ² is known: (evaluations,
        Σ w min cost, changed winners, G_c, the M-step's (F's data part, residuals, active clusters) or None)."""
        inv = None if sigma2 is None else 1.0 if self.scaled else 0.5 / sigma2
        params = SearchParams(self.mu, Gc, key, extra_random, inv, self.grid, *self.metric, not self.family.isotropic)
        combine = ESTEP if inv is None else ESTEP + STATS
        e, minsum, changed, Gc, *stats = self.engine.reduce(_estep, params, combine, _neighbourhoods_at_root)
        return e, minsum, changed, Gc, self._m_step(sigma2, *stats) if stats else None

    def posteriors(self, sigma2):
        """Step 6 after the first search (σ² was not known when it ran)."""
        params = PosteriorParams(0.5 / sigma2, self.mu.shape[0], None if self.family.isotropic else self.mu)
        return self._m_step(sigma2, *self.engine.reduce(_posterior_step, params, STATS))

    def _m_step(self, sigma2, sums, U, Q, data_f):
        if self.family.isotropic:
            self.mu, resid = m_step(self.mu, sums, U, Q)
        else:
            if self.var is None:  # the first M-step starts from the isotropic model the first search used
                self.var, self.weights = np.full(self.mu.shape, sigma2), np.full(len(U), 1.0 / len(U))
            self.mu, self.var, self.weights, resid = mixture_m_step(
                self.family, self.mu, self.var, self.weights, sums, U, Q, self.total_weight
            )
            self._set_metric()
        return float(data_f), resid, int(np.count_nonzero(U > 0))

    def set_tied(self, sigma2):
        """The shared σ² of "tied-spherical" with learned weights, once every cluster's residual is in."""
        self.var[:] = sigma2
        self._set_metric()

    def _set_metric(self):
        self.metric = diagonal_metric(self.var, self.weights)
        self.grid = pair_grid(self.engine, metric_range(*self.metric))

    def means(self):
        return self.mu

    def mixture(self):
        """σ² (C, D) and π, as the last M-step left them (the other models)."""
        return self.var, self.weights

    def result(self):
        """The final means on the driver."""
        return self.mu


class ShardedMeans:
    """The model sharded on the workers by cluster range (C·D over ``model-bytes``, ARCHITECTURE.md rule 1):
    the means (and the other models' σ², π, h and offset); the pair and posterior statistics are
    reduce-scattered by cluster, and G_c and the M-step run where each range lives; every partition reads
    the whole means (and metric, ``model.ref()``) for its search. Per iteration the driver receives G_c
    (C·G·4 bytes), each cluster's residual (C·8) and a few scalars, never C·D."""

    def __init__(self, engine, model, n_clusters, family, scaled=False):
        self.engine, self.model, self.n_clusters, self.family = engine, model, n_clusters, family
        self.total_weight, self.scaled, self.grid = engine.summary.total_weight, scaled, pair_grid(engine)
        pairs = Scatter(KeyedSum(rows=n_clusters))
        self.estep = ESTEP[:3] + (pairs,)
        self.stats = (Scatter(), Scatter(), Scatter(), Sum())
        self.small = (Rows(), Sum()) + (() if family.isotropic else RANGE)

    def _m_step_params(self, sigma2):
        return MStep(self.family, self.total_weight, self.n_clusters, sigma2, not self.scaled)

    def search(self, Gc, key, extra_random, sigma2):
        inv = None if sigma2 is None else 1.0 if self.scaled else 0.5 / sigma2
        metric = (self.model.ref(3), self.model.ref(4)) if self.scaled else NO_METRIC
        per_dim = not self.family.isotropic
        params = SearchParams(
            self.model.ref(), Gc, key, extra_random, inv, self.grid, *metric, per_dim, self._m_step_params(sigma2)
        )
        if inv is None:
            e, minsum, changed, Gc = self.engine.reduce(
                _estep, params, self.estep, scatter=ReduceScatter(self.model, _shard_neighbourhoods, (Rows(),))
            )
            return e, minsum, changed, Gc, None
        e, minsum, changed, data_f, Gc, *small = self.engine.reduce(
            _estep,
            params,
            self.estep + self.stats,
            scatter=ReduceScatter(self.model, _shard_update, (Rows(),) + self.small),
        )
        return e, minsum, changed, Gc, self._updated(data_f, small)

    def posteriors(self, sigma2):
        mu = None if self.family.isotropic else self.model.ref()
        params = PosteriorParams(0.5 / sigma2, self.n_clusters, mu, self._m_step_params(sigma2))
        data_f, *small = self.engine.reduce(
            _posterior_step, params, self.stats, scatter=ReduceScatter(self.model, _shard_m_step, self.small)
        )
        return self._updated(data_f, small)

    def _updated(self, data_f, small):
        if not self.family.isotropic:
            self.scaled, self.grid = True, pair_grid(self.engine, small[2:])
        return float(data_f), small[0], int(small[1])

    def set_tied(self, sigma2):
        self.grid = pair_grid(self.engine, self.model.apply(_shard_set_tied, sigma2, RANGE))

    def means(self):
        return None

    def mixture(self):
        return self.model.gather(1), self.model.gather(2)

    def result(self):
        return self.model.gather()


# how the shards' ranges of the metric combine (``metric_range``)
RANGE = (Max(), Min(), Max())


def _shard_neighbourhoods(fields, shard, params, lo):
    """Step 5 where clusters lo.. live: their rows of G_c from their pair statistics."""
    Gc = params.Gc[lo : lo + len(shard[0])].copy()
    update_neighbourhoods(*fields[0], Gc, lo, len(params.Gc))
    return shard, (Gc,)


def _shard_m_step(fields, shard, params, lo):
    """Step 6 where clusters lo.. live: their new means (the other models: σ², π, and the metric, whose range
    goes up); their residuals and active count go up."""
    sums, U, Q = fields[-3:]
    won = np.int64(np.count_nonzero(U > 0))
    ms = params.m_step
    if ms.family.isotropic:
        mu, resid = m_step(shard[0], sums, U, Q)
        return (mu,), (resid, won)
    mu, var, weights = shard[:3]
    if ms.first:
        var, weights = np.full(mu.shape, ms.sigma2), np.full(len(U), 1.0 / ms.n_clusters)
    mu, var, weights, resid = mixture_m_step(ms.family, mu, var, weights, sums, U, Q, ms.total_weight)
    h, offset = diagonal_metric(var, weights)
    return (mu, var, weights, h, offset), (resid, won, *metric_range(h, offset))


def _shard_update(fields, shard, params, lo):
    """Steps 5 and 6 where clusters lo.. live (σ² known: the search's posteriors came with it)."""
    _, (Gc,) = _shard_neighbourhoods(fields, shard, params, lo)
    shard, small = _shard_m_step(fields, shard, params, lo)
    return shard, (Gc,) + small


def _shard_set_tied(shard, sigma2, lo):
    """The shared σ² where clusters lo.. live, and their metric."""
    mu, var, weights = shard[:3]
    var = np.full(mu.shape, sigma2)
    h, offset = diagonal_metric(var, weights)
    return (mu, var, weights, h, offset), metric_range(h, offset)


@contextlib.contextmanager
def means_for(engine, mu, family, mixture=None):
    """Where the model lives during the EM: on the driver, or sharded on the workers when its C·D·8 bytes
    (three times that for the other models: μ, σ², h) are over ``model-bytes``. ``mixture``: a resumed fit's
    σ² and π."""
    if not engine.shards_model(mu.nbytes * (1 if family.isotropic else 3)):
        yield DriverMeans(engine, mu, family, mixture)
        return
    C = mu.shape[0]
    arrays = (mu,)
    if not family.isotropic:  # σ² and h take their width at the first M-step
        var, weights = mixture or (np.empty((C, 0)), np.full(C, 1.0 / C))
        arrays = (mu, var, weights, *(diagonal_metric(var, weights) if mixture else (np.empty((C, 0)), np.zeros(C))))
    with engine.sharded("vcgmm", arrays) as model:
        yield ShardedMeans(engine, model, C, family, scaled=mixture is not None)


def truncated_em(engine, mu, cfg, entropy, loop, phases, sets="random", cells=None):
    """Steps 3-6 on ``engine`` (the coreset or all rows) from the means ``mu``; ``sets``: how K^(n) starts
    (``truncated_init``), ``cells``: the engine's rows sorted by nearest seed (``by_nearest_seed``). Returns
    the means, σ², F, the distance evaluations, and the other models' σ² (C, D) and π (None for vc-GMM's)."""
    C, D = mu.shape
    G = min(cfg.G, C)
    Cp = min(cfg.n_truncated or cfg.G, C)
    total_w = engine.summary.total_weight
    floor = SIGMA2_FLOOR * float(np.mean(engine.summary.var))
    family = Family(cfg.covariance_type, cfg.weights, float(cfg.reg_covar), floor)
    tied = family.covariance_type == "tied-spherical"
    Gc = init_neighbourhoods(C, G, kernel_key(entropy, "G"))
    key_K = kernel_key(entropy, "K")
    t0, cpu0 = time.perf_counter(), time.process_time()
    evals, sigma2, prev_f, f, mixture = 0, None, None, None, None
    restored = loop.restored
    if restored is not None:  # a resumed fit: K^(n) from the checkpoint's rows, the rest from its state
        Gc, sigma2, f, evals = restored["Gc"], restored["sigma2"], restored["f"], restored["evals"]
        prev_f = f
        if not family.isotropic:
            mixture = (restored["var"], restored["weights"])
    elif cfg.precisions_init is not None:  # the first search ranks by the given model, with its posteriors
        mixture = initial_mixture(cfg, D)
        sigma2 = mixture if family.isotropic else float(np.mean(mixture[0]))
        mixture = None if family.isotropic else mixture

    # K^(n) depends on every E-step before: a rebuilt partition takes it from its buddy's copy (backup), or,
    # where that copy is lost too, from the nearest seed (``cells``) or the nearest mean (the driver's; the
    # seeds when the means are sharded) plus random others
    def nearest_to():
        if sets != "nearest" or cells is not None:
            return None
        return mu if means.means() is None else means.means()

    builder, model = _init_truncated_sets, lambda: (Cp, C, key_K, nearest_to(), cells)
    if restored is not None:
        fields = row_fields(C, Cp, signed=not family.isotropic)
        builder, model = restored_rows, lambda: (loop.restored_rows, "vcgmm", fields)
    with (
        means_for(engine, mu, family, mixture) as means,
        engine.state("vcgmm", builder, model, backup=("K", "Kd2", "winner")),
    ):
        for i in range(cfg.n_init_esteps if restored is None else 0):  # Suppl. F: optimise K^(n) and G_c
            e, _, _, Gc, _ = means.search(Gc, kernel_key(entropy, "init", i), cfg.extra_random, None)
            evals += e
        for it in loop:
            scaled = means.scaled
            e, minsum, changed, Gc, update = means.search(
                Gc, kernel_key(entropy, "estep", it), cfg.extra_random, sigma2
            )
            if sigma2 is None:  # eq. 8: σ² from the first search, before any posterior
                sigma2 = max(minsum / (D * total_w), floor)
                update = means.posteriors(sigma2)
            data_f, resid, active = update
            f = data_f if scaled else free_energy(data_f, sigma2, total_w, D, C)
            used = sigma2
            if tied:
                sigma2 = new_sigma2(resid, D, total_w, floor)
                if not family.isotropic:
                    means.set_tied(sigma2)
            evals += e
            extras = {"sigma2": used} if tied else {}
            loop.record(f, e, changed, centers=means.means(), **extras, active_clusters=active)
            if prev_f is not None and abs(f - prev_f) < cfg.tol * abs(f):
                loop.converged = True
            prev_f = f
            loop.save(
                lambda: {
                    "mu": means.result(),
                    "Gc": Gc,
                    "sigma2": sigma2,
                    "f": f,
                    "evals": int(evals),
                    **({} if family.isotropic else dict(zip(("var", "weights"), means.mixture()))),
                },
                rows=lambda directory: engine.dump_rows(directory, "vcgmm"),
            )
        mu = means.result()
        mixture = None if family.isotropic else means.mixture()
    phases["em"] = time.perf_counter() - t0
    phases["em_cpu"] = time.process_time() - cpu0  # this process's CPU: the EM's when it runs in-process
    return mu, sigma2, f, evals, mixture


@contextlib.contextmanager
def by_nearest_seed(work, seeds, sets, phases):
    """The working set with its rows sorted by nearest seed (``engine.reorder``), and its cells (the first
    row of each seed's rows, the seeds) from which each row's first K^(n) entry follows: the E-step's rows
    then meet the clusters they share (means, G_c, the pair statistics of a winner) one after another,
    not at random, and the sort's key pass is the only assignment pass (``truncated_init="nearest"``).
    Other inits: the rows as they are, no cells."""
    if sets != "nearest":
        yield work, None
        return
    t = time.perf_counter()
    with work.reorder(nearest_centre, (seeds, False)) as rows:
        keys, totals = rows.key_totals
        phases["reorder"] = time.perf_counter() - t
        yield rows, (np.concatenate([[0], np.cumsum(totals)]).astype(np.int64), keys.astype(np.int32))


def refit_size(cfg, n_samples, coreset):
    """The rows ``refit_means`` samples (``VCGMMConfig.refit_size``), or None: no refit (no coreset, or a
    model other than the isotropic one with equal weights: a Lloyd step would move its means away from the
    variances and weights fitted with them)."""
    size = getattr(cfg, "refit_size", None)
    if coreset is None or size is None or not isotropic(cfg):
        return None
    return min(n_samples, 2 * coreset if size == "auto" else size)


def refit_means(engine, mu, size, entropy, drawn=None):
    """Step 7: one Lloyd step from the EM's means on ``size`` fresh rows drawn ∝ w (all rows when ``size`` is
    N). Each mean comes from ≈ N'/C coreset rows (64 by default), importance-weighted, so it carries their
    sampling noise: blobs 1 M × 32, C = 2000, the EM's means end 3.5 % above faiss's QE; re-estimated from
    2 N' uniform rows, 1.5 % (one step on all N rows: 0.0 %). A cluster no sampled row chooses keeps its mean.
    ``drawn``: those rows, drawn with the coreset in its pass (``coreset_and_sample``)."""
    with progress.phase(f"refit on {size:,} rows", 1, "pass") as shown:
        if size >= engine.n_samples:
            new, evals = lloyd_update(engine, mu)
        else:
            with uniform_sample(engine, size, entropy, drawn) as rows:
                new, evals = lloyd_update(rows, mu)
        shown.update()
    return new, evals


def final_objective(engine, work, mu, kind):
    """objective_ and its distance evaluations: the exact QE over all rows, the working set's weighted QE,
    or nothing (``VCGMMConfig.final_objective``)."""
    if kind is None:
        return None, 0
    return final_pass(engine, mu) if kind == "exact" else final_pass(work, mu, "the coreset")


def check_data(cfg, source):
    """The initial mixture (``weights_init``, ``precisions_init``) against C, D and the model, before an
    engine opens."""
    C, D = cfg.n_clusters, source.n_features
    if cfg.weights_init is not None:
        w = np.asarray(cfg.weights_init, np.float64)
        if cfg.weights != "learned":
            raise InputError("weights_init is given, but weights='equal' keeps π_c = 1/C: set weights='learned'")
        if cfg.precisions_init is None:
            raise InputError(
                "weights_init needs precisions_init: the first E-step ranks clusters by π_c N(x; μ_c, Σ_c)"
            )
        if w.shape != (C,):
            raise InputError(f"weights_init has shape {w.shape}; expected (n_clusters,) = ({C},)")
        if (w <= 0).any() or abs(w.sum() - 1.0) > 1e-6:  # a weight of 0 gives its component no row, ever
            raise InputError(f"weights_init must be positive and sum to 1; got sum {w.sum():.9g}, min {w.min():.3g}")
    if cfg.precisions_init is not None:
        p = np.asarray(cfg.precisions_init, np.float64)
        want = {"tied-spherical": (), "spherical": (C,), "diag": (C, D)}[cfg.covariance_type]
        if p.shape != want:
            raise InputError(
                f"precisions_init has shape {p.shape}; covariance_type={cfg.covariance_type!r} takes shape {want}"
            )
        if not (p > 0).all():
            raise InputError("precisions_init must be positive")


def initial_mixture(cfg, n_features):
    """σ² (a float, for the isotropic model) or the other models' (σ² (C, D), π) from ``precisions_init`` and
    ``weights_init``; None: σ² from the first search."""
    if cfg.precisions_init is None:
        return None
    C = cfg.n_clusters
    var = 1.0 / np.asarray(cfg.precisions_init, np.float64)
    if isotropic(cfg):
        return float(var)
    weights = np.full(C, 1.0 / C) if cfg.weights_init is None else np.asarray(cfg.weights_init, np.float64)
    return np.broadcast_to(
        var.reshape(var.shape + (1,) * (2 - var.ndim)), (C, n_features)
    ).copy(), weights / weights.sum()


def kernel_key(entropy, *tag):
    """The seed of the kernels' row-keyed stream (``kernels.streams``) for ``tag`` ("K": K^(n), "G": G_c)."""
    return int(stream(entropy, "vcgmm", *tag).integers(2**63))


def _check(engine):
    if engine.n_samples == 1:
        raise InputError("a Gaussian mixture needs more than one row; got n_samples=1")
    if not float(np.max(engine.summary.var)) > 0:
        raise InputError(
            "all rows are identical (zero variance): a Gaussian mixture cannot be fitted; use algo='kmeans'"
        )


def fit(engine, cfg, entropy, loop):
    """Coreset (vc-GMM only), seeding, truncated EM, then one exact QE pass over all rows."""
    size = getattr(cfg, "coreset_size", None)
    if size == "auto":
        size = default_size(engine.n_samples, cfg.n_clusters)
    _check(engine)
    phases = {}
    refit = refit_size(cfg, engine.n_samples, size)
    aside = refit if refit and refit < engine.n_samples else None  # drawn with the coreset, in its pass
    with coreset_and_sample(engine, size, aside, entropy, cfg.n_clusters, phases) as (work, drawn):
        t = time.perf_counter()
        seeder = seeding_method(cfg, engine.n_features)
        if loop.restored is None:
            seeds, seed_evals = seed(
                work, cfg.n_clusters, seeder, entropy, chain_length=cfg.chain_length, oversampling_factor=OVERSAMPLING
            )
            mu = seeds
        else:  # a resumed fit: the means come from the checkpoint, the seeds order the rows as before
            mu, seeds, seed_evals = loop.restored["mu"], loop.restored["seeds"], loop.restored["seed_evals"]
        loop.keep(seed_evals=int(seed_evals), seeds=seeds)
        phases["seeding"] = time.perf_counter() - t
        sets = truncated_init(cfg, seeder)
        # vc-GMM's coreset is sorted by nearest seed; var-GMM-S's rows (all of them, perhaps streamed) stay put
        with by_nearest_seed(work, seeds, sets if size is not None else "random", phases) as (rows, cells):
            mu, sigma2, f, em_evals, mixture = truncated_em(rows, mu, cfg, entropy, loop, phases, sets, cells)
        if sets == "nearest":  # the assignment pass over the working set: the sort's key or the builder's
            seed_evals += work.n_samples * cfg.n_clusters
        t = time.perf_counter()
        mu, refit_evals = refit_means(engine, mu, refit, entropy, drawn) if refit else (mu, 0)
        phases["refit"] = time.perf_counter() - t
        t = time.perf_counter()
        qe, qe_evals = final_objective(engine, work, mu, getattr(cfg, "final_objective", "exact"))
        phases["final_qe"] = time.perf_counter() - t
    extras = {
        **mixture_extras(cfg, mixture, f, work.summary.total_weight),
        "sigma2_": float(sigma2),
        "free_energy_": float(f),
        "coreset_size_": size,
        "G_": min(cfg.G, cfg.n_clusters),
        "init_": seeder if isinstance(seeder, str) else "array",
        "truncated_init_": sets,
        "n_truncated_": min(cfg.n_truncated or cfg.G, cfg.n_clusters),
        "refit_size_": refit,
        "phase_s": phases,
        "seeding_distance_evals": int(seed_evals),
        "em_distance_evals": int(em_evals),
        "refit_distance_evals": int(refit_evals),
        "final_qe_distance_evals": int(qe_evals),
    }
    return FitResult(
        mu, qe, loop.n_iter, loop.converged, int(seed_evals + em_evals + refit_evals + qe_evals), loop.history, extras
    )


# what the model's predict_proba reads: σ² and C'
MODEL_EXTRAS = (
    ("sigma2_", lambda v, k: type(v) in (int, float) and math.isfinite(v) and v > 0, "a positive finite number"),
    ("n_truncated_", lambda v, k: type(v) is int and 1 <= v <= k, "an int in [1, n_clusters]"),
)


def mixture_extras(cfg, mixture, f, total_weight):
    """The other models' fitted attributes (a ``MixtureModel``'s): the covariance type, π (C,), σ² (C, D) and
    the free energy per unit of weight; none for vc-GMM's."""
    if mixture is None:
        return {}
    var, weights = mixture
    return {
        "covariance_type_": cfg.covariance_type,
        "weights_": weights,
        "variances_": var,
        "lower_bound_": float(f) / total_weight,
    }


def saved(cfg, n_samples, n_features):
    """What a vc-GMM or var-GMM-S checkpoint holds besides K^(n)'s files: the means, G_c (cluster indices
    a kernel reads), σ², F and the seeds that order the coreset; the other models' σ² (C, D) and π."""
    k = cfg.n_clusters
    mixture = {}
    if not isotropic(cfg):
        mixture = {"var": ("floats", (k, n_features)), "weights": ("floats", (k,))}
    return {
        **mixture,
        "mu": centres(cfg, n_features),
        "Gc": ("ints", (k, min(cfg.G, k)), 0, k),
        "sigma2": ("float", 5e-324, BIG, False),
        "f": NUMBER,
        "evals": COUNT,
        "seeds": centres(cfg, n_features),
        "seed_evals": COUNT,
    }


register(
    AlgorithmSpec(
        name="vcgmm",
        config=VCGMMConfig,
        fit=fit,
        estimator="VCGMM",
        summary="vc-GMM: truncated variational EM for an isotropic GMM on a lightweight coreset "
        "(k-means|| or AFK-MC2 seeding)",
        reference="Hirschberger, Forster, Lücke, TPAMI 2022, doi:10.1109/TPAMI.2021.3133763",
        objective="the free energy F of the truncated posteriors on the coreset (higher is better)",
        probabilistic=True,
        resumable=True,
        saved=saved,
        model_extras=MODEL_EXTRAS,
        check_data=check_data,
    )
)

register(
    AlgorithmSpec(
        name="vargmm",
        config=VarGMMConfig,
        fit=fit,
        estimator="VarGMM",
        summary="var-GMM-S: vc-GMM's truncated variational EM on all rows (weight 1), the paper's baseline",
        reference="Forster, Lücke, AISTATS 2018; Hirschberger, Forster, Lücke, TPAMI 2022",
        objective="the free energy F of the truncated posteriors on all rows (higher is better)",
        # K^(n) (int32) and its squared distances (float64) for C' clusters, and the winner (int32); the search
        # buffers are per thread (``_buffers``), for blocks of up to BLOCK_ROWS rows of C'·G + 1 candidates
        state_bytes=lambda cfg: max(ROW_BYTES, 12 * (cfg.n_truncated or cfg.G) + 4),
        thread_bytes=lambda cfg: buffer_bytes(BLOCK_ROWS, (cfg.n_truncated or cfg.G) * cfg.G + 1),
        probabilistic=True,
        resumable=True,
        saved=saved,
        model_extras=MODEL_EXTRAS,
        check_data=check_data,
    )
)
