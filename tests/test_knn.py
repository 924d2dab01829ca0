"""The kNN graph (dask_clust/blocks/knn.py) against brute force, scikit-learn and the SLK authors' graphs, under
every chunking and on a cluster."""

import pathlib

import numpy as np
import pytest

from dask_clust.blocks.knn import kneighbors_graph, neighbour_graph
from dask_clust.datasets import load_digits, load_mnist_5k
from dask_clust.engine import as_source, open_engine
from dask_clust.errors import InputError
from tests.reference import slk as ref

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "slk"


def graph_of(X, r, chunk_rows=None, client="in-process", normalize=False):
    with (
        open_engine(as_source(X, chunk_rows=chunk_rows), client, 0) as eng,
        neighbour_graph(eng, r, normalize=normalize) as g,
    ):
        ids, d2 = g.gather()
        return ids, d2, g.reference_sigma()


def tied_rows():
    """Integer rows with repeats: many equal distances, so the (distance, id) order is what decides."""
    rng = np.random.default_rng(4)
    return rng.integers(0, 3, (300, 3)).astype(np.float64)


@pytest.mark.parametrize("chunk_rows", [None, 75, 19])
def test_graph_is_brute_force_with_ties_to_the_lower_id(chunk_rows):
    X = tied_rows()
    ids, d2, _ = graph_of(X, 5, chunk_rows)
    want_ids, want_d2 = ref.knn_graph(X, 5)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(d2, want_d2)  # integer data: every distance is exact


@pytest.mark.cluster
def test_graph_bits_do_not_depend_on_chunks_or_workers(cluster):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 7)).astype(np.float32)
    runs = [
        graph_of(X, 4, rows, client)
        for rows, client in (
            (None, "in-process"),
            (500, "in-process"),
            (125, "in-process"),
            (125, cluster),
            (333, cluster),
        )
    ]
    for ids, d2, sigma in runs[1:]:
        np.testing.assert_array_equal(ids, runs[0][0])
        np.testing.assert_array_equal(d2, runs[0][1])
        assert sigma == runs[0][2]
    want_ids, want_d2 = ref.knn_graph(X.astype(np.float64), 4)
    np.testing.assert_array_equal(runs[0][0], want_ids)
    np.testing.assert_allclose(runs[0][1], want_d2, rtol=1e-13)


@pytest.mark.parametrize(
    "data,load,edges,sigma",
    [("digits", load_digits, 7188, 0.26722976069924), ("mnist5k", load_mnist_5k, 20_000, 0.50823005501820)],
)
def test_slk_graph_and_sigma_are_the_authors(data, load, edges, sigma):
    """Issue #18, line 1: on the normalised rows, the authors' 4-NN graph (row sets) and σ, with 4 chunks."""
    X = load()[0]
    ids, _, got = graph_of(X, 4, chunk_rows=-(-len(X) // 4), normalize=True)
    want = np.load(FIXTURES / "reference_fixtures.npz")[f"graph__{data}"]
    assert ids.size == edges
    assert all(set(a) == set(b) for a, b in zip(ids, want))
    assert abs(got - sigma) <= 1e-12


@pytest.mark.parametrize("mode", ["connectivity", "distance"])
def test_kneighbors_graph_is_scikit_learns(mode):
    from sklearn.neighbors import kneighbors_graph as sk_graph

    X = np.random.default_rng(2).standard_normal((400, 5))
    got = kneighbors_graph(X, 6, mode=mode)
    want = sk_graph(X, 6, mode=mode, include_self=False)
    assert got.shape == (400, 400) and got.nnz == 400 * 6
    np.testing.assert_array_equal(np.sort(got.indices.reshape(400, 6), 1), np.sort(want.indices.reshape(400, 6), 1))
    np.testing.assert_allclose(got.toarray(), want.toarray(), rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"n_neighbors": 10}, r"n_neighbors=10 needs more than n_neighbors rows; got n_samples=10"),
        ({"n_neighbors": 0}, r"n_neighbors must be an int >= 1; got 0"),
        ({"n_neighbors": 2.5}, r"n_neighbors must be an int >= 1; got 2.5"),
        ({"mode": "weights"}, r"mode must be 'connectivity' or 'distance'; got 'weights'"),
        ({"method": "hnsw"}, r"method must be one of \['auto', 'exact', 'ivf'\]; got 'hnsw'"),
        ({"nprobe": 0}, r"nprobe must be None or an int >= 1; got 0"),
        ({"nlist": 11}, r"nlist=11 cells need at least as many rows; got n_samples=10"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(InputError, match=message):
        kneighbors_graph(np.random.default_rng(0).standard_normal((10, 2)), **kwargs)


def test_the_exact_graph_is_refused_over_its_budget():
    import dask

    with (
        dask.config.set({"dask_clust.knn-exact-budget": 1e6}),
        pytest.raises(InputError, match=r"1,000 rows x 2 features is 2e\+06 multiply-adds, over .*budget = 1e\+06"),
    ):
        kneighbors_graph(np.random.default_rng(0).standard_normal((1000, 2)), 3, method="exact")


def ivf_graph_of(X, r, chunk_rows=None, client="in-process", **kw):
    with (
        open_engine(as_source(X, chunk_rows=chunk_rows), client, 0) as eng,
        neighbour_graph(eng, r, method="ivf", entropy=0, **kw) as g,
    ):
        ids, d2 = g.gather()
        return ids, d2, g.reference_sigma(), g.recall


@pytest.mark.parametrize("chunk_rows", [None, 75, 19])
def test_ivf_probing_every_cell_is_the_exact_graph(chunk_rows):
    """Issue #18, line 3 (IVF with nprobe = nlist vs exact): the rows sit in cell order, yet ties still go to
    the lower input id, and the squared distances and σ are the same bits."""
    X = tied_rows()
    ids, d2, sigma, recall = ivf_graph_of(X, 5, chunk_rows, nlist=12, nprobe=12)
    want_ids, want_d2 = ref.knn_graph(X, 5)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(d2, want_d2)
    assert sigma == graph_of(X, 5, chunk_rows)[2] and recall == 1.0


@pytest.mark.cluster
def test_ivf_graph_on_a_cluster_is_the_in_process_graph(cluster):
    X = load_digits()[0].astype(np.float32)
    here = ivf_graph_of(X, 4, 400, nprobe=4)
    there = ivf_graph_of(X, 4, 400, cluster, nprobe=4)
    for a, b in zip(here, there):
        np.testing.assert_array_equal(a, b)


def test_ivf_recall_is_measured_against_brute_force():
    """Few probes miss neighbours: every listed neighbour is at its true distance, each list is sorted,
    and the reported recall@4 (1000 random rows) is the recall of the whole graph against brute force
    within sampling error (binomial sd <= 0.016 at 1000 rows)."""
    X = ref.normalize(load_digits()[0])
    ids, d2, _, recall = ivf_graph_of(X, 4, 300, nprobe=3)
    want_ids, _ = ref.knn_graph(X, 4)
    true_recall = np.mean([len(np.intersect1d(a, b)) / 4 for a, b in zip(ids, want_ids)])
    assert 0.5 < true_recall < 1.0 and abs(recall - true_recall) <= 0.05, (recall, true_recall)
    np.testing.assert_allclose(d2, ref.sqdist(X, X)[np.arange(len(X))[:, None], ids], rtol=1e-12, atol=1e-15)
    assert np.all(np.diff(d2, axis=1) >= 0) and not np.any(ids == np.arange(len(X))[:, None])


def test_auto_takes_ivf_beyond_the_exact_budget():
    import dask

    X = tied_rows()
    with dask.config.set({"dask_clust.knn-exact-budget": 1e3}):
        with open_engine(as_source(X), "in-process", 0) as eng, neighbour_graph(eng, 3, method="auto") as g:
            assert g.method == "ivf" and g.nlist == round(4 * np.sqrt(len(X)))


def test_a_zero_row_stays_zero_when_normalised():
    """As scikit-learn's ``normalize``: the zero row is at distance 1 from every unit row."""
    from sklearn.preprocessing import normalize

    X = np.random.default_rng(1).standard_normal((20, 3))
    X[13] = 0
    got = kneighbors_graph(X, 3, mode="distance", normalize=True)
    want, _ = ref.knn_graph(normalize(X), 3)
    others = np.arange(20) != 13  # row 13 is at distance 1 ± rounding from all: its order is rounding's
    np.testing.assert_array_equal(got.indices.reshape(20, 3)[others], want[others])
    np.testing.assert_allclose(got[13].data, 1.0, rtol=1e-15)
