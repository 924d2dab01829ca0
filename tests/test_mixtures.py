"""Gaussian mixtures with per-cluster ("spherical"), diagonal ("diag"), full ("full") and shared ("tied")
covariances and mixing weights: the plain-numpy reference of their truncated variational EM
(tests/reference/gmm.py) against scikit-learn's GaussianMixture, and the bound's invariants."""

import warnings

import numpy as np
import pytest

from tests.reference import gmm as ref
from tests.reference.vcgmm import update_neighbourhoods

TYPES = ["spherical", "diag", "full", "tied"]


def scaled_blobs(n, d, c, seed):
    """Blobs whose clusters have per-dimension scales in [0.3, 3] and Dirichlet(2) weights."""
    from dask_clust.datasets import make_gaussian_mixture

    return make_gaussian_mixture(n, d, c, random_state=seed)[0]


def data_set(name):
    from sklearn.datasets import load_iris, load_wine

    if name == "blobs":
        return scaled_blobs(2000, 5, 8, seed=3)
    return (load_iris if name == "iris" else load_wine)().data


def start(X, C, covariance_type, seed):
    """Means at C distinct rows, variances spread about the data's (full: the data's covariance scaled per
    feature, tied: scaled once), Dirichlet weights."""
    rng = np.random.default_rng(seed)
    mu = X[rng.choice(len(X), C, replace=False)].astype(np.float64)
    var = X.var(axis=0) * rng.uniform(0.2, 2.0, (C, X.shape[1]))
    if covariance_type == "spherical":
        var[:] = var.mean(axis=1, keepdims=True)
    if covariance_type in ("full", "tied"):
        s = np.sqrt(rng.uniform(0.2, 2.0, (C, X.shape[1])))
        var = np.cov(X.T) * s[:, :, None] * s[:, None, :]
        var = var[0] if covariance_type == "tied" else var
    return mu, var, rng.dirichlet(np.full(C, 3.0))


def precisions_of(var, covariance_type):
    """scikit-learn's precisions_init for the variances (C, D) or covariances: (C,) for "spherical"."""
    if covariance_type in ("full", "tied"):
        return np.linalg.inv(var)
    return 1.0 / (var[:, 0] if covariance_type == "spherical" else var)


def sklearn_em_step(X, mu, var, pi, covariance_type, reg):
    """scikit-learn's GaussianMixture after one EM iteration from (π, μ, σ²)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    sk = GaussianMixture(
        len(mu), covariance_type=covariance_type, max_iter=1, reg_covar=reg, weights_init=pi, means_init=mu,
        precisions_init=precisions_of(var, covariance_type), init_params="random_from_data", random_state=0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # one iteration does not converge
        return sk.fit(X)


@pytest.mark.parametrize("covariance_type", TYPES)
@pytest.mark.parametrize("name", ["blobs", "iris", "wine"])
def test_one_iteration_with_every_cluster_searched_is_scikit_learns_em(name, covariance_type):
    """With C' = C every row's K^(n) holds every cluster: the truncated E-step is exact, F is the
    log-likelihood, and one iteration is the EM step scikit-learn's GaussianMixture takes from the same
    weights, means and precisions (to 1e-10 relative; its lower_bound_ is the mean log-likelihood at them)."""

    X = data_set(name)
    C, reg = 6, 1e-6
    mu, var, pi = start(X, C, covariance_type, seed=1)
    K = np.tile(np.arange(C, dtype=np.int32), (len(X), 1))
    Gc = np.arange(C, dtype=np.int32)[:, None]
    new_mu, new_var, new_pi, _, _, F = ref.em_step(
        X, np.ones(len(X)), mu, var, pi, K, Gc, covariance_type=covariance_type, reg_covar=reg
    )
    sk = sklearn_em_step(X, mu, var, pi, covariance_type, reg)
    np.testing.assert_allclose(new_pi, sk.weights_, rtol=1e-10)
    np.testing.assert_allclose(new_mu, sk.means_, rtol=1e-10, atol=1e-10 * np.abs(X).max())
    np.testing.assert_allclose(
        new_var[:, 0] if covariance_type == "spherical" else new_var, sk.covariances_, rtol=1e-10
    )
    assert F / len(X) == pytest.approx(sk.lower_bound_, rel=1e-10)


@pytest.mark.parametrize("covariance_type", TYPES)
def test_truncated_free_energy_never_decreases(covariance_type):
    """With C' < C the E-step searches S_n ⊇ K^(n), so the C' best of it bound the log-likelihood at least
    as tightly as the old K^(n), and the M-step maximises the bound for fixed posteriors: F never decreases
    (reg_covar = 0, which the M-step's maximiser does not add). Weights learned, rows weighted as a coreset's."""
    rng = np.random.default_rng(7)
    X = scaled_blobs(1500, 4, 12, seed=5)
    w = rng.uniform(0.5, 2.0, len(X))
    C, Cp, G = 12, 3, 5
    mu, var, pi = start(X, C, covariance_type, seed=2)
    K = np.array([rng.choice(C, Cp, replace=False) for _ in range(len(X))], np.int32)
    Gc = np.array([[c, *rng.choice(np.delete(np.arange(C), c), G - 1, replace=False)] for c in range(C)], np.int32)
    *_, F = ref.gmm(X, w, mu, var, pi, K, Gc, tol=0, max_iter=25, covariance_type=covariance_type, reg_covar=0.0)
    assert len(F) == 25 and F[-1] > F[0] + 0.05 * abs(F[0])
    assert np.all(np.diff(F) >= -1e-12 * np.abs(F[1:])), np.diff(F)


def test_neighbourhoods_rank_partners_by_their_mean_score():
    """G_c's partners: the clusters most often near the rows c wins, by mean −ℓ (vc-GMM's rule with −ℓ in
    place of d²), so a narrow cluster far away in d² but likely under its own variance is a partner."""
    mu = np.array([[0.0], [3.0], [1.5]])
    var = np.array([[1.0], [100.0], [0.01]])
    pi = np.full(3, 1 / 3)
    X = np.array([[0.2], [-0.2]])
    K = np.zeros((2, 1), np.int32)
    Gc = np.array([[0, 1, 2], [1, 0, 2], [2, 0, 1]], np.int32)
    new_K, Kcost, spaces = ref.estep_search(X, mu, K, Gc, lambda x, mu, S: -ref.scores(x, mu, var, np.log(pi), S))
    assert new_K[:, 0].tolist() == [0, 0]
    # in d², cluster 2 (1.5 away) is nearer than cluster 1 (3 away); under their variances, 1 is likelier
    assert update_neighbourhoods(Gc, new_K, spaces)[0].tolist() == [0, 1, 2]


def engine_fit(X, mu, var, pi, covariance_type, **kw):
    """var-GMM-S (all rows, weight 1) in-process from the mixture (μ, σ², π), weights learned."""
    import dask_clust

    precisions = precisions_of(var, covariance_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fit cut short by max_iter warns
        return dask_clust.fit(
            X, algo="vargmm", n_clusters=len(mu), init=mu, precisions_init=precisions, weights_init=pi,
            covariance_type=covariance_type, weights="learned", client="in-process", **kw,
        )  # fmt: skip


@pytest.mark.parametrize("covariance_type", TYPES)
@pytest.mark.parametrize("name", ["blobs", "iris", "wine"])
def test_the_engines_one_iteration_with_every_cluster_searched_is_scikit_learns_em(name, covariance_type):
    """The fit itself (kernels, chunks, exact sums, the M-step from sums about the old means): with C' = G = C
    one iteration from scikit-learn's start gives its weights, means and covariances to 1e-10, and F / N is
    its lower_bound_."""

    X = data_set(name)
    C, reg = 6, 1e-6
    mu, var, pi = start(X, C, covariance_type, seed=1)
    m = engine_fit(X, mu, var, pi, covariance_type, n_truncated=C, G=C, max_iter=1, reg_covar=reg)
    sk = sklearn_em_step(X, mu, var, pi, covariance_type, reg)
    np.testing.assert_allclose(m.weights_, sk.weights_, rtol=1e-10)
    np.testing.assert_allclose(m.cluster_centers_, sk.means_, rtol=1e-10, atol=1e-10 * np.abs(X).max())
    var_ = m.variances_[:, 0] if covariance_type == "spherical" else m.variances_
    np.testing.assert_allclose(var_, sk.covariances_, rtol=1e-10)
    assert m.history_[0]["objective"] / len(X) == pytest.approx(sk.lower_bound_, rel=1e-10)


@pytest.mark.parametrize("covariance_type", ["full", "tied"])
def test_the_e_step_measures_each_components_misfit(monkeypatch, covariance_type):
    """What ``split_merge`` splits a full or tied mixture by, from the E-step with C' = C, written out in
    numpy (to 1e-10), with r the posteriors and d² the squared Mahalanobis distance under the given mixture:
    full, Mardia's kurtosis Σ_n w r_nc d⁴_nc / (Σ_n w r_nc · D (D + 2)); tied, the spread Σ_n w r_nc d²_nc /
    (Σ_n w r_nc · D). Rows weighted, several chunks."""
    import dask

    from dask_clust.algorithms import vargmm

    X = scaled_blobs(3000, 4, 6, seed=4)
    w = np.random.default_rng(5).uniform(0.5, 2.0, len(X))
    C, D = 6, X.shape[1]
    mu, var, pi = start(X, C, covariance_type, seed=3)
    ended = []
    em = vargmm.truncated_em
    monkeypatch.setattr(vargmm, "truncated_em", lambda *a, **k: ended.append(em(*a, **k)) or ended[-1])
    with dask.config.set({"dask_clust.working-set-chunk-rows": 700}):
        engine_fit(X, mu, var, pi, covariance_type, n_truncated=C, G=C, max_iter=1, sample_weight=w)
    each = np.broadcast_to(var, (C, D, D))
    d2 = np.stack([np.einsum("nd,de,ne->n", X - mu[c], np.linalg.inv(each[c]), X - mu[c]) for c in range(C)], 1)
    log_p = np.log(pi) - 0.5 * np.linalg.slogdet(each)[1] - 0.5 * d2
    r = np.exp(log_p - log_p.max(axis=1, keepdims=True))
    r *= w[:, None] / r.sum(axis=1, keepdims=True)
    if covariance_type == "full":
        want = (r * d2**2).sum(axis=0) / (r.sum(axis=0) * D * (D + 2))
    else:
        want = (r * d2).sum(axis=0) / (r.sum(axis=0) * D)
    assert want.max() > 1.5 * want.min()  # the start's components are far from Gaussian, each its own way
    np.testing.assert_allclose(ended[0].misfit, want, rtol=1e-10)


@pytest.mark.parametrize("covariance_type", TYPES)
def test_the_engines_truncated_fit_follows_the_reference(covariance_type):
    """C' < C: the fit's free energy at every iteration, and its final weights, means and variances, are the
    plain-numpy reference's from the same K^(n) and G_c (as the fit draws them), the rows in several chunks
    and search blocks."""
    import dask

    from dask_clust._random import check_random_state
    from dask_clust.blocks import truncated_estep
    from tests.test_vcgmm import initial_sets

    X = scaled_blobs(1200, 4, 12, seed=5)
    C, Cp, G, rs = 12, 3, 5, 4
    mu, var, pi = start(X, C, covariance_type, seed=2)
    with pytest.MonkeyPatch.context() as mp, dask.config.set({"dask_clust.working-set-chunk-rows": 300}):
        mp.setattr(truncated_estep, "BLOCK_ROWS", 32)  # the 75-row chunks end in a shorter block
        m = engine_fit(
            X, mu, var, pi, covariance_type, n_truncated=Cp, G=G, max_iter=15, tol=0, random_state=rs,
            truncated_init="random",
        )  # fmt: skip
    K, Gc = initial_sets(check_random_state(rs), len(X), C, G, Cp)
    want_mu, want_var, want_pi, F = ref.gmm(
        X, np.ones(len(X)), mu, var, pi, K, Gc, tol=0, max_iter=15, covariance_type=covariance_type
    )
    np.testing.assert_allclose([h["objective"] for h in m.history_], F, rtol=1e-9)
    np.testing.assert_allclose(m.weights_, want_pi, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(m.cluster_centers_, want_mu, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(m.variances_, want_var, rtol=1e-8)
    assert abs(m.weights_.sum() - 1) < 1e-12 and F[-1] > F[0]


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(weights_init=np.full(4, 0.25)), "weights='equal' keeps"),
        (dict(weights="learned", weights_init=np.full(4, 0.25)), "weights_init needs precisions_init"),
        (dict(weights="learned", weights_init=np.full(3, 1 / 3), precisions_init=1.0), r"shape \(3,\); expected"),
        (dict(weights="learned", weights_init=np.full(4, 0.3), precisions_init=1.0), "sum to 1; got sum 1.2"),
        (dict(weights="learned", weights_init=np.array([0.5, 0.5, 0, 0]), precisions_init=1.0), "must be positive"),
        (dict(covariance_type="diag", precisions_init=np.ones(4)), r"'diag' takes shape \(4, 2\)"),
        (dict(covariance_type="spherical", precisions_init=np.array([1.0, 1, 0, 1])), "must be positive"),
        (dict(covariance_type="full", precisions_init=np.ones((4, 2))), r"'full' takes shape \(4, 2, 2\)"),
        (dict(covariance_type="tied", precisions_init=np.array([[1.0, 0.5], [0, 1]])), "must be symmetric"),
        (dict(covariance_type="full", precisions_init=np.tile([[1.0, 2], [2, 1]], (4, 1, 1))), "positive definite"),
    ],
)
def test_a_bad_initial_mixture_is_refused_before_any_work(kw, message):
    import dask_clust
    from dask_clust.errors import InputError

    X = np.random.default_rng(0).normal(size=(50, 2))
    with pytest.raises(InputError, match=message):
        dask_clust.fit(X, algo="vargmm", n_clusters=4, client="in-process", **kw)


@pytest.mark.parametrize("covariance_type", TYPES)
def test_a_mixtures_labels_and_posteriors_are_its_likeliest_components(covariance_type, tmp_path):
    """predict: each row's component of largest ℓ (not its nearest mean); predict_proba: the softmax of ℓ
    over the C' likeliest, against the reference's scores over all C; the same after save and load."""
    import dask_clust

    X = scaled_blobs(1500, 3, 6, seed=8)
    mu, var, pi = start(X, 6, covariance_type, seed=3)
    m = engine_fit(X, mu, var, pi, covariance_type, n_truncated=3, G=4, max_iter=5)
    scores = np.array([ref.scores(x, m.cluster_centers_, m.variances_, np.log(m.weights_), np.arange(6)) for x in X])
    nearest = ((X[:, None] - m.cluster_centers_[None]) ** 2).sum(-1).argmin(1)
    want = scores.argmax(1)
    assert (want != nearest).sum() > 10  # the likeliest component is often not the nearest mean here
    top = np.argsort(-scores, axis=1, kind="stable")[:, :3]
    s = np.take_along_axis(scores, top, 1)
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    for model in (m, dask_clust.load(m.save(str(tmp_path / "m")))):
        np.testing.assert_array_equal(model.predict(X).compute(), want)
        ids, proba = (a.compute() for a in model.predict_proba(X))
        np.testing.assert_array_equal(ids, top)
        np.testing.assert_allclose(proba, p, rtol=1e-10, atol=1e-15)


def sklearn_twin(m):
    """scikit-learn's GaussianMixture holding the fitted mixture m's parameters."""
    from sklearn.mixture import GaussianMixture

    sk = GaussianMixture(m.n_clusters, covariance_type=m.covariance_type)
    sk.weights_, sk.means_, sk.covariances_ = m.weights_, m.means_, m.covariances_
    sk.precisions_cholesky_, sk.precisions_ = m.precisions_cholesky_, m.precisions_
    sk.converged_, sk.n_iter_, sk.lower_bound_, sk.n_features_in_ = True, 1, 0.0, m.n_features_in_
    return sk


@pytest.fixture(scope="module")
def fitted():
    X = scaled_blobs(2000, 3, 6, seed=9)
    models = {}
    for kind in TYPES:
        mu, var, pi = start(X, 6, kind, seed=4)
        models[kind] = engine_fit(X, mu, var, pi, kind, n_truncated=2, G=4, max_iter=10)
    return X, models


@pytest.mark.parametrize("covariance_type", TYPES)
def test_a_mixtures_likelihoods_and_criteria_are_scikit_learns(fitted, covariance_type):
    """score_samples(exact=True), score, bic and aic equal scikit-learn's for the same parameters; the default
    truncated log-likelihood (C' = 2 of 6 components) is a lower bound of it, and close."""
    X, models = fitted
    m = models[covariance_type]
    sk = sklearn_twin(m)
    exact = m.score_samples(X, exact=True).compute()
    np.testing.assert_allclose(exact, sk.score_samples(X), rtol=1e-10)
    bound = m.score_samples(X).compute()
    assert (bound <= exact + 1e-12).all() and np.mean(exact - bound) < 0.05
    assert m.score(X, exact=True) == pytest.approx(sk.score(X), rel=1e-10)
    assert m.bic(X) == pytest.approx(sk.bic(X), rel=1e-10)
    assert m.aic(X) == pytest.approx(sk.aic(X), rel=1e-10)
    w = np.random.default_rng(0).uniform(0, 2, len(X))
    assert m.score(X, sample_weight=w, exact=True) == pytest.approx(np.average(exact, weights=w), rel=1e-10)


def test_samples_follow_the_mixture(fitted):
    """sample(n): component counts within 4 standard deviations of n·π, each component's rows with its mean
    and variances (to 4 standard errors), the same draws for the same random_state."""
    m = fitted[1]["diag"]
    n = 60_000
    X, y = m.sample(n, random_state=3)
    assert X.shape == (n, 3) and np.all(np.diff(y) >= 0)
    counts = np.bincount(y, minlength=6)
    pi = m.weights_
    assert np.all(np.abs(counts - n * pi) <= 4 * np.sqrt(n * pi * (1 - pi)) + 1)
    for c in np.flatnonzero(counts > 1000):
        rows = X[y == c]
        se = np.sqrt(m.variances_[c] / len(rows))
        assert np.all(np.abs(rows.mean(0) - m.means_[c]) < 4 * se)
        assert np.all(np.abs(rows.var(0) / m.variances_[c] - 1) < 4 * np.sqrt(2 / len(rows)))
    np.testing.assert_array_equal(m.sample(100, random_state=3)[0], m.sample(100, random_state=3)[0])


@pytest.mark.parametrize("covariance_type", ["full", "tied"])
def test_samples_follow_the_full_covariances(fitted, covariance_type):
    """A full or tied mixture's samples: each component's rows with its mean and covariance (4 standard
    errors of each entry)."""
    m = fitted[1][covariance_type]
    X, y = m.sample(80_000, random_state=4)
    for c in np.flatnonzero(np.bincount(y, minlength=6) > 2000):
        rows = X[y == c]
        cov = m.covariances_[c] if covariance_type == "full" else m.covariances_
        se = np.sqrt((cov**2 + np.outer(np.diag(cov), np.diag(cov))) / len(rows))
        assert np.all(np.abs(np.cov(rows.T) - cov) < 4 * se)
        assert np.all(np.abs(rows.mean(0) - m.means_[c]) < 4 * np.sqrt(np.diag(cov) / len(rows)))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda a, e: a["extra:variances_"].__setitem__((0, 0), -1.0), "variances_ must be"),
        (lambda a, e: a["extra:variances_"].__setitem__((0, 0), 0.0), "variances_ must be"),
        (lambda a, e: a["extra:weights_"].__setitem__(0, a["extra:weights_"][0] + 1e-6), "must sum to 1"),
        (lambda a, e: a["extra:weights_"].__setitem__(0, -a["extra:weights_"][0]), "weights_ must be"),
        (lambda a, e: e.__setitem__("covariance_type_", "full"), "covariance_type_ 'full'"),
        (lambda a, e: e.__setitem__("covariance_type_", "banded"), "covariance_type_ 'banded'"),
    ],
)
def test_a_saved_mixture_is_checked_on_load(fitted, tmp_path, edit, message):
    """A mixture's own schema: variances positive and finite, weights non-negative and summing to 1, a known
    covariance type; and a k-means model never carries a mixture's fields."""
    import json

    import dask_clust
    from dask_clust.errors import InvalidModelError

    m = fitted[1]["diag"]
    path = tmp_path / "m"
    m.save(str(path))
    again = dask_clust.load(str(path))
    assert type(again).__name__ == "MixtureModel"
    np.testing.assert_array_equal(again.weights_, m.weights_)
    arrays = dict(np.load(path / "arrays.npz"))
    meta = json.loads((path / "model.json").read_text())
    edit(arrays, meta["extras_"])
    np.savez(path / "arrays.npz", **arrays)
    (path / "model.json").write_text(json.dumps(meta))
    with pytest.raises(InvalidModelError, match=message):
        dask_clust.load(str(path))


@pytest.mark.parametrize(
    "edit,message",
    [(lambda v: v.__setitem__((0, 0, 1), v[0, 0, 1] + 1e-9), "must be symmetric"),
     (lambda v: v.__setitem__(0, -v[0]), "must be positive definite")],
)  # fmt: skip
def test_a_saved_full_mixture_holds_symmetric_positive_definite_covariances(fitted, tmp_path, edit, message):
    import dask_clust
    from dask_clust.errors import InvalidModelError

    path = tmp_path / "m"
    fitted[1]["full"].save(str(path))
    np.testing.assert_array_equal(dask_clust.load(str(path)).covariances_, fitted[1]["full"].covariances_)
    arrays = dict(np.load(path / "arrays.npz"))
    edit(arrays["extra:variances_"])
    np.savez(path / "arrays.npz", **arrays)
    with pytest.raises(InvalidModelError, match=message):
        dask_clust.load(str(path))


def test_a_full_model_over_the_model_bytes_is_refused_in_one_line():
    """A sharded model holds diagonal variances only: a full mixture past ``model-bytes`` is refused before
    its EM, naming the size and the way out."""
    import dask

    import dask_clust
    from dask_clust.errors import InputError

    X = scaled_blobs(500, 3, 4, seed=1)
    refused = pytest.raises(InputError, match="over dask_clust.model-bytes")
    with dask.config.set({"dask_clust.model-bytes": "256B"}), refused:
        dask_clust.fit(X, algo="vargmm", n_clusters=4, covariance_type="full", weights="learned", client="in-process")


def test_a_clustering_model_with_a_mixtures_fields_is_refused(tmp_path):
    import json

    import dask_clust
    from dask_clust.errors import InvalidModelError

    X = np.random.default_rng(0).normal(size=(200, 2))
    path = tmp_path / "k"
    dask_clust.fit(X, n_clusters=3, client="in-process", random_state=0).save(str(path))
    meta = json.loads((path / "model.json").read_text())
    meta["extras_"]["lower_bound_"] = -1.0
    (path / "model.json").write_text(json.dumps(meta))
    with pytest.raises(InvalidModelError, match="only a mixture model has"):
        dask_clust.load(str(path))


def test_gaussian_mixture_in_a_pipeline_and_cross_validation():
    """GaussianMixture is a scikit-learn density estimator: in a Pipeline its predict and score are the
    MixtureModel's on the scaled rows, and cross_val_score scores each held-out fold by its mean
    log-likelihood (the truncated bound); its attributes are scikit-learn's shapes."""
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    import dask_clust

    X = scaled_blobs(3000, 4, 5, seed=2)
    pipe = Pipeline([("scale", StandardScaler()), ("gm", dask_clust.GaussianMixture(5, random_state=0))])
    labels = pipe.fit(X).predict(X)
    gm, scaled = pipe.named_steps["gm"], StandardScaler().fit_transform(X)
    np.testing.assert_array_equal(labels, gm.model_.predict(scaled).compute())
    assert gm.weights_.shape == (5,) and gm.means_.shape == gm.covariances_.shape == (5, 4)
    np.testing.assert_allclose(gm.precisions_, 1 / gm.covariances_)
    assert pipe.score(X) == pytest.approx(gm.model_.score(scaled))
    scores = cross_val_score(pipe, X, cv=3)
    assert scores.shape == (3,) and np.all(np.isfinite(scores))
    spherical = dask_clust.GaussianMixture(5, covariance_type="spherical", random_state=0).fit(X)
    assert spherical.covariances_.shape == (5,) and spherical.bic(X) < dask_clust.GaussianMixture(
        1, covariance_type="spherical", random_state=0
    ).fit(X).bic(X)


def test_a_row_of_weight_zero_adds_nothing_even_with_every_cost_infinite():
    """A row of sample weight 0 may have only components of weight 0 (cost +∞) in its K^(n): no component
    gained weight from it. Its posteriors would be ∞ − ∞; it must add nothing, not NaN."""
    from dask_clust.kernels.truncated import posterior_stats

    X = np.array([[1.0, 2.0], [3.0, 4.0]])
    w = np.array([1.0, 0.0])
    K = np.array([[0, 1], [2, 3]], np.int32)
    Kd2 = np.array([[0.5, 1.5], [np.inf, np.inf]])
    with np.errstate(invalid="ignore"):
        e = np.exp(Kd2[:, :1] - Kd2)
    sums, U, Q = np.zeros((4, 2)), np.zeros(4), np.zeros((4, 2))
    total = posterior_stats(X, w, K, Kd2, e, 1.0, np.zeros((4, 2)), sums, U, Q)
    s = np.exp(-Kd2[0]) / np.exp(-Kd2[0]).sum()
    assert total == pytest.approx(np.log(np.exp(-Kd2[0]).sum()))
    np.testing.assert_allclose(U, [s[0], s[1], 0, 0])
    assert np.isfinite(sums).all() and np.isfinite(Q).all() and not sums[2:].any()


@pytest.mark.parametrize("covariance_type", TYPES)
def test_the_family_counts_and_shapes_parameters_as_scikit_learn(covariance_type):
    """Each covariance type's parameter count, ``covariances_`` and ``precisions_init`` shape are those of
    scikit-learn's GaussianMixture fitted with the same type; the family names the configs' types in order."""
    from sklearn.mixture import GaussianMixture

    from dask_clust._params import COVARIANCE_TYPES
    from dask_clust.blocks.gaussian import TYPES, check_precisions_init, covariance, n_parameters

    assert tuple(TYPES) == COVARIANCE_TYPES
    X = np.random.default_rng(0).normal(size=(200, 3))
    sk = GaussianMixture(4, covariance_type=covariance_type, random_state=0).fit(X)
    assert n_parameters(covariance_type, "learned", 4, 3) == sk._n_parameters()
    C, D = sk.means_.shape
    kind = covariance(covariance_type)
    var = sk.covariances_.copy() if kind.var_shape(C, D) == sk.covariances_.shape else None
    var = np.broadcast_to(sk.covariances_.reshape(C, -1), (C, D)).copy() if var is None else var
    np.testing.assert_array_equal(kind.covariances(var), sk.covariances_)
    np.testing.assert_allclose(kind.precisions_cholesky(var), sk.precisions_cholesky_, rtol=1e-12)
    np.testing.assert_allclose(kind.precisions(var), sk.precisions_, rtol=1e-10)
    assert check_precisions_init(sk.precisions_, covariance_type, C, D) is None
    assert "takes shape" in check_precisions_init(np.ones((C, D + 1)), covariance_type, C, D)


@pytest.mark.parametrize("covariance_type", ["diag", "tied-spherical"])
def test_the_default_refines_the_coreset_mixture_on_every_row(covariance_type):
    """GaussianMixture's default goes on from the coreset's mixture over every row: the model of a fit on all
    rows given the coreset fit's means, weights and precisions, bit for bit, its iterations continuing the
    coreset's history; ``coreset_only`` stops after the coreset."""
    import dask_clust
    from dask_clust.datasets import make_gaussian_mixture

    X = make_gaussian_mixture(6000, 4, 8, random_state=0)[0].astype(np.float32)
    kw = dict(covariance_type=covariance_type, random_state=1, coreset_size=800)
    fast = dask_clust.GaussianMixture(8, coreset_only=True, **kw).fit(X)
    refined = dask_clust.GaussianMixture(8, **kw).fit(X)
    given = dask_clust.GaussianMixture(
        8,
        covariance_type=covariance_type,
        random_state=1,
        coreset_size=None,
        means_init=fast.means_,
        weights_init=fast.weights_,
        precisions_init=1.0 / np.asarray(fast.covariances_),
    ).fit(X)
    np.testing.assert_array_equal(refined.means_, given.means_)
    np.testing.assert_array_equal(refined.weights_, given.weights_)
    assert refined.lower_bound_ == given.lower_bound_
    assert refined.n_iter_ == fast.n_iter_ + given.n_iter_
    assert [h["iteration"] for h in refined.model_.history_] == list(range(1, refined.n_iter_ + 1))
    assert fast.model_.extras_["refine_distance_evals"] == 0 < refined.model_.extras_["refine_distance_evals"]


def _given(X, mu, var, pi, covariance_type, sample_weight=None, **kw):
    """dask_clust.GaussianMixture fitted to X from a given mixture, every row and every component searched
    (exact EM)."""
    import dask_clust

    C = len(mu)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fit cut short by max_iter warns
        return dask_clust.GaussianMixture(
            C, covariance_type=covariance_type, means_init=mu, weights_init=pi,
            precisions_init=precisions_of(var, covariance_type), coreset_size=None, G=C, n_truncated=C, **kw,
        ).fit(X, sample_weight=sample_weight)  # fmt: skip


@pytest.mark.parametrize("covariance_type", TYPES)
def test_given_initial_values_are_used_as_given(covariance_type, monkeypatch):
    """weights_init, means_init and precisions_init all given: no seeder runs, and the estimator's first
    iteration is scikit-learn's EM step from them."""
    from dask_clust.blocks import seeding

    def refuse(*args, **kwargs):
        raise AssertionError("a seeder ran although the mixture was given")

    for name in ("kmeans_parallel", "kmeans_plusplus", "afkmc2", "random_rows"):
        monkeypatch.setattr(seeding, name, refuse)
    X = data_set("blobs")
    mu, var, pi = start(X, 6, covariance_type, seed=1)
    m = _given(X, mu, var, pi, covariance_type, max_iter=1, reg_covar=1e-6)
    sk = sklearn_em_step(X, mu, var, pi, covariance_type, 1e-6)
    np.testing.assert_allclose(m.weights_, sk.weights_, rtol=1e-10)
    np.testing.assert_allclose(m.means_, sk.means_, rtol=1e-10, atol=1e-10 * np.abs(X).max())
    np.testing.assert_allclose(m.covariances_, sk.covariances_, rtol=1e-10)


@pytest.mark.parametrize("covariance_type", ["diag", "full", "tied"])
def test_integer_sample_weights_are_repeated_rows_and_zero_an_absent_one(covariance_type):
    """sample_weight k on a row fits the model of that row repeated k times (0: the row left out), in fit
    and in score, within 1e-10."""
    X = data_set("blobs")
    w = np.random.default_rng(4).integers(0, 4, len(X)).astype(float)
    repeated = np.repeat(X, w.astype(int), axis=0)
    mu, var, pi = start(X, 6, covariance_type, seed=1)
    kw = dict(max_iter=8, tol=0.0, random_state=0)
    weighted = _given(X, mu, var, pi, covariance_type, sample_weight=w, **kw)
    plain = _given(repeated, mu, var, pi, covariance_type, **kw)
    np.testing.assert_allclose(weighted.weights_, plain.weights_, rtol=1e-10)
    np.testing.assert_allclose(weighted.means_, plain.means_, rtol=1e-10, atol=1e-10 * np.abs(X).max())
    np.testing.assert_allclose(weighted.covariances_, plain.covariances_, rtol=1e-10)
    assert weighted.score(X, sample_weight=w) == pytest.approx(plain.score(repeated), rel=1e-10)


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_warm_start_starts_each_fit_from_the_last(covariance_type):
    """scikit-learn's warm_start: the second fit is a fit given the first's means, weights and precisions
    (bit for bit), and ignores n_init; without it, a second fit repeats the first."""
    import dask_clust

    X = data_set("blobs")
    kw = dict(random_state=0, max_iter=3, coreset_size=None, covariance_type=covariance_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fits cut short by max_iter warn
        gm = dask_clust.GaussianMixture(6, warm_start=True, n_init=2, **kw).fit(X)
        mu, pi, prec = gm.means_.copy(), gm.weights_.copy(), np.asarray(gm.precisions_).copy()
        gm.fit(X)
        given = dask_clust.GaussianMixture(6, means_init=mu, weights_init=pi, precisions_init=prec, **kw).fit(X)
        cold = dask_clust.GaussianMixture(6, n_init=2, **kw)
        again = [cold.fit(X).means_.copy() for _ in range(2)]
    np.testing.assert_array_equal(gm.means_, given.means_)
    np.testing.assert_array_equal(gm.weights_, given.weights_)
    assert not np.array_equal(gm.means_, mu)
    np.testing.assert_array_equal(again[0], again[1])
    np.testing.assert_array_equal(again[0], mu)


def _numpy_m_step(X, resp, reg_covar):
    """scikit-learn's M-step from responsibilities (its _estimate_gaussian_parameters, diag), in numpy."""
    U = resp.sum(0)
    mu = resp.T @ X / U[:, None]
    var = np.stack([(resp[:, c, None] * (X - mu[c]) ** 2).sum(0) / U[c] for c in range(len(U))]) + reg_covar
    return mu, var, U / len(X)


@pytest.mark.parametrize("how", ["kmeans", "random-responsibilities"])
def test_a_mixture_starts_with_one_m_step_from_scikit_learns_responsibilities(how, monkeypatch):
    """scikit-learn's init_params "kmeans" (each row wholly its nearest k-means centre's) and "random"
    (uniform random responsibilities, normalised): the start is the numpy M-step from those responsibilities,
    the k-means centres here the reference Lloyd's and the random numbers the chunk's own stream."""
    from dask_clust._random import stream
    from dask_clust.blocks import mixture_start as ms
    from dask_clust.blocks.truncated_em import Family
    from dask_clust.engine import as_source, open_engine

    X = data_set("blobs").astype(np.float64)
    C, reg = 5, 1e-6
    centres = X[[0, 400, 800, 1200, 1600]]
    monkeypatch.setattr(ms, "seed", lambda engine, k, init, entropy: (centres, 0))
    monkeypatch.setattr(ms, "lloyd", lambda engine, c, **kw: type("R", (), {"centers": c, "distance_evals": 0}))
    with open_engine(as_source(X), "in-process", 7) as engine:
        starts = engine.source.starts
        mu, var, weights, _ = ms.mixture_start(engine, how, C, Family("diag", "learned", reg, 0.0), 7)
    if how == "kmeans":
        resp = np.eye(C)[((X[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)]
    else:
        resp = np.concatenate(
            [stream(7, "mixture start", "random-responsibilities", i).random((b - a, C)) for i, (a, b) in
             enumerate(zip(starts[:-1], starts[1:]))]
        )  # fmt: skip
        resp /= resp.sum(1, keepdims=True)
    want_mu, want_var, want_pi = _numpy_m_step(X, resp, reg)
    np.testing.assert_allclose(mu, want_mu, rtol=1e-10, atol=1e-10 * np.abs(X).max())
    np.testing.assert_allclose(var, want_var, rtol=1e-9)
    np.testing.assert_allclose(weights, want_pi, rtol=1e-10)


@pytest.mark.parametrize(
    "init_params,ours",
    [("kmeans", "kmeans"), ("k-means++", "k-means++"), ("random_from_data", "random"),
     ("random", "random-responsibilities"), ("auto", "k-means||")],
)  # fmt: skip
def test_init_params_speak_scikit_learns_vocabulary(init_params, ours):
    """GaussianMixture's init_params take scikit-learn's names with its meanings (its "random" is random
    responsibilities; random rows are its "random_from_data"), beside ours."""
    import dask_clust

    X = data_set("blobs")
    m = dask_clust.GaussianMixture(4, init_params=init_params, random_state=0, max_iter=5, tol=1e-3).fit(X)
    assert m.model_.extras_["init_"] == ours and np.isfinite(m.lower_bound_)


def stepwise_reference(batches, mu, var, pi, decay, reg_covar, covariance_type):
    """Plain-numpy stepwise EM (Cappé & Moulines 2009, eq. 5, in mini-batches): full posteriors, raw
    statistics (E r, E r x, E r x² or E r x xᵀ) per unit of weight, s_t = s_{t−1} + t^−decay (ŝ_t − s_{t−1}),
    the M-step of s_t. Yields (means, variances (C, D) or covariances, weights) after each batch."""
    s = None
    matrix = covariance_type in ("full", "tied")
    for t, (x, w) in enumerate(batches, 1):
        logp = np.array([ref.scores(row, mu, var, np.log(pi), np.arange(len(mu))) for row in x])
        r = np.exp(logp - logp.max(axis=1, keepdims=True))
        r = r / r.sum(axis=1, keepdims=True) * w[:, None]
        second = np.einsum("nc,nd,ne->cde", r, x, x) if matrix else r.T @ (x * x)
        new = (r.sum(axis=0), r.T @ x, second)
        new = tuple(v / w.sum() for v in new)
        gamma = t**-decay
        s = new if s is None else tuple((1 - gamma) * a + gamma * b for a, b in zip(s, new))
        U, S1, S2 = s
        mu = S1 / U[:, None]
        if covariance_type == "full":
            var = S2 / U[:, None, None] - mu[:, :, None] * mu[:, None, :] + reg_covar * np.eye(x.shape[1])
        elif covariance_type == "tied":
            var = (S2.sum(axis=0) - (U[:, None] * mu).T @ mu) / U.sum() + reg_covar * np.eye(x.shape[1])
        else:
            var = S2 / U[:, None] - mu**2
            if covariance_type == "spherical":
                var = np.repeat(var.mean(axis=1, keepdims=True), x.shape[1], axis=1)
            var = var + reg_covar
        pi = U / U.sum()
        yield mu, var, pi


@pytest.mark.parametrize("covariance_type", TYPES)
def test_partial_fit_is_stepwise_em_batch_by_batch(covariance_type):
    """Issue #52: ``partial_fit`` against the plain-numpy stepwise EM from the mixture the first batch's fit
    gives, batch by batch (sample weights within a batch included)."""
    from dask_clust import GaussianMixture

    X = scaled_blobs(6000, 4, 5, seed=8)
    w = np.random.default_rng(2).uniform(0.5, 2.0, len(X))
    kw = dict(covariance_type=covariance_type, random_state=1, reg_covar=1e-3, learning_decay=0.7)
    first = GaussianMixture(5, **kw).fit(X[:1000], sample_weight=w[:1000], client="in-process", progress=False)
    mu, var, pi = first.means_, first.model_.extras_["variances_"], first.weights_
    batches = [(X[a : a + 1000], w[a : a + 1000]) for a in range(0, len(X), 1000)]
    online = GaussianMixture(5, **kw)
    want = stepwise_reference(batches, mu, var, pi, 0.7, 1e-3, covariance_type)
    for t, ((x, wx), (mu_t, var_t, pi_t)) in enumerate(zip(batches, want), 1):
        online.partial_fit(x, sample_weight=wx)
        assert online.n_steps_ == t
        np.testing.assert_allclose(online.means_, mu_t, rtol=1e-10, atol=1e-12)
        # a covariance near 0 off the diagonal carries the cancellation of its terms: relative to the matrix
        np.testing.assert_allclose(
            online.model_.extras_["variances_"], var_t, rtol=1e-10, atol=1e-12 * np.abs(var_t).max()
        )
        np.testing.assert_allclose(online.weights_, pi_t, rtol=1e-10)
    online.fit(X, client="in-process", progress=False)
    assert online.n_steps_ == 0  # a fit starts the steps again


@pytest.mark.parametrize("batch", [2000, 5000])
def test_partial_fit_over_one_pass_of_a_stream_comes_within_a_tenth_of_a_nat_of_one_fit(batch):
    """Issue #52: one pass over a stream in batches reaches the held-out log-likelihood of one fit on every
    row within 0.1 nats a row (here within 0.02: measured 0.002-0.005), the fit started from the same
    mixture (the first batch's fit: the seeding's basin is the start's, online or not, and it alone moved
    the fits of this data by 0.6 nats across seeds), and the batches after the first improve on it."""
    from dask_clust import GaussianMixture

    X = scaled_blobs(66_000, 8, 16, seed=5).astype(np.float32)
    train, test = X[:60_000], X[60_000:]
    online = GaussianMixture(16, random_state=0)
    online.partial_fit(train[:batch])
    after_one = online.score(test, exact=True)
    first = GaussianMixture(16, random_state=0).fit(train[:batch], client="in-process", progress=False)
    start = dict(
        means_init=first.means_, weights_init=first.weights_, precisions_init=first.precisions_, random_state=0
    )
    # (no split-and-merge moves: they leave the start's basin, which stepwise EM does not)
    whole = GaussianMixture(16, split_merge=0, **start).fit(train, client="in-process", progress=False)
    for a in range(batch, len(train), batch):
        online.partial_fit(train[a : a + batch])
    assert online.n_steps_ == len(train) // batch
    score = online.score(test, exact=True)
    assert score > whole.score(test, exact=True) - 0.02 and score > after_one + 0.01


@pytest.mark.parametrize("decay", [0.5, 1.5, "fast"])
def test_partial_fit_refuses_a_learning_decay_outside_its_range(decay):
    """γ_t = t^−κ converges only for κ in (0.5, 1] (Cappé & Moulines' condition): refused in one line."""
    from dask_clust import GaussianMixture
    from dask_clust.errors import InvalidParameterError

    with pytest.raises(InvalidParameterError, match=r"learning_decay must be a float in \(0.5, 1\]"):
        GaussianMixture(2, learning_decay=decay).partial_fit(np.random.default_rng(0).normal(size=(50, 2)))


def _mixture_of(C, D, rng):
    from dask_clust.mixture import MixtureModel

    mu, var = rng.normal(0, 5, (C, D)), rng.uniform(0.5, 2.0, (C, D))
    pi = rng.dirichlet(np.ones(C))
    extras = {"covariance_type_": "diag", "weights_": pi, "variances_": var, "lower_bound_": 0.0, "n_truncated_": 5}
    extras["sigma2_"] = 1.0  # every mixture model carries the first E-step's σ²; a mixture's posteriors do not read it
    params = {"covariance_type": "diag", "weights": "learned", "n_clusters": C}
    return MixtureModel("vargmm", params, mu, extras_=extras)


def _peak(model, X):
    """The most numpy allocates while each of the three runs (tracemalloc sees every thread), and their values."""
    import tracemalloc

    calls = (
        lambda: model.score_samples(X, exact=True).compute(),
        lambda: tuple(a.compute() for a in model.predict_proba(X)),
        lambda: model.bic(X),
    )
    peaks, values = [], []
    for call in calls:
        tracemalloc.start()
        try:
            values.append(call())
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    ll, (ids, p), bic = values
    return max(peaks), (ll, ids, p, bic)


def test_likelihoods_posteriors_and_criteria_hold_memory_flat_in_the_components(monkeypatch):
    """Issue #52: ``score_samples`` (every component), ``predict_proba`` (truncated) and ``bic`` of 8,000 rows
    under 4,096 components work in row blocks of at most PROBA_BLOCK_BYTES of costs, a few of them per thread,
    whatever the components: the peak of what numpy allocates stays under 12 blocks, under a quarter of the
    rows × components matrix (262 MB); their values are the dense computation's on a slice of the rows (an
    oracle in plain numpy). The block is set to 4 MiB here, an eighth of its 32 MiB, so that the claim needs
    an eighth of the rows (tracemalloc slows every allocation)."""
    from dask_clust import mixture, models

    block = 4 << 20
    monkeypatch.setattr(models, "PROBA_BLOCK_BYTES", block)
    monkeypatch.setattr(mixture, "PROBA_BLOCK_BYTES", block)
    rng = np.random.default_rng(0)
    n, D = 8_000, 4
    X = rng.normal(0, 5, (n, D))
    model = _mixture_of(4096, D, rng)
    peak, (ll, ids, p, bic) = _peak(model, X)
    assert peak < 12 * block < 0.25 * n * 4096 * 8, peak
    mu, var, pi = model.means_, model.extras_["variances_"], model.extras_["weights_"]
    x = X[:300]
    logp = np.log(pi) - 0.5 * np.log(2 * np.pi * var).sum(axis=1) - 0.5 * (((x[:, None] - mu) ** 2) / var).sum(axis=2)
    top = logp.max(axis=1)
    np.testing.assert_allclose(ll[:300], top + np.log(np.exp(logp - top[:, None]).sum(axis=1)), rtol=1e-10)
    np.testing.assert_array_equal(ids[:300], np.argsort(-logp, axis=1, kind="stable")[:, :5])
    sub = np.exp(np.take_along_axis(logp, ids[:300], 1) - top[:, None])
    np.testing.assert_allclose(p[:300], sub / sub.sum(axis=1, keepdims=True), rtol=1e-10)
    np.testing.assert_allclose(bic, -2 * ll.sum() + (4096 * D * 2 + 4095) * np.log(n), rtol=1e-12)


def test_several_coreset_starts_go_on_with_the_one_of_highest_free_energy(monkeypatch):
    """``coreset_starts``: each start's EM on the coreset (its own stream, the fit's own first) is judged by
    the free energy it reaches; the fit then runs the best one as its own. One start is the fit it always
    was."""
    import dask_clust
    from dask_clust.algorithms import vcgmm

    X = scaled_blobs(20_000, 6, 12, seed=4).astype(np.float32)
    kw = dict(covariance_type="diag", weights="learned", coreset_size=4000, random_state=5, client="in-process")
    calls = []
    em = vcgmm.truncated_em

    def recording(rows, mu, cfg, entropy, loop, *args):
        out = em(rows, mu, cfg, entropy, loop, *args)
        calls.append((entropy, loop.max_iter, out[2]))
        return out

    monkeypatch.setattr(vcgmm, "truncated_em", recording)
    dask_clust.fit(X, "vcgmm", 12, coreset_starts=1, **kw)
    (own, _, _), *rest = calls
    assert not rest
    calls.clear()
    dask_clust.fit(X, "vcgmm", 12, coreset_starts=4, **kw)
    trials, (chosen, _, _) = calls[:4], calls[4]
    assert len(calls) == 5 and all(n == vcgmm.TRIAL_ITERATIONS for _, n, _ in trials)
    assert trials[0][0] == own  # the first start is the one-start fit's
    best = max(range(4), key=lambda i: (trials[i][2], -i))
    assert chosen == trials[best][0] == vcgmm.start_entropy(own, best)
    assert len({e for e, _, _ in trials}) == 4


@pytest.mark.parametrize(
    "covariance_type,n_clusters,starts", [("diag", 256, 1), ("diag", 257, 3), ("full", 4, 1), ("tied", 4, 3)]
)
def test_auto_coreset_starts_follow_the_type_and_the_components(monkeypatch, covariance_type, n_clusters, starts):
    """coreset_starts="auto": one start for a diagonal mixture of up to 256 components (the split-and-merge
    moves mend its optima), three above; one for "full" (its moves mend its optima too), three for "tied" (its
    moves alone left a seed in a worse basin); counted as the trial EMs run."""
    import dask_clust
    from dask_clust.algorithms import vcgmm

    X = scaled_blobs(3 * n_clusters, 2, 4, seed=1).astype(np.float32)
    trials = []
    em = vcgmm.truncated_em

    def recording(rows, mu, cfg, entropy, loop, *args):
        trials.append(loop.max_iter)
        return em(rows, mu, cfg, entropy, loop, *args)

    monkeypatch.setattr(vcgmm, "truncated_em", recording)
    dask_clust.fit(
        X, "vcgmm", n_clusters, covariance_type=covariance_type, weights="learned", coreset_starts="auto",
        coreset_size=len(X), split_merge=0, max_iter=2, random_state=0, client="in-process",
    )  # fmt: skip
    assert len(trials) == (starts + 1 if starts > 1 else 1)  # the trials, then the chosen start's own EM


def test_a_fit_with_several_coreset_starts_resumes_to_the_uninterrupted_bits(tmp_path):
    """The start chosen is in the checkpoint: a fit stopped in its EM continues from the same start."""
    import dask_clust
    from dask_clust import StopFit

    X = scaled_blobs(20_000, 6, 12, seed=4).astype(np.float32)
    kw = dict(covariance_type="diag", weights="learned", coreset_size=4000, random_state=5, coreset_starts=3, tol=0.0)
    kw.update(max_iter=20, client="in-process")

    def stop(record):
        if record["iteration"] == 7:
            raise StopFit

    dask_clust.fit(X, "vcgmm", 12, checkpoint=tmp_path / "ck", checkpoint_every=1, callback=stop, **kw)
    resumed = dask_clust.fit(X, "vcgmm", 12, resume=tmp_path / "ck", **kw)
    whole = dask_clust.fit(X, "vcgmm", 12, **kw)
    assert resumed.n_iter_ == whole.n_iter_ == 20
    np.testing.assert_array_equal(resumed.cluster_centers_, whole.cluster_centers_)
    assert resumed.lower_bound_ == whole.lower_bound_


@pytest.mark.parametrize("covariance_type", ["diag", "full"])
def test_a_split_and_merge_move_keeps_the_moments_of_what_it_moves(covariance_type):
    """SMEM's move (``split_merge.moved``): the merged component has the mean and covariance of the two it
    replaces as one mixture, E[x xᵀ] − E[x] E[x]ᵀ; the split one's halves are N(μ_k, Σ_k) cut at μ_k along
    its axis of largest variance: means μ_k ± E|z| u and variance Var|z| along u for z ~ N(0, λ) (scipy's
    half-normal), the rest of Σ_k kept; the other components untouched."""
    from scipy.stats import halfnorm

    from dask_clust.blocks.gaussian import covariance
    from dask_clust.blocks.split_merge import moved

    cov = covariance(covariance_type)
    mu, var, pi = start(scaled_blobs(3000, 4, 6, seed=2), 6, covariance_type, seed=7)
    i, j, k = 1, 4, 2
    m, v, w = moved(cov, mu, var, pi, i, j, k)
    full = var if covariance_type == "full" else np.stack([np.diag(s) for s in var])
    got = v if covariance_type == "full" else np.stack([np.diag(s) for s in v])
    p = pi[[i, j]] / pi[[i, j]].sum()
    mean = p @ mu[[i, j]]
    raw = sum(p[a] * (full[c] + np.outer(mu[c], mu[c])) for a, c in enumerate((i, j)))
    merged = raw - np.outer(mean, mean)  # (a diagonal model keeps its diagonal)
    np.testing.assert_allclose(m[i], mean, rtol=1e-12)
    np.testing.assert_allclose(got[i], merged if covariance_type == "full" else np.diag(np.diag(merged)), rtol=1e-10)
    assert w[i] == pi[i] + pi[j] and w[j] == w[k] == pi[k] / 2
    lam, vecs = np.linalg.eigh(full[k])
    axis = vecs[:, -1] if covariance_type == "full" else np.eye(4)[np.argmax(np.diag(full[k]))]
    lam = lam[-1] if covariance_type == "full" else np.diag(full[k]).max()
    half = halfnorm(scale=np.sqrt(lam))
    offset = m[j] - mu[k]
    np.testing.assert_allclose(abs(offset @ axis), half.mean(), rtol=1e-10)
    np.testing.assert_allclose(offset, abs(offset @ axis) * axis * np.sign(offset @ axis), atol=1e-12)
    np.testing.assert_allclose(m[k], mu[k] - offset, rtol=1e-12)
    for c in (j, k):
        np.testing.assert_allclose(axis @ got[c] @ axis, half.var(), rtol=1e-10)
        np.testing.assert_allclose(got[c] + np.outer(offset, offset), full[k], rtol=1e-10, atol=1e-12)
    rest = [c for c in range(6) if c not in (i, j, k)]
    np.testing.assert_array_equal(m[rest], mu[rest])
    np.testing.assert_array_equal(v[rest], var[rest])


def test_a_tied_move_keeps_the_shared_covariance_and_splits_along_its_widest_axis():
    """A tied mixture's move (``split_merge.moved``): the shared Σ as it was; i and j merged into their
    weighted mean with their weights added; k's halves at μ_k ± E|z| u with u the shared Σ's axis of largest
    variance λ and z ~ N(0, λ) (scipy's half-normal), half k's weight each; the other components untouched."""
    from scipy.stats import halfnorm

    from dask_clust.blocks.gaussian import covariance
    from dask_clust.blocks.split_merge import moved

    mu, var, pi = start(scaled_blobs(3000, 4, 6, seed=2), 6, "tied", seed=7)
    i, j, k = 1, 4, 2
    m, v, w = moved(covariance("tied"), mu, var, pi, i, j, k)
    np.testing.assert_array_equal(v, var)
    np.testing.assert_allclose(m[i], (pi[i] * mu[i] + pi[j] * mu[j]) / (pi[i] + pi[j]), rtol=1e-12)
    assert w[i] == pi[i] + pi[j] and w[j] == w[k] == pi[k] / 2
    lam, vecs = np.linalg.eigh(var)
    offset = m[j] - mu[k]
    np.testing.assert_allclose(abs(offset @ vecs[:, -1]), halfnorm(scale=np.sqrt(lam[-1])).mean(), rtol=1e-10)
    np.testing.assert_allclose(np.linalg.norm(offset), abs(offset @ vecs[:, -1]), rtol=1e-12)
    np.testing.assert_allclose(m[k], mu[k] - offset, rtol=1e-12)
    rest = [c for c in range(6) if c not in (i, j, k)]
    np.testing.assert_array_equal(m[rest], mu[rest])


def test_a_full_mixture_splits_the_component_whose_kurtosis_is_furthest_from_a_gaussians():
    """The split candidate of a full mixture, outside the merged pair: the largest |log b| among the components
    with spread (b > 0); a component collapsed on one row (b = 0, every row at its mean) is never it."""
    from dask_clust.blocks.gaussian import covariance
    from dask_clust.blocks.split_merge import split_candidate

    full = covariance("full")
    var = np.broadcast_to(np.eye(3), (6, 3, 3))
    kurtosis = np.array([1.2, 0.0, 0.7, 1.0, 1.5, 0.0])
    candidates = lambda pair: [c for c in range(6) if c not in pair and kurtosis[c] > 0]  # noqa: E731
    for pair in [(0, 3), (2, 4), (0, 2), (2, 3)]:
        want = max(candidates(pair), key=lambda c: abs(np.log(kurtosis[c])))
        assert split_candidate(full.split_rank(var, kurtosis), pair) == want


@pytest.mark.parametrize("n_features", [4, 16, 64])
def test_a_full_coreset_holds_half_a_row_per_parameter_and_one_above_256_components(n_features):
    """The default coreset of a full mixture, per component: half a row per free parameter of a component
    (its mean and Σ_c, as the type counts them for the BIC) up to 256 components, one above; at least the
    paper's 64."""
    from dask_clust.blocks.gaussian import covariance

    full = covariance("full")
    parameters = n_features + full.n_variances(1, n_features)
    assert full.coreset_rows(n_features, 256) == max(64, parameters // 2)
    assert full.coreset_rows(n_features, 257) == max(64, parameters)
    assert covariance("diag").coreset_rows(n_features, 1024) == 64


def test_merge_candidates_are_the_nearest_pairs_by_bhattacharyya_distance():
    """Each component's nearest by the Bhattacharyya distance of diagonal Gaussians, written out per pair
    (|Σ| as products), the pairs closest first, each once; the distance blocks of any size agree."""
    from dask_clust.blocks import split_merge

    rng = np.random.default_rng(3)
    C, D = 40, 5
    mu, diag = rng.normal(0, 3, (C, D)), rng.uniform(0.2, 4, (C, D))

    def distance(a, b):
        s = (diag[a] + diag[b]) / 2
        return (mu[a] - mu[b]) ** 2 / s @ np.ones(D) / 8 + 0.5 * np.log(
            np.prod(s) / np.sqrt(np.prod(diag[a]) * np.prod(diag[b]))
        )

    best = {}
    for a in range(C):
        d, b = min((distance(a, b), b) for b in range(C) if b != a)
        pair = (min(a, b), max(a, b))
        best[pair] = min(d, best.get(pair, np.inf))
    want = sorted(best, key=best.get)[:6]
    assert split_merge.merge_candidates(diag, mu, 6) == want
    old = split_merge.BLOCK_ENTRIES
    try:
        split_merge.BLOCK_ENTRIES = 3 * C * D
        assert split_merge.merge_candidates(diag, mu, 6) == want
    finally:
        split_merge.BLOCK_ENTRIES = old


@pytest.mark.parametrize("covariance_type", ["diag", "full", "tied"])
def test_split_and_merge_moves_leave_an_optimum_the_em_cannot(covariance_type):
    """Started with two components in one cluster and one spanning two others, the EM stays there. The moves
    (merge the pair, split the wide one) reach the likelihood of scikit-learn's EM started from the true
    means; without them the fit stays nats below it."""
    from sklearn.mixture import GaussianMixture

    import dask_clust

    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0, 0], [12, 0, 0], [0, 12, 0], [0, 0, 12]])
    X = (centres[rng.integers(0, 4, 24_000)] + rng.normal(0, 1, (24_000, 3))).astype(np.float32)
    fit_rows, held = X[:20_000], X[20_000:]
    bad = np.array([[-0.5, 0, 0], [0.5, 0, 0], [6, 6, 0], [0, 0, 12]])
    var = np.array([[0.75, 1, 1], [0.75, 1, 1], [37, 37, 1], [1, 1, 1]])  # the third spans two clusters
    precisions = 1 / var if covariance_type == "diag" else np.stack([np.diag(1 / v) for v in var])
    precisions = np.diag(1 / var.mean(axis=0)) if covariance_type == "tied" else precisions
    kw = dict(covariance_type=covariance_type, means_init=bad, precisions_init=precisions, coreset_size=4000)
    kw.update(weights_init=np.array([1, 1, 4, 2]) / 8, random_state=0, coreset_only=True)
    stuck = dask_clust.GaussianMixture(4, split_merge=0, **kw).fit(fit_rows)
    moved = dask_clust.GaussianMixture(4, split_merge=4, **kw).fit(fit_rows)
    truth = GaussianMixture(4, covariance_type=covariance_type, means_init=centres, random_state=0).fit(fit_rows)
    assert moved.score(held, exact=True) > truth.score(held) - 0.01
    assert stuck.score(held, exact=True) < truth.score(held) - 0.5
