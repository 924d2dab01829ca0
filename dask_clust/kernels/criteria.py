"""The partition criteria's kernels: each row's two nearest centres exactly, the per-cluster sums the
criteria are made of, and a sample's distance sums for its exact silhouette.

Calinski & Harabasz, "A dendrite method for cluster analysis", Comm. in Statistics 3(1), 1974; Davies &
Bouldin, "A cluster separation measure", IEEE TPAMI 1(2), 1979; Rousseeuw, "Silhouettes", J. Comput. Appl.
Math. 20, 1987; the simplified silhouette (a row's distances to the centres in place of its mean distances to
the clusters' rows): Hruschka, Campello & de Castro, "Evolving clusters in gene-expression data", Inf. Sci.
176(13), 2006, §3.
"""

import numpy as np
from numba import njit

from .distance import cross_products, sqdist


@njit(nogil=True, cache=True, inline="always")
def _measure(X, i, C, j, labels, d1, d2):
    """Centre j measured directly for row i, kept as its nearest or second-nearest (centres come in ascending
    order: a tie keeps the lower index). Returns 1, the evaluation."""
    s = sqdist(X, i, C, j)
    if s < d1[i]:
        d2[i] = d1[i]
        d1[i] = s
        labels[i] = j
    elif s < d2[i]:
        d2[i] = s
    return 1


@njit(nogil=True, cache=True)
def nearest_two(X, Cd, cnorm, C, tol, block, labels, d1, d2):
    """Each row's nearest centre and the exact squared distances to its nearest and second-nearest centres;
    returns the distance evaluations.

    The GEMM ranks the centres; every centre whose GEMM value lies within two rounding bands of the row's
    second-smallest is measured directly in float64, which covers both true nearest (a centre farther in the
    GEMM by more than that cannot be first or second). Ties go to the lowest index, as in ``assign``, so the
    labels are the model's. The scan keeps each row's three smallest values (branch-free, centre by centre
    along G's contiguous rows, as ``nearest_rows``): where the third lies beyond that reach, the two best
    are the only candidates, and only the other rows walk their column again.

    X      : IN  float32/float64 (n, d)
    Cd     : IN  X's dtype (k, d) contiguous;  cnorm : IN float64 (k,);  C : IN float64 (k, d), k >= 2
    tol    : IN  float (``gemm_tolerance``);   block : IN int (``rows_per_block``)
    labels : OUT int32 (n,)
    d1, d2 : OUT float64 (n,) squared distance to the nearest centre, to the second-nearest
    """
    n, k = X.shape[0], C.shape[0]
    block = max(1, min(block, n))
    G = np.empty((k, block), dtype=X.dtype)
    b1 = np.empty(block, dtype=X.dtype)
    b2 = np.empty(block, dtype=X.dtype)
    b3 = np.empty(block, dtype=X.dtype)
    j1 = np.empty(block, dtype=np.int32)
    j2 = np.empty(block, dtype=np.int32)
    two = X.dtype.type(2.0)
    cmax = 0.0
    for j in range(k):
        cmax = max(cmax, cnorm[j])
    evals = 0
    for r0 in range(0, n, block):
        m = min(n, r0 + block) - r0
        Gv = cross_products(X, r0, r0 + m, Cd, G)
        evals += m * k
        b1[:m] = np.inf
        b2[:m] = np.inf
        b3[:m] = np.inf
        j1[:m] = 0
        j2[:m] = 0
        for j in range(k):
            cj = X.dtype.type(cnorm[j])
            for r in range(m):
                v = cj - two * Gv[j, r]
                first, sec = b1[r], b2[r]
                lt1, lt2 = v < first, v < sec
                b3[r] = sec if lt2 else min(v, b3[r])
                b2[r] = first if lt1 else (v if lt2 else sec)
                j2[r] = j1[r] if lt1 else (j if lt2 else j2[r])
                b1[r] = v if lt1 else first
                j1[r] = j if lt1 else j1[r]
        for r in range(m):
            i = r0 + r
            xx = 0.0
            for t in range(X.shape[1]):
                xv = np.float64(X[i, t])
                xx += xv * xv
            reach = np.float64(b2[r]) + 2.0 * tol * (xx + cmax)
            labels[i] = -1
            d1[i] = d2[i] = np.inf
            if np.float64(b3[r]) > reach:
                lo, hi = min(j1[r], j2[r]), max(j1[r], j2[r])
                evals += _measure(X, i, C, lo, labels, d1, d2) + _measure(X, i, C, hi, labels, d1, d2)
            else:
                for j in range(k):
                    if np.float64(X.dtype.type(cnorm[j]) - two * Gv[j, r]) <= reach:
                        evals += _measure(X, i, C, j, labels, d1, d2)
    return evals


@njit(nogil=True, cache=True)
def cluster_sums(X, w, C, labels, d1, d2, weights, offsets, squares):
    """The per-cluster sums of the partition criteria; returns the rows' weighted simplified silhouette,
    Σ w (b − a) / max(a, b) with a, b the distances to the nearest and second-nearest centre (0 where both
    are 0).

    X       : IN    float32/float64 (n, d);  w : IN float64 (n,) sample weights
    C       : IN    float64 (k, d) the centres that label the rows
    labels  : IN    int32 (n,);  d1, d2 : IN float64 (n,) (``nearest_two``)
    weights : INOUT float64 (k,)     Σ w
    offsets : INOUT float64 (k, d)   Σ w (x − c): the cluster's mean is c + offsets / weights
    squares : INOUT float64 (k,)     Σ w ||x − c||²
    """
    silhouette = 0.0
    for i in range(X.shape[0]):
        j = labels[i]
        wi = w[i]
        weights[j] += wi
        squares[j] += wi * d1[i]
        for t in range(X.shape[1]):
            offsets[j, t] += wi * (np.float64(X[i, t]) - C[j, t])
        a = np.sqrt(d1[i])
        b = np.sqrt(d2[i])
        if b > 0.0:
            silhouette += wi * (b - a) / max(a, b)
    return silhouette


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
def distance_sums(G, sq, lo, labels, sums):
    """Each row's sums of Euclidean distances to the rows of every cluster, from their inner products: the
    silhouette's a and b before their means (the GEMM form ||x||² − 2 x·y + ||y||², clamped at 0, a row's
    distance to itself 0, as scikit-learn's ``euclidean_distances``).

    G      : IN    float64 (m, n) inner products of rows lo..lo+m with all n rows
    sq     : IN    float64 (n,) squared norms of all rows;  lo : IN int
    labels : IN    int64 (n,) in 0..k−1
    sums   : OUT   float64 (m, k)
    """
    m, n = G.shape
    sums[:] = 0.0
    for r in range(m):
        i = lo + r
        for c in range(n):
            if c != i:
                sums[r, labels[c]] += np.sqrt(max(sq[i] + sq[c] - 2.0 * G[r, c], 0.0))
