"""SLK's per-row work (Ziko, Granger & Ben Ayed, NeurIPS 2018): the kernel affinities
a = k(x, modes) and the fused bound update z <- softmax(a + λ W z).

One pass per update reads each row's z once: it sums W z from the halo, takes the previous z's energy
terms, its hard label and its column maxima (BO's next modes), and writes the new z in place. A
separate energy pass would read z twice; temporaries of N × K would double the memory of the largest
state there is. With few features a is recomputed per row instead of held (a third of SLK's memory).
"""

import math

import numpy as np
from numba import njit

from .distance import sqdist


@njit(nogil=True, cache=True)
def affinities(X, M, sigma, out):
    """out[i, l] = exp(−||x_i − m_l||² / (2σ²)), direct float64 distances.

    X : IN float64 (n, d);  M : IN float64 (k, d);  out : OUT float64 (n, k)
    """
    scale = 1.0 / (2.0 * sigma * sigma)
    for i in range(X.shape[0]):
        for l in range(M.shape[0]):
            out[i, l] = math.exp(-sqdist(X, i, M, l) * scale)


@njit(nogil=True, cache=True)
def bound_update(a, X, M, sigma, z, H, at, nb, lmbda, ids, labels, col_max, col_arg):
    """One Jacobi bound update of every row: b = Σ_{q ∈ N(p)} z_q from the previous z (the halo), then
    z_p <- softmax(a_p + λ b_p) in place. Returns the previous z's (Σ z log z, Σ a·z, Σ b·z).

    a       : IN     float64 (n, k)   affinities, or (0, k): recomputed per row from X, M and σ as
                                      ``affinities`` does (the same bits; one N × K array less to hold)
    X, M    : IN     float64 (n, d), (k, d)   rows and modes (read only when a is empty)
    z       : IN/OUT float64 (n, k)   the previous z, replaced by the new one
    H       : IN     float64 (m, k)   the previous z of the rows the partition reads
    at      : IN     int64 (u,)       where the chunk's named rows sit in H
    nb      : IN     int64 (n, r)     each row's neighbours as indices into ``at``, in ascending input id
                                      (so b's sum order is the same under any layout)
    ids     : IN     int64 (n,)       the rows' input ids (ties of the column maxima)
    labels  : OUT    int64 (n,)       argmax_l of the previous z (first on ties)
    col_max : OUT    float64 (k,)     max_p of the previous z per column
    col_arg : OUT    int64 (k,)       the row (index in the chunk) holding it, the lowest input id on ties
    """
    n, k = z.shape
    stored = a.shape[0] == n
    scale = 1.0 / (2.0 * sigma * sigma)
    b = np.empty(k)
    v = np.empty(k)
    row_a = np.empty(k)
    zlogz = az = bz = 0.0
    col_max[:] = -np.inf
    col_arg[:] = -1
    for i in range(n):
        for l in range(k):
            row_a[l] = a[i, l] if stored else math.exp(-sqdist(X, i, M, l) * scale)
        b[:] = 0.0
        for j in range(nb.shape[1]):
            q = at[nb[i, j]]
            for l in range(k):
                b[l] += H[q, l]
        best = 0
        for l in range(k):
            zl = z[i, l]
            if zl > 0.0:
                zlogz += zl * math.log(zl)
            az += row_a[l] * zl
            bz += b[l] * zl
            if zl > z[i, best]:
                best = l
            c = col_arg[l]
            if zl > col_max[l] or (zl == col_max[l] and ids[i] < ids[c]):
                col_max[l] = zl
                col_arg[l] = i
        labels[i] = best
        top = -np.inf
        for l in range(k):
            v[l] = row_a[l] + lmbda * b[l]
            top = max(top, v[l])
        s = 0.0
        for l in range(k):
            v[l] = math.exp(v[l] - top)
            s += v[l]
        for l in range(k):
            z[i, l] = v[l] / s
    return zlogz, az, bz
