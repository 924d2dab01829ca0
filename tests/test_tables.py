"""Tables in and out, as an ETL job uses them: a parquet dataset with a key and a label beside the features,
its feature columns fitted (``columns=``, ``--columns``), and the labels written back beside the key."""

import json

import numpy as np
import pandas as pd
import pytest

import dask_clust
from dask_clust.cli import main
from dask_clust.errors import InputError
from tests.reference import lloyd as ref
from tests.reference.make_blobs import blobs

FEATURES = [f"f{j}" for j in range(16)]
FILES, ROWS = 8, 400


@pytest.fixture(scope="module")
def events(tmp_path_factory):
    """8 parquet files: an int64 id, 16 float32 features, a string label (small files, which dask merges
    into fewer partitions once the id and label are projected away)."""
    X, y = blobs(FILES * ROWS, 16, 5, seed=3)
    where = tmp_path_factory.mktemp("events")
    for i in range(FILES):
        rows = slice(i * ROWS, (i + 1) * ROWS)
        frame = pd.DataFrame(X[rows], columns=FEATURES)
        frame.insert(0, "id", np.arange(rows.start, rows.stop, dtype=np.int64))
        frame["label"] = np.where(y[rows] % 2 == 0, "even", "odd")
        frame.to_parquet(where / f"part-{i}.parquet")
    return str(where), X


def _in_memory(X, k=5):
    return dask_clust.fit(X, "kmeans", k, random_state=0, client="in-process")


def _labels_by_id(path):
    out = pd.read_parquet(path).sort_values("id")
    np.testing.assert_array_equal(out["id"].to_numpy(), np.arange(FILES * ROWS))
    return out


@pytest.mark.cluster
def test_projected_parquet_fits_and_labels_go_back_beside_the_key(events, tmp_path, cluster):
    import dask.dataframe as dd

    path, X = events
    ddf = dd.read_parquet(path)
    model = dask_clust.fit(ddf[FEATURES], "kmeans", 5, random_state=0, client=cluster)
    want = _in_memory(X)
    np.testing.assert_allclose(model.cluster_centers_, want.cluster_centers_, rtol=1e-10)
    assert list(model.feature_names_in_) == FEATURES
    ddf[["id"]].assign(cluster=model.predict(ddf[FEATURES])).to_parquet(str(tmp_path / "labels"))
    out = _labels_by_id(tmp_path / "labels")
    np.testing.assert_array_equal(out["cluster"].to_numpy(), ref.assign(X, want.cluster_centers_)[0])


def test_columns_select_the_features_of_a_table_or_a_path(events):
    import dask.dataframe as dd

    path, X = events
    want = _in_memory(X).cluster_centers_
    for table in (path, dd.read_parquet(path), pd.read_parquet(path)):
        got = dask_clust.fit(table, "kmeans", 5, random_state=0, client="in-process", columns=FEATURES)
        np.testing.assert_allclose(got.cluster_centers_, want, rtol=1e-10)


def test_a_key_column_fitted_as_a_feature_is_warned_of(events):
    """Issue #54: an integer key column (``customer_id``) was clustered as a feature, without a word, when
    ``columns`` was forgotten. Integer columns named as identifiers are named in a warning; chosen columns,
    and integer features named otherwise, are fitted without one."""
    import warnings

    path, X = events
    frame = pd.DataFrame(X[:, :3], columns=["a", "b", "c"])
    frame["visits"] = np.arange(len(frame)) % 7
    for key in ("customer_id", "customerId", "row_key"):
        with pytest.warns(UserWarning, match=rf"columns \['{key}'\] look like keys .* 5 columns"):
            _in_memory(frame.assign(**{key: np.arange(len(frame))}))
    with pytest.warns(UserWarning, match=r"columns \['id'\] look like keys"):
        _in_memory(pd.read_parquet(path)[["id", *FEATURES]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _in_memory(frame)
        dask_clust.fit(frame.assign(id=0), "kmeans", 5, columns=["a", "b"], random_state=0, client="in-process")


def test_pandas_predict_is_a_series_on_the_frame_index(events):
    path, X = events
    frame = pd.read_parquet(path).set_index("id")
    model = dask_clust.fit(frame, "kmeans", 5, random_state=0, client="in-process", columns=FEATURES)
    got = model.predict(frame[FEATURES])
    assert isinstance(got, pd.Series) and got.name == "label"
    pd.testing.assert_index_equal(got.index, frame.index)
    np.testing.assert_array_equal(got.to_numpy(), ref.assign(X, model.cluster_centers_)[0])


def test_cli_fit_and_predict_with_columns_and_keep(events, tmp_path, capsys):
    path, X = events
    model_dir = str(tmp_path / "model")
    assert (
        main(["fit", path, "--columns", ",".join(FEATURES), "-k", "5", "--seed", "0", "--out", model_dir, "--quiet"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["features"] == FEATURES  # the summary names what was fitted
    model = dask_clust.load(model_dir)
    np.testing.assert_allclose(model.cluster_centers_, _in_memory(X).cluster_centers_, rtol=1e-10)
    assert list(model.feature_names_in_) == FEATURES
    want = ref.assign(X, model.cluster_centers_)[0]
    # the feature columns: by default those the model was fitted on; or named
    for i, extra in enumerate(([], ["--columns", ",".join(FEATURES)])):
        out = str(tmp_path / f"labels{i}.parquet")
        assert main(["predict", model_dir, path, "--keep", "id", "--out", out, *extra]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["labels"] == out
        np.testing.assert_array_equal(_labels_by_id(out)["label"].to_numpy(), want)


@pytest.mark.parametrize(
    "flag", [["--columns", "f*"], ["--columns=-id,-label"], ["--columns", "f?,f1?"], ["--columns=-label,-id"]]
)
def test_cli_columns_take_patterns_and_exclusions(events, tmp_path, capsys, flag):
    """Issue #54: --columns had to spell out every feature. Shell patterns and exclusions (every other column)
    select the same features, in the table's order; a list of names is taken as given."""
    path, X = events
    assert main(["fit", path, *flag, "-k", "5", "--seed", "0", "--out", str(tmp_path / "m"), "--quiet"]) == 0
    capsys.readouterr()
    model = dask_clust.load(tmp_path / "m")
    assert list(model.feature_names_in_) == FEATURES
    np.testing.assert_allclose(model.cluster_centers_, _in_memory(X).cluster_centers_, rtol=1e-10)


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--columns", "f0,nope"], r"columns \['nope'\] are not in the input; its columns are \['id', 'f0'"),
        ([], r"non-numeric columns: \['label'\] \(choose the feature columns with columns=\[\.\.\.\], or --columns"),
        (["--columns", "g*,f1"], r"--columns \['g\*'\] match no column; the columns are \['id', 'f0'"),
        (["--columns=-id,-label,-f*"], r"--columns -id,-label,-f\* leaves no column of \['id'"),
    ],
)
def test_cli_fit_refuses_columns_it_cannot_use(events, tmp_path, capsys, argv, msg):
    import re

    path, _ = events
    assert main(["fit", path, "-k", "3", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(msg, err), err


def test_cli_predict_refuses_keep_without_parquet_and_columns_of_an_array(events, tmp_path, capsys):
    path, X = events
    model_dir = str(tmp_path / "m")
    _in_memory(X).save(model_dir)
    np.save(tmp_path / "x.npy", X)
    assert main(["predict", model_dir, path, "--keep", "id", "--out", str(tmp_path / "l.npy")]) == 2
    assert "--out must be a .parquet path" in capsys.readouterr().err
    assert (
        main(["predict", model_dir, str(tmp_path / "x.npy"), "--columns", "f0", "--out", str(tmp_path / "l.npy")]) == 2
    )
    assert "name columns of a table" in capsys.readouterr().err
    assert not (tmp_path / "l.npy").exists()


def test_bad_columns_and_frames_are_refused_by_name(events, tmp_path):
    path, X = events
    frame = pd.read_parquet(path)
    with pytest.raises(InputError, match=r"columns= selects the features of a table .*got ndarray"):
        dask_clust.fit(X, "kmeans", 3, columns=FEATURES)
    with pytest.raises(InputError, match=r"columns must be a non-empty list of column names; got 'f0'"):
        dask_clust.fit(frame, "kmeans", 3, columns="f0")
    with pytest.raises(InputError, match=r"columns names a column twice: \['f1'\]"):
        dask_clust.fit(frame, "kmeans", 3, columns=["f1", "f2", "f1"])
    model = dask_clust.fit(frame, "kmeans", 3, random_state=0, client="in-process", columns=FEATURES[:4])
    with pytest.raises(InputError, match=r"X's columns \['f1', 'f0', 'f2', 'f3'\] are not the ones the model was"):
        model.predict(frame[["f1", "f0", "f2", "f3"]])
    # the names survive save and load, and a model fitted on an array takes any names of its width
    model.save(tmp_path / "m")
    assert list(dask_clust.load(tmp_path / "m").feature_names_in_) == FEATURES[:4]
    plain = dask_clust.fit(X[:, :4], "kmeans", 3, random_state=0, client="in-process")
    assert not hasattr(plain, "feature_names_in_")
    np.testing.assert_array_equal(
        plain.predict(frame[["f1", "f0", "f2", "f3"]]).to_numpy(),
        ref.assign(X[:, [1, 0, 2, 3]], plain.cluster_centers_)[0],
    )


def test_missing_values_in_a_dask_partition_are_named(events):
    import dask.dataframe as dd

    path, X = events
    frame = pd.read_parquet(path)[FEATURES].astype("Float32")
    frame.iloc[ROWS + 7, 2] = pd.NA
    model = _in_memory(X)
    with pytest.raises(InputError, match=r"Column 'f2' has a missing value \(NA\) at row 7 of partition 1"):
        model.predict(dd.from_pandas(frame, npartitions=FILES)).compute(scheduler="sync")


def test_a_parquet_path_is_read_file_by_file_with_its_row_counts_from_the_footers(tmp_path, monkeypatch):
    """A parquet dataset on a path (12 files named so that natural and plain sorting differ, one of three row
    groups, an id column left out) is read without a pass to count its rows (dask's
    ``compute_chunk_sizes``, made to fail here): one stored block per row group, the rows in
    ``dd.read_parquet``'s order; an NA in a nullable feature column is named from the footer's null count
    before any work, with its row; a dataset with a ``_metadata`` file is read by dask, the same rows."""
    import dask.array as da
    import dask.dataframe as dd

    from dask_clust.engine.data import as_source

    rng = np.random.default_rng(0)
    where = tmp_path / "parts"
    where.mkdir()
    for i in range(12):
        n = 50 + 7 * i
        frame = pd.DataFrame(rng.normal(size=(n, 3)).astype(np.float32), columns=["a", "b", "c"])
        frame.insert(0, "id", np.arange(n))
        frame.to_parquet(where / f"part.{i}.parquet", row_group_size=40 if i == 4 else None)
    want = dd.read_parquet(str(where))[["a", "c"]].compute().to_numpy()

    def no_count(self):
        raise AssertionError("a pass to count the rows")

    monkeypatch.setattr(da.Array, "compute_chunk_sizes", no_count)
    source = as_source(str(where), columns=["a", "c"])
    assert source.stored.numblocks[0] == 11 + 2 and source.n_samples == len(want)  # part.4: 78 rows, 2 groups
    np.testing.assert_array_equal(source.stored.compute(), want)
    files = sorted(where.iterdir(), key=lambda p: int(p.name.split(".")[1]))
    assert files != sorted(where.iterdir())  # part.10 comes after part.9, not after part.1
    np.testing.assert_array_equal(want, np.concatenate([pd.read_parquet(f)[["a", "c"]].to_numpy() for f in files]))
    model = dask_clust.fit(str(where), "kmeans", 3, columns=["a", "c"], random_state=0, client="in-process")
    np.testing.assert_array_equal(model.cluster_centers_, _in_memory(want, 3).cluster_centers_)

    na = tmp_path / "na"
    na.mkdir()
    for i in range(3):
        a = pd.array([1.0, 2.0, None if i == 1 else 3.0, 4.0], dtype="Float32")
        pd.DataFrame({"a": a, "b": np.ones(4, np.float32)}).to_parquet(na / f"part.{i}.parquet")
    with pytest.raises(InputError, match=r"Column 'a' has a missing value \(NA\) at row 2 of partition 1"):
        as_source(str(na))

    meta = str(tmp_path / "meta")  # a _metadata file: dask reads it (and counts the rows)
    dd.from_pandas(pd.DataFrame(rng.normal(size=(90, 2)), columns=["a", "b"]), npartitions=3).to_parquet(
        meta, write_metadata_file=True, write_index=False
    )
    monkeypatch.undo()
    got = as_source(meta)
    np.testing.assert_array_equal(got.stored.compute(), dd.read_parquet(meta).compute().to_numpy())
