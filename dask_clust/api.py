"""Public entry points: ``fit`` and ``load`` (the estimators over ``fit``: ``estimators.py``). Parameters and
data are validated here, once, before any work (ARCHITECTURE.md, rule 8)."""

import contextlib
import logging
import numbers
import time
import warnings
from dataclasses import fields

import numpy as np

from . import algorithms
from . import checkpoint as checkpoint_
from . import progress as progress_
from ._params import build_config
from ._random import check_random_state
from .engine import as_source, open_engine
from .engine.data import as_table, feature_names, key_columns, select_columns, stored_row_bytes
from .errors import ConvergenceWarning, InputError, InvalidParameterError, UnguardedScript
from .loop import Loop
from .mixture import MixtureModel
from .models import ClusteringModel

logger = logging.getLogger("dask_clust")


class _Default:
    def __repr__(self):
        return "<algorithm default>"


DEFAULT = _Default()


# rows a cluster below which a fit is warned of: a k near N is most often a mistake (a column count, a unit)
FEW_ROWS_A_CLUSTER = 2


def check_against_data(spec, cfg, source):
    """What every algorithm needs of the data, then what its spec adds (``AlgorithmSpec.check_data``): all
    before an engine opens, so bad data costs no pass over it."""
    if source.sparse and not spec.sparse:
        raise InputError(
            f"algo={spec.name!r} does not take sparse input yet (the algorithms that do: {algorithms.sparse()}): "
            "pass X.toarray() if it fits in memory"
        )
    if not spec.weighted and getattr(source, "weights", None) is not None:
        raise InputError(f"algo={spec.name!r} does not take sample_weight: {spec.unweighted_because}")
    k = getattr(cfg, "n_clusters", None)
    if k is not None and k > source.n_samples:
        raise InputError(f"n_clusters={k} must be <= n_samples={source.n_samples}")
    if k is not None and k * FEW_ROWS_A_CLUSTER > source.n_samples:
        warnings.warn(
            f"n_clusters={k:,} leaves {source.n_samples / k:.2g} rows a cluster on average ({source.n_samples:,} "
            f"rows): a centre then rests on a row or two, and every pass costs O(N·k·D) = "
            f"{source.n_samples * k * source.n_features:.2g} multiply-adds. Was k meant to be this large?",
            UserWarning,
            stacklevel=3,
        )
    init = getattr(cfg, "init", None)
    if init is not None and not isinstance(init, str):
        shape = np.shape(init)
        if shape != (k, source.n_features):
            raise InputError(
                f"init array has shape {shape}; expected (n_clusters, n_features) = ({k}, {source.n_features})"
            )
        if algorithms.spherical(cfg):
            zero = np.flatnonzero(~np.any(np.asarray(init, dtype=np.float64) != 0, axis=1))
            if len(zero):
                raise InputError(f"init row {zero[0]} has zero norm: under metric='cosine' a centre is a direction")
    if spec.check_data is not None:
        spec.check_data(cfg, source)


def _loop_length(spec, cfg):
    """The most iterations an algorithm's loop runs (``AlgorithmSpec.loop_length``)."""
    return 1 if spec.loop_length is None else getattr(cfg, spec.loop_length)


def _warn_unconverged(spec, cfg, result, loop):
    """A ConvergenceWarning when the loop ran out before the stopping rule held; an algorithm without one
    (``tol`` 0 or none: SBE, mini-batch by default) and a fit the callback stopped do not warn."""
    algo, limit = spec.name, spec.loop_length
    if (
        limit is None
        or result.converged
        or loop.stopped
        or not getattr(cfg, "tol", 0)
        or result.n_iter < getattr(cfg, limit)
    ):
        return
    warnings.warn(
        f"{algo} ended at {limit}={getattr(cfg, limit)} before its stopping rule (tol={cfg.tol}) held: "
        f"raise {limit} or tol",
        ConvergenceWarning,
        stacklevel=4,
    )


def fit(
    X,
    algo=algorithms.DEFAULT,
    n_clusters=8,
    *,
    init=DEFAULT,
    random_state=None,
    max_iter=DEFAULT,
    tol=DEFAULT,
    client=None,
    sample_weight=None,
    progress=None,
    callback=None,
    checkpoint=None,
    resume=None,
    checkpoint_every=10,
    checkpoint_seconds=300.0,
    columns=None,
    **params,
):
    """Fit a clustering model to X and return a ``ClusteringModel``.

    X: numpy or dask array, pandas or dask DataFrame (numeric columns), or a path to a .npy file, a zarr
    array/group or a parquet dataset; rows are samples. Nothing passed in is modified.
    columns: the feature columns of a table (a DataFrame or a parquet dataset), leaving keys and labels
    out; the model records them as ``feature_names_in_`` (every column of a table when None).
    algo: one of ``dask_clust.algorithms.REGISTRY`` (an unknown name raises, listing the valid ones).
    init, max_iter, tol and ``**params``: the algorithm's parameters (defaults: its config dataclass).
    random_state: int, SeedSequence or None. The same value and chunking give the same model on any
    number of workers.
    client: a ``distributed.Client``, a scheduler address, "in-process", or None (the current client if
    one exists; in-memory data up to 1 GiB is fitted in this process; otherwise a LocalCluster sized to
    the machine is started for the fit and closed again).
    progress: a bar per phase (loading, coreset, seeding, iterations, final pass) on stderr. None (default):
    bars when stderr is a terminal, nothing otherwise; True: bars on a terminal, one line per phase
    elsewhere (logs); False: nothing.
    callback(record) is called after every iteration with the history record plus "centers", the centres
    after that iteration (raise ``dask_clust.StopFit`` to stop early).
    checkpoint: a directory the fit's state is written to after every ``checkpoint_every`` iterations,
    whenever ``checkpoint_seconds`` have passed since the last write, and when the loop ends (npz and JSON,
    replaced atomically: a fit killed at any moment leaves the last one whole). When the directory already
    holds a checkpoint of this fit (same algorithm, parameters and data), the fit continues from it; one of
    another fit is refused, never replaced. On a cluster, per-row state is written by the workers that hold
    the rows: the directory must be on a filesystem they share with this process.
    resume: a checkpoint directory to continue from (it must hold one of this fit). A resumed fit ends with
    the model an uninterrupted one gives, bit for bit; with random_state=None it takes the checkpoint's.
    Algorithms that can resume: ``dask_clust.algorithms.resumable()``.
    """
    spec, cfg = configured(algo, n_clusters, init, max_iter, tol, params)
    _check_checkpointing(spec, checkpoint, resume, checkpoint_every, checkpoint_seconds)
    stored = checkpoint_.stored_entropy(resume if resume is not None else checkpoint)
    entropy = stored if random_state is None and stored is not None else check_random_state(random_state)
    source, names = sourced(X, columns, sample_weight, cfg)
    check_against_data(spec, cfg, source)
    saved = None
    if checkpoint is not None or resume is not None:
        saved = checkpoint_.Checkpoint(
            checkpoint,
            resume,
            checkpoint_.identity(algo, fitted_params(cfg, entropy), source),
            checkpoint_every,
            checkpoint_seconds,
            spec.saved(cfg, source.n_samples, source.n_features),
        )
    t0 = time.perf_counter()
    with progress_.reporting(progress), contextlib.ExitStack() as stack:
        if saved is not None:
            stack.callback(saved.release)
        engine = opened(stack, source, client, entropy, algorithms.state_of(spec, cfg, stored_row_bytes(source) + 8))
        if saved is not None:
            saved.check_summary(engine.summary)
            stack.callback(saved.close)
        result, loop = fitted(engine, spec, cfg, entropy, callback, saved)
        info = engine.describe()
    info["wall_s"] = time.perf_counter() - t0
    return model_of(spec, cfg, entropy, result, loop, info, names)


def configured(algo, n_clusters, init, max_iter, tol, params):
    """The algorithm's spec and its config from the parameters given (``DEFAULT``: the algorithm's own)."""
    spec = algorithms.get(algo)
    given = {"n_clusters": n_clusters, "init": init, "max_iter": max_iter, "tol": tol, **params}
    given = {k: v for k, v in given.items() if v is not DEFAULT}
    return spec, build_config(spec.config, f"algo={algo!r}", given)


def sourced(X, columns, sample_weight, cfg):
    """The input's ``Source`` and its feature names (a table's), warning of key-like columns fitted as
    features."""
    table = as_table(select_columns(X, columns))  # (a parquet path opened once, for both)
    names = feature_names(table)
    keys = key_columns(table) if columns is None else []
    if keys:
        warnings.warn(
            f"columns {keys} look like keys (integers named as identifiers) and are fitted as features: without "
            f"columns=, every one of the table's {len(names)} columns is one; choose the features with "
            "columns=[...] (--columns on the command line)",
            UserWarning,
            stacklevel=3,
        )
    return as_source(X, sample_weight, columns=columns, unit=algorithms.spherical(cfg)), names


def opened(stack, source, client, entropy, state):
    """An engine over ``source`` entered on ``stack``, its loading shown as a progress phase."""
    with progress_.phase(f"loading {source.n_samples:,} x {source.n_features}", source.n_chunks, "chunk") as shown:
        try:
            engine = stack.enter_context(open_engine(source, client, entropy, state))
        except UnguardedScript as exc:  # the explanation, without the cluster's start-up frames
            raise UnguardedScript(str(exc)) from None
        shown.update(source.n_chunks - shown.n)
    return engine


def fitted(engine, spec, cfg, entropy, callback=None, saved=None, final=None):
    """One fit on an open engine, published on the dashboard while it runs: (``FitResult``, its ``Loop``).
    ``final``: a ``DeferredFinal`` when the caller measures the centres over every row itself."""
    source = engine.source
    logger.info(
        "fitting %s (k=%s) on %d x %d %s in %d chunks (%s)",
        spec.name,
        getattr(cfg, "n_clusters", "-"),
        source.n_samples,
        source.n_features,
        source.dtype,
        source.n_chunks,
        engine.backend.kind,
    )
    with contextlib.ExitStack() as shown:
        told = engine.publisher(spec.name, spec.figure, getattr(cfg, "n_clusters", None))
        if told is not None:
            shown.enter_context(progress_.publishing(told))
            shown.callback(told.finish)
        loop = Loop(
            spec.name,
            _loop_length(spec, cfg),
            callback=callback,
            progress=True,
            checkpoint=saved,
            stops_early=bool(getattr(cfg, "tol", 0)),
            figure=spec.figure,
            final=final,
        )
        return spec.fit(engine, cfg, entropy, loop), loop


def fitted_params(cfg, entropy):
    """A model's ``params``: its config's fields and the entropy it was fitted with."""
    return {**{f.name: getattr(cfg, f.name) for f in fields(cfg)}, "random_state": entropy}


def model_of(spec, cfg, entropy, result, loop, info, names):
    """The fitted model of a ``FitResult`` (a ``MixtureModel`` for a probabilistic algorithm), warning when the
    loop ran out before its stopping rule held."""
    _warn_unconverged(spec, cfg, result, loop)
    logger.info(
        "%s finished: %d iterations, objective %s, %.2f s",
        spec.name,
        result.n_iter,
        "not computed" if result.objective is None else f"{result.objective:.6g}",
        info["wall_s"],
    )
    kind = MixtureModel if spec.probabilistic else ClusteringModel
    return kind(
        spec.name,
        fitted_params(cfg, entropy),
        result.centers,
        n_iter_=result.n_iter,
        converged_=result.converged,
        history_=result.history,
        n_distance_evals_=result.distance_evals,
        objective_=result.objective,
        extras_=result.extras,
        engine_=info,
        feature_names_in_=names,
    )


def _check_checkpointing(spec, checkpoint, resume, every, seconds):
    if (checkpoint is not None or resume is not None) and not spec.resumable:
        raise InvalidParameterError(
            f"algo={spec.name!r} cannot be checkpointed or resumed yet; the algorithms "
            f"that can are {algorithms.resumable()}"
        )
    if not (isinstance(every, numbers.Integral) and not isinstance(every, bool) and every >= 1):
        raise InvalidParameterError(f"checkpoint_every must be an int >= 1 (iterations); got {every!r}")
    if not (isinstance(seconds, numbers.Real) and not isinstance(seconds, bool) and seconds > 0):
        raise InvalidParameterError(f"checkpoint_seconds must be a number > 0; got {seconds!r}")


def load(path):
    """Read a model written by ``ClusteringModel.save`` (a ``ClusteringModel`` or a ``MixtureModel``)."""
    return ClusteringModel.load(path)
