"""dask_clust: clustering for data too large for one machine, on a Dask cluster.

    import dask_clust
    model = dask_clust.fit(X, algo="kmeans", n_clusters=100)
    labels = model.predict(X)          # lazy dask array
"""
import logging

from .api import ESTIMATORS, fit, load
from .algorithms import REGISTRY
from .engine.data import InputError
from .engine.loop import StopFit
from .models import ClusteringModel
from ._params import InvalidParameterError

globals().update(ESTIMATORS)
logging.getLogger("dask_clust").addHandler(logging.NullHandler())

__version__ = "0.1.0"
__all__ = ["fit", "load", "ClusteringModel", "InputError", "InvalidParameterError", "StopFit", "REGISTRY",
           *ESTIMATORS]
