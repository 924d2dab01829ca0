"""Public entry points: ``fit``, ``load``, and scikit-learn-compatible estimators generated from the
algorithm registry. Parameters and data are validated here, once (STYLE example 2)."""
import inspect
import logging
import time
from dataclasses import MISSING, fields

import numpy as np

from . import algorithms
from ._params import InvalidParameterError, build_config
from .engine import Loop, as_source, check_random_state, open_engine
from .engine.data import InputError
from .models import ClusteringModel

logger = logging.getLogger("dask_clust")


class _Default:
    def __repr__(self):
        return "<algorithm default>"


DEFAULT = _Default()


def _check_against_data(cfg, source):
    k = getattr(cfg, "n_clusters", None)
    if k is not None and k > source.n_samples:
        raise InputError(f"n_clusters={k} must be <= n_samples={source.n_samples}")
    init = getattr(cfg, "init", None)
    if init is not None and not isinstance(init, str):
        shape = np.shape(init)
        if shape != (k, source.n_features):
            raise InputError(f"init array has shape {shape}; expected (n_clusters, n_features) = "
                             f"({k}, {source.n_features})")


def _loop_length(cfg):
    """The most iterations an algorithm's loop runs: its max_iter, max_epochs (VRKM) or omaxit (SBE)."""
    for name in ("max_iter", "max_epochs", "omaxit"):
        if hasattr(cfg, name):
            return getattr(cfg, name)
    return 1


def fit(X, algo="kmeans", n_clusters=8, *, init=DEFAULT, random_state=None, max_iter=DEFAULT, tol=DEFAULT,
        client=None, sample_weight=None, progress=False, callback=None, **params):
    """Fit a clustering model to X and return a ``ClusteringModel``.

    X: numpy or dask array, pandas or dask DataFrame (numeric columns), or a path to a .npy file, a zarr
    array/group or a parquet dataset; rows are samples. Nothing passed in is modified.
    algo: one of ``dask_clust.algorithms.REGISTRY`` (an unknown name raises, listing the valid ones).
    init, max_iter, tol and ``**params``: the algorithm's parameters (defaults: its config dataclass).
    random_state: int, SeedSequence or None. The same value and chunking give the same model on any
    number of workers.
    client: a ``distributed.Client``, a scheduler address, "in-process", or None (the current client if
    one exists; in-memory data up to 1 GiB is fitted in this process; otherwise a LocalCluster sized to
    the machine is started for the fit and closed again).
    progress: print a one-line progress display on stderr; callback(record) is called after every
    iteration with the history record plus "centers", the centres after that iteration (raise
    ``dask_clust.StopFit`` to stop early).
    """
    spec = algorithms.get(algo)
    given = {"n_clusters": n_clusters, "init": init, "max_iter": max_iter, "tol": tol, **params}
    given = {k: v for k, v in given.items() if v is not DEFAULT}
    cfg = build_config(spec.config, f"algo={algo!r}", given)
    entropy = check_random_state(random_state)
    source = as_source(X, sample_weight)
    _check_against_data(cfg, source)
    t0 = time.perf_counter()
    with open_engine(source, client, entropy) as engine:
        logger.info("fitting %s (k=%s) on %d x %d %s in %d chunks (%s)", algo, getattr(cfg, "n_clusters", "-"),
                    source.n_samples, source.n_features, source.dtype, source.n_chunks, engine.backend.kind)
        loop = Loop(algo, _loop_length(cfg), callback=callback, progress=progress)
        result = spec.fit(engine, cfg, entropy, loop)
        info = engine.describe()
    info["wall_s"] = time.perf_counter() - t0
    logger.info("%s finished: %d iterations, objective %.6g, %.2f s", algo, result.n_iter,
                result.objective, info["wall_s"])
    params_out = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    params_out["random_state"] = entropy
    return ClusteringModel(algo, params_out, result.centers, n_iter_=result.n_iter,
                           converged_=result.converged, history_=result.history,
                           n_distance_evals_=result.distance_evals, objective_=result.objective,
                           extras_=result.extras, engine_=info)


def load(path):
    """Read a model written by ``ClusteringModel.save``."""
    return ClusteringModel.load(path)


# ---------------------------------------------------------------- estimators

class ClusteringEstimator:
    """scikit-learn conventions: hyper-parameters in ``__init__`` only, fitted attributes end in ``_``,
    ``fit`` returns self, ``predict``/``transform`` are lazy dask arrays."""

    _algo = None
    _param_names = ()

    def __init__(self, *args, **kwargs):
        if len(args) > 1:
            raise TypeError(f"{type(self).__name__} takes at most one positional argument (n_clusters)")
        if args:
            kwargs = {"n_clusters": args[0], **kwargs}
        unknown = sorted(set(kwargs) - set(self._param_names))
        if unknown:
            raise InvalidParameterError(f"{type(self).__name__} got unknown parameter(s) {unknown}; "
                                        f"valid parameters are {sorted(self._param_names)}")
        defaults = self._defaults()
        for name in self._param_names:
            setattr(self, name, kwargs.get(name, defaults[name]))

    @classmethod
    def _defaults(cls):
        d = {f.name: (f.default if f.default is not MISSING else f.default_factory())
             for f in fields(algorithms.get(cls._algo).config)}
        d["random_state"] = None
        return d

    def get_params(self, deep=True):
        return {name: getattr(self, name) for name in self._param_names}

    def set_params(self, **params):
        for name, value in params.items():
            if name not in self._param_names:
                raise InvalidParameterError(f"{type(self).__name__} has no parameter {name!r}; "
                                            f"valid parameters are {sorted(self._param_names)}")
            setattr(self, name, value)
        return self

    def __repr__(self):
        defaults = self._defaults()
        shown = [f"{k}={v!r}" for k, v in self.get_params().items()
                 if not (isinstance(v, str | int | float | type(None)) and v == defaults[k])]
        return f"{type(self).__name__}({', '.join(shown)})"

    def fit(self, X, y=None, sample_weight=None, *, client=None, progress=False, callback=None):
        params = self.get_params()
        random_state = params.pop("random_state")
        model = fit(X, self._algo, random_state=random_state, client=client, sample_weight=sample_weight,
                    progress=progress, callback=callback, **params)
        self.model_ = model
        self.cluster_centers_ = model.cluster_centers_
        self.n_iter_ = model.n_iter_
        self.history_ = model.history_
        self.n_features_in_ = model.n_features_in_
        self.inertia_ = model.objective_
        self._fit_X = X
        return self

    def _check_fitted(self):
        if not hasattr(self, "model_"):
            raise AttributeError(f"This {type(self).__name__} instance is not fitted yet; call fit first")
        return self.model_

    @property
    def labels_(self):
        """Labels of the training rows: a lazy dask array (computed when you ask for the values)."""
        return self._check_fitted().predict(self._fit_X)

    def predict(self, X):
        return self._check_fitted().predict(X)

    def predict_proba(self, X):
        return self._check_fitted().predict_proba(X)

    def fit_predict(self, X, y=None, sample_weight=None):
        return self.fit(X, sample_weight=sample_weight).labels_

    def transform(self, X):
        return self._check_fitted().transform(X)

    def fit_transform(self, X, y=None, sample_weight=None):
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def score(self, X, y=None, sample_weight=None):
        return self._check_fitted().score(X, sample_weight)


def _make_estimator(spec):
    names = tuple(f.name for f in fields(spec.config)) + ("random_state",)
    cls = type(spec.name and spec.estimator, (ClusteringEstimator,), {
        "_algo": spec.name, "_param_names": names,
        "__doc__": (f"{spec.summary}.\n\nReference: {spec.reference}. Parameters: {', '.join(names)}.\n\n"
                    f"history_[i]['objective']: {spec.objective}; inertia_: the exact QE of the centres on the "
                    "training rows."),
        "__module__": "dask_clust",
    })
    defaults = cls._defaults()
    sig = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for i, name in enumerate(names):
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if i == 0 else inspect.Parameter.KEYWORD_ONLY
        sig.append(inspect.Parameter(name, kind, default=defaults[name]))
    cls.__signature__ = inspect.Signature(sig[1:])
    return cls


ESTIMATORS = {spec.estimator: _make_estimator(spec) for spec in algorithms.REGISTRY.values()}
