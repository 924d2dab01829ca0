"""scikit-learn-compatible estimators generated from the algorithm registry, over ``api.fit``. Apart from
``api`` so that ``fit``, ``load`` and the command line do not import scikit-learn (1.5 s a process)."""

import numbers
import os
import textwrap
import warnings
from dataclasses import MISSING, fields

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, ClusterMixin, DensityMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from . import algorithms
from . import progress as progress_
from ._params import COVARIANCE_TYPES, build_config, describe
from ._random import check_random_state
from .api import fit
from .blocks.gaussian import own_model
from .engine.data import is_frame
from .engine.local import persisted
from .errors import InputError, InvalidParameterError


def _is_lazy(X):
    """Whether an input gives lazy (dask) results: a dask array or DataFrame, or a path to data on disk."""
    mod = type(X).__module__
    return isinstance(X, (str, os.PathLike)) or mod.startswith(("dask.", "dask_expr"))


def _feature_names(X):
    """The column names of a DataFrame whose columns are all strings (scikit-learn's rule), else None."""
    columns = getattr(X, "columns", None)
    if columns is None or not len(columns) or not all(isinstance(c, str) for c in columns):
        return None
    return np.asarray(list(columns), dtype=object)


CHECKPOINTING = {"checkpoint", "resume", "checkpoint_every", "checkpoint_seconds"}


class _PackedLabels:
    """``labels_`` in a pickle: stored in the smallest unsigned type that holds them."""

    def __init__(self, values):
        self.values = values


class ClusteringEstimator(ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, BaseEstimator):
    """scikit-learn estimator over ``fit``: hyper-parameters in ``__init__`` only (validated by ``fit``),
    fitted attributes end in ``_``, ``fit`` returns self. Results follow the input: numpy (or pandas) in,
    numpy out; a dask array or DataFrame or a path in, a lazy dask array out (known chunks). ``labels_`` is
    computed once at the end of the fit (numpy, or a persisted dask array for dask input); the training
    data is never kept."""

    _algo = None

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = algorithms.get(self._algo).sparse  # scipy CSR rows (others converted to CSR)
        return tags

    def fit(self, X, y=None, sample_weight=None, *, client=None, progress=None, callback=None, **checkpointing):
        """Fit to X (rows are samples; y is ignored). ``client``, ``progress``, ``callback`` and
        ``checkpointing`` (checkpoint, resume, checkpoint_every, checkpoint_seconds): as ``fit``."""
        return self._fit(X, sample_weight, client, progress, callback, checkpointing)

    def _fit(self, X, sample_weight, client, progress, callback, checkpointing):
        unknown = set(checkpointing) - CHECKPOINTING
        if unknown:
            raise TypeError(f"{type(self).__name__}.fit() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        params = self.get_params()
        random_state, n_init = params.pop("random_state"), params.pop("n_init")
        names = _feature_names(X)
        options = dict(
            client=client, sample_weight=sample_weight, progress=progress, callback=callback, **checkpointing
        )
        model = self._best_of(n_init, X, random_state, options, params)
        for attr in ("feature_names_in_", "labels_"):
            self.__dict__.pop(attr, None)
        if names is not None:
            self.feature_names_in_ = names
        self.model_ = model
        self.cluster_centers_ = model.cluster_centers_
        self.n_iter_ = model.n_iter_
        self.history_ = model.history_
        self.n_features_in_ = model.n_features_in_
        self.inertia_ = model.objective_
        fitted = model.extras_.get("labels_")  # a transductive fit's own labels (SLK), in row order
        if fitted is not None:
            import dask.array as da

            self.labels_ = (
                persisted(da.from_array(fitted, chunks=model.predict_array(X).chunks)) if _is_lazy(X) else fitted
            )
            return self
        with progress_.reporting(progress), progress_.phase("labels of the training rows", 1, "pass") as shown:
            labels = model.predict_array(X)
            self.labels_ = persisted(labels) if _is_lazy(X) else labels.compute()
            shown.update()
        return self

    def _best_of(self, n_init, X, random_state, options, params):
        """One fit, or the lowest objective of ``n_init`` (scikit-learn's rule), fit i seeded with the i-th
        word of ``SeedSequence(random_state).generate_state(n_init, uint64)``."""
        if not (isinstance(n_init, numbers.Integral) and not isinstance(n_init, bool) and n_init >= 1):
            raise InvalidParameterError(f"n_init must be an int >= 1; got {n_init!r}")
        if n_init > 1 and not isinstance(params.get("init", ""), str):
            warnings.warn(
                f"n_init={n_init} with explicit initial centres: they give the same fit every time, so it runs once",
                RuntimeWarning,
                stacklevel=4,
            )
            n_init = 1
        if n_init == 1:
            return fit(X, self._algo, random_state=random_state, **options, **params)
        if {"checkpoint", "resume"} & {k for k, v in options.items() if v is not None}:
            raise InvalidParameterError("n_init > 1 cannot be checkpointed: checkpoint one fit per random_state")
        best = None
        for seed in np.random.SeedSequence(check_random_state(random_state)).generate_state(n_init, np.uint64):
            model = fit(X, self._algo, random_state=int(seed), **options, **params)
            if model.objective_ is None:
                raise InvalidParameterError(f"n_init > 1 keeps the fit of lowest objective; {self._algo} computes none")
            if best is None or model.objective_ < best.objective_:
                best = model
        return best

    def __getstate__(self):
        state = super().__getstate__()
        labels = state.get("labels_")
        if isinstance(labels, np.ndarray) and labels.dtype == np.int32:
            # labels are < n_clusters: the smallest unsigned type holds them (int32 again when unpickled)
            state["labels_"] = _PackedLabels(labels.astype(np.min_scalar_type(max(0, self._n_features_out - 1))))
        return state

    def __setstate__(self, state):
        if isinstance(state.get("labels_"), _PackedLabels):
            state = {**state, "labels_": state["labels_"].values.astype(np.int32)}
        super().__setstate__(state)

    @property
    def _n_features_out(self):
        return self.cluster_centers_.shape[0]

    def _checked(self, X):
        """The fitted model, after scikit-learn's fitted and feature-name checks on X."""
        check_is_fitted(self, "model_")
        shape = getattr(X, "shape", None)
        if shape is not None and len(shape) == 2 and shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {shape[1]} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        names = _feature_names(X)
        fitted = getattr(self, "feature_names_in_", None)
        if fitted is not None and names is not None and not np.array_equal(names, fitted):
            raise ValueError(
                f"The feature names should match those that were passed during fit: fitted with "
                f"{list(fitted)}, got {list(names)}"
            )
        if fitted is not None and names is None:
            warnings.warn(
                f"X does not have valid feature names, but {type(self).__name__} was fitted with feature names",
                UserWarning,
            )
        if fitted is None and names is not None:
            warnings.warn(
                f"X has feature names, but {type(self).__name__} was fitted without feature names", UserWarning
            )
        return self.model_

    @staticmethod
    def _out(X, result):
        """numpy for in-memory input, the lazy dask array for dask input or a path."""
        return result if _is_lazy(X) else result.compute()

    def predict(self, X):
        """Index of the nearest centre of each row (int32)."""
        return self._out(X, self._checked(X).predict_array(X))

    def fit_predict(self, X, y=None, **fit_params):
        return self.fit(X, **fit_params).labels_

    def transform(self, X):
        """Euclidean distance of each row to every centre, (n, k) float64."""
        return self._out(X, self._checked(X).transform(X))

    def fit_transform(self, X, y=None, **fit_params):
        return self.fit(X, **fit_params).transform(X)

    def score(self, X, y=None, sample_weight=None):
        """Negative quantization error of X (scikit-learn's ``KMeans.score``; a mixture model's own ``score`` is
        its likelihood)."""
        return -self._checked(X).quantization_error(X, sample_weight)


class StreamingEstimator(ClusteringEstimator):
    """A clustering estimator that also learns from a stream of batches (Sculley's mini-batch update)."""

    def _fit(self, X, sample_weight, client, progress, callback, checkpointing):
        super()._fit(X, sample_weight, client, progress, callback, checkpointing)
        # partial_fit continues from here
        self.counts_, self.n_steps_ = self.model_.counts_, self.n_iter_
        self._since_reassign = self.model_.extras_.get("since_reassign", 0)
        return self

    def partial_fit(self, X, y=None, sample_weight=None):
        """One mini-batch step on the rows given (scikit-learn's ``partial_fit``), in this process: the first
        call (unless ``fit`` came before) seeds the centres on its rows by ``init`` and ``random_state``; each
        call assigns its rows to the centres as they are, moves every centre to the mean of all the rows it
        was ever given, and moves light centres onto its rows as ``fit`` does (``reassignment_ratio``).
        ``counts_``: their weight per centre; ``n_steps_``: the batches. A dask batch is computed here."""
        from .blocks.lloyd import to_sphere
        from .blocks.seeding import seed
        from .engine import as_source, open_engine
        from .models import ClusteringModel

        spec = algorithms.get(self._algo)
        params = self.get_params()
        random_state = params.pop("random_state")
        params.pop("n_init")
        cfg = build_config(spec.config, type(self).__name__, params)
        first = not hasattr(self, "counts_")
        entropy = check_random_state(random_state)
        names = _feature_names(X)
        source = as_source(X, sample_weight, unit=algorithms.spherical(cfg))
        if not first and source.n_features != self.n_features_in_:
            raise ValueError(
                f"X has {source.n_features} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        if first and cfg.n_clusters > source.n_samples:
            raise InputError(
                f"the first batch seeds n_clusters={cfg.n_clusters} centres from its rows; it has {source.n_samples}"
            )
        with open_engine(source, "in-process", entropy) as engine:
            if first:
                centers, _ = seed(engine, cfg.n_clusters, cfg.init, entropy)
                centers = to_sphere(centers) if algorithms.spherical(cfg) else centers
                counts, self.n_steps_, self._since_reassign = np.zeros(cfg.n_clusters), 0, 0
            else:
                centers, counts = self.cluster_centers_, self.counts_
            x, w = engine.take(np.arange(source.n_samples), weights=True, dense=False)
            centers, counts, self._since_reassign = spec.partial_step(
                cfg, x, w, centers, counts, self._since_reassign, entropy, self.n_steps_, engine.dtype
            )
        self.cluster_centers_, self.counts_ = centers, counts
        self.n_steps_ += 1
        if first:
            self.n_features_in_ = source.n_features
            if names is not None:
                self.feature_names_in_ = names
        self.model_ = ClusteringModel(
            self._algo,
            {**params, "random_state": entropy},
            self.cluster_centers_,
            n_iter_=self.n_steps_,
            extras_={"counts_": counts, "since_reassign": self._since_reassign},
        )
        return self


class UnweightedEstimator(ClusteringEstimator):
    """A clustering estimator whose algorithm draws rows uniformly and takes no sample_weight (VRKM, SBE)."""

    def fit(self, X, y=None, *, client=None, progress=None, callback=None, **checkpointing):
        """Fit to X (rows are samples; y is ignored). ``client``, ``progress``, ``callback`` and
        ``checkpointing``: as ``ClusteringEstimator.fit``."""
        return self._fit(X, None, client, progress, callback, checkpointing)


class ProbabilisticEstimator(ClusteringEstimator):
    """A clustering estimator whose model gives posteriors (vc-GMM, var-GMM-S)."""

    def predict_proba(self, X, output="sparse"):
        """Truncated posteriors (see ``ClusteringModel.predict_proba``): by default scikit-learn's (n, k)
        shape as a scipy CSR matrix holding the n·C' non-zeros; output="truncated" gives (ids,
        probabilities), (n, C') each (for a DataFrame, one DataFrame on its index: component_j and
        probability_j columns), output="dense" an (n, k) float64 array (8·k bytes per row)."""
        result = self._checked(X).predict_proba(X, output)
        if output == "truncated" and is_frame(X):
            return result
        if output == "truncated":
            return tuple(self._out(X, r) for r in result)
        return result if output == "sparse" else self._out(X, result)


def _init_source(names, defaults):
    """An ``__init__`` that only stores its parameters (scikit-learn's rule; ``fit`` validates them), with
    n_clusters positional and every other parameter keyword-only."""
    args = ", ".join([f"{names[0]}=_defaults[{names[0]!r}]", "*"] + [f"{n}=_defaults[{n!r}]" for n in names[1:]])
    body = "\n".join(f"    self.{n} = {n}" for n in names)
    return f"def __init__(self, {args}):\n{body}\n"


def _param_doc(spec, defaults):
    """numpydoc Parameters from the config dataclass: type, default, meaning and the constraint each must meet."""
    constraints = {**spec.config.constraints, "random_state": None}
    lines = ["Parameters", "----------"]
    for name, default in defaults.items():
        if name == "n_init":
            lines += [
                "n_init : int, default=1",
                "    Fits from different seeds, keeping the one of lowest objective (``inertia_``); fit i is",
                "    seeded with the i-th word of ``SeedSequence(random_state).generate_state(n_init, uint64)``.",
            ]
            continue
        if name == "random_state":
            lines += [
                "random_state : int, numpy.random.SeedSequence or None, default=None",
                "    Seed of every random draw; the same value and chunking give the same model on any",
                "    number of workers.",
            ]
            continue
        allowed = " or ".join(str(c) for c in constraints[name])
        kind = type(default).__name__ if default is not None else "object"
        lines += [
            f"{name} : {kind}, default={default!r}",
            textwrap.fill(
                f"{describe(spec.config, name)} Must be {allowed}.",
                100,
                initial_indent="    ",
                subsequent_indent="    ",
            ),
        ]
    return "\n".join(lines)


def _make_estimator(spec):
    defaults = _defaults_of(spec)
    names = tuple(defaults)
    namespace = {"_defaults": defaults}
    exec(_init_source(names, defaults), namespace)
    base = (
        ProbabilisticEstimator
        if spec.probabilistic
        else StreamingEstimator
        if spec.partial_step is not None
        else ClusteringEstimator
        if spec.weighted
        else UnweightedEstimator
    )
    doc = (
        f"{spec.summary}.\n\nReference: {spec.reference}.\n\n{_param_doc(spec, defaults)}\n\n"
        f"Attributes\n----------\ncluster_centers_ : ndarray (n_clusters, n_features)\nlabels_ : labels of the "
        f"training rows\ninertia_ : float or None\n    The exact QE of the centres on the training rows "
        f"(vc-GMM: as final_objective says).\nn_iter_ : int\n"
        f"history_ : list of dict\n    history_[i]['objective'] is {spec.objective}.\n"
    )
    cls = type(
        spec.estimator,
        (base,),
        {"_algo": spec.name, "__init__": namespace["__init__"], "__doc__": doc, "__module__": "dask_clust"},
    )
    cls.__init__.__qualname__ = f"{spec.estimator}.__init__"
    return cls


def _defaults_of(spec):
    d = {f.name: (f.default if f.default is not MISSING else f.default_factory()) for f in fields(spec.config)}
    d["n_init"] = 1
    d["random_state"] = None
    return d


ESTIMATORS = {spec.estimator: _make_estimator(spec) for spec in algorithms.REGISTRY.values()}


# scikit-learn's init_params, as VCGMM's init names them (its "random" is random responsibilities, ours random rows)
SKLEARN_INITS = {"random": "random-responsibilities", "random_from_data": "random"}


class GaussianMixture(DensityMixin, BaseEstimator):
    """Gaussian mixture with full, tied, diagonal or spherical covariances and learned weights, fitted by
    vc-GMM's truncated variational EM on a lightweight coreset, on a Dask cluster: scikit-learn's
    ``GaussianMixture`` attributes and methods, for data no single machine holds and thousands of components.

    References: F. Hirschberger, D. Forster, J. Lücke, "A Variational EM Acceleration for Efficient
    Clustering at Very Large Scales", IEEE TPAMI 44(12), 2022 (the truncated E-step, the coreset); the model
    p(x) = Σ_c π_c N(x; μ_c, Σ_c) as scikit-learn's (its M-step, ``reg_covar``). Each row's posterior
    covers its C' = ``n_truncated`` likeliest components (found among the neighbourhoods of its last ones, O(C'·G·D)
    per row, not O(C·D)); with ``n_truncated`` = ``G`` = n_components and ``coreset_size=None`` an iteration is
    scikit-learn's EM step. The coreset's weighted log-likelihood is an unbiased estimate of the data's (see
    ``dask_clust.algorithms.vcgmm``).

    Parameters
    ----------
    n_components : int, default=1
    covariance_type : {"diag", "full", "tied", "spherical", "tied-spherical"}, default="diag"
        Per component: diag(σ²_c1 … σ²_cD), a full Σ_c, or σ²_c I; or one Σ ("tied") or one σ²I shared by
        all. A full covariance costs O(D²) per row and component searched (Cholesky-based, in float64, grouped by
        component) where a diagonal one costs O(D), and its model C·D² (the driver holds it: a model
        over ``dask_clust.model-bytes`` is refused for "full" and "tied").
    tol : float, default=1e-4
        Stop when the free energy (the log-likelihood's truncated lower bound) changes by less than tol, relative.
    reg_covar : float, default=1e-6
        Added to every variance (scikit-learn's meaning).
    max_iter : int, default=100
    n_init : int, default=1
        Fits from different seeds, keeping the one of highest ``lower_bound_`` (scikit-learn's rule).
    init_params : str, default="auto"
        How the mixture starts when ``means_init`` is None. scikit-learn's: "kmeans" (one M-step from each row's
        nearest k-means centre, k-means|| then Lloyd), "k-means++" (means at greedy k-means++ rows),
        "random_from_data" (means at random rows), "random" (one M-step from uniform random
        responsibilities); or ours: "k-means||", "afkmc2", "auto" ("kmeans" for "full" and "tied", whose
        matrices the EM settled worse from means alone; else k-means|| while C²·D ≤ 2^32, else AFK-MC2).
        After means alone, the first E-step ranks by one σ² and equal weights (vc-GMM's).
    weights_init, means_init, precisions_init : array-like or None
        The starting mixture, in scikit-learn's shapes (precisions: (C,) "spherical", (C, D) "diag", (C, D, D)
        "full", (D, D) "tied", a float "tied-spherical"); weights and precisions together, or neither (the first
        E-step then uses one σ² and equal weights, vc-GMM's).
    random_state : int, SeedSequence or None, default=None
    weights : {"learned", "equal"}, default="learned"
    coreset_size : "auto", int or None, default="auto"
        Rows of the lightweight coreset the EM runs on ("auto": min(N, max(2^15, 64 C)), with D(D+3)/4 rows a
        component in place of 64 for "full", half a row per parameter, and D(D+3)/2 above 256 components);
        None: every row.
        A diagonal component has 2·D parameters, which about 64 rows estimate loosely when D is large: on
        500k x 32 at C = 1000 the held-out log-likelihood per row was -64.7 with "auto" (1 s), -64.2 with
        256k rows (3 s) and -63.9 with every row (5 s) (``benchmarks/bench_mixtures.py``).
    warm_start : bool, default=False
        As scikit-learn's: each ``fit`` after the first starts from the last one's mixture (its means,
        weights and precisions, as if given as ``means_init``, ``weights_init`` and ``precisions_init``),
        and ``n_init`` is then ignored.
    coreset_only : bool, default=False
        Stop after the EM on the coreset (the fast mode). By default the EM goes on over every row from the
        coreset's mixture until the free energy of all rows stops moving (one pass an iteration). On diagonal
        mixtures of 300k rows (C = 16 to 256, D = 16 to 64, 5 seeds each, BENCHMARKS.md) the default's
        held-out log-likelihood per row was above scikit-learn's on average on every line (by 0.23 to 2.3
        nats; no seed of the 45 below it by more than 0.001) at 2.0x to 19x its speed, and at C = 1,024
        (D = 16, 32, 64) by 0.02 to 0.05 (no seed more than 0.037 below) at 12.6x to 22x; the coreset alone
        was 1.1x to 2.3x faster still but up to 0.56 nats below the default on average at C = 256 and 1.2
        at C = 1,024, where it falls short of scikit-learn's.
    G : int, default=5
        Size of each component's neighbourhood, from which the rows' search spaces are built.
    n_truncated : int or None, default=None
        C', the components each row's posterior covers (None: G).
    coreset_starts : int or "auto", default="auto"
        Seedings tried on the coreset, each with 8 EM iterations there; the one of highest free energy is the
        fit's start (the coreset's free energy estimates the data's, and ranked eight starts of 300k x 64,
        C = 64 in the order of their held-out likelihood). "auto": for "diag" 1 up to 256 components, where
        the split-and-merge moves do better than more starts (none of 45 diagonal fits below scikit-learn's,
        at one seeding's cost), and 3 above (at 1,024 the moves alone left a seed 0.12 nats below); 1 for
        "full", whose moves mend what more starts did not (six starts left a seed of 300k x 64, C = 64
        0.148 nats below scikit-learn's, the moves took it 0.108 above); 3 for "tied" (with one and its moves,
        a seed of 300k x 64, C = 16 ended 1.28 nats below scikit-learn's) and for the spherical types.
    split_merge : int or "auto", default="auto"
        Split-and-merge moves tried on the coreset after its EM ("diag", "full" and "tied"; Ueda, Nakano,
        Ghahramani and Hinton, "SMEM Algorithm for Mixture Models", Neural Computation 12(9), 2000): the two
        closest components merged and a third split in two ("diag": the widest; "full": the one whose rows'
        Mardia kurtosis is furthest from a Gaussian's, as a component that swallowed a smaller cluster is heavy
        tailed and one spanning two alike bimodal; "tied": the one whose rows spread furthest beyond the shared
        Σ, which stays as it is), 8 EM iterations on the coreset from there, kept when
        its free energy rose; they stop after 3 in a row are not kept. EM alone settles where one component
        spans two clusters and two share one: eight starts of 300k x 64, C = 64 spread over 2.1 nats per row
        of held-out likelihood. With the moves no seed of the diagonal grid (C 16 to 256, D 16 to 64, 5 seeds)
        ended more than 0.001 nats below scikit-learn's, where 4 of 45 had ended 0.28 to 0.57 below. "auto": 8
        for "diag", 4 for "full" (each move costs an EM on the coreset, O(D²) a row; eight cost its 5x at
        C = 64, D = 64) and "tied" (without them six starts left a seed of 300k x 64, C = 16 0.98 nats below
        scikit-learn's). 0: none.
    learning_decay : float, default=0.6
        κ of ``partial_fit``'s step sizes γ_t = t^−κ, in (0.5, 1] (Cappé & Moulines' condition): 1 weighs every
        batch alike, smaller forgets the early batches (taken under a worse mixture) sooner.

    Attributes
    ----------
    weights_, means_, covariances_, precisions_, precisions_cholesky_ : as scikit-learn's (see
        ``covariance_type``); ``converged_``, ``n_iter_``, ``lower_bound_`` (the free energy per unit of weight
        on the rows the EM ran on); ``history_``; ``model_``, the ``MixtureModel``; ``n_steps_``, the batches
        ``partial_fit`` has taken since the last ``fit``.
    """

    def __init__(
        self,
        n_components=1,
        *,
        covariance_type="diag",
        tol=1e-4,
        reg_covar=1e-6,
        max_iter=100,
        n_init=1,
        init_params="auto",
        weights_init=None,
        means_init=None,
        precisions_init=None,
        random_state=None,
        weights="learned",
        coreset_size="auto",
        coreset_only=False,
        warm_start=False,
        G=5,
        n_truncated=None,
        learning_decay=0.6,
        coreset_starts="auto",
        split_merge="auto",
    ):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.tol = tol
        self.reg_covar = reg_covar
        self.max_iter = max_iter
        self.n_init = n_init
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.random_state = random_state
        self.weights = weights
        self.coreset_size = coreset_size
        self.coreset_only = coreset_only
        self.warm_start = warm_start
        self.G = G
        self.n_truncated = n_truncated
        self.learning_decay = learning_decay
        self.coreset_starts = coreset_starts
        self.split_merge = split_merge

    def _fit_params(self):
        if self.covariance_type in COVARIANCE_TYPES and own_model(self.covariance_type, self.weights):
            raise InvalidParameterError(
                "covariance_type='tied-spherical' with weights='equal' is vc-GMM's own model: use dask_clust.VCGMM"
            )
        return dict(
            algo="vcgmm",
            n_clusters=self.n_components,
            init=SKLEARN_INITS.get(self.init_params, self.init_params) if self.means_init is None else self.means_init,
            covariance_type=self.covariance_type,
            weights=self.weights,
            reg_covar=self.reg_covar,
            weights_init=self.weights_init,
            precisions_init=self.precisions_init,
            tol=self.tol,
            max_iter=self.max_iter,
            coreset_size=self.coreset_size,
            refine=not self.coreset_only,
            coreset_starts=self.coreset_starts,
            split_merge=self.split_merge,
            G=self.G,
            n_truncated=self.n_truncated,
            final_objective=None,  # a mixture is judged by its likelihood, not by a QE pass over every row
        )

    def fit(self, X, y=None, sample_weight=None, *, client=None, progress=None, callback=None, **checkpointing):
        """Fit to X (rows are samples; y is ignored). ``client``, ``progress``, ``callback`` and
        ``checkpointing`` (checkpoint, resume, checkpoint_every, checkpoint_seconds): as ``dask_clust.fit``."""
        unknown = set(checkpointing) - CHECKPOINTING
        if unknown:
            raise TypeError(f"GaussianMixture.fit() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        n_init = self.n_init
        if not (isinstance(n_init, numbers.Integral) and not isinstance(n_init, bool) and n_init >= 1):
            raise InvalidParameterError(f"n_init must be an int >= 1; got {n_init!r}")
        params = self._fit_params()
        if self.warm_start and hasattr(self, "model_"):  # scikit-learn's: the last fit is the one start
            params.update(self._last_mixture())
            n_init = 1
        options = dict(
            client=client, sample_weight=sample_weight, progress=progress, callback=callback, **checkpointing
        )
        if n_init > 1 and {"checkpoint", "resume"} & {k for k, v in checkpointing.items() if v is not None}:
            raise InvalidParameterError("n_init > 1 cannot be checkpointed: checkpoint one fit per random_state")
        seeds = [self.random_state]
        if n_init > 1:
            root = np.random.SeedSequence(check_random_state(self.random_state))
            seeds = [int(s) for s in root.generate_state(n_init, np.uint64)]
        best = None
        for seed in seeds:
            model = fit(X, random_state=seed, **options, **params)
            if best is None or model.lower_bound_ > best.lower_bound_:
                best = model
        names = _feature_names(X)
        self.__dict__.pop("feature_names_in_", None)
        if names is not None:
            self.feature_names_in_ = names
        self._take_model(best)
        self.converged_, self.n_iter_, self.lower_bound_ = best.converged_, best.n_iter_, best.lower_bound_
        self.history_, self.n_features_in_ = best.history_, best.n_features_in_
        self._stepwise, self.n_steps_ = None, 0
        return self

    def _take_model(self, model):
        self.model_ = model
        self.weights_, self.means_ = model.weights_, model.means_
        self.covariances_, self.precisions_cholesky_ = model.covariances_, model.precisions_cholesky_
        self.precisions_ = model.precisions_

    def partial_fit(self, X, y=None, sample_weight=None):
        """One step of stepwise (online) EM on the batch X, in this process (a dask batch is computed here):
        O. Cappé & E. Moulines, "On-line expectation-maximization algorithm for latent data models", JRSS-B
        71(3), 2009, in mini-batches (P. Liang & D. Klein, NAACL 2009). The expected statistics of the
        mixture (Σ r, Σ r x, Σ r x² per component and unit of weight, every component's posterior) move toward
        the batch's by γ_t = t^−``learning_decay``, and the mixture becomes their M-step (``reg_covar`` as
        ``fit``'s). The first call fits the first batch as ``fit`` does (unless ``fit`` came before) and takes
        it as its first step; ``sample_weight`` weighs the rows within their batch."""
        from .blocks.truncated_em import SIGMA2_FLOOR, Family
        from .engine import as_source, open_engine
        from .mixture import MixtureModel, stepwise_step

        decay = self.learning_decay
        if not (isinstance(decay, numbers.Real) and 0.5 < decay <= 1):
            raise InvalidParameterError(f"learning_decay must be a float in (0.5, 1]; got {decay!r}")
        if not hasattr(self, "model_"):
            self.fit(X, sample_weight=sample_weight, client="in-process", progress=False)
        source = as_source(X, sample_weight)
        if source.n_features != self.n_features_in_:
            raise ValueError(
                f"X has {source.n_features} features, but {type(self).__name__} is expecting "
                f"{self.n_features_in_} features as input"
            )
        with open_engine(source, "in-process") as engine:
            x, w = engine.take(np.arange(source.n_samples), weights=True)
            floor = SIGMA2_FLOOR * float(np.mean(engine.summary.var))
        model = self.model_
        family = Family(self.covariance_type, self.weights, float(self.reg_covar), floor)
        mixture = (model.means_, model.extras_["variances_"], model.weights_)
        self._stepwise, (mu, var, weights) = stepwise_step(self._stepwise, x, w, mixture, family, decay)
        self.n_steps_ = self._stepwise.steps
        extras = {**model.extras_, "weights_": weights, "variances_": var}
        self._take_model(MixtureModel(model.algo, model.params, mu, n_iter_=self.n_steps_, extras_=extras))
        return self

    def _last_mixture(self):
        """The last fit's mixture as the next one's start (``warm_start``): its means, precisions (1/σ² exactly,
        for the diagonal types) and, when learned, weights."""
        start = {"init": self.means_, "precisions_init": self.precisions_}
        if self.weights == "learned":
            start["weights_init"] = self.weights_
        return start

    _checked = ClusteringEstimator._checked
    _out = staticmethod(ClusteringEstimator._out)

    def predict(self, X):
        """Each row's likeliest component (int32)."""
        return self._out(X, self._checked(X).predict_array(X))

    def fit_predict(self, X, y=None, **fit_params):
        return self.fit(X, **fit_params).predict(X)

    predict_proba = ProbabilisticEstimator.predict_proba

    def score_samples(self, X, exact=False):
        """Per-row log-likelihood (float64): over the row's C' likeliest components by default, a lower bound
        (the fit's own bound); over every component when ``exact`` (scikit-learn's, O(C·D) per row)."""
        return self._out(X, self._checked(X).score_samples(X, exact))

    def score(self, X, y=None, sample_weight=None, exact=False):
        """Mean log-likelihood of X (``score_samples``: truncated by default, ``exact`` over every component)."""
        return self._checked(X).score(X, sample_weight, exact)

    def bic(self, X):
        """Bayesian information criterion on X (exact log-likelihood): lower is better."""
        return self._checked(X).bic(X)

    def aic(self, X):
        """Akaike information criterion on X (exact log-likelihood): lower is better."""
        return self._checked(X).aic(X)

    def sample(self, n_samples=1):
        """``n_samples`` rows drawn from the fitted mixture and their components, (X, y), drawn with
        ``random_state``."""
        check_is_fitted(self, "model_")
        return self.model_.sample(n_samples, self.random_state)


ESTIMATORS["GaussianMixture"] = GaussianMixture
