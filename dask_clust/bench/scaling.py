"""``--suite scaling``: strong scaling from 1 to 2 workers on this machine, and the driver's cost per
iteration against the number of workers (LocalClusters of 2 to 16 single-thread processes on tiny data):
the inputs of the multi-node plan."""
import logging
import statistics

from .. import api
from ..datasets import make_blobs
from ..engine.cluster import connect
from . import measure

logger = logging.getLogger("dask_clust.bench")

STRONG = (("blobs1m_d16", "kmeans", 200, {"max_iter": 12, "tol": 0.0}),
          ("blobs1m_d16", "vcgmm", 1000, {}))
OVERHEAD_WORKERS = (2, 4, 8, 16)


def strong(run):
    """Per-iteration time (Lloyd) and whole-fit time (vc-GMM) on 1 and 2 single-thread workers."""
    for name, algo, k, params in STRONG:
        path, X = run.data(name)
        k = min(k, len(X) // 4)
        for n_workers in (1, 2):
            with connect(n_workers=n_workers, threads_per_worker=1) as client:
                api.fit(X[:20_000], algo, min(k, 50), random_state=0, client=client, max_iter=2)  # warm workers
                walls, per_iter = [], []
                for _ in range(run.repeats):
                    m = api.fit(path, algo, k, random_state=0, client=client, **params)
                    walls.append(m.engine_["wall_s"])
                    per_iter.append(statistics.median(h["wall_s"] for h in m.history_[2:] or m.history_))
            run.emit({"kind": "strong", "data": name, "algo": algo, "k": k, "workers": n_workers,
                      "wall_s": statistics.median(walls), "s_per_iter": statistics.median(per_iter),
                      "n_iter": m.n_iter_})


def overhead(run):
    """Median empty-iteration time against the number of workers, 64 chunks of tiny data."""
    X = make_blobs(64 * 500, 8, 10, chunks=500, random_state=0)[0]  # lazy: generated on the workers
    for n_workers in OVERHEAD_WORKERS[:2] if run.tiny else OVERHEAD_WORKERS:
        logger.info("overhead with %d workers", n_workers)
        with connect(n_workers=n_workers, threads_per_worker=1) as client:
            ms = measure.engine_overhead_ms(X, client)
        run.emit({"kind": "overhead", "workers": n_workers, "overhead_ms": ms, "chunks": 64,
                  "rows": X.shape[0]})


def run_all(run):
    strong(run)
    overhead(run)
