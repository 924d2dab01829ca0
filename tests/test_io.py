"""Saved models, zarr / parquet / .npy inputs, labels written back, and the command line."""

import json
import os
import re
import subprocess
import sys

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest

import dask_clust
from dask_clust.cli import main
from tests.reference import lloyd as ref
from tests.reference.make_blobs import blobs


def test_save_load_round_trip(tmp_path, small_blobs):
    X, _ = small_blobs
    m = dask_clust.fit(X, n_clusters=4, random_state=0)
    m.save(tmp_path / "model")
    assert sorted(os.listdir(tmp_path / "model")) == ["arrays.npz", "model.json"]
    back = dask_clust.load(tmp_path / "model")
    np.testing.assert_array_equal(back.cluster_centers_, m.cluster_centers_)
    assert back.history_ == m.history_ and back.params == m.params and back.n_iter_ == m.n_iter_
    np.testing.assert_array_equal(back.predict(X).compute(), m.predict(X).compute())
    # an explicit init array is a parameter too, kept in the npz
    m2 = dask_clust.fit(X, n_clusters=2, init=X[:2].astype(np.float64))
    m2.save(tmp_path / "m2")
    np.testing.assert_array_equal(dask_clust.load(tmp_path / "m2").params["init"], X[:2])


def test_a_failed_save_leaves_the_model_already_there(tmp_path, small_blobs, monkeypatch):
    """Issue #20: save writes beside the directory and renames into place; a save that fails part-way
    leaves the good model and no partial directory. A model fitted from a DataFrame init saves it as values
    (before: 'cannot store DataFrame', after destroying the model there)."""
    X, _ = small_blobs
    good = dask_clust.fit(X, n_clusters=3, random_state=0, client="in-process")
    good.save(tmp_path / "model")
    framed = dask_clust.fit(X, n_clusters=3, init=pd.DataFrame(X[:3]), random_state=0, client="in-process")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(np, "savez", disk_full)
        with pytest.raises(
            dask_clust.InputError,
            match=r"model: no space left on its device \(No space left on "
            r"device\); nothing was written there$",
        ):  # one line (#35)
            framed.save(tmp_path / "model")
    assert sorted(os.listdir(tmp_path)) == ["model"]
    kept = dask_clust.load(tmp_path / "model")
    np.testing.assert_array_equal(kept.cluster_centers_, good.cluster_centers_)
    assert kept.params == good.params
    framed.save(tmp_path / "model")
    back = dask_clust.load(tmp_path / "model")
    np.testing.assert_array_equal(back.params["init"], X[:3])
    np.testing.assert_array_equal(back.cluster_centers_, framed.cluster_centers_)


def test_save_through_a_symbolic_link_replaces_its_target(tmp_path, small_blobs):
    """Issue #35: saving onto a link to a model directory failed with NotADirectoryError and left a partial
    directory; the link is followed, its target replaced and the link kept, nothing else left."""
    X, _ = small_blobs
    dask_clust.fit(X, n_clusters=3, random_state=0, client="in-process", progress=False).save(tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    m = dask_clust.fit(X, n_clusters=4, random_state=0, client="in-process", progress=False)
    m.save(tmp_path / "link")
    assert os.path.islink(tmp_path / "link") and sorted(os.listdir(tmp_path)) == ["link", "real"]
    np.testing.assert_array_equal(dask_clust.load(tmp_path / "real").cluster_centers_, m.cluster_centers_)


def test_load_missing_model(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"not a saved dask_clust model"):
        dask_clust.load(tmp_path)


def _npz_member(path, name, header, payload):
    """An arrays.npz of one stored member whose .npy header is ``header`` and data ``payload``."""
    import io
    import zipfile

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}.npy", buf.getvalue() + payload)


def _rewrite_meta(d, change):
    meta = json.loads((d / "model.json").read_text())
    change(meta)
    (d / "model.json").write_text(json.dumps(meta))


def _fifo(d, name):
    os.remove(d / name)
    os.mkfifo(d / name)


UNTRUSTED_MODELS = {
    # a megabyte that would expand to 1.6 GB: refused before any of it is inflated
    "zip bomb": (
        "kmeans",
        lambda d: np.savez_compressed(d / "arrays.npz", cluster_centers_=np.zeros((20_000, 10_000))),
        r"member 'cluster_centers_\.npy' is compressed",
    ),
    "header claiming 32 GB": (
        "kmeans",
        lambda d: _npz_member(
            d / "arrays.npz",
            "cluster_centers_",
            {"descr": "<f8", "fortran_order": False, "shape": (2**30, 4)},
            np.zeros((4, 4)).tobytes(),
        ),
        r"claims 34,359,738,368 bytes of float64 \(1073741824, 4\) but stores 128",
    ),
    "object array": (
        "kmeans",
        lambda d: _npz_member(
            d / "arrays.npz", "cluster_centers_", {"descr": "|O", "fortran_order": False, "shape": (1,)}, b"\0" * 8
        ),
        r"claims .* of object",
    ),
    "deep nesting": (
        "kmeans",
        lambda d: (d / "model.json").write_text("[" * 100_000 + "]" * 100_000),
        r"model\.json nests too deeply",
    ),
    "FIFO model.json": ("kmeans", lambda d: _fifo(d, "model.json"), r"model\.json is not a regular file"),
    "FIFO arrays.npz": ("kmeans", lambda d: _fifo(d, "arrays.npz"), r"arrays\.npz is not a regular file"),
    "another algorithm's extra": (
        "kmeans",
        lambda d: _rewrite_meta(d, lambda m: m["extras_"].update(row_normalization_="l2")),
        r"extras_ holds 'row_normalization_', which an algo='kmeans' model does not have",
    ),
    "a missing extra": (
        "vcgmm",
        lambda d: _rewrite_meta(d, lambda m: m["extras_"].pop("sigma2_")),
        r"missing key 'sigma2_'",
    ),
    "a bad extra": (
        "vcgmm",
        lambda d: _rewrite_meta(d, lambda m: m["extras_"].update(n_truncated_=True)),
        r"extras_ n_truncated_ must be an int in \[1, n_clusters\]; got True",
    ),
}


@pytest.mark.parametrize("kind", UNTRUSTED_MODELS)
def test_an_untrusted_model_file_is_refused_in_one_line(tmp_path, small_blobs, kind):
    """Issue #35: model files move between machines and people. Each crafted or damaged file is refused by
    InvalidModelError naming the path and the problem, within seconds: no allocation of what a header
    claims, no read from a FIFO that blocks for ever, no extra that changes what predict does."""
    import threading

    algo, damage, msg = UNTRUSTED_MODELS[kind]
    X, _ = small_blobs
    d = tmp_path / "model"
    dask_clust.fit(X, algo=algo, n_clusters=4, random_state=0, client="in-process", progress=False).save(d)
    damage(d)
    got = []
    reader = threading.Thread(target=lambda: got.append(_refusal(d)), daemon=True)
    reader.start()
    reader.join(60)
    assert got, "load did not return within 60 s"
    assert isinstance(got[0], dask_clust.InvalidModelError), got[0]
    assert str(got[0]).startswith(f"{d} is not a valid dask_clust model: ") and "\n" not in str(got[0])
    assert re.search(msg, str(got[0])), str(got[0])


def _refusal(d):
    try:
        dask_clust.load(d)
    except Exception as exc:  # noqa: BLE001 - the test inspects whatever was raised
        return exc
    return None


def test_centres_beyond_the_rows_dtype_are_refused(small_blobs):
    """A float64 model whose centres exceed float32's range: float32 rows are refused in one line (cast, the
    centres would be infinities and every row label 0); float64 rows get the nearest centre."""
    X, _ = small_blobs
    m = dask_clust.fit(X.astype(np.float64), n_clusters=3, random_state=0, client="in-process", progress=False)
    m.cluster_centers_[0] = 1e39
    with pytest.raises(dask_clust.InputError, match=r"centres reach 1e\+39, beyond float32's range: pass X as float64"):
        m.predict(X.astype(np.float32))
    labels = m.predict(X.astype(np.float64)).compute()
    np.testing.assert_array_equal(labels, ref.assign(X.astype(np.float64), m.cluster_centers_)[0])
    assert (labels != 0).all()


def test_zarr_input_and_labels_written_back(tmp_path, small_blobs):
    X, _ = small_blobs
    path = str(tmp_path / "x.zarr")
    da.from_array(X, chunks=(500, 4)).to_zarr(path)
    m = dask_clust.fit(path, n_clusters=3, random_state=0, client="in-process")
    ours = dask_clust.fit(X, n_clusters=3, init=m.cluster_centers_, max_iter=1)
    np.testing.assert_allclose(ours.cluster_centers_, m.cluster_centers_, rtol=1e-9)  # already converged
    m.predict(path).to_zarr(str(tmp_path / "labels.zarr"))
    labels = da.from_zarr(str(tmp_path / "labels.zarr")).compute()
    np.testing.assert_array_equal(labels, ref.assign(X, m.cluster_centers_)[0])


def test_parquet_input_and_cli_labels(tmp_path, small_blobs):
    X, _ = small_blobs
    pq = str(tmp_path / "x.parquet")
    pd.DataFrame(X, columns=list("abcd")).to_parquet(pq)
    model_dir = str(tmp_path / "model")
    labels_out = str(tmp_path / "labels.parquet")
    assert main(["fit", pq, "-k", "3", "--seed", "0", "--out", model_dir, "--labels-out", labels_out, "--quiet"]) == 0
    m = dask_clust.load(model_dir)
    got = pd.read_parquet(labels_out)["label"].to_numpy()
    np.testing.assert_array_equal(got, ref.assign(X, m.cluster_centers_)[0])


def test_cli_fit_predict_npy(tmp_path, small_blobs, capsys):
    X, _ = small_blobs
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "init.npy", X[:3].astype(np.float64))
    assert (
        main(
            [
                "fit",
                str(tmp_path / "x.npy"),
                "-k",
                "3",
                "--init",
                str(tmp_path / "init.npy"),
                "--tol",
                "0",
                "--out",
                str(tmp_path / "m"),
                "--quiet",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    C, _, qe, n_iter, _ = ref.lloyd(X, X[:3], tol=0)
    assert summary["objective"] == pytest.approx(qe, rel=1e-9) and summary["n_iter"] == n_iter
    assert main(["predict", str(tmp_path / "m"), str(tmp_path / "x.npy"), "--out", str(tmp_path / "l.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "l.npy"), ref.assign(X, C)[0])


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["fit", "/nonexistent/x.npy"], r"Input path does not exist"),
        (["fit", "X", "-k", "0"], None),
        (["fit", "X", "--tol", "-1"], r"'tol' parameter of algo='kmeans' must be"),
        (
            ["fit", "X", "--scheduler", "nonsense"],
            r"'nonsense' is not a Dask scheduler address: expected tcp://host:port",
        ),
        (["fit", "X", "--scheduler", "localhost:8786x"], r"'localhost:8786x' is not a Dask scheduler address"),
        (["fit", "X", "--scheduler", "http://127.0.0.1:8787/status"], r"that is a dashboard's web address"),
        (["fit", "TEXT"], r"Cannot read .*text\.npy: not a \.npy file \(no NumPy header\)"),
        (["fit", "DIR"], r"Cannot read .*dir\.npy: not a \.npy file \(a directory"),
    ],
)
@pytest.mark.cluster
def test_cli_bad_input_exits_2_with_one_line(tmp_path, small_blobs, argv, msg):
    X, _ = small_blobs
    np.save(tmp_path / "x.npy", X)
    (tmp_path / "text.npy").write_text("1,2,3\n")
    (tmp_path / "dir.npy").mkdir()
    named = {"X": "x.npy", "TEXT": "text.npy", "DIR": "dir.npy"}
    argv = [str(tmp_path / named[a]) if a in named else a for a in argv]
    proc = subprocess.run([sys.executable, "-m", "dask_clust.cli", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dask-clust: error: ")
    if msg:
        import re

        assert re.search(msg, lines[0])


@pytest.mark.cluster
def test_cli_shows_no_distributed_info_lines_without_v():
    proc = subprocess.run(
        [sys.executable, "-m", "dask_clust.cli", "demo", "--n", "4000", "-k", "3", "--true-clusters", "3", "--quiet"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "kmeans (k-means||)" in proc.stdout and "distributed" not in proc.stderr, proc.stderr


def test_model_repr_and_html_view(small_blobs):
    X, _ = small_blobs
    m = dask_clust.fit(X, "vcgmm", 4, random_state=0, client="in-process", coreset_size=None)
    text = repr(m)
    # (issue #54: it called itself ClusteringModel, and its QE "objective" beside the bar's free energy)
    assert text.startswith("MixtureModel(algo='vcgmm', n_clusters=4, n_features=4")
    assert f"QE={m.objective_:.6g}," in text and f"sigma2={m.sigma2_:.6g}" in text
    assert f"free_energy={m.free_energy_:.6g}" in text and "objective" not in text
    assert repr(dask_clust.fit(X, "kmeans", 4, random_state=0, client="in-process")).startswith("ClusteringModel(")
    page = m._repr_html_()
    assert "<table>" in page and f"{m.objective_:.6g}" in page and page.count("<polyline") == (m.n_iter_ > 1)
    assert m.n_iter_ > 1 and "free energy: max" in page and "objective: max" not in page


def test_model_plot_shows_the_history_and_the_centres(small_blobs):
    import matplotlib

    matplotlib.use("Agg")
    X, _ = small_blobs
    for cols in (slice(0, 2), slice(0, 4)):
        m = dask_clust.fit(X[:, cols], "kmeans", 5, random_state=0, client="in-process")
        history, centres = m.plot().axes
        np.testing.assert_array_equal(history.lines[0].get_ydata(), [h["objective"] for h in m.history_])
        xy = centres.collections[0].get_offsets()
        if m.n_features_in_ == 2:
            np.testing.assert_array_equal(xy, m.cluster_centers_)
        else:  # a projection onto orthonormal axes: distances shrink, the largest spread is kept
            C = m.cluster_centers_ - m.cluster_centers_.mean(0)
            s = np.linalg.svd(C, compute_uv=False)
            np.testing.assert_allclose((xy**2).sum(), (s[:2] ** 2).sum(), rtol=1e-9)


def test_make_blobs_equals_shared_generator_when_one_chunk():
    from dask_clust.datasets import make_blobs
    from tests.reference.make_blobs import blobs

    X, y = make_blobs(5000, 7, 9, random_state=3)
    Xr, yr = blobs(5000, 7, 9, seed=3)
    np.testing.assert_array_equal(X.compute(), Xr)
    np.testing.assert_array_equal(y.compute(), yr)
    # many chunks: lazy, reproducible, same centres, same statistics
    Xc, yc = make_blobs(5000, 7, 9, chunks=1000, random_state=3)
    assert Xc.numblocks == (5, 1) and X.dtype == np.float32
    np.testing.assert_array_equal(Xc.compute(), make_blobs(5000, 7, 9, chunks=1000, random_state=3)[0].compute())
    assert abs((yc.compute() == -1).mean() - 0.1) < 0.02


def test_metrics_against_scikit_learn():
    from sklearn.metrics import normalized_mutual_info_score

    from dask_clust import metrics

    rng = np.random.default_rng(0)
    t = rng.integers(0, 5, 500)
    p = np.where(rng.random(500) < 0.7, (t + 1) % 5, rng.integers(0, 6, 500))
    assert metrics.nmi(t, p) == pytest.approx(normalized_mutual_info_score(t, p), rel=1e-12)
    assert metrics.acc(t, (t + 2) % 5) == 1.0  # a relabelling is a perfect match
    assert metrics.purity([0, 0, 1, 1], [0, 0, 0, 1]) == 0.75
    assert metrics.acc([0, 0, 1, 1], [0, 0, 0, 1]) == 0.75
    X = rng.random((50, 2))
    C = X[:3]
    assert metrics.quantization_error(X, C) == pytest.approx(ref.assign(X, C)[1].sum(), rel=1e-12)


def test_pandas_and_dask_dataframe_inputs(small_blobs):
    import dask.dataframe as dd

    X, _ = small_blobs
    df = pd.DataFrame(X, columns=list("abcd"))
    init = X[:3].astype(np.float64)
    C, labels, qe, n_iter, _ = ref.lloyd(X, init)
    for data in (df, dd.from_pandas(df, npartitions=4)):
        m = dask_clust.fit(data, n_clusters=3, init=init, client="in-process")
        np.testing.assert_allclose(m.cluster_centers_, C, rtol=1e-10)
        got = m.predict(data)  # a Series on the frame's index: computed for pandas, lazy for dask
        assert isinstance(got, pd.Series if data is df else dd.Series)
        np.testing.assert_array_equal(dask.compute(got)[0].to_numpy(), labels)


def test_load_digits_clusters_like_scikit_learn():
    from sklearn.cluster import KMeans

    from dask_clust import metrics
    from dask_clust.datasets import load_digits

    X, y = load_digits()
    assert X.shape == (1797, 64) and X.dtype == np.float64
    ours = np.mean(
        [metrics.nmi(y, dask_clust.fit(X, n_clusters=10, random_state=s).predict(X).compute()) for s in range(3)]
    )
    sk = np.mean([metrics.nmi(y, KMeans(10, n_init=1, random_state=s).fit_predict(X)) for s in range(3)])
    assert ours >= sk - 0.05, (ours, sk)


def test_cli_demo_prints_summary_table(capsys):
    # the README's main job, on small data: a LocalCluster fit of lazily generated blobs
    assert main(["demo", "--n", "20000", "--d", "4", "-k", "5", "--true-clusters", "5", "--progress"]) == 0
    shown = capsys.readouterr()
    out = shown.out.splitlines()
    # the page of fits beside the dashboard's address, where the cluster is started, and not again
    assert re.search(r"^dashboard: (http://127\.0\.0\.1:\d+)/status  \(the fits: \1/dask-clust\)$", shown.err, re.M)
    assert "the fits on the dashboard" not in shown.err, shown.err
    header = next(i for i, line in enumerate(out) if line.startswith("algorithm"))
    cols = out[header].split()
    assert cols[:5] == ["algorithm", "k", "QE", "time_s", "iterations"] and "distance_evals" in cols
    row = out[header + 2].split()
    assert row[0] == "kmeans" and float(row[cols.index("QE") + 1]) > 0  # "kmeans (k-means||)" is 2 words


@pytest.mark.cluster
def test_every_input_format_gives_the_same_model_and_uses_every_worker(tmp_path, cluster):
    """The same 1M rows as .npy, one parquet file, a zarr store with its own chunks and a one-chunk dask
    array: one chunking (from the data's size), so one model, and work for every worker thread."""
    X, _ = blobs(1_000_000, 4, 8, seed=11)
    np.save(tmp_path / "x.npy", X)
    pd.DataFrame(X, columns=list("abcd")).to_parquet(tmp_path / "x.parquet")
    da.from_array(X, chunks=(300_000, 4)).to_zarr(str(tmp_path / "x.zarr"))
    inputs = {
        "npy": str(tmp_path / "x.npy"),
        "parquet": str(tmp_path / "x.parquet"),
        "zarr": str(tmp_path / "x.zarr"),
        "dask": da.from_array(X, chunks=X.shape),
    }
    models = {name: dask_clust.fit(data, n_clusters=8, random_state=4, client=cluster) for name, data in inputs.items()}
    first = models["npy"]
    for name, m in models.items():
        np.testing.assert_array_equal(m.cluster_centers_, first.cluster_centers_, err_msg=name)
        assert (m.n_iter_, m.objective_) == (first.n_iter_, first.objective_), name
        assert m.engine_["workers"] == 2 and m.engine_["chunks"] >= 2 * m.engine_["threads"], (name, m.engine_)


def _loaded_keys(client):
    """The names of the keys the workers hold, by task prefix."""
    return sorted(str(k).split("-")[0] for keys in client.has_what().values() for k in keys)


@pytest.mark.cluster
@pytest.mark.parametrize("seen", [True, False], ids=["workers-read", "driver-sends"])
def test_npy_chunks_are_read_by_the_workers_that_see_the_file(tmp_path, cluster, monkeypatch, seen):
    """A .npy path is read by each worker for its own chunks, not sent from the driver's memory map; a
    worker that does not see the same file (size and time differ) is sent them. Same model either way,
    and the same as in-process."""
    import dask_clust.engine.data as data

    X, _ = blobs(20_000, 4, 5, seed=3)
    path = str(tmp_path / "x.npy")
    np.save(path, X.astype(np.float32))
    if not seen:  # the driver's stamp no longer matches the file the workers find at that path
        monkeypatch.setattr(data, "file_stamp", lambda p: (0, 0))
    held = []
    m = dask_clust.fit(
        path, n_clusters=5, random_state=2, client=cluster, callback=lambda rec: held.append(_loaded_keys(cluster))
    )
    ref_m = dask_clust.fit(np.load(path), n_clusters=5, random_state=2, client="in-process")
    np.testing.assert_array_equal(m.cluster_centers_, ref_m.cluster_centers_)
    assert m.objective_ == ref_m.objective_
    read = held[0].count("file_rows")
    assert read == (m.engine_["chunks"] if seen else 0), held[0]


def test_a_changed_npy_file_is_refused_where_it_is_read(tmp_path):
    from dask_clust.engine.data import file_rows, file_stamp
    from dask_clust.errors import InputError

    path = str(tmp_path / "x.npy")
    np.save(path, np.arange(12.0).reshape(6, 2))
    x, w = file_rows(path, file_stamp(path), 2, 4, np.dtype(np.float32), None)
    np.testing.assert_array_equal(x, np.float32([[4, 5], [6, 7]]))
    assert w is None
    stamp = file_stamp(path)
    np.save(path, np.arange(14.0).reshape(7, 2))
    with pytest.raises(InputError, match="not the file the fit was started on"):
        file_rows(path, stamp, 0, 2, np.dtype(np.float64), None)
