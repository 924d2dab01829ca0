"""Stochastic backward Euler against the plain-numpy reference (tests/reference/sbe.py), Iris (the
paper's known answer), and its guards."""

import numpy as np
import pytest

import dask_clust
from dask_clust._random import check_random_state
from dask_clust.algorithms.sbe import draw_batches
from tests.reference import sbe as ref
from tests.reference.make_blobs import blobs


@pytest.fixture(scope="module")
def data():
    return blobs(1200, 4, 5, seed=3)[0]


def test_matches_reference_with_the_same_batches(data):
    k, rs, omaxit, imaxit, b = 5, 9, 6, 4, 100
    init = data[[1, 2, 3, 4, 5]].astype(np.float64)
    m = dask_clust.fit(
        data,
        algo="sbe",
        n_clusters=k,
        init=init,
        batch_size=b,
        omaxit=omaxit,
        imaxit=imaxit,
        step_size=0.8,
        eval_every=omaxit,
        random_state=rs,
        client="in-process",
    )
    entropy = check_random_state(rs)
    batches = [draw_batches(entropy, o, len(data), b, imaxit) for o in range(omaxit)]
    np.testing.assert_allclose(m.cluster_centers_, ref.sbe(data, init, batches, 0.8), rtol=1e-9, atol=1e-12)
    assert [h["gamma"] for h in m.history_] == pytest.approx([0.8 * k * 0.95**o for o in range(omaxit)])
    # each step's objective: f at its starting centres on its first batch (the first step's: at init)
    first = ((data[batches[0][0], None, :].astype(np.float64) - init[None]) ** 2).sum(-1).min(1).sum()
    assert m.history_[0]["objective"] == pytest.approx(first / (2 * b), rel=1e-9)
    # f on all rows at the evaluation (the last step here), the objective the QE of the returned centres
    qe = ((data[:, None, :].astype(np.float64) - m.cluster_centers_[None]) ** 2).sum(-1).min(1).sum()
    assert m.history_[-1]["f_all_rows"] == pytest.approx(qe / (2 * len(data)), rel=1e-9)
    assert m.objective_ == pytest.approx(qe, rel=1e-9)


def test_a_centre_without_batch_rows_does_not_move(data):
    far = data.max(0).astype(np.float64) + 1e3
    init = np.vstack([data[:4].astype(np.float64), far])
    m = dask_clust.fit(
        data,
        algo="sbe",
        n_clusters=5,
        init=init,
        batch_size=200,
        omaxit=5,
        imaxit=3,
        random_state=0,
        client="in-process",
    )
    np.testing.assert_array_equal(m.cluster_centers_[4], far)


def test_divergence_is_an_error_not_nan_centres(data):
    with pytest.raises(FloatingPointError, match="diverged"):
        dask_clust.fit(
            data,
            algo="sbe",
            n_clusters=5,
            step_size=500.0,
            alpha=0.0,
            batch_size=50,
            omaxit=30,
            random_state=0,
            client="in-process",
        )


def test_iris_reaches_the_global_minimum_where_lloyd_sticks():
    """The paper's Iris experiment (random rows, k = 3, batch 30, 100 x 10 steps, step 1): SBE ends in
    [0.2628, 0.2640] from (almost) every start; Lloyd from the same starts sometimes stays near 0.48."""
    from sklearn.datasets import load_iris

    X = load_iris().data
    rng = np.random.default_rng(0)
    good, lloyd_stuck = 0, 0
    for run in range(20):
        init = X[rng.choice(len(X), 3, replace=False)]
        m = dask_clust.fit(
            X,
            algo="sbe",
            n_clusters=3,
            init=init,
            batch_size=30,
            omaxit=100,
            imaxit=10,
            step_size=1.0,
            random_state=run,
            client="in-process",
        )
        good += 0.2628 <= m.objective_ / (2 * len(X)) <= 0.2640
        km = dask_clust.fit(X, n_clusters=3, init=init, client="in-process")
        lloyd_stuck += km.objective_ / (2 * len(X)) > 0.4
    assert good >= 19
    assert lloyd_stuck >= 1  # the starts include bad ones: SBE's result is not the init's


def test_digitlike_noise_level_is_the_analytic_one():
    from dask_clust.datasets import make_digitlike

    X, labels, centers = make_digitlike(n_samples=4000)
    assert X.shape == (4000, 784) and np.bincount(labels).tolist() == [500] * 8
    f = ((X - centers[labels]) ** 2).sum() / (2 * len(X))
    assert f == pytest.approx(784 * 0.2**2 / 2, rel=0.01)  # 15.68
    ink = (centers > 0).mean()
    assert 0.10 < ink < 0.20  # about 15 % ink pixels
