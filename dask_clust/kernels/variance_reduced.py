"""Variance-reduced k-means steps (ALGORITHMS.md §3): T single-sample updates with a constant learning
rate, each corrected by the sample's gradient at the epoch's anchor (its label and centre at the start of
the epoch).

The nearest centre of a step is found in the GEMV form ||c||² − 2 x·c over a transposed copy of the
centres (one vector pass across all centres instead of k short direct distances); where another centre
is within the form's rounding error of the best, the candidates are compared with direct float64
distances, so the choice is the exact one (lowest index on ties), as in ``distance.nearest_rows``.
"""
import numpy as np
from numba import njit

from .distance import sqdist_row


@njit(nogil=True, cache=True, inline="always")
def _norm(C, j):
    s = 0.0
    for t in range(C.shape[1]):
        s += C[j, t] * C[j, t]
    return s


@njit(nogil=True, cache=True, inline="always")
def _set(C, CT, cn, j):
    """Refresh centre j's transposed copy and squared norm after an update of C[j]."""
    for t in range(C.shape[1]):
        CT[t, j] = C[j, t]
    cn[j] = _norm(C, j)
    return cn[j]


@njit(nogil=True, cache=True, fastmath={"contract"})
def _nearest(xr, C, CT, cn, v, band):
    """Index of the exactly nearest centre to the row buffer xr (lowest index on ties)."""
    k = C.shape[0]
    for j in range(k):
        v[j] = cn[j]
    for t in range(xr.shape[0]):
        x2 = 2.0 * xr[t]
        for j in range(k):  # vectorises across the centres
            v[j] -= x2 * CT[t, j]
    best = np.inf
    jb = 0
    for j in range(k):
        if v[j] < best:
            best = v[j]
            jb = j
    near = 0
    for j in range(k):
        near += v[j] - best <= band
    if near == 1:
        return jb
    exact = np.inf
    for j in range(k):
        if v[j] - best <= band:
            dj = sqdist_row(xr, C, j)
            if dj < exact:
                exact = dj
                jb = j
    return jb


@njit(nogil=True, cache=True, inline="always")
def _drift(C, Ct, j):
    s = 0.0
    for t in range(C.shape[1]):
        e = C[j, t] - Ct[j, t]
        s += e * e
    return np.sqrt(s)


@njit(nogil=True, cache=True)
def variance_reduced_steps(X, idx, anchor, lower2, Ct, A, C, eta, tol):
    """Steps t = 0..T−1 on rows idx[t]: j = nearest centre of x under the current C (lowest index on
    ties), a = x's anchor label;  j == a: c_j −= η (c_j − A_j)  (the pull-back);  else c_j −= η (c_j − x)
    and c_a += η (A_a − x). Returns (steps whose nearest centre was not the anchor label, distance
    evaluations).

    The nearest centre is the anchor label without a search when x is closer to it than the anchor pass's
    bound on every other centre, less the farthest any other centre has drifted since that pass (Hamerly's
    test); otherwise all k centres are compared.

    X : IN (n, d);  idx : IN int64 (T,) rows, drawn uniformly;  anchor : IN int32 (n,) nearest under Ct
    lower2 : IN float64 (n,) lower bound of each row's squared distance under Ct to every other centre
    Ct : IN float64 (k, d) the anchor pass's centres;  A : IN float64 (k, d) anchor centres (their means)
    C : INOUT float64 (k, d) current centres (A on entry);  eta : IN float the constant learning rate
    tol : IN float relative rounding band of the GEMV form
    """
    k, d = C.shape
    CT = np.empty((d, k))
    cn = np.empty(k)
    drift = np.empty(k)
    dirty = np.zeros(k, np.bool_)
    stale = np.empty(k, np.int64)  # centres updated since the transposed copy was last refreshed
    nstale = 0
    cmax = 0.0
    for j in range(k):
        cmax = max(cmax, _set(C, CT, cn, j))
        drift[j] = _drift(C, Ct, j)
    top1, top2 = _two_largest(drift)
    v = np.empty(k)
    xr = np.empty(d)
    moved = 0
    evals = 0
    for t in range(idx.shape[0]):
        i = idx[t]
        xx = 0.0
        for s in range(d):
            xr[s] = X[i, s]
            xx += xr[s] * xr[s]
        a = anchor[i]
        da = sqdist_row(xr, C, a)
        others = drift[top2] if top1 == a else drift[top1]
        r = np.sqrt(lower2[i]) * (1.0 - 1e-9) - others  # every other centre is at least this far
        if r > 0.0 and da < r * r:
            j = a
            evals += 1
        else:
            for q in range(nstale):  # the search reads the transposed copy: bring it up to date
                cmax = max(cmax, _set(C, CT, cn, stale[q]))
                dirty[stale[q]] = False
            nstale = 0
            j = _nearest(xr, C, CT, cn, v, tol * (xx + cmax))
            evals += k + 1
        if j == a:
            for s in range(d):
                C[j, s] -= eta * (C[j, s] - A[j, s])
        else:
            moved += 1
            for s in range(d):
                C[j, s] -= eta * (C[j, s] - xr[s])
                C[a, s] += eta * (A[a, s] - xr[s])
            nstale = _touch(C, Ct, a, drift, dirty, stale, nstale)
        nstale = _touch(C, Ct, j, drift, dirty, stale, nstale)
        if drift[j] > drift[top2] or drift[a] > drift[top2]:
            top1, top2 = _two_largest(drift)
    return moved, evals


@njit(nogil=True, cache=True, inline="always")
def _touch(C, Ct, j, drift, dirty, stale, nstale):
    """Centre j was updated: its drift grows to its running maximum (a bound only needs to stay an
    upper one) and its transposed copy goes stale."""
    drift[j] = max(drift[j], _drift(C, Ct, j))
    if not dirty[j]:
        dirty[j] = True
        stale[nstale] = j
        nstale += 1
    return nstale


@njit(nogil=True, cache=True)
def _two_largest(x):
    """Indices of the largest and second largest entries (the same index when there is one entry)."""
    i1 = 0
    for j in range(x.shape[0]):
        if x[j] > x[i1]:
            i1 = j
    i2 = 1 if i1 == 0 and x.shape[0] > 1 else 0
    for j in range(x.shape[0]):
        if j != i1 and x[j] > x[i2]:
            i2 = j
    return i1, i2
