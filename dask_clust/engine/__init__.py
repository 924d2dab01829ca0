"""The only layer that talks to Dask; algorithms see the ``Engine`` verbs of ``ops.py``."""

from .calls import Halo, ReduceScatter
from .data import as_source
from .ops import Engine, open_engine, open_local
from .rowfiles import restored_rows

__all__ = ["Engine", "Halo", "ReduceScatter", "as_source", "open_engine", "open_local", "restored_rows"]
