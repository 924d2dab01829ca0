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


def rows_per_block(n_centers):
    """GEMM row-block width: keeps the (k × rows) block of cross products near 1 MB of cache."""
    return max(256, min(4096, (1 << 18) // max(1, n_centers)))


def gemm_tolerance(dtype, n_features):
    """Relative gap below which a GEMM-ranked row is re-searched in float64."""
    eps = np.finfo(dtype).eps
    return float(16.0 * eps * max(1, n_features))


@njit(nogil=True, cache=True)
def cross_products(X, b0, b1, Cd, G):
    """G[:, :b1-b0] = Cd · X[b0:b1]ᵀ (k × rows), the GEMM part of ||x||² − 2 x·c + ||c||².

    Rows sit on G's contiguous axis so the per-row scans that follow vectorise across rows.
    X : IN (n, d);  Cd : IN (k, d) contiguous, X's dtype;  G : OUT (k, >= b1-b0), X's dtype
    Returns the view of G that holds the block.
    """
    m = b1 - b0
    Gv = G if G.shape[1] == m else np.empty((Cd.shape[0], m), dtype=G.dtype)
    np.dot(Cd, X[b0:b1].T, Gv)
    return Gv


@njit(nogil=True, cache=True)
def nearest_rows(X, b0, b1, Cd, cnorm, C, tol, G, best, second, jb, labels, mind):
    """Nearest centre for rows b0..b1 of X; returns the number of distance evaluations.

    X      : IN  float32/float64 (n, d)        the data block
    b0, b1 : IN  int                           row range
    Cd     : IN  X's dtype (k, d) contiguous   the centres, for the GEMM
    cnorm  : IN  float64 (k,)                  ||c||²
    C      : IN  float64 (k, d)                the centres, for the exact float64 re-search
    tol    : IN  float                         relative gap that triggers the re-search
    G      : OUT X's dtype (k, block)          scratch for the cross products
    best, second, jb : OUT X's dtype, X's dtype, int32 (block,)  scratch (the caller's own
                                               allocations: distinct arrays let LLVM vectorise the scan;
                                               in X's dtype because the GEMM's rounding, which the
                                               re-search tolerance covers, dominates the scan's)
    labels : OUT int32 (n,)                    nearest centre (lowest index on ties)
    mind   : OUT float64 (n,)                  exact squared distance to it
    """
    k = C.shape[0]
    m = b1 - b0
    Gv = cross_products(X, b0, b1, Cd, G)
    cmax = 0.0
    for j in range(k):
        cmax = max(cmax, cnorm[j])
    best[:m] = np.inf
    second[:m] = np.inf
    two = best.dtype.type(2.0)
    for j in range(k):  # branch-free selects across rows: vectorises, no reduction, exact
        cj = best.dtype.type(cnorm[j])
        for r in range(m):
            v = cj - two * Gv[j, r]
            b = best[r]
            lt = v < b
            second[r] = b if lt else min(v, second[r])
            jb[r] = j if lt else jb[r]
            best[r] = v if lt else b
    evals = m * k
    for r in range(m):
        i = b0 + r
        labels[i] = jb[r]
        xx = 0.0
        for t in range(X.shape[1]):
            xv = np.float64(X[i, t])
            xx += xv * xv
        if k > 1 and np.float64(second[r]) - np.float64(best[r]) <= tol * (xx + cmax):
            exact = np.inf
            for j in range(k):
                dj = sqdist(X[i], C[j])
                if dj < exact:
                    exact = dj
                    labels[i] = j
            evals += k
            mind[i] = exact
        else:
            mind[i] = sqdist(X[i], C[labels[i]])
            evals += 1
    return evals
