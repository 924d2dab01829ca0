"""The algorithms, each registered in ``registry`` when this package is imported (in this order: the
README's table, the CLI's help and the estimators follow it)."""

from .registry import (
    REGISTRY,
    AlgorithmSpec,
    final_pass,
    finish,
    get,
    register,
    resumable,
    sparse,
    spherical,
    state_of,
)
from . import kmeans  # noqa: F401,E402  (registers itself)
from . import vargmm  # noqa: F401,E402
from . import vcgmm  # noqa: F401,E402
from . import nmbatch  # noqa: F401,E402
from . import minibatch  # noqa: F401,E402
from . import vrkm  # noqa: F401,E402
from . import sbe  # noqa: F401,E402
from . import slk  # noqa: F401,E402

# ``fit``'s and the command line's algorithm when none is named
DEFAULT = "kmeans"

__all__ = [
    "DEFAULT",
    "REGISTRY",
    "AlgorithmSpec",
    "final_pass",
    "finish",
    "get",
    "register",
    "resumable",
    "sparse",
    "spherical",
    "state_of",
]
