"""predict_proba at large C (issue #17): 1 M x 16 rows, C = 4096, C' = 5, on a LocalCluster (2 workers x
1 thread). The truncated output (ids, probabilities) is computed and brought back; we report each
worker's peak resident size (target <= 2 GB per worker), what the driver receives, and what the dense
(n, C) form would have been. The model's means are 4096 rows of the data and σ² their mean squared
distance: predict_proba needs nothing else from a fit.
"""

import time

import dask
import numpy as np

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.models import ClusteringModel
from harness.common import emit, local_cluster
from harness.measure import Workers

N, D, C, CP = 1_000_000, 16, 4096, 5


def main():
    X, _ = make_blobs(N, D, 200, random_state=0)  # lazy, generated on the workers
    means = np.asarray(X[:: N // C][:C].compute(), dtype=np.float64)
    model = ClusteringModel("vcgmm", {"n_clusters": C}, means, extras_={"sigma2_": 1.0, "n_truncated_": CP})
    with local_cluster(2, 1) as client:
        workers = Workers(client)
        dask_clust.fit(np.asarray(X[:5000]), algo="kmeans", n_clusters=4, client=client, max_iter=1)  # warm
        workers.reset()
        base = workers.peak()
        t = time.perf_counter()
        ids, p = dask.compute(*model.predict_proba(X))
        wall = time.perf_counter() - t
        peak = workers.peak()
    row = {
        "n": N,
        "d": D,
        "C": C,
        "n_truncated": CP,
        "wall_s": wall,
        "worker_peak_bytes": peak,
        "worker_rss_before_bytes": base,
        "driver_received_bytes": ids.nbytes + p.nbytes,
        "dense_bytes": N * C * 8,
        "rows_sum_to_one": bool(np.allclose(p.sum(1), 1.0)),
    }
    emit("vcgmm_proba", row)
    print(
        f"\npredict_proba 1M x 16, C = 4096: {wall:.1f} s, worker peak {peak / 2**30:.2f} GiB (target <= 2 GB; "
        f"{base / 2**30:.2f} GiB before), driver received {row['driver_received_bytes'] / 1e6:.0f} MB "
        f"(dense would be {row['dense_bytes'] / 1e9:.1f} GB)"
    )


if __name__ == "__main__":
    main()
