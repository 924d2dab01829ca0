"""Rule 4: inputs streamed from their source on every pass give the same model; what streaming counts and
refuses before any work."""

import contextlib
import os

import numpy as np
import pytest

import dask_clust
from dask_clust.engine import as_source

# every test here starts processes (a cluster, its workers, a kernel): not in the fast tier
pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("where", ["in-process", "cluster"])
def test_streaming_gives_the_same_model(cluster, where):
    """Rule 4: data streamed from its source on every pass gives the model persisted data gives, with the
    fit's state in memory or in local files between calls."""
    import dask

    from dask_clust.datasets import make_blobs

    X, _ = make_blobs(6000, 5, 8, chunks=1000, random_state=4)
    w = np.linspace(0.5, 2.0, 6000)
    client = "in-process" if where == "in-process" else cluster
    held = dask_clust.fit(X, n_clusters=8, random_state=0, client=client, sample_weight=w)
    for files in (False, True):  # the state in memory, or in the workers' files between calls
        with dask.config.set({"dask_clust.stream": True, "dask_clust.state-files": files}):
            streamed = dask_clust.fit(X, n_clusters=8, random_state=0, client=client, sample_weight=w)
        assert streamed.engine_["streaming"] and not held.engine_["streaming"]
        assert streamed.engine_["state_files"] == files
        np.testing.assert_array_equal(streamed.cluster_centers_, held.cluster_centers_)
        assert streamed.n_iter_ == held.n_iter_ and streamed.objective_ == held.objective_


def test_stream_auto_switch_and_small_loaders(input_chunks):
    import dask

    from dask_clust.datasets import make_blobs
    from dask_clust.engine.data import ArraySource
    from dask_clust.engine.streaming import loaders, should_stream

    X, _ = make_blobs(64_000, 4, 3, chunks=1000, random_state=0)
    src = as_source(X)
    assert src.n_chunks == 64
    assert should_stream(src, memory_bytes=src.nbytes)  # data > half the memory: stream
    assert not should_stream(src, memory_bytes=4 * src.nbytes)
    assert not should_stream(as_source(X.compute()), memory_bytes=1)  # in driver memory already
    assert isinstance(as_source(X.compute()), ArraySource)
    with dask.config.set({"dask_clust.stream": False}):
        assert not should_stream(src, memory_bytes=1)
    # each loader carries its own chunk's graphs only, not the whole input's
    import pickle

    sizes = [len(pickle.dumps(b)) for b in loaders(src, range(src.n_chunks))]
    assert max(sizes) < 4 * min(sizes) and max(sizes) < 20_000


def test_streaming_counts_the_fits_state_and_refuses_what_cannot_fit(input_chunks, monkeypatch):
    """Issue #20: a fit's per-row state (declared by its algorithm) stays in memory while the data streams,
    so it counts toward ``stream-fraction``; state that alone exceeds it is refused before any work, in one
    line naming the algorithm (vargmm: 12 C' + 4 = 64 B per row at C' = 5; before, it pushed every worker past
    95 % and the fit died after 500 s)."""
    import dask

    from dask_clust.datasets import make_blobs
    from dask_clust.engine.ops import Engine
    from dask_clust.engine.streaming import should_stream
    from dask_clust.errors import InputError

    X, _ = make_blobs(64_000, 4, 3, chunks=8000, random_state=0)  # 16 B of float32 data per row
    src = as_source(X)
    memory = 4 * src.nbytes  # half of it holds the data alone: persisted without state
    assert not should_stream(src, memory, (0, "kmeans"))
    assert should_stream(src, memory, (24, "nmbatch"))  # 16 + 24 B per row > half
    with pytest.raises(
        InputError,
        match=r"^x keeps 40 B of state per row: 0\.00256 GB for 64,000 rows, over "
        r"stream-fraction = 0\.5 of the 0\.0041 GB of memory it runs in; add",
    ):
        should_stream(src, memory + 96, (40, "x"))
    reduces = []
    monkeypatch.setattr(Engine, "reduce", lambda *a, **k: reduces.append(a) or pytest.fail("work before refusing"))
    with (
        dask.config.set({"dask_clust.stream-fraction": 1e-6}),
        pytest.raises(
            InputError,
            match=r"^algo='vargmm' keeps 64 B of state per row: .* GB for 64,000 rows, .*; add workers or memory, or "
            r"fit on a coreset \(algo='kmeans', algo='vcgmm' with coreset_size=\.\.\.\), or with an algorithm "
            r"that keeps its state in the workers' local files \('kmeans', 'nmbatch'\)$",
        ),
    ):
        dask_clust.fit(X, algo="vargmm", n_clusters=3, client="in-process")
    assert reduces == []


def test_streaming_is_refused_when_a_workers_chunks_cannot_fit_its_limit():
    """Issue #20: a streaming worker thread holds a chunk and the input block(s) it is cut from (a zarr chunk
    is decoded whole) while it computes it; with its share of the state, the process (``WORKER_BASE``) and a
    streamed pass's own buffers (``STREAM_PASS``), that must stay under the nanny's terminate fraction of its
    limit, or the nanny restarts it in every pass (measured: 32 MiB chunks on 512 MiB workers, 3 restarts).
    800 MiB workers, 6 GiB of 32-d float32, kmeans (Lloyd's 16 B of state per row): refused before any work,
    naming the worker and what to change, unless both the chunks and the input's blocks are 32 MiB and the fit
    keeps no 64 MiB of buffers per thread (vc-GMM's search buffers are about that). The next chunk's blocks
    are read ahead only where that keeps the worker under distributed's pause threshold (0.8 of its limit):
    here never, on 1,200 MiB workers yes (counted then)."""
    from dask_clust.engine.data import Source
    from dask_clust.engine.streaming import STREAM_PASS, WORKER_BASE, streaming_memory
    from dask_clust.errors import InputError

    rows = 50_331_648
    share = rows * 16 / 3
    for mib, chunk_mib, block_mib, buffer_mib, refused in (
        (800, 128, 32, 0, True),
        (800, 32, 128, 0, True),
        (800, 32, 32, 64, True),
        (800, 32, 32, 0, False),
        (1200, 32, 32, 0, False),
    ):
        limit = mib << 20
        worker = {"memory_limit": limit, "nthreads": 1, "metrics": {"memory": 90 << 20}}
        workers = {f"tcp://w{i}": worker for i in range(3)}
        per = (chunk_mib << 20) // 128
        src = Source(rows, 32, np.float32, np.r_[np.arange(0, rows, per), rows], False)
        src.input_chunk_bytes = block_mib << 20
        decode = max(chunk_mib, block_mib) << 20
        need = WORKER_BASE + STREAM_PASS + (chunk_mib << 20) + decode + (buffer_mib << 20) + share
        ahead = need + decode <= 0.8 * limit
        assert ahead == (mib == 1200)
        need += decode if ahead else 0
        assert (need > 0.95 * limit) == refused
        state = (16, "algo='kmeans'", buffer_mib << 20)
        if refused:
            buffers = rf" \+ {buffer_mib} MiB of buffers" if buffer_mib else ""
            with pytest.raises(
                InputError,
                match=rf"^algo='kmeans' streams chunks of {chunk_mib} MiB cut from input "
                rf"blocks of up to {block_mib} MiB: worker tcp://w0 "
                rf"would need about {need / 2**20:.0f} MiB \(1 thread\(s\) x both"
                rf"{buffers}, .* of its 800 MiB limit",
            ):
                streaming_memory(src, state, workers)
        else:
            assert streaming_memory(src, state, workers) == int(need)


@pytest.fixture
def store(tmp_path):
    """A zarr store of 12,000 × 6 float32 rows in stored blocks of 3,000 rows, and its rows."""
    import dask.array as da

    X = np.random.default_rng(5).normal(size=(12_000, 6)).astype(np.float32)
    path = str(tmp_path / "x.zarr")
    da.from_array(X, chunks=(3000, 6)).to_zarr(path)
    return path, X


@contextlib.contextmanager
def _streamed(path, keep=False, threads=2, rows=1100):
    """An in-process engine streaming ``path`` in chunks of ``rows`` rows (not aligned with its blocks);
    without ``keep``, no memory to keep any of them."""
    import dask

    import dask_clust.engine.streaming as streaming
    from dask_clust.engine import open_engine

    with dask.config.set({"dask_clust.stream": True, "dask_clust.in-process-threads": threads}):
        src = as_source(path, chunk_rows=rows)
        saved = streaming.KEEP_FRACTION
        streaming.KEEP_FRACTION = saved if keep else 0.0
        try:
            with open_engine(src, "in-process") as engine:
                yield engine, src
        finally:
            streaming.KEEP_FRACTION = saved


def _reads_rows(chunk, _):
    return (np.float64(chunk.x.sum(dtype=np.float64)),)


def _reads_nothing(chunk, _):
    return (np.int64(chunk.n),)


@pytest.mark.parametrize("threads", [1, 2])
def test_each_stored_block_is_decoded_once_per_pass_and_only_when_read(store, threads):
    """Rule 4: chunks of 1,100 rows cut from stored blocks of 3,000 (most chunks straddle two blocks, most
    blocks serve four chunks) decode each block once per pass: the first pass reads exactly the store's bytes,
    and so does every pass after it; a step that reads no rows reads nothing, and a take reads only the chunk
    holding its rows (here one block). Each result against numpy's."""
    path, X = store
    with _streamed(path, threads=threads) as (engine, src):
        assert src.n_chunks == 11 and engine.backend.streaming
        assert engine.bytes_read() == X.nbytes  # the summary pass
        np.testing.assert_allclose(engine.summary.mean, X.mean(axis=0, dtype=np.float64), rtol=1e-12)
        (total,) = engine.reduce(_reads_rows)
        assert total == pytest.approx(X.sum(dtype=np.float64), rel=1e-12)
        assert engine.bytes_read() == 2 * X.nbytes
        (n,) = engine.reduce(_reads_nothing)
        assert n == len(X) and engine.bytes_read() == 2 * X.nbytes
        np.testing.assert_array_equal(engine.take([7701, 8000, 7701]), X[[7701, 8000, 7701]])  # chunk 7
        assert engine.bytes_read() == 2 * X.nbytes + X[6000:9000].nbytes


def test_a_streaming_partition_keeps_what_fits_its_memory(store):
    """Rule 4, what fits stays: with the memory to keep them, a streamed engine's chunks are read by the first
    pass only; with none (``KEEP_FRACTION`` = 0), every pass reads the store again. Same results either way."""
    path, X = store
    for keep, passes in ((True, 1), (False, 3)):
        with _streamed(path, keep=keep) as (engine, _):
            sums = [engine.reduce(_reads_rows)[0] for _ in range(2)]
            assert sums[0] == sums[1] == pytest.approx(X.sum(dtype=np.float64), rel=1e-12)
            assert engine.bytes_read() == passes * X.nbytes


def test_kmeans_parallel_draws_each_round_in_the_pass_that_updates_the_potential(store, monkeypatch):
    """k-means||: each round's draw rides on the pass that adds the last round's candidates to the potential;
    the rows it returns hold every row the separate draw keeps, and the centres are those of the separate draw
    (forced here by a margin no key passes), bit for bit. Streamed, a fit makes its summary pass, one pass per
    round and one for the candidates' weights, then Lloyd's iterations and the final pass, and reads one block
    for its first centre."""
    import dask

    from dask_clust.blocks import seeding
    from dask_clust.engine import streaming
    from dask_clust.engine.ops import Engine

    path, X = store
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(X))
    steps = []
    reduce = Engine.reduce
    monkeypatch.setattr(Engine, "reduce", lambda self, step, *a, **k: steps.append(step) or reduce(self, step, *a, **k))
    monkeypatch.setattr(streaming, "KEEP_FRACTION", 0.0)  # no chunk kept: every pass reads the store
    with dask.config.set({"dask_clust.stream": True, "dask_clust.chunk-bytes": "26400B"}):
        fused = dask_clust.fit(path, n_clusters=12, max_iter=4, random_state=3, sample_weight=w, client="in-process")
    rounds = steps.count(seeding._update_and_draw)
    assert seeding._oversample not in steps and rounds == 5
    needed = 1 + rounds + 1 + fused.n_iter_ + 1
    assert needed + 0.25 <= fused.engine_["passes"] <= needed + 0.5  # + the one or two blocks of a chunk
    monkeypatch.setattr(seeding, "KEY_MARGIN", np.inf)
    separate = dask_clust.fit(X, n_clusters=12, max_iter=4, random_state=3, sample_weight=w, client="in-process")
    assert steps.count(seeding._oversample) == 5
    np.testing.assert_array_equal(fused.cluster_centers_, separate.cluster_centers_)
    assert fused.objective_ == separate.objective_


def test_kmeans_parallel_first_round_carries_the_engines_first_pass(store, monkeypatch):
    """Unweighted, the first centre's chunk is chosen from the chunks' sizes and read alone before the engine's
    first pass, and k-means||'s first round carries that pass: a streamed fit makes one pass per round, one
    for the candidates' weights, Lloyd's iterations and the final pass (and the first centre's chunk); the
    centres are those of a fit whose first pass ran alone first, bit for bit, and of unit sample weights."""
    import dask

    from dask_clust.engine import streaming
    from dask_clust.engine.ops import Engine

    path, X = store
    kw = dict(n_clusters=12, max_iter=4, tol=0, random_state=3, client="in-process")
    monkeypatch.setattr(streaming, "KEEP_FRACTION", 0.0)
    with dask.config.set({"dask_clust.stream": True, "dask_clust.chunk-bytes": "26400B"}):
        carried = dask_clust.fit(path, **kw)
        monkeypatch.setattr(Engine, "__init__", _opening_with_first_pass(Engine.__init__))
        alone = dask_clust.fit(path, **kw)
    rounds = 5
    assert rounds + 1 + 4 + 1 <= carried.engine_["passes"] <= rounds + 1 + 4 + 1 + 0.5
    assert alone.engine_["passes"] == carried.engine_["passes"] + 1
    ones = dask_clust.fit(X, sample_weight=np.ones(len(X)), **kw)
    for other in (alone, ones):
        np.testing.assert_array_equal(carried.cluster_centers_, other.cluster_centers_)
        assert carried.objective_ == other.objective_


def test_a_streamed_gather_is_sized_by_the_smallest_workers_memory_and_the_drivers_budget():
    """Rows gathered for minibatch's steps meet at the root partition's worker: streamed, a gather holds at
    most 5 % of the smallest worker's memory (and 256 MiB, the driver's), and at most the steps left; in
    memory, 64 MiB and 64 steps."""
    from types import SimpleNamespace

    from dask_clust.blocks.batches import steps_per_gather

    def engine(streaming, *memory):
        return SimpleNamespace(
            n_features=32,
            n_samples=1000,
            row_bytes=32 * 4,  # dense float32 rows
            streaming=streaming,
            partitions=lambda: [(1, m << 20) for m in memory],
        )

    step = 1024 * 32 * 4  # a batch of 1,024 float32 rows of 32 features: 128 KiB
    assert steps_per_gather(engine(True, 900, 700), 1024, 10**6) == int(0.05 * (700 << 20)) // step == 280
    assert steps_per_gather(engine(True, 64 << 10), 1024, 10**6) == (256 << 20) // step == 2048
    assert steps_per_gather(engine(True, 700), 1024, 100) == 100
    assert steps_per_gather(engine(False, 700), 1024, 10**6) == 64
    assert steps_per_gather(engine(True, 1), 1024, 10**6) == 1


def test_streamed_nmbatch_reads_the_store_twice(store, monkeypatch):
    """nmbatch's first call builds its nesting-order copy of the rows and carries the engine's first pass, its
    batches read that copy, and the final QE reads the store again: two passes, the bits of a fit whose first
    pass ran alone first."""
    import dask

    from dask_clust.engine import streaming
    from dask_clust.engine.ops import Engine

    path, _ = store
    kw = dict(algo="nmbatch", n_clusters=6, batch_size=500, random_state=2, client="in-process")
    monkeypatch.setattr(streaming, "KEEP_FRACTION", 0.0)
    with dask.config.set({"dask_clust.stream": True, "dask_clust.chunk-bytes": "26400B"}):
        carried = dask_clust.fit(path, **kw)
        monkeypatch.setattr(Engine, "__init__", _opening_with_first_pass(Engine.__init__))
        alone = dask_clust.fit(path, **kw)
    assert carried.engine_["passes"] == 2.0 and alone.engine_["passes"] == 3.0
    np.testing.assert_array_equal(carried.cluster_centers_, alone.cluster_centers_)
    assert carried.objective_ == alone.objective_


def _opening_with_first_pass(init):
    """``Engine.__init__`` followed by the engine's first pass, as every engine opened before calls could
    carry it."""

    def opening(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.summary  # noqa: B018

    return opening


def test_streamed_minibatch_holds_a_window_of_draws_from_one_pass(store, monkeypatch):
    """minibatch's uniform batches touch every stored block, so on a streamed store the workers draw a window
    of about N / b steps' rows in one pass (which carries the engine's first pass and the seeding sample) and
    hold them in their files: 40 steps of 64 rows of 12,000 take one window, so the fit makes two passes (that
    one, the final QE); 400 steps take three windows, three passes and the final QE. In memory, gathers of 4
    steps (takes) give the same models, bit for bit, as they do streamed with the state kept out of files
    (each a pass)."""
    import dask

    from dask_clust.blocks import batches
    from dask_clust.engine import streaming

    path, _ = store
    kw = dict(algo="minibatch", n_clusters=6, batch_size=64, max_no_improvement=None, random_state=4)
    monkeypatch.setattr(streaming, "KEEP_FRACTION", 0.0)
    fits = {}
    for steps, passes in ((40, 2.0), (400, 4.0)):
        with dask.config.set({"dask_clust.chunk-bytes": "26400B", "dask_clust.stream": True}):
            streamed = dask_clust.fit(path, client="in-process", max_iter=steps, **kw)
        assert streamed.engine_["streaming"] and streamed.engine_["state_files"]
        assert streamed.engine_["passes"] == passes
        fits[steps] = streamed
    monkeypatch.setattr(batches, "MOST_STEPS", 4)
    for config in ({"dask_clust.stream": False}, {"dask_clust.stream": True, "dask_clust.state-files": False}):
        with dask.config.set({"dask_clust.chunk-bytes": "26400B", **config}):
            for steps, streamed in fits.items():
                other = dask_clust.fit(path, client="in-process", max_iter=steps, **kw)
                assert other.engine_["state_files"] is False
                np.testing.assert_array_equal(streamed.cluster_centers_, other.cluster_centers_)
                assert streamed.objective_ == other.objective_ and streamed.n_iter_ == other.n_iter_ == steps


def test_state_in_files_maps_back_what_was_written(tmp_path):
    """A chunk's state between calls (``rowfiles``): arrays (also in a dict of the state) come back mapped, so
    an in-place write lasts without being written again; an array replaced, or kept under another name while
    its file's name gets a new array (Lloyd's spare labels), is written anew, never over a mapped file; other
    values come back as they were; files of arrays no longer in the state are removed."""
    from dask_clust.engine.rowfiles import state_from_files, state_to_files

    where = str(tmp_path / "c")
    labels, mind = np.arange(5, dtype=np.int32), np.linspace(0, 1, 5)
    state_to_files({"labels": labels, "k-means||": {"mind": mind, "phi": 2.5, "pending": []}}, where, {})
    state, mapped = state_from_files(where)
    assert state["k-means||"]["phi"] == 2.5 and state["k-means||"]["pending"] == []
    np.testing.assert_array_equal(state["labels"], labels)
    state["k-means||"]["mind"][2] = -1.0  # in place, through the mapping
    state["spare"], state["labels"] = state["labels"], labels[::-1].copy()
    state_to_files(state, where, mapped)
    del state, mapped
    again, _ = state_from_files(where)
    np.testing.assert_array_equal(again["labels"], labels[::-1])
    np.testing.assert_array_equal(again["spare"], labels)
    np.testing.assert_array_equal(again["k-means||"]["mind"], [0, 0.25, -1.0, 0.75, 1.0])
    assert len([f for f in os.listdir(where) if f.endswith(".npy")]) == 3


def test_state_in_files_keeps_csr_rows_as_mapped_arrays(tmp_path):
    """nmbatch keeps a chunk's CSR rows in nesting order in its state: between calls they live as their three
    arrays' files, come back as the same matrix over mapped arrays, and are not written again while the state
    holds the matrix it was given (a pickle of the rows on every call would cost a pass over them a step)."""
    from scipy import sparse

    from dask_clust.engine.rowfiles import state_from_files, state_to_files

    where = str(tmp_path / "c")
    rows = sparse.random(40, 30, density=0.2, format="csr", dtype=np.float32, random_state=0)
    state_to_files({"nmbatch": {"x": rows, "b": 3}}, where, {})
    files = set(os.listdir(where))
    state, mapped = state_from_files(where)
    x = state["nmbatch"]["x"]
    assert sparse.issparse(x) and x.format == "csr" and x.shape == rows.shape and x.dtype == rows.dtype
    np.testing.assert_array_equal(x.toarray(), rows.toarray())
    state["nmbatch"]["b"] = 4
    state_to_files(state, where, mapped)
    assert set(os.listdir(where)) == files  # the same three array files: nothing written anew
    again, mapped = state_from_files(where)
    assert again["nmbatch"]["b"] == 4
    np.testing.assert_array_equal(again["nmbatch"]["x"].toarray(), rows.toarray())
    again["nmbatch"]["x"] = rows[::2]  # replaced: written anew, the old files removed
    state_to_files(again, where, mapped)
    del again, mapped
    last, _ = state_from_files(where)
    np.testing.assert_array_equal(last["nmbatch"]["x"].toarray(), rows[::2].toarray())
    assert len(set(os.listdir(where)) & files) == 1  # only the manifest is left of the first files


def test_state_directories_of_ended_processes_are_removed(tmp_path):
    """A partition's state directory is named after its process; a new one removes those of processes that
    have ended (a killed worker leaves its own), never a live process's."""
    import subprocess
    import sys

    from dask_clust.engine.rowfiles import remove_dead_states, state_directory

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    dead = tmp_path / f"dask_clust-state-{ended.pid}-abc"
    (dead / "3").mkdir(parents=True)
    live = tmp_path / f"dask_clust-state-{os.getppid()}-abc"
    live.mkdir()
    other = tmp_path / "dask_clust-state-notapid"
    other.mkdir()
    mine = state_directory(str(tmp_path))
    assert os.path.basename(mine).startswith(f"dask_clust-state-{os.getpid()}-")
    assert not dead.exists() and live.exists() and other.exists() and os.path.isdir(mine)
    remove_dead_states(str(tmp_path))
    assert os.path.isdir(mine) and live.exists()


@pytest.mark.parametrize("rows", ["store", "csr"])
@pytest.mark.parametrize("algo", ["kmeans", "nmbatch"])
def test_a_streamed_fit_with_its_state_in_files_gives_the_same_model(store, algo, rows):
    """Rule 4: kmeans and nmbatch, whose state only their steps touch, keep it in local files between calls
    when it would not fit (forced here by ``state-files``) and give the bits of the fit that keeps it in
    memory; from a zarr store, and from a dask array of CSR blocks (nmbatch's state then holds each chunk's
    rows in nesting order as a CSR matrix, kept in the files as its arrays: ``state_to_files``)."""
    import dask
    import dask.array as da

    from dask_clust.datasets import make_documents

    if rows == "store":
        X, chunk_bytes = store[0], "26400B"
    else:
        docs, _ = make_documents(3000, 600, 12, random_state=1)
        X, chunk_bytes = da.from_array(docs, chunks=(500, docs.shape[1]), asarray=False), "16KiB"
    kw = dict(algo=algo, n_clusters=6, random_state=2, client="in-process")
    with dask.config.set({"dask_clust.chunk-bytes": chunk_bytes, "dask_clust.stream": False}):
        held = dask_clust.fit(X, **kw)
    filing = {"dask_clust.chunk-bytes": chunk_bytes, "dask_clust.stream": True, "dask_clust.state-files": True}
    with dask.config.set(filing):
        filed = dask_clust.fit(X, **kw)
    assert filed.engine_["state_files"] and filed.engine_["streaming"] and not held.engine_["state_files"]
    assert held.engine_["chunks"] > 1
    np.testing.assert_array_equal(filed.cluster_centers_, held.cluster_centers_)
    assert filed.objective_ == held.objective_ and filed.n_iter_ == held.n_iter_


def test_state_goes_to_files_where_it_would_pause_a_streaming_worker():
    """kmeans's 16 B of state per row, streamed from 23.5 M rows on two 700 MiB workers: under stream-fraction
    of the cluster's memory, but with it a worker would pass distributed's pause threshold (0.8 of its limit;
    measured: 87 % and 11 "Pausing worker" events), so it goes to the workers' files; on 900 MiB workers it
    stays in memory, and an algorithm that does not allow files keeps it there either way."""
    from dask_clust.engine.data import Source
    from dask_clust.engine.streaming import _worker_need, state_in_files

    class Streamed(Source):  # a dask source, as far as the decision goes
        pass

    rows = 23_500_000
    src = Streamed(rows, 32, np.float32, np.r_[np.arange(0, rows, 262_144), rows], False)
    src.input_chunk_bytes = 30 << 20
    for mib, files in ((700, True), (900, False)):
        w = {"memory_limit": mib << 20, "nthreads": 1, "metrics": {"memory": 200 << 20}}
        workers = {"a": w, "b": w}
        assert src.n_samples * 16 < 0.5 * 2 * (mib << 20)
        assert (_worker_need(src, (16, "k", 0, True), w, 2)[0] > 0.8 * (mib << 20)) == files
        assert state_in_files(src, 2 * (mib << 20), (16, "kmeans", 0, True), workers) == files
        assert not state_in_files(src, 2 * (mib << 20), (16, "vcgmm", 0, False), workers)


def test_row_files_load_from_many_threads_with_every_header_parsed_under_one_lock(tmp_path, monkeypatch):
    """Issue #53: numpy parses a .npy header with ast.literal_eval, not thread-safe on CPython 3.11.0-3.11.7
    (gh-106905; it failed a resume on a fresh clone once). A checkpoint's row files and a partition's state
    files are read from a partition's threads at once: 64 of each loaded 8 times over from 16 threads, every
    header parse seen holding the lock (the race itself is too rare to provoke), every array as written."""
    import ast
    from concurrent.futures import ThreadPoolExecutor

    from dask_clust import outputs
    from dask_clust.engine.rowfiles import state_from_files, state_to_files

    rng = np.random.default_rng(3)
    written = {}
    for i in range(64):
        arrays = {"labels": rng.integers(0, 9, 40 + i).astype(np.int32), "dist": rng.random((40 + i, 3))}
        np.savez(tmp_path / f"rows-{i}.npz", **arrays)
        state_to_files({"lloyd": arrays}, str(tmp_path / f"state-{i}"), {})
        written[i] = arrays
    parse = ast.literal_eval
    unlocked = []

    def checked(text):
        if not outputs.NPY_HEADER.locked():
            unlocked.append(text)
        return parse(text)

    monkeypatch.setattr(ast, "literal_eval", checked)

    def load(i):
        rows = outputs.stored_arrays(tmp_path / f"rows-{i}.npz")
        state, _ = state_from_files(str(tmp_path / f"state-{i}"))
        return i, rows, {k: np.array(v) for k, v in state["lloyd"].items()}

    with ThreadPoolExecutor(16) as pool:
        loaded = list(pool.map(load, list(range(64)) * 8))
    assert not unlocked
    for i, rows, state in loaded:
        for got in (rows, state):
            assert set(got) == {"labels", "dist"}
            for name, want in written[i].items():
                np.testing.assert_array_equal(got[name], want)
                assert got[name].dtype == want.dtype
