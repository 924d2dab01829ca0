"""Squared Euclidean distances.

Full searches use the blocked-GEMM form ||x||² − 2 x·cᵀ + ||c||² (clamped at 0) in the data's dtype;
where the two best candidates of a row are closer than the GEMM's rounding error, the row is re-searched
with the direct float64 form Σ (x − c)², so ties go to the lowest index and cancellation cannot pick the
wrong centre (ALGORITHMS.md §0).
"""
import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def sqdist(x, c):
    """Direct squared distance Σ_j (x_j − c_j)² in float64.

    x : IN float32/float64 (d,)
    c : IN float64 (d,)
    """
    s = 0.0
    for j in range(x.shape[0]):
        t = np.float64(x[j]) - c[j]
        s += t * t
    return s


@njit(nogil=True, cache=True)
def row_sqnorms(X, out):
    """out[i] = ||X[i]||² in float64.

    X   : IN  float32/float64 (n, d)
    out : OUT float64 (n,)
    """
    for i in range(X.shape[0]):
        s = 0.0
        for j in range(X.shape[1]):
            v = np.float64(X[i, j])
            s += v * v
        out[i] = s


def rows_per_block(n_centers):
    """GEMM row-block height: keeps the block of cross products (rows × k) near 256 KB of cache."""
    return max(16, min(4096, 65536 // max(1, n_centers)))


def gemm_tolerance(dtype, n_features):
    """Relative gap below which a GEMM-ranked row is re-searched in float64."""
    eps = np.finfo(dtype).eps
    return float(8.0 * eps * max(1, n_features))


@njit(nogil=True, cache=True)
def nearest_rows(X, b0, b1, Ct, cnorm, C, tol, G, labels, mind):
    """Nearest centre for rows b0..b1 of X; returns the number of distance evaluations.

    X      : IN  float32/float64 (n, d)       the data block
    b0, b1 : IN  int                          row range
    Ct     : IN  dtype of X (d, k), contiguous  the centres transposed, for the GEMM
    cnorm  : IN  float64 (k,)                 ||c||²
    C      : IN  float64 (k, d)               the centres, for the exact float64 re-search
    tol    : IN  float                        relative gap that triggers the re-search
    G      : OUT dtype of X (>= b1-b0, k)     scratch for the cross products
    labels : OUT int32 (n,)                   nearest centre (lowest index on ties)
    mind   : OUT float64 (n,)                 exact squared distance to it
    """
    k = C.shape[0]
    m = b1 - b0
    np.dot(X[b0:b1], Ct, G[:m])
    cmax = 0.0
    for j in range(k):
        if cnorm[j] > cmax:
            cmax = cnorm[j]
    evals = m * k
    for r in range(m):
        i = b0 + r
        best = np.inf
        second = np.inf
        jb = 0
        for j in range(k):
            v = cnorm[j] - 2.0 * np.float64(G[r, j])
            if v < best:
                second = best
                best = v
                jb = j
            elif v < second:
                second = v
        xx = 0.0
        for t in range(X.shape[1]):
            xv = np.float64(X[i, t])
            xx += xv * xv
        if k > 1 and second - best <= tol * (xx + cmax):
            exact = np.inf
            for j in range(k):
                dj = sqdist(X[i], C[j])
                if dj < exact:
                    exact = dj
                    jb = j
            evals += k
            mind[i] = exact
        else:
            mind[i] = sqdist(X[i], C[jb])
            evals += 1
        labels[i] = jb
    return evals
