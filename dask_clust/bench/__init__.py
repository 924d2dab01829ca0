"""Benchmark runners shared by ``dask-clust bench`` and ``benchmarks/``: our fit and the tools users
compare it with, each returning one JSON-ready row measured in the calling process."""
import statistics
import time

import numpy as np

from . import api
from .engine import as_source, open_engine
from .models import ClusteringModel


def run_ours(X, k, init, seed, client, max_iter=300):
    t = time.perf_counter()
    model = api.fit(X, "kmeans", k, init=init, random_state=seed, client=client, max_iter=max_iter)
    wall = time.perf_counter() - t
    with open_engine(as_source(X), client, 0) as engine:
        overhead = engine.overhead_ms()
    its = [h["wall_s"] for h in model.history_]
    return {"tool": "dask_clust", "algo": "kmeans", "init": init, "n": X.shape[0], "d": X.shape[1], "k": k,
            "seed": seed, "wall_s": wall, "n_iter": model.n_iter_, "objective": model.objective_,
            "distance_evals": model.n_distance_evals_, "s_per_iter": statistics.median(its),
            "overhead_ms_per_iter": overhead, "workers": model.engine_["workers"]}


def run_sklearn(X, k, seed, max_iter=300):
    try:
        from sklearn.cluster import KMeans
    except ImportError:
        return None
    t = time.perf_counter()
    km = KMeans(k, init="k-means++", n_init=1, random_state=seed, max_iter=max_iter).fit(X)
    wall = time.perf_counter() - t
    return {"tool": "scikit-learn", "algo": "kmeans", "init": "k-means++", "n": X.shape[0], "d": X.shape[1],
            "k": k, "seed": seed, "wall_s": wall, "n_iter": int(km.n_iter_), "objective": float(km.inertia_),
            "distance_evals": None, "s_per_iter": wall / max(1, int(km.n_iter_)), "overhead_ms_per_iter": None,
            "workers": None}


def run_daskml(X, k, seed, max_iter=300):
    try:
        import dask.array as da
        from dask_ml.cluster import KMeans
    except ImportError:
        return None
    Xd = da.from_array(X, chunks=(max(1, X.shape[0] // 16), -1))
    t = time.perf_counter()
    try:
        km = KMeans(n_clusters=k, init="k-means||", random_state=seed, max_iter=max_iter).fit(Xd)
    except Exception as exc:  # dask-ml lags behind dask releases: report rather than fail the run
        return {"tool": "dask-ml", "error": f"{type(exc).__name__}: {exc}"[:300]}
    wall = time.perf_counter() - t
    qe = ClusteringModel("kmeans", {}, km.cluster_centers_).quantization_error(X)
    return {"tool": "dask-ml", "algo": "kmeans", "init": "k-means||", "n": X.shape[0], "d": X.shape[1], "k": k,
            "seed": seed, "wall_s": wall, "n_iter": int(km.n_iter_), "objective": qe, "distance_evals": None,
            "s_per_iter": wall / max(1, int(km.n_iter_)), "overhead_ms_per_iter": None, "workers": None}


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
