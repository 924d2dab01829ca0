"""Checkpoint and resume (issue #20): a fit killed at any moment continues from its last checkpoint to the
bits of the uninterrupted fit; a checkpoint of other data or parameters is refused, never replaced."""

import contextlib
import json
import os
import subprocess
import sys
import threading
import time

import dask
import numpy as np
import pytest

import dask_clust
from dask_clust import InputError, StopFit
from dask_clust.checkpoint import INDEX
from dask_clust.errors import InvalidParameterError

# 30 iterations each (tol=0: no early stop); vc-GMM on a coreset, var-GMM-S on every row
FITS = {
    "kmeans": {"init": "random", "tol": 0.0},
    "vcgmm": {"tol": 0.0, "coreset_size": 3000},
    "vargmm": {"tol": 0.0},
    "nmbatch": {"tol": 0.0, "batch_size": 500},
    "vrkm": {"tol": 0.0, "epoch_size": 0.05},
    "minibatch": {"tol": 0.0, "max_no_improvement": None, "batch_size": 500},
    "sbe": {"batch_size": 200, "eval_every": 4},
}
LENGTH = {"vrkm": "max_epochs", "sbe": "omaxit"}

_DRIVER = """
import os, signal, sys
import dask, numpy as np
import dask_clust
dask.config.set({"dask_clust.min-chunk-bytes": "1KiB"})
X, algo, path, kill_at, kw = np.load(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), eval(sys.argv[5])

def die(record):
    if record["iteration"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

dask_clust.fit(X, algo, 24, random_state=3, max_iter=30, client="in-process", checkpoint=path, checkpoint_every=4,
               callback=die, **kw)
"""


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(0).random((12_000, 5)).astype(np.float32)


def _fit(X, algo, **kw):
    return dask_clust.fit(X, algo, 24, **{"random_state": 3, LENGTH.get(algo, "max_iter"): 30, **FITS[algo], **kw})


def assert_same_model(a, b, iterations=30):
    assert a.n_iter_ == b.n_iter_ == iterations
    assert np.array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.objective_ == b.objective_ and a.n_distance_evals_ == b.n_distance_evals_
    strip = lambda h: json.dumps([{k: v for k, v in r.items() if k != "wall_s"} for r in h])  # noqa: E731  (NaN)
    assert strip(a.history_) == strip(b.history_)
    assert a.extras_.get("sigma2_") == b.extras_.get("sigma2_")


@pytest.mark.cluster
@pytest.mark.parametrize("algo", ["kmeans", "vcgmm"])
def test_a_killed_driver_resumes_to_the_uninterrupted_bits(tmp_path, data, algo):
    """The driver is SIGKILLed in iteration 14 of 30 (checkpoints every 4: the last is after 12); the same call
    with resume= ends with the uninterrupted model: centres, objective, evaluations and every history record."""
    np.save(tmp_path / "X.npy", data)
    path = tmp_path / "ck"
    run = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(tmp_path / "X.npy"), algo, str(path), "14", repr(FITS[algo])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == -9, run.stderr[-2000:]
    with open(path / INDEX) as f:
        assert json.load(f)["iteration"] == 12
    calls = []
    resumed = _fit(data, algo, client="in-process", resume=path, callback=calls.append)
    assert [c["iteration"] for c in calls] == list(range(13, 31))  # only the iterations the kill lost ran again
    assert_same_model(resumed, _fit(data, algo, client="in-process"))


def test_every_resumable_algorithm_is_tested():
    from dask_clust import algorithms  # (a submodule: imported by a fit, which this test need not follow)

    assert set(algorithms.resumable()) == set(FITS)


@pytest.mark.cluster
@pytest.mark.parametrize(
    "algo,sharded",
    [
        ("kmeans", False),
        ("kmeans", True),
        ("vargmm", False),
        ("vargmm", True),
        ("nmbatch", False),
        ("vrkm", False),
        ("minibatch", False),
        ("sbe", False),
    ],
)
def test_a_checkpoint_written_by_workers_resumes_anywhere(tmp_path, data, cluster, algo, sharded):
    """On a cluster the per-row state (Lloyd's labels, var-GMM-S's K^(n), nmbatch's labels, distances and
    bounds) is written by the workers holding the rows, and sharded centres are gathered; a fit stopped
    after iteration 9 there continues in this process, or on the cluster with the model sharded, to the
    uninterrupted bits."""
    path = tmp_path / "ck"

    def stop(record):
        if record["iteration"] == 9:
            raise StopFit

    with dask.config.set({"dask_clust.model-bytes": "256B" if sharded else "64MiB"}):
        _fit(data, algo, client=cluster, checkpoint=path, checkpoint_every=100, callback=stop)
    generation = path / json.load(open(path / INDEX))["generation"]
    if algo in ("kmeans", "vargmm", "nmbatch"):  # the others keep no per-row state across iterations
        assert len(os.listdir(generation / "rows")) > 4  # one file per chunk
    with dask.config.set({"dask_clust.model-bytes": "256B"}):
        resumed = _fit(data, algo, client=cluster if not sharded else "in-process", checkpoint=path)
    whole = _fit(data, algo, client="in-process")
    assert_same_model(resumed, whole, whole.n_iter_)
    assert whole.n_iter_ > 12


@pytest.mark.parametrize(
    "model,sharded",
    [(dict(covariance_type="diag"), False), (dict(covariance_type="tied-spherical"), False),
     (dict(covariance_type="diag"), True), (dict(covariance_type="full"), False),
     (dict(covariance_type="tied"), False)],
)  # fmt: skip
def test_a_mixture_resumes_to_the_uninterrupted_bits(tmp_path, data, model, sharded):
    """A mixture with learned weights keeps its σ² and π in the checkpoint beside the means, its K^(n)'s costs
    (−ℓ, of either sign) in the rows files: a fit stopped after iteration 9 continues to the uninterrupted
    bits, weights and variances included; with the model sharded, its shards start from the checkpoint's."""
    path = tmp_path / "ck"
    settings = dask.config.set({"dask_clust.model-bytes": "256B"}) if sharded else contextlib.nullcontext()

    def stop(record):
        if record["iteration"] == 9:
            raise StopFit

    kw = dict(client="in-process", weights="learned", **model)
    with settings:
        _fit(data, "vargmm", checkpoint=path, checkpoint_every=3, callback=stop, **kw)
        calls = []
        resumed = _fit(data, "vargmm", checkpoint=path, callback=calls.append, **kw)
    assert calls[0]["iteration"] == 10
    whole = _fit(data, "vargmm", **kw)
    assert_same_model(resumed, whole, whole.n_iter_)
    for name in ("weights_", "variances_"):
        np.testing.assert_array_equal(resumed.extras_[name], whole.extras_[name])
    assert whole.n_iter_ > 12


def test_a_finished_checkpoint_gives_the_model_without_iterating(tmp_path, data):
    path = tmp_path / "ck"
    first = _fit(data, "kmeans", client="in-process", checkpoint=path)
    calls = []
    again = _fit(data, "kmeans", client="in-process", checkpoint=path, callback=calls.append)
    assert calls == [] and [n for n in os.listdir(path) if n.startswith("it-")] == [
        json.load(open(path / INDEX))["generation"]
    ]
    assert_same_model(first, again)


def test_a_failed_write_keeps_the_last_checkpoint(tmp_path, data, monkeypatch):
    """A checkpoint write that fails part-way (the disk full) leaves the previous one whole and nothing else, and
    says so in one line (issue #35: a raw OSError ended the fit)."""
    path = tmp_path / "ck"
    real, writes = np.savez, []

    def savez(f, **arrays):  # the second checkpoint fails after its rows are written, at its arrays
        writes.extend([1] if getattr(f, "name", "").endswith("arrays.npz") else [])
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        real(f, **arrays)

    monkeypatch.setattr(np, "savez", savez)
    with pytest.raises(
        InputError,
        match=r"^checkpoint=\S+ck: no space left on its device writing the checkpoint after "
        r"iteration 10 \(the last one took \d+\.\d MiB\); the checkpoint after "
        r"iteration 5 is intact: free space and resume from it$",
    ):
        _fit(data, "vcgmm", client="in-process", checkpoint=path, checkpoint_every=5)
    monkeypatch.setattr(np, "savez", real)
    index = json.load(open(path / INDEX))
    assert index["iteration"] == 5 and sorted(os.listdir(path)) == sorted([INDEX, index["generation"]])
    assert_same_model(_fit(data, "vcgmm", client="in-process", resume=path), _fit(data, "vcgmm", client="in-process"))


class _Stopped(Exception):
    pass


def _checkpointed_then_stopped(tmp_path, data, algo):
    """A checkpoint after iteration 5 of a fit that stopped in iteration 7 (an exception from its callback)."""
    path = tmp_path / "ck"

    def stop(record):
        if record["iteration"] == 7:
            raise _Stopped

    with pytest.raises(_Stopped):
        _fit(data, algo, client="in-process", checkpoint=path, checkpoint_every=5, callback=stop)
    return path


ROWS_DAMAGE = {  # (algo, what is done to each per-row file's arrays, the refusal)
    "vcgmm cluster indices of 2**30": (
        "vcgmm",
        lambda z: {**z, "K": np.full_like(z["K"], 2**30)},
        r"'K' holds values outside \[0, 24\)",
    ),
    "vcgmm NaN distances": (
        "vcgmm",
        lambda z: {**z, "Kd2": np.full_like(z["Kd2"], np.nan)},
        r"'Kd2' holds values outside \[0\.0, inf\)",
    ),
    "vcgmm half the rows": (
        "vcgmm",
        lambda z: {k: v[: len(v) // 2] for k, v in z.items()},
        r"'K' is int32 \(\d+, 5\), not int32 \(\d+, 5\) \(the rows its name covers\)",
    ),
    "vcgmm a field missing": (
        "vcgmm",
        lambda z: {k: v for k, v in z.items() if k != "winner"},
        r"holds fields \['K', 'Kd2'\], not \['K', 'Kd2', 'winner'\]",
    ),
    "vcgmm a float field as integers": (
        "vcgmm",
        lambda z: {**z, "Kd2": z["Kd2"].astype(np.int64)},
        r"'Kd2' is int64 .*, not float64",
    ),
    "nmbatch labels of 2**30": (
        "nmbatch",
        lambda z: {**z, "labels": np.full_like(z["labels"], 2**30)},
        r"'labels' holds values outside \[0, 24\)",
    ),
}


def _edit_index(path, change):
    meta = json.load(open(path / INDEX))
    change(meta)
    (path / INDEX).write_text(json.dumps(meta))


def _edit_arrays(path):
    gen = path / json.load(open(path / INDEX))["generation"]
    with np.load(gen / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(gen / "arrays.npz", **{k: v + 1 if v.dtype.kind == "f" else v for k, v in arrays.items()})


GENERATION_DAMAGE = {
    "converged edited in": lambda path: _edit_index(path, lambda m: m.update(converged=True)),
    "the history cut": lambda path: _edit_index(path, lambda m: m.update(history=m["history"][:-2])),
    "an array changed": _edit_arrays,
}


@pytest.mark.parametrize("damage", GENERATION_DAMAGE)
def test_an_edited_generation_is_refused_not_resumed(tmp_path, data, damage):
    """Issue #35: a damaged but parseable checkpoint resumed silently to another model; each generation now
    carries a checksum of its arrays and of all the index says of it."""
    path = _checkpointed_then_stopped(tmp_path, data, "kmeans")
    GENERATION_DAMAGE[damage](path)
    with pytest.raises(
        dask_clust.InvalidModelError,
        match=r"is not a valid dask_clust checkpoint: generation it-000005"
        r"-\w+ does not match its checksum",
    ):
        _fit(data, "kmeans", client="in-process", resume=path)


def _change_rows(path, change):
    """Every per-row file of the checkpoint's generation rewritten with ``change(its arrays)``."""
    rows = path / json.load(open(path / INDEX))["generation"] / "rows"
    for name in os.listdir(rows):
        with np.load(rows / name) as z:
            arrays = {k: z[k] for k in z.files}
        np.savez(rows / name, **change(arrays))


def _resign(path):
    """The checksums of the generation made again over its files as they now are: what a forger would do."""
    from dask_clust.checkpoint import _generation_digest
    from dask_clust.outputs import file_sha256

    meta = json.load(open(path / INDEX))
    gen = path / meta["generation"]
    meta["rows"] = {name: file_sha256(gen / "rows" / name) for name in meta["rows"]}
    meta["checksum"] = _generation_digest(gen, meta)
    (path / INDEX).write_text(json.dumps(meta))


@pytest.mark.parametrize("damage", ROWS_DAMAGE)
def test_a_crafted_rows_file_is_refused_before_a_kernel_reads_it(tmp_path, data, damage):
    """Issue #35: per-row state files are checked before any kernel reads them (cluster indices of 2**30 crashed
    the process with SIGSEGV; half a file's rows resumed to another model): one InputError naming the file,
    even when the generation's checksums were made again over the crafted files (they are no signature)."""
    algo, change, msg = ROWS_DAMAGE[damage]
    path = _checkpointed_then_stopped(tmp_path, data, algo)
    _change_rows(path, change)
    _resign(path)
    with pytest.raises(InputError, match=r"the checkpoint's rows file \S+\.npz.*" + msg):
        _fit(data, algo, client="in-process", resume=path)


def _edit_state(path, change):
    """The generation's state (its arrays and the index's scalars) rewritten with ``change(state)``, then
    re-signed (``_resign``): only the declared-state checks stand between it and the fit."""
    meta = json.load(open(path / INDEX))
    gen = path / meta["generation"]
    with np.load(gen / "arrays.npz") as z:
        state = {**meta["scalars"], **{k: z[k] for k in z.files}}
    change(state)
    np.savez(gen / "arrays.npz", **{k: v for k, v in state.items() if isinstance(v, np.ndarray)})
    meta["scalars"] = {k: v for k, v in state.items() if not isinstance(v, np.ndarray)}
    (path / INDEX).write_text(json.dumps(meta))
    _resign(path)


STATE_DAMAGE = {  # (algo, what is done to the generation's state, the refusal)
    "kmeans centres not finite": (
        "kmeans",
        lambda st: st["centers"].fill(np.nan),
        r"'centers' holds values that are not finite",
    ),
    "kmeans centres of another width": (
        "kmeans",
        lambda st: st.update(centers=st["centers"][:, :-1]),
        r"'centers' is float64 \(24, 4\), not floats \(24, 5\)",
    ),
    "vcgmm neighbour indices of 2**30": (
        "vcgmm",
        lambda st: st["Gc"].fill(2**30),
        r"'Gc' holds values outside \[0, 24\)",
    ),
    "vcgmm sigma2 a string": ("vcgmm", lambda st: st.update(sigma2="big"), r"'sigma2' is 'big', not a number"),
    "minibatch counts one short": (
        "minibatch",
        lambda st: st.update(counts=st["counts"][:-1]),
        r"'counts' is float64 \(23,\), not floats \(24,\)",
    ),
    "nmbatch a batch beyond the rows": (
        "nmbatch",
        lambda st: st.update(b=10**9),
        r"'b' is 1000000000, not an integer in \[1, 12001\)",
    ),
    "sbe an entry of another algorithm": ("sbe", lambda st: st.update(Gc=[0]), r"its state holds \['Gc', "),
    "vrkm an entry missing": (
        "vrkm",
        lambda st: st.pop("warned"),
        r"its state holds \['C', 'best', 'evals', "
        r"'seed_evals'\], not",
    ),
}


@pytest.mark.parametrize("damage", STATE_DAMAGE)
def test_a_crafted_checkpoint_state_is_refused_before_any_work(tmp_path, data, damage):
    """Issue #35: the state a checkpoint restores on the driver (centres, vc-GMM's neighbour indices, counters,
    a random stream) reached the fit unchecked once its checksum matched, and a checksum is no signature:
    each algorithm now declares what its checkpoint holds, and a resumed state is checked against it before
    any work, one line naming the entry."""
    algo, change, msg = STATE_DAMAGE[damage]
    path = _checkpointed_then_stopped(tmp_path, data, algo)
    _edit_state(path, change)
    with pytest.raises(dask_clust.InvalidModelError, match=r"is not a valid dask_clust checkpoint: " + msg) as got:
        _fit(data, algo, client="in-process", resume=path)
    assert "\n" not in str(got.value)


def test_every_resumable_algorithm_declares_what_its_checkpoint_holds():
    specs = dask_clust.algorithms.REGISTRY
    assert all(specs[a].saved is not None for a in dask_clust.algorithms.resumable())


@pytest.mark.parametrize("algo", ["vcgmm", "nmbatch"])
def test_a_rows_file_edited_within_its_ranges_is_refused_not_resumed(tmp_path, data, algo):
    """Issue #35: a per-row value changed to another valid one (a row's cluster index) passed every check and
    resumed to another model; each generation now records its per-row files' checksums, which the workers
    check as they read: one InputError naming the file."""
    field = {"vcgmm": "K", "nmbatch": "labels"}[algo]
    path = _checkpointed_then_stopped(tmp_path, data, algo)

    def another_cluster(z):
        v = z[field].copy()
        v.flat[0] = (v.flat[0] + 1) % 24  # still one of the 24 clusters
        return {**z, field: v}

    _change_rows(path, another_cluster)
    with pytest.raises(
        InputError,
        match=r"the checkpoint's rows file \S+\.npz cannot be read: its bytes do not "
        r"match the checksum its generation recorded",
    ):
        _fit(data, algo, client="in-process", resume=path)


def test_checkpoints_of_another_fit_are_refused(tmp_path, data):
    path = tmp_path / "ck"
    _fit(data, "kmeans", client="in-process", checkpoint=path, max_iter=3)
    before = sorted(os.listdir(path))
    with pytest.raises(InputError, match=r"another fit \(parameter n_clusters=24 there, 25 here\)"):
        dask_clust.fit(
            data, "kmeans", 25, random_state=3, max_iter=3, client="in-process", checkpoint=path, **FITS["kmeans"]
        )
    with pytest.raises(InputError, match=r"another fit \(parameter random_state=3 there, 4 here\)"):
        _fit(data, "kmeans", client="in-process", resume=path, max_iter=3, random_state=4)
    with pytest.raises(InputError, match=r"another fit \(the data shape=\[12000, 5\] there, \[11999, 5\] here\)"):
        _fit(data[1:], "kmeans", client="in-process", resume=path, max_iter=3)
    with pytest.raises(
        InputError,
        match=r"checkpoint=\S*ck holds a checkpoint of another fit \(parameter "
        r"n_clusters=24 there, 25 here\); refusing to replace it",
    ):
        dask_clust.fit(
            data,
            "kmeans",
            25,
            random_state=3,
            max_iter=3,
            client="in-process",
            resume=tmp_path / "x",
            checkpoint=path,
            **FITS["kmeans"],
        )
    changed = data.copy()
    changed[7_777, 2] += 1
    with pytest.raises(InputError, match="written from other data"):
        _fit(changed, "kmeans", client="in-process", resume=path, max_iter=3)
    assert sorted(os.listdir(path)) == before  # nothing replaced
    # random_state=None takes the checkpoint's
    assert (
        _fit(data, "kmeans", client="in-process", resume=path, max_iter=3, random_state=None).params["random_state"]
        == 3
    )


def test_a_checkpoint_of_other_chunks_is_refused(tmp_path, data, input_chunks):
    """The model's bits depend on the chunk boundaries: a checkpoint cut otherwise is not resumed."""
    import dask.array as da

    path = tmp_path / "ck"
    _fit(da.from_array(data, chunks=(3_000, 5)), "kmeans", client="in-process", checkpoint=path, max_iter=3)
    with pytest.raises(InputError, match=r"another fit \(the data n_chunks=4 there, 3 here\)"):
        _fit(da.from_array(data, chunks=(4_000, 5)), "kmeans", client="in-process", resume=path, max_iter=3)
    with pytest.raises(InputError, match=r"another fit \(the data's chunk boundaries differ\)"):
        _fit(
            da.from_array(data, chunks=((2_000, 4_000, 3_000, 3_000), (5,))),
            "kmeans",
            client="in-process",
            resume=path,
            max_iter=3,
        )


def test_a_read_only_checkpoint_directory_is_refused_before_work(tmp_path, data, monkeypatch):
    """Issue #35: a directory the fit cannot write in was accepted, and the fit died at its first write, after
    the work. The refusal of the filesystem is injected (these tests may run as root, who writes anywhere)."""
    import builtins

    from dask_clust import checkpoint

    def read_only(name, mode="r", *args, **kwargs):
        if "w" in mode and os.path.dirname(os.fspath(name)) == str(tmp_path / "ck"):
            raise PermissionError(13, "Permission denied", os.fspath(name))
        return builtins.open(name, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "open", read_only, raising=False)
    (tmp_path / "ck").mkdir()
    calls = []
    with pytest.raises(InputError, match=r"^checkpoint=\S+ck: cannot write in it \(Permission denied\)$"):
        _fit(data, "kmeans", client="in-process", checkpoint=tmp_path / "ck", callback=calls.append)
    assert calls == [] and os.listdir(tmp_path / "ck") == []


def test_bad_checkpoint_arguments_are_refused_before_work(tmp_path, data):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="holds files that are not a dask_clust checkpoint"):
        _fit(data, "kmeans", client="in-process", checkpoint=tmp_path / "other")
    with pytest.raises(InputError, match="holds no dask_clust checkpoint"):
        _fit(data, "kmeans", client="in-process", resume=tmp_path / "other")
    with pytest.raises(InputError, match="no such directory"):
        _fit(data, "kmeans", client="in-process", resume=tmp_path / "missing")
    with pytest.raises(InvalidParameterError, match=r"algo='slk' cannot be checkpointed or resumed yet; .*'kmeans'"):
        dask_clust.fit(data, "slk", 4, checkpoint=tmp_path / "new")
    with pytest.raises(InvalidParameterError, match="checkpoint_every must be an int >= 1"):
        _fit(data, "kmeans", checkpoint=tmp_path / "new", checkpoint_every=0)
    with pytest.raises(InvalidParameterError, match="checkpoint_seconds must be a number > 0"):
        _fit(data, "kmeans", checkpoint=tmp_path / "new", checkpoint_seconds=-1)
    assert not (tmp_path / "new").exists()


def test_the_estimator_and_the_command_line_continue_a_checkpoint(tmp_path, data, capsys):
    """A KMeans estimator's fit stopped after iteration 6, then ``dask-clust fit --checkpoint`` on the same
    data saved as .npy: the command continues it to the uninterrupted model."""
    from dask_clust import KMeans
    from dask_clust.cli import main

    path = tmp_path / "ck"

    def stop(record):
        if record["iteration"] == 6:
            raise StopFit

    KMeans(24, init="random", tol=0.0, max_iter=30, random_state=3).fit(data, checkpoint=path, callback=stop)
    assert json.load(open(path / INDEX))["iteration"] == 6
    np.save(tmp_path / "X.npy", data)
    assert (
        main(
            [
                "fit",
                str(tmp_path / "X.npy"),
                "-k",
                "24",
                "--init",
                "random",
                "--tol",
                "0",
                "--max-iter",
                "30",
                "--seed",
                "3",
                "--checkpoint",
                str(path),
                "--out",
                str(tmp_path / "m"),
                "--quiet",
            ]
        )
        == 0
    )
    assert_same_model(dask_clust.load(tmp_path / "m"), _fit(data, "kmeans", client="in-process"))


def test_two_fits_on_one_checkpoint_directory_the_second_is_refused(tmp_path, data):
    """Issue #35: two fits started on one directory (a requeued job, a job array) killed each other's
    generations. The first holds checkpoint.lock (host, pid, start time) while it runs; the second is
    refused in one line before any work, and the first ends with the bits of an undisturbed fit."""
    import threading

    from dask_clust.checkpoint import LOCK

    plain = _fit(data, "kmeans", client="in-process")
    inside, go_on = threading.Event(), threading.Event()

    def wait_at_2(record):
        if record["iteration"] == 2:
            inside.set()
            go_on.wait(60)

    got = {}
    first = threading.Thread(
        target=lambda: got.update(
            m=_fit(
                data, "kmeans", client="in-process", checkpoint_every=4, checkpoint=tmp_path / "ck", callback=wait_at_2
            )
        )
    )
    first.start()
    try:
        assert inside.wait(60)
        held = json.loads((tmp_path / "ck" / LOCK).read_text())
        assert held["pid"] == os.getpid() and held["started"] > 0
        calls = []
        with pytest.raises(
            InputError,
            match=rf"^checkpoint=\S+ck is in use by another fit \(pid {os.getpid()} on "
            r"\S+\): .*remove \S+checkpoint.lock if that fit is gone$",
        ):
            _fit(data, "kmeans", client="in-process", checkpoint=tmp_path / "ck", callback=calls.append)
        assert calls == []
    finally:
        go_on.set()
        first.join(60)
    assert_same_model(got["m"], plain)
    assert not (tmp_path / "ck" / LOCK).exists()


@pytest.mark.cluster
def test_a_lock_left_by_a_fit_that_is_gone_is_taken_over(tmp_path, data):
    """A fit killed on this host leaves its lock: the next fit takes it over (the pid is gone, or now names
    another process started later); a lock of another host, whose process this host cannot see, is refused,
    and one a failed fit held is released."""
    import socket

    import psutil

    from dask_clust.checkpoint import LOCK, LOCK_STALE_S

    ck = tmp_path / "ck"
    ck.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    me = psutil.Process(os.getpid())
    for left in (
        {"host": socket.gethostname(), "pid": gone.pid, "started": 1.0},  # the pid is gone (or reused)
        {"host": socket.gethostname(), "pid": os.getpid(), "started": me.create_time() - 5},  # reused
        '{"host": ',
    ):  # cut while written, long ago
        (ck / LOCK).write_text(left if isinstance(left, str) else json.dumps(left))
        os.utime(ck / LOCK, (1, 1))
        _fit(data, "kmeans", client="in-process", max_iter=3, checkpoint=ck)
        assert not (ck / LOCK).exists()
    (ck / LOCK).write_text(json.dumps({"host": "elsewhere.example", "pid": 1, "started": 1.0}))
    with pytest.raises(InputError, match=r"in use by another fit \(pid 1 on elsewhere\.example\)"):
        _fit(data, "kmeans", client="in-process", max_iter=3, checkpoint=ck)
    assert (ck / LOCK).exists()
    # issue #53: another host's lock untouched for longer than LOCK_STALE_S is its stopped fit's: taken over
    os.utime(ck / LOCK, (time.time() - LOCK_STALE_S - 5,) * 2)
    _fit(data, "kmeans", client="in-process", max_iter=3, checkpoint=ck)
    assert not (ck / LOCK).exists()

    def fail(record):
        raise RuntimeError("a callback's own error")

    with pytest.raises(RuntimeError, match="a callback's own error"):
        _fit(data, "kmeans", client="in-process", checkpoint=tmp_path / "failed", callback=fail)
    assert not (tmp_path / "failed" / LOCK).exists()


def test_a_running_fit_touches_its_lock_so_other_hosts_see_it_alive(tmp_path, data, monkeypatch):
    """Issue #53: the fit holding a checkpoint's lock touches it every LOCK_BEAT_S (here 0.05 s) while it runs,
    and stops when it ends (the lock removed); another host ages the lock by the file system's clock."""
    from dask_clust import checkpoint

    monkeypatch.setattr(checkpoint, "LOCK_BEAT_S", 0.05)
    ck = tmp_path / "ck"
    seen = []

    def look(record):
        time.sleep(0.15)
        seen.append(os.path.getmtime(ck / checkpoint.LOCK))

    _fit(data, "kmeans", client="in-process", max_iter=4, checkpoint=ck, callback=look)
    assert len(seen) >= 4 and len(set(seen)) == len(seen) and seen == sorted(seen)
    assert not (ck / checkpoint.LOCK).exists()
    assert not [t for t in threading.enumerate() if t.name == "dask_clust-lock"]
    assert abs(checkpoint._file_system_now(str(tmp_path)) - time.time()) < 5
