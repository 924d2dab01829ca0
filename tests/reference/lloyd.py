"""Plain-numpy Lloyd k-means, line by line as Lloyd (1982) and scikit-learn's ``_kmeans_single_lloyd``:
the oracle for dask_clust's kmeans. Slow and simple on purpose: brute-force float64 distances."""

import numpy as np


def sqdist(X, C):
    X = np.asarray(X, np.float64)
    return np.stack([((X - c) ** 2).sum(-1) for c in np.asarray(C, np.float64)], axis=1).reshape(len(X), len(C))


def label_sums(X, labels, w, k):
    """Σ w x over each label's rows."""
    return np.stack([(w[labels == j, None] * X[labels == j]).sum(0) for j in range(k)]).reshape(k, X.shape[1])


def assign(X, C):
    d = sqdist(X, C)
    labels = d.argmin(1)  # ties: lowest index
    return labels, d[np.arange(len(X)), labels]


def spherical_kmeans(X, init, sample_weight=None, max_iter=300):
    """Spherical k-means (Dhillon & Modha, Machine Learning 2001, §3) on rows the caller put on the unit
    sphere: each row to the centre of largest inner product (ties: lowest index), each centre its rows' mean
    direction Σ w x / ||Σ w x|| (kept where no row chose it), until no label changes. Returns centres,
    labels, Σ w (1 − x·c) of the returned centres and n_iter."""
    X = np.asarray(X, np.float64)
    w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, np.float64)
    C = np.array(init, np.float64)
    C /= np.linalg.norm(C, axis=1)[:, None]
    labels = None
    for it in range(max_iter):
        new_labels = np.argmax(X @ C.T, axis=1)
        if labels is not None and np.array_equal(labels, new_labels):
            break
        labels = new_labels
        sums = label_sums(X, labels, w, len(C))
        norms = np.linalg.norm(sums, axis=1)
        C[norms > 0] = sums[norms > 0] / norms[norms > 0, None]
    labels = np.argmax(X @ C.T, axis=1)
    return C, labels, float((w * (1 - (X * C[labels]).sum(axis=1))).sum()), it + 1


def lloyd(X, init, sample_weight=None, max_iter=300, tol=1e-4):
    """Returns centres, labels, QE (of the returned centres), n_iter, relocations per iteration."""
    X = np.asarray(X, np.float64)
    w = np.ones(len(X)) if sample_weight is None else np.asarray(sample_weight, np.float64)
    tol_abs = tol * np.var(X, axis=0).mean()
    C = np.array(init, np.float64)
    k = len(C)
    prev = None
    relocations = []
    strict = False
    for it in range(max_iter):
        labels, d = assign(X, C)
        sums = label_sums(X, labels, w, k)
        weights = np.bincount(labels, weights=w, minlength=k)
        empty = np.flatnonzero(weights == 0)
        if len(empty):  # farthest rows from their centre, ties by lowest row index
            far = np.lexsort((np.arange(len(X)), -d))[: len(empty)]
            for e, i in zip(empty, far):
                o = labels[i]
                if weights[o] - w[i] > 0:
                    sums[o] -= w[i] * X[i]
                    weights[o] -= w[i]
                sums[e] = w[i] * X[i]
                weights[e] = w[i]
        relocations.append(len(empty))
        new = C.copy()
        nz = weights > 0
        new[nz] = sums[nz] / weights[nz, None]
        shift = ((new - C) ** 2).sum()
        strict = prev is not None and np.array_equal(prev, labels) and not len(empty)
        C = new
        prev = labels
        if strict or shift <= tol_abs:
            break
    labels, d = assign(X, C)
    return C, labels, float((w * d).sum()), it + 1, relocations
