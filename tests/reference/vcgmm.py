"""Plain-numpy truncated variational EM for the isotropic GMM (vc-GMM, Alg. 1-2 of Hirschberger,
Forster, Lücke, TPAMI 2022), written step by step, per row, for small data. The oracle of
tests/test_vcgmm.py: deterministic given the initial K^(n) and G_c (no "+1", C' <= G)."""

import numpy as np


def sqdist(x, mu, S):
    return ((x.astype(np.float64) - mu[S]) ** 2).sum(axis=1)


def estep_search(X, mu, K, Gc, cost=sqdist):
    """S_n = ∪_{c ∈ K^(n)} G_c (K^(n) first in its order, then each G_c's others as first seen; equal
    distances keep this order); K^(n) ← its C' closest. Returns the new K, their d²,
    and per row the search space with its distances. ``cost(x, mu, S)``: another distance of row x to the
    clusters S (a mixture's −ℓ)."""
    n, Cp = K.shape
    newK = np.empty_like(K)
    Kd2 = np.empty(K.shape)
    spaces = []
    for i in range(n):
        S = [int(c) for c in K[i]]
        for c in K[i]:
            for g in Gc[c]:
                if g not in S:
                    S.append(int(g))
        S = np.array(S)
        d2 = cost(X[i], mu, S)
        order = np.argsort(d2, kind="stable")[:Cp]
        newK[i] = S[order]
        Kd2[i] = d2[order]
        spaces.append((S, d2))
    return newK, Kd2, spaces


def update_neighbourhoods(Gc, K, spaces):
    """G_c ← {c} + the G−1 partners with the smallest mean d² over the rows c won (ties: lower index)."""
    C, G = Gc.shape
    Gc = Gc.copy()
    for c in range(C):
        count, total = {}, {}
        for i in np.flatnonzero(K[:, 0] == c):
            S, d2 = spaces[i]
            for p, d in zip(S, d2):
                if p != c:
                    count[p] = count.get(p, 0) + 1
                    total[p] = total.get(p, 0.0) + d
        if not count:
            continue
        partners = sorted(count, key=lambda p: (total[p] / count[p], p))
        Gc[c, 1:] = partners[: G - 1]
    return Gc


def posteriors(Kd2, sigma2):
    a = -Kd2 / (2 * sigma2)
    top = a.max(axis=1, keepdims=True)
    e = np.exp(a - top)
    z = e.sum(axis=1, keepdims=True)
    return e / z, (top + np.log(z))[:, 0]


def vcgmm(X, w, mu, K, Gc, tol=1e-4, max_iter=300, unit=False):
    """Returns (means, σ², F per iteration). ``unit`` (rows on the unit sphere): each mean is its rows'
    posterior-weighted mean direction Σ w s x / ||Σ w s x||."""
    X = np.asarray(X)
    n, D = X.shape
    C = mu.shape[0]
    W = w.sum()
    mu = mu.astype(np.float64).copy()
    sigma2 = None
    F = []
    for _ in range(max_iter):
        K, Kd2, spaces = estep_search(X, mu, K, Gc)
        Gc = update_neighbourhoods(Gc, K, spaces)
        if sigma2 is None:
            sigma2 = (w * Kd2[:, 0]).sum() / (D * W)
        s, lse = posteriors(Kd2, sigma2)
        F.append((w * lse).sum() - W * (0.5 * D * np.log(2 * np.pi * sigma2) + np.log(C)))
        ws = w[:, None] * s
        U = np.zeros(C)
        sums = np.zeros((C, D))
        np.add.at(U, K, ws)
        for a in range(K.shape[1]):
            np.add.at(sums, K[:, a], ws[:, a, None] * X.astype(np.float64))
        new = mu.copy()
        won = U > 0
        new[won] = sums[won] / (np.linalg.norm(sums[won], axis=1) if unit else U[won])[:, None]
        resid = sum(ws[i, a] * ((X[i] - new[K[i, a]]) ** 2).sum() for i in range(n) for a in range(K.shape[1]))
        mu, sigma2 = new, resid / (D * W)
        if len(F) > 1 and abs(F[-1] - F[-2]) < tol * abs(F[-1]):
            break
    return mu, sigma2, np.array(F)
