"""Every bad-input error (ARCHITECTURE.md, rule 8), matched by regex, raised before any work; nothing the caller
passed is modified; a generated bad value for every declared constraint of every algorithm."""

from dataclasses import fields

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest

import dask_clust
from dask_clust import InputError, InvalidParameterError
from dask_clust.algorithms import REGISTRY
from tests.reference import lloyd as ref

X = np.random.default_rng(0).random((200, 3)).astype(np.float32)


def test_not_2d():
    with pytest.raises(InputError, match=r"Expected a 2-D array .* got an array of shape \(200,\)"):
        dask_clust.fit(X[:, 0], n_clusters=2)
    with pytest.raises(InputError, match=r"shape \(2, 3, 4\)"):
        dask_clust.fit(np.zeros((2, 3, 4)), n_clusters=2)


def test_empty():
    with pytest.raises(InputError, match=r"at least 1 sample and 1 feature"):
        dask_clust.fit(np.zeros((0, 3)), n_clusters=1)


@pytest.mark.parametrize("bad", [np.array([["a", "b"], ["c", "d"]]), np.zeros((3, 2), dtype=complex)])
def test_non_numeric(bad):
    with pytest.raises(InputError, match=r"Input must be numeric .* got dtype"):
        dask_clust.fit(bad, n_clusters=1)


def test_non_numeric_dataframe_columns():
    df = pd.DataFrame({"a": [1.0, 2.0, 3.0], "name": ["x", "y", "z"]})
    with pytest.raises(InputError, match=r"non-numeric columns: \['name'\]"):
        dask_clust.fit(df, n_clusters=1)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_inf_reported_with_chunk_and_row(value):
    Xb = X.copy()
    Xb[137, 2] = Xb[139, 0] = value
    # chunks of 20 rows (kept: within the configured bounds): row 137 is row 17 of chunk 6
    with (
        dask.config.set({"dask_clust.min-chunk-bytes": "200B", "dask_clust.chunking": "input"}),
        pytest.raises(InputError, match=r"NaN or infinity at row 137 \(chunk 6, row 17 of the chunk\), column 2 \("),
    ):
        dask_clust.fit(da.from_array(Xb, chunks=(20, 3)), n_clusters=2, client="in-process")


def test_values_whose_squares_overflow_are_named_in_the_first_pass(monkeypatch):
    """Issue #20: 1e300 squared overflows float64; the first pass names the row and its chunk, and nothing
    runs after it (here the first pass rides on k-means||'s first round, after the first centre's one-chunk
    read)."""
    from dask_clust.engine.ops import Engine

    Xb = np.random.default_rng(0).standard_normal((40_000, 3))
    Xb[3 * 10_000 + 7_777, 1] = -1e300
    calls = []
    reduce = Engine.reduce
    monkeypatch.setattr(Engine, "reduce", lambda self, step, *a, **k: calls.append(step) or reduce(self, step, *a, **k))
    with (
        dask.config.set({"dask_clust.min-chunk-bytes": "1KiB", "dask_clust.chunking": "input"}),
        pytest.raises(
            InputError,
            match=r"reach 1e\+300 in magnitude \(at row 37,777 \(chunk 3, row 7,777 of "
            r"the chunk\)\): sums of squared distances .* would overflow float64",
        ),
    ):
        dask_clust.fit(da.from_array(Xb, chunks=(10_000, 3)), n_clusters=2, client="in-process")
    assert [c.__name__ for c in calls] == ["_propose_in", "_update_and_draw"]


def test_n_clusters_larger_than_n_samples():
    with pytest.raises(InputError, match=r"n_clusters=201 must be <= n_samples=200"):
        dask_clust.fit(X, n_clusters=201)


def test_n_clusters_near_n_samples_is_warned_of():
    """Issue #54: k = 1,000,000 on 1.2 M rows started without a word; under 2 rows a cluster is warned of."""
    import warnings

    with pytest.warns(UserWarning, match=r"n_clusters=150 leaves 1.3 rows a cluster on average \(200 rows\)"):
        dask_clust.fit(X, n_clusters=150, random_state=0, client="in-process")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        dask_clust.fit(X, n_clusters=100, random_state=0, client="in-process", max_iter=100)


def test_init_array_shape():
    with pytest.raises(InputError, match=r"init array has shape \(2, 3\); expected .* \(3, 3\)"):
        dask_clust.fit(X, n_clusters=3, init=np.zeros((2, 3)))


def test_feature_mismatch_at_predict():
    m = dask_clust.fit(X, n_clusters=2, random_state=0)
    with pytest.raises(InputError, match=r"X has 4 features, but the model was fitted with 3 features"):
        m.predict(np.zeros((5, 4)))


def test_nan_at_predict_is_reported():
    m = dask_clust.fit(X, n_clusters=2, random_state=0)
    bad = X.copy()
    bad[153, 0] = np.nan
    with pytest.raises(InputError, match=r"NaN or infinity at row 153, column 0 \(from 0\)$"):  # the global row
        m.predict(da.from_array(bad, chunks=(50, 3))).compute()


def test_unknown_algorithm_lists_valid_ones():
    with pytest.raises(InvalidParameterError, match=r"unknown algorithm 'nope'; valid algorithms are \['kmeans'"):
        dask_clust.fit(X, algo="nope")


def test_unknown_parameter_lists_valid_ones():
    with pytest.raises(InvalidParameterError, match=r"unknown parameter\(s\) \['n_jobs'\]; valid parameters are \["):
        dask_clust.fit(X, n_clusters=2, n_jobs=4)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'copy_x'"):
        dask_clust.KMeans(copy_x=True)
    with pytest.raises(InvalidParameterError, match=r"The 'n_clusters' parameter of algo='kmeans' must be"):
        dask_clust.KMeans(0).fit(X)  # scikit-learn's rule: __init__ stores, fit validates


@pytest.mark.parametrize(
    "algo,name,constraint",
    [
        (a, f.name, c)
        for a, spec in REGISTRY.items()
        for f in fields(spec.config)
        for c in spec.config.constraints[f.name]
        if type(c).__name__ != "NoneOK"
    ],
)
def test_every_constraint_rejects_a_generated_bad_value(algo, name, constraint):
    bad = constraint.bad_value()
    with pytest.raises(InvalidParameterError, match=rf"The '{name}' parameter of algo='{algo}' must be"):
        dask_clust.fit(X, algo=algo, **{name: bad})


def test_every_parameter_has_constraints():
    for spec in REGISTRY.values():
        assert set(spec.config.constraints) == {f.name for f in fields(spec.config)}


def test_every_parameter_has_a_meaning_in_the_docstring_and_the_cli_help():
    from dask_clust._params import describe
    from dask_clust.cli import build_parser

    parser = build_parser(["fit"])
    fit_help = " ".join(parser._subparsers._group_actions[0].choices["fit"].format_help().split())
    fit_help = fit_help.replace("- ", "-")  # argparse wraps a line after a hyphen ('tied-spherical')
    for spec in REGISTRY.values():
        doc = getattr(dask_clust, spec.estimator).__doc__
        for f in fields(spec.config):
            meaning = describe(spec.config, f.name)
            assert meaning, (spec.name, f.name)
            assert meaning.split(":")[0].split(" (")[0][:30] in " ".join(doc.split()), (spec.name, f.name)
            flag = "--" + f.name.replace("_", "-") + " VALUE"
            assert flag in fit_help and f"{spec.name}: {f.default!r}" in fit_help, (spec.name, f.name)


@pytest.mark.parametrize(
    "bad,msg",
    [
        (np.ones(5), r"sample_weight must have shape \(200,\)"),
        (-np.ones(200), r"sample_weight must be non-negative"),
        (np.full(200, np.nan), r"sample_weight contains NaN or infinity at index 0"),
        (np.zeros(200), r"positive sum"),
    ],
)
def test_sample_weight_errors(bad, msg):
    with pytest.raises(InputError, match=msg):
        dask_clust.fit(X, n_clusters=2, sample_weight=bad)


def test_random_state_errors():
    with pytest.raises(InputError, match=r"random_state must be"):
        dask_clust.fit(X, n_clusters=2, random_state="zero")


@pytest.mark.parametrize(
    "make", [lambda: X.copy(), lambda: (X * 100).astype(np.int64), lambda: np.asfortranarray(X.astype(np.float64))]
)
def test_input_is_not_modified(make):
    data = make()
    before = data.copy()
    w = np.linspace(1, 2, 200)
    w_before = w.copy()
    m = dask_clust.fit(data, n_clusters=3, random_state=0, sample_weight=w)
    m.predict(data).compute()
    np.testing.assert_array_equal(data, before)
    np.testing.assert_array_equal(w, w_before)
    assert data.dtype == before.dtype


def test_integer_input_is_cast_to_float64_and_float32_kept():
    assert dask_clust.fit((X * 10).astype(np.int32), n_clusters=2, random_state=0).predict(X).dtype == np.int32
    from dask_clust.engine import as_source

    assert as_source((X * 10).astype(np.int32)).dtype == np.float64
    assert as_source(X).dtype == np.float32
    assert as_source(X.astype(np.float16)).dtype == np.float32


def test_a_fit_ended_by_its_iteration_limit_warns(small_blobs):
    import warnings

    X, _ = small_blobs
    init = X[:6].astype(np.float64)
    n_iter = ref.lloyd(X, init)[3]  # Lloyd's own count to convergence from these centres
    assert n_iter > 2
    with pytest.warns(
        dask_clust.ConvergenceWarning,
        match=r"kmeans ended at max_iter=2 before its stopping rule \(tol=0.0001\) held: raise max_iter or tol",
    ):
        assert not dask_clust.fit(X, n_clusters=6, init=init, max_iter=2, client="in-process").converged_
    with warnings.catch_warnings():
        warnings.simplefilter("error", dask_clust.ConvergenceWarning)
        assert dask_clust.fit(X, n_clusters=6, init=init, max_iter=n_iter + 1, client="in-process").converged_
        # SBE has no stopping rule: its limit is the plan, not a failure
        dask_clust.fit(X, "sbe", n_clusters=6, omaxit=2, random_state=0, client="in-process")


def test_every_default_setting_parses_as_dask_reads_it():
    """A default timeout or size that dask cannot parse fails only where it is read (``first-worker-timeout``'s
    "10min" did, on a cluster without workers): each is parsed here as dask's helpers parse it."""
    from dask.utils import parse_bytes, parse_timedelta

    from dask_clust.engine import config

    timeouts = [k for k in config.DEFAULTS if k.endswith("-timeout")]
    sizes = [k for k in config.DEFAULTS if k.endswith("-bytes") and k != "knn-exact-budget"]
    assert "first-worker-timeout" in timeouts and "model-bytes" in sizes
    assert parse_timedelta(config.DEFAULTS["first-worker-timeout"]) == 600
    for key in timeouts:
        assert parse_timedelta(config.DEFAULTS[key]) > 0, key
    for key in sizes:
        assert parse_bytes(config.DEFAULTS[key]) > 0, key
