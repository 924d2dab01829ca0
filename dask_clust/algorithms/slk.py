"""Scalable Laplacian K-modes (``algo="slk"``, SLK-BO and SLK-MS): the rows L2-normalised, seeded, then
SLK's outer iterations on their kNN graph.

I. M. Ziko, E. Granger, I. Ben Ayed, "Scalable Laplacian K-modes", NeurIPS 2018 (arXiv:1810.13044). The
steps, what the driver receives and how a lost worker is recovered are in
``dask_clust/blocks/laplacian_kmodes.py``.

``algo="slk"`` fits on the L2-normalised rows (the authors normalise; the paper does not say so): its
``cluster_centers_`` are the modes in that space and ``predict`` gives each new row's nearest mode there.
``labels_`` are SLK's labels of the training rows in input order; ``modes_index_`` (BO) the modes' input
rows; ``seeds_`` the seeds; ``graph_method_`` / ``graph_recall_`` the kNN graph's method and recall@r.

"""

import numbers
import warnings
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._params import FiniteArray, Interval, NoneOK, Options
from ..blocks.knn import METHODS
from ..blocks.laplacian_kmodes import slk
from ..blocks.seeding import SEEDERS, seed
from ..engine.data import l2_rows
from ..errors import InputError
from .registry import AlgorithmSpec, final_pass, register


@dataclass
class SLKConfig:
    n_clusters: int = 8
    mode: str = "bo"
    lmbda: float = 1.3
    n_neighbors: int = 4
    sigma: object = "reference"
    init: object = "k-means++"
    tol: float = 1e-5
    min_iter: int = 3
    max_iter: int = 100
    inner_tol: float = 1e-6
    inner_max_iter: int = 1000
    knn_method: str = "auto"
    nlist: object = None
    nprobe: int = 16

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "mode": [Options(("bo", "ms"))],
        "lmbda": [Interval(numbers.Real, 0, None, "left")],
        "n_neighbors": [Interval(numbers.Integral, 1, None)],
        "sigma": [Options(("reference",)), Interval(numbers.Real, 0, None, "neither")],
        "init": [Options(SEEDERS), FiniteArray()],
        "tol": [Interval(numbers.Real, 0, None, "left")],
        "min_iter": [Interval(numbers.Integral, 1, None)],
        "max_iter": [Interval(numbers.Integral, 1, None)],
        "inner_tol": [Interval(numbers.Real, 0, None, "left")],
        "inner_max_iter": [Interval(numbers.Integral, 1, None)],
        "knn_method": [Options(METHODS)],
        "nlist": [NoneOK(), Interval(numbers.Integral, 1, None)],
        "nprobe": [Interval(numbers.Integral, 1, None)],
    }
    docs: ClassVar = {
        "n_clusters": "Number of clusters (modes) K; at most the number of rows.",
        "mode": "'bo': the modes are the rows of largest z per cluster (SLK-BO); 'ms': mean-shift over each "
        "cluster's members (SLK-MS).",
        "lmbda": "Weight lambda of the Laplacian (graph) term; the authors' default 1.3.",
        "n_neighbors": "Out-edges per row of the kNN graph (the authors' 5-NN without the row itself: 4).",
        "sigma": "Kernel width: 'reference' (sigma^2 = sum of squared kNN distances / ((n_neighbors + 1) N), the "
        "authors' formula) or a positive float.",
        "init": "Seeding on the normalised rows, as k-means' init (the authors use k-means++).",
        "tol": "Outer loop: stop when the energy changes by at most tol, relative.",
        "min_iter": "Outer loop: fewest iterations before tol may stop it.",
        "max_iter": "Outer loop: most iterations.",
        "inner_tol": "Bound updates: stop when the relaxed energy changes by at most inner_tol, relative.",
        "inner_max_iter": "Bound updates: most per outer iteration.",
        "knn_method": "kNN graph: 'exact' (N^2 D work), 'ivf' (rows in nlist k-means cells, each cell searched "
        "exactly among its nprobe nearest cells; recall@n_neighbors on 1000 rows in graph_recall_) or "
        "'auto' (exact while N^2 D <= dask_clust.knn-exact-budget).",
        "nlist": "IVF cells; None: round(4 sqrt(N)).",
        "nprobe": "IVF: cells searched per cell (itself and its nearest); nprobe >= nlist is the exact graph.",
    }


def _normalised(chunk, params):
    """The rows L2-normalised (in float64, kept in the input's dtype; an all-zero row stays zero), weight 1."""
    return l2_rows(chunk.x).astype(chunk.x.dtype, copy=False), np.ones(chunk.x.shape[0])


def check_data(cfg, source):
    """Directions need two features; the kNN graph needs more rows than neighbours."""
    if source.n_features == 1:
        raise InputError(
            "algo='slk' clusters the rows' directions (it L2-normalises them): with n_features = 1 a "
            "direction is only a sign; use algo='kmeans'"
        )
    if cfg.n_neighbors >= source.n_samples:
        raise InputError(
            f"n_neighbors={cfg.n_neighbors} needs more than n_neighbors rows; got n_samples={source.n_samples}"
        )


def fit(engine, cfg, entropy, loop):
    """Normalise the rows (a second engine over them, on the same workers), seed, SLK, one QE pass."""
    n, k = engine.n_samples, cfg.n_clusters
    sizes = np.diff(engine.source.starts)
    # per row: the rows in float64, a, z and the halo's copy of z (K floats each), graph and labels
    state_bytes = 8 * (engine.n_features + 3 * k + 3 * cfg.n_neighbors + 4)
    with engine.sample(_normalised, None, sizes, entropy, row_bytes=state_bytes) as rows:
        seeds, seed_evals = seed(rows, k, cfg.init, entropy)
        out = slk(
            rows,
            seeds,
            loop,
            mode=cfg.mode,
            lmbda=cfg.lmbda,
            n_neighbors=cfg.n_neighbors,
            sigma=cfg.sigma,
            tol=cfg.tol,
            min_iter=cfg.min_iter,
            inner_tol=cfg.inner_tol,
            inner_max_iter=cfg.inner_max_iter,
            normalize=False,
            knn_method=cfg.knn_method,
            nlist=cfg.nlist,
            nprobe=cfg.nprobe,
            entropy=entropy,
        )
        qe, qe_evals = final_pass(rows, out.modes, "the normalised rows")
    if out.lost:
        warnings.warn(
            f"slk lost a cluster at outer iteration {out.outer} (a cluster kept no row): the model is the "
            "previous iteration's; try another random_state, fewer clusters or a smaller lmbda",
            RuntimeWarning,
            stacklevel=2,
        )
    from ..loop import FitResult

    extras = {
        "labels_": out.labels,
        "seeds_": np.asarray(seeds, np.float64),
        "sigma_": out.sigma,
        "lost_cluster_": out.lost,
        "inner_iterations_": list(out.inner),
        "graph_recall_": out.recall,
        "graph_method_": out.method,
        "row_normalization_": "l2",
    }
    if out.mode_ids is not None:
        extras["modes_index_"] = np.asarray(out.mode_ids, dtype=np.int64)
    search = n * (n - 1) if out.method == "exact" else 0  # IVF's candidates are not counted
    evals = seed_evals + search + qe_evals + sum(h.get("distance_evals", 0) for h in loop.history)
    return FitResult(out.modes, qe, loop.n_iter, loop.converged and not out.lost, int(evals), loop.history, extras)


register(
    AlgorithmSpec(
        name="slk",
        config=SLKConfig,
        fit=fit,
        estimator="SLK",
        summary="scalable Laplacian K-modes (SLK-BO / SLK-MS) on the kNN graph of the L2-normalised rows",
        reference="Ziko, Granger, Ben Ayed, NeurIPS 2018, arXiv:1810.13044",
        objective="the continuous energy −Σ a·z − λ Σ (W z)·z after each outer iteration",
        check_data=check_data,
        weighted=False,
        unweighted_because="its graph and modes weigh every row alike",
        model_extras=(("row_normalization_", lambda v, k: v == "l2", "'l2'"),),
    )
)
