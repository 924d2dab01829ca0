"""The estimators are scikit-learn estimators: scikit-learn's own estimator checks, a Pipeline, model
selection, and results that follow the input's kind (numpy in, numpy out; dask in, dask out)."""

import pickle
import warnings

import dask.array as da
import numpy as np
import pandas as pd
import pytest
from scipy import sparse
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import dask_clust
from dask_clust.estimators import ESTIMATORS
from tests.reference import lloyd as ref
from tests.reference import nmbatch as ref_nmbatch
from tests.reference.make_blobs import blobs

# Checks that cannot apply, with the reason (the same list scikit-learn keeps for its own KMeans)
WEIGHT_IS_NOT_REPEAT = (
    "the seeding draws rows with probability proportional to their weight: a row repeated twice is two draws, a "
    "row of weight 2 is one, so the random streams (and the model) differ"
)
EXPECTED_FAILURES = {
    "check_sample_weight_equivalence_on_dense_data": WEIGHT_IS_NOT_REPEAT,
    "check_sample_weight_equivalence_on_sparse_data": WEIGHT_IS_NOT_REPEAT,  # (estimators taking sparse rows)
}


# scikit-learn's sparse checks read predict_proba's shape from a classifier's tags, which a clusterer has not
# (None: AttributeError); fit, predict and predict_proba of the mixtures on CSR rows: tests/test_sparse.py
PROBA_IS_A_CLASSIFIERS = "scikit-learn's check reads predict_proba's shape from classifier tags a clusterer has not"


def _expected(estimator):
    # GaussianMixture's checks run with n_components=1: no seeding draws, so a weight is a repeat there
    weighted = "sample_weight" in estimator.fit.__code__.co_varnames
    expected = dict(EXPECTED_FAILURES) if weighted and not isinstance(estimator, dask_clust.GaussianMixture) else {}
    if hasattr(estimator, "predict_proba") and estimator.__sklearn_tags__().input_tags.sparse:
        sparse_checks = ("check_estimator_sparse_array", "check_estimator_sparse_matrix")
        expected.update(dict.fromkeys(sparse_checks, PROBA_IS_A_CLASSIFIERS))
    return expected


@parametrize_with_checks([cls(random_state=0) for cls in ESTIMATORS.values()], expected_failed_checks=_expected)
def test_scikit_learn_estimator_checks(estimator, check):
    if check.func.__name__ == "check_array_api_input":
        # runs only for estimators that declare array-API support; ours take numpy, dask and pandas
        assert not estimator.__sklearn_tags__().array_api_support
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check(estimator)


def test_pipeline_and_cross_val_score():
    X, _ = blobs(1200, 4, 5, seed=3)
    pipe = Pipeline([("scale", StandardScaler()), ("km", dask_clust.KMeans(5, random_state=0))])
    labels = pipe.fit(X).predict(X)
    assert isinstance(labels, np.ndarray) and labels.shape == (1200,)
    scaled = StandardScaler().fit_transform(X)
    np.testing.assert_array_equal(labels, dask_clust.fit(scaled, n_clusters=5, random_state=0).predict(scaled))
    scores = cross_val_score(pipe, X, cv=3)
    assert scores.shape == (3,) and np.all(scores < 0)  # score is −QE of the held-out rows


def test_results_follow_the_input_kind():
    X, _ = blobs(2000, 3, 4, seed=4)
    est = dask_clust.KMeans(4, random_state=0).fit(X)
    for out in (est.labels_, est.predict(X), est.transform(X), est.fit_predict(X)):
        assert isinstance(out, np.ndarray)
    Xd = da.from_array(X, chunks=500)
    lazy = est.predict(Xd)
    assert isinstance(lazy, da.Array) and not np.isnan(lazy.shape[0])
    np.testing.assert_array_equal(lazy.compute(), est.labels_)
    on_dask = dask_clust.KMeans(4, random_state=0).fit(Xd, client="in-process")
    assert isinstance(on_dask.labels_, da.Array)
    np.testing.assert_array_equal(on_dask.labels_.compute(), on_dask.predict(X))


@pytest.mark.cluster
def test_labels_are_computed_when_fit_returns(cluster):
    from distributed import futures_of

    X, _ = blobs(4000, 3, 4, seed=4)
    with cluster.as_current():  # persist then runs on the cluster and returns before the labels exist
        est = dask_clust.KMeans(4, random_state=0).fit(da.from_array(X, chunks=500), client=cluster)
        futures = futures_of(est.labels_)
        assert futures and all(f.status == "finished" for f in futures)
        np.testing.assert_array_equal(est.labels_.compute(), ref.assign(X, est.cluster_centers_)[0])


def test_n_init_keeps_the_best_of_n_separate_fits():
    X, _ = blobs(3000, 4, 12, seed=5)
    seeds = np.random.SeedSequence(0).generate_state(5, np.uint64)
    fits = [dask_clust.fit(X, "kmeans", 8, random_state=int(s), client="in-process") for s in seeds]
    assert len({m.objective_ for m in fits}) > 1  # the seeds lead to different optima: there is a best
    best = min(fits, key=lambda m: m.objective_)
    est = dask_clust.KMeans(8, n_init=5, random_state=0).fit(X)
    np.testing.assert_array_equal(est.cluster_centers_, best.cluster_centers_)
    assert est.inertia_ == best.objective_ == min(m.objective_ for m in fits)
    np.testing.assert_array_equal(est.labels_, ref.assign(X, best.cluster_centers_)[0])
    with pytest.raises(dask_clust.InvalidParameterError, match=r"n_init must be an int >= 1; got 0"):
        dask_clust.KMeans(8, n_init=0).fit(X)
    with pytest.warns(RuntimeWarning, match=r"n_init=3 with explicit initial centres"):
        once = dask_clust.KMeans(3, init=X[:3].astype(np.float64), n_init=3).fit(X)
    np.testing.assert_allclose(once.cluster_centers_, ref.lloyd(X, X[:3])[0], rtol=1e-10)


def test_partial_fit_is_sculleys_update_with_the_counts_carried():
    """Twelve batches of 250 rows, each against the plain-numpy reference from the state the last one left
    (the counts, the rows since the last reassignment check); ratio 0.2 makes the reassignment run."""
    from dask_clust._random import check_random_state, stream

    X, _ = blobs(3000, 4, 6, seed=7)
    C, v, since = X[:6].astype(np.float64), None, 0
    est = dask_clust.MiniBatchKMeans(6, init=C.copy(), reassignment_ratio=0.2, random_state=3)
    picks = lambda step: stream(check_random_state(3), "minibatch", "reassign", "partial", step)  # noqa: E731
    for step, b in enumerate(range(0, len(X), 250)):
        batch = X[b : b + 250]
        est.partial_fit(batch)
        C, v, since = ref_nmbatch.minibatch(batch, C, [np.arange(len(batch))], 0.2, lambda _: picks(step), v, since)
        np.testing.assert_allclose(est.cluster_centers_, C, rtol=1e-10)
        np.testing.assert_array_equal(est.counts_, v)
    assert est.n_steps_ == 12
    np.testing.assert_array_equal(est.predict(X), ref.assign(X, C)[0])
    with pytest.raises(ValueError, match=r"X has 3 features, but MiniBatchKMeans is expecting 4"):
        est.partial_fit(X[:10, :3])


def test_partial_fit_over_a_stream_ends_near_one_fit_of_its_rows():
    X, _ = blobs(6000, 4, 6, seed=7)
    rows = np.random.default_rng(0).permutation(len(X))  # a stream in no particular order
    stream = dask_clust.MiniBatchKMeans(6, random_state=0)
    for b in range(0, len(X), 500):
        stream.partial_fit(X[rows[b : b + 500]])
    whole = dask_clust.MiniBatchKMeans(6, random_state=0).fit(X)
    qe = [ref.assign(X, est.cluster_centers_)[1].sum() for est in (stream, whole)]
    assert qe[0] <= 1.01 * qe[1], qe
    # fit then partial_fit: the stream continues from the fit's centres and counts
    n = whole.counts_.sum()
    whole.partial_fit(X[:500])
    assert whole.counts_.sum() == n + 500 and whole.n_steps_ == whole.n_iter_ + 1


def test_unfitted_and_probabilistic_only():
    X, _ = blobs(300, 2, 3, seed=5)
    with pytest.raises(NotFittedError, match="is not fitted yet"):
        dask_clust.KMeans(3).predict(X)
    assert not hasattr(dask_clust.KMeans(3), "predict_proba")
    est = dask_clust.VCGMM(3, random_state=0).fit(X)
    P = est.predict_proba(X)  # scikit-learn's (n_samples, n_clusters), sparse: n·C' non-zeros
    assert sparse.issparse(P) and P.shape == (300, 3)
    np.testing.assert_allclose(np.asarray(P.sum(1)).ravel(), 1.0, rtol=1e-12)
    dense = est.predict_proba(X, output="dense")
    assert isinstance(dense, np.ndarray)
    np.testing.assert_array_equal(dense, P.toarray())
    ids, p = est.predict_proba(X, output="truncated")
    assert isinstance(ids, np.ndarray) and np.array_equal(ids[:, 0], est.predict(X))


def test_feature_names_are_checked():
    X, _ = blobs(500, 3, 3, seed=6)
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    est = dask_clust.KMeans(3, random_state=0).fit(df)
    np.testing.assert_array_equal(est.feature_names_in_, ["a", "b", "c"])
    np.testing.assert_array_equal(est.predict(df), est.labels_)
    with pytest.raises(ValueError, match="feature names should match"):
        est.predict(df[["c", "a", "b"]])
    with pytest.raises(ValueError, match="X has 2 features, but KMeans is expecting 3"):
        est.predict(X[:, :2])


def test_labels_are_kept_not_the_training_data():
    """labels_ belongs to the fit: changing X afterwards changes nothing, and a pickled model holds its
    centres, not its 25.6 MB of training rows."""
    X, _ = blobs(400_000, 16, 8, seed=7)  # float32: 25.6 MB
    assert X.nbytes == 25_600_000
    est = dask_clust.KMeans(8, random_state=0, max_iter=5).fit(X)
    before = est.labels_.copy()
    X[:] = 0
    np.testing.assert_array_equal(est.labels_, before)
    assert len(np.unique(before)) == 8
    size = len(pickle.dumps(est))
    assert size < 1_000_000, size  # the labels (400 kB as uint8 in the pickle) and the centres
    again = pickle.loads(pickle.dumps(est))
    assert again.labels_.dtype == np.int32
    np.testing.assert_array_equal(again.labels_, before)
    np.testing.assert_array_equal(again.predict(X[:1000]), est.predict(X[:1000]))
