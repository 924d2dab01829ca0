"""The algorithm registry: ``algo="name"`` → a config dataclass (with its constraint table) and a fit
driver. ``fit``, the estimator classes, the CLI and the benchmark harness are all generated from it. The
algorithm modules import it; the package imports them (each registers itself), so nothing imports upward."""

from dataclasses import dataclass

from ..engine.streaming import HOLDS_DRAWS


@dataclass(frozen=True)
class AlgorithmSpec:
    """What generic code (``api``, ``models``, the estimators, the CLI, the engine's sizing, the tests and the
    benchmark harness) knows of an algorithm: everything it needs, so none of it names an algorithm.

    name, config, fit: ``algo=name``; a dataclass with a ``constraints`` dict (field -> list of constraints);
        ``fit(engine, config, entropy, loop) -> loop.FitResult``.
    estimator, summary, reference: the estimator class name in ``dask_clust``; one line for the README table
        and the CLI help; the paper.
    objective: what ``history_``'s per-iteration "objective" is (the model's ``objective_`` is the exact QE
        of the returned centres over all rows, unless the config says otherwise: ``loop.FitResult``).
    loop_length: the config field bounding the loop (its iterations, epochs or outer iterations), or None.
    check_data(config, source): raises ``InputError`` for data the algorithm cannot fit with this config
        (beyond what every algorithm checks: n_clusters <= n_samples, an init array's shape), before an
        engine opens; None: nothing more.
    weighted: takes sample_weight (the estimator's fit has the parameter only then); when False,
        ``unweighted_because`` says why in the refusal.
    probabilistic: the model has truncated posteriors (``predict_proba``) and the estimator exposes them.
    sparse: takes rows as a scipy CSR matrix (its steps read ``chunk.x`` as CSR through the kernels' CSR
        paths, and its model predicts CSR rows); the others refuse one in a line.
    partial_step(config, x, w, centers, counts, since, entropy, step, dtype) -> (centers, counts, since): the
        estimator's ``partial_fit`` on a batch it holds (``since``: rows since the last reassignment;
        ``step``: the batches before it); None: no ``partial_fit``.
    state_bytes(config): bytes of state the fit keeps per input row through the fit (the engine streams or
        refuses with them counted); None: none. keeps_rows: its state holds a copy of its input rows and
        weights besides (counted too). thread_bytes(config): bytes of buffers each worker thread keeps
        through the fit (``Chunk.scratch``), counted when the input streams; None: none. state_files: its
        per-row state is touched by its steps alone (no backup, halo or partition-to-partition exchange of
        it), so a streamed fit whose state would not fit the workers' memory keeps it in local files between
        calls instead of being refused. holds_draws: on a streamed input it draws a window of steps' batches
        in one pass, held by the workers until used (``blocks/batches.py``): about a copy of their rows, so
        its state lives in their local files whenever the input streams.
    resumable: ``fit(checkpoint=, resume=)`` continues it to the same bits (its fit saves through
        ``loop.save`` and starts from ``loop.restored``). saved(config, n_samples, n_features) ->
        {name: spec} of what its checkpoint holds (``checkpoint.check_saved``): a resumed fit's state is
        checked against it before any work; every resumable algorithm declares it.
    model_extras: (name, check(value, n_clusters) -> bool, what it must be) for each ``extras_`` entry its
        model's predict/transform read: a saved model must carry them, valid, and no other algorithm's
        model may (``models.load`` checks).
    """

    name: str
    config: type
    fit: object
    estimator: str
    summary: str
    reference: str
    objective: str
    # the short name of that figure on the progress bar, the log and the model's plots ("objective" where it is
    # a QE, so that a free energy is not shown under the name of the model's QE)
    figure: str = "objective"
    loop_length: str | None = "max_iter"
    check_data: object = None
    sparse: bool = False
    weighted: bool = True
    unweighted_because: str = ""
    probabilistic: bool = False
    partial_step: object = None
    state_bytes: object = None
    keeps_rows: bool = False
    thread_bytes: object = None
    state_files: bool = False
    holds_draws: bool = False
    resumable: bool = False
    saved: object = None
    model_extras: tuple = ()

    def __post_init__(self):
        if not self.weighted and not self.unweighted_because:
            raise ValueError(f"algorithm {self.name!r} takes no sample_weight: say why (unweighted_because)")
        if self.loop_length is not None and self.loop_length not in self.config.__dataclass_fields__:
            raise ValueError(f"algorithm {self.name!r}: loop_length {self.loop_length!r} is not a config field")


# specs of what checkpoints hold (``AlgorithmSpec.saved``, ``checkpoint.check_saved``)
BIG = 1.7976931348623157e308
COUNT = ("int", 0, 2**63)  # distance evaluations, steps
NUMBER = ("float", -BIG, BIG, False)  # any finite number
MAYBE = ("float", -BIG, BIG, True)  # a finite number, or None before the first


# the metrics of the algorithms that take ``metric`` (their config's field), and its documentation
METRICS = ("euclidean", "cosine")
METRIC = (
    '"euclidean", or "cosine": spherical k-means (Dhillon & Modha, Machine Learning 2001): every row is '
    "divided by its norm as it is read (a row of zero norm is refused), centres stay on the unit sphere "
    "(each its cluster's mean direction), and objectives are Σ w (1 − cos)."
)


def spherical(cfg):
    """Whether a config asks for the unit sphere (``metric="cosine"``; a config without ``metric``: no)."""
    return getattr(cfg, "metric", "euclidean") == "cosine"


def centres(cfg, n_features):
    """k finite centres of the data's width."""
    return ("floats", (cfg.n_clusters, n_features))


def state_of(spec, cfg, row_bytes):
    """(bytes of per-row state, who keeps it, bytes of buffers per worker thread, whether the state may live
    in files, what works where the fit's state cannot fit): what ``open_engine`` counts for the fit of
    ``spec`` on rows of ``row_bytes`` bytes each (with their weight)."""
    return (
        (int(spec.state_bytes(cfg)) if spec.state_bytes else 0) + (row_bytes if spec.keeps_rows else 0),
        f"algo={spec.name!r}",
        (int(spec.thread_bytes(cfg)) if spec.thread_bytes else 0),
        HOLDS_DRAWS if spec.holds_draws else spec.state_files,
        routes(),
    )


def routes():
    """The fits whose state does not grow with the data, for a refusal to name: those that fit on a coreset
    (their ``coreset_size``) and those that keep their state in the workers' files."""
    coreset = sorted(n for n, s in REGISTRY.items() if "coreset_size" in s.config.__dataclass_fields__)
    files = sorted(n for n, s in REGISTRY.items() if s.state_files)
    return (
        f"fit on a coreset ({', '.join(f'algo={n!r}' for n in coreset)} with coreset_size=...), or with an "
        f"algorithm that keeps its state in the workers' local files ({', '.join(map(repr, files))})"
    )


REGISTRY = {}


def final_pass(engine, centers, rows="all rows", unit=False, loop=None):
    """The exact QE of the returned centres over the engine's rows and its distance evaluations (one pass);
    ``unit`` (rows and centres on the unit sphere): Σ w (1 − cos), half of it. Over all rows of a ``loop``
    whose caller measures them itself (``Loop.final``, a ``DeferredFinal``): (None, 0), marked taken."""
    from .. import progress
    from ..blocks.lloyd import quantization_error

    if loop is not None and loop.final is not None and rows == "all rows":
        loop.final.taken = True
        return None, 0

    with progress.phase(f"final pass ({'1 − cos' if unit else 'QE'} of {rows})", 1, "pass") as shown:
        qe, evals = quantization_error(engine, centers)
        shown.update()
    return (qe / 2 if unit else qe), evals


def finish(engine, centers, loop, distance_evals, extras, converged=None, unit=False):
    """A fit's ``FitResult``: its objective is the exact QE of the returned centres over all rows (one
    pass; ``unit``: Σ w (1 − cos)), whatever the algorithm optimised on the way."""
    from ..loop import FitResult

    qe, qe_evals = final_pass(engine, centers, unit=unit, loop=loop)
    return FitResult(
        centers,
        qe,
        loop.n_iter,
        loop.converged if converged is None else converged,
        int(distance_evals) + qe_evals,
        loop.history,
        extras,
    )


def sparse():
    """The algorithms that take a scipy CSR matrix."""
    return sorted(name for name, spec in REGISTRY.items() if spec.sparse)


def resumable():
    return sorted(name for name, spec in REGISTRY.items() if spec.resumable)


def register(spec):
    REGISTRY[spec.name] = spec
    return spec


def get(name):
    if name not in REGISTRY:
        from ..errors import InvalidParameterError

        raise InvalidParameterError(f"unknown algorithm {name!r}; valid algorithms are {sorted(REGISTRY)}")
    return REGISTRY[name]
