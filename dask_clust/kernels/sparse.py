"""Kernels on row chunks held as CSR (``indptr``, ``indices``, ``data``: scipy's layout) against dense centres:
documents as TF-IDF rows, 10^4-10^6 columns, a few hundred non-zeros each. A row's squared distance to a
centre is ||x||² − 2 x·c + ||c||², its inner products with every centre gathered from the centres' columns
(``CT``, the centres transposed, D × k): O(nnz·k) a chunk where a dense row costs O(D·k). Every sum is
float64; a distance is clamped at 0 (the expansion can round below it when x is a centre)."""

import math

import numpy as np
from numba import njit


@njit(nogil=True, cache=True, inline="always")
def row_sqnorm(indptr, data, i):
    """||x_i||² of CSR row i, in float64."""
    s = 0.0
    for p in range(indptr[i], indptr[i + 1]):
        v = np.float64(data[p])
        s += v * v
    return s


@njit(nogil=True, cache=True, inline="always")
def row_sqdist(indptr, indices, data, i, xx, C, cnorm, c):
    """||x_i − c||² of CSR row i (squared norm xx) to centre c of C, by the expansion from its non-zeros, clamped
    at 0: O(nnz), not O(D)."""
    dot = 0.0
    for p in range(indptr[i], indptr[i + 1]):
        dot += np.float64(data[p]) * C[c, indices[p]]
    return max(0.0, xx - 2.0 * dot + cnorm[c])


@njit(nogil=True, cache=True)
def row_products(indptr, indices, data, i, CT, dots):
    """dots[j] = x_i·c_j for every centre, and ||x_i||²."""
    dots[:] = 0.0
    xx = 0.0
    for p in range(indptr[i], indptr[i + 1]):
        v = np.float64(data[p])
        xx += v * v
        col = CT[indices[p]]
        for j in range(dots.shape[0]):
            dots[j] += v * col[j]
    return xx


# relative rounding of the expansion ||x||² − 2 x·c + ||c||² (a sum of nnz products: below nnz·eps·(||x||² +
# ||c||²) for rows of up to 10^4 non-zeros): what a bound kept from it gives up, and a test on it adds
EXPANSION_SLACK = 1e-12
# relative slack on the triangle-inequality test (``assign.TRIANGLE_SLACK``)
TRIANGLE_SLACK = 1e-9


@njit(nogil=True, cache=True, inline="always")
def two_smallest(xx, dots, cnorm):
    """From a row's squared norm and inner products: (index, squared distance) of its nearest centre
    (lowest index on ties) and the second smallest squared distance."""
    best, runner, bj = np.inf, np.inf, 0
    for j in range(dots.shape[0]):
        d = max(0.0, xx - 2.0 * dots[j] + cnorm[j])
        if d < best:
            best, runner, bj = d, best, j
        elif d < runner:
            runner = d
    return bj, best, runner


@njit(nogil=True, cache=True)
def _search_row(xx, dots, cnorm, cmax, i, labels, mind, mind2):
    """Row i's nearest centre from its inner products (ties: the lowest index), its squared distance, and a
    lower bound of the others' (the second nearest less the expansion's rounding) when mind2 is kept."""
    bj, best, runner = two_smallest(xx, dots, cnorm)
    labels[i], mind[i] = bj, best
    if mind2.shape[0] > 0:
        mind2[i] = max(0.0, runner - EXPANSION_SLACK * (xx + cmax))


@njit(nogil=True, cache=True)
def csr_assign(indptr, indices, data, CT, cnorm, labels, mind, mind2):
    """Label every row with its nearest centre (ties: the lowest index); returns distance evaluations.

    indptr, indices, data : IN a CSR chunk (n rows);  CT : IN float64 (d, k) the centres' columns
    cnorm  : IN float64 (k,) ||c_j||²
    labels : OUT int32 (n,);  mind : OUT float64 (n,) squared distance to the label's centre
    mind2  : OUT float64 (n,) a lower bound of the squared distance to every other centre, or (0,): skipped
    """
    n, k = indptr.shape[0] - 1, CT.shape[1]
    dots = np.empty(k)
    cmax = cnorm.max() if k else 0.0
    for i in range(n):
        xx = row_products(indptr, indices, data, i, CT, dots)
        _search_row(xx, dots, cnorm, cmax, i, labels, mind, mind2)
    return n * k


@njit(nogil=True, cache=True)
def csr_assign_moved(indptr, indices, data, CT, cnorm, shift, prev, labels, mind, mind2):
    """``csr_assign`` after the centres moved, for rows whose ``prev`` labels and ``mind2`` bounds were kept
    for the centres before the move (Hamerly's test, as ``assign.assign_moved``): a row whose own centre is
    nearer than every other can have come keeps its label, measured against that centre alone (O(nnz));
    the others are searched in full. Returns distance evaluations.

    shift : IN float64 (k,) an upper bound of each centre's move;  prev : IN int32 (n,) the labels before
    labels : OUT int32 (n,);  mind : INOUT float64 (n,);  mind2 : INOUT float64 (n,) the bounds
    """
    n, k = indptr.shape[0] - 1, CT.shape[1]
    far, second, arg = 0.0, 0.0, -1  # the largest move, its centre, and the largest of the others
    for j in range(k):
        if shift[j] > far:
            far, second, arg = shift[j], far, j
        elif shift[j] > second:
            second = shift[j]
    cmax = cnorm.max() if k else 0.0
    dots = np.empty(k)
    evals = 0
    for i in range(n):
        a = prev[i]
        lower = np.sqrt(mind2[i]) * (1.0 - TRIANGLE_SLACK) - (second if a == arg else far)
        xx, dot = 0.0, 0.0
        for p in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[p])
            xx += v * v
            dot += v * CT[indices[p], a]
        d = max(0.0, xx - 2.0 * dot + cnorm[a])
        evals += 1
        if lower > 0.0 and d + EXPANSION_SLACK * (xx + cmax) < lower * lower:
            labels[i], mind[i], mind2[i] = a, d, lower * lower
        else:
            row_products(indptr, indices, data, i, CT, dots)
            _search_row(xx, dots, cnorm, cmax, i, labels, mind, mind2)
            evals += k
    return evals


@njit(nogil=True, cache=True)
def csr_accumulate(indptr, indices, data, w, labels, mind, sums, weights):
    """Lloyd's partial sufficient statistics for labelled CSR rows; returns Σ w·mind (``assign.accumulate``)."""
    qe = 0.0
    for i in range(indptr.shape[0] - 1):
        j = labels[i]
        wi = w[i]
        weights[j] += wi
        qe += wi * mind[i]
        for p in range(indptr[i], indptr[i + 1]):
            sums[j, indices[p]] += wi * np.float64(data[p])
    return qe


@njit(nogil=True, cache=True)
def csr_sum_entries(indptr, indices, data, w, labels, mind, d, keys, values, weights):
    """Lloyd's Σ w x per centre of labelled CSR rows as entries, one a non-zero: keys[p] = label·d + column,
    values[p] = w·x (``combine.Entries``; p counted from indptr[0]), and Σ w per centre into ``weights``;
    returns Σ w·mind."""
    qe = 0.0
    first = indptr[0]
    for i in range(indptr.shape[0] - 1):
        j = labels[i]
        wi = w[i]
        weights[j] += wi
        qe += wi * mind[i]
        for p in range(indptr[i], indptr[i + 1]):
            keys[p - first] = j * d + indices[p]
            values[p - first] = wi * np.float64(data[p])
    return qe


@njit(nogil=True, cache=True)
def csr_potentials(indptr, indices, data, w, mind, CT, cnorm, pot):
    """Greedy k-means++ scoring on CSR rows: pot[j] += Σ_i w_i min(mind_i, ||x_i − c_j||²)
    (``assign.candidate_potentials``); returns evaluations."""
    n, m = indptr.shape[0] - 1, CT.shape[1]
    dots = np.empty(m)
    for i in range(n):
        xx = row_products(indptr, indices, data, i, CT, dots)
        for j in range(m):
            pot[j] += w[i] * min(mind[i], max(0.0, xx - 2.0 * dots[j] + cnorm[j]))
    return n * m


@njit(nogil=True, cache=True)
def csr_row_sqnorms(indptr, data, out):
    """out[i] = ||x_i||² in float64, for each row of a CSR chunk."""
    for i in range(indptr.shape[0] - 1):
        out[i] = row_sqnorm(indptr, data, i)


@njit(nogil=True, cache=True)
def csr_sqdist_to(indptr, indices, data, C, cnorm, ids, out):
    """out[i, a] = ||x_i − c_{ids[i, a]}||² by the expansion from row i's non-zeros (O(nnz) a pair, clamped at 0).

    C : IN float64 (k, D);  cnorm : IN float64 (k,) ||c_j||²;  ids : IN int32 (n, m);  out : OUT float64 (n, m)
    """
    for i in range(ids.shape[0]):
        xx = row_sqnorm(indptr, data, i)
        for a in range(ids.shape[1]):
            out[i, a] = row_sqdist(indptr, indices, data, i, xx, C, cnorm, ids[i, a])


@njit(nogil=True, cache=True)
def csr_summary(indptr, indices, data, sums, sumsq):
    """``stats.chunk_summary`` of a CSR chunk (its implicit zeros add nothing): per-feature Σx and Σx², max |x|
    and its first row, and the first non-finite value as (row, column), (-1, -1) when every value is finite."""
    sums[:] = 0.0
    sumsq[:] = 0.0
    max_abs, at = 0.0, 0
    for i in range(indptr.shape[0] - 1):
        for p in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[p])
            if not math.isfinite(v):
                return max_abs, at, i, indices[p]
            sums[indices[p]] += v
            sumsq[indices[p]] += v * v
            if abs(v) > max_abs:
                max_abs, at = abs(v), i
    return max_abs, at, -1, -1


@njit(nogil=True, cache=True)
def csr_weighted_moments(indptr, indices, data, w, wx):
    """``stats.weighted_moments`` of a CSR chunk: Σ w x per feature into wx; returns Σ w ||x||²."""
    wx[:] = 0.0
    total = 0.0
    for i in range(indptr.shape[0] - 1):
        s = 0.0
        for p in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[p])
            wx[indices[p]] += w[i] * v
            s += v * v
        total += w[i] * s
    return total
