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
