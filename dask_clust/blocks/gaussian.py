"""The Gaussian family: one class per covariance type, holding everything that differs between them (the
M-step's variances, the shapes of scikit-learn's attributes, the parameter count, the checks of a given or
stored model). The truncated EM (``algorithms/vcgmm.py``) and the fitted ``MixtureModel`` reach the types
only through ``covariance(name)``; nothing else compares a ``covariance_type`` string.

A model keeps its variances as σ² (C, D) whatever the type (a spherical component repeats σ²_c along d,
the tied type one σ² everywhere), so the costs −ℓ_c(x) = −log π_c N(x; μ_c, diag σ²_c) and the searches
are the same code for every type; a type says how the M-step sets them and how they look from outside.
"""

import numpy as np


class CovarianceType:
    """A covariance type: ``name``, whether one σ² is shared by all components (``tied``), and how the
    M-step, scikit-learn's shapes and the checks see its σ² (C, D)."""

    name = ""
    tied = False

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
        """A stored model's σ² (C, D), already finite and positive: the problem with it, or None."""
        return None


class Diag(CovarianceType):
    """diag(σ²_c1 … σ²_cD) per component."""

    name = "diag"

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
        if not (var == var[:, :1]).all():
            return f"variances_ of a {self.name!r} mixture must be equal across features"
        return None


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
        if not (var == var[0, 0]).all():
            return f"variances_ of a {self.name!r} mixture must be one value"
        return None


# in ``COVARIANCE_TYPES``' order (the configs validate the name against it)
TYPES = {t.name: t() for t in (TiedSpherical, Spherical, Diag)}


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
    if not (p > 0).all():
        return "precisions_init must be positive"
    return None
