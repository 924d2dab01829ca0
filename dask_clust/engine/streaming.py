"""Rule 4 (ARCHITECTURE.md): whether an input streams from its source on every pass, and whether a
streaming worker would outgrow its memory limit, both decided before a fit starts."""

import cloudpickle
import dask
import numpy as np

from ..errors import InputError
from . import config
from .data import ArraySource, FutureSource

# what a streaming worker needs beyond its chunks, state and buffers, measured on CPython 3.11 (one worker of
# one thread, zarr stores of 1 and 2 GiB in 32 MiB chunks, Lloyd; ``benchmarks/bench_faults.py --parts
# stream``): the process after its first fit (numpy, numba's compiled kernels, distributed; 315-344 MiB),
# and what a streamed pass holds besides its chunk, the input block and the fit's state (the loader's
# compute, the codec's buffers, the partials: 33-34 MiB over 16.1 B of state per row, Lloyd's 16)
WORKER_BASE = 340 << 20


STREAM_PASS = 48 << 20


def fit_state(state):
    """(bytes of state per row, who keeps them, bytes of buffers per worker thread) of the ``state`` a fit
    declares (``algorithms.state_of``); the last may be left out (none)."""
    row_bytes, who, *buffers = state
    return int(row_bytes), who, int(buffers[0]) if buffers else 0


def should_stream(source, memory_bytes, state=(0, "the fit")):
    """Rule 4: stream a dask source from where it lives each pass when it and the fit's per-row state would
    take more than ``stream-fraction`` of the memory available to hold them (``stream``: "auto", True or
    False). ``state`` = (bytes per row, who keeps them[, bytes per thread]), declared by the algorithm: the
    state stays in memory either way, so a fit whose state alone is over that share is refused before it
    starts."""
    row_bytes, who, _ = fit_state(state)
    fraction = float(config.get("stream-fraction"))
    held = source.n_samples * int(row_bytes)
    if held > fraction * memory_bytes:
        raise InputError(
            f"{who} keeps {int(row_bytes)} B of state per row: {held / 1e9:.3g} GB for "
            f"{source.n_samples:,} rows, over stream-fraction = {fraction:g} of the "
            f"{memory_bytes / 1e9:.3g} GB of memory it runs in; add workers or memory, or fit on a "
            "sample (an algorithm with a coreset, or its coreset_size where the algorithm takes one)"
        )
    mode = config.get("stream")
    if isinstance(source, (ArraySource, FutureSource)) or mode is False or mode == "never":
        return False
    if mode is True or mode == "always":
        return True
    return source.nbytes + held > fraction * memory_bytes


def loaders(source, ids):
    """Per chunk, its pickled dask graph: what a streaming partition computes on every pass."""
    return [cloudpickle.dumps(source.delayed_block(i)) for i in ids]


def streaming_memory(source, state, workers):
    """A streamed chunk is computed from its source on every pass: a worker thread holds it and the input
    block(s) it is cut from meanwhile (a zarr chunk decoded whole), and the fit's buffers. With the
    worker's share of the fit's state and the process itself, that must stay under the memory its nanny
    allows, or the nanny restarts the worker in every pass: refused before any work instead, in one line.
    ``workers``: the scheduler's {address: {"memory_limit", "nthreads", "metrics": {"memory"}}}. Returns the
    largest worker's estimate in bytes."""
    chunk = int(np.diff(source.starts).max()) * source.n_features * source.dtype.itemsize
    block = getattr(source, "input_chunk_bytes", 0)
    row_bytes, who, buffers = fit_state(state)
    per_thread = chunk + max(chunk, block) + buffers  # the chunk, the input it is cut from, the fit's buffers
    share = source.n_samples * row_bytes / max(1, len(workers))
    terminate = float(dask.config.get("distributed.worker.memory.terminate", 0.95) or 1.0)
    largest = 0
    for addr, w in sorted(workers.items()):
        limit = w.get("memory_limit") or 0
        process = max(WORKER_BASE, w.get("metrics", {}).get("memory", 0)) + STREAM_PASS
        need = process + w.get("nthreads", 1) * per_thread + share
        largest = max(largest, need)
        if limit and need > terminate * limit:
            raise InputError(
                f"{who} streams chunks of {chunk / 2**20:.0f} MiB cut from input blocks of up to "
                f"{block / 2**20:.0f} MiB: worker {addr} would need about "
                f"{need / 2**20:.0f} MiB ({w.get('nthreads', 1)} thread(s) x both"
                f"{f' + {buffers / 2**20:.0f} MiB of buffers' if buffers else ''}, "
                f"{share / 2**20:.0f} MiB of state, the process) of its {limit / 2**20:.0f} MiB limit; "
                "store the input in smaller chunks, set dask_clust.chunk-bytes lower, or give "
                "workers more memory"
            )
    return int(largest)
