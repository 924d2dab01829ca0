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
Not yet here: the estimator and ``algo="slk"``, IVF graphs for large N, rebuilding after a lost worker.
"""
from dataclasses import dataclass, field

import numpy as np

from ..engine.combine import ArgMax, Rows, Sum
from ..knn import neighbour_graph


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
        d2 = np.einsum("ij,ij->i", own[mine], own[mine])[:, None] - 2.0 * (own[mine] @ members.T) \
            + np.einsum("ij,ij->i", members, members)[None, :]
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


def slk(engine, seeds, *, mode="bo", lmbda=1.3, n_neighbors=4, sigma="reference", tol=1e-5, min_iter=3,
        max_iter=100, inner_tol=1e-6, inner_max_iter=1000):
    """SLK from seeds on the normalised rows (K × D); returns an ``SLKResult``."""
    seeds = np.asarray(seeds, dtype=np.float64)
    with neighbour_graph(engine, n_neighbors, normalize=True) as graph, \
            engine.halo("slk-nb", _neighbours):
        sigma = graph.reference_sigma() if sigma == "reference" else float(sigma)
        ids, modes = first_modes(engine, seeds, sigma, mode)
        state = SLKResult(None, modes, ids, sigma, 0)
        inner, e_old = [], None
        (neg_az,) = engine.reduce(_start_inner, (modes, sigma), (Sum(),))
        for it in range(1, max_iter + 1):
            inner.append(inner_loop(engine, lmbda, inner_tol, inner_max_iter))
            sizes, (_, top_ids), neg_az_old, lap = engine.reduce(_settle, lmbda, (Sum(), ArgMax(), Sum(), Sum()))
            if np.any(sizes == 0):   # the previous state, its labels kept on the workers
                state.labels, state.outer, state.inner, state.lost = labels_of(engine, "slk-labels-prev"), it, inner, True
                return state
            if mode == "bo":
                ids, modes = top_ids, rows_at(engine, top_ids)
                (neg_az,) = engine.reduce(_start_inner, (modes, sigma), (Sum(),))
                e = neg_az + lap
            else:
                e = neg_az_old + lap
                modes = mean_shift(engine, modes, sigma, sizes)
                engine.reduce(_start_inner, (modes, sigma), (Sum(),))
            state = SLKResult(None, modes, ids, sigma, it, list(inner))
            if it >= min_iter and e_old is not None and abs(e - e_old) <= tol * abs(e_old):
                break
            e_old = e
        state.labels = labels_of(engine, "slk-labels")
        return state


def labels_of(engine, key):
    """The rows' labels (state ``key``), to the driver once, at the end."""
    (labels,) = engine.reduce(_labels, key, (Rows(),))
    return labels
