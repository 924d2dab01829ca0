"""Scalable Laplacian K-modes, SLK-BO and SLK-MS, on the engine (ALGORITHMS.md §5).

I. M. Ziko, E. Granger, I. Ben Ayed, "Scalable Laplacian K-modes", NeurIPS 2018 (arXiv:1810.13044).

  1. normalise the rows; the kNN graph W (r out-edges, ``knn``) and σ from it
  2. first modes: BO, per cluster of the nearest-seed partition the member of highest in-cluster kernel
     density; MS, mean-shift over those members from each seed
  repeat (outer, at least ``min_iter``, at most ``max_iter``, until the energy changes <= tol relative)
  3. a = k(x, modes); z = softmax(a)
  4. bound updates: z <- softmax(a + λ W z), every row from the previous z (Jacobi: one halo exchange of
     z per update), until the relaxed energy Σ z log z − a·z − λ (W z)·z changes <= inner_tol relative
  5. hard labels; the modes: BO, argmax_p z_pl per cluster (ties to the lowest row id); MS, mean-shift
     over the cluster's members from its mode
  6. the energy −a·z − λ (W z)·z, with BO's new a and MS's previous a (the authors' order)
  A cluster left without rows: the previous outer iteration's state, flagged ``lost``.

The energy of a z is known one update late (it needs W z, which the next update's halo brings), so the
inner loop runs one update past the authors' count and keeps the previous z: the counts are theirs.

Per update the driver receives one number (the energy); per outer iteration K cluster sizes, K argmax
values and ids (BO) or K·D mean-shift sums per mean-shift step (MS); it holds the K·D modes. Rows and z
stay on the workers; z of cross-partition neighbours goes partition to partition.
``algo="slk"`` fits on the L2-normalised rows (the authors normalise; the paper does not say so): its
``cluster_centers_`` are the modes in that space and ``predict`` gives each new row's nearest mode there.
``labels_`` are SLK's labels of the training rows. Not yet here: IVF graphs for large N, rebuilding after
a lost worker.
"""
import numbers
import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .._params import ArrayOf2D, Interval, Options
from ..engine.combine import ArgMax, Rows, Sum
from ..engine.data import InputError, l2_rows
from ..knn import METHODS, gemm_sqdist, neighbour_graph, squared_norms
from ..seeding import SEEDERS, seed
from . import AlgorithmSpec, final_pass, register


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
    knn_method: str = "exact"

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "mode": [Options(("bo", "ms"))],
        "lmbda": [Interval(numbers.Real, 0, None, "left")],
        "n_neighbors": [Interval(numbers.Integral, 1, None)],
        "sigma": [Options(("reference",)), Interval(numbers.Real, 0, None, "neither")],
        "init": [Options(SEEDERS), ArrayOf2D()],
        "tol": [Interval(numbers.Real, 0, None, "left")],
        "min_iter": [Interval(numbers.Integral, 1, None)],
        "max_iter": [Interval(numbers.Integral, 1, None)],
        "inner_tol": [Interval(numbers.Real, 0, None, "left")],
        "inner_max_iter": [Interval(numbers.Integral, 1, None)],
        "knn_method": [Options(METHODS)],
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
        "knn_method": "kNN graph: 'exact' (N^2 D work; IVF for large N is not built yet).",
    }


@dataclass
class SLKResult:
    labels: np.ndarray        # per row, in the engine's row order
    modes: np.ndarray         # (K, D) on the normalised rows
    mode_ids: np.ndarray      # BO: the modes' row ids; MS: None
    sigma: float
    outer: int
    inner: list = field(default_factory=list)
    lost: bool = False


def kernel(x, modes, sigma):
    """k(x, m) = exp(−||x − m||² / (2σ²)), direct distances."""
    return np.exp(-((x[:, None, :] - modes[None, :, :]) ** 2).sum(-1) / (2 * sigma ** 2))


def softmax(v):
    e = np.exp(v - v.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def nearest_seed(x, seeds):
    return ((x[:, None, :] - seeds[None, :, :]) ** 2).sum(-1).argmin(1)


# ---------------------------------------------------------------- per-chunk steps

def _neighbours(chunk, params):
    """The halo plan: each row's neighbours in ascending id, so W z is summed in that order anywhere."""
    return np.sort(chunk.state["knn"][0], axis=1).ravel()


def _first_labels(chunk, seeds):
    chunk.state["slk-labels"] = nearest_seed(chunk.state["knn-x"], seeds)
    return (np.bincount(chunk.state["slk-labels"], minlength=len(seeds)),)


def _densest_members(chunk, params):
    """BO's first modes: each row's in-cluster kernel density (all rows through the halo), the densest
    row per cluster (ties to the lowest id)."""
    seeds, sigma = params
    everyone = chunk.halo["knn-x"]
    all_labels = nearest_seed(everyone, seeds)
    own, labels = chunk.state["knn-x"], chunk.state["slk-labels"]
    k = len(seeds)
    best, ids = np.full(k, -np.inf), np.zeros(k, np.int64)
    for l in np.unique(labels):
        mine = np.flatnonzero(labels == l)
        members = everyone[all_labels == l]
        # GEMM form: N·D per member pair would dominate the whole fit (mnist5k: 5 s of 7)
        d2 = gemm_sqdist(own[mine], members, squared_norms(own[mine]), squared_norms(members))
        density = np.exp(-np.maximum(d2, 0.0) / (2 * sigma ** 2)).sum(1)
        j = int(np.argmax(density))
        best[l], ids[l] = density[j], chunk.start + mine[j]
    return ((best, ids),)


def _rows_of(chunk, ids):
    lo, hi = np.searchsorted(ids, [chunk.start, chunk.stop])
    return ids[lo:hi], chunk.state["knn-x"][ids[lo:hi] - chunk.start]


def _ms_sums(chunk, params):
    """One mean-shift step's partial sums per cluster over its hard members: Σ g x and Σ g."""
    modes, sigma = params
    x, labels = chunk.state["knn-x"], chunk.state["slk-labels"]
    k = len(modes)
    sums, weights = np.zeros((k, x.shape[1])), np.zeros(k)
    for l in np.unique(labels):
        members = x[labels == l]
        g = np.exp(-((members - modes[l]) ** 2).sum(1) / (2 * sigma ** 2))
        sums[l] = (g[:, None] * members).sum(0)
        weights[l] = g.sum()
    return sums, weights


def _start_inner(chunk, params):
    """a from the modes and z = softmax(a); returns −Σ a·z_last for the energy with this a (MS's uses
    the previous a, BO's the new one: both come from here)."""
    modes, sigma = params
    a = kernel(chunk.state["knn-x"], modes, sigma)
    last = chunk.state.get("slk-z-prev")
    chunk.state["slk-a"] = a
    chunk.state["slk-z"] = softmax(a)
    return (0.0 if last is None else -(a * last).sum(),)


def _update(chunk, lmbda):
    """One bound update from the previous z (halo): z_new = softmax(a + λ W z); returns the relaxed energy
    of the previous z (its W z is this update's)."""
    z, a = chunk.state["slk-z"], chunk.state["slk-a"]
    n, k = z.shape
    nb = chunk.halo["slk-z"].reshape(n, -1, k)
    b = np.zeros_like(z)
    for j in range(nb.shape[1]):
        b += nb[:, j]
    zlogz = np.where(z > 0, z * np.log(np.where(z > 0, z, 1.0)), 0.0)
    energy = zlogz.sum() - (a * z).sum() - lmbda * (b * z).sum()
    chunk.state["slk-z-prev"], chunk.state["slk-b-prev"] = z, b
    chunk.state["slk-z"] = softmax(a + lmbda * b)
    return (energy,)


def _settle(chunk, lmbda):
    """After the inner loop (z = the previous update's): labels, cluster sizes, BO's argmax rows, and the
    energy's parts −a·z and −λ (W z)·z."""
    z, b, a = chunk.state["slk-z-prev"], chunk.state["slk-b-prev"], chunk.state["slk-a"]
    labels = z.argmax(1)
    chunk.state["slk-labels-prev"], chunk.state["slk-labels"] = chunk.state["slk-labels"], labels
    k = z.shape[1]
    top = (z.max(0), chunk.start + z.argmax(0))
    return np.bincount(labels, minlength=k), top, -(a * z).sum(), -lmbda * (b * z).sum()


def _labels(chunk, key):
    return (chunk.state[key],)


# ---------------------------------------------------------------- the driver

def first_modes(engine, seeds, sigma, mode):
    """BO: the densest member of each nearest-seed cluster (ids, rows); MS: mean-shift from the seeds."""
    (sizes,) = engine.reduce(_first_labels, seeds, (Sum(),))
    if mode == "bo":
        ((_, ids),) = engine.reduce(_densest_members, (seeds, sigma), (ArgMax(),), halo=("knn-all", "knn-x"))
        return ids, rows_at(engine, ids)
    return None, mean_shift(engine, seeds, sigma, sizes)


def rows_at(engine, ids):
    uniq, inverse = np.unique(ids, return_inverse=True)
    _, rows = engine.reduce(_rows_of, uniq, (Rows(), Rows()))
    return rows[inverse]


def mean_shift(engine, modes, sigma, sizes, tol=1e-5, max_iter=1000):
    """Every cluster's mode moved by mean-shift over its members until it moves < tol (each on its own
    count, as one cluster at a time would)."""
    modes = np.array(modes, dtype=np.float64)
    active = sizes > 0
    for _ in range(max_iter):
        if not active.any():
            break
        sums, weights = engine.reduce(_ms_sums, (modes, sigma), (Sum(), Sum()))
        new = sums[active] / weights[active, None]
        moved = np.linalg.norm(new - modes[active], axis=1)
        modes[active] = new
        active[np.flatnonzero(active)[moved < tol]] = False
    return modes


def inner_loop(engine, lmbda, tol, max_iter):
    """Bound updates until the relaxed energy changes <= tol relative; returns the authors' count (the
    update whose z is kept)."""
    energies = []
    for p in range(1, max_iter + 2):
        (e,) = engine.reduce(_update, lmbda, (Sum(),), halo=("slk-nb", "slk-z"))
        energies.append(e)   # energy of z_{p-1}
        if p >= 3 and abs(energies[-1] - energies[-2]) <= tol * abs(energies[-2]):
            return p - 1
    return max_iter


def slk(engine, seeds, loop, *, mode="bo", lmbda=1.3, n_neighbors=4, sigma="reference", tol=1e-5, min_iter=3,
        inner_tol=1e-6, inner_max_iter=1000, normalize=True):
    """SLK from seeds (K × D, on the normalised rows); ``loop`` (an ``engine.Loop``) runs the outer
    iterations and records each one's energy. Returns an ``SLKResult``."""
    seeds = np.asarray(seeds, dtype=np.float64)
    with neighbour_graph(engine, n_neighbors, normalize=normalize) as graph, \
            engine.halo("slk-nb", _neighbours):
        sigma = graph.reference_sigma() if sigma == "reference" else float(sigma)
        if not sigma > 0:
            raise InputError(f"sigma from the graph is 0: every row's {n_neighbors} nearest rows are copies of it "
                             "(after L2 normalisation); pass sigma= a positive float or raise n_neighbors")
        ids, modes = first_modes(engine, seeds, sigma, mode)
        state = SLKResult(None, modes, ids, sigma, 0)
        inner, e_old = [], None
        (neg_az,) = engine.reduce(_start_inner, (modes, sigma), (Sum(),))
        for it in loop:
            inner.append(inner_loop(engine, lmbda, inner_tol, inner_max_iter))
            sizes, (_, top_ids), neg_az_old, lap = engine.reduce(_settle, lmbda, (Sum(), ArgMax(), Sum(), Sum()))
            if np.any(sizes == 0):   # the previous state, its labels kept on the workers
                loop.record(np.nan, 0, None, inner_iterations=inner[-1], lost_cluster=True)
                state.labels, state.outer, state.inner, state.lost = labels_of(engine, "slk-labels-prev"), it + 1, inner, True
                return state
            if mode == "bo":
                ids, modes = top_ids, rows_at(engine, top_ids)
                (neg_az,) = engine.reduce(_start_inner, (modes, sigma), (Sum(),))
                e = neg_az + lap
            else:
                e = neg_az_old + lap
                modes = mean_shift(engine, modes, sigma, sizes)
                engine.reduce(_start_inner, (modes, sigma), (Sum(),))
            state = SLKResult(None, modes, ids, sigma, it + 1, list(inner))
            loop.record(e, engine.n_samples * len(modes), None, centers=modes, inner_iterations=inner[-1])
            if it + 1 >= min_iter and e_old is not None and abs(e - e_old) <= tol * abs(e_old):
                loop.converged = True
                break
            e_old = e
        state.labels = labels_of(engine, "slk-labels")
        return state


def _normalised(chunk, params):
    """The rows L2-normalised (in float64, kept in the input's dtype; an all-zero row stays zero), weight 1."""
    return l2_rows(chunk.x).astype(chunk.x.dtype, copy=False), np.ones(chunk.x.shape[0])


def fit(engine, cfg, entropy, loop):
    """Normalise the rows (a second engine over them, on the same workers), seed, SLK, one QE pass."""
    if getattr(engine.source, "weights", None) is not None:
        raise InputError("algo='slk' does not take sample_weight: its graph and modes weigh every row alike")
    n, k = engine.n_samples, cfg.n_clusters
    if engine.n_features == 1:
        raise InputError("algo='slk' clusters the rows' directions (it L2-normalises them): with n_features = 1 a "
                         "direction is only a sign; use algo='kmeans'")
    if cfg.n_neighbors >= n:
        raise InputError(f"n_neighbors={cfg.n_neighbors} needs more than n_neighbors rows; got n_samples={n}")
    if k > n:
        raise InputError(f"n_samples={n} should be >= n_clusters={k}")
    sizes = np.diff(engine.source.starts)
    with engine.sample(_normalised, None, sizes, entropy) as rows:
        seeds, seed_evals = seed(rows, k, cfg.init, entropy)
        out = slk(rows, seeds, loop, mode=cfg.mode, lmbda=cfg.lmbda, n_neighbors=cfg.n_neighbors, sigma=cfg.sigma,
                  tol=cfg.tol, min_iter=cfg.min_iter, inner_tol=cfg.inner_tol, inner_max_iter=cfg.inner_max_iter,
                  normalize=False)
        qe, qe_evals = final_pass(rows, out.modes, "the normalised rows")
    if out.lost:
        warnings.warn(f"slk lost a cluster at outer iteration {out.outer} (a cluster kept no row): the model is the "
                      "previous iteration's; try another random_state, fewer clusters or a smaller lmbda",
                      RuntimeWarning, stacklevel=2)
    from ..engine import FitResult

    extras = {"labels_": out.labels, "sigma_": out.sigma, "lost_cluster_": out.lost,
              "inner_iterations_": list(out.inner), "graph_recall_": 1.0, "row_normalization_": "l2"}
    if out.mode_ids is not None:
        extras["modes_index_"] = np.asarray(out.mode_ids, dtype=np.int64)
    evals = seed_evals + n * (n - 1) + qe_evals + sum(h.get("distance_evals", 0) for h in loop.history)
    return FitResult(out.modes, qe, loop.n_iter, loop.converged and not out.lost, int(evals), loop.history, extras)


register(AlgorithmSpec(
    name="slk", config=SLKConfig, fit=fit, estimator="SLK",
    summary="scalable Laplacian K-modes (SLK-BO / SLK-MS) on the kNN graph of the L2-normalised rows",
    reference="Ziko, Granger, Ben Ayed, NeurIPS 2018, arXiv:1810.13044",
    objective="the continuous energy −Σ a·z − λ Σ (W z)·z after each outer iteration",
    weighted=False,
))


def labels_of(engine, key):
    """The rows' labels (state ``key``), to the driver once, at the end."""
    (labels,) = engine.reduce(_labels, key, (Rows(),))
    return labels
