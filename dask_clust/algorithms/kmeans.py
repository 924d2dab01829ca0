"""Lloyd k-means (``algo="kmeans"``): seed (``seeding``), then Lloyd iterations (``lloyd``) to
convergence. The baseline users compare with, and the building block of the other algorithms.
``metric="cosine"``: spherical k-means (rows and centres on the unit sphere, each row to the centre of
largest inner product, each centre its cluster's mean direction).

S. P. Lloyd, "Least squares quantization in PCM", IEEE Trans. Inf. Theory 28(2), 1982,
doi:10.1109/TIT.1982.1056489; I. S. Dhillon and D. S. Modha, "Concept decompositions for large sparse text
data using clustering", Machine Learning 42, 2001, doi:10.1023/A:1007612920971. The steps are in
``dask_clust/blocks/lloyd.py``.
"""

import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._params import COMMON_DOCS, FiniteArray, Interval, NoneOK, Options
from ..blocks.coreset import working_set
from ..blocks.lloyd import LLOYD_ROW_BYTES, lloyd, to_sphere
from ..blocks.seeding import AUTO, ROW_BYTES, SEEDERS, seed
from .registry import BIG, COUNT, METRIC, METRICS, AlgorithmSpec, centres, final_pass, register, spherical


@dataclass
class KMeansConfig:
    n_clusters: int = 8
    init: object = "auto"
    max_iter: int = 300
    tol: float = 1e-4
    oversampling_factor: float = 2.0
    init_max_iter: int = 30
    n_local_trials: int | None = None
    chain_length: int = 20
    coreset_size: int | None = None
    metric: str = "euclidean"

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "init": [Options((AUTO,) + SEEDERS), FiniteArray()],
        "max_iter": [Interval(numbers.Integral, 1, None)],
        "tol": [Interval(numbers.Real, 0, None, "left")],
        "oversampling_factor": [Interval(numbers.Real, 0, None, "neither")],
        "init_max_iter": [Interval(numbers.Integral, 1, None)],
        "n_local_trials": [Interval(numbers.Integral, 1, None), NoneOK()],
        "chain_length": [Interval(numbers.Integral, 1, None)],
        "coreset_size": [Interval(numbers.Integral, 1, None), NoneOK()],
        "metric": [Options(METRICS)],
    }

    docs: ClassVar = {
        "init": f"{COMMON_DOCS['init']} 'auto': 'k-means||', or 'k-means++' on sparse (CSR) rows, whose "
        "k-means|| seeds ended 3-4 % worse on TF-IDF documents.",
        "tol": "Stop when the centres' total squared shift is at most tol times the mean feature variance "
        "(scikit-learn's rule).",
        "coreset_size": "Rows of a lightweight coreset (Bachem et al., KDD 2018) to seed and iterate on (the "
        "vc-GMM paper's LWCS baseline); None uses all rows. objective_ is the QE over all rows.",
        "metric": METRIC,
    }


def fit(engine, cfg, entropy, loop):
    """Seed, then Lloyd to convergence; with ``coreset_size`` both run on a lightweight coreset (the
    vc-GMM paper's LWCS baseline) and one exact pass gives the QE on all rows. Resumable: a checkpoint
    holds the centres, the counters and every row's label (4 bytes a row, written where the rows live).
    ``metric="cosine"``: the engine holds the rows on the unit sphere (``api.fit``), the seeds are put on it
    and Lloyd's M-step keeps them there; every objective is Σ w (1 − cos), half the QE of unit vectors."""
    unit = spherical(cfg)
    with working_set(engine, cfg.coreset_size, entropy, cfg.n_clusters) as work:
        if loop.restored is None:
            centers, seed_evals = seed(
                work,
                cfg.n_clusters,
                cfg.init,
                entropy,
                n_local_trials=cfg.n_local_trials,
                oversampling_factor=cfg.oversampling_factor,
                init_max_iter=cfg.init_max_iter,
                chain_length=cfg.chain_length,
            )
            centers = to_sphere(centers) if unit else centers
        else:  # a resumed fit: the centres come from the checkpoint
            centers, seed_evals = None, loop.restored["seed_evals"]
        loop.keep(seed_evals=int(seed_evals))
        tol = cfg.tol * float(np.mean(work.summary.var))
        result = lloyd(work, centers, max_iter=cfg.max_iter, tol=tol, loop=loop, unit=unit)
    result.distance_evals += seed_evals
    result.extras = {"seeding_distance_evals": int(seed_evals)}
    if cfg.coreset_size is not None:
        coreset_qe = result.objective
        result.objective, qe_evals = final_pass(engine, result.centers, unit=unit, loop=loop)
        result.distance_evals += qe_evals
        result.extras.update(coreset_size_=cfg.coreset_size, coreset_objective=coreset_qe)
    return result


def saved(cfg, n_samples, n_features):
    """What a kmeans checkpoint holds: Lloyd's state (``blocks/lloyd.py``) and the seeding's evaluations."""
    return {
        "centers": centres(cfg, n_features),
        "moves": ("floats", (cfg.n_clusters,)),
        "drift": ("floats", (cfg.n_clusters,)),
        "far": ("float", 0.0, BIG, False),
        "evals": COUNT,
        "objective": ("float", 0.0, BIG, True),
        "strict": ("bool",),
        "seed_evals": COUNT,
    }


register(
    AlgorithmSpec(
        name="kmeans",
        config=KMeansConfig,
        fit=fit,
        estimator="KMeans",
        summary="Lloyd k-means with k-means||, greedy k-means++, AFK-MC2 or random seeding; sample weights",
        reference="Lloyd 1982, doi:10.1109/TIT.1982.1056489",
        objective="QE of the iteration's assignment, Σ w ||x − c_label||², before the centres move (with "
        "metric='cosine', Σ w (1 − cos))",
        # the seeder's state, then Lloyd's; on a coreset both are the working set's, none of the input rows'
        state_bytes=lambda cfg: 0 if cfg.coreset_size else max(ROW_BYTES, LLOYD_ROW_BYTES),
        state_files=True,
        resumable=True,
        saved=saved,
        sparse=True,
    )
)
