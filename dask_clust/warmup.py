"""Compile every numba kernel of the package into numba's on-disk cache before the first fit needs it.

A kernel is compiled the first time a process calls it with a new signature, and the result is written to
numba's cache (``NUMBA_CACHE_DIR``, else the package's ``__pycache__``). On a fresh install that happens
inside the first fit, in every worker process at once: tens of seconds of a worker's event loop spent in
LLVM, on every new pod of a Kubernetes cluster whose cache directory starts empty. ``dask-clust compile``
(``compile_kernels``) does it once, ahead of time: in an image's build (``deploy/docker/Dockerfile``), after
installing into a shared HPC environment, or before a test session.

The kernels are reached the way fits reach them: a small fit of every algorithm and its variants, in
float32 and float64, labelled and scored, in-process; the fits are split into ``PARTS`` lists, each run in
its own process, the processes side by side.
"""

import subprocess
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


def compile_part(part):
    """Run part ``part``'s fits in this process (its kernels compiled, or loaded from the cache)."""
    from . import api
    from .metrics import acc, nmi, quantization_error

    rng = np.random.default_rng(0)
    truth = rng.integers(0, 4, 2000)
    for dtype in (np.float32, np.float64):
        X = (rng.normal(size=(2000, 6)) + 4 * truth[:, None]).astype(dtype)
        for algo, params in FITS[part]:
            model = api.fit(X, algo, 4, client="in-process", random_state=0, progress=False, **params)
            labels = np.asarray(model.predict(X))
            nmi(truth, labels), acc(truth, labels), quantization_error(X, model.cluster_centers_)
        if part == 0:
            _compile_sparse(X, truth)
        else:
            _compile_criteria(X, model.cluster_centers_)
            _compile_eager_lloyd(X)


def _compile_eager_lloyd(X):
    """Lloyd's eager step (``kernels/assign.py: nearest_after_move``): the small fits above keep their bounds
    lazily, which a fit does only where its chunks have room for their exact sums (``blocks/lloyd.py:
    lazy_for``); these rows in chunks of 1 KiB have none."""
    import dask

    from . import api

    with dask.config.set({"dask_clust.min-chunk-bytes": "1KiB"}):
        api.fit(X, "kmeans", 4, client="in-process", random_state=0, progress=False)


def _compile_sparse(X, truth):
    """The CSR kernels (``kernels/sparse.py``), through the fits that take sparse rows, where scipy is installed
    (a sparse input needs it anyway)."""
    from . import algorithms, api

    try:
        from scipy import sparse
    except ImportError:
        return
    S = sparse.csr_matrix(np.where(X > 2, X, 0))
    for algo in algorithms.sparse():
        for init in ("k-means||", "k-means++"):
            model = api.fit(S, algo, 4, init=init, client="in-process", random_state=0, progress=False)
            np.asarray(model.predict(S))
    _compile_criteria(S, model.cluster_centers_)


def _compile_criteria(X, centers):
    """The partition criteria's kernels (``kernels/criteria.py``), for dense or CSR rows."""
    from .metrics import davies_bouldin_score, silhouette_score

    davies_bouldin_score(X, centers, client="in-process")
    silhouette_score(X, centers, sample_size=100, random_state=0, client="in-process")


def compile_kernels(cwd=None):
    """Compile every kernel into numba's cache, the ``PARTS`` parts in as many processes side by side.

    ``cwd``: the processes' directory (default: this process's). Raises ``RuntimeError`` naming the parts
    that failed."""
    parts = [subprocess.Popen([sys.executable, "-m", "dask_clust.warmup", str(part)], cwd=cwd) for part in range(PARTS)]
    failed = [part for part, process in enumerate(parts) if process.wait() != 0]
    if failed:
        raise RuntimeError(f"compiling the kernels failed in part(s) {failed} (their output is above)")


if __name__ == "__main__":
    compile_part(int(sys.argv[1]))
