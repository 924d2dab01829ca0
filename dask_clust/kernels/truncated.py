"""Truncated variational E-steps for isotropic GMMs (vc-GMM / var-GMM-S, ALGORITHMS.md §1).

Per row n: the search space S_n = ∪_{c ∈ K^(n)} G_c (+1 random cluster), distances to its members,
K^(n) ← the C' closest; the winner c_o = argmin over S_n feeds the neighbourhood statistics, the
truncated posteriors over K^(n) feed the M-step. Random draws use a counter-based generator keyed by
(seed, global row), so they do not depend on how rows are chunked or which thread runs them.
"""
import numpy as np
from numba import njit

from .distance import sqdist

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(nogil=True, cache=True, inline="always")
def _splitmix(state):
    """One step of SplitMix64: (next state, 64 random bits)."""
    state = state + _GOLDEN
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@njit(nogil=True, cache=True, inline="always")
def _row_state(seed, row):
    return np.uint64(seed) ^ (np.uint64(row) * _GOLDEN)


@njit(nogil=True, cache=True)
def draw_distinct(first, row0, n_clusters, seed, out):
    """Rows of distinct random cluster indices: out[i, 0] = first[i] when first[i] >= 0, the others
    uniform among the clusters not yet in the row (rejection; out.shape[1] <= n_clusters).

    first : IN  int32 (n,)  a fixed first entry per row, or -1
    row0  : IN  int         global index of row 0 (keys the random stream)
    out   : OUT int32 (n, m)
    """
    C = np.uint64(n_clusters)
    for i in range(out.shape[0]):
        state = _row_state(seed, row0 + i)
        t = 0
        if first[i] >= 0:
            out[i, 0] = first[i]
            t = 1
        while t < out.shape[1]:
            state, z = _splitmix(state)
            u = np.int32(z % C)
            dup = False
            for s in range(t):
                if out[i, s] == u:
                    dup = True
                    break
            if not dup:
                out[i, t] = u
                t += 1


@njit(nogil=True, cache=True)
def truncated_search(X, w, row0, mu, K, Kd2, Gc, seed, extra_random, S_idx, S_d2, S_size, mark):
    """E-step search: K^(n) ← the C' closest clusters of S_n for every row; returns
    (distance evaluations, Σ w_n min_c d²).

    X      : IN    float32/float64 (n, d) rows;  w : IN float64 (n,) weights
    row0   : IN    int   global index of row 0 (keys the random draws)
    mu     : IN    float64 (C, d) means
    K      : INOUT int32 (n, C') truncated sets; on return sorted by distance (K[:, 0] = winner)
    Kd2    : OUT   float64 (n, C') squared distances to K's members
    Gc     : IN    int32 (C, G) neighbourhoods, Gc[c, 0] = c
    seed   : IN    int   random stream of this iteration (used for "+1" and for top-ups)
    extra_random : IN bool  add one uniform random cluster to S_n ("+1")
    S_idx, S_d2 : OUT int32 / float64 (n, >= C'·G + 1) the search spaces and their distances
    S_size : OUT   int32 (n,)
    mark   : SCRATCH int64 (C,) filled with -1 by the caller (last row that put a cluster in S)
    """
    n, Cp = K.shape
    C = np.uint64(mu.shape[0])
    G = Gc.shape[1]
    evals = 0
    minsum = 0.0
    for i in range(n):
        size = 0
        tag = row0 + i
        for a in range(Cp):
            c = K[i, a]
            for g in range(G):
                m = Gc[c, g]
                if mark[m] != tag:
                    mark[m] = tag
                    S_idx[i, size] = m
                    size += 1
        state = _row_state(seed, tag)
        draws = 1 if extra_random else 0
        while draws > 0 or size < Cp:  # "+1" is dropped when already present; top-ups are not
            state, z = _splitmix(state)
            m = np.int32(z % C)
            draws -= 1
            if mark[m] != tag:
                mark[m] = tag
                S_idx[i, size] = m
                size += 1
        for s in range(size):
            S_d2[i, s] = sqdist(X[i], mu[S_idx[i, s]])
        evals += size
        for a in range(Cp):  # partial selection sort: the C' smallest, ascending (ties: first seen)
            best = a
            for s in range(a + 1, size):
                if S_d2[i, s] < S_d2[i, best]:
                    best = s
            if best != a:
                S_d2[i, a], S_d2[i, best] = S_d2[i, best], S_d2[i, a]
                S_idx[i, a], S_idx[i, best] = S_idx[i, best], S_idx[i, a]
            K[i, a] = S_idx[i, a]
            Kd2[i, a] = S_d2[i, a]
        S_size[i] = size
        minsum += w[i] * S_d2[i, 0]
    return evals, minsum


@njit(nogil=True, cache=True)
def neighbourhood_pairs(S_idx, S_d2, S_size, n_clusters, out_c, out_p, out_count, out_sum, order, start, tab):
    """Aggregate, per winner c_o = S_idx[n, 0], the (count, Σ d²) of every other member of S_n:
    the statistics from which G_c is re-chosen. Returns the number of (c_o, c~) pairs written,
    grouped by c_o ascending.

    S_idx, S_d2, S_size : IN  from ``truncated_search`` (n rows)
    out_c, out_p : OUT int32 (>= Σ (S_size − 1),);  out_count : OUT int64;  out_sum : OUT float64
    order : SCRATCH int64 (n,);  start : SCRATCH int64 (C + 1,);  tab : SCRATCH int64 (2, C) filled with -1
    """
    n = S_size.shape[0]
    start[:] = 0
    for i in range(n):
        start[S_idx[i, 0] + 1] += 1
    for c in range(n_clusters):
        start[c + 1] += start[c]
    fill = start[:n_clusters].copy()
    for i in range(n):
        c = S_idx[i, 0]
        order[fill[c]] = i
        fill[c] += 1
    npairs = 0
    for c in range(n_clusters):
        for r in range(start[c], start[c + 1]):
            i = order[r]
            for s in range(1, S_size[i]):
                p = S_idx[i, s]
                if tab[0, p] != c:
                    tab[0, p] = c
                    tab[1, p] = npairs
                    out_c[npairs] = c
                    out_p[npairs] = p
                    out_count[npairs] = 1
                    out_sum[npairs] = S_d2[i, s]
                    npairs += 1
                else:
                    j = tab[1, p]
                    out_count[j] += 1
                    out_sum[j] += S_d2[i, s]
    return npairs


@njit(nogil=True, cache=True)
def posterior_stats(X, w, K, Kd2, sigma2, sums, U, Q):
    """Truncated posteriors s_nc = softmax_{c ∈ K^(n)}(−d²/2σ²) (max-shifted) and the M-step's
    sufficient statistics; returns Σ_n w_n logsumexp_{c ∈ K^(n)}(−d²/2σ²), the data part of F.

    X : IN (n, d);  w : IN float64 (n,);  K : IN int32 (n, C');  Kd2 : IN float64 (n, C')
    sums : INOUT float64 (C, d)  Σ w s x;   U : INOUT float64 (C,) Σ w s;   Q : INOUT float64 (C,) Σ w s d²
    """
    n, Cp = K.shape
    d = X.shape[1]
    inv = 0.5 / sigma2
    s = np.empty(Cp)
    total = 0.0
    for i in range(n):
        top = -np.inf
        for a in range(Cp):
            top = max(top, -Kd2[i, a] * inv)
        z = 0.0
        for a in range(Cp):
            s[a] = np.exp(-Kd2[i, a] * inv - top)
            z += s[a]
        total += w[i] * (top + np.log(z))
        for a in range(Cp):
            c = K[i, a]
            ws = w[i] * s[a] / z
            U[c] += ws
            Q[c] += ws * Kd2[i, a]
            for t in range(d):
                sums[c, t] += ws * np.float64(X[i, t])
    return total


@njit(nogil=True, cache=True)
def select_neighbours(pair_c, pair_p, count, dsum, Gc):
    """G_c ← {c} + the G−1 partners with the smallest mean d² (ties: lower index); clusters that won
    no row keep their G_c.

    pair_c, pair_p : IN int32 (m,) pairs grouped by pair_c (each (c, p) once);  count, dsum : IN (m,)
    Gc : INOUT int32 (C, G)
    """
    G = Gc.shape[1]
    m = pair_c.shape[0]
    a = 0
    while a < m:
        c = pair_c[a]
        b = a
        while b < m and pair_c[b] == c:
            b += 1
        chosen = 0
        last_mean = -np.inf
        last_p = -1
        while chosen < G - 1:  # G−1 rounds of "next smallest (mean, index) after the last one"
            best_mean = np.inf
            best_p = -1
            for j in range(a, b):
                mean = dsum[j] / count[j]
                p = pair_p[j]
                after = mean > last_mean or (mean == last_mean and p > last_p)
                if after and (mean < best_mean or (mean == best_mean and p < best_p)):
                    best_mean = mean
                    best_p = p
            if best_p < 0:  # fewer partners than G−1 (cannot happen when |S_n| >= G): keep the rest
                break
            chosen += 1
            Gc[c, chosen] = best_p
            last_mean = best_mean
            last_p = best_p
        a = b
