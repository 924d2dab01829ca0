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


# one slot of a winner's pair table: partner (-1: empty), rows whose search space held it, Σ d² over them;
# the three share a cache line, which the separate arrays they replaced did not
PAIR = np.dtype([("key", np.int32), ("count", np.int32), ("dsum", np.float64)])


@njit(nogil=True, cache=True, inline="always")
def _add_pair(c, p, d2, offset, table, fill, spill_c, spill_p, spill_d, nspill):
    """(count, Σ d²) of partner p in winner c's open-addressing table (slots offset[c]..offset[c+1], a
    power of 2); a partner that finds the table half full goes to the spill list (all its later
    occurrences too), so nothing is lost."""
    base = offset[c]
    mask = offset[c + 1] - base - 1
    h = (p * 40503) & mask
    while True:  # ends: a table is never more than half full
        e = table[base + h]
        if e.key == p:
            e.count += 1
            e.dsum += d2
            return nspill
        if e.key == -1:
            break
        h = (h + 1) & mask
    if 2 * fill[c] < mask + 1:
        e = table[base + h]
        e.key = p
        e.count = 1
        e.dsum = d2
        fill[c] += 1
        return nspill
    spill_c[nspill] = c
    spill_p[nspill] = p
    spill_d[nspill] = d2
    return nspill + 1


@njit(nogil=True, cache=True)
def truncated_search(X, w, row0, mu, K, Kd2, winner, Gc, seed, extra_random, mark,
                     offset, table, fill, spill_c, spill_p, spill_d):
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
    table  : INOUT PAIR (offset[C],) the tables, keys -1 when empty;  fill : INOUT int32 (C,) keys used
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
            k = K[i, a]
            for g in range(G):  # branch-free: half the members are repeats, a branch mispredicts on them
                m = Gc[k, g]
                S[size] = m
                size += mark[m] != tag
                mark[m] = tag
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
        for s in range(size):  # apart from the selection: independent loads overlap
            d2[s] = sqdist_row(xr, mu, S[s])
        kept = 0
        for s in range(size):  # insertion into the sorted C' best; equal distances keep their order
            d = d2[s]
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
                nspill = _add_pair(c, S[s], d2[s], offset, table, fill, spill_c, spill_p, spill_d, nspill)
    return evals, minsum, changed, nspill


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def posterior_stats(X, w, K, Kd2, e, inv, sums, U, Q):
    """The M-step's sufficient statistics from the truncated posteriors s_nc = e_nc / Σ_c e_nc over K^(n);
    returns Σ_n w_n logsumexp_{c ∈ K^(n)}(−d²/2σ²), the data part of F.

    X : IN (n, d);  w : IN float64 (n,);  K : IN int32 (n, C');  Kd2 : IN float64 (n, C') ascending
    e : IN float64 (n, C') exp(−(d² − min d²)/2σ²);  inv : IN 1/2σ²
    sums : INOUT float64 (C, d)  Σ w s x;   U : INOUT float64 (C,) Σ w s;   Q : INOUT float64 (C,) Σ w s d²
    """
    n, Cp = K.shape
    d = X.shape[1]
    total = 0.0
    for i in range(n):
        z = 0.0
        for a in range(Cp):
            z += e[i, a]
        total += w[i] * (np.log(z) - Kd2[i, 0] * inv)
        wz = w[i] / z
        for a in range(Cp):
            c = K[i, a]
            ws = wz * e[i, a]
            U[c] += ws
            Q[c] += ws * Kd2[i, a]
            for t in range(d):
                sums[c, t] += ws * np.float64(X[i, t])
    return total


@njit(nogil=True, cache=True, inline="always")
def _gather(c, p, count, dsum, owner, slot, who, cnt, tot, k):
    """Add (count, Σ d²) to winner c's partner p in the dense lists who/cnt/tot (k used); returns k."""
    if owner[p] != c:
        owner[p] = c
        slot[p] = k
        who[k] = p
        cnt[k] = count
        tot[k] = dsum
        return k + 1
    cnt[slot[p]] += count
    tot[slot[p]] += dsum
    return k


@njit(nogil=True, cache=True)
def select_neighbours(offset, tables, spill_c, spill_p, spill_d, Gc, partners):
    """G_c ← {c} + the G−1 partners with the smallest mean d² (ties: lower index), from every part's pair
    tables and spills; clusters that won no row keep their G_c. Per winner the sums run over the parts'
    tables in part order, then its spills in part order, so they depend on the parts, not on the workers.

    offset : IN int64 (C + 1,) the tables' layout, shared by the parts;  tables : IN PAIR (P, offset[C])
    spill_c, spill_p, spill_d : IN (m,) int32 / int32 / float64, every part's spills in part order
    Gc : INOUT int32 (C, G);  partners : OUT int64 (C,) distinct partners per winner (sizes the next tables)
    """
    C, G = Gc.shape
    m = spill_c.shape[0]
    start = np.zeros(C + 1, np.int64)  # spills grouped by winner, order kept (counting sort)
    for j in range(m):
        start[spill_c[j] + 1] += 1
    for c in range(C):
        start[c + 1] += start[c]
    order = np.empty(m, np.int64)
    nxt = start[:C].copy()
    for j in range(m):
        order[nxt[spill_c[j]]] = j
        nxt[spill_c[j]] += 1
    owner = np.full(C, -1, np.int64)
    slot = np.empty(C, np.int64)
    who = np.empty(C, np.int32)
    cnt = np.empty(C, np.int64)
    tot = np.empty(C)
    best = np.empty(max(G - 1, 1))
    bestp = np.empty(max(G - 1, 1), np.int32)
    for c in range(C):
        k = 0
        for q in range(tables.shape[0]):
            for h in range(offset[c], offset[c + 1]):
                e = tables[q, h]
                if e.key >= 0:
                    k = _gather(c, e.key, e.count, e.dsum, owner, slot, who, cnt, tot, k)
        for r in range(start[c], start[c + 1]):
            j = order[r]
            k = _gather(c, spill_p[j], 1, spill_d[j], owner, slot, who, cnt, tot, k)
        partners[c] = k
        chosen = 0
        for r in range(k if G > 1 else 0):  # insertion into the G−1 smallest (mean, index)
            mean = tot[r] / cnt[r]
            p = who[r]
            pos = chosen
            if chosen == G - 1:
                if mean > best[G - 2] or (mean == best[G - 2] and p > bestp[G - 2]):
                    continue
                pos = G - 2
            while pos > 0 and (mean < best[pos - 1] or (mean == best[pos - 1] and p < bestp[pos - 1])):
                best[pos] = best[pos - 1]
                bestp[pos] = bestp[pos - 1]
                pos -= 1
            best[pos] = mean
            bestp[pos] = p
            chosen = min(chosen + 1, G - 1)
        for r in range(chosen):  # fewer partners than G−1 (only when |S_n| < G): the rest is kept
            Gc[c, 1 + r] = bestp[r]
