"""Truncated variational E-steps for isotropic GMMs (vc-GMM / var-GMM-S, ALGORITHMS.md §1).

Per row n: the search space S_n = ∪_{c ∈ K^(n)} G_c (+1 random cluster), distances to its members,
K^(n) ← the C' closest; the winner c_o = argmin over S_n feeds the neighbourhood statistics, the
truncated posteriors over K^(n) feed the M-step. Random draws use a counter-based generator keyed by
(seed, global row), so they do not depend on how rows are chunked or which thread runs them.
"""
import numpy as np
from numba import njit

from .distance import sqdist_row

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


@njit(nogil=True, cache=True, inline="always")
def _add_pair(c, p, d2, offset, keys, count, dsum, fill, spill_c, spill_p, spill_d, nspill):
    """(count, Σ d²) of partner p in winner c's open-addressing table (slots offset[c]..offset[c+1], a
    power of 2); a partner that finds the table half full goes to the spill list (all its later
    occurrences too), so nothing is lost."""
    base = offset[c]
    mask = offset[c + 1] - base - 1
    h = (p * 40503) & mask
    while keys[base + h] != -1:
        if keys[base + h] == p:
            count[base + h] += 1
            dsum[base + h] += d2
            return nspill
        h = (h + 1) & mask
    if 2 * fill[c] < mask + 1:
        keys[base + h] = p
        count[base + h] = 1
        dsum[base + h] = d2
        fill[c] += 1
        return nspill
    spill_c[nspill] = c
    spill_p[nspill] = p
    spill_d[nspill] = d2
    return nspill + 1


@njit(nogil=True, cache=True)
def truncated_search(X, w, row0, mu, K, Kd2, winner, Gc, seed, extra_random, mark,
                     offset, keys, count, dsum, fill, spill_c, spill_p, spill_d):
    """E-step search and neighbourhood statistics, one pass: for every row S_n = ∪_{c ∈ K^(n)} G_c (+1),
    K^(n) ← its C' closest (ascending, stable), and for the winner c_o = K^(n)[0] the (count, Σ d²) of
    every other member of S_n. Returns (distance evaluations, Σ w min d², changed winners, spilled pairs).

    X      : IN    float32/float64 (n, d) rows;  w : IN float64 (n,) weights
    row0   : IN    int   global index of row 0 (keys the random draws)
    mu     : IN    float64 (C, d) means;   Gc : IN int32 (C, G) neighbourhoods, Gc[c, 0] = c
    K      : INOUT int32 (n, C') truncated sets;   Kd2 : OUT float64 (n, C') their squared distances
    winner : INOUT int32 (n,) K[:, 0] of the previous search (to count changes)
    seed   : IN    int   random stream of this search ("+1" and top-ups up to C')
    extra_random : IN bool  add one uniform random cluster to S_n (dropped when already present)
    mark   : SCRATCH int64 (C,), -1 on the first call of a search
    offset : IN    int64 (C + 1,) winner c's table is slots offset[c]..offset[c+1] (a power of 2)
    keys, count, dsum : INOUT int32 / int64 / float64 (offset[C],) the tables, keys -1 when empty
    fill   : INOUT int32 (C,) keys used per table
    spill_c, spill_p, spill_d : OUT (>= n·(C'·G)) pairs that found their table half full
    """
    n, Cp = K.shape
    C = np.uint64(mu.shape[0])
    G = Gc.shape[1]
    S = np.empty(Cp * G + 1, np.int32)
    d2 = np.empty(Cp * G + 1)
    top = np.empty(Cp, np.int32)
    topd = np.empty(Cp)
    xr = np.empty(X.shape[1])
    evals = 0
    changed = 0
    nspill = 0
    minsum = 0.0
    for i in range(n):
        for t in range(X.shape[1]):
            xr[t] = X[i, t]
        size = 0
        tag = row0 + i
        for a in range(Cp):
            for g in range(G):
                m = Gc[K[i, a], g]
                if mark[m] != tag:
                    mark[m] = tag
                    S[size] = m
                    size += 1
        state = _row_state(seed, tag)
        draws = 1 if extra_random else 0
        while draws > 0 or size < Cp:
            state, z = _splitmix(state)
            m = np.int32(z % C)
            draws -= 1
            if mark[m] != tag:
                mark[m] = tag
                S[size] = m
                size += 1
        kept = 0
        for s in range(size):  # insertion into the sorted C' best; equal distances keep their order
            d = sqdist_row(xr, mu, S[s])
            d2[s] = d
            if kept < Cp or d < topd[kept - 1]:
                pos = kept if kept < Cp else Cp - 1
                while pos > 0 and d < topd[pos - 1]:
                    topd[pos] = topd[pos - 1]
                    top[pos] = top[pos - 1]
                    pos -= 1
                topd[pos] = d
                top[pos] = S[s]
                kept = min(kept + 1, Cp)
        evals += size
        for a in range(Cp):
            K[i, a] = top[a]
            Kd2[i, a] = topd[a]
        c = top[0]
        changed += winner[i] != c
        winner[i] = c
        minsum += w[i] * topd[0]
        for s in range(size):
            if S[s] != c:
                nspill = _add_pair(c, S[s], d2[s], offset, keys, count, dsum, fill, spill_c, spill_p, spill_d,
                                   nspill)
    return evals, minsum, changed, nspill


@njit(nogil=True, cache=True)
def table_pairs(offset, keys, count, dsum, out_c, out_p, out_count, out_sum):
    """The per-winner tables as (c, c~, count, Σ d²) grouped by c; returns how many.

    offset : IN int64 (C + 1,);  keys, count, dsum : IN (offset[C],);  out_* : OUT (>= used keys,)
    """
    m = 0
    for c in range(offset.shape[0] - 1):
        for h in range(offset[c], offset[c + 1]):
            if keys[h] != -1:
                out_c[m] = c
                out_p[m] = keys[h]
                out_count[m] = count[h]
                out_sum[m] = dsum[h]
                m += 1
    return m


@njit(nogil=True, cache=True)
def merge_pairs(pair_c, pair_p, count, dsum, n_clusters, out_c, out_p, out_count, out_sum):
    """Sum the pairs (c, c~) that occur more than once, in input order (so the sums do not depend on
    anything but that order); the output is grouped by c ascending. Linear time: a counting sort by c,
    then a marker per partner. Returns the number of distinct pairs written.

    pair_c, pair_p : IN int32 (m,);  count : IN int64 (m,);  dsum : IN float64 (m,)
    out_c, out_p, out_count, out_sum : OUT (>= m,)
    """
    m = pair_c.shape[0]
    start = np.zeros(n_clusters + 1, np.int64)
    for j in range(m):
        start[pair_c[j] + 1] += 1
    for c in range(n_clusters):
        start[c + 1] += start[c]
    order = np.empty(m, np.int64)
    fill = start[:n_clusters].copy()
    for j in range(m):
        order[fill[pair_c[j]]] = j
        fill[pair_c[j]] += 1
    owner = np.full(n_clusters, -1, np.int64)
    slot = np.empty(n_clusters, np.int64)
    k = 0
    for c in range(n_clusters):
        for r in range(start[c], start[c + 1]):
            j = order[r]
            p = pair_p[j]
            if owner[p] != c:
                owner[p] = c
                slot[p] = k
                out_c[k] = c
                out_p[k] = p
                out_count[k] = count[j]
                out_sum[k] = dsum[j]
                k += 1
            else:
                out_count[slot[p]] += count[j]
                out_sum[slot[p]] += dsum[j]
    return k


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
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
