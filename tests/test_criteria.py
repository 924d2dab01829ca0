"""The partition criteria (``dask_clust.metrics``): scikit-learn's scores of the labels the centres give, a
plain-numpy oracle for the simplified silhouette, weights as repeated rows, and the same bits on any
chunking and worker count."""

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import metrics as skm

from dask_clust import metrics
from dask_clust.errors import InputError, InvalidParameterError
from dask_clust.kernels.assign import Prepared, nearest

HERE = {"client": "in-process"}


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=4, size=(5, 6))
    X = np.concatenate([c + rng.normal(size=(rng.integers(150, 400), 6)) for c in centres])
    return X[rng.permutation(len(X))]


def _centres(X, k, seed, far=0):
    """k rows of X as centres, and ``far`` more no row is nearest to (empty clusters)."""
    rng = np.random.default_rng(seed)
    C = X[rng.choice(len(X), k, replace=False)].astype(np.float64)
    return np.concatenate([C, 1e3 + np.arange(far * X.shape[1], dtype=float).reshape(far, X.shape[1])])


def _labels(X, C):
    return ((X[:, None, :].astype(np.float64) - C[None]) ** 2).sum(-1).argmin(1)


@pytest.mark.parametrize("seed, far", [(0, 0), (1, 2)], ids=["all-held", "two-empty"])
def test_the_criteria_are_scikit_learns_scores_of_the_centres_labels(rows, dtype, seed, far):
    X = rows.astype(dtype)
    C = _centres(X, 7, seed, far)
    labels = _labels(X, C)
    X64 = X.astype(np.float64)
    assert metrics.calinski_harabasz_score(X, C, **HERE) == pytest.approx(
        skm.calinski_harabasz_score(X64, labels), rel=1e-10
    )
    assert metrics.davies_bouldin_score(X, C, **HERE) == pytest.approx(skm.davies_bouldin_score(X64, labels), rel=1e-10)
    assert metrics.silhouette_score(X, C, sample_size=len(X), **HERE) == pytest.approx(
        skm.silhouette_score(X64, labels), rel=1e-10
    )


def test_the_simplified_silhouette_equals_the_plain_numpy_oracle(rows):
    C = _centres(rows, 6, 2)
    d = np.sort(np.sqrt(((rows[:, None, :] - C[None]) ** 2).sum(-1)), axis=1)
    oracle = np.mean((d[:, 1] - d[:, 0]) / np.maximum(d[:, 0], d[:, 1]))
    assert metrics.simplified_silhouette_score(rows, C, **HERE) == pytest.approx(oracle, rel=1e-12)


def test_a_sampled_silhouette_is_scikit_learns_on_the_drawn_rows(rows, monkeypatch):
    from dask_clust.blocks import criteria

    C = _centres(rows, 5, 3)
    drawn = []
    score = criteria.silhouette
    monkeypatch.setattr(criteria, "silhouette", lambda X, labels: drawn.append(X) or score(X, labels))
    value = metrics.silhouette_score(rows, C, sample_size=200, random_state=4, **HERE)
    (sample,) = drawn
    assert sample.shape == (200, rows.shape[1])
    assert len(np.unique(sample, axis=0)) == 200  # without replacement
    assert value == pytest.approx(skm.silhouette_score(sample, _labels(sample, C)), rel=1e-10)


def test_csr_rows_give_the_criteria_of_the_dense_rows(rows):
    """A CSR matrix (distances by the expansion from its non-zeros) gives scikit-learn's scores of its dense
    rows' labels, and the sampled silhouette draws the same rows."""
    rng = np.random.default_rng(11)
    dense = np.where(rng.random(rows.shape) < 0.4, rows, 0.0)
    S = sp.csr_matrix(dense)
    C = _centres(dense, 6, 12)
    labels = _labels(dense, C)
    assert metrics.calinski_harabasz_score(S, C, **HERE) == pytest.approx(
        skm.calinski_harabasz_score(dense, labels), rel=1e-10
    )
    assert metrics.davies_bouldin_score(S, C, **HERE) == pytest.approx(
        skm.davies_bouldin_score(dense, labels), rel=1e-10
    )
    assert metrics.simplified_silhouette_score(S, C, **HERE) == pytest.approx(
        metrics.simplified_silhouette_score(dense, C, **HERE), rel=1e-10
    )
    for size in (len(dense), 300):
        assert metrics.silhouette_score(S, C, sample_size=size, random_state=2, **HERE) == pytest.approx(
            metrics.silhouette_score(dense, C, sample_size=size, random_state=2, **HERE), rel=1e-10
        )


def test_integer_weights_count_as_repeated_rows(rows):
    rng = np.random.default_rng(5)
    w = rng.integers(0, 4, size=len(rows))
    repeated = np.repeat(rows, w, axis=0)
    C = _centres(rows, 6, 6)
    for score in (metrics.calinski_harabasz_score, metrics.davies_bouldin_score, metrics.simplified_silhouette_score):
        assert score(rows, C, sample_weight=w.astype(float), **HERE) == pytest.approx(
            score(repeated, C, **HERE), rel=1e-10
        )


@pytest.mark.parametrize("m", [2, 3, 5])
def test_the_nearest_centres_are_the_models_and_brute_forces(rows, dtype, m):
    """The pass labels every row as ``predict`` does and finds its m nearest as brute force does, near ties
    included: a row equidistant from two centres, three equal centres (every row near them walks its column
    again)."""
    from dask_clust.kernels.criteria import nearest_m

    X = rows.astype(dtype)
    C = _centres(X, 4, 7)
    C = np.concatenate([C, C[2:3], C[2:3]])
    X = np.concatenate([X, ((C[0] + C[1]) / 2)[None].astype(dtype)])
    P = Prepared(C, X.dtype)
    ids, dists = np.empty((len(X), m), np.int32), np.empty((len(X), m))
    nearest_m(X, P.Cd, P.cnorm, P.C, P.tol, P.block, ids, dists)
    want, mind, _ = nearest(X, P)
    np.testing.assert_array_equal(ids[:, 0], want)
    np.testing.assert_array_equal(dists[:, 0], mind)
    exact = ((X[:, None, :].astype(np.float64) - C[None]) ** 2).sum(-1)
    order = np.lexsort((np.broadcast_to(np.arange(len(C)), exact.shape), exact), axis=1)[:, :m]
    np.testing.assert_allclose(dists, np.take_along_axis(exact, order, axis=1), rtol=1e-12)
    ties = np.isclose(np.take_along_axis(exact, order, axis=1), dists, rtol=0, atol=0)
    np.testing.assert_array_equal(ids[ties], order[ties])


def test_the_criteria_do_not_depend_on_the_chunking(rows):
    C = _centres(rows, 6, 8)
    scores = [
        (
            metrics.calinski_harabasz_score(X, C, **HERE),
            metrics.davies_bouldin_score(X, C, **HERE),
            metrics.simplified_silhouette_score(X, C, **HERE),
            metrics.silhouette_score(X, C, sample_size=300, random_state=1, **HERE),
        )
        for X in (rows, da.from_array(rows, chunks=97), da.from_array(rows, chunks=500))
    ]
    assert scores[0] == scores[1] == scores[2]


@pytest.mark.cluster
def test_the_criteria_are_the_same_bits_on_a_cluster(cluster, rows):
    C = _centres(rows, 6, 9)
    X = da.from_array(rows, chunks=200)
    for score in (metrics.calinski_harabasz_score, metrics.davies_bouldin_score, metrics.simplified_silhouette_score):
        assert score(X, C, client=cluster) == score(X, C, **HERE)


def test_a_fitted_model_gives_its_centres(rows):
    import dask_clust

    model = dask_clust.fit(rows, "kmeans", 5, random_state=0, client="in-process")
    assert metrics.calinski_harabasz_score(rows, model, **HERE) == pytest.approx(
        skm.calinski_harabasz_score(rows, model.predict(rows)), rel=1e-10
    )


def test_bad_centres_and_rows_are_refused_in_one_line(rows):
    with pytest.raises(InputError, match="at least 2 centres"):
        metrics.calinski_harabasz_score(rows, rows[:1], **HERE)
    with pytest.raises(InputError, match=r"shape \(k, 6\)"):
        metrics.davies_bouldin_score(rows, rows[:3, :4], **HERE)
    with pytest.raises(InputError, match="weighted rows"):
        from dask_clust.blocks import criteria
        from dask_clust.engine import as_source, open_engine

        with open_engine(as_source(rows, np.ones(len(rows))), "in-process") as engine:
            criteria.silhouette_sample(engine, 10, 0)
    with pytest.raises(InvalidParameterError, match="sample_size"):
        metrics.silhouette_score(rows, rows[:3], sample_size=1, **HERE)
    with pytest.raises(InputError, match="1 cluster"):
        metrics.calinski_harabasz_score(rows, np.stack([rows.mean(0), rows.mean(0) + 1e6]), **HERE)


@pytest.mark.cluster
def test_a_worker_lost_between_the_two_passes_gives_the_undisturbed_index(three_workers, lost, rows, monkeypatch):
    """Davies–Bouldin's second pass reads each row's label from its chunk's state: a partition rebuilt
    before it labels its rows again from the centres, to the same bits."""
    import os
    import signal

    from dask_clust.engine import Engine
    from tests.engine_support import worker_pids

    C = _centres(rows, 6, 10)
    X = da.from_array(rows, chunks=200)
    calm = metrics.davies_bouldin_score(X, C, client=three_workers)
    victim = sorted(worker_pids(three_workers).values())[1]
    reduce = Engine.reduce

    def killing(self, fn, *args, **kwargs):
        if getattr(fn, "__name__", "") == "_spreads_step" and not lost:
            os.kill(victim, signal.SIGKILL)
        return reduce(self, fn, *args, **kwargs)

    monkeypatch.setattr(Engine, "reduce", killing)
    assert metrics.davies_bouldin_score(X, C, client=three_workers) == calm
    assert lost
