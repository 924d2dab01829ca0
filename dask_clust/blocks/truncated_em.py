"""The truncated variational EM of a Gaussian mixture (steps 3-6 of vc-GMM, F. Hirschberger, D. Forster,
J. Lücke, IEEE TPAMI 44(12), 2022, Alg. 1; ``algorithms/vcgmm.py`` gives the steps in full): where the model
lives while it runs (on the driver, or sharded on the workers by cluster range), its M-step for every
covariance type of the family (``gaussian.py``), and the loop from the seeds to the converged free energy.
"""

import contextlib
import math
import time
from typing import NamedTuple

import numpy as np

from .._random import stream
from ..engine import restored_rows
from ..engine.combine import Max, Min, Rows, Sum
from ..errors import InputError
from .gaussian import covariance, own_model
from .lloyd import m_step as mean_directions
from .truncated_estep import (
    NO_METRIC,
    Found,
    SearchParams,
    TruncatedInit,
    estep_combine,
    init_neighbourhoods,
    init_truncated_sets,
    pair_grid,
    posterior_step,
    row_fields,
    scatter_step,
    stats_combine,
    truncated_estep,
    update_neighbourhoods,
)

# σ² never falls below this fraction of the mean feature variance (keeps 1/σ² finite, as reg_covar)
SIGMA2_FLOOR = 1e-10


def m_step(mu, sums, U, Q, unit=False):
    """μ_c = Σ w s x / U_c (kept when U_c = 0: no re-seeding) and each cluster's part of σ² in one pass:
    with Q_c = Σ w s ||x − μ_c^old||² (a column), Σ w s ||x − μ_c^new||² = Q_c − U_c ||μ_c^new − μ_c^old||².
    Row-wise, so the clusters of a shard give the bits of the whole. ``unit`` (rows on the unit sphere,
    metric="cosine"): μ_c = Σ w s x / ||Σ w s x||, the mean direction, which maximises Σ w s x·μ over unit μ
    and so still raises the free energy at fixed σ²; its residual is the general Q_c − 2 δ·(Σ w s x − U_c
    μ_c^old) + U_c ||δ||², δ = μ_c^new − μ_c^old (the cross term no longer vanishes off the mean)."""
    if unit:
        new = mean_directions(sums, U, mu, unit=True)
        delta = new - mu
        cross = (delta * (sums - U[:, None] * mu)).sum(axis=1)
        return new, np.maximum(Q[:, 0] - 2 * cross + U * (delta * delta).sum(axis=1), 0.0)
    new = mu.copy()
    won = U > 0
    new[won] = sums[won] / U[won, None]
    shift = ((new - mu) ** 2).sum(axis=1)
    return new, np.maximum(Q[:, 0] - U * shift, 0.0)


def isotropic(cfg):
    """Whether a config (or a ``Family``) asks for vc-GMM's own model: one σ² and equal weights."""
    return own_model(cfg.covariance_type, cfg.weights)


class Family(NamedTuple):
    """The mixture a fit learns (``VarGMMConfig``), the floor of its variances, and for a type that reads it
    (``CovarianceType.needs_scatter``) the rows' scatter Σ w (x − m)(x − m)ᵀ (D, D) about their mean m."""

    covariance_type: str
    weights: str
    reg_covar: float
    floor: float
    scatter: tuple | None = None
    unit: bool = False  # rows on the unit sphere and means kept there (metric="cosine"; the isotropic model)

    @property
    def isotropic(self):
        """vc-GMM's own model (one σ², equal weights): its searches rank clusters by squared distance."""
        return isotropic(self)

    @property
    def cov(self):
        """Its ``CovarianceType``."""
        return covariance(self.covariance_type)

    @property
    def moments(self):
        """What the E-step's Q holds (``CovarianceType.moments``; 0 for the isotropic model: Σ w s d²)."""
        return 0 if self.isotropic else self.cov.moments


def family_of(cfg, engine):
    """The mixture a config asks for, its variances floored at SIGMA2_FLOOR of the data's mean variance;
    the rows' scatter where its type reads it (one pass over ``engine``'s rows, O(D²) to the driver)."""
    floor = SIGMA2_FLOOR * float(np.mean(engine.summary.var))
    scatter = None
    if covariance(cfg.covariance_type).needs_scatter:
        mean = np.asarray(engine.summary.mean, np.float64)
        scatter = (engine.reduce(scatter_step, mean, (Sum(),))[0], mean)
    unit = getattr(cfg, "metric", "euclidean") == "cosine"
    return Family(cfg.covariance_type, cfg.weights, float(cfg.reg_covar), floor, scatter, unit)


def mixture_m_step(family, mu, var, weights, sums, U, Q, total_weight):
    """Step 6 of the other models, row-wise (a shard's clusters give the bits of the whole): μ_c as ``m_step``;
    the variances from the residuals about the new means, taken from Q about the old ones (no cancellation),
    as the covariance type sets them (``CovarianceType.m_step``; "tied-spherical"'s one σ² is left to
    ``new_sigma2``); π_c = U_c / Σw ("learned"). A cluster no row reaches (U_c = 0) keeps μ_c and its
    variances and gets π_c = 0, so the weights still sum to 1. Returns μ, the variances, π and each
    cluster's residual (its trace)."""
    won = U > 0
    new = mu.copy()
    new[won] = sums[won] / U[won, None]
    var, resid = family.cov.m_step(var, Q, U, won, new, mu, family, total_weight)
    if family.weights == "learned":
        weights = U / total_weight
    return new, var, weights, resid


def metric_range(family, h, offset):
    """(the most −ℓ_c − offset_c per unit of squared distance, least and largest finite offset): what
    ``pair_grid`` bounds the costs with (a shard's part; Max, Min, Max combine them)."""
    finite = offset[np.isfinite(offset)]
    return family.cov.h_max(h), np.min(finite, initial=np.inf), np.max(finite, initial=-np.inf)


def new_sigma2(resid, n_features, total_weight, floor):
    """σ² = Σ_c resid_c / (D Σw), floored."""
    return max(resid.sum() / (n_features * total_weight), floor)


def free_energy(data_f, sigma2, total_weight, n_features, n_clusters):
    """F = Σ w logsumexp_{K^(n)}(−d²/2σ²) − Σw (D/2) log(2πσ²) − Σw log C."""
    return data_f - total_weight * (0.5 * n_features * math.log(2 * math.pi * sigma2) + math.log(n_clusters))


class MStepResult(NamedTuple):
    """Step 6's result: F's data part (Σ w log Σ_{K^(n)} exp(−cost)), each cluster's residual (its trace),
    and the clusters that won rows."""

    data_f: float
    resid: np.ndarray
    active: int


class ShardedUpdate(NamedTuple):
    """A search with σ² known on a sharded model, as its reduce-scatter returns it: the summed fields
    (evaluations, Σ w least cost, changed winners, the data term of F), then the shards' small fields (G_c,
    then the M-step's)."""

    evals: int
    least_cost: float
    changed: int
    data_f: float
    neighbourhoods: np.ndarray
    small: tuple


class Search(NamedTuple):
    """An iteration's step 4 (and 5, 6 when σ² is known): its cost evaluations, Σ w min cost, the rows whose
    winner changed, the new G_c, and step 6's result (None before σ² is known)."""

    evaluations: int
    least_cost: float
    changed: int
    neighbourhoods: np.ndarray
    m_step: MStepResult | None


class MStep(NamedTuple):
    """What a sharded M-step reads besides its statistics: the family, Σw, C, and σ² of the isotropic model
    the first search used (``first``: the per-cluster model starts from it)."""

    family: Family
    total_weight: float
    n_clusters: int
    sigma2: float | None
    first: bool


class PosteriorParams(NamedTuple):
    """What ``posterior_step`` reads: 1/2σ², C, the means (for Q about them; None: not needed), what the
    sharded M-step after it reads, and what Q holds (``Family.moments``)."""

    inv: float
    n_clusters: int
    mu: object
    m_step: MStep | None = None
    moments: int = 0


class Means:
    """The model in an engine model (``Engine.model``: on the driver while its bytes are within
    ``model-bytes``, else sharded on the workers by cluster range, ARCHITECTURE.md rule 1): the means (and the
    other models' σ², π, and their metric h and offset). The pair and posterior statistics go to where each
    range of clusters lives (reduce-scattered when sharded; combined whole at the root partition when on the
    driver) and G_c and the M-step run there, the same shard functions either way, so the same bits; every
    partition reads the whole means (and metric, ``model.ref()``) for its search. Per iteration the driver
    receives G_c (C·G·4 bytes), each cluster's residual (C·8), the metric's range and a few scalars, and the
    new model where it is on the driver (C·D·8 per array; C·D²·8 for σ² and h of "full"); never the pair
    statistics. A sharded model holds diagonal variances only (``means_for``)."""

    def __init__(self, engine, model, n_clusters, family, mixture=None):
        self.engine, self.model, self.n_clusters, self.family = engine, model, n_clusters, family
        self.total_weight, self.scaled = engine.summary.total_weight, mixture is not None
        self.grid = pair_grid(engine, metric_range(family, *family.cov.metric(*mixture)) if mixture else None)
        self.misfit = None  # each component's (``CovarianceType.misfit``), from the first M-step on
        self.estep, self.stats = estep_combine(n_clusters), stats_combine(family.moments)
        self.small = (Rows(), Sum()) + (() if family.isotropic else RANGE + (Rows(),))

    def _m_step_params(self, sigma2):
        return MStep(self.family, self.total_weight, self.n_clusters, sigma2, not self.scaled)

    def search(self, Gc, key, extra_random, sigma2):
        """Step 4 (+ its posteriors when σ² is known), step 5, and step 6 when σ² is known: a ``Search``."""
        inv = None if sigma2 is None else 1.0 if self.scaled else 0.5 / sigma2
        metric = (self.model.ref(3), self.model.ref(4)) if self.scaled else NO_METRIC
        params = SearchParams(
            self.model.ref(), Gc, key, extra_random, inv, self.grid, *metric, self.family.moments,
            self._m_step_params(sigma2),
        )  # fmt: skip
        if inv is None:  # (the summed fields, then the small ones: here G_c)
            found = Found(*self.model.step(truncated_estep, params, self.estep, _shard_neighbourhoods, (Rows(),)))
            return Search(int(found.evals), float(found.least_cost), int(found.changed), found.neighbourhoods, None)
        out = self.model.step(truncated_estep, params, self.estep + self.stats, _shard_update, (Rows(),) + self.small)
        updated = ShardedUpdate(*out[:5], out[5:])
        m_step = self._updated(updated.data_f, updated.small)
        return Search(
            int(updated.evals), float(updated.least_cost), int(updated.changed), updated.neighbourhoods, m_step
        )

    def posteriors(self, sigma2):
        """Step 6 after the first search (σ² was not known when it ran)."""
        moments = self.family.moments
        mu = self.model.ref() if moments else None
        params = PosteriorParams(0.5 / sigma2, self.n_clusters, mu, self._m_step_params(sigma2), moments)
        out = self.model.step(posterior_step, params, self.stats, _shard_m_step, self.small)
        return self._updated(out[0], out[1:])  # (the summed data term, then the shards' small fields)

    def _updated(self, data_f, small):
        if not self.family.isotropic:
            self.scaled, self.grid = True, pair_grid(self.engine, small[2:5])
            self.misfit = small[5] if len(small[5]) else None
        return MStepResult(float(data_f), small[0], int(small[1]))

    def set_tied(self, sigma2):
        """The shared σ² of "tied-spherical" with learned weights, once every cluster's residual is in."""
        self.grid = pair_grid(self.engine, self.model.apply(_shard_set_tied, TiedSet(sigma2, self.family), RANGE))

    def means(self):
        """The means where they are on the driver (None where sharded)."""
        return self.model.local()

    def mixture(self):
        """σ² and π, as the last M-step left them (the other models)."""
        return self.model.gather(1), self.model.gather(2)

    def result(self):
        """The final means on the driver."""
        return self.model.gather()


# how the shards' ranges of the metric combine (``metric_range``)
RANGE = (Max(), Min(), Max())


def _shard_neighbourhoods(fields, shard, params, lo):
    """Step 5 where clusters lo.. live: their rows of G_c from their pair statistics."""
    Gc = params.Gc[lo : lo + len(shard[0])].copy()
    update_neighbourhoods(*fields[0], Gc, lo, len(params.Gc))
    return shard, (Gc,)


def _shard_m_step(fields, shard, params, lo):
    """Step 6 where clusters lo.. live, from their posterior statistics ``fields`` (Σ w s x, U, Q, and Σ w s r⁴
    for "full"): their new means (the other models: σ², π, and the metric, whose range goes up with each
    component's misfit, empty for the types that measure none); their residuals and active count go up."""
    sums, U, Q, *fourth = fields
    won = np.int64(np.count_nonzero(U > 0))
    ms = params.m_step
    if ms.family.isotropic:
        mu, resid = m_step(shard[0], sums, U, Q, ms.family.unit)
        return (mu,), (resid, won)
    mu, var, weights, _, offset = shard
    # the costs the E-step summed: −ℓ after the first M-step, else squared distances at 1/2σ²
    inv, offset = (0.5 / ms.sigma2, NO_METRIC[1]) if ms.first else (1.0, offset)
    if ms.first:  # the per-cluster model starts from the isotropic one the first search used
        var, weights = ms.family.cov.isotropic_var(ms.sigma2, *mu.shape), np.full(len(U), 1.0 / ms.n_clusters)
    mu, var, weights, resid = mixture_m_step(ms.family, mu, var, weights, sums, U, Q, ms.total_weight)
    misfit = ms.family.cov.misfit(U, Q, fourth, inv, offset, mu.shape[1])
    h, offset = ms.family.cov.metric(var, weights)
    misfit = np.empty(0) if misfit is None else misfit
    return (mu, var, weights, h, offset), (resid, won, *metric_range(ms.family, h, offset), misfit)


def _shard_update(fields, shard, params, lo):
    """Steps 5 and 6 where clusters lo.. live (σ² known: the search's posteriors came with it)."""
    _, (Gc,) = _shard_neighbourhoods(fields, shard, params, lo)
    shard, small = _shard_m_step(fields[1:], shard, params, lo)
    return shard, (Gc,) + small


class TiedSet(NamedTuple):
    """``_shard_set_tied``'s parameters: the shared σ² and the family."""

    sigma2: float
    family: object


def _shard_set_tied(shard, params: TiedSet, lo):
    """The shared σ² where clusters lo.. live, and their metric."""
    mu, var, weights = shard[:3]
    var = np.full(var.shape, params.sigma2)
    h, offset = params.family.cov.metric(var, weights)
    return (mu, var, weights, h, offset), metric_range(params.family, h, offset)


@contextlib.contextmanager
def means_for(engine, mu, family, mixture=None):
    """The model for the EM (``Means``), in an engine model of C·D·8 bytes (three times that for the other
    models: μ, σ², h; "full" adds its matrices). ``mixture``: a resumed fit's σ² and π."""
    C, D = mu.shape
    nbytes = mu.nbytes * (1 if family.isotropic else 3) + (8 * C * D * D * 3 if family.cov.moments == 2 else 0)
    if engine.shards_model(nbytes) and family.cov.var_shape(C, D) != mu.shape:
        raise InputError(
            f"covariance_type={family.covariance_type!r} with C = {C:,}, D = {D:,} makes a model of {nbytes:,} bytes, "
            "over dask_clust.model-bytes: a sharded model holds diagonal variances only (use 'diag', or raise "
            "model-bytes)"
        )
    arrays = (mu,)
    if not family.isotropic:  # σ² and h take their width at the first M-step
        var, weights = mixture or (np.empty((C, 0)), np.full(C, 1.0 / C))
        arrays = (mu, var, weights, *(family.cov.metric(var, weights) if mixture else (np.empty((C, 0)), np.zeros(C))))
    with engine.model("vcgmm", arrays, nbytes) as model:
        yield Means(engine, model, C, family, mixture)


class EMResult(NamedTuple):
    """What ``truncated_em`` ends with: the means, σ², F, the distance evaluations, the other models' σ²
    (C, D) and π (None for vc-GMM's), and each component's ``misfit`` at the last E-step (None for the types
    that measure none)."""

    mu: np.ndarray
    sigma2: float
    f: float
    evals: int
    mixture: tuple | None
    misfit: np.ndarray | None = None


def truncated_em(engine, mu, cfg, entropy, loop, phases, sets="random", cells=None):
    """Steps 3-6 on ``engine`` (the coreset or all rows) from the means ``mu``; ``sets``: how K^(n) starts
    (``truncated_init``), ``cells``: the engine's rows sorted by nearest seed (``by_nearest_seed``): an
    ``EMResult``."""
    C, D = mu.shape
    G = min(cfg.G, C)
    Cp = min(cfg.n_truncated or cfg.G, C)
    total_w = engine.summary.total_weight
    family = family_of(cfg, engine)
    floor = family.floor
    tied = covariance(family.covariance_type).tied
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
        sigma2 = mixture if family.isotropic else family.cov.mean_variance(mixture[0])
        mixture = None if family.isotropic else mixture

    # K^(n) depends on every E-step before: a rebuilt partition takes it from its buddy's copy (backup), or,
    # where that copy is lost too, from the nearest seed (``cells``) or the nearest mean (the driver's; the
    # seeds when the means are sharded) plus random others
    def nearest_to():
        if sets != "nearest" or cells is not None:
            return None
        return mu if means.means() is None else means.means()

    builder, model = init_truncated_sets, lambda: TruncatedInit(Cp, C, key_K, nearest_to(), cells)
    if restored is not None:
        fields = row_fields(C, Cp, signed=not family.isotropic)
        builder, model = restored_rows, lambda: (loop.restored_rows, "vcgmm", fields)
    with (
        means_for(engine, mu, family, mixture) as means,
        engine.state("vcgmm", builder, model, backup=("K", "Kd2", "winner")),
    ):
        for i in range(cfg.n_init_esteps if restored is None else 0):  # Suppl. F: optimise K^(n) and G_c
            found = means.search(Gc, kernel_key(entropy, "init", i), cfg.extra_random, None)
            Gc, evals = found.neighbourhoods, evals + found.evaluations
        for it in loop:
            scaled = means.scaled
            found = means.search(Gc, kernel_key(entropy, "estep", it), cfg.extra_random, sigma2)
            Gc, e, changed, update = found.neighbourhoods, found.evaluations, found.changed, found.m_step
            if sigma2 is None:  # eq. 8: σ² from the first search, before any posterior
                sigma2 = max(found.least_cost / (D * total_w), floor)
                update = means.posteriors(sigma2)
            data_f, active = update.data_f, update.active
            f = data_f if scaled else free_energy(data_f, sigma2, total_w, D, C)
            used = sigma2
            if tied:
                sigma2 = new_sigma2(update.resid, D, total_w, floor)
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
        misfit = means.misfit
    phases["em"] = time.perf_counter() - t0
    phases["em_cpu"] = time.process_time() - cpu0  # this process's CPU: the EM's when it runs in-process
    return EMResult(mu, sigma2, f, evals, mixture, misfit)


def initial_mixture(cfg, n_features):
    """σ² (a float, for the isotropic model) or the other models' (σ² (C, D), π) from ``precisions_init`` and
    ``weights_init``; None: σ² from the first search."""
    if cfg.precisions_init is None:
        return None
    C = cfg.n_clusters
    if isotropic(cfg):
        return float(1.0 / np.asarray(cfg.precisions_init, np.float64))
    weights = np.full(C, 1.0 / C) if cfg.weights_init is None else np.asarray(cfg.weights_init, np.float64)
    var = covariance(cfg.covariance_type).from_precisions(cfg.precisions_init, C, n_features)
    return var, weights / weights.sum()


def kernel_key(entropy, *tag):
    """The seed of the kernels' row-keyed stream (``kernels.streams``) for ``tag`` ("K": K^(n), "G": G_c)."""
    return int(stream(entropy, "vcgmm", *tag).integers(2**63))
