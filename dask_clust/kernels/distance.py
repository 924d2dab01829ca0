"""Squared Euclidean distances.

Full searches use the blocked-GEMM form ||x||² − 2 x·cᵀ + ||c||² (clamped at 0) in the data's dtype;
where the two best candidates of a row are closer than the GEMM's rounding error, the row is re-searched
with the direct float64 form Σ (x − c)², so ties go to the lowest index and cancellation cannot pick the
wrong centre.
"""

import numpy as np
from numba import njit


@njit(nogil=True, cache=True, inline="always")
def sqdist(X, i, C, j):
    """Direct squared distance Σ_t (X[i, t] − C[j, t])² in float64.

    X : IN float32/float64 (n, d);  C : IN float64 (k, d);  i, j : IN row indices
    Indexes rows instead of taking row views: a view costs two atomic reference-count updates,
    which tripled the cost of a 16-d distance.
    """
    d = X.shape[1]
    s0 = s1 = s2 = s3 = 0.0  # four chains: a single running sum would serialise on the add latency
    t = 0
    while t + 4 <= d:
        a0 = np.float64(X[i, t]) - C[j, t]
        a1 = np.float64(X[i, t + 1]) - C[j, t + 1]
        a2 = np.float64(X[i, t + 2]) - C[j, t + 2]
        a3 = np.float64(X[i, t + 3]) - C[j, t + 3]
        s0 += a0 * a0
        s1 += a1 * a1
        s2 += a2 * a2
        s3 += a3 * a3
        t += 4
    while t < d:
        a0 = np.float64(X[i, t]) - C[j, t]
        s0 += a0 * a0
        t += 1
    return (s0 + s1) + (s2 + s3)


@njit(nogil=True, cache=True, inline="always")
def sqdist_squares(X, i, C, j, squares):
    """``sqdist``'s value, bit for bit, nearly twice as fast from 8 features (below, slower: see
    ``sqdist_to_labels``): the squares go first to ``squares`` in a loop without a sum, which LLVM vectorises
    (the chains of ``sqdist`` it does not), then add up in ``sqdist``'s four chains in its order, the chains
    kept in ``squares[d:d + 4]`` (as four scalars they ran 13 % slower at d = 32).

    X : IN float32/float64 (n, d >= 4);  C : IN float64 (k, d);  i, j : IN row indices
    squares : OUT float64 (>= d + 4,) scratch
    """
    d = X.shape[1]
    for t in range(d):
        a = np.float64(X[i, t]) - C[j, t]
        squares[t] = a * a
    for c in range(4):
        squares[d + c] = squares[c]
    d4 = d - d % 4
    for t in range(4, d4, 4):
        for c in range(4):
            squares[d + c] += squares[t + c]
    for t in range(d4, d):
        squares[d] += squares[t]
    return (squares[d] + squares[d + 1]) + (squares[d + 2] + squares[d + 3])


@njit(nogil=True, cache=True)
def sqdist_to_labels(X, lo, hi, C, labels, out, known):
    """out[i] = ``sqdist``(X, i, C, labels[i]) for rows lo..hi, by ``sqdist_squares`` from ``SQUARES_FROM``
    features (the choice outside the loop: inside, it undid the vectorising), but for the rows whose label
    is ``known[i]``: their ``out[i]`` already holds ``sqdist`` to that centre (the same function of the same
    row and centre: the same bits).

    X : IN float32/float64 (n, d);  C : IN float64 (k, d);  labels : IN int32 (n,);  out : INOUT float64 (n,)
    known : IN int32 (n,) the centre each row's ``out`` is already measured to, or (0,): none
    """
    some = known.shape[0] > 0
    if X.shape[1] >= SQUARES_FROM:
        squares = np.empty(X.shape[1] + 4)
        for i in range(lo, hi):
            if not (some and labels[i] == known[i]):
                out[i] = sqdist_squares(X, i, C, labels[i], squares)
    else:
        for i in range(lo, hi):
            if not (some and labels[i] == known[i]):
                out[i] = sqdist(X, i, C, labels[i])


@njit(nogil=True, cache=True, fastmath={"reassoc"})
def rough_sqnorm(X, i):
    """||X[i]||² in float64 summed in whatever order the SIMD lanes take (a quarter of the time of one
    running sum; the last bits may differ between CPUs): for rounding bands and bounds only, whose slack
    is orders of magnitude wider, never for a value a model or an objective keeps.

    Not inlined: numba's inlining would drop the reassociation this function is compiled with."""
    s = 0.0
    for t in range(X.shape[1]):
        v = np.float64(X[i, t])
        s += v * v
    return s


@njit(nogil=True, cache=True, inline="always")
def sqnorm(X, i):
    """||X[i]||² in float64, in index order.  X : IN float32/float64 (n, d);  i : IN row index"""
    s = 0.0
    for t in range(X.shape[1]):
        v = np.float64(X[i, t])
        s += v * v
    return s


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def sqdist_row(xr, C, j):
    """Squared distance of a float64 row buffer to C[j]: the gather form of the truncated E-step.

    xr : IN float64 (d,) the row, converted once;  C : IN float64 (k, d);  j : IN row of C
    Reassociation lets the sum run in SIMD lanes (a third of the time of one running sum).
    """
    s = 0.0
    for t in range(xr.shape[0]):
        a = xr[t] - C[j, t]
        s += a * a
    return s


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def scaled_sqdist_row(xr, C, h, a, j):
    """a[j] + Σ_t h[j, t] (xr[t] − C[j, t])²: a squared distance under row j's diagonal metric, plus its
    offset. With h = 1/2σ² and a = −log π + ½ Σ_t log 2πσ²_t it is a Gaussian component's −log density, the
    cost a mixture's truncated E-step ranks clusters by.

    xr : IN float64 (d,);  C, h : IN float64 (k, d);  a : IN float64 (k,);  j : IN row of C
    """
    s = 0.0
    for t in range(xr.shape[0]):
        v = xr[t] - C[j, t]
        s += h[j, t] * (v * v)
    return a[j] + s


# features from which ``sqdist_squares`` beats ``sqdist`` (200k rows: 2.2 against 3.8 ms at 32, 0.56 against
# 0.30 at 3)
SQUARES_FROM = 8
# absolute slack of a bound from the GEMM form: products that underflow in float32 lose < 1.5e-45 each
UNDERFLOW = 1e-30


def rows_per_block(n_centers):
    """GEMM row-block width: keeps the (k × rows) block of cross products near 1 MB of cache, down to 64
    rows (a floor of 256 left 4 MB blocks at k = 4096: 13 % slower there, 6 % at k = 2048)."""
    return max(64, min(4096, (1 << 18) // max(1, n_centers)))


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
def nearest_rows(X, b0, b1, Cd, cnorm, C, tol, G, best, second, jb, top, band, labels, mind, mind2, known):
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
    top, band : OUT float64 (block,)           scratch: each row's best GEMM value and rounding band
    labels : OUT int32 (n,)                    nearest centre (lowest index on ties)
    mind   : OUT float64 (n,)                  exact squared distance to it
    mind2  : OUT float64 (n,) or (0,)          a lower bound of the squared distance to every other
                                               centre (from the scan's second value, less its rounding
                                               band); not written when empty
    known  : IN  int32 (n,) or (0,)            rows whose ``mind`` already holds the exact distance to
                                               centre known[i] (a search after a move, most labels kept):
                                               not measured again where the scan picks that centre
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
    researched = 0
    labels[b0:b1] = jb[:m]
    # every row measured against its scan's best in a loop of its own (inside the one below the squares'
    # loop ran 40 % slower); a near tie's is thrown away for its re-search
    sqdist_to_labels(X, b0, b1, C, labels, mind, known)
    for r in range(m):
        i = b0 + r
        xx = rough_sqnorm(X, i)
        band[r] = tol * (xx + cmax)
        top[r] = np.float64(best[r])
        near_tie = k > 1 and np.float64(second[r]) - top[r] <= band[r]
        if mind2.shape[0]:  # after a re-search the label may be the scan's second: only the best bounds the rest
            mind2[i] = max(0.0, (top[r] if near_tie else np.float64(second[r])) + xx - band[r] - UNDERFLOW)
        if near_tie:
            mind[i] = np.inf
            researched += 1
        else:
            band[r] = -1.0  # no centre passes: every GEMM value is >= the row's best
    evals += m - researched
    if researched:
        evals += _research(X, b0, m, C, cnorm, Gv, top, band, labels, mind, researched)
    return evals


@njit(nogil=True, cache=True, inline="always")
def _keep_closer(X, i, C, j, labels, mind):
    """Row i's label becomes centre j when j is strictly closer, measured directly (centres come in
    ascending order: ties keep the lower index)."""
    dj = sqdist(X, i, C, j)
    if dj < mind[i]:
        mind[i] = dj
        labels[i] = j


@njit(nogil=True, cache=True)
def _research(X, b0, m, C, cnorm, Gv, top, band, labels, mind, researched):
    """The float64 re-search of the rows whose best and second GEMM values lie within the rounding band:
    only centres whose GEMM value is within the band of the row's best can win, and they are measured
    directly, in ascending order (ties to the lower index). Rows outside it have band −1 (no centre passes)
    and their mind already set. Returns the evaluations.

    A few rows are re-searched row by row, down G's strided columns. Near-equal centres are common in GMM
    fits and in 32-D blobs with many centres per blob (vc-GMM's means at C = 4096: 39 % of the rows), and
    then centre by centre over G's contiguous rows, a vectorised count first skipping the centres within no
    row's band, is 2x faster than the row walks; the result is the same either way."""
    evals = 0
    two = Gv.dtype.type(2.0)
    k = C.shape[0]
    if 8 * researched < m:
        for r in range(m):
            if band[r] < 0.0:
                continue
            i = b0 + r
            for j in range(k):
                if np.float64(Gv.dtype.type(cnorm[j]) - two * Gv[j, r]) - top[r] <= band[r]:
                    _keep_closer(X, i, C, j, labels, mind)
                    evals += 1
        return evals
    for j in range(k):
        cj = Gv.dtype.type(cnorm[j])
        hits = 0
        for r in range(m):
            hits += np.float64(cj - two * Gv[j, r]) - top[r] <= band[r]
        if hits == 0:
            continue
        for r in range(m):
            if np.float64(cj - two * Gv[j, r]) - top[r] <= band[r]:
                _keep_closer(X, b0 + r, C, j, labels, mind)
                evals += 1
    return evals


@njit(nogil=True, cache=True)
def nearest_neighbours(Q, q_ids, Y, y_ids, approx, slack, out_j, out_d2):
    """Each query row's r nearest rows of Y other than itself, by exact float64 distance, ties to the lower
    id: the r-th smallest approximate (GEMM) distance plus twice its error bound ``slack`` selects the
    candidates, which are re-measured directly, so the result does not depend on the GEMM's blocking nor on
    the order of Y's rows.

    Q       : IN  float64 (n, d)   query rows
    q_ids   : IN  int64 (n,)       their ids (a query skips the row of Y with its own id)
    Y       : IN  float64 (m, d)   candidate rows
    y_ids   : IN  int64 (m,)       their ids (the tie-break)
    approx  : IN  float64 (n, m)   approximate squared distances of Q to Y
    slack   : IN  float            bound on |approx − exact|
    out_j   : OUT int64 (n, r)     neighbours as rows of Y, nearest first; −1 where Y has fewer than r others
    out_d2  : OUT float64 (n, r)   their exact squared distances (inf where −1)
    """
    r = out_j.shape[1]
    worst = np.empty(r)
    for i in range(Q.shape[0]):
        worst[:] = np.inf  # the r smallest approximate distances, ascending
        for j in range(Y.shape[0]):
            a = approx[i, j]
            if y_ids[j] == q_ids[i] or a >= worst[r - 1]:
                continue
            t = r - 1
            while t > 0 and worst[t - 1] > a:
                worst[t] = worst[t - 1]
                t -= 1
            worst[t] = a
        limit = worst[r - 1] + 2.0 * slack
        out_d2[i, :] = np.inf
        out_j[i, :] = -1
        for j in range(Y.shape[0]):
            if y_ids[j] == q_ids[i] or approx[i, j] > limit:
                continue
            d = sqdist(Q, i, Y, j)
            last = out_j[i, r - 1]
            if d > out_d2[i, r - 1] or (d == out_d2[i, r - 1] and last >= 0 and y_ids[j] > y_ids[last]):
                continue
            t = r - 1
            while t > 0 and (out_d2[i, t - 1] > d or (out_d2[i, t - 1] == d and y_ids[out_j[i, t - 1]] > y_ids[j])):
                out_d2[i, t] = out_d2[i, t - 1]
                out_j[i, t] = out_j[i, t - 1]
                t -= 1
            out_d2[i, t] = d
            out_j[i, t] = j


@njit(nogil=True, cache=True)
def nearest_centres(X, C, out):
    """Each row's m = out.shape[1] nearest rows of C by direct float64 distance, ties to the lower index
    (IVF's probes: exact, so a row's probes do not depend on how the rows are blocked).

    X : IN float32/float64 (n, d);  C : IN float64 (k, d), k >= m;  out : OUT int64 (n, m), nearest first
    """
    m = out.shape[1]
    best = np.empty(m)
    for i in range(X.shape[0]):
        best[:] = np.inf
        for j in range(C.shape[0]):
            d = sqdist(X, i, C, j)
            if d >= best[m - 1]:
                continue
            t = m - 1
            while t > 0 and best[t - 1] > d:
                best[t] = best[t - 1]
                out[i, t] = out[i, t - 1]
                t -= 1
            best[t] = d
            out[i, t] = j
