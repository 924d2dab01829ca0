"""Nested mini-batch k-means and Sculley's mini-batch k-means against the plain-numpy references
(tests/reference/nmbatch.py), the bounds against brute force, and the nesting's invariances."""

import dask.array as da
import numpy as np
import pytest

import dask_clust
from dask_clust._random import check_random_state, stream
from dask_clust.blocks.batches import batch_ids, window_at
from dask_clust.kernels.nested import nested_ranks
from tests.reference import nmbatch as ref
from tests.reference.make_blobs import blobs


@pytest.fixture(scope="module")
def data():
    return blobs(3000, 4, 10, seed=5)[0]


def _order(n, random_state):
    key = int(stream(check_random_state(random_state), "nmbatch", "nesting").integers(2**63))
    ranks = np.empty(n, np.int64)
    nested_ranks(0, n, key, ranks)
    return np.argsort(ranks)


def _rounds(m):
    return [(h["batch_size"], h["objective"], h["changed"], h["distance_evals"]) for h in m.history_]


@pytest.mark.parametrize(
    "rho,mode,bounds", [(10.0, "paper", "elkan"), (300.0, "reference", "elkan"), (10.0, "paper", "hamerly")]
)
def test_rounds_match_reference(data, rho, mode, bounds):
    k, b0, rs = 8, 150, 3
    m = dask_clust.fit(
        data,
        algo="nmbatch",
        n_clusters=k,
        init="first-k",
        batch_size=b0,
        rho=rho,
        rho_mode=mode,
        bounds=bounds,
        tol=0.0,
        max_iter=60,
        random_state=rs,
        client="in-process",
    )
    order = _order(len(data), rs)
    rounds, centers = ref.nmbatch(data, order, data[order[:k]], b0, rho, 60, mode)
    ours = _rounds(m)
    assert [r[0] for r in ours] == [r[0] for r in rounds]  # the same doublings
    assert [r[2] for r in ours] == [r[2] for r in rounds]  # the same label changes, round by round
    np.testing.assert_allclose([r[1] for r in ours], [r[1] for r in rounds], rtol=1e-9)
    np.testing.assert_allclose(m.cluster_centers_, centers, rtol=1e-9, atol=1e-12)
    assert len({r[0] for r in ours}) >= 3  # the batch really grew
    if bounds == "elkan":  # float32 bounds rounded down may only add a few evaluations; a joining row adds
        for h, (*_, ref_e) in zip(m.history_, rounds):  # the exact distance to its GEMM-found centre
            assert ref_e <= h["distance_evals"] <= 1.01 * ref_e + 2 + h["joined"]
    assert m.extras_["bounds_"] == bounds


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bounds_never_exceed_true_distances(dtype):
    from tests.test_kernels import _join, _reuse

    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 6)).astype(dtype)
    w = np.ones(400)
    k = 7
    order = rng.permutation(400)
    C = X[:k].astype(np.float64)
    p = np.zeros(k)
    labels, dist = np.zeros(400, np.int32), np.zeros(400)
    elkan, hamerly = np.empty((400, k), np.float32), np.empty((400, 1), np.float32)
    lab_h, dist_h = labels.copy(), dist.copy()
    b_old = 0
    for b in (50, 50, 120, 120, 400, 400, 400):
        old, new = np.sort(order[:b_old]), np.sort(order[b_old:b])
        for lower, lab, dst in ((elkan, labels, dist), (hamerly, lab_h, dist_h)):
            sums = np.zeros((k, 6)), np.zeros(k), np.zeros(k)
            _reuse(X, w, old, C, p, lab, dst, lower, *sums)
            _join(X, w, new, C, lab, dst, lower, *sums)
        rows = order[:b]
        true = np.sqrt(((X[rows, None, :].astype(np.float64) - C[None]) ** 2).sum(-1))
        assert np.all(elkan[rows] <= true)
        second = np.sort(true, axis=1)[:, 1]
        assert np.all(hamerly[rows, 0] <= second)
        # labels are the true nearest centres, distances exact
        np.testing.assert_array_equal(labels[rows], true.argmin(1))
        np.testing.assert_allclose(dist[rows], true.min(1), rtol=1e-12)
        np.testing.assert_array_equal(lab_h[rows], labels[rows])
        new_c = C + rng.normal(scale=0.2, size=C.shape)
        p = np.sqrt(((new_c - C) ** 2).sum(1))
        C, b_old = new_c, b


def test_nesting_is_one_permutation_whatever_the_chunking():
    n = 10_001
    whole = np.empty(n, np.int64)
    nested_ranks(0, n, 12345, whole)
    np.testing.assert_array_equal(np.sort(whole), np.arange(n))
    parts = [np.empty(s1 - s0, np.int64) for s0, s1 in ((0, 17), (17, 5000), (5000, n))]
    for (s0, _), out in zip(((0, 17), (17, 5000), (5000, n)), parts):
        nested_ranks(s0, n, 12345, out)
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    # a batch is a uniform sample: rows of rank < n/2 split evenly between the halves of the data
    assert abs(int(np.count_nonzero(whole[: n // 2] < n // 2)) - n // 4) < 4 * np.sqrt(n / 16)


def test_the_first_rows_are_copied_out_of_the_state_they_build():
    """The first call builds a chunk's nesting-order state and returns its rows of rank < m, in rank order, as
    the reference ranks them; as copies, so that the call's partial does not keep the chunk's whole state (a
    streamed worker writes it to its files when the chunk is done)."""
    from types import SimpleNamespace

    from dask_clust.algorithms.nmbatch import FirstRows, Nesting, _first_rows

    x = np.random.default_rng(0).normal(size=(500, 3)).astype(np.float32)
    chunk = SimpleNamespace(n=500, start=1000, x=x, w=np.ones(500), state={})
    ranks, rows, w = _first_rows(chunk, FirstRows(40, Nesting(7, 5000, 1, None, 0)))
    st = chunk.state["nmbatch"]
    want = np.empty(500, np.int64)
    nested_ranks(1000, 5000, 7, want)
    order = np.argsort(want)
    np.testing.assert_array_equal(ranks, want[order][want[order] < 40])
    np.testing.assert_array_equal(rows, x[order][: len(ranks)])
    assert len(w) == len(ranks) > 0
    assert not any(np.shares_memory(a, st[k]) for a, k in ((ranks, "ranks"), (rows, "x"), (w, "w")))


def test_chunking_does_not_change_the_fit(data, input_chunks):
    kw = dict(
        algo="nmbatch",
        n_clusters=8,
        init="first-k",
        batch_size=150,
        rho=10.0,
        tol=0.0,
        max_iter=40,
        random_state=1,
        client="in-process",
    )
    one = dask_clust.fit(da.from_array(data, chunks=(3000, 4)), **kw)
    seven = dask_clust.fit(da.from_array(data, chunks=(430, 4)), **kw)
    assert one.engine_["chunks"] == 1 and seven.engine_["chunks"] == 7
    a, b = _rounds(one), _rounds(seven)
    assert [(r[0], r[2], r[3]) for r in a] == [(r[0], r[2], r[3]) for r in b]
    np.testing.assert_allclose([r[1] for r in a], [r[1] for r in b], rtol=1e-12)
    np.testing.assert_allclose(one.cluster_centers_, seven.cluster_centers_, rtol=1e-12)


def test_memory_budget_switches_to_one_bound_per_row(data):
    kw = dict(
        algo="nmbatch",
        n_clusters=8,
        init="first-k",
        batch_size=150,
        rho=10.0,
        max_iter=30,
        random_state=2,
        client="in-process",
    )
    roomy = dask_clust.fit(data, **kw)
    tight = dask_clust.fit(data, bounds_memory=3000 * 8 * 4 - 1, **kw)  # k bounds for 3000 rows do not fit
    assert roomy.extras_["bounds_"] == "elkan" and tight.extras_["bounds_"] == "hamerly"
    assert [(r[0], r[2]) for r in _rounds(roomy)] == [(r[0], r[2]) for r in _rounds(tight)]
    np.testing.assert_array_equal(roomy.cluster_centers_, tight.cluster_centers_)


def test_stops_when_the_whole_data_is_stable(data):
    m = dask_clust.fit(
        data,
        algo="nmbatch",
        n_clusters=5,
        init="first-k",
        batch_size=100,
        rho=1.0,
        tol=0.0,
        random_state=0,
        client="in-process",
    )
    assert m.converged_
    last = m.history_[-1]
    assert last["batch_size"] == len(data) and last["changed"] == 0 and last["joined"] == 0
    # the energy of the full batch is the QE of the centres before the last (unchanged) update
    assert m.objective_ == pytest.approx(last["objective"] * len(data), rel=1e-9)


@pytest.mark.parametrize("ratio", [0.0, 0.3])
def test_minibatch_matches_sculley_reference(data, ratio):
    """Batches of 64 rows from a 3,000-row set against the plain-numpy reference; ratio 0.3 moves light
    centres onto batch rows (scikit-learn's reassignment, here made frequent)."""
    k, b, rs, steps = 6, 64, 4, 12
    init = data[[0, 500, 1000, 1500, 2000, 2500]].astype(np.float64)
    m = dask_clust.fit(
        da.from_array(data, chunks=(700, 4)),
        algo="minibatch",
        n_clusters=k,
        init=init,
        batch_size=b,
        max_iter=steps,
        max_no_improvement=None,
        reassignment_ratio=ratio,
        random_state=rs,
        client="in-process",
    )
    entropy = check_random_state(rs)
    # the batches as drawn (their uniformity: tests/test_kernels.py)
    batches = list(batch_ids(window_at(entropy, "minibatch", 0, len(data), b), 0, steps))
    want, counts, _ = ref.minibatch(data, init, batches, ratio, lambda s: stream(entropy, "minibatch", "reassign", s))
    np.testing.assert_allclose(m.cluster_centers_, want, rtol=1e-10)
    np.testing.assert_array_equal(m.counts_, counts)
    assert m.n_iter_ == steps
    if ratio:
        assert sum(r["changed"] for r in m.history_) > 0  # the reassignment ran


def test_minibatch_early_stop_and_quality(data):
    from sklearn.cluster import KMeans

    m = dask_clust.fit(
        data, algo="minibatch", n_clusters=10, batch_size=256, max_iter=500, random_state=0, client="in-process"
    )
    assert m.converged_ and m.n_iter_ < 500
    best = KMeans(10, n_init=5, random_state=0).fit(data).inertia_
    assert m.objective_ < 1.1 * best


@pytest.mark.parametrize("bad", [dict(rho=0.0), dict(bounds="yinyang"), dict(rho_mode="x"), dict(batch_size=0)])
def test_invalid_parameters(data, bad):
    (name,) = bad
    with pytest.raises(ValueError, match=f"The '{name}' parameter of"):
        dask_clust.fit(data, algo="nmbatch", n_clusters=3, client="in-process", **bad)
