"""The only layer that talks to Dask; algorithms see the ``Engine`` verbs of ``ops.py``."""
from .data import as_source, check_random_state
from .ops import Engine, open_engine
from .loop import FitResult, Loop

__all__ = ["Engine", "FitResult", "Loop", "as_source", "check_random_state", "open_engine"]
