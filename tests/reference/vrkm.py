"""Plain-numpy sequential VRKM++ (Zhao et al. 2018, Alg. 4, with the pull-back of a row's anchor centre that
kernels/variance_reduced.py states) and VRKM (Alg. 3: plus the batch gradient over the anchor partition,
computed by scanning it): the oracle of tests/test_vrkm.py. ``draws(epoch)`` gives the epoch's sampled row
indices."""

import numpy as np


def _nearest(x, C):
    return int(np.argmin(((x[None, :] - C) ** 2).sum(1)))


def vrkm(X, centers, eta, draws, epochs, variant="vrkm++"):
    """Returns (final centres, QE of every epoch's anchor pass)."""
    X = X.astype(np.float64)
    C = np.array(centers, dtype=np.float64)
    qes = []
    for epoch in range(epochs):
        d2 = ((X[:, None, :] - C[None]) ** 2).sum(-1)
        anchor = d2.argmin(1)
        qes.append(d2.min(1).sum())
        A = C.copy()
        for j in range(len(C)):
            if np.any(anchor == j):
                A[j] = X[anchor == j].mean(0)
        grad = np.zeros_like(A)
        if variant == "vrkm":
            for j in range(len(C)):
                members = X[anchor == j]
                if len(members):
                    grad[j] = (A[j] - members).sum(0) / len(members)
        C = A.copy()
        for i in draws(epoch):
            x = X[i]
            j, a = _nearest(x, C), anchor[i]
            step = np.zeros_like(C)
            if j == a:
                step[j] = C[j] - A[j]
            else:
                step[j] = C[j] - x
                step[a] = -(A[a] - x)
            C = C - eta * (step + grad)
    return C, qes
