"""The command line as a user meets it: every bad input gets status 2 and one line before any work,
Ctrl-C gets 130 and one line, outputs appear whole or not at all, and --help does not import the engine."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from dask_clust.cli import build_parser
from tests.reference.make_blobs import blobs

ENV = {**os.environ, "DASK_DASK_CLUST__CONNECT_TIMEOUT": "2s"}


def run(*argv, cwd):
    return subprocess.run(
        [sys.executable, "-m", "dask_clust.cli", *argv], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=240
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A directory with good data, a saved model and the bad inputs of issue #16's points 6-8."""
    d = tmp_path_factory.mktemp("cli")
    X, _ = blobs(3000, 4, 5, seed=2)
    np.save(d / "x.npy", X)
    np.save(d / "object.npy", np.array([[1, "a"], [2, "b"]], dtype=object), allow_pickle=True)
    big = X.astype(np.float64)
    big[7, 2] = 1e300
    np.save(d / "huge.npy", big)
    nan = X.copy()
    nan[2345, 1] = np.nan
    np.save(d / "nan.npy", nan)
    pd.DataFrame({"a": [1.0, 2.0, 3.0], "n": pd.array([1, None, 3], dtype="Int64")}).to_parquet(d / "na.parquet")
    (d / "empty.parquet").write_bytes(b"")  # a writer that died before its first row group
    assert run("fit", "x.npy", "-k", "5", "--seed", "0", "--out", "model", "--quiet", cwd=d).returncode == 0
    meta = json.loads((d / "model" / "model.json").read_text())

    def broken(name, change=None, text=None):
        shutil.copytree(d / "model", d / name)
        if text is None:
            m = json.loads(json.dumps(meta))
            change(m)
            text = json.dumps(m)
        (d / name / "model.json").write_text(text)

    broken("missing-key", lambda m: m.pop("n_iter_"))
    broken("bad-json", text="{not json")
    broken("made-up-algo", lambda m: m.update(algo="kmedoids"))
    broken("wrong-k", lambda m: m["params"].update(n_clusters=7))
    broken("bad-type", lambda m: m.update(converged_="yes"))
    shutil.copytree(d / "model", d / "nan-centres")
    with np.load(d / "model" / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["cluster_centers_"][0, 0] = np.nan
    np.savez(d / "nan-centres" / "arrays.npz", **arrays)
    return d


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["fit", "object.npy", "-k", "2"], r"Cannot read object\.npy: .*must hold a numeric array"),
        (["fit", "huge.npy", "-k", "2"], r"values reach 1e\+300 in magnitude.*rescale"),
        (["fit", "na.parquet", "-k", "2"], r"Column 'n' has a missing value \(NA\) at row 1"),
        (["fit", "empty.parquet", "-k", "2"], r"Cannot read empty\.parquet as a parquet dataset: .*0 bytes"),
        (["fit", "missing.npy"], r"Input path does not exist: missing\.npy"),
        (["fit", "x.npy", "-k", "0"], r"'n_clusters' parameter .* must be an int in the range \[1, inf\]; got 0"),
        (["fit", "x.npy", "--algo", "kmedoids"], r"invalid choice: 'kmedoids'"),
        (["fit", "x.npy", "--bogus"], r"unrecognized arguments: --bogus"),
        (
            ["fit", "x.npy", "--scheduler", "tcp://127.0.0.1:{port}"],
            r"no Dask scheduler answered at tcp://127\.0\.0\.1",
        ),
        (["fit", "x.npy", "--out", "/proc/x"], r"--out /proc/x: cannot write in /proc"),
        (["fit", "x.npy", "--labels-out", "/missing/l.npy"], r"the directory /missing does not exist"),
        (
            ["fit", "x.npy", "--labels-out", "l.txt"],
            r"the format follows the suffix; use one of \.npy, \.parquet, \.zarr",
        ),
        (["fit", "x.npy", "--out", "x.npy"], r"exists and is not a dask_clust model directory"),
        (["predict", "model", "x.npy", "--out", "p.txt"], r"the format follows the suffix"),
        (["predict", "missing-key", "x.npy", "--out", "l.npy"], r"not a valid dask_clust model: missing key 'n_iter_'"),
        (["predict", "bad-json", "x.npy", "--out", "l.npy"], r"model\.json is not valid JSON"),
        (["predict", "made-up-algo", "x.npy", "--out", "l.npy"], r"unknown algorithm 'kmedoids'"),
        (["predict", "wrong-k", "x.npy", "--out", "l.npy"], r"params n_clusters=7 but cluster_centers_ has 5 rows"),
        (["predict", "nan-centres", "x.npy", "--out", "l.npy"], r"cluster_centers_ holds NaN or infinity"),
        (["predict", "bad-type", "x.npy", "--out", "l.npy"], r"converged_ has type str"),
        (["predict", "nowhere", "x.npy", "--out", "l.npy"], r"nowhere is not a saved dask_clust model"),
        (
            ["predict", "model", "x.npy"],
            r"predict writes --out \(the labels\), --proba-out \(the probabilities\) or both",
        ),
        (["predict", "model", "x.npy", "--proba-out", "p.npy"], r"a kmeans model has no probabilities"),
        (["predict", "model", "x.npy", "--proba-out", "p.txt"], r"--proba-out p\.txt: the format follows the suffix"),
        (
            ["predict", "model", "x.npy", "--out", "l.parquet", "--proba-out", "p.npy", "--keep", "id"],
            r"beside the labels or probabilities: --proba-out must be a \.parquet path; got p\.npy",
        ),
        (["show", "nowhere"], r"nowhere is not a saved dask_clust model"),
        (["show", "wrong-k"], r"params n_clusters=7 but cluster_centers_ has 5 rows"),
        (["demo", "--n", "0"], r"argument --n: expected a positive integer; got 0"),
        (["demo", "--n", "10", "-k", "20"], r"-k \(20\) and --true-clusters \(100\) must be <= --n \(10\)"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
@pytest.mark.cluster
def test_bad_input_exits_2_with_one_line_before_any_work(work, argv, msg):
    argv = [a.format(port=free_port()) for a in argv]
    before = set(os.listdir(work))
    proc = run(*argv, cwd=work)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dask-clust"), proc.stderr
    assert re.search(msg, lines[0]), lines[0]
    assert proc.stdout == ""
    assert set(os.listdir(work)) == before  # nothing written, not even a partial output


@pytest.mark.cluster
@pytest.mark.parametrize("suffix", [".npy", ".parquet", ".zarr"])
def test_failed_predict_leaves_nothing_and_keeps_the_old_output(work, suffix):
    out = f"labels{suffix}"
    good = run("predict", "model", "x.npy", "--out", out, cwd=work)
    assert good.returncode == 0, good.stderr
    kept = sorted(os.listdir(work / out)) if suffix != ".npy" else (work / out).read_bytes()
    bad = run("predict", "model", "nan.npy", "--out", out, cwd=work)
    assert bad.returncode == 2 and "NaN or infinity at row 2345, column 1 (from 0)" in bad.stderr, bad.stderr
    assert (sorted(os.listdir(work / out)) if suffix != ".npy" else (work / out).read_bytes()) == kept
    assert not [n for n in os.listdir(work) if ".partial-" in n]
    fresh = run("predict", "model", "nan.npy", "--out", f"fresh{suffix}", cwd=work)
    assert fresh.returncode == 2 and not os.path.exists(work / f"fresh{suffix}")


def columns_written(path):
    """The columns of a parquet dataset as any reader sees them (pandas hides an index it wrote)."""
    import pyarrow.dataset

    return pyarrow.dataset.dataset(path).schema.names


@pytest.mark.cluster
def test_labels_outputs_hold_the_models_labels(work):
    for suffix in (".npy", ".parquet", ".zarr"):
        assert run("predict", "model", "x.npy", "--out", f"all{suffix}", cwd=work).returncode == 0
    import dask.array as da

    import dask_clust

    want = dask_clust.load(work / "model").predict(np.load(work / "x.npy")).compute()
    np.testing.assert_array_equal(np.load(work / "all.npy"), want)
    np.testing.assert_array_equal(pd.read_parquet(work / "all.parquet")["label"].to_numpy(), want)
    assert columns_written(work / "all.parquet") == ["label"]
    np.testing.assert_array_equal(da.from_zarr(str(work / "all.zarr")).compute(), want)


@pytest.mark.cluster
def test_probability_outputs_hold_the_mixtures_posteriors(tmp_path):
    import dask.array as da

    import dask_clust

    X, _ = blobs(3000, 4, 5, seed=3)
    table = pd.DataFrame(X, columns=["a", "b", "c", "d"]).assign(id=np.arange(len(X)) + 7)
    table.to_parquet(tmp_path / "t.parquet")
    fit = run(
        "fit",
        "t.parquet",
        "--columns=-id",
        "--algo",
        "vcgmm",
        "-k",
        "5",
        "--seed",
        "0",
        "--out",
        "m",
        "--quiet",
        cwd=tmp_path,
    )
    assert fit.returncode == 0, fit.stderr
    argv = ["--out", "l.parquet", "--proba-out", "p.parquet", "--keep", "id", "--progress"]
    proc = run("predict", "m", "t.parquet", *argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # the tasks of each write counted to the end, one line each (stderr is no terminal)
    assert re.search(r"^writing labels: (\d+)/\1 tasks in [\d.]+ s$", proc.stderr, re.M), proc.stderr
    assert re.search(r"^writing probabilities: (\d+)/\1 tasks in [\d.]+ s$", proc.stderr, re.M), proc.stderr
    for suffix in (".npy", ".zarr"):
        assert run("predict", "m", "t.parquet", "--proba-out", f"p{suffix}", cwd=tmp_path).returncode == 0

    model = dask_clust.load(tmp_path / "m")
    ids, p = (a.compute() for a in model.predict_proba(X, output="truncated"))
    got = pd.read_parquet(tmp_path / "p.parquet")
    C = ids.shape[1]
    assert list(got.columns) == ["id"] + [f"component_{j}" for j in range(1, C + 1)] + [
        f"probability_{j}" for j in range(1, C + 1)
    ]
    assert columns_written(tmp_path / "p.parquet") == list(got.columns)
    np.testing.assert_array_equal(got["id"], table["id"])
    np.testing.assert_array_equal(got.filter(like="component_").to_numpy(), ids)
    np.testing.assert_array_equal(got.filter(like="probability_").to_numpy(), p)
    dense = model.predict_proba(X, output="dense").compute()
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), dense)
    np.testing.assert_array_equal(da.from_zarr(str(tmp_path / "p.zarr")).compute(), dense)
    np.testing.assert_array_equal(pd.read_parquet(tmp_path / "l.parquet")["label"], model.predict(X).compute())


@pytest.mark.cluster
def test_ctrl_c_exits_130_with_one_line(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: the command and its LocalCluster's workers."""
    import dask.array as da

    da.random.RandomState(0).random_sample((400_000, 8), chunks=(50_000, 8)).astype("float32").to_zarr(
        str(tmp_path / "x.zarr")
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dask_clust.cli",
            "fit",
            "x.zarr",
            "-k",
            "50",
            "--tol",
            "0",
            "--max-iter",
            "100000",
            "--progress",
        ],
        cwd=tmp_path,
        env=ENV,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    seen = ""
    while "seeding" not in seen:  # the cluster is up and the data loaded: the iterations are running
        line = proc.stderr.readline()
        assert line, "the fit ended before it could be interrupted"
        seen += line
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130
    assert rest.splitlines() == ["dask-clust: interrupted"], rest


@pytest.mark.cluster
def test_help_and_version_do_not_import_the_engine():
    code = (
        "import sys; from dask_clust.cli import build_parser; build_parser([]).format_help(); "
        "print(sorted(m for m in ('numba', 'dask', 'distributed', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    version = subprocess.run([sys.executable, "-m", "dask_clust.cli", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == "dask-clust 0.1.0"


@pytest.mark.cluster
def test_fit_and_predict_do_not_import_scikit_learn(work):
    """scikit-learn is the estimators' base (1.5 s to import): a command that fits or predicts never needs it."""
    code = (
        "import sys, numpy as np; from dask_clust import api; m = api.load('model'); "
        "m.predict(np.load('x.npy')); api.fit(np.load('x.npy'), 'kmeans', 3, max_iter=2); "
        "print('sklearn' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=work, env=ENV)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_global_flags_after_the_command():
    args = build_parser(["fit"]).parse_args(["fit", "x.npy", "-k", "3", "-v"])
    assert args.verbose == 1 and args.p_n_clusters == 3
    assert build_parser([]).parse_args(["-vv", "predict", "m", "x.npy", "--out", "l.npy"]).verbose == 2
    assert not hasattr(build_parser([]).parse_args(["predict", "m", "x.npy", "--out", "l.npy"]), "verbose")


def test_compile_says_where_and_for_which_cpu_and_runs_every_part(monkeypatch, capsys):
    import numba

    from dask_clust import warmup
    from dask_clust.cli import main

    calls = []
    monkeypatch.setattr(warmup, "compile_kernels", lambda: calls.append(1))
    monkeypatch.setattr(numba.config, "CACHE_DIR", "/tmp/numba-cache")
    monkeypatch.setattr(numba.config, "CPU_NAME", "x86-64-v3")
    assert main(["compile"]) in (0, None) and calls == [1]
    assert "into /tmp/numba-cache, for x86-64-v3" in capsys.readouterr().out
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setattr(numba.config, "CPU_NAME", None)
    main(["compile"])
    out = capsys.readouterr().out
    assert "the package's __pycache__" in out and "this machine's CPU" in out


def test_every_flag_is_lower_case_and_its_help_gives_its_default_once(capsys):
    """Issue #54: ``--G`` was the one capitalised flag (it stays, beside ``--g``), and argparse added
    "(default: ...)" to help that already said it, or that had none to give (None, a switch's False)."""
    parser = build_parser(["fit"])
    for flag in ("--g", "--G"):
        assert parser.parse_args(["fit", "x.npy", flag, "3"]).p_G == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["fit", "--help"])
    text = capsys.readouterr().out
    flags = set(re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", text))
    assert {f for f in flags if f != f.lower()} == {"--G"} and "--g VALUE, --G VALUE" in text
    for option in re.split(r"\n  (?=-)", text):
        assert len(re.findall(r"\(default", option)) <= 1, option
        assert "(default: None)" not in option and "(default: False)" not in option, option
    assert "(default: kmeans)" in text  # a default the help does not say is still given


@pytest.mark.cluster
def test_show_says_what_a_saved_model_holds(work):
    """Issue #54: no command showed what a saved model holds, and model.json did not say which dask_clust
    wrote it."""
    import dask_clust

    proc = run("show", "model", cwd=work)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    shown, model = json.loads(proc.stdout), dask_clust.load(work / "model")
    assert shown["written_by"] == f"dask_clust {dask_clust.__version__}" == model.written_by
    assert (shown["kind"], shown["algo"], shown["n_clusters"], shown["n_features"]) == ("clustering", "kmeans", 5, 4)
    assert shown["objective"] == model.objective_ and shown["n_iter"] == model.n_iter_
    assert shown["params"] == json.loads(json.dumps(model.params))


def test_a_flag_is_only_its_whole_name(capsys):
    """Issue #54: argparse's abbreviations took ``--n-init 3`` as ``--n-init-esteps 3``, without a word."""
    parser = build_parser(["fit"])
    assert parser.parse_args(["fit", "x.npy", "-k", "3", "--n-init-esteps", "3"]).p_n_init_esteps == 3
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["fit", "x.npy", "-k", "3", "--n-init", "3"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --n-init 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser([]).parse_args(["predict", "m", "x.npy", "--ou", "l.npy"])


@pytest.mark.cluster
def test_sweep_prints_each_ks_criteria_and_the_k_they_pick(work):
    done = run(
        "sweep", "x.npy", "-k", "2,5,8", "--algo", "kmeans", "--seed", "0", "--table-out", "t.csv", "--quiet", cwd=work
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["algo"], out["criterion"]) == ("kmeans", "simplified_silhouette")
    assert [row["k"] for row in out["table"]] == [2, 5, 8]
    best = max(out["table"], key=lambda row: row["simplified_silhouette"])
    assert out["best_k"] == best["k"]
    table = pd.read_csv(work / "t.csv", index_col="k")
    np.testing.assert_allclose(table["simplified_silhouette"], [row["simplified_silhouette"] for row in out["table"]])
    bad = run("sweep", "x.npy", "-k", "2,5", "--criterion", "bic", "--quiet", cwd=work)
    assert bad.returncode == 2 and "criterion must be one of" in bad.stderr and len(bad.stderr.splitlines()) == 1
    own = run("sweep", "x.npy", "-k", "2,5", "--algo", "kmeans", "--seed", "0", "--own-seeding", "--quiet", cwd=work)
    alone = run("fit", "x.npy", "-k", "2", "--algo", "kmeans", "--seed", "0", "--quiet", cwd=work)
    # k = 2's model is fit's own (its k-means|| rounds, not those drawn for k = 5): its QE, bit for bit
    assert json.loads(own.stdout)["table"][0]["objective"] == json.loads(alone.stdout)["objective"]
