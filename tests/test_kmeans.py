"""Lloyd k-means against the plain-numpy reference, scikit-learn and hand-worked toys."""

import math

import numpy as np
import pytest

import dask_clust
from dask_clust.blocks.seeding import seed
from dask_clust.engine import as_source, open_engine
from tests.conftest import rtol_for
from tests.reference import lloyd as ref

TOY = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0]])


def test_hand_worked_toy():
    # iteration 1 moves both centres to the pairs' midpoints; iteration 2 changes no label
    m = dask_clust.fit(TOY, n_clusters=2, init=np.array([[0.0, 0.0], [10.0, 0.0]]))
    np.testing.assert_array_equal(m.cluster_centers_, [[0.0, 0.5], [10.0, 0.5]])
    assert m.objective_ == 1.0 and m.n_iter_ == 2 and m.converged_
    assert [h["changed"] for h in m.history_] == [4, 0]
    np.testing.assert_array_equal(m.predict(TOY).compute(), [0, 0, 1, 1])


def test_hand_worked_weighted_toy():
    # weights 1,3 on the left pair: centre (0, 0.75); QE = 0.75² + 3·0.25² + 2·0.5² = 1.25
    m = dask_clust.fit(TOY, n_clusters=2, init=np.array([[0.0, 0.0], [10.0, 0.0]]), sample_weight=[1.0, 3.0, 1.0, 1.0])
    np.testing.assert_allclose(m.cluster_centers_, [[0.0, 0.75], [10.0, 0.5]], rtol=0, atol=1e-15)
    assert m.objective_ == pytest.approx(1.25, rel=1e-15)
    assert m.score(TOY, sample_weight=[1.0, 3.0, 1.0, 1.0]) == pytest.approx(-1.25, rel=1e-15)


@pytest.mark.parametrize("max_iter", [1, 300])
def test_matches_reference(small_blobs, dtype, max_iter):
    X, _ = small_blobs
    X = X.astype(dtype)
    init = X[[0, 5, 10, 500, 1000, 2000]].astype(np.float64)
    w = np.random.default_rng(3).random(len(X)) + 0.5
    m = dask_clust.fit(X, n_clusters=6, init=init, max_iter=max_iter, sample_weight=w)
    C, labels, qe, n_iter, _ = ref.lloyd(X, init, sample_weight=w, max_iter=max_iter)
    np.testing.assert_allclose(m.cluster_centers_, C, rtol=1e-10, atol=1e-10)
    assert m.n_iter_ == n_iter
    assert m.objective_ == pytest.approx(qe, rel=1e-10)
    np.testing.assert_array_equal(m.predict(X).compute(), labels)
    assert m.engine_["chunks"] > 1
    if n_iter > 2:  # steps after the first measured most rows against their own centre alone (Hamerly's test)
        assert m.history_[-1]["distance_evals"] < 0.5 * len(X) * 6


@pytest.mark.parametrize("far_start", [False, True])
def test_lazy_bounds_label_every_row_as_the_eager_step(monkeypatch, far_start):
    """Lloyd over lazily kept bounds (``kernels/lazy.py``, the choice at small k·d) labels every row as the
    eager step does: the same changes in every iteration and the same relocations (``far_start``: two centres
    no row picks), so the same iterations, and centres and objective equal within rounding (its sums are
    exact, the eager step's rounded per chunk first); after the first step it measures fewer distances."""
    from dask_clust.blocks import lloyd
    from dask_clust.datasets import make_blobs

    X = np.asarray(make_blobs(40_000, 8, 12, random_state=2)[0])
    init = X[:12].astype(np.float64)
    if far_start:
        init[-2:] = [[1e4] * 8, [2e4] * 8]
    fit = lambda: dask_clust.fit(X, n_clusters=12, init=init, tol=0, max_iter=40, client="in-process")  # noqa: E731
    lazy = fit()
    monkeypatch.setattr(lloyd, "LAZY_VALUES", 0)
    eager = fit()
    for key in ("changed", "relocated"):
        assert [h[key] for h in lazy.history_] == [h[key] for h in eager.history_]
    assert lazy.history_[0]["relocated"] == 2 * far_start and lazy.n_iter_ == eager.n_iter_ > 5
    np.testing.assert_allclose(lazy.cluster_centers_, eager.cluster_centers_, rtol=1e-12)
    assert lazy.objective_ == pytest.approx(eager.objective_, rel=1e-12)
    np.testing.assert_allclose(
        [h["objective"] for h in lazy.history_], [h["objective"] for h in eager.history_], rtol=1e-11
    )
    evals = [sum(h["distance_evals"] for h in m.history_[1:]) for m in (lazy, eager)]
    assert evals[0] < 0.9 * evals[1], evals  # (a kept row costs the eager step one evaluation)


def test_empty_cluster_relocation_matches_reference(small_blobs):
    X, _ = small_blobs
    init = np.vstack([X[:4].astype(np.float64), [[1e4] * 4, [2e4] * 4]])  # two centres nobody picks
    m = dask_clust.fit(X, n_clusters=6, init=init)
    C, labels, qe, n_iter, reloc = ref.lloyd(X, init)
    assert m.history_[0]["relocated"] == reloc[0] == 2
    np.testing.assert_allclose(m.cluster_centers_, C, rtol=1e-10)
    assert len(np.unique(m.predict(X).compute())) == 6


def test_same_as_scikit_learn_from_same_init(small_blobs, dtype):
    from sklearn.cluster import KMeans

    X, _ = small_blobs
    X = X.astype(dtype)
    init = X[[1, 2, 3, 4, 5, 6]]
    sk = KMeans(6, init=init, n_init=1, algorithm="lloyd").fit(X)
    m = dask_clust.fit(X, n_clusters=6, init=init.astype(np.float64))
    np.testing.assert_allclose(m.cluster_centers_, sk.cluster_centers_, rtol=rtol_for(dtype) * 10, atol=1e-4)
    assert m.n_iter_ == sk.n_iter_
    assert m.objective_ == pytest.approx(sk.inertia_, rel=rtol_for(dtype) * 10)


@pytest.mark.parametrize("init", ["k-means||", "k-means++"])
def test_quality_close_to_scikit_learn(init):
    from sklearn.cluster import KMeans

    from tests.reference.make_blobs import blobs

    X, _ = blobs(20_000, 8, 30, seed=2)
    # 10 seeds: the standard error of either mean is about 1.3 %, so 3 % is a real margin
    ours = np.mean([dask_clust.fit(X, n_clusters=30, init=init, random_state=s).objective_ for s in range(10)])
    sk = np.mean([KMeans(30, init="k-means++", n_init=1, random_state=s).fit(X).inertia_ for s in range(10)])
    assert ours <= 1.03 * sk, (ours, sk)


@pytest.mark.parametrize("init", ["k-means++", "k-means||", "afkmc2", "random"])
def test_seeders_pick_distinct_rows_reproducibly(small_blobs, init):
    X, _ = small_blobs
    with open_engine(as_source(X), "in-process", 7) as eng:
        C1, _ = seed(eng, 6, init, 7)
    with open_engine(as_source(X), "in-process", 7) as eng:
        C2, _ = seed(eng, 6, init, 7)
    np.testing.assert_array_equal(C1, C2)
    assert len(np.unique(C1, axis=0)) == 6
    if init != "k-means||":  # k-means|| returns reclustered means, the others return rows
        rows = {tuple(r) for r in X.astype(np.float64)}
        assert all(tuple(c) in rows for c in C1)


def test_kmeans_plusplus_seeding_potential_like_scikit_learn():
    from sklearn.cluster import kmeans_plusplus

    from tests.reference.make_blobs import blobs

    X, _ = blobs(5000, 4, 20, seed=4)
    ours, theirs = [], []
    for s in range(10):
        with open_engine(as_source(X), "in-process", s) as eng:
            C, _ = seed(eng, 20, "k-means++", s)
        ours.append(ref.assign(X, C)[1].sum())
        C2, _ = kmeans_plusplus(X, 20, random_state=s)
        theirs.append(ref.assign(X, C2)[1].sum())
    # the same distribution (greedy k-means++ with 2 + ln k trials): the means of 10 seeds differ by less
    # than 4 standard errors of their difference (measured over 40 seeds: within 1.3 SE, one SE ≈ 2.2 %)
    se = math.sqrt(np.var(ours, ddof=1) / len(ours) + np.var(theirs, ddof=1) / len(theirs))
    assert abs(np.mean(ours) - np.mean(theirs)) <= 4 * se, (np.mean(ours), np.mean(theirs), se)


def test_result_independent_of_chunking_given_init(small_blobs):
    import dask.array as da

    X, _ = small_blobs
    init = X[:6].astype(np.float64)
    a = dask_clust.fit(X, n_clusters=6, init=init)
    b = dask_clust.fit(da.from_array(X, chunks=(211, 4)), n_clusters=6, init=init, client="in-process")
    np.testing.assert_allclose(a.cluster_centers_, b.cluster_centers_, rtol=1e-12)
    assert a.n_iter_ == b.n_iter_


def test_estimator_conventions(small_blobs):
    X, _ = small_blobs
    est = dask_clust.KMeans(6, random_state=0, tol=1e-6)
    assert est.get_params()["n_clusters"] == 6 and est.get_params()["tol"] == 1e-6
    assert est.fit(X) is est
    assert est.cluster_centers_.shape == (6, 4)
    labels = est.labels_
    assert isinstance(labels, np.ndarray) and labels.dtype == np.int32  # numpy in, numpy out
    np.testing.assert_array_equal(labels, est.predict(X))
    assert est.inertia_ == pytest.approx(-est.score(X), rel=1e-9)
    assert est.transform(X).shape == (3000, 6)
    clone = type(est)(**est.get_params())
    assert clone.get_params() == est.get_params()
    assert repr(est) == "KMeans(n_clusters=6, random_state=0, tol=1e-06)"  # scikit-learn: changed params, sorted
    from sklearn.base import clone as sk_clone

    assert sk_clone(est).get_params() == est.get_params()


def test_transform_is_euclidean_distance(small_blobs):
    X, _ = small_blobs
    m = dask_clust.fit(X, n_clusters=3, random_state=0)
    np.testing.assert_allclose(m.transform(X).compute(), np.sqrt(ref.sqdist(X, m.cluster_centers_)), rtol=1e-12)


def test_callback_history_and_stop():
    from tests.reference.make_blobs import blobs

    X, _ = blobs(2000, 3, 5, seed=0)
    seen = []

    def cb(rec):
        seen.append(rec)
        if rec["iteration"] == 2:
            raise dask_clust.StopFit

    m = dask_clust.fit(X, n_clusters=5, init="random", random_state=1, callback=cb, tol=0)
    assert m.n_iter_ == 2 and not m.converged_ and len(seen) == 2
    assert set(m.history_[0]) >= {"iteration", "objective", "wall_s", "distance_evals", "changed"}
    assert m.history_[1]["objective"] <= m.history_[0]["objective"]
    # the callback sees each iteration's centres: the QE of those after iteration 1 is iteration 2's objective
    d2 = ((X[:, None, :].astype(np.float64) - seen[0]["centers"][None]) ** 2).sum(-1).min(1)
    assert d2.sum() == pytest.approx(seen[1]["objective"], rel=1e-9)
    assert "centers" not in m.history_[0]
