"""The algorithm registry: ``algo="name"`` → a config dataclass (with its constraint table) and a fit
driver. ``fit``, the estimator classes, the CLI and the benchmark harness are all generated from it."""
from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    config: type            # dataclass with a ``constraints`` dict: field → list of constraints
    fit: object             # fit(engine, config, entropy, loop) -> dict (see algorithms.kmeans.fit)
    estimator: str          # the estimator class name in ``dask_clust``
    summary: str            # one line for the README table and the CLI help
    reference: str          # the paper


REGISTRY = {}


def finish(engine, centers, loop, distance_evals, extras):
    """A fit's result (see ``kmeans.fit``) whose objective is the exact QE of the returned centres over all
    rows (one pass), whatever the algorithm optimised on the way."""
    from ..lloyd import quantization_error

    qe, qe_evals = quantization_error(engine, centers)
    return {"centers": centers, "objective": qe, "n_iter": loop.n_iter, "converged": loop.converged,
            "distance_evals": int(distance_evals) + qe_evals, "history": loop.history, "extras": extras}


def register(spec):
    REGISTRY[spec.name] = spec
    return spec


def get(name):
    if name not in REGISTRY:
        from .._params import InvalidParameterError

        raise InvalidParameterError(f"unknown algorithm {name!r}; valid algorithms are {sorted(REGISTRY)}")
    return REGISTRY[name]


from . import kmeans  # noqa: E402,F401  (registers itself)
from . import vcgmm  # noqa: E402,F401
from . import nmbatch  # noqa: E402,F401
from . import minibatch  # noqa: E402,F401
from . import vrkm  # noqa: E402,F401
from . import sbe  # noqa: E402,F401
