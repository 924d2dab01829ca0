"""MixtureModel: a fitted Gaussian mixture with per-component variances or learned weights (vc-GMM's
``covariance_type`` "spherical", "diag", "full" and "tied", or weights="learned"), its likelihoods and its
files.

p(x) = Σ_c π_c N(x; μ_c, Σ_c). Everything below reads the components through their costs −ℓ_c(x) =
−log π_c N(x; μ_c, Σ_c) (``MixtureCosts``): a row's label is its component of largest ℓ, its posteriors
a softmax of ℓ over its C' likeliest components, its log-likelihood log Σ_c exp ℓ_c(x) (over all C when
asked: O(C·D) per row; else over those C', a lower bound, as the fit's free energy). Saved as every model
is (``ClusteringModel.save``), with "model": "mixture" in model.json and a schema of its own: variances
finite and positive (one per component for "spherical", one for all for "tied-spherical", symmetric positive
definite matrices for "full" and "tied"), weights non-negative and summing to 1.
"""

import math
from typing import NamedTuple

import dask
import dask.array as da
import numpy as np

from ._params import COVARIANCE_TYPES
from ._random import check_random_state
from .blocks.gaussian import component_costs, covariance, n_parameters
from .blocks.truncated_em import mixture_m_step, new_sigma2
from .engine.data import as_dask_rows, check_finite_block, is_frame, is_pandas, map_rows, unit_rows
from .errors import InputError
from .kernels.assign import is_csr, squared_distances, squared_distances_to
from .models import PROBA_BLOCK_BYTES, ClusteringModel, checked_frame_rows

# the weights must sum to 1 within this (a model's π are U_c / Σw, rounded once each)
WEIGHTS_SUM_TOL = 1e-9


class MixtureCosts:
    """The components' costs −ℓ_c(x) (+∞ for a component of weight 0), from the covariance type's metric
    (``CovarianceType.metric``): diagonal, offset_c + Σ_d h_cd (x_d − μ_cd)² with h = 1/2σ², offset_c =
    ½ Σ_d log 2πσ²_cd − log π_c; or a matrix's, offset_c + ½ ||(x − μ_c) L_c||² (Cholesky-based, float64)."""

    def __init__(self, covariance_type, mu, var, weights):
        self.mu = mu
        self.h, self.offset = covariance(covariance_type).metric(var, weights)
        if self.h.ndim == 2:
            self._hmu = self.h * mu
            self._const = (self._hmu * mu).sum(axis=1) + self.offset

    def _spherical_scales(self, x):
        """For CSR rows: each component's one h (the metric of a spherical model, whose cost is offset_c +
        h_c ||x − μ_c||², by the expansion from a row's non-zeros); other models read dense rows."""
        if self.h.ndim != 2 or not np.all(self.h == self.h[:, :1]):
            raise InputError("sparse rows are read by the isotropic models only (one variance a component)")
        return self.h[:, 0]

    def costs(self, x):
        """−ℓ of rows x for every component, (n, C) float64: diagonal ones in the GEMM form (as scikit-learn's),
        a matrix's component by component, O(C·D²) a row (as scikit-learn's); CSR rows' by the expansion."""
        if is_csr(x):
            return self.offset + self._spherical_scales(x) * squared_distances(x, self.mu)
        x = np.asarray(x, np.float64)
        if self.h.ndim == 3:
            n, C = len(x), len(self.mu)
            out = np.empty((n, C))
            ids = np.repeat(np.arange(C, dtype=np.int32)[None, :], n, axis=0)
            component_costs(x, np.repeat(np.arange(n), C), ids.ravel(), self.mu, self.h, self.offset, out.ravel())
            return out
        out = (x * x) @ self.h.T
        out -= 2.0 * (x @ self._hmu.T)
        out += self._const
        return out

    def costs_of(self, x, ids):
        """−ℓ of each row for its components ``ids`` (n, m), directly: no cancellation between the terms (CSR
        rows: by the expansion from their non-zeros)."""
        if is_csr(x):
            return self.offset[ids] + self._spherical_scales(x)[ids] * squared_distances_to(x, self.mu, ids)
        x = np.asarray(x, np.float64)
        out = np.empty(ids.shape)
        if self.h.ndim == 3:
            rows = np.repeat(np.arange(len(x)), ids.shape[1])
            component_costs(x, rows, ids.ravel(), self.mu, self.h, self.offset, out.reshape(-1))
            return out
        for j in range(ids.shape[1]):
            c = ids[:, j]
            out[:, j] = self.offset[c] + (self.h[c] * (x - self.mu[c]) ** 2).sum(axis=1)
        return out


def truncated_ids_block(x, C, n_truncated, mixture=None, block_info=None):
    """Each row's ``n_truncated`` nearest means (int32, nearest first), or its likeliest components given a
    mixture's costs (``mixture.MixtureCosts``), in sub-blocks whose rows × C float64 distances stay within
    PROBA_BLOCK_BYTES whatever C is."""
    check_finite_block(x, block_info)
    x = x if is_csr(x) else np.ascontiguousarray(x)
    n, k = x.shape[0], C.shape[0]
    ids = np.empty((n, n_truncated), np.int32)
    rows = max(1, PROBA_BLOCK_BYTES // (8 * k))
    buf = np.empty((min(n, rows), k))
    for b0 in range(0, n, rows):
        d2 = buf[: min(rows, n - b0)]
        if mixture is None:
            squared_distances(x[b0 : b0 + rows], C, d2)
        else:
            d2[:] = mixture.costs(x[b0 : b0 + rows])
        top = (
            np.argpartition(d2, n_truncated - 1, axis=1)[:, :n_truncated]
            if n_truncated < k
            else np.broadcast_to(np.arange(k), d2.shape)
        )
        order = np.argsort(np.take_along_axis(d2, top, 1), axis=1, kind="stable")
        ids[b0 : b0 + len(d2)] = np.take_along_axis(top, order, 1)
    return ids


def _truncated_proba_block(x, ids, C, sigma2, mixture=None):
    """softmax over a row's truncated set of −d²/(2σ²) (or of ℓ, given a mixture's costs), in float64 from
    the rows themselves."""
    if mixture is not None:
        a = -mixture.costs_of(x, ids)
    else:
        a = squared_distances_to(x, C, ids)
        a *= -0.5 / sigma2
    e = np.exp(a - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _frame_posteriors(frame, C, sigma2, n_truncated, mixture, unit=False, partition_info=None):
    """A DataFrame partition's truncated posteriors as a DataFrame on its index (``_posterior_frame``);
    ``unit``: of its rows on the unit sphere (a spherical model's)."""
    x = checked_frame_rows(frame, partition_info)
    x = unit_rows(x) if unit else x
    ids = truncated_ids_block(x, C, n_truncated, mixture)
    return _posterior_frame(ids, _truncated_proba_block(x, ids, C, sigma2, mixture), frame.index)


def _posterior_frame(ids, p, index):
    """component_1 .. component_C' and probability_1 .. probability_C' columns (likeliest first)."""
    import pandas as pd

    columns = {f"component_{j + 1}": ids[:, j] for j in range(ids.shape[1])}
    columns.update({f"probability_{j + 1}": p[:, j] for j in range(p.shape[1])})
    return pd.DataFrame(columns, index=index)


def _dense_block(ids, p, n_clusters):
    out = np.zeros((ids.shape[0], n_clusters))
    np.put_along_axis(out, ids, p, 1)
    return out


# bytes of the rows × C cost block of the exact log-likelihood: its GEMM and log-sum-exp stay in cache (20,000
# rows x 2,048 components: 0.24 s in blocks of 4 MB, 0.5 s of 32 MB, 2.2 s in one)
SCORE_BLOCK_BYTES = 4 << 20


def log_likelihood(costs):
    """log Σ_c exp(−cost_c) per row of costs −ℓ: the rows' log-likelihood over those components."""
    low = costs.min(axis=1, keepdims=True)
    return -low[:, 0] + np.log(np.exp(low - costs).sum(axis=1))


def _score_block(x, mixture, n_truncated, block_info=None):
    """Per-row log-likelihood: over every component (``n_truncated`` None), in row blocks of
    SCORE_BLOCK_BYTES, or over the row's ``n_truncated`` likeliest (a lower bound)."""
    check_finite_block(x, block_info)
    x = x if is_csr(x) else np.ascontiguousarray(x)
    if n_truncated is not None:
        ids = truncated_ids_block(x, mixture.mu, n_truncated, mixture)
        return log_likelihood(mixture.costs_of(x, ids))
    rows = max(1, SCORE_BLOCK_BYTES // (8 * len(mixture.mu)))
    return np.concatenate([log_likelihood(mixture.costs(x[b : b + rows])) for b in range(0, x.shape[0], rows)] or [[]])


class Stepwise(NamedTuple):
    """Stepwise EM's statistics (``GaussianMixture.partial_fit``), per unit of weight and taken about fixed
    centres ``ref`` (the starting means), so that the M-step's residual S2 − S1²/U cancels little while the
    means stay near them: U_c = E[r_c], S1_c = E[r_c (x − ref_c)], S2_c = E[r_c (x − ref_c)²] (C, D), and the
    batches taken so far. A batch's own sums are in the GEMM form, as scikit-learn's M-step."""

    ref: np.ndarray
    U: np.ndarray
    S1: np.ndarray
    S2: np.ndarray
    steps: int


def batch_statistics(x, w, mixture, ref, moments=1):
    """ŝ of a batch: its expected statistics per unit of weight under ``mixture`` (``MixtureCosts``), with
    every component's posterior, in row blocks of PROBA_BLOCK_BYTES: (U, S1, S2) as ``Stepwise``'s, S2 as
    the type's M-step reads it (``CovarianceType.moments``): per dimension (C, D), the scatter about each
    ref_c (C, D, D), or the rows' scatter about the refs' mean (D, D), whose posteriors sum to 1."""
    C, D = ref.shape
    U, S1 = np.zeros(C), np.zeros((C, D))
    S2 = np.zeros(((D, D), (C, D), (C, D, D))[moments])
    about = ref.mean(axis=0)
    rows = max(1, PROBA_BLOCK_BYTES // (8 * C))
    for a in range(0, len(x), rows):
        xb = np.asarray(x[a : a + rows], np.float64)
        costs = mixture.costs(xb)
        r = np.exp(costs.min(axis=1, keepdims=True) - costs)
        r *= (w[a : a + rows] / r.sum(axis=1))[:, None]
        u = r.sum(axis=0)
        rx = r.T @ xb
        U += u
        S1 += rx - u[:, None] * ref
        if moments == 1:
            S2 += r.T @ (xb * xb) - 2.0 * rx * ref + u[:, None] * ref * ref
        elif moments == 2:
            for c in range(C):
                v = xb - ref[c]
                S2[c] += (v * r[:, c, None]).T @ v
        else:
            v = xb - about
            S2 += (v * w[a : a + rows, None]).T @ v
    total = float(np.sum(w))
    return U / total, S1 / total, S2 / total


def stepwise_step(state, x, w, mixture, family, decay):
    """One step of stepwise EM (O. Cappé & E. Moulines, "On-line expectation-maximization algorithm for latent
    data models", JRSS-B 71(3), 2009, eq. (5); in mini-batches as P. Liang & D. Klein, NAACL 2009): the
    statistics move toward the batch's, s_t = s_{t−1} + γ_t (ŝ_t − s_{t−1}) with γ_t = t^−decay (γ_1 = 1:
    the first batch's alone), and the mixture is the M-step of s_t (``mixture_m_step``; a tied σ² pooled).
    ``mixture``: (means, variances (C, D), weights) before the step; ``state``: the last ``Stepwise``, or
    None to start about those means. Returns (the new state, the new mixture)."""
    mu0, var0, weights0 = mixture
    moments = family.cov.moments
    costs = MixtureCosts(family.covariance_type, mu0, var0, weights0)
    ref = np.array(mu0, np.float64) if state is None else state.ref
    gamma = 1.0 if state is None else (state.steps + 1.0) ** -decay
    new = batch_statistics(x, w, costs, ref, moments)
    if state is not None:
        new = tuple((1.0 - gamma) * old + gamma * s for old, s in zip((state.U, state.S1, state.S2), new))
    U, S1, S2 = new
    state = Stepwise(ref, U, S1, S2, 1 if state is None else state.steps + 1)
    total = float(U.sum())
    if family.cov.needs_scatter:
        family = family._replace(scatter=(S2, ref.mean(axis=0)))
    mu, var, weights, resid = mixture_m_step(family, ref, var0, weights0, S1 + U[:, None] * ref, U, S2, total)
    if covariance(family.covariance_type).tied:
        var[:] = new_sigma2(resid, mu.shape[1], total, family.floor)
    return state, (mu, var, weights)


class MixtureModel(ClusteringModel):
    """The model of every probabilistic fit (``AlgorithmSpec.probabilistic``: vc-GMM, var-GMM-S), a fitted
    Gaussian mixture. vc-GMM's own model (one σ², equal weights: no ``covariance_type_`` among its extras) is
    the mixture "tied-spherical" of weights 1/C and σ² = ``sigma2_``, whose likeliest component is the nearest
    mean, so it predicts by the nearest centre as a clustering model does; its ``score`` is a likelihood too.
    Beside a ``ClusteringModel``'s attributes: ``covariance_type``, ``weights_`` (C,), ``means_`` (C, D, the
    centres), ``variances_`` (as the EM keeps them: (C, D) for the diagonal types, else ``covariances_``),
    ``covariances_``, ``precisions_`` and ``precisions_cholesky_`` in scikit-learn's shapes ((C,) "spherical",
    (C, D) "diag", (C, D, D) "full", (D, D) "tied", a float "tied-spherical"), ``lower_bound_`` (the free
    energy per unit of weight: the mean log-likelihood's lower bound on the rows the EM ran on; not for
    vc-GMM's own model, whose ``free_energy_`` is the coreset's)."""

    kind = "mixture"
    FIELDS = ("covariance_type_", "weights_", "variances_", "lower_bound_")

    @property
    def _own(self):
        """Whether this is vc-GMM's own model (one σ², equal weights)."""
        return "covariance_type_" not in self.extras_

    def _takes_sparse(self):
        super()._takes_sparse()
        if not self._own:
            raise InputError(
                f"a {self.covariance_type!r} mixture reads dense rows (sparse rows: vc-GMM's isotropic model only)"
            )

    @property
    def covariance_type(self):
        return self.extras_.get("covariance_type_", "tied-spherical")

    @property
    def weights_(self):
        return np.full(self.n_clusters, 1.0 / self.n_clusters) if self._own else self.extras_["weights_"]

    @property
    def variances_(self):
        if self._own:
            return np.full(self.cluster_centers_.shape, float(self.extras_["sigma2_"]))
        return self.extras_["variances_"]

    @property
    def means_(self):
        return self.cluster_centers_

    @property
    def covariances_(self):
        return covariance(self.covariance_type).covariances(self.variances_)

    @property
    def precisions_cholesky_(self):
        return covariance(self.covariance_type).precisions_cholesky(self.variances_)

    @property
    def precisions_(self):
        return covariance(self.covariance_type).precisions(self.variances_)

    def _costs(self):
        return MixtureCosts(self.covariance_type, self.cluster_centers_, self.variances_, self.weights_)

    def _mixture(self):
        # vc-GMM's own model: the nearest centre, by the exact GEMM kernel
        return None if self._own else self._costs()

    def predict_proba(self, X, output="truncated"):
        """Truncated posteriors: per row, softmax of ℓ_c(x) = log π_c N(x; μ_c, Σ_c) over its C' =
        ``n_truncated_`` likeliest components, zero for every other (vc-GMM's own model: softmax of −d²/(2σ²)
        over its C' nearest means, ties in distance either).

        ``output``: "truncated" (default) gives what they are, two lazy dask arrays (ids, probabilities),
        (n, C') int32 and float64, nearest mean first: 12·C' bytes per row, whatever k is. "sparse": a
        scipy CSR matrix (n, k) computed now (for in-memory sizes). "dense": a lazy (n, k) float64 dask
        array, 8·k bytes per row, almost all zeros (1 M rows at k = 4096: 32 GB).

        A DataFrame with output "truncated" (read by column name, as ``predict``) gives one DataFrame on its
        index, lazy for a dask one: columns component_1 .. component_C' (int32, likeliest first) and
        probability_1 .. probability_C', so the posteriors can be put beside a key column."""
        if output not in ("truncated", "sparse", "dense"):
            raise ValueError(f"output must be 'truncated', 'sparse' or 'dense'; got {output!r}")
        if output == "truncated" and is_frame(X):
            return self._proba_frame(X)
        X = self._input(X)
        k, Cp = self.n_clusters, int(self.extras_["n_truncated_"])
        if output == "dense":  # output blocks of PROBA_BLOCK_BYTES
            rows = max(1, PROBA_BLOCK_BYTES // (8 * k))
            if max(X.chunks[0]) > rows:
                X = X.rechunk({0: rows})
        mixture = self._mixture()
        ids = map_rows(X, truncated_ids_block, np.int32, Cp, self.cluster_centers_, Cp, mixture)
        p = da.map_blocks(
            _truncated_proba_block,
            X,
            ids,
            self.cluster_centers_,
            float(self.extras_["sigma2_"]),
            mixture,
            dtype=np.float64,
            meta=np.empty((0, 0)),
        )
        if output == "truncated":
            return ids, p
        if output == "dense":
            return da.map_blocks(
                _dense_block, ids, p, k, dtype=np.float64, chunks=(X.chunks[0], (k,)), meta=np.empty((0, 0))
            )
        from scipy import sparse

        ids, p = dask.compute(ids, p)
        n = ids.shape[0]
        out = sparse.csr_matrix((p.ravel(), ids.ravel(), np.arange(0, n * Cp + 1, Cp)), shape=(n, k))
        out.sort_indices()
        return out

    def _proba_frame(self, X):
        self._check_frame(X)
        args = (self.cluster_centers_, float(self.extras_["sigma2_"]), int(self.extras_["n_truncated_"]))
        args += (self._mixture(), self._cosine)
        if is_pandas(X):
            return _frame_posteriors(X, *args)
        meta = _posterior_frame(np.empty((0, args[2]), np.int32), np.empty((0, args[2])), X._meta.index)
        return X.map_partitions(_frame_posteriors, *args, meta=meta)

    def _summary(self):
        """The clustering summary, its objective named for what it is (the QE of the means, not the EM's
        free energy, which the progress bar and the history show), with the free energy beside it."""
        rows = [("QE", v) if k == "objective" else (k, v) for k, v in super()._summary()]
        name = "lower_bound" if "lower_bound_" in self.extras_ else "free_energy"  # (per unit of weight, or whole)
        return rows + [(name, f"{self.extras_[name + '_']:.6g}"), ("sigma2", f"{self.extras_['sigma2_']:.6g}")]

    def score_samples(self, X, exact=False):
        """Per-row log-likelihood log p(x), a lazy float64 dask array: over every component when ``exact``
        (O(C·D) a row, scikit-learn's), else over the row's C' = ``n_truncated_`` likeliest components, a
        lower bound that is tight when the others are far less likely (O(C·D) to find them as well, but
        no C-wide exponentials)."""
        X = self._input(X)
        n_truncated = None if exact else int(self.extras_["n_truncated_"])
        return map_rows(X, _score_block, np.float64, None, self._costs(), n_truncated)

    def score(self, X, sample_weight=None, exact=False):
        """Mean log-likelihood of X (weighted by ``sample_weight``), computed now; ``exact`` as
        ``score_samples``."""
        ll = self.score_samples(X, exact)
        if sample_weight is None:
            return float(ll.mean().compute())
        w = sample_weight if isinstance(sample_weight, da.Array) else da.from_array(np.asarray(sample_weight, float))
        if w.shape != ll.shape:
            raise ValueError(f"sample_weight must have shape {ll.shape}; got {w.shape}")
        w = w.rechunk(ll.chunks)
        total, weight = da.compute((ll * w).sum(), w.sum())
        return float(total / weight)

    def n_parameters(self):
        """Free parameters: the means, the variances (C·D, C, 1, C·D(D+1)/2 or D(D+1)/2) and the weights (C − 1
        when learned)."""
        C, D = self.cluster_centers_.shape
        return n_parameters(self.covariance_type, self.params.get("weights"), C, D)

    def bic(self, X, exact=True):
        """Bayesian information criterion on X: −2 log L + p log n, log L over every component (``exact``, the
        default) or over each row's C' likeliest (as ``score_samples``)."""
        n = as_dask_rows(X, self.n_features_in_).shape[0]
        return -2.0 * self.score(X, exact=exact) * n + self.n_parameters() * math.log(n)

    def aic(self, X, exact=True):
        """Akaike information criterion on X: −2 log L + 2p, log L as ``bic``'s."""
        n = as_dask_rows(X, self.n_features_in_).shape[0]
        return -2.0 * self.score(X, exact=exact) * n + 2 * self.n_parameters()

    def nearest_costs(self):
        """(h, offset, C') when every component's cost −ℓ_c(x) is offset + h ||x − μ_c||² with one h and one
        offset (one variance, equal weights: vc-GMM's own model), so that a row's likeliest components are
        its nearest means; else None."""
        costs = self._costs()
        h, offset = costs.h, costs.offset
        if h.ndim != 2 or not (np.all(h == h.flat[0]) and np.all(offset == offset[0])):
            return None
        return float(h.flat[0]), float(offset[0]), int(self.extras_["n_truncated_"])

    def sample(self, n_samples=1, random_state=None):
        """``n_samples`` rows drawn from the mixture and their components, (X, y), grouped by component as
        scikit-learn's: counts ~ Multinomial(n, π), then x ~ N(μ_c, Σ_c)."""
        if not (isinstance(n_samples, (int, np.integer)) and n_samples >= 1):
            raise ValueError(f"n_samples must be an int >= 1; got {n_samples!r}")
        rng = np.random.default_rng(check_random_state(random_state))
        counts = rng.multinomial(n_samples, self.weights_)
        kind, var = covariance(self.covariance_type), self.variances_
        X = np.concatenate([kind.draw(rng, self.cluster_centers_, var, c, n) for c, n in enumerate(counts)])
        return X, np.repeat(np.arange(len(counts)), counts)

    @staticmethod
    def check_fields(params, extras, centers):
        """The schema of a mixture's own fields, on load: raises ValueError naming the first problem."""
        C, D = centers.shape
        if "sigma2_" not in extras:
            raise ValueError("a mixture model holds sigma2_ (vc-GMM's σ², or the first search's)")
        if not set(MixtureModel.FIELDS) & extras.keys():  # vc-GMM's own model: sigma2_ is all it has
            return
        kind = extras["covariance_type_"]
        if kind not in COVARIANCE_TYPES or kind != params.get("covariance_type"):
            raise ValueError(f"covariance_type_ {kind!r} is not one of {COVARIANCE_TYPES} or not the params'")
        var, weights = np.asarray(extras["variances_"]), np.asarray(extras["weights_"])
        shape = covariance(kind).var_shape(C, D)
        if var.shape != shape or var.dtype.kind != "f" or not np.isfinite(var).all():
            raise ValueError(f"variances_ must be {shape} finite floats")
        problem = covariance(kind).check_variances(var)
        if problem is not None:
            raise ValueError(problem)
        if weights.shape != (C,) or weights.dtype.kind != "f" or not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(f"weights_ must be ({C},) finite non-negative floats")
        if abs(weights.sum() - 1.0) > WEIGHTS_SUM_TOL:
            raise ValueError(f"weights_ must sum to 1; they sum to {weights.sum():.12g}")
        if not isinstance(extras["lower_bound_"], (int, float)) or not math.isfinite(extras["lower_bound_"]):
            raise ValueError("lower_bound_ must be a finite number")
