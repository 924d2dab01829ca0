"""``dask_clust.sweep``: every k's model is ``fit``'s (kmeans': with the rounds of k-means|| the sweep shares),
its criteria scikit-learn's scores of its labels, the chosen k the blobs' own, the same sweep on any worker
count; and scikit-learn's ``GridSearchCV`` over the estimators, the slower way to the same question."""

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from sklearn import metrics as skm
from sklearn.datasets import make_blobs

import dask_clust
from dask_clust import metrics
from dask_clust.errors import InputError, InvalidParameterError

HERE = {"client": "in-process"}
KS = [2, 3, 4, 6]


@pytest.fixture(scope="module")
def four():
    X, _ = make_blobs(3000, n_features=5, centers=4, cluster_std=1.0, center_box=(-20, 20), random_state=3)
    return X.astype(np.float32)


def shared_ell(k, factor=2.0):
    """The fit whose k-means|| draws what a sweep over KS shares: its rounds' ℓ = factor·max(KS) (exact in
    floats for KS), reclustered to k."""
    assert factor * max(KS) / k * k == factor * max(KS)
    return {"oversampling_factor": factor * max(KS) / k}


@pytest.mark.parametrize("algo, params", [("kmeans", {}), ("vcgmm", {}), ("vargmm", {"covariance_type": "diag"})])
def test_every_k_is_fits_model_and_its_criteria_scikit_learns(four, algo, params):
    """Each k's model is the fit's with the same seeding: k-means||'s candidates (kmeans) drawn once with the
    largest k's ℓ; the mixtures' seeding is their own."""
    result = dask_clust.sweep(four, algo, KS, random_state=1, keep_models=True, silhouette_size=None, **HERE, **params)
    assert list(result.table.index) == KS
    for k in KS:
        model = result.models_[k]
        alone = dask_clust.fit(
            four, algo, k, random_state=1, **HERE, **params, **(shared_ell(k) if algo == "kmeans" else {})
        )
        np.testing.assert_array_equal(model.cluster_centers_, alone.cluster_centers_)
        assert model.objective_ == alone.objective_ == result.table.loc[k, "objective"]  # (the same QE bits)
        timeless = lambda history: [{k: v for k, v in r.items() if k != "wall_s"} for r in history]  # noqa: E731
        assert timeless(model.history_) == timeless(alone.history_)
        # the partition the centres make (a diagonal mixture's predict takes the likeliest component instead)
        labels = ((four[:, None, :].astype(np.float64) - model.cluster_centers_[None]) ** 2).sum(-1).argmin(1)
        row = result.table.loc[k]
        X64 = four.astype(np.float64)
        assert row["calinski_harabasz"] == pytest.approx(skm.calinski_harabasz_score(X64, labels), rel=1e-10)
        assert row["davies_bouldin"] == pytest.approx(skm.davies_bouldin_score(X64, labels), rel=1e-10)
        assert row["inertia"] == pytest.approx(((X64 - model.cluster_centers_[labels]) ** 2).sum(), rel=1e-10)
        if algo != "kmeans":  # vc-GMM's over each row's C' nearest components, found in the first pass
            exact = algo == "vargmm"  # (a diagonal mixture's likeliest components are not its nearest means)
            assert (model.nearest_costs() is None) == exact
            assert row["bic"] == pytest.approx(model.bic(four, exact=exact), rel=1e-10)
            assert row["aic"] == pytest.approx(model.aic(four, exact=exact), rel=1e-10)


def test_unshared_seeding_gives_each_k_its_separate_fit(four):
    result = dask_clust.sweep(
        four, "kmeans", KS, random_state=5, keep_models=True, silhouette_size=None, shared_seeding=False, **HERE
    )
    for k in KS:
        alone = dask_clust.fit(four, "kmeans", k, random_state=5, **HERE)
        np.testing.assert_array_equal(result.models_[k].cluster_centers_, alone.cluster_centers_)
        assert result.models_[k].n_distance_evals_ == alone.n_distance_evals_


def test_the_silhouette_sample_is_one_for_every_k(four):
    """Every k's silhouette (computed together at the end) is the metric's of its model on the same draw; when
    it is the criterion, the k it picks is the table's best and only its model is kept."""
    result = dask_clust.sweep(four, "kmeans", KS, random_state=2, keep_models=True, silhouette_size=400, **HERE)
    for k in KS:
        assert result.table.loc[k, "silhouette"] == metrics.silhouette_score(
            four, result.models_[k], sample_size=400, random_state=2, **HERE
        )
    picked = dask_clust.sweep(four, "kmeans", KS, criterion="silhouette", random_state=2, silhouette_size=400, **HERE)
    assert picked.best_k_ == result.table["silhouette"].idxmax() and list(picked.models_) == [picked.best_k_]
    np.testing.assert_array_equal(picked.best_.cluster_centers_, result.models_[picked.best_k_].cluster_centers_)


@pytest.mark.parametrize(
    "algo, params, criterion",
    [("kmeans", {}, "simplified_silhouette"), ("vcgmm", {}, "bic"), ("vargmm", {"covariance_type": "diag"}, "bic")],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_default_criterion_picks_the_blobs_number(algo, params, criterion, seed):
    X, _ = make_blobs(4000, n_features=6, centers=5, cluster_std=1.0, center_box=(-25, 25), random_state=10 + seed)
    ks = [2, 3, 4, 5, 6, 7, 8]
    result = dask_clust.sweep(X, algo, ks, random_state=seed, silhouette_size=None, **HERE, **params)
    assert result.criterion == criterion
    assert result.best_k_ == 5
    assert set(result.models_) == {5}
    assert result.best_.n_clusters == 5


@pytest.mark.cluster
def test_the_sweep_is_the_same_on_a_cluster(cluster, four):
    X = da.from_array(four, chunks=500)
    here = dask_clust.sweep(X, "kmeans", KS, random_state=4, keep_models=True, silhouette_size=300, **HERE)
    there = dask_clust.sweep(X, "kmeans", KS, random_state=4, keep_models=True, silhouette_size=300, client=cluster)
    columns = [c for c in here.table if c not in ("fit_s", "wall_s")]
    assert here.table[columns].equals(there.table[columns])
    for k in KS:
        np.testing.assert_array_equal(here.models_[k].cluster_centers_, there.models_[k].cluster_centers_)


def test_the_plot_draws_each_criterion_against_k(four):
    import matplotlib

    matplotlib.use("Agg")
    result = dask_clust.sweep(four, "kmeans", KS, random_state=0, silhouette_size=300, **HERE)
    axes = result.plot()
    assert len(axes) == 5
    np.testing.assert_array_equal(axes[0].lines[0].get_xdata(), KS)


def test_bad_sweeps_are_refused_in_one_line(four):
    with pytest.raises(InvalidParameterError, match="list of ints >= 2"):
        dask_clust.sweep(four, "kmeans", [1, 2], **HERE)
    with pytest.raises(InvalidParameterError, match="repeats"):
        dask_clust.sweep(four, "kmeans", [2, 2], **HERE)
    with pytest.raises(InvalidParameterError, match="criterion must be one of"):
        dask_clust.sweep(four, "kmeans", KS, criterion="bic", **HERE)
    with pytest.raises(InvalidParameterError, match="silhouette_size"):
        dask_clust.sweep(four, "kmeans", KS, criterion="silhouette", silhouette_size=None, **HERE)
    with pytest.raises(InputError, match="n_clusters=4000"):
        dask_clust.sweep(four, "kmeans", [2, 4000], **HERE)


@pytest.mark.parametrize("estimator, param", [("KMeans", "n_clusters"), ("GaussianMixture", "n_components")])
def test_grid_search_over_the_number_of_clusters(four, estimator, param):
    from sklearn.model_selection import GridSearchCV

    search = GridSearchCV(getattr(dask_clust, estimator)(random_state=0), {param: [2, 4, 6]}, cv=2)
    search.fit(four)
    assert set(search.cv_results_["param_" + param]) == {2, 4, 6}
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()


@pytest.mark.cluster
def test_a_worker_lost_mid_sweep_gives_the_undisturbed_sweep(three_workers, lost, four, monkeypatch):
    """A worker killed as the second k's criteria pass starts: its partitions are rebuilt, that call repeated,
    and every later k fitted on the rebuilt engine; the table and the models are the undisturbed ones."""
    import os
    import signal

    from dask_clust.engine import Engine
    from tests.engine_support import worker_pids

    X = da.from_array(four, chunks=250)
    kw = dict(random_state=5, keep_models=True, silhouette_size=300, client=three_workers)
    calm = dask_clust.sweep(X, "kmeans", KS, **kw)
    victim = sorted(worker_pids(three_workers).values())[1]
    reduce, seen = Engine.reduce, []

    def killing(self, fn, *args, **kwargs):
        if getattr(fn, "__name__", "") == "_sums_step":
            seen.append(fn)
            if len(seen) == 2:
                os.kill(victim, signal.SIGKILL)
        return reduce(self, fn, *args, **kwargs)

    monkeypatch.setattr(Engine, "reduce", killing)
    hit = dask_clust.sweep(X, "kmeans", KS, **kw)
    assert lost
    columns = [c for c in calm.table if c not in ("fit_s", "wall_s")]
    assert hit.table[columns].equals(calm.table[columns])
    for k in KS:
        np.testing.assert_array_equal(hit.models_[k].cluster_centers_, calm.models_[k].cluster_centers_)


def test_a_spherical_sweep_scores_the_rows_on_the_sphere(four):
    """metric="cosine": every k's model is fit's, and the criteria are those of the unit rows."""
    unit = (four / np.linalg.norm(four, axis=1, keepdims=True)).astype(np.float64)
    result = dask_clust.sweep(four, "kmeans", KS, metric="cosine", random_state=0, keep_models=True, **HERE)
    for k in KS:
        model = result.models_[k]
        alone = dask_clust.fit(four, "kmeans", k, metric="cosine", random_state=0, **HERE, **shared_ell(k))
        np.testing.assert_array_equal(model.cluster_centers_, alone.cluster_centers_)
        assert model.objective_ == alone.objective_
        labels = ((unit[:, None, :] - model.cluster_centers_[None]) ** 2).sum(-1).argmin(1)
        assert result.table.loc[k, "calinski_harabasz"] == pytest.approx(  # (the fit's unit rows are float32)
            skm.calinski_harabasz_score(unit, labels), rel=1e-6
        )


def test_a_streamed_sweep_is_the_held_one():
    """Rule 4: a sweep over data read from its source on every pass, each fit's state in memory or in the
    workers' files between calls (``forget_state`` clears those too), gives the sweep of held data."""
    import dask

    from dask_clust.datasets import make_blobs

    X, _ = make_blobs(6000, 5, 6, chunks=1000, random_state=4)
    kw = dict(random_state=0, keep_models=True, silhouette_size=500, **HERE)
    held = dask_clust.sweep(X, "kmeans", KS, **kw)
    columns = [c for c in held.table if c not in ("fit_s", "wall_s")]
    for files in (False, True):
        with dask.config.set({"dask_clust.stream": True, "dask_clust.state-files": files}):
            streamed = dask_clust.sweep(X, "kmeans", KS, **kw)
        assert streamed.models_[KS[0]].engine_["streaming"] and not held.models_[KS[0]].engine_["streaming"]
        assert streamed.models_[KS[0]].engine_["state_files"] == files
        assert streamed.table[columns].equals(held.table[columns])


def test_a_sweep_of_csr_rows_scores_each_model_as_the_metrics_do(four):
    """Documents are CSR rows: every k's model is fit's on them, and its criteria those of the metrics."""
    S = sp.csr_matrix(np.where(four > 0, four, 0).astype(np.float32))
    result = dask_clust.sweep(S, "kmeans", KS, random_state=0, keep_models=True, silhouette_size=400, **HERE)
    for k in KS:
        model = result.models_[k]
        np.testing.assert_array_equal(
            model.cluster_centers_, dask_clust.fit(S, "kmeans", k, random_state=0, **HERE).cluster_centers_
        )
        row = result.table.loc[k]
        assert row["calinski_harabasz"] == metrics.calinski_harabasz_score(S, model, **HERE)
        assert row["davies_bouldin"] == metrics.davies_bouldin_score(S, model, **HERE)
        assert row["silhouette"] == metrics.silhouette_score(S, model, sample_size=400, random_state=0, **HERE)
