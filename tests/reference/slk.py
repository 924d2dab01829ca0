"""Plain-numpy Scalable Laplacian K-modes (SLK-BO and SLK-MS), written from Ziko, Granger & Ben Ayed
(NeurIPS 2018, §3) as blocks/laplacian_kmodes.py states them: the oracle for dask_clust's slk. Slow and simple on
purpose: a brute-force kNN graph, dense kernels, float64."""

import numpy as np


def normalize(X):
    X = np.asarray(X, np.float64)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def sqdist(X, Y):
    """Direct Σ (x − y)² for every pair, in row blocks that keep the temporary near 16 M values."""
    step = max(1, (1 << 24) // max(1, Y.size))
    return np.concatenate([((X[i : i + step, None, :] - Y[None, :, :]) ** 2).sum(-1) for i in range(0, len(X), step)])


def knn_graph(X, r=4):
    """(N, r) out-neighbours of every row, the row itself excluded, sorted by (distance, row id)."""
    d = sqdist(X, X)
    np.fill_diagonal(d, np.inf)
    ids = np.broadcast_to(np.arange(len(X)), d.shape)
    order = np.lexsort((ids, d), axis=1)[:, :r]
    return order, np.take_along_axis(d, order, 1)


def sigma_reference(knn_d2, rho=5):
    """σ with σ² = Σ(squared kNN distances) / (ρN): the reference divides by ρ = r + 1."""
    return float(np.sqrt(knn_d2.sum() / (rho * len(knn_d2))))


def kernel(X, M, sigma):
    return np.exp(-sqdist(X, M) / (2 * sigma**2))


def softmax(v):
    e = np.exp(v - v.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def neighbour_sum(graph, z):
    """b_p = Σ_{q in N(p)} z_q, summed in ascending neighbour id."""
    b = np.zeros_like(z)
    for q in np.sort(graph, axis=1).T:
        b += z[q]
    return b


def relaxed_energy(z, a, b, lmbda):
    zlogz = np.where(z > 0, z * np.log(np.where(z > 0, z, 1.0)), 0.0)
    return zlogz.sum() - (a * z).sum() - lmbda * (b * z).sum()


def inner_loop(a, graph, lmbda, z, tol=1e-6, max_iter=1000):
    """Jacobi bound updates z <- softmax(a + λ W z) until the relaxed energy changes <= tol relative."""
    e_old, b = None, neighbour_sum(graph, z)
    for it in range(1, max_iter + 1):
        z = softmax(a + lmbda * b)
        b = neighbour_sum(graph, z)  # the energy's, and the next update's
        e = relaxed_energy(z, a, b, lmbda)
        if e_old is not None and abs(e - e_old) <= tol * abs(e_old):
            return z, it
        e_old = e
    return z, max_iter


def bo_first_modes(X, seeds, sigma):
    """Per cluster of the nearest-seed partition, the member of highest in-cluster kernel density."""
    labels = sqdist(X, seeds).argmin(1)
    modes = np.empty(len(seeds), np.int64)
    for l in range(len(seeds)):
        members = np.flatnonzero(labels == l)
        modes[l] = members[kernel(X[members], X[members], sigma).sum(1).argmax()]
    return modes


def mean_shift(X, members, m, sigma, tol=1e-5, max_iter=1000):
    for _ in range(max_iter):
        g = kernel(X[members], m[None], sigma)[:, 0]
        new = (g[:, None] * X[members]).sum(0) / g.sum()
        moved = np.linalg.norm(new - m)
        m = new
        if moved < tol:
            break
    return m


def continuous_energy(z, a, graph, lmbda):
    """The outer loop's energy: −Σ a·z − λ Σ (W z)·z (the relaxed energy without its entropy term)."""
    return -(a * z).sum() - lmbda * (neighbour_sum(graph, z) * z).sum()


def ms_modes(X, labels, modes, sigma):
    return np.stack([mean_shift(X, np.flatnonzero(labels == l), modes[l], sigma) for l in range(len(modes))])


def slk(
    X,
    seeds,
    mode="bo",
    lmbda=1.3,
    sigma=None,
    graph=None,
    n_neighbors=4,
    outer_tol=1e-5,
    outer_min=3,
    outer_max=100,
    inner_tol=1e-6,
    inner_max=1000,
):
    """SLK on rows X (normalised here) from k-means++ seeds. Returns a dict: labels, z, modes (and
    mode_ids for BO), sigma, graph, outer, inner (count per outer iteration), lost.

    Each outer iteration: z from softmax(a) by the inner loop, hard labels, the modes (BO: argmax z per
    cluster; MS: mean-shift over the hard members from the previous modes), a from the new modes. The
    stopping energy takes BO's new a and MS's previous a (the reference's order: BO's modes come out of
    the z-update, MS's mean-shift runs after the energy). A cluster with no row: the previous outer
    iteration's state (before the first, the nearest-seed partition)."""
    X = normalize(X)
    if graph is None:
        graph, d2 = knn_graph(X, n_neighbors)
    else:
        d2 = ((X[:, None, :] - X[graph]) ** 2).sum(-1)
    if sigma is None:
        sigma = sigma_reference(d2, n_neighbors + 1)
    seeds = np.asarray(seeds, np.float64)
    k = len(seeds)
    labels = sqdist(X, seeds).argmin(1)
    if mode == "bo":
        ids = bo_first_modes(X, seeds, sigma)
        modes = X[ids]
    else:
        ids, modes = None, ms_modes(X, labels, seeds, sigma)
    a = kernel(X, modes, sigma)
    state = dict(labels=labels, z=softmax(a), modes=modes, mode_ids=ids)
    inner, e_old = [], None
    for it in range(1, outer_max + 1):
        z, n = inner_loop(a, graph, lmbda, softmax(a), inner_tol, inner_max)
        inner.append(n)
        labels = z.argmax(1)
        if len(np.unique(labels)) < k:
            return dict(state, sigma=sigma, graph=graph, outer=it, inner=inner, lost=True)
        if mode == "bo":
            ids = z.argmax(0)  # ties: the smallest row id
            a_new = kernel(X, X[ids], sigma)
            e = continuous_energy(z, a_new, graph, lmbda)
            modes = X[ids]
        else:
            e = continuous_energy(z, a, graph, lmbda)
            modes = ms_modes(X, labels, modes, sigma)
            a_new = kernel(X, modes, sigma)
        a = a_new
        state = dict(labels=labels, z=z, modes=modes, mode_ids=ids)
        if it >= outer_min and e_old is not None and abs(e - e_old) <= outer_tol * abs(e_old):
            break
        e_old = e
    return dict(state, sigma=sigma, graph=graph, outer=it, inner=inner, lost=False)
