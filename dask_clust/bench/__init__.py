"""Benchmarks: the suites of ``dask-clust bench`` (``suites``, ``paper``, ``scaling``, rendered by
``report``) and per-iteration timings shared with the scripts in ``benchmarks/``."""
import statistics
import time

import numpy as np

from .. import api


def sklearn_iteration_s(X, init, threads, iters=10):
    """scikit-learn's Lloyd per iteration: (fit of 1 + iters iterations − fit of 1) / iters, median of 3."""
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_limits

    def run(max_iter):
        t = time.perf_counter()
        KMeans(len(init), init=init, n_init=1, max_iter=max_iter, tol=0, algorithm="lloyd").fit(X)
        return time.perf_counter() - t

    with threadpool_limits(threads):
        run(2)
        return statistics.median([(run(1 + iters) - run(1)) / iters for _ in range(3)])


def daskml_iteration_s(X, init, iters=10):
    """dask-ml KMeans per iteration from the same centres (None when dask-ml is not installed)."""
    try:
        import dask.array as da
        from dask_ml.cluster import KMeans
    except ImportError:
        return None
    Xd = da.from_array(X, chunks=(max(1, X.shape[0] // 16), -1)).persist()

    def run(max_iter):
        t = time.perf_counter()
        KMeans(n_clusters=len(init), init=init, max_iter=max_iter, tol=0).fit(Xd)
        return time.perf_counter() - t

    run(2)
    return (run(1 + iters) - run(1)) / iters


def ours_iteration_s(X, init, client, iters=10):
    """Our Lloyd per iteration from the same centres: median wall time of iterations 3..iters+2."""
    m = api.fit(X, "kmeans", len(init), init=np.asarray(init, np.float64), max_iter=iters + 2, tol=0, client=client)
    return statistics.median(h["wall_s"] for h in m.history_[2:])
