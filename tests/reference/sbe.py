"""Plain-numpy stochastic backward Euler (Yin, Pham, Oberman, Osher 2018, its lost formulas restated as
algorithms/sbe.py gives them): the oracle of tests/test_sbe.py. ``batches[o]`` is outer step o's (imaxit, b)
row ids."""

import numpy as np


def grad(B, y):
    d2 = ((B[:, None, :] - y[None]) ** 2).sum(-1)
    a = d2.argmin(1)
    g = np.zeros_like(y)
    for j in range(len(y)):
        members = B[a == j]
        g[j] = (len(members) * y[j] - members.sum(0)) / len(B)
    return g


def sbe(X, x0, batches, step_size, alpha=0.75, decay=0.95):
    X = X.astype(np.float64)
    x = np.array(x0, dtype=np.float64)
    gamma = step_size * len(x)
    for ids in batches:
        y = x.copy()
        z = x.copy()
        for inner in ids:
            y = x - gamma * grad(X[inner], y)
            z = alpha * z + (1 - alpha) * y
        x = z
        gamma *= decay
    return x
