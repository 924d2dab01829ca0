"""VRKM / VRKM++ against the plain-numpy sequential reference (tests/reference/vrkm.py), against Lloyd
(no steps), and their documented edge cases."""

import dask.array as da
import numpy as np
import pytest

import dask_clust
from dask_clust._random import check_random_state, stream
from dask_clust.errors import InputError
from tests.reference import vrkm as ref
from tests.reference.make_blobs import blobs


@pytest.fixture(scope="module")
def data():
    return blobs(900, 3, 6, seed=8)[0]


def _one_chunk(X):
    return da.from_array(X, chunks=X.shape)


@pytest.mark.parametrize("variant", ["vrkm++", "vrkm"])
def test_one_chunk_equals_sequential_reference(data, variant, input_chunks):
    k, eta, rs = 6, 0.02, 5
    init = data[[0, 100, 200, 300, 400, 500]].astype(np.float64)
    m = dask_clust.fit(
        _one_chunk(data),
        algo="vrkm",
        variant=variant,
        n_clusters=k,
        init=init,
        learning_rate=eta,
        max_epochs=3,
        tol=0.0,
        random_state=rs,
        client="in-process",
    )
    assert m.engine_["chunks"] == 1 and m.n_iter_ == 3
    entropy = check_random_state(rs)
    C, qes = ref.vrkm(
        data, init, eta, lambda e: stream(entropy, "vrkm", e, 0).integers(0, len(data), len(data)), 3, variant
    )
    np.testing.assert_allclose(m.cluster_centers_, C, rtol=1e-6)
    np.testing.assert_allclose([h["objective"] for h in m.history_], qes, rtol=1e-9)
    assert m.history_[0]["changed"] > 0  # steps off the anchor label happened: both branches ran
    n = len(data)
    assert m.history_[-1]["distance_evals"] < n * k + n * (k + 1)  # and steps skipped the search


def test_both_variants_give_the_same_epochs(data):
    kw = dict(
        algo="vrkm",
        n_clusters=6,
        init="random",
        learning_rate=0.01,
        max_epochs=4,
        tol=0.0,
        random_state=2,
        client="in-process",
    )
    plus = dask_clust.fit(data, variant="vrkm++", **kw)
    batch = dask_clust.fit(data, variant="vrkm", **kw)
    np.testing.assert_allclose(
        [h["objective"] for h in plus.history_], [h["objective"] for h in batch.history_], rtol=1e-6
    )


def test_no_steps_is_lloyd(data):
    init = data[[5, 15, 25, 35, 45, 55]].astype(np.float64)
    v = dask_clust.fit(
        data, algo="vrkm", n_clusters=6, init=init, epoch_size=0, max_epochs=4, tol=0.0, client="in-process"
    )
    lloyd = dask_clust.fit(data, n_clusters=6, init=init, max_iter=4, tol=0.0, client="in-process")
    assert lloyd.n_iter_ == 4  # still moving: the comparison covers every iteration
    np.testing.assert_allclose(
        [h["objective"] for h in v.history_], [h["objective"] for h in lloyd.history_], rtol=1e-12
    )
    np.testing.assert_allclose(v.cluster_centers_, lloyd.cluster_centers_, rtol=1e-12)
    assert v.objective_ == pytest.approx(lloyd.objective_, rel=1e-12)


def test_empty_cluster_keeps_its_centre(data):
    init = data[[0, 100, 200, 300, 400]].astype(np.float64)
    far = data.max(0).astype(np.float64) + 1e3
    init = np.vstack([init, far])
    m = dask_clust.fit(
        data, algo="vrkm", n_clusters=6, init=init, max_epochs=3, tol=0.0, random_state=0, client="in-process"
    )
    np.testing.assert_array_equal(m.cluster_centers_[5], far)  # no row, no step ever reaches it


def test_many_chunks_approximate_one(data, input_chunks):
    kw = dict(
        algo="vrkm", n_clusters=6, init=data[:6].astype(np.float64), max_epochs=10, random_state=1, client="in-process"
    )
    one = dask_clust.fit(_one_chunk(data), **kw)
    eight = dask_clust.fit(da.from_array(data, chunks=(113, 3)), **kw)
    assert eight.engine_["chunks"] == 8
    assert abs(eight.objective_ / one.objective_ - 1) < 0.02


def test_learning_rate_and_epoch_defaults(data):
    m = dask_clust.fit(
        data, algo="vrkm", n_clusters=4, max_epochs=2, epoch_size=0.5, random_state=0, client="in-process"
    )
    assert m.extras_["learning_rate_"] == pytest.approx(4 / len(data)) and m.extras_["epoch_size_"] == len(data) // 2
    with pytest.raises(ValueError, match="The 'epoch_size' parameter of"):
        dask_clust.fit(data, algo="vrkm", n_clusters=4, epoch_size=1.5, client="in-process")
    with pytest.raises(InputError, match="sample_weight"):
        dask_clust.fit(data, algo="vrkm", n_clusters=4, sample_weight=np.ones(len(data)), client="in-process")


def test_overshooting_learning_rate_warns(data):
    """Many chunks summing their steps with a large rate overshoot: the fit says so instead of returning a
    divergent model silently."""
    X = da.from_array(data, chunks=(60, 3))
    with pytest.warns(RuntimeWarning, match="overshoots"):
        dask_clust.fit(
            X, algo="vrkm", n_clusters=6, learning_rate=2.0, max_epochs=6, tol=0.0, random_state=0, client="in-process"
        )


def test_a_learning_rate_the_centres_run_away_with_is_named(data):
    """A step past 2 moves a centre further from each row it steps towards, a factor |1 - eta| a step: the
    centres overflow the next pass's exact sums. The error names the learning rate, not the engine's guess
    that the data's scale was misjudged."""
    with pytest.raises(
        FloatingPointError,
        match=r"vrkm diverged after \d+ epochs: with learning_rate=50 the "
        r"centres ran away from the data .* lower learning_rate",
    ) as got:
        dask_clust.fit(
            data,
            algo="vrkm",
            n_clusters=6,
            learning_rate=50.0,
            max_epochs=5,
            tol=0.0,
            random_state=0,
            client="in-process",
        )
    assert "misjudged" in str(got.value.__cause__)


@pytest.mark.parametrize("eta,rises", [(0.002, False), (1.0, True)])
def test_stops_when_an_epoch_is_no_better_than_the_best(data, eta, rises):
    """The stopping rule on the epochs' QE: the fit ends at the first epoch less than tol below the lowest QE
    before it (the paper's |ΔQE| < tol while the QE falls; a rise ends it too), never earlier. A large
    constant step makes the QE rise (1.0), a small one makes it fall slowly (0.002)."""
    tol = 1e-3
    m = dask_clust.fit(
        data,
        algo="vrkm",
        n_clusters=6,
        init="random",
        learning_rate=eta,
        max_epochs=40,
        tol=tol,
        random_state=1,
        client="in-process",
    )
    qe = [h["objective"] for h in m.history_]
    first = next(t for t in range(1, len(qe)) if min(qe[:t]) - qe[t] < tol * qe[t])
    assert m.converged_ and len(qe) == first + 1 < 40
    assert (qe[-1] > min(qe[:-1])) == rises
