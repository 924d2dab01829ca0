"""The Gaussian family: one class per covariance type, holding everything that differs between them (the
M-step's covariances, the costs' metric, the shapes of scikit-learn's attributes, the parameter count, the
checks of a given or stored model, sampling). The truncated EM (``truncated_em.py``) and the fitted
``MixtureModel`` reach the types only through ``covariance(name)``; nothing else compares a
``covariance_type`` string.

The diagonal types keep their variances as σ² (C, D) (a spherical component repeats σ²_c along d,
"tied-spherical" one σ² everywhere), so their costs −ℓ_c(x) = −log π_c N(x; μ_c, diag σ²_c) and searches
are one code; "full" keeps Σ_c (C, D, D) and "tied" one Σ (D, D), scikit-learn's ``covariances_``, and
their costs are Cholesky-based in float64, −ℓ_c(x) = offset_c + ½ ||(x − μ_c) L_c||² with L_c L_cᵀ = Σ_c⁻¹
(scikit-learn's ``precisions_cholesky_``, upper triangular), offset_c = ½ D log 2π − Σ_d log L_c,dd − log π_c.
"""

import math

import numpy as np
from scipy.linalg import LinAlgError, cholesky, solve_triangular

from ..errors import InputError
from ..kernels.truncated import by_component, cholesky_costs, diagonal_metric, scatter_stats


class CovarianceType:
    """A covariance type: ``name``, whether one σ² is shared by all components (``tied``), and how the
    M-step, scikit-learn's shapes and the checks see its σ² (C, D)."""

    name = ""
    # whether one σ² is set once every component's residual is in (``new_sigma2``), after the M-step
    tied = False
    # what the E-step's Q holds beyond Σ w s and Σ w s x: 1 Σ w s (x_d − μ_cd)² (C, D); 2 Σ w s (x − μ_c)(x −
    # μ_c)ᵀ (C, D, D); 0 nothing the M-step reads (the tied covariance comes from the rows' scatter)
    moments = 1
    # whether the M-step reads the rows' scatter about their mean (``Family.scatter``)
    needs_scatter = False
    # what init="auto" starts a mixture of this type with (None: a seeder's means, ``seeding_method``)
    auto_start = None
    # whether ``split_merge`` may move this type's components: it ranks them (``split_rank``), and merges
    # and splits them (``moved``)
    splits = False
    # the components above which a mixture's fit is measured to need more (``Diag.starts``, ``Full.coreset_rows``)
    many_components = 256
    # coreset_starts="auto" (GaussianMixture's default): the starts whose best is measured at scikit-learn's
    # likelihood or above (BENCHMARKS.md)
    coreset_starts = 3
    # split_merge="auto" (GaussianMixture's default): the moves a fit of this type tries
    moves = 0

    def starts(self, n_clusters):
        """coreset_starts="auto" resolved for a mixture of ``n_clusters`` components."""
        return self.coreset_starts

    def coreset_rows(self, n_features, n_clusters):
        """The default coreset's rows per component (``default_size``): the paper's 64."""
        return 64

    def var_shape(self, n_clusters, n_features):
        """The shape of the model's variances as the EM keeps them."""
        return (n_clusters, n_features)

    def isotropic_var(self, sigma2, n_clusters, n_features):
        """The variances of the isotropic model σ² I, the first search's (each type's first M-step starts there)."""
        return np.full(self.var_shape(n_clusters, n_features), sigma2)

    def m_step(self, var, Q, U, won, new, old, family, total_weight):
        """Step 6's variances, row-wise (a shard of the components gives the bits of the whole): the residuals
        Σ w s (x_d − μ^new_cd)² = Q_cd − U_c (μ^new_cd − μ^old_cd)², Q about the old means (no cancellation),
        as ``variances`` sets them, floored. Returns (variances, each component's Σ_d residual)."""
        resid = np.maximum(Q - U[:, None] * (new - old) ** 2, 0.0)
        var = var.copy()
        self.variances(var, resid, U, won, family.reg_covar)
        np.maximum(var, family.floor, out=var)
        return var, resid.sum(axis=1)

    def metric(self, var, weights):
        """What the search's costs read: (h, offset) with −ℓ_c(x) = offset_c + Σ_d h_cd (x_d − μ_cd)²."""
        return diagonal_metric(var, weights)

    def h_max(self, h):
        """An upper bound of −ℓ_c(x) − offset_c per unit of ||x − μ_c||² (``pair_grid``'s range)."""
        return np.max(h, initial=0.0)

    def mean_variance(self, var):
        """The mean variance over components and features (σ² of the isotropic model a given one starts)."""
        return float(np.mean(var))

    def from_precisions(self, precisions, n_clusters, n_features):
        """The variances from scikit-learn's ``precisions_init`` (checked, in this type's shape)."""
        var = 1.0 / np.asarray(precisions, np.float64)
        return np.broadcast_to(var.reshape(var.shape + (1,) * (2 - var.ndim)), (n_clusters, n_features)).copy()

    def precisions(self, var):
        """scikit-learn's ``precisions_``."""
        return 1.0 / np.asarray(self.covariances(var))

    def precisions_cholesky(self, var):
        """scikit-learn's ``precisions_cholesky_``."""
        return 1.0 / np.sqrt(self.covariances(var))

    def draw(self, rng, mu, var, c, n):
        """n rows of component c, x ~ N(μ_c, Σ_c)."""
        return mu[c] + np.sqrt(var[c]) * rng.standard_normal((n, len(mu[c])))

    def check_precisions(self, p):
        """A given ``precisions_init`` of this type's shape: the problem, or None."""
        return None if (p > 0).all() else "precisions_init must be positive"

    def log_volume(self, var):
        """log det Σ_c per component (C,): the volume a component spreads over (``split_rank``)."""
        return np.log(var).sum(axis=1)

    def diagonal(self, var):
        """The variances along each feature, (C, D)."""
        return var

    def misfit(self, U, Q, fourth, inv, offset, n_features):
        """How far each component's rows depart from its Gaussian, as this type measures it from an E-step's
        statistics (U = Σ w s, Q as ``moments`` says, ``fourth``: Σ w s r⁴ where the E-step sums it; the costs'
        scale ``inv`` and offsets, empty for squared distances): None, for the types that measure nothing."""
        return None

    def split_rank(self, var, misfit):
        """Which component ``split_merge`` splits first (the highest): the widest, log det Σ_c (a diagonal
        component spanning two clusters holds the gap between them); ``misfit``: each component's
        (``misfit``), None for the types that measure nothing."""
        return self.log_volume(var).astype(np.float64)

    def moved(self, var, i, j, k, delta_i, delta_j, share_i):
        """The variances after a move (``split_merge.moved``): components i and j merged into i (``merged``),
        k split into j and k (``split``); and the split means' offset from μ_k."""
        new = var.copy()
        new[i] = self.merged(var, i, j, delta_i, delta_j, share_i)
        offset, half = self.split(var, k)
        new[j] = new[k] = half
        return new, offset

    def merged(self, var, i, j, delta_i, delta_j, share_i):
        """Σ of components i and j as one: the moments of their two-component mixture, Σ = p (Σ_i + δ_i δ_iᵀ) +
        (1 − p)(Σ_j + δ_j δ_jᵀ), with δ the offsets of their means from the merged one and p = π_i / (π_i + π_j)."""
        return share_i * (var[i] + delta_i**2) + (1 - share_i) * (var[j] + delta_j**2)

    def split(self, var, k):
        """Component k as its two halves along the axis u of its largest variance λ (``split_merge``): (their
        means' offsets ± √(2λ/π) u from μ_k, their Σ = Σ_k − (2/π) λ u uᵀ), the moments of N(μ_k, Σ_k) cut in
        two at μ_k, so that the two, with half the weight each, have the mean and Σ of the one."""
        d = int(np.argmax(var[k]))
        half = var[k].copy()
        half[d] *= 1 - 2 / math.pi
        offset = np.zeros(len(half))
        offset[d] = math.sqrt(2 * var[k, d] / math.pi)
        return offset, half

    def variances(self, var, resid, U, won, reg_covar):
        """Step 6 for the components that won rows: σ² from each one's residuals resid (C, D) = Σ w s (x_d −
        μ_cd)² and U_c = Σ w s, plus ``reg_covar`` (scikit-learn's meaning), into ``var`` in place. Row-wise:
        the components of a shard give the bits of the whole."""
        raise NotImplementedError

    def n_variances(self, n_clusters, n_features):
        """Free variance parameters."""
        raise NotImplementedError

    def precision_shape(self, n_clusters, n_features):
        """The shape of scikit-learn's ``precisions_init`` and ``covariances_`` for this type."""
        raise NotImplementedError

    def covariances(self, var):
        """scikit-learn's ``covariances_`` from σ² (C, D)."""
        raise NotImplementedError

    def check_variances(self, var):
        """A stored model's variances, finite and of the type's shape: the problem with them, or None."""
        return None if (var > 0).all() else "variances_ must be positive"


class Diag(CovarianceType):
    """diag(σ²_c1 … σ²_cD) per component."""

    name = "diag"
    splits = True
    # the split-and-merge moves did better than three starts (BENCHMARKS.md), at one seeding's cost
    coreset_starts = 1
    moves = 8
    # above this many components eight moves mend too few of the EM's optima: at C = 1,024, D = 32 one start
    # left a seed 0.12 nats a row below scikit-learn's (the mean 0.02 below); three starts took every seed
    # to within 0.03 of it (the mean 0.04 above) for 40 % more time, where 24 more moves had gained less at
    # three times the cost. At C = 256 one start holds the line on every seed measured (``many_components``)

    def starts(self, n_clusters):
        return 3 if n_clusters > self.many_components else self.coreset_starts

    def variances(self, var, resid, U, won, reg_covar):
        var[won] = resid[won] / U[won, None] + reg_covar

    def n_variances(self, n_clusters, n_features):
        return n_clusters * n_features

    def precision_shape(self, n_clusters, n_features):
        return (n_clusters, n_features)

    def covariances(self, var):
        return var


class Spherical(CovarianceType):
    """σ²_c I per component: the mean of the residuals over the dimensions."""

    name = "spherical"

    def variances(self, var, resid, U, won, reg_covar):
        var[won] = (resid[won].mean(axis=1) / U[won] + reg_covar)[:, None]

    def n_variances(self, n_clusters, n_features):
        return n_clusters

    def precision_shape(self, n_clusters, n_features):
        return (n_clusters,)

    def covariances(self, var):
        return var[:, 0].copy()

    def check_variances(self, var):
        problem = super().check_variances(var)
        if problem is None and not (var == var[:, :1]).all():
            return f"variances_ of a {self.name!r} mixture must be equal across features"
        return problem


class TiedSpherical(Spherical):
    """One σ² I shared by all components (vc-GMM's): set once every component's residual is in
    (``new_sigma2``), not per component."""

    name = "tied-spherical"
    tied = True

    def variances(self, var, resid, U, won, reg_covar):
        pass

    def n_variances(self, n_clusters, n_features):
        return 1

    def precision_shape(self, n_clusters, n_features):
        return ()

    def covariances(self, var):
        return float(var[0, 0])

    def check_variances(self, var):
        problem = super().check_variances(var)
        if problem is None and not (var == var[0, 0]).all():
            return f"variances_ of a {self.name!r} mixture must be one value"
        return problem


def precision_cholesky(cov):
    """L (…, D, D), upper triangular with L Lᵀ = Σ⁻¹, for each Σ (…, D, D) (scikit-learn's
    ``_compute_precision_cholesky``: Σ = A Aᵀ, L = A⁻ᵀ); a Σ not positive definite is refused in one line."""
    cov = np.asarray(cov, np.float64)
    flat = cov.reshape((-1,) + cov.shape[-2:])
    out = np.empty_like(flat)
    eye = np.eye(cov.shape[-1])
    for c, sigma in enumerate(flat):
        try:
            lower = cholesky(sigma, lower=True)
        except LinAlgError:
            raise InputError(
                f"the covariance of component {c} is not positive definite (a component on too few distinct rows, "
                "or collinear features): increase reg_covar"
            ) from None
        out[c] = solve_triangular(lower, eye, lower=True).T
    return out.reshape(cov.shape)


def symmetric(a):
    """(a + aᵀ) / 2 over the last two axes: a weighted outer product rounds (w a_i) a_j and (w a_j) a_i
    differently, and an inverse is symmetric only to rounding; a covariance must be symmetric to the bit."""
    return 0.5 * (a + np.swapaxes(a, -1, -2))


def per_component(total, U, n):
    """total_c / (U_c n) for the components that won rows, 1 for the others."""
    out = np.ones(len(U))
    won = U > 0
    out[won] = total[won] / (U[won] * n)
    return out


def floored(cov, family):
    """Σ + reg_covar I (scikit-learn's), its diagonal floored as the diagonal types' variances are."""
    d = np.arange(cov.shape[-1])
    cov[..., d, d] = np.maximum(cov[..., d, d] + family.reg_covar, family.floor)
    return cov


class Matrix(CovarianceType):
    """The types with a covariance matrix ("full", "tied"): Cholesky-based costs, scikit-learn's shapes for
    ``covariances_`` and the precisions; the variances as the EM keeps them are those shapes. They start as
    scikit-learn's do, from one M-step on the k-means cells: from seeded means alone the first search's one σ²
    leaves the matrices to the EM, which settled in worse basins (300k x 32, C = 64, held-out log-likelihood
    per row: full −60.88 against −60.57 from k-means, tied −69.87 against −69.05; scikit-learn −60.73 and the
    like; benchmarks/bench_mixtures.py --types full,tied)."""

    auto_start = "kmeans"

    def isotropic_var(self, sigma2, n_clusters, n_features):
        return sigma2 * np.broadcast_to(np.eye(n_features), self.var_shape(n_clusters, n_features)).copy()

    def metric(self, var, weights):
        """(Lᵀ (C, D, D), or (1, D, D) shared, offset (C,)): −ℓ_c(x) = offset_c + ½ ||(x − μ_c) L_c||², with
        the factors transposed (lower triangular) for the kernels' contiguous dot products."""
        L = precision_cholesky(var).reshape((-1,) + var.shape[-2:])
        D = var.shape[-1]
        log_det = np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
        with np.errstate(divide="ignore"):
            offset = 0.5 * D * math.log(2 * math.pi) - log_det - np.log(weights)
        return np.ascontiguousarray(np.swapaxes(L, 1, 2)), offset

    def h_max(self, h):
        # ½ ||v L||² <= ½ ||L||_F² ||v||²
        return 0.5 * float(np.max((h * h).sum(axis=(1, 2)), initial=0.0))

    def mean_variance(self, var):
        return float(np.mean(np.diagonal(var, axis1=-2, axis2=-1)))

    def from_precisions(self, precisions, n_clusters, n_features):
        return symmetric(np.linalg.inv(np.asarray(precisions, np.float64)))

    def covariances(self, var):
        return var

    def precisions(self, var):
        L = self.precisions_cholesky(var)
        return L @ np.swapaxes(L, -1, -2)

    def precisions_cholesky(self, var):
        return precision_cholesky(var)

    def check_variances(self, var):
        if not np.array_equal(var, np.swapaxes(var, -1, -2)):
            return f"variances_ of a {self.name!r} mixture must be symmetric"
        try:
            precision_cholesky(var)
        except InputError:
            return f"variances_ of a {self.name!r} mixture must be positive definite"
        return None

    def check_precisions(self, p):
        if not np.allclose(p, np.swapaxes(p, -1, -2)):  # scikit-learn's test and tolerance
            return "precisions_init must be symmetric"
        if not (np.linalg.eigvalsh(p) > 0).all():
            return "precisions_init must be positive definite"
        return None


class Full(Matrix):
    """Σ_c per component (C, D, D): Σ_c = Σ w s (x − μ_c)(x − μ_c)ᵀ / U_c + reg_covar I."""

    name = "full"
    moments = 2
    splits = True
    # one start and four moves, split by kurtosis (``split_rank``): six starts all missed the basin of a
    # 300k x 64, C = 64 seed (0.148 nats a row below scikit-learn's likelihood) and the moves split by
    # volume did not leave it; split by kurtosis they took it to 0.108 above. Each move costs an EM on the
    # coreset (1 to 1.5 s there): with eight the five seeds' mean was 4.1x scikit-learn's speed, with four
    # 6.0x, the same worst seed (BENCHMARKS.md)
    coreset_starts = 1
    moves = 4

    def var_shape(self, n_clusters, n_features):
        return (n_clusters, n_features, n_features)

    def coreset_rows(self, n_features, n_clusters):
        """Half a row per free parameter of a component (its mean and Σ_c), at least the paper's 64; one row per
        parameter above ``many_components``. With 128 a component (the paper's 2^15 rows at C = 256, D = 32:
        560 parameters each) the coreset's mixture was 9.3 nats a row short and the refine on every row ended
        0.12 below scikit-learn's; with 280, 0.095 above it, at 14.7x its speed; one row per parameter gained
        no more and, at C = 64, D = 64, cost the 5x. At C = 1,024, D = 16, half a row left the refine 0.04
        below scikit-learn's on average (a seed 0.08; three starts or eight moves no better), one row 0.03
        above it, at 30x its speed (300k rows, benchmarks/bench_mixtures.py --types full)."""
        parameters = n_features * (n_features + 3) // 2
        return max(64, parameters if n_clusters > self.many_components else parameters // 2)

    def log_volume(self, var):
        return np.linalg.slogdet(var)[1]

    def diagonal(self, var):
        return np.diagonal(var, axis1=1, axis2=2)

    def misfit(self, U, Q, fourth, inv, offset, n_features):
        """Mardia's multivariate kurtosis of each component's rows, Σ w s r⁴ / (U_c D (D + 2)) with r² the
        squared Mahalanobis distance to μ_c under the Σ_c of the E-step (K. V. Mardia, Biometrika 57(3), 1970):
        1 for rows that are Gaussian, above it for a component whose rows hold a smaller cluster apart from its
        own (the heavy tail of their distances), below it for one spanning two clusters alike (bimodal). 1 for
        a component no row reaches."""
        return per_component(fourth[0], U, n_features * (n_features + 2))

    def split_rank(self, var, misfit):
        """How far Mardia's kurtosis (``misfit``) is from a Gaussian's, |log b|: above 1 for a component that
        swallowed a smaller cluster, below for one that spans two alike. A full component of the first kind is
        not the widest when the clusters' scales differ (300k x 64, C = 64, seed 3: the two such components
        ranked 5th and 19th by log det Σ, 1st and 2nd by kurtosis, 1.17 and 1.08 against 1.00 for the rest).
        A component whose rows all sit at its mean (b = 0: collapsed on one row, or on copies of one) ranks
        last: there is nothing to cut, and at the top it took every move (300k x 16, C = 64, seed 0)."""
        if misfit is None:
            return super().split_rank(var, misfit)
        rank = np.full(len(misfit), -np.inf)
        spread = misfit > 0
        rank[spread] = np.abs(np.log(misfit[spread]))
        return rank

    def merged(self, var, i, j, delta_i, delta_j, share_i):
        outer_i, outer_j = np.outer(delta_i, delta_i), np.outer(delta_j, delta_j)
        return symmetric(share_i * (var[i] + outer_i) + (1 - share_i) * (var[j] + outer_j))

    def split(self, var, k):
        lam, vecs = np.linalg.eigh(var[k])
        u, lam = vecs[:, -1], float(lam[-1])
        return math.sqrt(2 * lam / math.pi) * u, symmetric(var[k] - (2 / math.pi) * lam * np.outer(u, u))

    def m_step(self, var, Q, U, won, new, old, family, total_weight):
        # Σ w s (x − μ^new)(x − μ^new)ᵀ = Q − U (μ^new − μ^old)(μ^new − μ^old)ᵀ, Q about the old means
        shift = new - old
        resid = symmetric(Q - U[:, None, None] * shift[:, :, None] * shift[:, None, :])
        var = var.copy()
        var[won] = floored(resid[won] / U[won, None, None], family)
        return var, np.trace(resid, axis1=1, axis2=2)

    def n_variances(self, n_clusters, n_features):
        return n_clusters * n_features * (n_features + 1) // 2

    def precision_shape(self, n_clusters, n_features):
        return (n_clusters, n_features, n_features)

    def draw(self, rng, mu, var, c, n):
        return mu[c] + rng.standard_normal((n, len(mu[c]))) @ cholesky(var[c], lower=True).T


class Tied(Matrix):
    """One Σ (D, D) shared by every component: Σ = Σ_c Σ w s (x − μ_c)(x − μ_c)ᵀ / Σw + reg_covar I. Every
    row's posteriors sum to 1, so that sum is the rows' scatter S about their mean m less Σ_c U_c (μ_c − m)
    (μ_c − m)ᵀ: S is the data's, taken once (``Family.scatter``), and the E-step adds nothing for it."""

    name = "tied"
    moments = 0
    needs_scatter = True
    splits = True
    # three starts and four moves: the moves relocate a mean and its weight, which no EM step does (a shared
    # Σ leaves nothing to widen). Six starts without moves left 300k x 64, C = 16, seed 4 0.98 nats a row below
    # scikit-learn's likelihood, and three 300k x 64, C = 64 0.6 below; one start with 4, 8 or 16 moves left
    # a seed of C = 16, D = 64 1.28 below; three with four held every seed of the grid C 16 to 256, D 16 to 64
    # (BENCHMARKS.md)
    coreset_starts = 3
    moves = 4

    def var_shape(self, n_clusters, n_features):
        return (n_features, n_features)

    def diagonal(self, var):
        return np.diagonal(var)[None, :]

    def misfit(self, U, Q, fourth, inv, offset, n_features):
        """Each component's rows' mean squared Mahalanobis distance to μ_c under the shared Σ, per feature,
        Σ w s r² / (U_c D), from Q = Σ w s cost (r² = 2 inv (cost − offset_c)): 1 on average over the
        components (Σ is their rows' mean scatter), above it for a component whose rows spread further than
        Σ says, as one spanning two clusters does. 1 for a component no row reaches."""
        with np.errstate(invalid="ignore"):  # 0 · ∞: a component of weight 0, which no row reaches
            half_r2 = Q[:, 0] - U * offset if len(offset) else Q[:, 0]
        return per_component(2 * inv * half_r2, U, n_features)

    def split_rank(self, var, misfit):
        """The component spreading furthest beyond the shared Σ (``misfit``)."""
        return np.log(misfit)

    def moved(self, var, i, j, k, delta_i, delta_j, share_i):
        """The shared Σ as it is; component k split along its axis u of largest variance λ (as ``Full.split``):
        no component's own spread is known to cut."""
        lam, vecs = np.linalg.eigh(var)
        return var.copy(), math.sqrt(2 * float(lam[-1]) / math.pi) * vecs[:, -1]

    def m_step(self, var, Q, U, won, new, old, family, total_weight):
        scatter, mean = family.scatter
        about = new - mean
        resid = symmetric(scatter - (U[:, None] * about).T @ about)
        return floored(resid / total_weight, family), np.zeros(len(U))

    def n_variances(self, n_clusters, n_features):
        return n_features * (n_features + 1) // 2

    def precision_shape(self, n_clusters, n_features):
        return (n_features, n_features)

    def draw(self, rng, mu, var, c, n):
        return mu[c] + rng.standard_normal((n, len(mu[c]))) @ cholesky(var, lower=True).T


# in ``COVARIANCE_TYPES``' order (the configs validate the name against it)
TYPES = {t.name: t() for t in (TiedSpherical, Spherical, Diag, Full, Tied)}


def covariance(name):
    """The ``CovarianceType`` called ``name`` (one of ``COVARIANCE_TYPES``)."""
    return TYPES[name]


def own_model(covariance_type, weights):
    """Whether a mixture is vc-GMM's own model: one σ² and equal weights (its searches rank clusters by
    squared distance, and nothing of it is learned but the means and σ²)."""
    return covariance(covariance_type).tied and weights == "equal"


def n_parameters(covariance_type, weights, n_clusters, n_features):
    """Free parameters: the means, the variances and the weights (C − 1 when learned)."""
    var = covariance(covariance_type).n_variances(n_clusters, n_features)
    return n_clusters * n_features + var + (n_clusters - 1 if weights == "learned" else 0)


def check_precisions_init(precisions, covariance_type, n_clusters, n_features):
    """A given ``precisions_init`` against the type's shape: the problem, or None."""
    want = covariance(covariance_type).precision_shape(n_clusters, n_features)
    p = np.asarray(precisions, np.float64)
    if p.shape != want:
        return f"precisions_init has shape {p.shape}; covariance_type={covariance_type!r} takes shape {want}"
    return covariance(covariance_type).check_precisions(p)


def component_costs(x, rows, ids, mu, Lt, offset, out):
    """−ℓ_c(x) = offset_c + ½ ||(x − μ_c) L_c||² of entries (row, component): x (n, D); rows, ids: each entry's
    row of x and component; Lt: the metric's L_cᵀ (C, D, D), or (1, D, D) shared; out: float64 (entries,)."""
    cholesky_costs(x, rows, *by_component(ids, len(mu)), mu, Lt, offset, out)


def component_scatter(x, rows, ids, weights, mu, Q):
    """Q_c += Σ weight (x − μ_c)(x − μ_c)ᵀ over entries (row, component, weight)."""
    scatter_stats(x, rows, weights, *by_component(ids, len(mu)), mu, Q)
