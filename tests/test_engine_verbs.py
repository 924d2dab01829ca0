"""The engine's verbs on their own: in-process threads, a coreset drawn on the workers, halos, reorder, a
state written and read back by row, reduce-scatter and sharded models (Lloyd, vc-GMM), AFK-MC2 chains
on the workers."""

import os
from typing import NamedTuple

import numpy as np
import pytest

import dask_clust
from dask_clust.engine import Halo, ReduceScatter, as_source, open_engine
from tests.reference.make_blobs import blobs


def _shuffled_state(chunk, _):
    order = np.random.default_rng(chunk.start).permutation(chunk.x.shape[0])
    chunk.state["s"] = {"order": order, "v": chunk.x[order, 0].copy()}


def _cleared(chunk, _):
    chunk.state["s"]["v"][:] = -1
    return (np.int64(1),)


def _order_and_values(chunk, _):
    return chunk.state["s"]["order"], chunk.state["s"]["v"]


def test_a_state_kept_in_another_order_is_written_and_read_back_by_row(tmp_path):
    """nmbatch keeps its rows in nesting order: its checkpoint's files hold them by row all the same (an
    engine cut in other chunks reads them by row), and reading them puts each value back at its row's
    place in the state's order."""
    from dask_clust.engine.combine import Rows

    X = np.arange(46.0).reshape(23, 2)
    with open_engine(as_source(X, None, chunk_rows=6), "in-process", 0) as engine:
        with engine.state("s", _shuffled_state):
            digests = engine.dump_rows(tmp_path, "s", ("v",), order="order")
            files = sorted(os.listdir(tmp_path))
            assert len(files) == 4 and sorted(digests) == files
            np.testing.assert_array_equal(np.concatenate([np.load(tmp_path / f)["v"] for f in files]), X[:, 0])
            engine.reduce(_cleared)
            engine.load_rows((os.fspath(tmp_path), digests), "s", {"v": ("float64", (), None, None)}, order="order")
            order, v = engine.reduce(_order_and_values, None, (Rows(), Rows()))
    starts = np.repeat(np.arange(0, 23, 6), [6, 6, 6, 5])
    np.testing.assert_array_equal(v, X[starts + order, 0])


def test_in_process_threads_setting_keeps_the_model():
    """``in-process-threads`` bounds the driver's threads; chunks, not threads, fix the model (rule 5), also
    where a step calls BLAS (the coreset's dot products: a threaded BLAS would split them differently)."""
    import dask

    X = blobs(60_000, 3, 5, seed=2)[0]
    kw = dict(algo="vcgmm", n_clusters=5, coreset_size=3000, max_iter=3, random_state=0, client="in-process")
    with dask.config.set({"dask_clust.min-chunks": 1}):  # one chunk: a dot product long enough to be threaded
        default = dask_clust.fit(X, **kw)
        with dask.config.set({"dask_clust.in-process-threads": 1}):
            one = dask_clust.fit(X, **kw)
    assert one.engine_["threads"] == 1 and default.engine_["threads"] == (os.cpu_count() or 1)
    np.testing.assert_array_equal(one.cluster_centers_, default.cluster_centers_)
    assert one.objective_ == default.objective_


@pytest.mark.cluster
def test_coreset_drawn_on_the_workers_gives_the_in_process_model(cluster):
    """A coreset larger than ``in-process-bytes`` stays on the workers that drew it, rebalanced there into
    chunks of ``working-set-chunk-rows``; the model is the one of the coreset brought in-process."""
    import dask

    from dask_clust.datasets import make_blobs
    from dask_clust.engine import events

    X, _ = make_blobs(20_000, 4, 8, chunks=3000, random_state=1)
    drawn = []
    kw = dict(algo="vcgmm", n_clusters=8, coreset_size=6500, max_iter=10, random_state=3)
    with (
        dask.config.set({"dask_clust.working-set-chunk-rows": 1000}),
        events.watch("drawn", lambda rows: drawn.append(rows)),
    ):
        here = dask_clust.fit(X, client=cluster, **kw)
        assert not drawn
        with dask.config.set({"dask_clust.in-process-bytes": "1KiB"}):
            there = dask_clust.fit(X, client=cluster, **kw)
    assert drawn == [6500, 13000]  # the coreset, then the refit's 2 N' uniform rows (step 7)
    np.testing.assert_array_equal(here.cluster_centers_, there.cluster_centers_)
    assert here.objective_ == there.objective_ and here.n_iter_ == there.n_iter_


# a hand-made graph on 6 rows, 3 per partition: row i reads the rows NEIGHBOURS[i], across the split
NEIGHBOURS = [[1, 3], [2, 4], [0, 5], [0, 4], [1, 5], [2, 3]]


Z0 = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])


def _reads(chunk, params):
    return np.array([NEIGHBOURS[i] for i in range(chunk.start, chunk.stop)]).ravel()


def _init_z(chunk, params):
    chunk.state["z"] = Z0[chunk.start : chunk.stop].copy()


def _jacobi(chunk, params):
    """z_i ← (z_i + Σ_{j ∈ N(i)} z_j) / 3 from the neighbours' previous values, written in place row by row
    (a Gauss-Seidel update would read the rows this partition already overwrote)."""
    z = chunk.state["z"]
    nb = chunk.halo["z"].reshape(-1, 2)
    for r in range(len(z)):
        z[r] = (z[r] + nb[r].sum()) / 3.0
    return (z.copy(),)


@pytest.mark.cluster
@pytest.mark.parametrize("where", ["in-process", "cluster"])
def test_halo_gives_the_hand_computed_jacobi_step(cluster, where):
    from dask_clust.engine.combine import Rows

    X = np.arange(12, dtype=np.float64).reshape(6, 2)
    with open_engine(as_source(X, chunk_rows=3), "in-process" if where == "in-process" else cluster, 0) as eng:
        assert eng.n_chunks == 2 and eng.n_workers == (1 if where == "in-process" else 2)
        with eng.state("z", _init_z), eng.halo("graph", _reads):
            (one,) = eng.reduce(_jacobi, None, (Rows(),), halo=Halo("graph", "z"))
            (two,) = eng.reduce(_jacobi, None, (Rows(),), halo=Halo("graph", "z"))
    # by hand: z1_i = (z0_i + z0_a + z0_b) / 3
    hand = np.array(
        [(1 + 2 + 8) / 3, (2 + 4 + 16) / 3, (4 + 1 + 32) / 3, (8 + 1 + 16) / 3, (16 + 2 + 32) / 3, (32 + 4 + 8) / 3]
    )
    np.testing.assert_allclose(one, hand, rtol=1e-15, atol=0)
    again = np.array([(hand[i] + hand[NEIGHBOURS[i]].sum()) / 3 for i in range(6)])
    np.testing.assert_allclose(two, again, rtol=1e-15, atol=0)


def _read_other_half(chunk, n):
    half = n // 2
    return np.arange(half, n) if chunk.start < half else np.arange(0, half)


def _init_v(chunk, params):
    chunk.state["v"] = np.arange(chunk.start, chunk.stop, dtype=np.float64)


def _check_v(chunk, n):
    half = n // 2
    want = np.arange(half, n) if chunk.start < half else np.arange(0, half)
    return (np.int64(np.array_equal(chunk.halo["v"], want)),)


@pytest.mark.cluster
def test_halo_rows_go_partition_to_partition(cluster):
    """A halo of 1 M float64 rows between 2 workers: the driver's sockets carry none of its 8 MB."""
    from harness.scaling import DriverBytes

    n = 2_000_000
    X = np.zeros((n, 1), np.float32)
    with open_engine(as_source(X, chunk_rows=n // 2), cluster, 0) as eng:
        assert eng.n_workers == 2
        with eng.state("v", _init_v), eng.halo("other", _read_other_half, n):
            eng.reduce(_check_v, n, halo=Halo("other", "v"))  # warm
            with DriverBytes() as io:
                (ok,) = eng.reduce(_check_v, n, halo=Halo("other", "v"))
    assert ok == 2
    assert io.read + io.written < 100_000, (io.read, io.written)


def _bucket(chunk, params):
    """A stateless key: a coarse bucket of the first feature."""
    return np.floor(chunk.x[:, 0].astype(np.float64) * params).astype(np.int64) % 7


def _rows_and_ids(chunk, params):
    return chunk.x, chunk.input_ids()


def _moments(chunk, params):
    x = chunk.x.astype(np.float64)
    return x.sum(0), (x * x).sum(0), np.int64(len(x))


@pytest.mark.cluster
@pytest.mark.parametrize("where", ["in-process", "cluster"])
def test_reorder_sorts_by_key_and_maps_back(cluster, where):
    from dask_clust.engine.combine import Rows

    # integer values: every chunk's float64 sums are exact whichever rows it holds, so the reduce's bits can
    # only differ if the combine or the row movement loses or repeats something
    X = np.round(np.random.default_rng(3).standard_normal((5000, 3)) * 100).astype(np.float32)
    keys = _bucket(type("C", (), {"x": X}), 0.1)
    with open_engine(as_source(X, chunk_rows=700), "in-process" if where == "in-process" else cluster, 0) as eng:
        before = eng.reduce(_moments)
        with eng.reorder(_bucket, 0.1) as sorted_eng:
            assert sorted_eng.n_chunks == eng.n_chunks == 8
            rows, ids = sorted_eng.reduce(_rows_and_ids, None, (Rows(), Rows()))
            after = sorted_eng.reduce(_moments)
            back = sorted_eng.to_input_order(rows)
    order = np.lexsort((np.arange(len(X)), keys))  # by key, ties in input order
    np.testing.assert_array_equal(ids, order)
    np.testing.assert_array_equal(rows, X[order])
    np.testing.assert_array_equal(back, X)  # reorder then to_input_order: the identity
    for a, b in zip(before, after):  # an exact reduce: the same bits on both orders
        np.testing.assert_array_equal(a, b)


def _sums_per_label(chunk, params):
    """Per label (the first feature's integer part mod k): Σ x and the count, for a reduce-scatter."""
    k, scale = params
    lab = np.floor(chunk.x[:, 0].astype(np.float64)).astype(np.int64) % k
    sums = np.zeros((k, chunk.x.shape[1]))
    np.add.at(sums, lab, chunk.x.astype(np.float64) * scale)
    return sums, np.bincount(lab, minlength=k), np.int64(len(lab))


def _mean_of_shard(fields, shard, params, lo):
    """Where clusters lo.. live: the new means (the old ones where a cluster is empty), its rows' ids."""
    sums, counts = fields
    new = shard[0].copy()
    new[counts > 0] = sums[counts > 0] / counts[counts > 0, None]
    return (new,), (np.arange(lo, lo + len(new)), counts)


def _scaled_by_model(chunk, params):
    """A step that reads the whole sharded model from its parameters (a ShardRef in a tuple)."""
    k, means = params
    return (means * len(chunk.x),)


@pytest.mark.cluster
@pytest.mark.parametrize("where", ["in-process", "cluster"])
def test_reduce_scatter_leaves_the_sums_sharded_on_the_workers(three_workers, where):
    """A reduce-scatter over 3 partitions (k = 7 rows: shards of 2, 2, 3) gives each shard the rows of the
    driver's exact sum; at_shard's small fields come back in row order; a ShardRef in a later call's
    parameters gives every chunk the whole model, and gather brings the same bits to the driver."""
    from dask_clust.engine.combine import Rows, Scatter, Sum

    rng = np.random.default_rng(2)
    X = (rng.random((4000, 3)) * 50).astype(np.float32)
    k = 7
    start = np.arange(k * 3, dtype=np.float64).reshape(k, 3)
    client = "in-process" if where == "in-process" else three_workers
    with open_engine(as_source(X, chunk_rows=500), client, 0) as eng:
        assert eng.n_workers == (1 if where == "in-process" else 3)
        sums, counts, n = eng.reduce(_sums_per_label, (k, 1.0))
        with eng.sharded("means", (start,)) as model:
            n2, ids, counts2 = eng.reduce(
                _sums_per_label,
                (k, 1.0),
                (Scatter(), Scatter(), Sum()),
                scatter=ReduceScatter(model, _mean_of_shard, (Rows(), Rows())),
            )
            means = model.gather()
            (scaled,) = eng.reduce(_scaled_by_model, (k, model.ref()))
    want = start.copy()
    want[counts > 0] = sums[counts > 0] / counts[counts > 0, None]
    assert n2 == n == len(X)
    np.testing.assert_array_equal(ids, np.arange(k))
    np.testing.assert_array_equal(counts2, counts)
    np.testing.assert_array_equal(means, want)
    np.testing.assert_allclose(scaled, want * len(X), rtol=1e-14)


def _sharded_kmeans_cases():
    X, _ = blobs(3000, 4, 6, seed=1)
    duplicated = np.repeat(X[:10].astype(np.float64), 3, axis=0)  # 20 empty clusters: relocations
    return X, [dict(n_clusters=30, init=duplicated), dict(n_clusters=40, init="k-means++", random_state=3)]


@pytest.mark.cluster
@pytest.mark.parametrize("case", [0, 1])
def test_sharded_lloyd_gives_the_model_of_the_driver(three_workers, case):
    """Centres over model-bytes live sharded on the workers (sums reduce-scattered by cluster, the M-step
    and the empty-cluster relocation where each cluster range lives): the same bits, history included,
    as the centres on the driver, in-process and on 3 workers."""
    import dask

    X, cases = _sharded_kmeans_cases()
    kw = cases[case]
    driver = dask_clust.fit(X, client="in-process", **kw)
    with dask.config.set({"dask_clust.model-bytes": "1"}):
        for client in ("in-process", three_workers):
            sharded = dask_clust.fit(X, client=client, **kw)
            np.testing.assert_array_equal(sharded.cluster_centers_, driver.cluster_centers_)
            assert sharded.objective_ == driver.objective_
            assert [(h["objective"], h["center_shift"], h["relocated"]) for h in sharded.history_] == [
                (h["objective"], h["center_shift"], h["relocated"]) for h in driver.history_
            ]
    assert sum(h["relocated"] for h in driver.history_) == (20 if case == 0 else 0)


@pytest.mark.cluster
@pytest.mark.parametrize(
    "algo,model",
    [
        ("vcgmm", {}),
        ("vargmm", {}),
        ("vcgmm", dict(covariance_type="diag", weights="learned")),
        ("vargmm", dict(covariance_type="tied-spherical", weights="learned")),
    ],
)
def test_sharded_gmm_means_give_the_model_of_the_driver(three_workers, algo, model):
    """vc-GMM's means over model-bytes live sharded on the workers (pair and posterior statistics
    reduce-scattered by cluster, G_c and the M-step where each cluster range lives; the other models' σ²,
    π and metric there too, a shared σ² set where they live): the same bits, free energy and σ² history
    included, as the means on the driver; with the working set in-process and on 3 workers."""
    import dask

    X, _ = blobs(3000, 4, 6, seed=1)
    kw = dict(algo=algo, n_clusters=40, G=4, n_init_esteps=1, random_state=2, max_iter=8, **model)
    if algo == "vcgmm":
        kw["coreset_size"] = 2000
    with dask.config.set({"dask_clust.working-set-chunk-rows": 400}):  # several chunks per partition
        driver = dask_clust.fit(X, client="in-process", **kw)
    with dask.config.set(
        {"dask_clust.model-bytes": "1", "dask_clust.in-process-bytes": "1", "dask_clust.working-set-chunk-rows": 400}
    ):
        for client in ("in-process", three_workers):
            sharded = dask_clust.fit(X, client=client, **kw)
            np.testing.assert_array_equal(sharded.cluster_centers_, driver.cluster_centers_)
            assert sharded.objective_ == driver.objective_
            assert sharded.extras_["sigma2_"] == driver.extras_["sigma2_"]
            for name in ("weights_", "variances_"):
                np.testing.assert_array_equal(sharded.extras_.get(name), driver.extras_.get(name))
            assert [(h["objective"], h.get("sigma2"), h["active_clusters"]) for h in sharded.history_] == [
                (h["objective"], h.get("sigma2"), h["active_clusters"]) for h in driver.history_
            ]
    assert driver.n_iter_ > 2


@pytest.mark.cluster
def test_afkmc2_chains_run_on_the_workers(cluster, monkeypatch):
    """AFK-MC2's proposals stay on the workers that drew them and are scored there, CHAINS_PER_ROUND
    chains per round trip: on 2 workers the driver evaluates only each chain's distances to the centres
    chosen earlier in its round, and the seeds are the in-process ones, bit for bit."""
    from dask_clust.blocks import seeding

    X, _ = blobs(6000, 5, 8, seed=4)
    k, m, n = 40, 6, seeding.CHAINS_PER_ROUND
    with open_engine(as_source(X, chunk_rows=700), "in-process", 0) as eng:
        here, evals_here = seeding.afkmc2(eng, k, 9, chain_length=m)

    on_driver = []

    def counted(rows, centers, mind):
        on_driver.append(seeding.update_mind.__wrapped__(rows, centers, mind))
        return on_driver[-1]

    counted.__wrapped__ = seeding.update_mind
    monkeypatch.setattr(seeding, "update_mind", counted)
    with open_engine(as_source(X, chunk_rows=700), cluster, 0) as eng:
        assert eng.n_workers == 2
        trips = eng.round_trips
        there, evals_there = seeding.afkmc2(eng, k, 9, chain_length=m)
        # the first centre (the chunks' weights, then its chunk's row), the state, the masses, the draw and the
        # state's drop, then one per round
        assert eng.round_trips - trips == 6 + -(-(k - 1) // n)
    np.testing.assert_array_equal(there, here)
    # one pass for d² to the first centre, then each proposal of chain j against centres 2..j once
    assert evals_there == evals_here == len(X) + m * sum(range(0, k - 1))
    rounds = [min(n, k - j) for j in range(1, k, n)]
    assert sum(on_driver) == sum(m * b for r in rounds for b in range(r))


@pytest.mark.cluster
def test_a_sharded_model_never_passes_through_the_driver(cluster):
    """One sharded Lloyd iteration at k = 4096, d = 64 (2 MiB of centres and as much of sums) on
    2 workers: the driver's sockets carry Σ w and ||Δc||² per cluster (64 KiB) and the call, not the
    sums; the same iteration with the centres on the driver carries the sums."""
    import dask

    from dask_clust.blocks import lloyd as L
    from dask_clust.engine.combine import Rows
    from harness.scaling import DriverBytes

    rng = np.random.default_rng(0)
    X = rng.standard_normal((20_000, 64)).astype(np.float32)
    C = rng.standard_normal((4096, 64))
    with open_engine(as_source(X, chunk_rows=5000), cluster, 0) as eng:
        assert eng.n_workers == 2
        with DriverBytes() as on_driver:
            eng.reduce(L.lloyd_step, L.Prepared(C, eng.dtype))
        with eng.sharded("c", (C,)) as model:
            eng.reduce(
                L.lloyd_step,
                model.ref(),
                L.SHARDED_STEP,
                scatter=ReduceScatter(model, L.sharded_m_step, (Rows(), Rows())),
            )
            with DriverBytes() as io:
                eng.reduce(
                    L.lloyd_step,
                    model.ref(),
                    L.SHARDED_STEP,
                    scatter=ReduceScatter(model, L.sharded_m_step, (Rows(), Rows())),
                )
    assert on_driver.read > C.nbytes  # the finished sums: 8 bytes a value
    assert io.read + io.written < 2 * 4096 * 8 + 100_000, (io.read, io.written)
    with dask.config.set({"dask_clust.model-bytes": "1MiB"}):
        assert eng.shards_model(C.nbytes) and not eng.shards_model(C[:100].nbytes)


def _cells_per_label(chunk, k):
    """Per (label, cell) of the rows (label: the first feature's integer part mod k, cell: the second's mod
    k): the count, as a sparse keyed field of up to k² keys."""
    x = np.floor(chunk.x[:, :2].astype(np.float64)).astype(np.int64) % k
    keys, counts = np.unique(x[:, 0] * k + x[:, 1], return_counts=True)
    return np.int64(len(x)), (keys, counts.astype(np.int64))


def _cells_of_shard(fields, shard, params, lo):
    """Where labels lo.. live: how many cells their rows reach, and the model plus its rows' counts."""
    ((keys, counts),) = fields
    rows = keys // params - lo
    reached = np.bincount(rows, minlength=len(shard[0]))
    total = np.bincount(rows, weights=counts, minlength=len(shard[0]))
    return (shard[0] + total[:, None],), (reached,)


@pytest.mark.cluster
def test_a_held_model_keeps_a_large_combined_field_at_the_root(cluster):
    """A model on the driver (``Engine.model`` within model-bytes) runs its shard function where the step's
    fields are finished: a keyed field of ~40k (label, cell) entries never reaches the driver, only the new
    model and the small fields, and they are the bits of the same step on the model sharded, and of numpy."""
    import dask

    from dask_clust.engine.combine import KeyedSum, Rows, Scatter, Sum
    from harness.scaling import DriverBytes

    rng = np.random.default_rng(5)
    k = 512
    X = (rng.random((60_000, 2)) * k).astype(np.float32)
    start = np.zeros((k, 1))
    combine = (Sum(), Scatter(KeyedSum(rows=k)))
    got = {}
    with open_engine(as_source(X, chunk_rows=10_000), cluster, 0) as eng:
        assert eng.n_workers == 2
        with DriverBytes() as whole:
            n, (keys, _) = eng.reduce(_cells_per_label, k, (Sum(), KeyedSum()))
        for bytes_ in ("1GiB", "1"):
            with dask.config.set({"dask_clust.model-bytes": bytes_}), eng.model("cells", (start,)) as model:
                with DriverBytes() as io:
                    out = model.step(_cells_per_label, k, combine, _cells_of_shard, (Rows(),))
                got[bytes_] = (out, model.gather(), io.read)
    cells = np.floor(X.astype(np.float64)).astype(np.int64) % k
    reached = np.array([len(np.unique(cells[cells[:, 0] == i, 1])) for i in range(k)])
    for out, model, _ in got.values():
        assert out[0] == n == len(X)
        np.testing.assert_array_equal(out[1], reached)
        np.testing.assert_array_equal(model[:, 0], np.bincount(cells[:, 0], minlength=k))
    assert len(keys) == reached.sum() > 30_000
    assert whole.read > 16 * 30_000  # the keyed field to the driver: a key and a count an entry
    assert got["1GiB"][2] < whole.read / 4, (got["1GiB"][2], whole.read)


def test_every_peer_call_is_a_method_of_its_part_taking_its_fields():
    """Partition to partition, a call is a typed message (``mailbox.peer_call``), not a method's name: each
    registered type names a function of the part it reaches, whose parameters are its fields, in order."""
    import inspect

    from dask_clust.engine.backups import Backups
    from dask_clust.engine.halo import HaloExchange
    from dask_clust.engine.mailbox import PEER_CALLS
    from dask_clust.engine.partition import Partition
    from dask_clust.engine.sharded import ShardStore

    assert {c.feature for c in PEER_CALLS} == {Partition, HaloExchange, ShardStore, Backups}
    assert len(PEER_CALLS) == 12
    for cls in PEER_CALLS:
        assert getattr(cls.feature, cls.method.__name__) is cls.method, cls
        assert list(inspect.signature(cls.method).parameters)[1:] == list(cls._fields), cls


def test_a_partitions_host_answers_registered_calls_only():
    import asyncio
    import concurrent.futures
    import types

    from dask_clust.engine.backups import BackupGet, Backups
    from dask_clust.engine.host import PartitionHost

    backups = Backups.__new__(Backups)
    backups._kept = {("s", 0): [(3, {"f": np.arange(2)})]}
    part = types.SimpleNamespace(feature={Backups: backups}.__getitem__)
    host = PartitionHost.__new__(PartitionHost)
    host.parts, host.worker = {"p": part}, types.SimpleNamespace(address="tcp://here")
    host._thread = concurrent.futures.ThreadPoolExecutor(1)
    got = asyncio.run(host.call("p", BackupGet, ("s", [0], 4)))  # the newest copy before call 4
    assert got["status"] == "OK" and list(got["result"].data) == [0]
    for bad in ["backups.get", tuple, Backups]:  # a method's name, a type that is no peer call
        refused = asyncio.run(host.call("p", bad, ("s", [0], 4)))
        assert refused["status"] == "error" and "is not a partition's call" in str(refused["exception"].data)
    host._thread.shutdown()


def _members(protocol):
    """A protocol's names: its annotated attributes and its methods."""
    return set(protocol.__annotations__) | {
        n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")
    }


def test_features_and_recovery_hooks_use_only_what_their_protocols_name():
    """A partition's features reach it through ``PartitionView``, a recovery hook the partition it rebuilds
    through ``RebuiltPartition``: nothing else of theirs is used, and the partition (``Partition``, the
    driver's ``Rebuilding``) has all of it."""
    import inspect
    import re

    from dask_clust.engine import backups, halo, sharded
    from dask_clust.engine.mailbox import PartitionView, RebuiltPartition
    from dask_clust.engine.partition import Partition
    from dask_clust.engine.recovery import Rebuilding

    view, rebuilt = _members(PartitionView), _members(RebuiltPartition)
    for feature in (backups.Backups, halo.HaloExchange, sharded.ShardStore):
        used = set(re.findall(r"(?:self\._part|\bpart)\.(\w+)", inspect.getsource(feature)))
        assert used and used <= view, (feature, used - view)
    for hook in (backups.restore_state, sharded.restore_shards):
        used = set(re.findall(r"\bpart\.(\w+)", inspect.getsource(hook)))
        assert used and used <= rebuilt, (hook, used - rebuilt)
    for cls, members in ((Partition, view), (Rebuilding, rebuilt)):
        assigned = set(re.findall(r"self\.(\w+) =", inspect.getsource(cls.__init__)))
        assert all(hasattr(cls, m) or m in assigned for m in members), cls


def test_every_combine_has_the_combine_protocol():
    import inspect

    from dask_clust.engine import combine

    made = {
        combine.Scatter: combine.Scatter(),
        combine.Top: combine.Top(2),
        combine.RowTop: combine.RowTop(2),
        combine.Fold: combine.Fold(0.0),
    }
    classes = [
        c
        for _, c in inspect.getmembers(combine, inspect.isclass)
        if c.__module__ == combine.__name__ and hasattr(c, "lift") and c not in (combine.Combine, combine.Accumulates)
    ]
    instances = {c: made.get(c) or c() for c in classes if not c.__name__.startswith("_")}
    assert len(instances) >= 11 and all(isinstance(i, combine.Combine) for i in instances.values())
    accumulating = {c for c, i in instances.items() if isinstance(i, combine.Accumulates)}
    assert accumulating == {combine.Sum, combine.Scatter}


class _Moments(NamedTuple):
    sums: np.ndarray
    weight: float


def _named_moments(chunk, params) -> _Moments:
    return _Moments(chunk.w @ chunk.x.astype(np.float64), float(chunk.w.sum()))


def _plain_moments(chunk, params):
    return chunk.w @ chunk.x.astype(np.float64), float(chunk.w.sum())


def test_a_steps_fields_come_back_as_its_declared_type():
    """Issue #57: ``reduce`` gives a step's combined fields as the NamedTuple its return annotation names (the
    same values as the plain tuple of an unannotated step); ``at_root`` gives its own result."""
    X = np.arange(60, dtype=np.float64).reshape(20, 3)
    with open_engine(as_source(X, None, chunk_rows=6), "in-process", 0) as engine:
        named = engine.reduce(_named_moments)
        plain = engine.reduce(_plain_moments)
        rooted = engine.reduce(_named_moments, at_root=lambda fields, params: fields[1])
    assert type(named) is _Moments and type(plain) is tuple
    np.testing.assert_array_equal(named.sums, X.sum(axis=0))
    assert named.weight == 20.0 and np.array_equal(plain[0], named.sums) and rooted == 20.0
