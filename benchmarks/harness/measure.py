"""One benchmark row: a fit timed ``repeats`` times (the median is reported; fewer when they pass
``LONG_FIT_S``), its exact QE on the full data, iterations, distance evaluations, engine overhead share and peak memory.

Our fits run on the suite's cluster. Competitors run in a process of their own that reads the run's .npy
file, so a competitor that exceeds the time cap is killed and reported as "cap" instead of stalling the
suite, and its memory is its own.
"""

import multiprocessing
import queue
import statistics
import time

import numpy as np

from dask_clust import api
from dask_clust.engine import as_source, open_engine

from .data import read

# repeats stop once the fits so far took this long: a fit of minutes is timed once (its noise is small
# against its length), which keeps the paper suite within its hour
LONG_FIT_S = 30.0
# a --tiny run's loop lengths, by the name each algorithm gives its loop
TINY_LOOP = {"max_iter": 5, "max_epochs": 2, "omaxit": 5}


def quantization_error(X, centers):
    """Σ min_c ||x − c||² in float64, in this process (in blocks): the same arithmetic for every tool's
    centres, and no cluster round trip for data this process already holds."""
    C = np.asarray(centers, np.float64)
    cc = (C * C).sum(1)
    total = 0.0
    for s in range(0, len(X), 65536):
        x = np.asarray(X[s : s + 65536], np.float64)
        total += np.maximum((x * x).sum(1)[:, None] - 2 * x @ C.T + cc[None], 0).min(1).sum()
    return float(total)


def versus(got, base):
    """eta and speedup of a row against the baseline row of the same run (None when either is missing)."""
    if "qe" not in got or "qe" not in base:
        return {"eta": None, "speedup": None}
    return {"eta": got["qe"] / base["qe"] - 1, "speedup": base["wall_s"] / got["wall_s"]}


def reset_peak_memory():
    """Restart this process's peak-RSS count (Linux: writing 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory():
    """This process's peak resident set size in bytes since the last reset (None where unknown)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Workers:
    """Peak memory of the processes a fit runs in: the cluster's workers, or this process in-process."""

    def __init__(self, client):
        self.client = client if hasattr(client, "run") else None

    def reset(self):
        if self.client is None:
            reset_peak_memory()
        else:
            self.client.run(reset_peak_memory)

    def peak(self):
        if self.client is None:
            return peak_memory()
        peaks = [p for p in self.client.run(peak_memory).values() if p is not None]
        return max(peaks) if peaks else None


def engine_overhead_ms(path, client):
    """Median wall time of an empty iteration over the partitions of the data at ``path`` on ``client``."""
    with open_engine(as_source(path), client, 0) as engine:
        return engine.overhead_ms()


def ours(path, X, algo, k, seed, client, params, repeats, overhead_ms):
    """Row fields of ``repeats`` identical fits of ours (the model of the last; all are equal). The fit
    reads the .npy at ``path`` on the workers, as a user's fit reads its files; X, the same data in this
    process, gives the exact QE."""
    workers, walls, peak = Workers(client), [], 0
    while len(walls) < repeats and sum(walls) < LONG_FIT_S:
        workers.reset()
        t = time.perf_counter()
        model = api.fit(path, algo, k, random_state=seed, client=client, **params)
        walls.append(time.perf_counter() - t)
        peak = max(peak, workers.peak() or 0)
    wall = statistics.median(walls)
    trips = model.engine_.get("round_trips", 0)
    return {
        "wall_s": wall,
        "wall_runs": walls,
        "qe": quantization_error(X, model.cluster_centers_),
        "n_iter": model.n_iter_,
        "distance_evals": int(model.n_distance_evals_),
        "overhead_share": min(1.0, trips * overhead_ms / 1000 / wall),
        "peak_worker_bytes": peak or None,
        "workers": model.engine_.get("workers"),
        "extras": _plain(model.extras_),
    }


def _plain(extras):
    """The JSON-friendly part of a model's extras (numbers and flat dicts of numbers)."""
    keep = {}
    for key, v in (extras or {}).items():
        if isinstance(v, (int, float, str, bool)):
            keep[key] = v
        elif isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values()):
            keep[key] = v
    return keep


# ------------------------------------------------------------------ one Lloyd iteration, per library
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


# ------------------------------------------------------------------ competitors, each in its own process


def _sklearn(X, k, seed, kind, batch_size, max_iter):
    from sklearn.cluster import KMeans, MiniBatchKMeans

    cut = {} if max_iter is None else {"max_iter": max_iter}
    if kind == "minibatch":
        size = {} if batch_size is None else {"batch_size": min(batch_size, len(X))}  # None: its default (1024)
        est = MiniBatchKMeans(k, n_init=1, random_state=seed, **size, **cut)
    else:
        est = KMeans(k, init="k-means++", n_init=1, algorithm=kind, random_state=seed, **cut)
    est.fit(X)
    return est.cluster_centers_, int(getattr(est, "n_iter_", 0) or getattr(est, "n_steps_", 0))


def _daskml(X, k, seed, kind, batch_size, max_iter):
    import dask
    import dask.array as da
    from dask_ml.cluster import KMeans

    Xd = da.from_array(X, chunks=(max(1, -(-len(X) // 16)), -1))
    # its k-means|| rounds are Lloyd-like iterations too: a cut run cuts both
    cut = {} if max_iter is None else {"max_iter": max_iter, "init_max_iter": max_iter}
    with dask.config.set(scheduler="threads"):
        est = KMeans(n_clusters=k, init="k-means||", random_state=seed, **cut).fit(Xd)
    return np.asarray(est.cluster_centers_), int(est.n_iter_)


def _faiss(X, k, seed, kind, batch_size, max_iter):
    """faiss's k-means with its defaults (random rows as seeds, 25 Lloyd iterations on at most 256 rows per
    centre), on every core as the other libraries; its time is training only (no labels of all rows)."""
    import faiss

    km = faiss.Kmeans(X.shape[1], k, seed=seed + 1, **({} if max_iter is None else {"niter": max_iter}))
    km.train(np.ascontiguousarray(X, dtype=np.float32))
    return km.centroids.astype(np.float64), int(km.cp.niter)


COMPETITORS = {  # name -> (runner, kind, the library it needs)
    "sklearn-lloyd": (_sklearn, "lloyd", "sklearn"),
    "sklearn-elkan": (_sklearn, "elkan", "sklearn"),
    "sklearn-minibatch": (_sklearn, "minibatch", "sklearn"),
    "dask-ml": (_daskml, None, "dask_ml"),
    "faiss": (_faiss, None, "faiss"),
}


def _competitor_fits(name, path, k, seed, repeats, batch_size, max_iter=None, warm=True):
    runner, kind, _ = COMPETITORS[name]
    X = read(path)
    if warm:  # a first fit in a fresh process pays for imports and thread pools; our workers are warm, so warm it too
        runner(X[: max(4 * k, 200)], k, seed, kind, batch_size, max_iter)
    walls = []
    while len(walls) < repeats and sum(walls) < LONG_FIT_S:
        t = time.perf_counter()
        centers, n_iter = runner(X, k, seed, kind, batch_size, max_iter)
        walls.append(time.perf_counter() - t)
    return {"walls": walls, "centers": centers, "n_iter": n_iter, "peak": peak_memory()}


def _child(out, args):
    try:
        out.put(("ok", _competitor_fits(*args)))
    except Exception as exc:  # reported in the row: a competitor's failure must not end the suite
        out.put(("error", f"{type(exc).__name__}: {exc}"[:300]))


def competitor(name, path, X, k, seed, repeats, cap_s, batch_size=None, isolated=True, max_iter=None):
    """Row fields of a competitor's ``repeats`` fits in a fresh process, or {"status": "cap" | "error: ..."}.
    isolated=False runs them in this process, without the cap or the warm-up fit (the smoke run, where a
    process costs more than the fits); ``max_iter`` cuts the library's iterations (the smoke run too)."""
    import importlib.util

    library = COMPETITORS[name][2]
    if importlib.util.find_spec(library) is None:
        return {"status": f"not installed ({library})"}
    if not isolated:
        return _row(_competitor_fits(name, path, k, seed, repeats, batch_size, max_iter, warm=False), X)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_child, args=(out, (name, path, k, seed, repeats, batch_size, max_iter)), daemon=True)
    proc.start()
    try:
        status, got = out.get(timeout=cap_s)
    except queue.Empty:
        status, got = "cap", None
    finally:
        proc.kill()
        proc.join()
    if status != "ok":
        return {"status": status if got is None else f"error: {got}", "cap_s": cap_s}
    return _row(got, X)


def _row(got, X):
    wall = statistics.median(got["walls"])
    return {
        "wall_s": wall,
        "wall_runs": got["walls"],
        "qe": quantization_error(X, got["centers"]),
        "n_iter": got["n_iter"],
        "distance_evals": None,
        "overhead_share": None,
        "peak_worker_bytes": got["peak"],
    }
