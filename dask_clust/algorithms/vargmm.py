"""var-GMM-S (``algo="vargmm"``): vc-GMM's truncated variational EM on every row, with weight 1 (D. Forster,
J. Lücke, "Can clustering scale sublinearly with its clusters?", AISTATS 2018; F. Hirschberger, D. Forster,
J. Lücke, IEEE TPAMI 44(12), 2022, the paper's baseline). Steps 2-6 of vc-GMM's box (``vcgmm.py``) on the
input itself: seeding (or a whole mixture as scikit-learn starts one, ``blocks/mixture_start.py``), the
truncated EM (``blocks/truncated_em.py``), then the exact QE of the means over all rows.

The pieces every Gaussian-mixture fit shares live here, and ``vcgmm.py`` builds on them: the config, how
the means start, the checks of the input and of a given mixture, what the model and a checkpoint hold.
"""

import math
import numbers
import time
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from .._params import COVARIANCE_TYPES, Boolean, FiniteArray, Interval, NoneOK, Options
from ..blocks.gaussian import check_precisions_init, covariance
from ..blocks.lloyd import to_sphere
from ..blocks.mixture_start import STARTS, mixture_start
from ..blocks.seeding import ROW_BYTES, SEEDERS, seed
from ..blocks.truncated_em import family_of, isotropic, truncated_em
from ..blocks.truncated_estep import BLOCK_ROWS, buffer_bytes
from ..errors import InputError
from ..loop import FitResult
from .registry import BIG, COUNT, METRIC, METRICS, NUMBER, AlgorithmSpec, centres, final_pass, register, spherical


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
    metric: str = "euclidean"

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
        "precisions_init": [Interval(numbers.Real, 0, None, "neither"), FiniteArray((1, 2, 3)), NoneOK()],
        "metric": [Options(METRICS)],
    }

    docs: ClassVar = {
        "n_clusters": "Number of Gaussian components C.",
        "G": "Size of each cluster's neighbourhood G_c, from which the rows' search spaces are built.",
        "n_truncated": "C', the clusters each row's truncated posterior covers (None: G).",
        "init": "As k-means' init, or 'auto': 'kmeans' for 'full' and 'tied' (below), else k-means|| (ℓ = C/2) on "
        "the working set while C²·D ≤ 2^32 (its "
        "recluster runs on the driver in O(C²·D·log C); on sparse rows k-means++, as k-means' 'auto'), else "
        "'afkmc2', the paper's seeding (sublinear in N', but "
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
        "'spherical': σ²_c I per component; 'diag': diag(σ²_c1 … σ²_cD) per component; 'full': Σ_c per "
        "component; 'tied': one Σ shared by all (scikit-learn's four, with its shapes). A full covariance's cost "
        "is O(D²) an evaluation (a diagonal one's O(D)).",
        "weights": "'equal': π_c = 1/C (the paper's); 'learned': π_c = Σ_n w_n s_nc / Σw from each M-step.",
        "reg_covar": "Added to every per-component variance (scikit-learn's meaning), so none collapses onto "
        "a few rows; 'tied-spherical' keeps vc-GMM's σ² (floored at 1e-10 of the mean feature variance).",
        "weights_init": "Initial π (n_clusters,), positive, summing to 1 (weights='learned' only; needs "
        "precisions_init). None: equal.",
        "precisions_init": "Initial precisions, as scikit-learn's: a positive float ('tied-spherical'), "
        "(n_clusters,) ('spherical'), (n_clusters, n_features) ('diag'), (n_clusters, n_features, n_features) "
        "('full') or (n_features, n_features) ('tied'), symmetric positive definite. The first E-step then "
        "ranks clusters by −ℓ with these; None: σ² from the first search (vc-GMM's eq. 8).",
        "metric": METRIC + " The isotropic model only (one σ², equal weights): the E-step runs on the unit "
        "rows and each M-step puts the means back on the sphere (their mean directions). The model then "
        "reads rows on the sphere in predict, predict_proba and score.",
    }


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


def seeding_method(cfg, n_features, sparse=False):
    """The seeder ``init`` names ("auto" resolved as the config's docs say; ``sparse``: the rows are CSR, whose
    greedy seeding is k-means++, ``blocks.seeding``), or the given array."""
    if isinstance(cfg.init, str) and cfg.init == "auto":
        if covariance(cfg.covariance_type).auto_start is not None:
            return covariance(cfg.covariance_type).auto_start
        if cfg.n_clusters**2 * n_features > AUTO_KMEANS_PARALLEL_MAX:
            return "afkmc2"
        return "k-means++" if sparse else "k-means||"
    return cfg.init


def truncated_init(cfg, seeder):
    """How K^(n) starts ("auto" resolved: the paper's random sets after AFK-MC2, the nearest mean otherwise)."""
    if cfg.truncated_init != "auto":
        return cfg.truncated_init
    return "random" if isinstance(seeder, str) and seeder == "afkmc2" else "nearest"


def given_mixture(cfg, mu, var, weights):
    """``cfg`` with the mixture (means, σ² (C, D), weights or None) as its given start (``init``,
    ``precisions_init`` in scikit-learn's shape, exactly 1/σ², and ``weights_init``)."""
    precisions = covariance(cfg.covariance_type).precisions(var)
    return replace(cfg, init=mu, precisions_init=precisions, weights_init=weights)


def starting_means(work, cfg, entropy, loop):
    """Step 2 on the working set: (means, seeds, distance evaluations, the config with the start's mixture as
    its given one, the seeder). A seeder gives means; scikit-learn's starts (``STARTS``) a whole mixture,
    whose precisions and weights become the config's unless the user gave them; a resumed fit takes the
    checkpoint's means and seeds."""
    seeder = seeding_method(cfg, work.n_features, work.sparse)
    if loop.restored is not None:  # the means come from the checkpoint, the seeds order the rows as before
        mu, seeds, evals = loop.restored["mu"], loop.restored["seeds"], loop.restored["seed_evals"]
    elif isinstance(seeder, str) and seeder in STARTS:
        mu, var, weights, evals = mixture_start(work, seeder, cfg.n_clusters, family_of(cfg, work), entropy)
        given = given_mixture(cfg, mu, var, weights)
        seeds, cfg = (
            mu,
            replace(
                given,
                precisions_init=given.precisions_init if cfg.precisions_init is None else cfg.precisions_init,
                weights_init=given.weights_init if cfg.weights_init is None else cfg.weights_init,
            ),
        )
    else:
        seeds, evals = seed(
            work, cfg.n_clusters, seeder, entropy, chain_length=cfg.chain_length, oversampling_factor=OVERSAMPLING
        )
        mu = seeds
    if spherical(cfg) and loop.restored is None:  # (a checkpoint's are on the sphere already)
        mu = seeds = to_sphere(mu)
    loop.keep(seed_evals=int(evals), seeds=seeds)
    return mu, seeds, evals, cfg, seeder


def em_result(cfg, mu, qe, loop, em, how, evals):
    """The ``FitResult`` of a mixture fit: ``em`` = the EM's (σ², F, the other models' σ² and π, the weight
    of the rows it ended on); ``how`` = (seeder, truncated init, coreset size, refit size, phases);
    ``evals`` = the distance evaluations by phase (seeding, em, refine, refit, final_qe)."""
    sigma2, f, mixture, total_weight = em
    seeder, sets, size, refit, phases = how
    extras = {
        **mixture_extras(cfg, mixture, f, total_weight),
        "sigma2_": float(sigma2),
        "free_energy_": float(f),
        "coreset_size_": size,
        "G_": min(cfg.G, cfg.n_clusters),
        "init_": seeder if isinstance(seeder, str) else "array",
        "truncated_init_": sets,
        "n_truncated_": min(cfg.n_truncated or cfg.G, cfg.n_clusters),
        "refit_size_": refit,
        "phase_s": phases,
        **{f"{phase}_distance_evals": int(n) for phase, n in evals.items()},
    }
    return FitResult(mu, qe, loop.n_iter, loop.converged, int(sum(evals.values())), loop.history, extras)


def final_objective(engine, work, mu, cfg, loop):
    """objective_ and its distance evaluations: the exact QE over all rows (Σ w (1 − cos) on the sphere), the
    working set's weighted one, or nothing (``VCGMMConfig.final_objective``)."""
    kind = getattr(cfg, "final_objective", "exact")
    if kind is None:
        return None, 0
    unit = spherical(cfg)
    return (
        final_pass(engine, mu, unit=unit, loop=loop) if kind == "exact" else final_pass(work, mu, "the coreset", unit)
    )


def check_data(cfg, source):
    """The initial mixture (``weights_init``, ``precisions_init``) against C, D and the model, before an
    engine opens."""
    C, D = cfg.n_clusters, source.n_features
    if source.sparse and not isotropic(cfg):
        raise InputError(
            "sparse rows take the isotropic model only (covariance_type='tied-spherical', weights='equal': "
            f"squared distances from a row's non-zeros); got covariance_type={cfg.covariance_type!r}, "
            f"weights={cfg.weights!r}: pass X.toarray() if it fits in memory"
        )
    if spherical(cfg) and not isotropic(cfg):
        raise InputError(
            "metric='cosine' takes the isotropic model only (covariance_type='tied-spherical', "
            f"weights='equal'); got covariance_type={cfg.covariance_type!r}, weights={cfg.weights!r}"
        )
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


def check_rows(engine):
    """What every Gaussian mixture needs of its rows: more than one, and not all equal."""
    if engine.n_samples == 1:
        raise InputError("a Gaussian mixture needs more than one row; got n_samples=1")
    if not float(np.max(engine.summary.var)) > 0:
        raise InputError(
            "all rows are identical (zero variance): a Gaussian mixture cannot be fitted; use algo='kmeans'"
        )


def fit(engine, cfg, entropy, loop):
    """var-GMM-S: seeding, the truncated EM on every row as they are, then the exact QE over all rows."""
    check_rows(engine)
    phases = {}
    t = time.perf_counter()
    mu, _, seed_evals, cfg, seeder = starting_means(engine, cfg, entropy, loop)
    phases["seeding"] = time.perf_counter() - t
    sets = truncated_init(cfg, seeder)
    em = truncated_em(engine, mu, cfg, entropy, loop, phases, sets)
    if sets == "nearest":  # the state builder's assignment pass over the rows
        seed_evals += engine.n_samples * cfg.n_clusters
    phases["refit"] = 0.0
    t = time.perf_counter()
    qe, qe_evals = final_objective(engine, engine, em.mu, cfg, loop)
    phases["final_qe"] = time.perf_counter() - t
    evals = dict(seeding=seed_evals, em=em.evals, refit=0, refine=0, final_qe=qe_evals)
    fitted = (em.sigma2, em.f, em.mixture, engine.summary.total_weight)
    return em_result(cfg, em.mu, qe, loop, fitted, (seeder, sets, None, None, phases), evals)


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
        shape = covariance(cfg.covariance_type).var_shape(k, n_features)
        mixture = {"var": ("floats", shape), "weights": ("floats", (k,))}
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
        name="vargmm",
        config=VarGMMConfig,
        fit=fit,
        estimator="VarGMM",
        summary="var-GMM-S: vc-GMM's truncated variational EM on all rows (weight 1), the paper's baseline",
        reference="Forster, Lücke, AISTATS 2018; Hirschberger, Forster, Lücke, TPAMI 2022",
        objective="the free energy F of the truncated posteriors on all rows (higher is better)",
        figure="free energy",
        state_bytes=em_row_bytes,
        thread_bytes=em_thread_bytes,
        probabilistic=True,
        sparse=True,
        resumable=True,
        saved=saved,
        model_extras=MODEL_EXTRAS,
        check_data=check_data,
    )
)
