"""The same model on any worker count, tree shape and input form, on LocalCluster processes; what a fit
keeps on its workers against what its algorithm declares."""

import numpy as np
import pytest

import dask_clust
from dask_clust.engine import as_source, open_engine
from tests.reference import lloyd as ref

# every test here starts processes (a cluster, its workers, a kernel): not in the fast tier
pytestmark = pytest.mark.cluster


def test_take_and_first_pass_on_cluster(cluster, small_blobs):
    X, _ = small_blobs
    src = as_source(X)
    with open_engine(src, cluster, 0) as eng:
        assert eng.backend.kind == "cluster" and eng.n_workers == 2 and eng.n_chunks > 2
        ids = np.array([2999, 0, 17, 17, 1500])
        np.testing.assert_array_equal(eng.take(ids), X[ids])
        np.testing.assert_allclose(eng.summary.mean, X.astype(np.float64).mean(0), rtol=1e-12)
        np.testing.assert_allclose(eng.summary.var, X.astype(np.float64).var(0), rtol=1e-9)
        trips = eng.round_trips
        eng.overhead_ms(5)
        assert eng.round_trips - trips == 5 + 2  # the repeats and two warm-up round trips, nothing else


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "afkmc2", "random"])
def test_same_model_on_one_and_two_workers(cluster, small_blobs, init):
    """Rule 5: the same random_state and chunking give bit-identical centres, in-process (one partition)
    and on 2 worker processes (two partitions)."""
    X, _ = small_blobs
    one = dask_clust.fit(X, n_clusters=6, init=init, random_state=11, client="in-process")
    two = dask_clust.fit(X, n_clusters=6, init=init, random_state=11, client=cluster)
    assert one.engine_["workers"] == 1 and two.engine_["workers"] == 2
    np.testing.assert_array_equal(one.cluster_centers_, two.cluster_centers_)
    assert one.n_iter_ == two.n_iter_ and one.objective_ == two.objective_


@pytest.mark.parametrize("algo", sorted(dask_clust.REGISTRY))
def test_every_registered_algorithm_is_worker_count_invariant(cluster, small_blobs, algo):
    """Every algorithm in the registry, at its defaults: bit-identical on one and on two partitions."""
    X, _ = small_blobs
    one = dask_clust.fit(X, algo=algo, n_clusters=6, random_state=5, client="in-process")
    two = dask_clust.fit(X, algo=algo, n_clusters=6, random_state=5, client=cluster)
    np.testing.assert_array_equal(one.cluster_centers_, two.cluster_centers_)
    assert one.objective_ == two.objective_


@pytest.mark.parametrize(
    "covariance_type,refine", [("spherical", False), ("diag", False), ("diag", True), ("full", True), ("tied", False)]
)
def test_a_gaussian_mixture_is_worker_count_invariant(cluster, small_blobs, covariance_type, refine):
    """A mixture with learned weights on its coreset (and, as GaussianMixture's default, moved by split and
    merge there and refined on every row): weights, means and variances bit-identical on one and on two
    partitions."""
    X, _ = small_blobs
    kw = dict(
        algo="vcgmm", n_clusters=6, random_state=5, covariance_type=covariance_type, weights="learned", refine=refine
    )
    kw.update(split_merge=4 if refine else 0)
    one = dask_clust.fit(X, client="in-process", **kw)
    two = dask_clust.fit(X, client=cluster, **kw)
    for name in ("cluster_centers_", "weights_", "variances_"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name))
    assert one.lower_bound_ == two.lower_bound_


def _held_bytes(value):
    """Bytes of the numpy arrays in a chunk's state (dicts, tuples and lists of them)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return sum(_held_bytes(v) for v in value)
    return 0


DECLARED = [(algo, {}) for algo in sorted(dask_clust.REGISTRY) if algo != "nmbatch"] + [
    ("nmbatch", {"bounds": "elkan"}),
    ("nmbatch", {"bounds": "hamerly"}),
]  # "auto" is one of the two


@pytest.mark.parametrize("algo,params", DECLARED)
def test_every_registered_algorithm_keeps_what_it_declares(small_blobs, algo, params):
    """Issue #20: the engine streams or refuses a fit by the state its algorithm declares per input row
    (``state_bytes``) and the buffers per thread (``thread_bytes``). Measured after every call of a fit, on
    the partition of the input's rows: the arrays its chunks keep never exceed the declaration (kmeans
    declared 8 B per row and kept Lloyd's 16; nmbatch with Elkan's bounds 32 and kept 28 + 4 k), and the
    buffers of the thread that ran them neither."""
    import dask

    from dask_clust.algorithms import state_of
    from dask_clust.engine import events

    X, _ = small_blobs
    spec = dask_clust.REGISTRY[algo]
    row_bytes, _, thread_bytes, *_ = state_of(spec, spec.config(n_clusters=6, **params), X.shape[1] * X.itemsize + 8)
    seen = {"input": None, "state": 0, "buffers": 0}

    def made(partition):
        seen["input"] = seen["input"] or partition

    def ran(partition, call):
        if partition is seen["input"]:
            seen["state"] = max(seen["state"], sum(_held_bytes(c.state) for c in partition.chunks))
            seen["buffers"] = max(seen["buffers"], _held_bytes(vars(partition.chunks[0].scratch)))

    with (
        events.watch("partition", made),
        events.watch("ran", ran),
        dask.config.set({"dask_clust.in-process-threads": 1, "dask_clust.min-chunk-bytes": "1KiB"}),
    ):
        dask_clust.fit(X, algo=algo, n_clusters=6, random_state=5, client="in-process", **params)
    assert len(seen["input"].chunks) > 1
    assert seen["state"] <= row_bytes * len(X), (seen["state"] / len(X), row_bytes)
    assert seen["buffers"] <= thread_bytes, (seen["buffers"], thread_bytes)


def test_dask_input_on_cluster_matches_reference(cluster, input_chunks):
    from dask_clust.datasets import make_blobs

    X, _ = make_blobs(4000, 3, 5, chunks=700, random_state=3)
    Xn = X.compute()
    init = Xn[:5].astype(np.float64)
    m = dask_clust.fit(X, n_clusters=5, init=init, client=cluster)
    C, labels, qe, n_iter, _ = ref.lloyd(Xn, init)
    np.testing.assert_allclose(m.cluster_centers_, C, rtol=1e-10)
    assert m.objective_ == pytest.approx(qe, rel=1e-10) and m.engine_["chunks"] == 6


@pytest.mark.parametrize("split_every", [1, 2, 3, 16])
def test_any_tree_gives_the_same_model(three_workers, small_blobs, split_every):
    """The partitions combine on the workers in a tree of fan-in split-every; every shape gives the bits
    of the in-process fit (a chain at 1, the root alone with every child at 16)."""
    import dask

    X, _ = small_blobs
    kw = dict(n_clusters=6, init="k-means++", random_state=4)
    ref_model = dask_clust.fit(X, client="in-process", **kw)
    with dask.config.set({"dask_clust.split-every": split_every}):
        m = dask_clust.fit(X, client=three_workers, **kw)
    assert m.engine_["workers"] == 3
    np.testing.assert_array_equal(m.cluster_centers_, ref_model.cluster_centers_)
    assert m.objective_ == ref_model.objective_
