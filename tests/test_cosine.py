"""metric="cosine" (spherical k-means, Dhillon & Modha, Machine Learning 2001): kmeans, minibatch, nmbatch
and vc-GMM against plain-numpy spherical references (tests/reference), on the driver and sharded, in-process
and on workers; the rows' normalisation, its refusals and what a spherical model reads."""

import dask
import dask.array as da
import numpy as np
import pytest

import dask_clust
from dask_clust._random import check_random_state, stream
from dask_clust.blocks.batches import batch_ids, window_at
from dask_clust.blocks.truncated_em import m_step
from dask_clust.errors import InputError
from tests.reference import lloyd as ref_lloyd
from tests.reference import nmbatch as ref_nmbatch
from tests.reference import vcgmm as ref_vcgmm
from tests.reference.make_blobs import blobs
from tests.test_nmbatch import _order, _rounds
from tests.test_vcgmm import _nearest, initial_sets


def on_sphere(X):
    """The rows divided by their float64 norms, in their own dtype: what a spherical fit reads."""
    return (X / np.linalg.norm(X.astype(np.float64), axis=1)[:, None]).astype(X.dtype)


@pytest.fixture(scope="module")
def directions():
    """Rows whose directions cluster: blobs about centres far from the origin, in float64 and float32."""
    X, _ = blobs(2000, 6, 8, seed=3)
    return X.astype(np.float64) + 4.0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_spherical_kmeans_equals_the_plain_numpy_oracle(directions, dtype):
    """From a given init (itself put on the sphere): the oracle's centres to 1e-10, its labels and its
    Σ (1 − cos), which is also objective_, score's negative and the last record's objective (to 1e-10; 1e-8
    in float32, whose rows on the sphere have norms 1 ± 2⁻²⁴, so ½ ||x − c||² and 1 − x·c differ by that)."""
    X = directions.astype(dtype)
    rel = 1e-10 if dtype == np.float64 else 1e-8
    init = np.random.default_rng(0).normal(size=(7, X.shape[1]))
    m = dask_clust.fit(X, "kmeans", 7, init=init, metric="cosine", tol=0, client="in-process")
    C, labels, objective, n_iter = ref_lloyd.spherical_kmeans(on_sphere(X), init)
    assert n_iter > 3
    np.testing.assert_allclose(m.cluster_centers_, C, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(m.predict(X).compute(), labels)
    assert m.objective_ == pytest.approx(objective, rel=rel)
    assert -m.score(X) == pytest.approx(objective, rel=rel)
    assert m.history_[-1]["objective"] == pytest.approx(objective, rel=rel)
    np.testing.assert_allclose(np.linalg.norm(m.cluster_centers_, axis=1), 1.0, rtol=1e-14)


def test_spherical_kmeans_is_within_one_percent_of_scikit_learns_on_normalised_rows(directions):
    """scikit-learn's KMeans on the normalised rows, its centres renormalised after: our spherical fit's
    Σ (1 − cos) within 1 % of that model's (seeds 0-2)."""
    from sklearn.cluster import KMeans

    Xn = on_sphere(directions)
    for seed in range(3):
        ours = dask_clust.fit(directions, "kmeans", 12, metric="cosine", random_state=seed, client="in-process")
        sk = KMeans(12, random_state=seed, n_init=1).fit(Xn).cluster_centers_
        sk /= np.linalg.norm(sk, axis=1)[:, None]
        theirs = float(np.sum(1 - np.max(Xn @ sk.T, axis=1)))
        assert ours.objective_ <= 1.01 * theirs


@pytest.mark.parametrize("algo", ["kmeans", "vcgmm"])
def test_sharded_spherical_centres_give_the_model_of_the_driver(directions, algo):
    """Centres over model-bytes live sharded (the spherical M-step where each range lives): the same bits."""
    kw = dict(algo=algo, n_clusters=20, metric="cosine", random_state=4, client="in-process", max_iter=10)
    driver = dask_clust.fit(directions, **kw)
    with dask.config.set({"dask_clust.model-bytes": "1"}):
        sharded = dask_clust.fit(directions, **kw)
    np.testing.assert_array_equal(sharded.cluster_centers_, driver.cluster_centers_)
    assert sharded.objective_ == driver.objective_


@pytest.mark.parametrize("bounds", ["elkan", "hamerly"])
def test_spherical_nmbatch_rounds_match_the_reference(bounds):
    """Nested batches on the sphere: the reference's doublings (its test reading σ̂ / (R̄ p)), label changes,
    energies (Σ (1 − cos) over the batch) and centres; the bounds as they are on the sphere lose no label."""
    X = on_sphere(blobs(3000, 4, 10, seed=5)[0].astype(np.float64) + 3.0)
    k, b0, rs, rho = 8, 150, 3, 10.0
    m = dask_clust.fit(
        X, "nmbatch", k, init="first-k", batch_size=b0, rho=rho, bounds=bounds, tol=0.0, max_iter=60,
        random_state=rs, metric="cosine", client="in-process", rho_mode="paper",
    )  # fmt: skip
    order = _order(len(X), rs)
    rounds, centers = ref_nmbatch.nmbatch(X, order, X[order[:k]], b0, rho, 60, "paper", unit=True)
    ours = _rounds(m)
    assert [r[0] for r in ours] == [r[0] for r in rounds]
    assert [r[2] for r in ours] == [r[2] for r in rounds]
    np.testing.assert_allclose([r[1] for r in ours], [r[1] for r in rounds], rtol=1e-9)
    np.testing.assert_allclose(m.cluster_centers_, centers, rtol=1e-9, atol=1e-12)
    assert len({r[0] for r in ours}) >= 3


def test_the_doubling_test_on_the_sphere_divides_the_spread_by_the_mean_resultant_length():
    """σ̂ / (R̄ p) against a hand computation: a cluster whose rows spread (R̄ = 0.5) has a mean direction
    twice as uncertain, so the same displacement votes for doubling where it did not on R^D."""
    from dask_clust.algorithms.nmbatch import doubling_test

    sse, v, p = np.array([4.0]), np.array([5.0]), np.array([0.05])  # σ̂ = sqrt(4 / 4) = 1 ("reference")
    S = np.array([[2.5, 0.0]])  # ||S|| / v = 0.5
    assert not doubling_test(sse, v, p, 30.0, "reference")  # 1 / 0.05 = 20
    assert doubling_test(sse, v, p, 30.0, "reference", S)  # 1 / (0.5 · 0.05) = 40


@pytest.mark.parametrize("ratio", [0.0, 0.3])
def test_spherical_minibatch_matches_the_reference(ratio):
    """Sculley's update with each centre given rows put back on the sphere, batch by batch (reassignment
    onto batch rows, which are on the sphere already, at ratio 0.3)."""
    X = on_sphere(blobs(3000, 4, 10, seed=5)[0].astype(np.float64) + 3.0)
    k, b, rs, steps = 6, 64, 4, 12
    init = X[[0, 500, 1000, 1500, 2000, 2500]].astype(np.float64)
    m = dask_clust.fit(
        da.from_array(X, chunks=(700, 4)), "minibatch", k, init=init, batch_size=b, max_iter=steps,
        max_no_improvement=None, reassignment_ratio=ratio, random_state=rs, metric="cosine", client="in-process",
    )  # fmt: skip
    entropy = check_random_state(rs)
    batches = list(batch_ids(window_at(entropy, "minibatch", 0, len(X), b), 0, steps))
    picks = lambda s: stream(entropy, "minibatch", "reassign", s)  # noqa: E731
    want, counts, _ = ref_nmbatch.minibatch(X, init, batches, ratio, picks, unit=True)
    np.testing.assert_allclose(m.cluster_centers_, want, rtol=1e-10)
    np.testing.assert_array_equal(m.counts_, counts)


def test_spherical_minibatch_partial_fit_matches_the_reference():
    """The estimator's partial_fit on three batches it is given (seeded on the first), as the reference."""
    X = blobs(3000, 4, 10, seed=5)[0] + 3.0
    init = X[[0, 700, 1400, 2100]]
    est = dask_clust.MiniBatchKMeans(4, init=init, metric="cosine", reassignment_ratio=0.0)
    batches = [np.arange(lo, lo + 100) for lo in (0, 100, 200)]
    for ids in batches:
        est.partial_fit(X[ids])
    want, counts, _ = ref_nmbatch.minibatch(on_sphere(X), init, batches, unit=True)
    np.testing.assert_allclose(est.cluster_centers_, want, rtol=1e-10)
    np.testing.assert_array_equal(est.counts_, counts)


def test_spherical_vcgmm_trajectory_matches_the_reference():
    """vc-GMM on the sphere: its coreset drawn from the unit rows, then the reference's truncated EM with
    each mean its rows' mean direction: the same free energies, means and σ²."""
    from tests.test_vcgmm import _coreset

    data = blobs(1500, 5, 12, seed=4)[0].astype(np.float64) + 2.0
    C, size, rs = 30, 800, 7
    init = on_sphere(data[np.linspace(0, len(data) - 1, C).astype(int)])
    m = dask_clust.fit(
        data, "vcgmm", C, coreset_size=size, init=init, random_state=rs, client="in-process",
        truncated_init="nearest", refit_size=None, metric="cosine",
    )  # fmt: skip
    Xc, wc = _coreset(on_sphere(data), size, rs)
    first = _nearest(Xc, init)
    order = np.argsort(first, kind="stable")
    Xc, wc, first = Xc[order], wc[order], first[order]
    K0, G0 = initial_sets(check_random_state(rs), size, C, 5, 5, first)
    mu, sigma2, F = ref_vcgmm.vcgmm(Xc, wc, init, K0, G0, unit=True)
    assert m.n_iter_ == len(F) > 3
    np.testing.assert_allclose([h["objective"] for h in m.history_], F, rtol=1e-6)
    np.testing.assert_allclose(m.cluster_centers_, mu, rtol=1e-6, atol=1e-9)
    assert m.sigma2_ == pytest.approx(sigma2, rel=1e-6)


def test_the_spherical_m_step_residual_is_the_rows_squared_distance_to_the_new_mean():
    """Q about the old means turned into Σ w s ||x − μ_new||² about the mean direction: brute force."""
    rng = np.random.default_rng(1)
    x = on_sphere(rng.normal(size=(50, 3)))
    s = rng.random(50)
    old = on_sphere(rng.normal(size=(1, 3)))
    Q = np.array([[(s * ((x - old) ** 2).sum(axis=1)).sum()]])
    new, resid = m_step(old, (s[:, None] * x).sum(axis=0)[None], np.array([s.sum()]), Q, unit=True)
    np.testing.assert_allclose(np.linalg.norm(new), 1.0, rtol=1e-15)
    assert resid[0] == pytest.approx((s * ((x - new) ** 2).sum(axis=1)).sum(), rel=1e-12)


def test_rows_of_zero_norm_are_refused_with_their_row(directions):
    X = directions.copy()
    X[1234] = 0.0
    for given in (X, da.from_array(X, chunks=(500, -1))):
        with pytest.raises(InputError, match="row 1234 has zero norm"):
            dask_clust.fit(given, "kmeans", 4, metric="cosine", client="in-process")
    m = dask_clust.fit(directions, "kmeans", 4, metric="cosine", client="in-process", random_state=0)
    with pytest.raises(InputError, match="row 1234 has zero norm"):
        m.predict(X).compute()
    with pytest.raises(InputError, match="init row 2 has zero norm"):
        dask_clust.fit(directions, "kmeans", 4, init=np.eye(4, 6) * [[1], [1], [0], [1]], metric="cosine")


def test_a_spherical_mixture_is_the_isotropic_model_only(directions):
    with pytest.raises(InputError, match="isotropic model only.*'diag'"):
        dask_clust.fit(directions, "vcgmm", 4, metric="cosine", covariance_type="diag", weights="learned")


def test_a_saved_spherical_model_reads_rows_on_the_sphere(directions, tmp_path):
    """A row and the same row scaled by 10 get the same label and posteriors; so after save and load."""
    m = dask_clust.fit(directions, "vcgmm", 8, metric="cosine", random_state=1, client="in-process")
    m.save(tmp_path / "m")
    back = dask_clust.load(tmp_path / "m")
    for model in (m, back):
        ids, p = model.predict_proba(directions[:50])
        ids10, p10 = model.predict_proba(10 * directions[:50])
        np.testing.assert_array_equal(ids.compute(), ids10.compute())
        np.testing.assert_allclose(p.compute(), p10.compute(), rtol=1e-12)
        np.testing.assert_array_equal(model.predict(directions).compute(), m.predict(10 * directions).compute())


@pytest.mark.cluster
@pytest.mark.parametrize("algo", ["kmeans", "minibatch", "nmbatch", "vcgmm"])
def test_a_spherical_fit_is_worker_count_invariant(cluster, directions, algo):
    """The same bits in-process and on 2 workers (the rows normalised where each chunk loads)."""
    X = directions.astype(np.float32)
    one = dask_clust.fit(X, algo, 6, metric="cosine", random_state=5, client="in-process")
    two = dask_clust.fit(X, algo, 6, metric="cosine", random_state=5, client=cluster)
    np.testing.assert_array_equal(one.cluster_centers_, two.cluster_centers_)
    assert one.objective_ == two.objective_


def test_a_spherical_fit_reads_every_input_form_alike(directions, tmp_path):
    """The rows put on the sphere where each chunk loads, from a numpy array, a dask array cut otherwise and a
    zarr store read on every pass (``stream="always"``): the same bits."""
    X = directions.astype(np.float32)
    path = str(tmp_path / "x.zarr")
    da.from_array(X, chunks=(300, -1)).to_zarr(path)
    kw = dict(algo="kmeans", n_clusters=6, metric="cosine", random_state=2, client="in-process")
    want = dask_clust.fit(X, **kw)
    for given in (da.from_array(X, chunks=(700, 3)), path):
        with dask.config.set({"dask_clust.stream": "always"} if given is path else {}):
            got = dask_clust.fit(given, **kw)
        np.testing.assert_array_equal(got.cluster_centers_, want.cluster_centers_)
        assert got.objective_ == want.objective_


@pytest.mark.parametrize("algo", ["kmeans", "minibatch", "nmbatch", "vcgmm"])
def test_a_spherical_fit_resumes_to_the_uninterrupted_bits(tmp_path, algo):
    """Stopped after iteration 9 and resumed from its checkpoint (its centres on the sphere already, not
    put there again): the uninterrupted model, history included."""
    from tests.test_checkpoint import _fit, assert_same_model

    data = on_sphere(np.random.default_rng(0).random((12_000, 5)).astype(np.float32) - 0.3)

    def stop(record):
        if record["iteration"] == 9:
            raise dask_clust.StopFit

    kw = dict(client="in-process", metric="cosine")
    _fit(data, algo, checkpoint=tmp_path / "ck", checkpoint_every=3, callback=stop, **kw)
    calls = []
    resumed = _fit(data, algo, checkpoint=tmp_path / "ck", callback=calls.append, **kw)
    assert calls[0]["iteration"] == 10
    whole = _fit(data, algo, **kw)
    assert_same_model(resumed, whole, whole.n_iter_)
