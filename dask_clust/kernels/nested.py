"""Nested mini-batch k-means kernels (ALGORITHMS.md §2): the nesting order, and one round over a chunk's
active rows with lower bounds on the distances to the centres (Elkan: one per centre; Hamerly: one on the
second closest).

Bounds are float32 (N·k·4 bytes) rounded down, so they stay lower bounds of the float64 distances.
"""
import numpy as np
from numba import njit

from .distance import sqdist
from .._random import GOLDEN, splitmix

# float32 rounding is at most 2^-24 relative: shrinking by 2^-22 first keeps a stored bound below its value
_SHRINK = 1.0 - 2.0 ** -22


@njit(nogil=True, cache=True, inline="always")
def _down(x):
    """A float32 lower bound of the non-negative part of x."""
    return np.float32(max(x, 0.0) * _SHRINK)


@njit(nogil=True, cache=True, inline="always")
def _feistel(x, half, mask, seed):
    """Four Feistel rounds on a 2·half-bit integer: a bijection of [0, 2^(2·half))."""
    left = x >> half
    right = x & mask
    for r in range(4):
        _, z = splitmix(seed ^ (right * GOLDEN + np.uint64(r)))
        left, right = right, left ^ (z & mask)
    return (left << half) | right


@njit(nogil=True, cache=True)
def nested_ranks(row0, n_total, seed, out):
    """out[i] = rank of global row row0 + i in a pseudo-random permutation of [0, n_total) keyed by seed.

    A Feistel network on the smallest even power of 2 >= n_total, walked along its cycle until it lands
    inside [0, n_total): a bijection computed row by row, so the ranks do not depend on the chunking.
    row0 : IN int;  n_total : IN int;  seed : IN int;  out : OUT int64 (n,)
    """
    bits = 2
    while (1 << bits) < n_total:
        bits += 2
    half = np.uint64(bits // 2)
    mask = (np.uint64(1) << half) - np.uint64(1)
    key = np.uint64(seed)
    n = np.uint64(n_total)
    for i in range(out.shape[0]):
        y = _feistel(np.uint64(row0 + i), half, mask, key)
        while y >= n:
            y = _feistel(y, half, mask, key)
        out[i] = np.int64(y)


@njit(nogil=True, cache=True, inline="always")
def _move(X, i, wi, a, S, v, sign):
    v[a] += sign * wi
    for t in range(X.shape[1]):
        S[a, t] += sign * wi * np.float64(X[i, t])


@njit(nogil=True, cache=True)
def nested_round(X, w, order, n_old, n_new, C, p, labels, dist, lower, S, v, sse):
    """One round of nmbatch on a chunk: reused rows (positions [0, n_old) of ``order``) take l −= p, their
    exact distance to their centre, and the exact distance to every centre whose bound is below it
    (Elkan, in index order); a changed label moves the row's (w x, w) from the old centre's sums to the
    new one's. Rows at positions [n_old, n_new) join with all k distances (tight bounds).
    Returns (distance evaluations, changed labels).

    X : IN (n, D);  w : IN float64 (n,);  order : IN int64 (n,) chunk rows by nesting rank
    C : IN float64 (k, D) centres;  p : IN float64 (k,) their displacement at the last update
    labels : INOUT int32 (n,), dist : INOUT float64 (n,) label and exact distance, by position
    lower : INOUT float32 (n, k) bounds by position (Elkan), or (n, 1): bound on the second closest (Hamerly)
    S : INOUT float64 (k, D) Σ w x moves;  v : INOUT float64 (k,) Σ w moves
    sse : INOUT float64 (k,) Σ w d² of the active rows by their new label
    """
    k = C.shape[0]
    elkan = lower.shape[1] == k
    pmax = 0.0
    for j in range(k):
        pmax = max(pmax, p[j])
    evals = 0
    changed = 0
    for pos in range(n_old):
        i = order[pos]
        a = labels[pos]
        d = np.sqrt(sqdist(X, i, C, a))
        evals += 1
        if elkan:
            a0 = labels[pos]
            candidates = 0
            for j in range(k):  # branch-free, so both loops vectorise; most rows have no candidate
                lj = _down(lower[pos, j] - p[j])
                lower[pos, j] = lj
                candidates += lj < d
            candidates -= lower[pos, a0] < d
            for j in range(k if candidates else 0):  # Alg. 1: every centre but the label at the round's start
                if j != a0 and lower[pos, j] < d:
                    dj = np.sqrt(sqdist(X, i, C, j))
                    evals += 1
                    lower[pos, j] = _down(dj)
                    if dj < d:
                        a = j
                        d = dj
        else:
            lower[pos, 0] = _down(lower[pos, 0] - pmax)
            if lower[pos, 0] < d:
                a, d, second = _nearest_two(X, i, C)
                evals += k
                lower[pos, 0] = _down(second)
        if a != labels[pos]:
            _move(X, i, w[i], labels[pos], S, v, -1.0)
            _move(X, i, w[i], a, S, v, 1.0)
            labels[pos] = a
            changed += 1
        dist[pos] = d
        sse[a] += w[i] * d * d
    for pos in range(n_old, n_new):
        i = order[pos]
        if elkan:
            a = 0
            d = np.inf
            for j in range(k):
                dj = np.sqrt(sqdist(X, i, C, j))
                lower[pos, j] = _down(dj)
                if dj < d:
                    a = j
                    d = dj
        else:
            a, d, second = _nearest_two(X, i, C)
            lower[pos, 0] = _down(second)
        evals += k
        labels[pos] = a
        dist[pos] = d
        _move(X, i, w[i], a, S, v, 1.0)
        sse[a] += w[i] * d * d
    return evals, changed


@njit(nogil=True, cache=True, inline="always")
def _nearest_two(X, i, C):
    """(index, distance) of the nearest centre (lowest index on ties) and the second smallest distance."""
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
