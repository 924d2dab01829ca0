"""Stochastic backward Euler for k-means (ALGORITHMS.md §4): one implicit step x ← z, where z averages
the iterates of a stochastic fixed-point iteration y = x − γ g_B(y) over mini-batches B."""
import numpy as np
from numba import njit

from .distance import sqdist


@njit(nogil=True, cache=True)
def batch_gradient(B, y, g):
    """g ← the mini-batch gradient of f = QE/(2N) at the centres y: rows of B go to their nearest centre of
    y (lowest index on ties), g_j = (cnt_j y_j − Σ_{a_i = j} x_i)/|B|; a centre without rows gets 0.

    B : IN (b, d) the batch;  y : IN float64 (k, d);  g : OUT float64 (k, d)
    """
    k, d = y.shape
    cnt = np.zeros(k)
    g[:] = 0.0
    for i in range(B.shape[0]):
        j = 0
        best = np.inf
        for c in range(k):
            v = sqdist(B, i, y, c)
            if v < best:
                best = v
                j = c
        cnt[j] += 1.0
        for t in range(d):
            g[j, t] -= np.float64(B[i, t])
    inv = 1.0 / B.shape[0]
    for j in range(k):
        for t in range(d):
            g[j, t] = (cnt[j] * y[j, t] + g[j, t]) * inv


@njit(nogil=True, cache=True)
def backward_euler_step(batches, x, gamma, alpha, z):
    """One outer step from x: y = z = x; for each batch B: y ← x − γ g_B(y), z ← α z + (1 − α) y.

    batches : IN (imaxit, b, d);  x : IN float64 (k, d);  z : OUT float64 (k, d) the next iterate
    """
    y = x.copy()
    g = np.empty_like(x)
    z[:] = x
    for m in range(batches.shape[0]):
        batch_gradient(batches[m], y, g)
        for j in range(x.shape[0]):
            for t in range(x.shape[1]):
                y[j, t] = x[j, t] - gamma * g[j, t]
                z[j, t] = alpha * z[j, t] + (1.0 - alpha) * y[j, t]
