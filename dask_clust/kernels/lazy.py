"""Lloyd's step over rows whose Hamerly bounds are kept lazily: a row the test keeps is not read.

Hamerly's test (G. Hamerly, "Making k-means even faster", SDM 2010, §3) keeps a row's label while an upper
bound u of its distance to its own centre is below a lower bound l of its distance to every other centre;
when the centres move, u grows by its centre's move and l shrinks by the largest move. Kept as values, the
bounds are rewritten at every step, and the step reads every row to sum it. Kept lazily, u less its centre's
moves accumulated since the fit began (``drift``) and l plus the largest moves accumulated (``far``), a row
whose test passes costs a read of its label and two bounds, nothing is written, and its features stay where
they are: only the rows that fail are gathered, searched (``assign``) and given fresh bounds. The labels are
a full search's all the same.

The cluster sums the M-step needs then cannot come from reading every row: each chunk keeps Σ w x, Σ w and
Σ w ||x − ref||² per cluster exactly, as fixed-point words on the fit's grid (``stats.fixed_add_weighted``),
and a row that changes label moves its share from one cluster's words to the other's. Exact words are the
same however the rows reached them, so a chunk that kept its state since the fit began and one rebuilt from
its rows (a lost worker) give the same bits. ``ref`` (the data's mean) keeps Σ w ||x − ref||² about the size
of the data's spread, so a step's QE, formed from the three (``lazy_qe``), loses little to cancellation.
"""

import numpy as np
from numba import njit

from .assign import GATHER_ROWS, assign, gather_buffers
from .stats import fixed_add_weighted, from_fixed

# relative slack on the lazy test: far above the rounding of a bound plus its accumulated moves
LAZY_SLACK = 1e-9
# above half a float32 ulp of any value, relative: a bound moved by it rounds to float32 on its safe side
_ULP32 = 2.4e-7


@njit(nogil=True, cache=True, inline="always")
def _up32(v):
    """The float32 nearest v that is not below it."""
    f = np.float32(v)
    return f if f >= v else np.float32(v + _ULP32 * abs(v) + 1e-37)


@njit(nogil=True, cache=True, inline="always")
def _down32(v):
    """The float32 nearest v that is not above it."""
    f = np.float32(v)
    return f if f <= v else np.float32(v - _ULP32 * abs(v) - 1e-37)


@njit(nogil=True, cache=True, inline="always")
def _bounds(mind, mind2, drift, far):
    """A searched row's bounds as kept lazily, in float32 rounded outwards (the test reads 8 bytes of bounds a
    row, not 16): its distance less its centre's drift, and its bound of every other centre's distance plus
    the accumulated largest moves, each widened by the slack."""
    return _up32(np.sqrt(mind) * (1.0 + LAZY_SLACK) - drift), _down32(np.sqrt(mind2) * (1.0 - LAZY_SLACK) + far)


@njit(nogil=True, cache=True)
def lazy_bounds(labels, mind, mind2, drift, far, ub, lb):
    """Rows just searched by ``assign``: their bounds kept lazily.

    labels : IN int32 (n,);  mind : IN float64 (n,) the exact squared distance to the label's centre
    mind2 : IN float64 (n,) a lower bound of the squared distance to every other centre
    drift : IN float64 (k,);  far : IN float;  ub, lb : OUT float32 (n,)
    """
    for i in range(labels.shape[0]):
        ub[i], lb[i] = _bounds(mind[i], mind2[i], drift[labels[i]], far)


@njit(nogil=True, cache=True)
def add_shares(X, w, labels, ref, top, s1, sw, sq):
    """Rows' weighted shares added to their clusters' exact words: Σ w x (``s1``: k·d word rows, cluster c's
    at c·d), Σ w (``sw``) and Σ w ||x − ref||² (``sq``); with ``w`` negated, taken back exactly.

    X : IN float32/float64 (n, d);  w : IN float64 (n,);  labels : IN int32 (n,);  ref : IN float64 (d,)
    s1 : INOUT int64 (k·d, 3);  sw, sq : INOUT int64 (k, 3)
    Returns the number of products that did not fit the grid (not added).
    """
    n, d = X.shape
    at = np.empty(n, np.int64)
    q = np.empty((n, 1))
    for r in range(n):
        at[r] = labels[r] * d
        s = 0.0
        for t in range(d):
            v = np.float64(X[r, t]) - ref[t]
            s += v * v
        q[r, 0] = s
    bad = fixed_add_weighted(s1, X, w, at, top)
    at[:] = labels
    bad += fixed_add_weighted(sw, np.ones((n, 1)), w, at, top)
    return bad + fixed_add_weighted(sq, q, w, at, top)


@njit(nogil=True, cache=True)
def lazy_search(X, w, Cd, cnorm, C, tol, block, drift, far, ref, top, labels, ub, lb, s1, sw, sq):
    """One step after the centres moved: every row's lazy test; the rows that fail are searched in gathers
    of ``GATHER_ROWS``, get fresh bounds, and those whose label changed move their shares of the words.

    X : IN float32/float64 (n, d);  w : IN float64 (n,);  Cd, cnorm, C, tol, block : IN as ``assign`` takes them
    drift : IN float64 (k,) each centre's moves since the fit began (an upper bound);  far : IN float the sum
    of the largest moves;  ref, top : IN as ``add_shares``'
    labels : INOUT int32 (n,);  ub, lb : INOUT float32 (n,) the lazy bounds;  s1, sw, sq : INOUT the words
    Returns (distance evaluations, labels changed, products that did not fit).
    """
    n, d = X.shape
    rows, Xg, glabels, gmind, gmind2, _ = gather_buffers(X)
    evals = changed = bad = 0
    g = 0
    for i in range(n):
        a = labels[i]
        u, l = np.float64(ub[i]), np.float64(lb[i])
        if not (u + drift[a] + LAZY_SLACK * (abs(u) + drift[a] + abs(l) + far) < l - far):
            rows[g] = i
            for t in range(d):  # not Xg[g] = X[i]: a row view costs two atomic reference counts
                Xg[g, t] = X[i, t]
            g += 1
        if g == GATHER_ROWS or (g > 0 and i == n - 1):
            evals += assign(Xg[:g], Cd, cnorm, C, tol, block, glabels[:g], gmind[:g], gmind2[:g], labels[:0])
            c, b = _settle(
                Xg[:g],
                w,
                rows[:g],
                glabels[:g],
                gmind[:g],
                gmind2[:g],
                drift,
                far,
                ref,
                top,
                labels,
                ub,
                lb,
                s1,
                sw,
                sq,
            )
            changed += c
            bad += b
            g = 0
    return evals, changed, bad


@njit(nogil=True, cache=True)
def _settle(Xg, w, rows, glabels, gmind, gmind2, drift, far, ref, top, labels, ub, lb, s1, sw, sq):
    """The searched rows (``Xg``, rows ``rows`` of the chunk) take their labels and fresh bounds; a row whose
    label changed moves its share of the words. Returns (labels changed, products that did not fit)."""
    moved = np.empty(rows.shape[0], np.int64)
    m = 0
    for r in range(rows.shape[0]):
        moved[m] = r
        m += glabels[r] != labels[rows[r]]
    bad = 0
    if m:
        sel = moved[:m]
        wm = w[rows[sel]]
        bad += add_shares(Xg[sel], -wm, labels[rows[sel]], ref, top, s1, sw, sq)
        bad += add_shares(Xg[sel], wm, glabels[sel], ref, top, s1, sw, sq)
    for r in range(rows.shape[0]):
        i = rows[r]
        labels[i] = glabels[r]
        ub[i], lb[i] = _bounds(gmind[r], gmind2[r], drift[glabels[r]], far)
    return m, bad


@njit(nogil=True, cache=True)
def lazy_qe(C, ref, s1, sw, sq, top):
    """A chunk's QE, Σ_c Σ w ||x − c||², from its words: per cluster Σ w ||x − r||² − 2 (c − r)·(Σ w x − r Σ w)
    + Σ w ||c − r||² with r = ``ref`` (each cluster's term at least 0, as its true value is).

    C : IN float64 (k, d);  ref : IN float64 (d,);  s1 : IN int64 (k·d, 3);  sw, sq : IN int64 (k, 3)
    """
    k, d = C.shape
    S1 = np.empty(k * d)
    W = np.empty(k)
    Q = np.empty(k)
    from_fixed(s1, top, S1)
    from_fixed(sw, top, W)
    from_fixed(sq, top, Q)
    qe = 0.0
    for c in range(k):
        cross = 0.0
        cc = 0.0
        for t in range(d):
            dc = C[c, t] - ref[t]
            cross += dc * (S1[c * d + t] - W[c] * ref[t])
            cc += dc * dc
        qe += max(0.0, Q[c] - 2.0 * cross + W[c] * cc)
    return qe
