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
  6'. split and merge (``split_merge`` moves, ``moves``; Ueda et al., "SMEM Algorithm for Mixture Models",
     Neural Computation 2000; "diag", "full" and "tied" with learned weights, GaussianMixture's default, none
     here by default): after the coreset's EM, the closest pair merged and a third component split (the
     widest; for "full" the one whose rows' kurtosis is furthest from a Gaussian's; for "tied" the one whose
     rows spread furthest beyond the shared Σ), kept when an EM from there raises the coreset's F
     (``blocks/split_merge.py``).
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

The steps' code: 1, 7 and the refine here; 2, the config, the checks and what the model and a checkpoint
hold in ``vargmm.py`` (var-GMM-S's fit on every row, which this one builds on); 3-6 in
``blocks/truncated_estep.py`` (per chunk: K^(n), the search, the statistics) and ``blocks/truncated_em.py``
(the M-step, where the model lives, the loop); what differs between covariance types in
``blocks/gaussian.py``.

Where the means live (``means_for``): on the driver while C·D·8 fits ``model-bytes``; above, sharded on the
workers by cluster range (ARCHITECTURE.md, rule 1), the E-step's pair and posterior statistics reduce-scattered to
where each range lives and steps 5-6 run there, so the driver receives O(C·G) per iteration, not O(C·D).
Both give the same bits.

Sparse rows (a CSR matrix of documents; the isotropic model with equal weights only): the coreset's
proposal and every cost are squared distances ||x||² − 2 x·μ + ||μ||² from a row's non-zeros (O(nnz) a
member of S_n, ``kernels/truncated.py``), Σ w s x is scattered by column, the coreset stays CSR on the
driver or the workers, and ``init="auto"`` seeds by k-means++ (``seeding_method``). The driver receives the
same C × D statistics as from dense rows (O(C·G) when the means are sharded).

Clamping (documented, not an error): G ← min(G, C) and C' ← min(C', C); with C ≤ G every search space
holds all clusters, i.e. exact EM.
"""

import contextlib
import numbers
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .. import progress
from .._params import Boolean, Interval, NoneOK, Options
from ..blocks.coreset import coreset_and_sample, default_size, uniform_sample
from ..blocks.gaussian import covariance
from ..blocks.knn import Centres, nearest_centre
from ..blocks.lloyd import lloyd_update
from ..blocks.split_merge import split_merge
from ..blocks.truncated_em import isotropic, truncated_em
from ..loop import Loop
from .registry import COUNT, AlgorithmSpec, register, spherical
from .vargmm import (
    MODEL_EXTRAS,
    VarGMMConfig,
    check_data,
    check_rows,
    em_result,
    em_row_bytes,
    em_thread_bytes,
    final_objective,
    given_mixture,
    saved,
    starting_means,
    truncated_init,
)
from .vargmm import fit as fit_every_row

# EM iterations a start (``best_start``) or a split-and-merge move is judged after: its basin is set by then,
# and the judging costs less than a quarter of the fit's own coreset EM
TRIAL_ITERATIONS = 8


@dataclass
class VCGMMConfig(VarGMMConfig):
    coreset_size: object = "auto"
    refit_size: object = "auto"
    final_objective: object = "exact"
    refine: bool = False
    coreset_starts: int = 1
    split_merge: int = 0

    constraints: ClassVar = {
        **VarGMMConfig.constraints,
        "refine": [Boolean()],
        "coreset_starts": [Options(("auto",)), Interval(numbers.Integral, 1, None)],
        "split_merge": [Options(("auto",)), Interval(numbers.Integral, 0, None)],
        "coreset_size": [Options(("auto",)), Interval(numbers.Integral, 1, None), NoneOK()],
        "refit_size": [Options(("auto",)), Interval(numbers.Integral, 1, None), NoneOK()],
        "final_objective": [Options(("exact", "coreset")), NoneOK()],
    }
    docs: ClassVar = {
        **VarGMMConfig.docs,
        "coreset_size": "Rows N' of the lightweight coreset the EM runs on: 'auto' is the paper's "
        "min(N, max(2^15, 64 C)) ('full': D(D+3)/4 rows a component in place of 64, half one a parameter, and "
        "D(D+3)/2 above 256 components), None runs on all rows (var-GMM-S).",
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
        "coreset_starts": "Seedings tried on the coreset, each followed by the EM on it (steps 2-6); the one of "
        "highest free energy goes on to step 7 or the refine (the coreset's free energy estimates the data's "
        "without bias). Costs a pass over the coreset per EM iteration a start, none over the data. 1: the "
        "paper's one start; 'auto': the covariance type's, for \"diag\" 1 up to 256 components (the "
        'split-and-merge moves do better) and 3 above, 1 for "full" (its moves too), 3 for "tied" and the '
        "spherical types. The seeding's basin decides a mixture's likelihood more than the EM does: on "
        "1M x 64 at C = 64, eight single starts ranged over 2.2 nats per row of held-out log-likelihood, and their "
        "coreset free energies ranked them exactly (benchmarks/BENCHMARKS.md).",
        "split_merge": "Split-and-merge moves tried on the coreset after its EM (``blocks/split_merge.py``; Ueda et "
        'al., Neural Computation 2000): two overlapping components merged and a third split ("diag": the '
        'widest; "full": the one whose rows\' kurtosis is furthest from a Gaussian\'s; "tied": the one whose '
        "rows spread furthest beyond the shared Σ), the EM run "
        f"{TRIAL_ITERATIONS} iterations from there, kept when the coreset's free energy rose; stops after "
        "3 in a row are not kept. They leave the optima where one component spans two clusters and two "
        "share one, which more starts rarely avoid (eight starts of 300k x 64, C = 64 spread over 2.1 nats "
        "per row). Costs those iterations on the coreset per move, no pass over the data. 0: none (the paper's "
        'fit); \'auto\': the covariance type\'s, 8 for "diag", 4 for "full" and "tied", 0 for the others. "diag", '
        '"full" and "tied" only, with learned weights.',
    }


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
    with work.reorder(nearest_centre, Centres(seeds, False)) as rows:
        keys, totals = rows.key_totals
        phases["reorder"] = time.perf_counter() - t
        yield rows, (np.concatenate([[0], np.cumsum(totals)]).astype(np.int64), keys.astype(np.int32))


def n_moves(cfg):
    """The split-and-merge moves the fit may try (``VCGMMConfig.split_merge``, "auto" resolved: the covariance
    type's ``CovarianceType.moves``): none unless the type's components can be moved (``splits``) and the weights
    are learned."""
    cov = covariance(cfg.covariance_type)
    if not cov.splits or cfg.weights != "learned":
        return 0
    return cov.moves if cfg.split_merge == "auto" else cfg.split_merge


def moves(rows, cfg, em, entropy, phases):
    """``split_merge`` on the coreset ``rows`` from the EM's result ``em``, each move judged by a var-GMM-S EM
    of TRIAL_ITERATIONS iterations given the moved mixture (K^(n) from the nearest mean, as the refine
    starts). Returns the ``EMResult`` of the mixture kept, its evaluations those of every EM run."""
    t = time.perf_counter()
    evals = 0
    cov = covariance(cfg.covariance_type)

    def judged(m, var, weights):
        nonlocal evals
        trial = Loop("split and merge", min(cfg.max_iter, TRIAL_ITERATIONS))
        new = truncated_em(rows, m, given_mixture(cfg, m, var, weights), entropy, trial, {}, "nearest")
        evals += new.evals + rows.n_samples * cfg.n_clusters  # (and the nearest-mean pass)
        return (new.mu, *new.mixture), new.f, new, cov.split_rank(new.mixture[0], new.misfit)

    rank = cov.split_rank(em.mixture[0], em.misfit)
    _, _, kept = split_merge(judged, cov, (em.mu, *em.mixture), em.f, n_moves(cfg), rank)
    phases["split_merge"] = time.perf_counter() - t
    return (em if kept is None else kept)._replace(evals=em.evals + evals)


def refine_on_all_rows(engine, cfg, em, entropy, loop, phases):
    """``VCGMMConfig.refine``: steps 3-6 on every row of ``engine``, from the coreset's mixture (its
    ``EMResult`` ``em``), exactly as a var-GMM-S fit given it (``means_init``, ``weights_init``,
    ``precisions_init``) runs them: K^(n) from the nearest mean, then the searches rank by −ℓ. The iterations
    continue the fit's history (a loop of their own that starts where the coreset's ended, with ``max_iter``
    more). Not checkpointed: a fit resumed from its coreset checkpoint refines again, to the same bits.
    Returns (its ``EMResult``, the loop)."""
    mu, mixture = em.mu, em.mixture
    if mixture is None:  # vc-GMM's own model: one σ², equal weights
        mixture = (np.full(mu.shape, em.sigma2), None)
    start = given_mixture(cfg, mu, *mixture)
    rows = Loop(
        "refine on all rows",
        loop.n_iter + cfg.max_iter,
        callback=loop.callback,
        progress=True,
        figure=loop.figure,
        final=loop.final,
    )
    rows.history = list(loop.history)
    found = {}
    em = truncated_em(engine, mu, start, entropy, rows, found, "nearest")
    phases["refine"] = found["em"]
    return em._replace(evals=em.evals + engine.n_samples * cfg.n_clusters), rows


def refit_size(cfg, n_samples, coreset):
    """The rows ``refit_means`` samples (``VCGMMConfig.refit_size``), or None: no refit (no coreset, or a
    model other than the isotropic one with equal weights: a Lloyd step would move its means away from the
    variances and weights fitted with them)."""
    size = getattr(cfg, "refit_size", None)
    if coreset is None or size is None or not isotropic(cfg):
        return None
    return min(n_samples, 2 * coreset if size == "auto" else size)


def refit_means(engine, mu, size, entropy, drawn=None, unit=False):
    """Step 7: one Lloyd step from the EM's means on ``size`` fresh rows drawn ∝ w (all rows when ``size`` is
    N). Each mean comes from ≈ N'/C coreset rows (64 by default), importance-weighted, so it carries their
    sampling noise: blobs 1 M × 32, C = 2000, the EM's means end 3.5 % above faiss's QE; re-estimated from
    2 N' uniform rows, 1.5 % (one step on all N rows: 0.0 %). A cluster no sampled row chooses keeps its mean.
    ``drawn``: those rows, drawn with the coreset in its pass (``coreset_and_sample``); ``unit``: a spherical
    step (metric="cosine": the means stay on the sphere)."""
    with progress.phase(f"refit on {size:,} rows", 1, "pass") as shown:
        if size >= engine.n_samples:
            new, evals = lloyd_update(engine, mu, unit)
        else:
            with uniform_sample(engine, size, entropy, drawn) as rows:
                new, evals = lloyd_update(rows, mu, unit)
        shown.update()
    return new, evals


def start_entropy(entropy, i):
    """The random stream of start i (``coreset_starts``): the fit's own for the first, so that one start is
    the fit it always was."""
    return entropy if i == 0 else int(np.random.SeedSequence(entropy, spawn_key=(0x5EED, i)).generate_state(1)[0])


def n_starts(cfg):
    """``coreset_starts``, "auto" resolved: the covariance type's (``CovarianceType.starts``)."""
    if cfg.coreset_starts == "auto":
        return covariance(cfg.covariance_type).starts(cfg.n_clusters)
    return cfg.coreset_starts


def best_start(work, cfg, entropy, loop):
    """Steps 2-6 on the coreset from each of ``coreset_starts`` streams, untracked: the stream of the one whose
    EM reached the highest free energy (the first on ties), which the fit then runs as its own (a second EM
    on the coreset, so that its iterations, callbacks and checkpoints are the fit's). A resumed fit takes the
    start its checkpoint names."""
    starts = n_starts(cfg)
    if starts == 1:
        return entropy
    if loop.restored is not None:
        return start_entropy(entropy, int(loop.restored["start"]))
    best, best_f = 0, -np.inf
    with progress.phase("coreset starts", starts, "start") as shown:
        for i in range(starts):
            e, trial = start_entropy(entropy, i), Loop(loop.name, min(loop.max_iter, TRIAL_ITERATIONS))
            mu, seeds, _, given, seeder = starting_means(work, cfg, e, trial)
            sets = truncated_init(given, seeder)
            with by_nearest_seed(work, seeds, sets, {}) as (rows, cells):
                f = truncated_em(rows, mu, given, e, trial, {}, sets, cells).f
            if f > best_f:
                best, best_f = i, f
            shown.update(1, free_energy=f"{f:.6g}")
    loop.keep(start=best)
    return start_entropy(entropy, best)


def fit(engine, cfg, entropy, loop):
    """Coreset, seeding, truncated EM, then the refit or the refine, then one exact QE pass over all rows
    (without a coreset: var-GMM-S's fit)."""
    size = cfg.coreset_size
    if size is None:
        return fit_every_row(engine, cfg, entropy, loop)
    if size == "auto":
        per_cluster = covariance(cfg.covariance_type).coreset_rows(engine.n_features, cfg.n_clusters)
        size = default_size(engine.n_samples, cfg.n_clusters, per_cluster)
    check_rows(engine)
    phases = {}
    refit = refit_size(cfg, engine.n_samples, size)
    aside = refit if refit and refit < engine.n_samples else None  # drawn with the coreset, in its pass
    with coreset_and_sample(engine, size, aside, entropy, cfg.n_clusters, phases) as (work, drawn):
        t = time.perf_counter()
        start = best_start(work, cfg, entropy, loop)
        mu, seeds, seed_evals, cfg, seeder = starting_means(work, cfg, start, loop)
        phases["seeding"] = time.perf_counter() - t
        sets = truncated_init(cfg, seeder)
        # the coreset sorted by nearest seed
        with by_nearest_seed(work, seeds, sets, phases) as (rows, cells):
            em = truncated_em(rows, mu, cfg, start, loop, phases, sets, cells)
            if n_moves(cfg) and not loop.stopped:
                em = moves(rows, cfg, em, start, phases)
        if sets == "nearest":  # the assignment pass over the working set: the sort's key or the builder's
            seed_evals += work.n_samples * cfg.n_clusters
        t = time.perf_counter()
        em_evals, refine_evals, rows_of_em = em.evals, 0, work
        if cfg.refine and not loop.stopped:
            em, loop = refine_on_all_rows(engine, cfg, em, entropy, loop, phases)
            refine_evals, refit, rows_of_em = em.evals, None, engine
        mu, refit_evals = refit_means(engine, em.mu, refit, entropy, drawn, spherical(cfg)) if refit else (em.mu, 0)
        phases["refit"] = time.perf_counter() - t
        t = time.perf_counter()
        qe, qe_evals = final_objective(engine, work, mu, cfg, loop)
        phases["final_qe"] = time.perf_counter() - t
    evals = dict(seeding=seed_evals, em=em_evals, refit=refit_evals, refine=refine_evals, final_qe=qe_evals)
    fitted = (em.sigma2, em.f, em.mixture, rows_of_em.summary.total_weight)
    return em_result(cfg, mu, qe, loop, fitted, (seeder, sets, size, refit, phases), evals)


def saved_with_start(cfg, n_samples, n_features):
    """What a vc-GMM checkpoint holds (``vargmm.saved``), and with several coreset starts the one chosen."""
    return {**saved(cfg, n_samples, n_features), **({"start": COUNT} if n_starts(cfg) > 1 else {})}


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
        figure="free energy",
        # the coreset is the working set's; a refine keeps var-GMM-S's state on every row
        state_bytes=lambda cfg: em_row_bytes(cfg) if cfg.refine else 0,
        thread_bytes=lambda cfg: em_thread_bytes(cfg) if cfg.refine else 0,
        probabilistic=True,
        sparse=True,
        resumable=True,
        saved=saved_with_start,
        model_extras=MODEL_EXTRAS,
        check_data=check_data,
    )
)
