"""dask_clust: clustering for data too large for one machine, on a Dask cluster.

    import dask_clust
    model = dask_clust.fit(X, algo="kmeans", n_clusters=100)
    labels = model.predict(X)          # lazy dask array

The public names are imported on first use (PEP 562), so ``dask-clust --help`` and ``--version`` do not
pay for numba, dask and scikit-learn.
"""

import importlib
import importlib.util
import logging

logging.getLogger("dask_clust").addHandler(logging.NullHandler())

__version__ = "0.1.0"

_LAZY = {
    "fit": "api",
    "load": "api",
    "ClusteringModel": "models",
    "MixtureModel": "mixture",
    "InputError": "errors",
    "InvalidParameterError": "errors",
    "StopFit": "loop",
    "REGISTRY": "algorithms",
    "InvalidModelError": "errors",
    "UnguardedScript": "errors",
    "TLSRefused": "errors",
    "ClusterLost": "errors",
    "NoWorkers": "errors",
    "ConvergenceWarning": "errors",
    "kneighbors_graph": "blocks.knn",
    "sweep": "sweeps",
    "SweepResult": "sweeps",
}


def _estimators():
    return importlib.import_module(".estimators", __name__).ESTIMATORS


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module("." + _LAZY[name], __name__), name)
    elif name == "__all__":
        value = [*_LAZY, *_estimators()]
    elif (
        not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is None and name in _estimators()
    ):  # a submodule's name (``from . import algorithms``) is not an estimator
        value = _estimators()[name]
    else:
        raise AttributeError(f"module 'dask_clust' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY, *_estimators()})
