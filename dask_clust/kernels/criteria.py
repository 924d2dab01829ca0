"""The partition criteria's kernels: each row's two nearest centres exactly, the per-cluster sums the
criteria are made of, and the exact silhouette of a sample.

Calinski & Harabasz, "A dendrite method for cluster analysis", Comm. in Statistics 3(1), 1974; Davies &
Bouldin, "A cluster separation measure", IEEE TPAMI 1(2), 1979; Rousseeuw, "Silhouettes", J. Comput. Appl.
Math. 20, 1987; the simplified silhouette (a row's distances to the centres in place of its mean distances to
the clusters' rows): Hruschka, Campello & de Castro, "Evolving clusters in gene-expression data", Inf. Sci.
176(13), 2006, §3.
"""

import numpy as np
from numba import njit

from .distance import cross_products, sqdist


@njit(nogil=True, cache=True)
def nearest_two(X, Cd, cnorm, C, tol, block, labels, d1, d2):
    """Each row's nearest centre and the exact squared distances to its nearest and second-nearest centres;
    returns the distance evaluations.

    The GEMM ranks the centres; every centre whose GEMM value lies within two rounding bands of the row's
    second-smallest is measured directly in float64, which covers both true nearest (a centre farther in the
    GEMM by more than that cannot be first or second). Ties go to the lowest index, as in ``assign``, so the
    labels are the model's.

    X      : IN  float32/float64 (n, d)
    Cd     : IN  X's dtype (k, d) contiguous;  cnorm : IN float64 (k,);  C : IN float64 (k, d), k >= 2
    tol    : IN  float (``gemm_tolerance``);   block : IN int (``rows_per_block``)
    labels : OUT int32 (n,)
    d1, d2 : OUT float64 (n,) squared distance to the nearest centre, to the second-nearest
    """
    n, k = X.shape[0], C.shape[0]
    block = max(1, min(block, n))
    G = np.empty((k, block), dtype=X.dtype)
    cmax = 0.0
    for j in range(k):
        cmax = max(cmax, cnorm[j])
    evals = 0
    for b0 in range(0, n, block):
        b1 = min(n, b0 + block)
        Gv = cross_products(X, b0, b1, Cd, G)
        evals += (b1 - b0) * k
        for r in range(b1 - b0):
            i = b0 + r
            first = second = np.inf
            for j in range(k):
                v = cnorm[j] - 2.0 * np.float64(Gv[j, r])
                if v < first:
                    second = first
                    first = v
                elif v < second:
                    second = v
            xx = 0.0
            for t in range(X.shape[1]):
                xv = np.float64(X[i, t])
                xx += xv * xv
            reach = second + 2.0 * tol * (xx + cmax)
            best = best2 = np.inf
            jbest = -1
            for j in range(k):
                if cnorm[j] - 2.0 * np.float64(Gv[j, r]) <= reach:
                    s = sqdist(X, i, C, j)
                    evals += 1
                    if s < best:
                        best2 = best
                        best = s
                        jbest = j
                    elif s < best2:
                        best2 = s
            labels[i] = jbest
            d1[i] = best
            d2[i] = best2
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
def silhouette_rows(X, labels, counts, lo, hi, out):
    """Rousseeuw's silhouette of rows lo..hi of X against all of X: a = the mean distance to the other rows of
    its cluster, b = the smallest mean distance to another cluster's rows, s = (b − a) / max(a, b), and 0 for a
    row alone in its cluster (scikit-learn's convention).

    X      : IN  float32/float64 (n, d);  labels : IN int32 (n,) in 0..k−1;  counts : IN int64 (k,) rows per label
    lo, hi : IN  int the rows to score
    out    : OUT float64 (n,) out[lo:hi] written
    """
    n, d = X.shape
    k = counts.shape[0]
    sums = np.empty(k)
    for i in range(lo, hi):
        sums[:] = 0.0
        for m in range(n):
            s = 0.0
            for t in range(d):
                v = np.float64(X[i, t]) - np.float64(X[m, t])
                s += v * v
            sums[labels[m]] += np.sqrt(s)
        own = labels[i]
        if counts[own] < 2:
            out[i] = 0.0
            continue
        a = sums[own] / (counts[own] - 1)
        b = np.inf
        for c in range(k):
            if c != own and counts[c] > 0:
                b = min(b, sums[c] / counts[c])
        out[i] = (b - a) / max(a, b) if max(a, b) > 0.0 else 0.0
    return (hi - lo) * n
