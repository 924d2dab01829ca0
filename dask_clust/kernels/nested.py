"""Nested mini-batch k-means kernels (Newling & Fleuret, NIPS 2016, Alg. 5): the nesting order, and a round
over a chunk's rows in the batch with lower bounds on the distances to the centres (Elkan: one per centre;
Hamerly: one on the second closest): the rows already in it through their bounds, the rows joining it by
a blocked GEMM.

Bounds are float32 (N·k·4 bytes) rounded down, so they stay lower bounds of the float64 distances.

Rows are dense (n, D) arrays or CSR chunks given as (indptr, indices, data, xx) with xx the rows' squared
norms: ``reuse_rows`` reads either through ``_distance``, ``_nearest_two`` and ``_move``, which numba
resolves by the rows' type, so the round's bound logic is written once; a CSR distance is
||x||² − 2 x·c + ||c||² from the row's non-zeros (O(nnz), not O(D)), and the bound kept from it gives up
that expansion's rounding.
"""

import numpy as np
from numba import njit, types
from numba.extending import overload

from .._random import permute
from .distance import UNDERFLOW, nearest_rows, sqdist, sqnorm
from .sparse import EXPANSION_SLACK, row_products, row_sqdist, two_smallest

# float32 rounding is at most 2^-24 relative: shrinking by 2^-22 first keeps a stored bound below its value
_SHRINK = 1.0 - 2.0**-22


@njit(nogil=True, cache=True, inline="always")
def _down(x):
    """A float32 lower bound of the non-negative part of x."""
    return np.float32(max(x, 0.0) * _SHRINK)


@njit(nogil=True, cache=True)
def nested_ranks(row0, n_total, seed, out):
    """out[i] = rank of global row row0 + i in a pseudo-random permutation of [0, n_total) keyed by seed.

    ``permute``, row by row: the ranks do not depend on the chunking.
    row0 : IN int;  n_total : IN int;  seed : IN int;  out : OUT int64 (n,)
    """
    for i in range(out.shape[0]):
        out[i] = permute(row0 + i, n_total, seed)


def _move(X, i, wi, a, S, v, sign):
    """Row i's (w x, w) added to (sign 1) or taken from (−1) centre a's sums."""


@overload(_move, inline="always")
def _move_rows(X, i, wi, a, S, v, sign):
    if isinstance(X, types.Array):

        def dense(X, i, wi, a, S, v, sign):
            v[a] += sign * wi
            for t in range(X.shape[1]):
                S[a, t] += sign * wi * np.float64(X[i, t])

        return dense

    def csr(X, i, wi, a, S, v, sign):
        indptr, indices, data, _ = X
        keys, values, used = S  # the moves' terms (``combine.Entries``): a k × D delta a chunk would cost more
        d = used[1]
        v[a] += sign * wi
        e = used[0]
        for q in range(indptr[i], indptr[i + 1]):
            keys[e] = a * d + indices[q]
            values[e] = sign * wi * np.float64(data[q])
            e += 1
        used[0] = e

    return csr


def _distance(X, i, C, cnorm, j):
    """(d², e): row i's squared distance to centre j and how far below it the truth can lie (the CSR
    expansion's rounding; 0 for a direct sum)."""


@overload(_distance, inline="always")
def _distance_rows(X, i, C, cnorm, j):
    if isinstance(X, types.Array):
        return lambda X, i, C, cnorm, j: (sqdist(X, i, C, j), 0.0)

    def csr(X, i, C, cnorm, j):
        indptr, indices, data, xx = X
        return row_sqdist(indptr, indices, data, i, xx[i], C, cnorm, j), EXPANSION_SLACK * (xx[i] + cnorm[j])

    return csr


@njit(nogil=True, cache=True)
def reuse_rows(X, w, rows, C, cnorm, CT, p, labels, dist, lower, S, v, sse):
    """A round over rows already in the batch (ascending indices, so X streams from memory instead of
    being read a row at random: 4× faster at 108 features): each takes l −= p, its exact distance to its
    centre, and the exact distance to every centre whose bound is below it (Elkan, in index order); a
    changed label moves the row's (w x, w) from the old centre's sums to the new one's.
    Returns (distance evaluations, changed labels).

    X : IN (n, D), or a CSR chunk (indptr, indices, data, xx);  w : IN float64 (n,);  rows : IN int64 (m,)
    ascending;  C : IN float64 (k, D) centres;  cnorm : IN float64 (k,) ||c_j||² and CT : IN float64 (D, k)
    their columns (read for CSR rows only);  p : IN float64 (k,) their displacement at the last update
    labels : INOUT int32 (n,), dist : INOUT float64 (n,) label and exact distance, by row
    lower : INOUT float32 (n, k) bounds by row (Elkan), or (n, 1): bound on the second closest (Hamerly)
    S : INOUT float64 (k, D) Σ w x moves; for CSR rows their terms (keys int64, values float64, used int64
    (2,)): entry e < used[0] adds values[e] at the flat position keys[e] of the k × D sums, used[1] = D
    v : INOUT float64 (k,) Σ w moves;  sse : INOUT float64 (k,) Σ w d² of the rows by their new label
    """
    k = C.shape[0]
    elkan = lower.shape[1] == k
    pmax = 0.0
    for j in range(k):
        pmax = max(pmax, p[j])
    evals = 0
    changed = 0
    for t in range(rows.shape[0]):
        i = rows[t]
        a0 = labels[i]
        a = a0
        d = np.sqrt(_distance(X, i, C, cnorm, a)[0])
        evals += 1
        if elkan:
            candidates = 0
            for j in range(k):  # branch-free, so both loops vectorise; most rows have no candidate
                lj = _down(lower[i, j] - p[j])
                lower[i, j] = lj
                candidates += lj < d
            candidates -= lower[i, a0] < d
            for j in range(k if candidates else 0):  # Alg. 1: every centre but the label at the round's start
                if j != a0 and lower[i, j] < d:
                    dj2, err = _distance(X, i, C, cnorm, j)
                    dj = np.sqrt(dj2)
                    evals += 1
                    lower[i, j] = _down(np.sqrt(max(dj2 - err, 0.0)))
                    if dj < d:
                        a = j
                        d = dj
        else:
            lower[i, 0] = _down(lower[i, 0] - pmax)
            if lower[i, 0] < d:
                a, d, second = _nearest_two(X, i, C, cnorm, CT)
                evals += k
                lower[i, 0] = _down(second)
        if a != a0:
            _move(X, i, w[i], a0, S, v, -1.0)
            _move(X, i, w[i], a, S, v, 1.0)
            labels[i] = a
            changed += 1
        dist[i] = d
        sse[a] += w[i] * d * d
    return evals, changed


@njit(nogil=True, cache=True)
def join_rows(X, w, rows, Cd, cnorm, C, tol, block, labels, dist, lower, S, v, sse):
    """Rows joining the batch: all k distances by the blocked GEMM of ``nearest_rows`` (exact label, lowest
    index on ties, and exact distance), each bound the GEMM's value less its rounding band (the band
    ``nearest_rows`` takes for the second best), rounded down; their (w x, w) join the sums.
    Returns distance evaluations. A tenth of the time of k direct distances per row at 108 features.

    X, w : IN as ``reuse_rows``;  rows : IN int64 (m,) the joining rows
    Cd, cnorm, C, tol, block : IN the centres as ``kernels.assign.Prepared`` holds them
    labels, dist, lower, S, v, sse : OUT / INOUT as ``reuse_rows``
    """
    k, D = C.shape
    elkan = lower.shape[1] == k
    n = rows.shape[0]
    block = max(1, min(block, n))
    xb = np.empty((block, D), X.dtype)
    G = np.empty((k, block), X.dtype)
    best = np.empty(block, X.dtype)
    second = np.empty(block, X.dtype)
    jb = np.zeros(block, np.int32)
    top = np.empty(block)
    band = np.empty(block)
    lab = np.empty(block, np.int32)
    mind = np.empty(block)
    mind2 = np.empty(block)
    cmax = 0.0
    for j in range(k):
        cmax = max(cmax, cnorm[j])
    two = X.dtype.type(2.0)
    evals = 0
    for s in range(0, n, block):
        m = min(block, n - s)
        for r in range(m):
            xb[r] = X[rows[s + r]]
        Gb = G if m == block else np.empty((k, m), X.dtype)  # the GEMM writes into G only at its width
        evals += nearest_rows(xb, 0, m, Cd, cnorm, C, tol, Gb, best, second, jb, top, band, lab, mind, mind2, lab[:0])
        for r in range(m):
            i = rows[s + r]
            a = lab[r]
            d = np.sqrt(mind[r])
            if elkan:
                xx = sqnorm(xb, r)
                slack = xx - tol * (xx + cmax) - UNDERFLOW
                for j in range(k):
                    lower[i, j] = _down(np.sqrt(max(np.float64(X.dtype.type(cnorm[j]) - two * Gb[j, r]) + slack, 0.0)))
                lower[i, a] = _down(d)
            else:
                lower[i, 0] = _down(np.sqrt(mind2[r]))
            labels[i] = a
            dist[i] = d
            _move(X, i, w[i], a, S, v, 1.0)
            sse[a] += w[i] * d * d
    return evals


def _nearest_two(X, i, C, cnorm, CT):
    """(index, distance) of the nearest centre (lowest index on ties) and a lower bound of the second
    smallest distance."""


@overload(_nearest_two, inline="always")
def _nearest_two_rows(X, i, C, cnorm, CT):
    if isinstance(X, types.Array):

        def dense(X, i, C, cnorm, CT):
            a = 0
            d = np.inf
            second = np.inf
            for j in range(C.shape[0]):
                dj = np.sqrt(sqdist(X, i, C, j))
                if dj < d:
                    second = d
                    a = j
                    d = dj
                elif dj < second:
                    second = dj
            return a, d, second

        return dense

    def csr(X, i, C, cnorm, CT):
        indptr, indices, data, xx = X
        dots = np.empty(C.shape[0])  # every centre's inner product from its columns: O(nnz·k), contiguous in k
        row_products(indptr, indices, data, i, CT, dots)
        a, best, runner = two_smallest(xx[i], dots, cnorm)
        return a, np.sqrt(best), np.sqrt(max(runner - EXPANSION_SLACK * (xx[i] + cnorm.max()), 0.0))

    return csr


@njit(nogil=True, cache=True)
def csr_join_rows(indptr, indices, data, xx, w, rows, CT, cnorm, labels, dist, lower, S, v, sse):
    """``join_rows`` for CSR rows: all k inner products from the centres' columns (O(nnz·k)), the nearest
    centre (lowest index on ties) and its distance, each bound the expansion's distance less its rounding,
    rounded down; their (w x, w) join the sums. Returns distance evaluations.

    indptr, indices, data : IN the CSR chunk;  xx : IN float64 (n,) its rows' squared norms
    CT : IN float64 (D, k) the centres' columns;  cnorm : IN float64 (k,) ||c_j||²
    S : INOUT the joining rows' terms (keys, values, used), as ``reuse_rows`` takes them for CSR rows
    w, rows, labels, dist, lower, v, sse : as ``join_rows``
    """
    k = CT.shape[1]
    elkan = lower.shape[1] == k
    X = (indptr, indices, data, xx)
    cmax = cnorm.max() if k else 0.0
    dots = np.empty(k)
    for t in range(rows.shape[0]):
        i = rows[t]
        row_products(indptr, indices, data, i, CT, dots)
        a, best, runner = two_smallest(xx[i], dots, cnorm)
        d = np.sqrt(best)
        if elkan:
            for j in range(k):
                dj2 = max(0.0, xx[i] - 2.0 * dots[j] + cnorm[j])
                lower[i, j] = _down(np.sqrt(max(dj2 - EXPANSION_SLACK * (xx[i] + cnorm[j]), 0.0)))
        else:
            lower[i, 0] = _down(np.sqrt(max(runner - EXPANSION_SLACK * (xx[i] + cmax), 0.0)))
        labels[i] = a
        dist[i] = d
        _move(X, i, w[i], a, S, v, 1.0)
        sse[a] += w[i] * d * d
    return rows.shape[0] * k
