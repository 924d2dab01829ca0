"""The registry knows its algorithms: a new one is a module that registers itself, nothing more. A toy
k-medoids-like algorithm (below, written against the engine's verbs only) is registered here and fitted
through ``dask_clust.fit``, saved, loaded and refused on bad data like the real ones; its medoids are checked
against brute force. The spec's declared facts are enforced before any work."""

import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

import dask_clust
from dask_clust._params import Interval
from dask_clust._random import stream
from dask_clust.algorithms import REGISTRY, AlgorithmSpec, finish, register
from dask_clust.engine.combine import ArgMin
from dask_clust.errors import InputError


# -- the toy algorithm: a module's worth (config, two steps, a fit, its spec) ------------------------------
@dataclass
class ToyConfig:
    n_clusters: int = 3
    rounds: int = 20
    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "rounds": [Interval(numbers.Integral, 1, None)],
    }


def _nearest(chunk, centers):
    d = ((chunk.x[:, None, :].astype(np.float64) - centers[None]) ** 2).sum(-1)
    return d.argmin(1), d.min(1)


def means_step(chunk, centers):
    label, d = _nearest(chunk, centers)
    k = len(centers)
    sums = np.zeros_like(centers)
    np.add.at(sums, label, chunk.x * chunk.w[:, None])
    return sums, np.bincount(label, chunk.w, k), float(np.dot(chunk.w, d))


def medoid_step(chunk, means):
    """Per cluster, the row nearest its mean (ties to the lower row id): one ArgMin field (distances, ids, rows)."""
    d = ((chunk.x[:, None, :].astype(np.float64) - means[None]) ** 2).sum(-1)
    best = d.argmin(0)
    return ((d[best, np.arange(len(means))], chunk.start + best, chunk.x[best].astype(np.float64)),)


def toy_fit(engine, cfg, entropy, loop):
    ids = np.sort(stream(entropy, "toy", "seed").choice(engine.n_samples, cfg.n_clusters, replace=False))
    centers = engine.take(ids).astype(np.float64)
    evals = 0
    for _ in loop:
        sums, counts, cost = engine.reduce(means_step, centers)
        means = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1e-300)[:, None], centers)
        _, _, new = engine.reduce(medoid_step, means, combine=(ArgMin(),))[0]
        evals += 2 * engine.n_samples * cfg.n_clusters
        loop.record(cost, 2 * engine.n_samples * cfg.n_clusters)
        loop.converged = bool(np.array_equal(new, centers))
        centers = new
    return finish(engine, centers, loop, evals, {})


def toy_check_data(cfg, source):
    if source.n_features > 64:
        raise InputError(f"algo='toy-medoids' takes at most 64 features; got {source.n_features}")


TOY = AlgorithmSpec(
    name="toy-medoids",
    config=ToyConfig,
    fit=toy_fit,
    estimator="ToyMedoids",
    summary="k-medoids-like toy",
    reference="none",
    objective="QE of the assignment",
    loop_length="rounds",
    check_data=toy_check_data,
    weighted=False,
    unweighted_because="the toy ignores weights",
)
# -- end of the toy ------------------------------------------------------------------------------------


@pytest.fixture
def toy():
    register(TOY)
    try:
        yield TOY
    finally:  # other tests of this process iterate over the registry
        REGISTRY.pop(TOY.name, None)


def brute_medoids(X, centers, rounds):
    c = centers.astype(np.float64)
    for _ in range(rounds):
        label = ((X[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
        means = np.array([X[label == j].mean(0) if (label == j).any() else c[j] for j in range(len(c))])
        new = X[((X[:, None, :] - means[None]) ** 2).sum(-1).argmin(0)].astype(np.float64)
        if np.array_equal(new, c):
            break
        c = new
    return c


def test_a_registered_toy_fits_saves_and_loads_through_the_generic_paths(toy, tmp_path):
    X = np.random.default_rng(0).standard_normal((600, 3)) + np.repeat(np.eye(3) * 6, 200, axis=0)
    model = dask_clust.fit(X, algo="toy-medoids", n_clusters=3, random_state=1, client="in-process")
    seed = np.sort(stream(1, "toy", "seed").choice(600, 3, replace=False))
    np.testing.assert_array_equal(model.cluster_centers_, brute_medoids(X, X[seed], 20))
    assert all((X == c).all(1).any() for c in model.cluster_centers_)  # medoids are rows
    assert model.converged_ and 1 <= model.n_iter_ <= 20
    np.testing.assert_array_equal(model.predict(X), ((X[:, None] - model.cluster_centers_) ** 2).sum(-1).argmin(1))
    model.save(tmp_path / "m")
    np.testing.assert_array_equal(dask_clust.load(tmp_path / "m").cluster_centers_, model.cluster_centers_)


def test_the_toys_declared_facts_refuse_bad_data_before_any_work(toy):
    with pytest.raises(InputError, match=r"algo='toy-medoids' does not take sample_weight: the toy ignores"):
        dask_clust.fit(np.ones((10, 2)), algo="toy-medoids", sample_weight=np.ones(10), client="in-process")
    with pytest.raises(InputError, match=r"at most 64 features; got 65"):
        dask_clust.fit(np.ones((10, 65)), algo="toy-medoids", client="in-process")


@pytest.mark.parametrize(
    "wrong,message",
    [({"loop_length": "rounds", "weighted": False}, "say why"), ({"loop_length": "max_iter"}, "not a config field")],
)
def test_a_spec_is_checked_when_it_is_made(wrong, message):
    base = dict(name="x", config=ToyConfig, fit=toy_fit, estimator="X", summary="", reference="", objective="")
    with pytest.raises(ValueError, match=message):
        AlgorithmSpec(**base, **wrong)
