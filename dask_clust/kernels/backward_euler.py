"""Stochastic backward Euler for k-means (Yin, Pham, Oberman, Osher 2018): one implicit step x ← z, where z
averages the iterates of a stochastic fixed-point iteration y = x − γ g_B(y) over mini-batches B."""

import numpy as np
from numba import njit

from .assign import assign
from .distance import sqnorm


@njit(nogil=True, cache=True)
def batch_gradient(B, y, tol, block, labels, mind, g):
    """g ← the mini-batch gradient of f = QE/(2N) at the centres y: rows of B go to their nearest centre of
    y (the blocked GEMM of ``assign``: exact, lowest index on ties), g_j = (cnt_j y_j − Σ_{a_i = j} x_i)/|B|;
    a centre without rows gets 0. Returns the batch's Σ min_j ||x − y_j||².

    B : IN (b, d) the batch;  y : IN float64 (k, d);  tol, block : IN ``Prepared``'s for y
    labels : OUT int32 (b,), mind : OUT float64 (b,) scratch;  g : OUT float64 (k, d)
    """
    k, d = y.shape
    cnorm = np.empty(k)
    for j in range(k):
        cnorm[j] = sqnorm(y, j)
    assign(B, y.astype(B.dtype), cnorm, y, tol, block, labels, mind, np.empty(0), labels[:0])
    cnt = np.zeros(k)
    g[:] = 0.0
    qe = 0.0
    for i in range(B.shape[0]):
        j = labels[i]
        cnt[j] += 1.0
        qe += mind[i]
        for t in range(d):
            g[j, t] -= np.float64(B[i, t])
    inv = 1.0 / B.shape[0]
    for j in range(k):
        for t in range(d):
            g[j, t] = (cnt[j] * y[j, t] + g[j, t]) * inv
    return qe


@njit(nogil=True, cache=True)
def backward_euler_step(batches, x, gamma, alpha, tol, block, z):
    """One outer step from x: y = z = x; for each batch B: y ← x − γ g_B(y), z ← α z + (1 − α) y.
    Returns the first batch's Σ min_j ||x − x_j||² (at y = x: an estimate of the QE at x, for free).

    batches : IN (imaxit, b, d);  x : IN float64 (k, d);  tol, block : IN ``Prepared``'s for x
    z : OUT float64 (k, d) the next iterate
    """
    y = x.copy()
    g = np.empty_like(x)
    b = batches.shape[1]
    labels = np.empty(b, np.int32)
    mind = np.empty(b)
    z[:] = x
    first = 0.0
    for m in range(batches.shape[0]):
        qe = batch_gradient(batches[m], y, tol, block, labels, mind, g)
        if m == 0:
            first = qe
        for j in range(x.shape[0]):
            for t in range(x.shape[1]):
                y[j, t] = x[j, t] - gamma * g[j, t]
                z[j, t] = alpha * z[j, t] + (1.0 - alpha) * y[j, t]
    return first
