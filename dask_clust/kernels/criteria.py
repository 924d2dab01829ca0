"""The partition criteria's kernels: each row's m nearest centres exactly, the per-cluster sums the
criteria are made of, and a sample's distance sums for its exact silhouette.

Calinski & Harabasz, "A dendrite method for cluster analysis", Comm. in Statistics 3(1), 1974; Davies &
Bouldin, "A cluster separation measure", IEEE TPAMI 1(2), 1979; Rousseeuw, "Silhouettes", J. Comput. Appl.
Math. 20, 1987; the simplified silhouette (a row's distances to the centres in place of its mean distances to
the clusters' rows): Hruschka, Campello & de Castro, "Evolving clusters in gene-expression data", Inf. Sci.
176(13), 2006, §3.
"""

import numpy as np
from numba import njit

from .distance import cross_products, sqdist, sqnorm
from .sparse import row_products, row_sqdist, row_sqnorm


@njit(nogil=True, cache=True, inline="always")
def _keep(ids, dists, i, j, s):
    """Centre j at squared distance s into row i's list, ascending by (distance, index), if it belongs there."""
    m = ids.shape[1]
    if s > dists[i, m - 1] or (s == dists[i, m - 1] and j > ids[i, m - 1] >= 0):
        return
    p = m - 1
    while p > 0 and (s < dists[i, p - 1] or (s == dists[i, p - 1] and j < ids[i, p - 1])):
        dists[i, p] = dists[i, p - 1]
        ids[i, p] = ids[i, p - 1]
        p -= 1
    dists[i, p] = s
    ids[i, p] = j


@njit(nogil=True, cache=True)
def nearest_m(X, Cd, cnorm, C, tol, block, ids, dists):
    """Each row's m nearest centres and their exact squared distances, ascending (m = ids.shape[1], 2 <= m <=
    k); returns the distance evaluations.

    The GEMM ranks the centres: the scan keeps each row's m + 1 smallest values (centre by centre, along G's
    contiguous rows, as ``nearest_rows``; a value that does not beat the row's (m+1)-th costs one compare).
    Every centre whose GEMM value lies within two rounding bands of the row's m-th smallest is measured
    directly in float64, which covers the true m nearest (a centre farther in the GEMM by more cannot be among
    them): where the (m+1)-th value lies beyond that reach, the m kept are the only candidates, and only the
    other rows walk their column again. Ties go to the lowest index, as in ``assign``, so ids[:, 0] are the
    model's labels.

    X     : IN  float32/float64 (n, d)
    Cd    : IN  X's dtype (k, d) contiguous;  cnorm : IN float64 (k,);  C : IN float64 (k, d)
    tol   : IN  float (``gemm_tolerance``);   block : IN int (``rows_per_block``)
    ids   : OUT int32 (n, m);  dists : OUT float64 (n, m)
    """
    n, k, m = X.shape[0], C.shape[0], ids.shape[1]
    block = max(1, min(block, n))
    G = np.empty((k, block), dtype=X.dtype)
    top = np.empty((block, m + 1), dtype=X.dtype)
    tj = np.empty((block, m + 1), dtype=np.int32)
    three = (
        np.empty(block, X.dtype),
        np.empty(block, X.dtype),
        np.empty(block, X.dtype),
        np.empty(block, np.int32),
        np.empty(block, np.int32),
        np.empty(block, np.int32),
    )
    two = X.dtype.type(2.0)
    cmax = 0.0
    for j in range(k):
        cmax = max(cmax, cnorm[j])
    evals = 0
    for r0 in range(0, n, block):
        rows = min(n, r0 + block) - r0
        Gv = cross_products(X, r0, r0 + rows, Cd, G)
        evals += rows * k
        if m == 2:
            _three_smallest(Gv, cnorm, rows, top, tj, *three)
        else:
            _smallest(Gv, cnorm, rows, top, tj)
        for r in range(rows):
            i = r0 + r
            reach = np.float64(top[r, m - 1]) + 2.0 * tol * (sqnorm(X, i) + cmax)
            ids[i] = -1
            dists[i] = np.inf
            if np.float64(top[r, m]) > reach:  # the m kept are the candidates
                for q in range(m):
                    _keep(ids, dists, i, tj[r, q], sqdist(X, i, C, tj[r, q]))
                evals += m
            else:
                for j in range(k):
                    if np.float64(X.dtype.type(cnorm[j]) - two * Gv[j, r]) <= reach:
                        _keep(ids, dists, i, j, sqdist(X, i, C, j))
                        evals += 1
    return evals


@njit(nogil=True, cache=True)
def _smallest(Gv, cnorm, rows, top, tj):
    """Each row's m + 1 smallest GEMM values ||c||² − 2 x·c and their centres (m + 1 = top.shape[1]),
    ascending, the earlier centre first on ties: ``_keep``'s insertion along G's contiguous rows."""
    two = Gv.dtype.type(2.0)
    top[:rows] = np.inf
    tj[:rows] = -1
    for j in range(Gv.shape[0]):
        cj = Gv.dtype.type(cnorm[j])
        for r in range(rows):
            _keep(tj, top, r, j, cj - two * Gv[j, r])


@njit(nogil=True, cache=True)
def _three_smallest(Gv, cnorm, rows, top, tj, v1, v2, v3, j1, j2, j3):
    """``_smallest`` for m = 2 (the silhouette's), the same values and centres: branch-free selects on six
    arrays of their own, which vectorise across rows (the insertion does not: 2.2× its time at k = 1,024)."""
    two = Gv.dtype.type(2.0)
    v1[:rows] = np.inf
    v2[:rows] = np.inf
    v3[:rows] = np.inf
    j1[:rows] = 0
    j2[:rows] = 0
    j3[:rows] = 0
    for j in range(Gv.shape[0]):
        cj = Gv.dtype.type(cnorm[j])
        for r in range(rows):
            v = cj - two * Gv[j, r]
            a, b, c = v1[r], v2[r], v3[r]
            lt1, lt2, lt3 = v < a, v < b, v < c
            v3[r] = b if lt2 else (v if lt3 else c)
            j3[r] = j2[r] if lt2 else (j if lt3 else j3[r])
            v2[r] = a if lt1 else (v if lt2 else b)
            j2[r] = j1[r] if lt1 else (j if lt2 else j2[r])
            v1[r] = v if lt1 else a
            j1[r] = j if lt1 else j1[r]
    for r in range(rows):
        top[r, 0], top[r, 1], top[r, 2] = v1[r], v2[r], v3[r]
        tj[r, 0], tj[r, 1], tj[r, 2] = j1[r], j2[r], j3[r]


@njit(nogil=True, cache=True)
def csr_nearest_m(indptr, indices, data, CT, cnorm, ids, dists):
    """``nearest_m`` for CSR rows: every centre's squared distance by the expansion ||x||² − 2 x·c + ||c||² in
    float64 from the row's non-zeros (O(nnz·k), as ``sparse.csr_assign``, so ids[:, 0] are its labels);
    returns the distance evaluations.

    indptr, indices, data : IN a CSR chunk (n rows);  CT : IN float64 (d, k) the centres' columns
    cnorm : IN float64 (k,);  ids : OUT int32 (n, m);  dists : OUT float64 (n, m)
    """
    n, k = indptr.shape[0] - 1, CT.shape[1]
    dots = np.empty(k)
    for i in range(n):
        xx = row_products(indptr, indices, data, i, CT, dots)
        ids[i] = -1
        dists[i] = np.inf
        for j in range(k):
            _keep(ids, dists, i, j, max(0.0, xx - 2.0 * dots[j] + cnorm[j]))
    return n * k


@njit(nogil=True, cache=True, inline="always")
def _tally(w, ids, dists, i, weights, squares):
    """Row i into its cluster's Σ w and Σ w ||x − c||²; returns its weighted simplified silhouette term,
    w (b − a) / max(a, b) (0 where both distances are 0)."""
    j = ids[i, 0]
    weights[j] += w[i]
    squares[j] += w[i] * dists[i, 0]
    a, b = np.sqrt(dists[i, 0]), np.sqrt(dists[i, 1])
    return w[i] * (b - a) / max(a, b) if b > 0.0 else 0.0


@njit(nogil=True, cache=True)
def cluster_sums(X, w, C, ids, dists, weights, offsets, squares):
    """The per-cluster sums of the partition criteria; returns the rows' weighted simplified silhouette,
    Σ w (b − a) / max(a, b) with a, b the distances to the nearest and second-nearest centre (0 where both
    are 0).

    X       : IN    float32/float64 (n, d);  w : IN float64 (n,) sample weights
    C       : IN    float64 (k, d) the centres that label the rows
    ids     : IN    int32 (n, m);  dists : IN float64 (n, m), m >= 2 (``nearest_m``)
    weights : INOUT float64 (k,)     Σ w
    offsets : INOUT float64 (k, d)   Σ w (x − c): the cluster's mean is c + offsets / weights
    squares : INOUT float64 (k,)     Σ w ||x − c||²
    """
    silhouette = 0.0
    for i in range(X.shape[0]):
        silhouette += _tally(w, ids, dists, i, weights, squares)
        j = ids[i, 0]
        for t in range(X.shape[1]):
            offsets[j, t] += w[i] * (np.float64(X[i, t]) - C[j, t])
    return silhouette


@njit(nogil=True, cache=True)
def csr_cluster_sums(indptr, indices, data, w, C, ids, dists, weights, offsets, squares):
    """``cluster_sums`` for CSR rows: Σ w (x − c) as Σ w x over the non-zeros less (Σ w) c, once the chunk's
    rows are in (k × d dense, as Lloyd's partial sums of CSR rows). Arguments as ``cluster_sums``'s, the rows
    as a CSR chunk's three arrays."""
    silhouette = 0.0
    for i in range(indptr.shape[0] - 1):
        silhouette += _tally(w, ids, dists, i, weights, squares)
        j = ids[i, 0]
        for p in range(indptr[i], indptr[i + 1]):
            offsets[j, indices[p]] += w[i] * np.float64(data[p])
    for j in range(C.shape[0]):
        if weights[j] != 0.0:
            for t in range(C.shape[1]):
                offsets[j, t] -= weights[j] * C[j, t]
    return silhouette


@njit(nogil=True, cache=True)
def csr_spreads_about(indptr, indices, data, w, M, mnorm, labels, spreads):
    """``spreads_about`` for CSR rows, each distance by the expansion from the row's non-zeros (``row_sqdist``).

    M : IN float64 (k, d);  mnorm : IN float64 (k,) ||m||²;  the rest as ``spreads_about``'s
    """
    for i in range(indptr.shape[0] - 1):
        j = labels[i]
        spreads[j] += w[i] * np.sqrt(row_sqdist(indptr, indices, data, i, row_sqnorm(indptr, data, i), M, mnorm, j))


@njit(nogil=True, cache=True)
def spreads_about(X, w, M, labels, spreads):
    """Σ w ||x − m|| per cluster, m its row of M (the clusters' means): Davies–Bouldin's scatter.

    X       : IN    float32/float64 (n, d);  w : IN float64 (n,);  M : IN float64 (k, d)
    labels  : IN    int32 (n,)
    spreads : INOUT float64 (k,)
    """
    for i in range(X.shape[0]):
        j = labels[i]
        spreads[j] += w[i] * np.sqrt(sqdist(X, i, M, j))


@njit(nogil=True, cache=True)
def row_distances(G, sq, lo):
    """Inner products made Euclidean distances in place, as scikit-learn's ``euclidean_distances``: the GEMM
    form ||x||² − 2 x·y + ||y||², clamped at 0, a row's distance to itself 0 (the silhouette's, once for
    every labeling of the rows).

    G  : INOUT float64 (m, n) inner products of rows lo..lo+m with all n rows, then their distances
    sq : IN    float64 (n,) squared norms of all rows;  lo : IN int
    """
    m, n = G.shape
    for r in range(m):
        i = lo + r
        for c in range(n):
            G[r, c] = np.sqrt(max(sq[i] + sq[c] - 2.0 * G[r, c], 0.0))
        G[r, i] = 0.0


@njit(nogil=True, cache=True)
def distance_sums(dist, labels, sums):
    """Each row's sums of distances to the rows of every cluster: the silhouette's a and b before their means
    (a row's own distance, 0, adds nothing).

    dist   : IN  float64 (m, n) distances of m rows to all n rows (``row_distances``)
    labels : IN  int64 (n,) in 0..k−1;   sums : OUT float64 (m, k)
    """
    m, n = dist.shape
    sums[:] = 0.0
    for r in range(m):
        for c in range(n):
            sums[r, labels[c]] += dist[r, c]


@njit(nogil=True, cache=True)
def nearest_log_likelihood(w, dists, h, n_terms):
    """Σ w log Σ_{c among the row's n_terms nearest} exp(−h d²_c): the log-likelihood of an isotropic mixture
    of equal weights (each component's cost offset + h ||x − μ_c||², one h and one offset) over each row's
    likeliest components, less the offset; a lower bound of the whole sum, the truncated EM's free energy.

    w : IN float64 (n,);  dists : IN float64 (n, m) ascending, m >= n_terms;  h : IN float;  n_terms : IN int
    """
    total = 0.0
    for i in range(dists.shape[0]):
        low = dists[i, 0]
        s = 0.0
        for q in range(n_terms):
            s += np.exp(-h * (dists[i, q] - low))
        total += w[i] * (np.log(s) - h * low)
    return total
