"""Compile the package's numba kernels into their on-disk cache before the test session starts.

Every worker process of every LocalCluster the tests start would otherwise compile the kernels it runs,
and the workers of one cluster reach each kernel at the same moment, so on a fresh install each kernel
was compiled once per worker instead of once (about 3 of a CI run's 14 minutes). Run as
``python -m tests.compile_kernels PART`` for PART in 0 .. PARTS-1, the parts in parallel; conftest.py does.
"""

import sys

import numpy as np

PARTS = 2
# each part's fits: (algorithm, parameters); the kernels the two parts share are compiled by both
FITS = (
    (
        ("kmeans", {"init": "k-means||"}),
        ("kmeans", {"init": "k-means++"}),
        ("kmeans", {"init": "afkmc2"}),
        ("vcgmm", {}),
        ("vargmm", {}),
        ("minibatch", {}),
        ("slk", {"mode": "ms", "knn_method": "exact"}),
        ("slk", {"mode": "bo", "knn_method": "ivf"}),
    ),
    (
        ("nmbatch", {"bounds": "elkan"}),
        ("nmbatch", {"bounds": "hamerly"}),
        ("vrkm", {}),
        ("sbe", {}),
        ("slk", {"mode": "bo", "knn_method": "exact"}),
        # a full covariance's search, costs and scatter kernels
        ("vargmm", {"covariance_type": "full", "weights": "learned"}),
    ),
)


def main(part):
    import dask_clust
    from dask_clust.metrics import acc, nmi, quantization_error

    rng = np.random.default_rng(0)
    truth = rng.integers(0, 4, 2000)
    for dtype in (np.float32, np.float64):
        X = (rng.normal(size=(2000, 6)) + 4 * truth[:, None]).astype(dtype)
        for algo, params in FITS[part]:
            model = dask_clust.fit(
                X, algo=algo, n_clusters=4, client="in-process", random_state=0, progress=False, **params
            )
            labels = np.asarray(model.predict(X))
            nmi(truth, labels), acc(truth, labels), quantization_error(X, model.cluster_centers_)


if __name__ == "__main__":
    main(int(sys.argv[1]))
