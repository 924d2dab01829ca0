"""Truncated variational E-steps for Gaussian mixtures (vc-GMM / var-GMM-S: Hirschberger,
Forster, Lücke, TPAMI 2022, Alg. 1-2, and the same steps with per-cluster diagonal variances and weights).

Per row n: the search space S_n = ∪_{c ∈ K^(n)} G_c (+1 random cluster), the cost of each member (the
squared distance for the isotropic model with equal weights, −log π_c N(x; μ_c, Σ_c) for the others),
K^(n) ← the C' cheapest; the winner c_o = argmin over S_n feeds the neighbourhood statistics, the
truncated posteriors over K^(n) feed the M-step. Random draws use ``streams``' counter-based generator
keyed by (seed, global row), so they do not depend on how rows are chunked or which thread runs them.

Rows are a dense (n, D) array or a CSR block given as (indptr, indices, data, xx), xx the rows' squared norms
(documents): ``truncated_search`` and ``posterior_stats`` read a row through ``_row_costs`` and
``_add_row``, which numba resolves by the rows' type; a CSR row's squared distance is ||x||² − 2 x·μ + ||μ||²
from its non-zeros (O(nnz) a member of S_n, not O(D)). CSR rows take the squared-distance costs only (the
isotropic model with equal weights: vc-GMM's own).
"""

import numpy as np
from numba import njit, types
from numba.extending import overload

from .._random import row_state, splitmix
from .distance import scaled_sqdist_row, sqdist_row
from .sparse import row_sqdist


def diagonal_metric(var, weights):
    """``truncated_search``'s h and offset for the components N(μ_c, diag σ²_c) of weight π_c, so that its cost
    is −ℓ_c(x) = −log π_c N(x; μ_c, diag σ²_c): h = 1/2σ², offset_c = ½ Σ_d log 2πσ²_cd − log π_c (+∞ for
    π_c = 0). Row-wise (a shard of the components gives the bits of the whole)."""
    with np.errstate(divide="ignore"):
        return 0.5 / var, 0.5 * np.log(2 * np.pi * var).sum(axis=1) - np.log(weights)


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
        state = row_state(seed, row0 + i)
        t = 0
        if first[i] >= 0:
            out[i, 0] = first[i]
            t = 1
        while t < out.shape[1]:
            state, z = splitmix(state)
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
def _search_space(i, tag, K, Gc, C, seed, extra_random, mark, o, space):
    """Row i's S_n = ∪_{c ∈ K^(n)} G_c (+1 random, topped up to C'), packed into space[o:]; returns |S_n|."""
    Cp, G = K.shape[1], Gc.shape[1]
    # K^(n) first, in the previous search's ascending order (each c is slot 0 of its G_c): the selection
    # then mostly finds the best already sorted, and its branches predict (a fifth of the search)
    for a in range(Cp):
        k = K[i, a]
        space[o + a] = k
        mark[k] = tag
    m_ = Cp
    for a in range(Cp):
        k = K[i, a]
        for g in range(1, G):  # branch-free: half the members are repeats, a branch mispredicts on them
            m = Gc[k, g]
            space[o + m_] = m
            m_ += mark[m] != tag
            mark[m] = tag
    state = row_state(seed, tag)
    draws = 1 if extra_random else 0
    while draws > 0 or m_ < Cp:
        state, z = splitmix(state)
        m = np.int32(z % C)
        draws -= 1
        if mark[m] != tag:
            mark[m] = tag
            space[o + m_] = m
            m_ += 1
    return m_


@njit(nogil=True, cache=True, inline="always")
def _keep_cheapest(i, o, m_, space, space_d2, w, K, Kd2, winner, top, topd):
    """K^(n) ← the C' cheapest of row i's S_n (ascending; equal costs keep their order); returns (w · the
    least cost, whether the winner changed)."""
    Cp = K.shape[1]
    kept = 0
    for s in range(o, o + m_):  # insertion into the sorted C' best
        d = space_d2[s]
        if kept < Cp or d < topd[kept - 1]:
            at = kept if kept < Cp else Cp - 1
            while at > 0 and d < topd[at - 1]:
                topd[at] = topd[at - 1]
                top[at] = top[at - 1]
                at -= 1
            topd[at] = d
            top[at] = space[s]
            kept = min(kept + 1, Cp)
    for a in range(Cp):
        K[i, a] = top[a]
        Kd2[i, a] = topd[a]
    c = top[0]
    changed = winner[i] != c
    winner[i] = c
    return w[i] * topd[0], changed


def _row_costs(X, i, xr, mu, mnorm, h, offset, space, space_d2, o, m_):
    """space_d2[s] = row i's cost of cluster space[s], for s in o..o + m_ (``truncated_search``)."""


@overload(_row_costs, inline="always")
def _row_costs_rows(X, i, xr, mu, mnorm, h, offset, space, space_d2, o, m_):
    if isinstance(X, types.Array):

        def dense(X, i, xr, mu, mnorm, h, offset, space, space_d2, o, m_):
            for t in range(X.shape[1]):
                xr[t] = X[i, t]
            scaled = h.shape[0] > 0
            for s in range(o, o + m_):  # apart from the selection: independent loads overlap
                if scaled:
                    space_d2[s] = scaled_sqdist_row(xr, mu, h, offset, space[s])
                else:
                    space_d2[s] = sqdist_row(xr, mu, space[s])

        return dense

    def csr(X, i, xr, mu, mnorm, h, offset, space, space_d2, o, m_):
        indptr, indices, data, xx = X
        for s in range(o, o + m_):
            space_d2[s] = row_sqdist(indptr, indices, data, i, xx[i], mu, mnorm, space[s])

    return csr


def _add_row(X, i, ws, c, sums):
    """sums[c] += ws · x_i."""


@overload(_add_row, inline="always")
def _add_row_rows(X, i, ws, c, sums):
    if isinstance(X, types.Array):

        def dense(X, i, ws, c, sums):
            for t in range(X.shape[1]):
                sums[c, t] += ws * np.float64(X[i, t])

        return dense

    def csr(X, i, ws, c, sums):
        indptr, indices, data, _ = X
        for q in range(indptr[i], indptr[i + 1]):
            sums[c, indices[q]] += ws * np.float64(data[q])

    return csr


def _add_row_moments(X, i, ws, c, mu, sums, Q):
    """sums[c] += ws · x_i and Q[c, d] += ws (x_id − μ_cd)² (a diagonal model's M-step)."""


@overload(_add_row_moments, inline="always")
def _add_row_moments_rows(X, i, ws, c, mu, sums, Q):
    if isinstance(X, types.Array):

        def dense(X, i, ws, c, mu, sums, Q):
            for t in range(X.shape[1]):
                x = np.float64(X[i, t])
                v = x - mu[c, t]
                sums[c, t] += ws * x
                Q[c, t] += ws * (v * v)

        return dense

    def csr(X, i, ws, c, mu, sums, Q):
        raise ValueError("CSR rows take the squared-distance costs only")

    return csr


@njit(nogil=True, cache=True)
def truncated_search(
    X, w, row0, mu, mnorm, h, offset, K, Kd2, winner, Gc, seed, extra_random, mark, pos, space, space_d2
):
    """E-step search, one pass: for every row S_n = ∪_{c ∈ K^(n)} G_c (+1), K^(n) ← its C' cheapest
    (ascending, stable); S_n and its costs are kept for the neighbourhood statistics. Returns
    (cost evaluations, Σ w min cost, changed winners).

    X      : IN    float32/float64 (n, d) rows, or a CSR block (indptr, indices, data, xx);  w : IN float64 (n,)
    row0   : IN    int   global index of row 0 (keys the random draws)
    mu     : IN    float64 (C, d) means;   Gc : IN int32 (C, G) neighbourhoods, Gc[c, 0] = c
    mnorm  : IN    float64 (C,) ||μ_c||² (read for CSR rows only)
    h, offset : IN float64 (C, d), (C,) the cost offset[c] + Σ h[c] (x − μ_c)² (``scaled_sqdist_row``),
                   or (0, 0), (0,): the squared distance (the only cost of CSR rows)
    K      : INOUT int32 (n, C') truncated sets;   Kd2 : OUT float64 (n, C') their costs
    winner : INOUT int32 (n,) K[:, 0] of the previous search (to count changes)
    seed   : IN    int   random stream of this search ("+1" and top-ups up to C')
    extra_random : IN bool  add one uniform random cluster to S_n (dropped when already present)
    mark   : SCRATCH int64 (C,), -1 on the first call of a search
    pos    : OUT int64 (n + 1,) row i's search space is entries pos[i]..pos[i+1] of
    space, space_d2 : OUT int32 / float64 (>= n·(C'·G + 1)) S_n and its costs, packed row after row
    """
    n, Cp = K.shape
    C = np.uint64(mu.shape[0])
    top = np.empty(Cp, np.int32)
    topd = np.empty(Cp)
    xr = np.empty(mu.shape[1])
    evals = 0
    changed = 0
    minsum = 0.0
    pos[0] = 0
    for i in range(n):
        o = pos[i]  # packed row after row: a row touches only the cache lines it fills
        m_ = _search_space(i, row0 + i, K, Gc, C, seed, extra_random, mark, o, space)
        _row_costs(X, i, xr, mu, mnorm, h, offset, space, space_d2, o, m_)
        pos[i + 1] = pos[i] + m_
        evals += m_
        least, ch = _keep_cheapest(i, o, m_, space, space_d2, w, K, Kd2, winner, top, topd)
        changed += ch
        minsum += least
    return evals, minsum, changed


@njit(nogil=True, cache=True)
def search_spaces(row0, n_clusters, K, Gc, seed, extra_random, mark, pos, space):
    """The first half of ``truncated_search`` for costs computed apart (a full covariance's, grouped by component in a
    kernel): every row's S_n packed into space, row i's at pos[i]..pos[i+1]; returns the entries."""
    C = np.uint64(n_clusters)
    pos[0] = 0
    for i in range(K.shape[0]):
        pos[i + 1] = pos[i] + _search_space(i, row0 + i, K, Gc, C, seed, extra_random, mark, pos[i], space)
    return pos[K.shape[0]]


@njit(nogil=True, cache=True)
def keep_truncated(w, K, Kd2, winner, pos, space, space_d2):
    """The second half: K^(n) ← the C' cheapest of each row's S_n, given their costs; returns (Σ w min cost,
    changed winners)."""
    Cp = K.shape[1]
    top = np.empty(Cp, np.int32)
    topd = np.empty(Cp)
    minsum = 0.0
    changed = 0
    for i in range(K.shape[0]):
        least, ch = _keep_cheapest(i, pos[i], pos[i + 1] - pos[i], space, space_d2, w, K, Kd2, winner, top, topd)
        changed += ch
        minsum += least
    return minsum, changed


@njit(nogil=True, cache=True, inline="always")
def _accumulate(c, p, n, d2sum, owner, slot, who, cnt, tot, k):
    """Add (n, d2sum) to winner c's partner p in the dense lists who/cnt/tot (k entries used; owner[p] == c
    when p already has one, at slot[p]); returns the new k."""
    if owner[p] != c:
        owner[p] = c
        slot[p] = k
        who[k] = p
        cnt[k] = n
        tot[k] = d2sum
        return k + 1
    cnt[slot[p]] += n
    tot[slot[p]] += d2sum
    return k


# the index of a 64-bit word's single set bit b: _BIT_INDEX[(b · _DE_BRUIJN) >> 58] (a de Bruijn sequence's
# 6-bit windows are distinct), so a bitset hands back its members without testing the bits between them
_DE_BRUIJN = np.uint64(0x03F79D71B4CB0A89)
_BIT_INDEX = np.zeros(64, np.int64)
_BIT_INDEX[[((1 << i) * 0x03F79D71B4CB0A89 % (1 << 64)) >> 58 for i in range(64)]] = np.arange(64)


@njit(nogil=True, cache=True)
def pair_statistics(winner, pos, space, space_d2, n_clusters, inv_unit, shift, cap, key, count, dsum):
    """Step 5's sufficient statistics of a block: for every winner c_o and every other member c~ of the
    search spaces of the rows c_o won, (count, Σ cost(x_n, c~)), each cost taken as min(cost − shift, cap).
    Rows are visited grouped by winner (a counting sort); one winner's partners accumulate in dense
    per-cluster sums and a bitset of the partners seen, which hands them back in ascending order in
    O(C/64 + partners): a block's keys c_o·C + c~ come out sorted and distinct, so a ``KeyedSum`` takes them
    without sorting. Each pair's Σ cost adds its rows
    in ascending order, whatever the thread, and leaves as an integer count of 1/inv_unit (rounded), so
    the blocks' sums add exactly as int64, one word instead of a float's fixed-point three: the partners
    are only ranked by mean cost, for which a grid 2^-62 of the largest possible sum is ample.

    winner : IN int32 (n,);  pos, space, space_d2 : IN truncated_search's packed S_n and costs
    inv_unit, shift, cap : IN float64 costs enter as min(cost − shift, cap) >= 0, on a grid 1/inv_unit (a power
    of two) such that the sum over any pair's rows is < 2^62 (``pair_grid``)
    key, count, dsum : OUT int64 / int32 / int64 (>= pos[n]) the entries, key = c_o·C + c~
    Returns the number of entries.
    """
    n = winner.shape[0]
    C = n_clusters
    first = np.zeros(C + 1, np.int64)
    for i in range(n):
        first[winner[i] + 1] += 1
    for c in range(C):
        first[c + 1] += first[c]
    order = np.empty(n, np.int64)
    nxt = first[:C].copy()
    for i in range(n):
        order[nxt[winner[i]]] = i
        nxt[winner[i]] += 1
    seen = np.zeros((C + 63) >> 6, np.uint64)
    cnt = np.zeros(C, np.int32)
    tot = np.zeros(C)
    one, low6 = np.uint64(1), np.uint64(63)
    k = 0
    for c in range(C):
        for r in range(first[c], first[c + 1]):
            i = order[r]
            for s in range(pos[i], pos[i + 1]):  # the winner itself too (no branch), dropped below
                p = space[s]
                cnt[p] += 1
                tot[p] += min(space_d2[s] - shift, cap)
                seen[p >> 6] |= one << (np.uint64(p) & low6)
        if first[c + 1] > first[c]:
            seen[c >> 6] &= ~(one << (np.uint64(c) & low6))
            cnt[c] = 0
            tot[c] = 0.0
            for wi in range(seen.shape[0]):
                word = seen[wi]
                if word == 0:
                    continue
                seen[wi] = 0
                while word != 0:  # lowest set bit first, found in O(1): ascending partners
                    low = word & (~word + one)
                    p = (wi << 6) + _BIT_INDEX[(low * _DE_BRUIJN) >> np.uint64(58)]
                    key[k] = c * C + p
                    count[k] = cnt[p]
                    dsum[k] = np.int64(tot[p] * inv_unit + 0.5)
                    cnt[p] = 0
                    tot[p] = 0.0
                    k += 1
                    word ^= low
    return k


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def posterior_stats(X, w, K, Kd2, e, inv, mu, sums, U, Q):
    """The M-step's sufficient statistics from the truncated posteriors s_nc = e_nc / Σ_c e_nc over K^(n);
    returns Σ_n w_n logsumexp_{c ∈ K^(n)}(−inv·cost), the data part of F (all of F when the costs are −ℓ and
    inv = 1).

    X : IN (n, d), or a CSR block (``truncated_search``);  w : IN float64 (n,);  K : IN int32 (n, C')
    Kd2 : IN float64 (n, C') costs, ascending
    e : IN float64 (n, C') exp(−(cost − min cost)·inv)
    mu : IN float64 (C, d) the means the costs used, or (0, 0) when the costs are squared distances
    sums : INOUT float64 (C, d)  Σ w s x;   U : INOUT float64 (C,) Σ w s
    Q : INOUT float64 (C, d) Σ w s (x_d − μ_cd)², per dimension (diagonal variances), or, without ``mu``,
        (C, 1) Σ w s d²
    """
    n, Cp = K.shape
    per_dim = mu.shape[0] > 0
    total = 0.0
    for i in range(n):
        if w[i] == 0.0:  # nothing to add, and its costs may all be +∞ (components of weight 0)
            continue
        z = 0.0
        for a in range(Cp):
            z += e[i, a]
        total += w[i] * (np.log(z) - Kd2[i, 0] * inv)
        wz = w[i] / z
        for a in range(Cp):
            c = K[i, a]
            ws = wz * e[i, a]
            U[c] += ws
            if per_dim:
                _add_row_moments(X, i, ws, c, mu, sums, Q)
            else:
                Q[c, 0] += ws * Kd2[i, a]
                _add_row(X, i, ws, c, sums)
    return total


@njit(nogil=True, cache=True)
def select_neighbours(start, keys, lo, count, dsum, Gc, n_clusters):
    """G_c ← {c} + the G−1 partners with the smallest mean cost (ties: lower index), from every block's
    ``pair_statistics``, summed in block order (so they depend on the chunks, not on the workers);
    clusters that won no row keep their G_c. Gc may be a range of the C clusters (a shard): partners are
    any of the ``n_clusters``.

    start : IN int64 (B, R + 1) block b's winner, row c of Gc, has entries start[b, c]..start[b, c + 1] of
    keys, count, dsum : IN int64 / int32 / int64 every block's entries, key = (lo + c)·n_clusters + partner
    (``pair_statistics``; its Σ d² on its integer grid)
    lo : IN int the cluster of Gc's row 0
    Gc : INOUT int32 (R, G)
    """
    R, G = Gc.shape
    owner = np.full(n_clusters, -1, np.int64)
    slot = np.empty(n_clusters, np.int64)
    who = np.empty(n_clusters, np.int32)
    cnt = np.empty(n_clusters, np.int64)
    tot = np.empty(n_clusters, np.int64)
    best = np.empty(max(G - 1, 1))
    bestp = np.empty(max(G - 1, 1), np.int32)
    for c in range(R):
        k = 0
        for b in range(start.shape[0]):
            for r in range(start[b, c], start[b, c + 1]):
                k = _accumulate(c, keys[r] - (lo + c) * n_clusters, count[r], dsum[r], owner, slot, who, cnt, tot, k)
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


@njit(nogil=True, cache=True)
def by_component(ids, n_clusters):
    """Entries grouped by component (a counting sort, entry order kept within a group): (order, start),
    component c's entries at order[start[c]:start[c + 1]]."""
    start = np.zeros(n_clusters + 1, np.int64)
    for e in range(ids.shape[0]):
        start[ids[e] + 1] += 1
    for c in range(n_clusters):
        start[c + 1] += start[c]
    nxt = start[:n_clusters].copy()
    order = np.empty(ids.shape[0], np.int64)
    for e in range(ids.shape[0]):
        order[nxt[ids[e]]] = e
        nxt[ids[e]] += 1
    return order, start


# rows a full-covariance kernel takes together: each L_c or Q_c element loaded once serves them all
ROW_TILE = 4


@njit(nogil=True, cache=True, inline="always")
def _tile(X, rows, order, g, m, mu, c, V):
    """V[r] = x − μ_c for the tile's m entries (rows[order[g + r]]), zero rows after them."""
    for r in range(m):
        i = rows[order[g + r]]
        for t in range(X.shape[1]):
            V[r, t] = np.float64(X[i, t]) - mu[c, t]
    for r in range(m, ROW_TILE):
        for t in range(X.shape[1]):
            V[r, t] = 0.0


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def cholesky_costs(X, rows, order, start, mu, Lt, offset, out):
    """Costs under full covariances of entries (row, component) grouped by component (``by_component``):
    out = offset_c + ½ ||(x − μ_c) L_c||², float64, L_c upper triangular (Σ_c⁻¹ = L_c L_cᵀ) given as Lt_c = L_cᵀ,
    so that (v L_c)_j = Σ_{k<=j} Lt_c[j, k] v_k: D(D+1)/2 multiply-adds an entry, ROW_TILE entries of a
    component at a time (L_c stays in cache while its entries pass; an entry's sum does not depend on its
    tile).

    X : IN (n, d);  rows : IN int64 (E,) each entry's row;  order, start : IN ``by_component``'s
    mu : IN float64 (C, d);  Lt : IN float64 (C, d, d) lower triangular, or (1, d, d) shared;  offset : (C,)
    out : OUT float64 (E,)
    """
    d = X.shape[1]
    V = np.empty((ROW_TILE, d))
    shared = Lt.shape[0] == 1
    for c in range(mu.shape[0]):
        f = 0 if shared else c
        for g in range(start[c], start[c + 1], ROW_TILE):
            m = min(ROW_TILE, start[c + 1] - g)
            _tile(X, rows, order, g, m, mu, c, V)
            q0 = q1 = q2 = q3 = 0.0
            for j in range(d):
                y0 = y1 = y2 = y3 = 0.0
                for k in range(j + 1):
                    a = Lt[f, j, k]
                    y0 += a * V[0, k]
                    y1 += a * V[1, k]
                    y2 += a * V[2, k]
                    y3 += a * V[3, k]
                q0 += y0 * y0
                q1 += y1 * y1
                q2 += y2 * y2
                q3 += y3 * y3
            for r in range(m):
                out[order[g + r]] = offset[c] + 0.5 * (q0 if r == 0 else q1 if r == 1 else q2 if r == 2 else q3)


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def scatter_stats(X, rows, weights, order, start, mu, Q):
    """Q_c += Σ weight (x − μ_c)(x − μ_c)ᵀ over entries (row, component, weight) grouped by component
    (``by_component``), ROW_TILE at a time: the lower triangle summed, the upper copied from it (a full
    covariance's M-step statistics).

    X : IN (n, d);  rows : IN int64 (E,);  weights : IN float64 (E,);  order, start : IN ``by_component``'s
    mu : IN float64 (C, d) the means Q is taken about;  Q : INOUT float64 (C, d, d)
    """
    d = X.shape[1]
    V = np.empty((ROW_TILE, d))
    for c in range(mu.shape[0]):
        if start[c + 1] == start[c]:
            continue
        for g in range(start[c], start[c + 1], ROW_TILE):
            m = min(ROW_TILE, start[c + 1] - g)
            _tile(X, rows, order, g, m, mu, c, V)
            p0 = weights[order[g]]
            p1 = weights[order[g + 1]] if m > 1 else 0.0
            p2 = weights[order[g + 2]] if m > 2 else 0.0
            p3 = weights[order[g + 3]] if m > 3 else 0.0
            for j in range(d):
                a0, a1, a2, a3 = p0 * V[0, j], p1 * V[1, j], p2 * V[2, j], p3 * V[3, j]
                for k in range(j + 1):
                    Q[c, j, k] += a0 * V[0, k] + a1 * V[1, k] + a2 * V[2, k] + a3 * V[3, k]
        for j in range(d):
            for k in range(j):
                Q[c, k, j] = Q[c, j, k]
