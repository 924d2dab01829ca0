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

The steps' code: 1 and 7 here; 3-6 in ``blocks/truncated_estep.py`` (per chunk: K^(n), the search, the
statistics) and ``blocks/truncated_em.py`` (the M-step, where the model lives, the loop); what differs between
covariance types in ``blocks/gaussian.py``.

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
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from .. import progress
from .._params import COVARIANCE_TYPES, Boolean, FiniteArray, Interval, NoneOK, Options
from ..blocks.coreset import coreset_and_sample, default_size, uniform_sample
from ..blocks.gaussian import check_precisions_init, covariance
from ..blocks.knn import nearest_centre
from ..blocks.lloyd import lloyd_update
from ..blocks.mixture_start import STARTS, mixture_start
from ..blocks.seeding import ROW_BYTES, SEEDERS, seed
from ..blocks.truncated_em import family_of, isotropic, truncated_em
from ..blocks.truncated_estep import BLOCK_ROWS, buffer_bytes
from ..errors import InputError
from ..loop import FitResult, Loop
from .registry import BIG, COUNT, NUMBER, AlgorithmSpec, centres, final_pass, register


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
        "init": [Options(("auto",) + SEEDERS + STARTS), FiniteArray()],
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
        "like non-greedy k-means++ it can leave well-separated clusters without a mean). Or a whole mixture as "
        "scikit-learn's GaussianMixture starts: 'kmeans' (one M-step from the rows' nearest k-means centres, "
        "k-means|| then Lloyd on the working set) or 'random-responsibilities' (its init_params='random': one "
        "M-step from uniform random responsibilities); ``blocks/mixture_start.py``.",
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
    refine: bool = False

    constraints: ClassVar = {
        **VarGMMConfig.constraints,
        "refine": [Boolean()],
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
        "refine": "After the EM on the coreset, the same truncated EM on every row, started from the "
        "coreset's mixture (its means, variances and weights: a var-GMM-S fit given them, ``refine_on_all_rows``) "
        "until the free energy of all rows stops moving: one pass over the data per iteration. The "
        "coreset's ≈ 64 rows per component estimate 2·D parameters each loosely: on diagonal mixtures of "
        "250k rows (C = 16 to 256, D = 16 and 32, 3 seeds) the refined held-out log-likelihood per row was "
        "0.01 to 0.30 nats higher on average (the worst seed 0.28 higher at C = 256), at about a third of the "
        "coreset-only fit's speed (BENCHMARKS.md, benchmarks/bench_mixtures.py --parts parity). Replaces step "
        "7's refit; no effect without a coreset. GaussianMixture's default.",
    }


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


def given_mixture(cfg, mu, var, weights):
    """``cfg`` with the mixture (means, σ² (C, D), weights or None) as its given start (``init``,
    ``precisions_init`` in scikit-learn's shape, exactly 1/σ², and ``weights_init``)."""
    precisions = 1.0 / np.asarray(covariance(cfg.covariance_type).covariances(var))
    return replace(cfg, init=mu, precisions_init=precisions, weights_init=weights)


def refine_on_all_rows(engine, cfg, mu, sigma2, mixture, entropy, loop, phases):
    """``VCGMMConfig.refine``: steps 3-6 on every row of ``engine``, from the coreset's mixture, exactly as a
    var-GMM-S fit given it (``means_init``, ``weights_init``, ``precisions_init``) runs them: K^(n) from the
    nearest mean, then the searches rank by −ℓ. The iterations continue the fit's history (a loop of their own
    that starts where the coreset's ended, with ``max_iter`` more). Not checkpointed: a fit resumed from its
    coreset checkpoint refines again, to the same bits. Returns (μ, σ², F, evaluations, the other models' σ²
    and π, the loop)."""
    if mixture is None:  # vc-GMM's own model: one σ², equal weights
        mixture = (np.full(mu.shape, sigma2), None)
    start = given_mixture(cfg, mu, *mixture)
    rows = Loop("refine on all rows", loop.n_iter + cfg.max_iter, callback=loop.callback, progress=True)
    rows.history = list(loop.history)
    found = {}
    mu, sigma2, f, evals, mixture = truncated_em(engine, mu, start, entropy, rows, found, "nearest")
    phases["refine"] = found["em"]
    return mu, sigma2, f, evals + engine.n_samples * cfg.n_clusters, mixture, rows


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
        problem = check_precisions_init(cfg.precisions_init, cfg.covariance_type, C, D)
        if problem is not None:
            raise InputError(problem)


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
        if loop.restored is None and isinstance(seeder, str) and seeder in STARTS:
            # scikit-learn's starts: a whole mixture from responsibilities, the EM's first search ranks by it
            mu, var, weights, seed_evals = mixture_start(work, seeder, cfg.n_clusters, family_of(cfg, work), entropy)
            given = given_mixture(cfg, mu, var, weights)  # what the user gave is kept
            seeds, cfg = (
                mu,
                replace(
                    given,
                    precisions_init=given.precisions_init if cfg.precisions_init is None else cfg.precisions_init,
                    weights_init=given.weights_init if cfg.weights_init is None else cfg.weights_init,
                ),
            )
        elif loop.restored is None:
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
        refine = getattr(cfg, "refine", False) and size is not None and not loop.stopped
        if refine:
            mu, sigma2, f, refine_evals, mixture, loop = refine_on_all_rows(
                engine, cfg, mu, sigma2, mixture, entropy, loop, phases
            )
            refit = None
        mu, refit_evals = refit_means(engine, mu, refit, entropy, drawn) if refit else (mu, 0)
        phases["refit"] = time.perf_counter() - t
        t = time.perf_counter()
        qe, qe_evals = final_objective(engine, work, mu, getattr(cfg, "final_objective", "exact"))
        phases["final_qe"] = time.perf_counter() - t
    extras = {
        **mixture_extras(cfg, mixture, f, (engine if refine else work).summary.total_weight),
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
        "refine_distance_evals": int(refine_evals) if refine else 0,
        "final_qe_distance_evals": int(qe_evals),
    }
    return FitResult(
        mu,
        qe,
        loop.n_iter,
        loop.converged,
        int(seed_evals + em_evals + (refine_evals if refine else 0) + refit_evals + qe_evals),
        loop.history,
        extras,
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


def em_row_bytes(cfg):
    """The truncated EM's state per row: K^(n) (int32) and its costs (float64) for C' clusters, and the
    winner (int32); the seeder's before it."""
    return max(ROW_BYTES, 12 * (cfg.n_truncated or cfg.G) + 4)


def em_thread_bytes(cfg):
    """The search's buffers per worker thread (``buffer_bytes``): blocks of up to BLOCK_ROWS rows of C'·G + 1
    candidates."""
    return buffer_bytes(BLOCK_ROWS, (cfg.n_truncated or cfg.G) * cfg.G + 1)


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
        # the coreset is the working set's; a refine keeps var-GMM-S's state on every row
        state_bytes=lambda cfg: em_row_bytes(cfg) if cfg.refine else 0,
        thread_bytes=lambda cfg: em_thread_bytes(cfg) if cfg.refine else 0,
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
        state_bytes=em_row_bytes,
        thread_bytes=em_thread_bytes,
        probabilistic=True,
        resumable=True,
        saved=saved,
        model_extras=MODEL_EXTRAS,
        check_data=check_data,
    )
)
