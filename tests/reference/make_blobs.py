"""The benchmark generator ``blobs`` the issues quote their figures on (unit-variance Gaussian blobs around
centres uniform in [-spread, spread]^d, a tenth of the rows uniform background), restated as the oracle for
``dask_clust.datasets.make_blobs``: the same stream."""

import numpy as np


def blobs(n, d, c_true, seed=0, spread=10.0):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-spread, spread, size=(c_true, d))
    lab = rng.integers(0, c_true, size=n)
    x = centers[lab] + rng.standard_normal((n, d))
    bg = rng.random(n) < 0.10
    x[bg] = rng.uniform(-spread - 3, spread + 3, size=(bg.sum(), d))
    lab[bg] = -1
    return x.astype(np.float32), lab
