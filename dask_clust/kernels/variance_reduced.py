"""Variance-reduced k-means steps (Zhao et al., "Variance reduced k-means", 2018, Alg. 3-4): T single-sample
updates with a constant learning rate, each corrected by the sample's gradient at the epoch's anchor (its
label and centre at the start of the epoch).

A step's nearest centre is found with bounds from the epoch's anchor pass: every centre but the row's
anchor label was at least sqrt(lower2) away then, and has moved at most its drift since. When the anchor
centre is closer than all those bounds (Hamerly's test) there is no search; otherwise only the centres
whose bound does not rule them out get an exact distance (Elkan's test with one bound per row).
"""

import numpy as np
from numba import njit

from .distance import sqdist_row

# a bound rounded up by the square root and the subtraction must not rule out an exact tie
_MARGIN = 1.0 - 1e-9


@njit(nogil=True, cache=True, inline="always")
def _drift(C, Ct, j):
    s = 0.0
    for t in range(C.shape[1]):
        e = C[j, t] - Ct[j, t]
        s += e * e
    return np.sqrt(s)


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


@njit(nogil=True, cache=True)
def variance_reduced_steps(X, idx, anchor, lower2, Ct, A, C, eta):
    """Steps t = 0..T−1 on rows idx[t]: j = nearest centre of x under the current C (lowest index on
    ties), a = x's anchor label;  j == a: c_j −= η (c_j − A_j)  (the pull-back);  else c_j −= η (c_j − x)
    and c_a += η (A_a − x). Returns (steps whose nearest centre was not the anchor label, distance
    evaluations).

    X : IN (n, d);  idx : IN int64 (T,) rows, drawn uniformly;  anchor : IN int32 (n,) nearest under Ct
    lower2 : IN float64 (n,) lower bound of each row's squared distance under Ct to every other centre
    Ct : IN float64 (k, d) the anchor pass's centres;  A : IN float64 (k, d) anchor centres (their means)
    C : INOUT float64 (k, d) current centres (A on entry);  eta : IN float the constant learning rate
    """
    k, d = C.shape
    drift = np.empty(k)  # per centre, an upper bound of its distance from Ct
    for j in range(k):
        drift[j] = _drift(C, Ct, j)
    top1, top2 = _two_largest(drift)
    xr = np.empty(d)
    moved = 0
    evals = 0
    for t in range(idx.shape[0]):
        i = idx[t]
        for s in range(d):
            xr[s] = X[i, s]
        a = anchor[i]
        best = sqdist_row(xr, C, a)
        evals += 1
        far = np.sqrt(lower2[i]) * _MARGIN
        r = far - (drift[top2] if top1 == a else drift[top1])
        j = a
        if not (r > 0.0 and best < r * r):
            for c in range(k):
                if c == a:
                    continue
                rc = far - drift[c]
                if rc > 0.0 and rc * rc > best:
                    continue
                dc = sqdist_row(xr, C, c)
                evals += 1
                if dc < best or (dc == best and c < j):
                    best = dc
                    j = c
        if j == a:
            for s in range(d):
                C[j, s] -= eta * (C[j, s] - A[j, s])
        else:
            moved += 1
            for s in range(d):
                C[j, s] -= eta * (C[j, s] - xr[s])
                C[a, s] += eta * (A[a, s] - xr[s])
            drift[a] = max(drift[a], _drift(C, Ct, a))  # running maxima: a bound only has to stay above
        drift[j] = max(drift[j], _drift(C, Ct, j))
        if drift[j] > drift[top2] or drift[a] > drift[top2]:
            top1, top2 = _two_largest(drift)
    return moved, evals
