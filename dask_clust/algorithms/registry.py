"""The algorithm registry: ``algo="name"`` → a config dataclass (with its constraint table) and a fit
driver. ``fit``, the estimator classes, the CLI and the benchmark harness are all generated from it. The
algorithm modules import it; the package imports them (each registers itself), so nothing imports upward."""

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    config: type  # dataclass with a ``constraints`` dict: field → list of constraints
    fit: object  # fit(engine, config, entropy, loop) -> engine.FitResult
    estimator: str  # the estimator class name in ``dask_clust``
    summary: str  # one line for the README table and the CLI help
    reference: str  # the paper
    objective: str  # what history_'s per-iteration "objective" is (the model's objective_ is the
    # exact QE of the returned centres over all rows unless vc-GMM's
    # final_objective says otherwise, loop.FitResult)
    weighted: bool = True  # takes sample_weight (the estimator's fit has the parameter only then)
    state_bytes: object = None  # (config) -> bytes of state the fit keeps per input row through the fit
    # (the engine streams or refuses with them counted); None: none
    keeps_rows: bool = False  # its state holds a copy of its input rows and weights besides (counted too)
    thread_bytes: object = None  # (config) -> bytes of buffers each worker thread keeps through the fit
    # (``Chunk.scratch``), counted when the input streams; None: none
    resumable: bool = False  # fit(checkpoint=, resume=) continues it to the same bits (its fit saves
    # through loop.save and starts from loop.restored)
    saved: object = None  # (config, n_samples, n_features) -> {name: spec} of what its checkpoint holds
    # (``checkpoint.check_saved``): a resumed fit's state is checked against it
    # before any work; every resumable algorithm declares it
    model_extras: tuple = ()  # (name, check(value, n_clusters) -> bool, what it must be) for each extras_
    # entry its model's predict/transform read: a saved model must carry them,
    # valid, and no other algorithm's model may (``models.load`` checks)


# specs of what checkpoints hold (``AlgorithmSpec.saved``, ``checkpoint.check_saved``)
BIG = 1.7976931348623157e308
COUNT = ("int", 0, 2**63)  # distance evaluations, steps
NUMBER = ("float", -BIG, BIG, False)  # any finite number
MAYBE = ("float", -BIG, BIG, True)  # a finite number, or None before the first


def centres(cfg, n_features):
    """k finite centres of the data's width."""
    return ("floats", (cfg.n_clusters, n_features))


def state_of(spec, cfg, row_bytes):
    """(bytes of per-row state, who keeps it, bytes of buffers per worker thread): what ``open_engine``
    counts for the fit of ``spec`` on rows of ``row_bytes`` bytes each (with their weight)."""
    return (
        (int(spec.state_bytes(cfg)) if spec.state_bytes else 0) + (row_bytes if spec.keeps_rows else 0),
        f"algo={spec.name!r}",
        (int(spec.thread_bytes(cfg)) if spec.thread_bytes else 0),
    )


REGISTRY = {}


def final_pass(engine, centers, rows="all rows"):
    """The exact QE of the returned centres over the engine's rows and its distance evaluations (one pass)."""
    from .. import progress
    from ..blocks.lloyd import quantization_error

    with progress.phase(f"final pass (QE of {rows})", 1, "pass") as shown:
        qe, evals = quantization_error(engine, centers)
        shown.update()
    return qe, evals


def finish(engine, centers, loop, distance_evals, extras, converged=None):
    """A fit's ``FitResult``: its objective is the exact QE of the returned centres over all rows (one
    pass), whatever the algorithm optimised on the way."""
    from ..loop import FitResult

    qe, qe_evals = final_pass(engine, centers)
    return FitResult(
        centers,
        qe,
        loop.n_iter,
        loop.converged if converged is None else converged,
        int(distance_evals) + qe_evals,
        loop.history,
        extras,
    )


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
