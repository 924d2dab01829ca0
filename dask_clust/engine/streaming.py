"""Rule 4 (ARCHITECTURE.md): whether an input streams from its source on every pass, whether a streaming
worker would outgrow its memory limit and how many of its rows it may keep, all decided before a fit starts;
and how a streaming partition reads its chunks (``BlockCache``): each stored block decoded once per call,
the next chunk's blocks read while the current ones are computed."""

import collections
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import dask
import numpy as np

from ..errors import InputError
from ..kernels.assign import is_csr
from . import config
from .data import ArraySource, FutureSource, csr_bytes, run_graph
from .events import count

logger = logging.getLogger("dask_clust")

# what a streaming worker needs beyond its chunks, state and buffers, measured on CPython 3.11 (one worker of
# one thread, zarr stores of 1 and 2 GiB in 32 MiB chunks, Lloyd; ``benchmarks/bench_faults.py --parts
# stream``): the process after its first fit (numpy, numba's compiled kernels, distributed; 315-344 MiB),
# and what a streamed pass holds besides its chunk, the input block and the fit's state (the loader's
# compute, the codec's buffers, the partials: 33-34 MiB over 16.1 B of state per row, Lloyd's 16)
WORKER_BASE = 340 << 20


STREAM_PASS = 48 << 20
# the share of a streaming worker's memory limit the rows it keeps may bring it to: below distributed's
# pause threshold (0.8 by default: a paused worker stops taking tasks, and logs "Pausing worker")
KEEP_FRACTION = 0.7
# a fit's state that lives in local files whenever its input streams: the draws of a window of a stochastic
# method's steps, held until used (``blocks/batches.py``), about a copy of the rows, each with its label and
# weight (``HELD_ROW_BYTES``)
HOLDS_DRAWS = "holds draws"
HELD_ROW_BYTES = 16


def _pause():
    return float(dask.config.get("distributed.worker.memory.pause", 0.8) or 1.0)


def fit_state(state):
    """(bytes of state per row, who keeps them, bytes of buffers per worker thread, whether the state may
    live in local files between calls: False, True, or ``HOLDS_DRAWS``) of the ``state`` a fit declares
    (``algorithms.state_of``); the last two may be left out (none, no)."""
    row_bytes, who, *rest = state
    rest = list(rest) + [0, False][len(rest) :]
    return int(row_bytes), who, int(rest[0]), rest[1]


def state_in_files(source, memory_bytes, state, workers=None, streamed=True):
    """Rule 4: a streamed fit keeps its per-row state in local files between calls (``rowfiles``) when the
    algorithm allows it (its state is touched by its steps alone) and the state would take more than
    ``stream-fraction`` of the memory, or would bring a streaming worker (``workers``, as ``streaming_memory``
    takes them) past distributed's pause threshold, where it stops taking tasks and logs "Pausing worker";
    a fit that holds draws (``HOLDS_DRAWS``) keeps it there whenever it streams (``streamed``)
    (``state-files``: "auto", True or False)."""
    row_bytes, _, _, files = fit_state(state)
    mode = config.get("state-files")
    if not files or mode is False or isinstance(source, (ArraySource, FutureSource)):
        return False
    if files == HOLDS_DRAWS and streamed:
        return True
    if mode is True or source.n_samples * row_bytes > float(config.get("stream-fraction")) * memory_bytes:
        return True
    return any(
        (w.get("memory_limit") or 0) and _worker_need(source, state, w, len(workers))[0] > _pause() * w["memory_limit"]
        for w in (workers or {}).values()
    )


def should_stream(source, memory_bytes, state=(0, "the fit")):
    """Rule 4: stream a dask source from where it lives each pass when it and the fit's per-row state would
    take more than ``stream-fraction`` of the memory available to hold them (``stream``: "auto", True or
    False). ``state`` = (bytes per row, who keeps them[, bytes per thread, whether it may live in files, the
    routes that work where it cannot: the refusal names them]),
    declared by the algorithm: a fit whose state alone is over that share streams with its state in files
    where the algorithm allows it (``state_in_files``), and is refused before it starts where not."""
    row_bytes, who, _, _ = fit_state(state)
    fraction = float(config.get("stream-fraction"))
    held = source.n_samples * int(row_bytes)
    if state_in_files(source, memory_bytes, state, streamed=False) and config.get("stream") not in (False, "never"):
        return True
    if held > fraction * memory_bytes:
        raise InputError(
            f"{who} keeps {int(row_bytes)} B of state per row: {held / 1e9:.3g} GB for "
            f"{source.n_samples:,} rows, over stream-fraction = {fraction:g} of the "
            f"{memory_bytes / 1e9:.3g} GB of memory it runs in; add workers or memory, or "
            f"{state[4] if len(state) > 4 else 'fit on a sample (an algorithm with a coreset)'}"
        )
    mode = config.get("stream")
    if isinstance(source, (ArraySource, FutureSource)) or mode is False or mode == "never":
        return False
    if mode is True or mode == "always":
        return True
    return source.nbytes + held > fraction * memory_bytes


def _worker_need(source, state, w, n_workers, in_files=False):
    """What a streaming worker ``w`` (the scheduler's info of it) needs besides any rows it keeps: the process,
    per thread its chunk, the input block(s) it is cut from as they are decoded (``decode_copies`` of them at
    once: a table's ``data.FRAME_COPIES``) and the fit's buffers, and its share of the fit's state (``in_files``: a
    chunk's state per thread instead); and one chunk's blocks read ahead, unless that would take the worker
    past distributed's pause threshold (then none are). Returns (bytes, chunk, block, share, read ahead)."""
    rows = int(np.diff(source.starts).max())
    chunk = rows * source.n_features * source.dtype.itemsize
    block = getattr(source, "input_chunk_bytes", 0)
    decode = max(chunk, block) + (getattr(source, "decode_copies", 1) - 1) * block
    row_bytes, _, buffers, files = fit_state(state)
    # in files, a thread holds the state of the chunk it runs; draws held are about a copy of its rows
    held = chunk + rows * HELD_ROW_BYTES if files == HOLDS_DRAWS else 0
    per_thread = chunk + decode + buffers + (rows * row_bytes + held if in_files else 0)
    share = 0 if in_files else source.n_samples * row_bytes / max(1, n_workers)
    process = max(WORKER_BASE, w.get("metrics", {}).get("memory", 0)) + STREAM_PASS
    need = process + w.get("nthreads", 1) * per_thread + share
    limit = w.get("memory_limit") or 0
    ahead = not limit or need + decode <= _pause() * limit
    return need + (decode if ahead else 0), chunk, block, share, ahead


def streaming_memory(source, state, workers, in_files=False):
    """A streamed chunk is computed from its source on every pass: a worker thread holds it and the input
    block(s) it is cut from meanwhile (a zarr chunk decoded whole), and the fit's buffers; the worker reads
    the next chunk's blocks ahead. With the worker's share of the fit's state and the process itself, that
    must stay under the memory its nanny allows, or the nanny restarts the worker in every pass: refused
    before any work instead, in one line. ``workers``: the scheduler's {address: {"memory_limit", "nthreads",
    "metrics": {"memory"}}}. Returns the largest worker's estimate in bytes."""
    _, who, buffers, _ = fit_state(state)
    terminate = float(dask.config.get("distributed.worker.memory.terminate", 0.95) or 1.0)
    largest = 0
    for addr, w in sorted(workers.items()):
        limit = w.get("memory_limit") or 0
        need, chunk, block, share, ahead = _worker_need(source, state, w, len(workers), in_files)
        largest = max(largest, need)
        if limit and need > terminate * limit:
            raise InputError(
                f"{who} streams chunks of {chunk / 2**20:.0f} MiB cut from input blocks of up to "
                f"{block / 2**20:.0f} MiB: worker {addr} would need about "
                f"{need / 2**20:.0f} MiB ({w.get('nthreads', 1)} thread(s) x both"
                f"{f' + {buffers / 2**20:.0f} MiB of buffers' if buffers else ''}, "
                f"{'one read ahead, ' if ahead else ''}"
                f"{share / 2**20:.0f} MiB of state, the process) of its {limit / 2**20:.0f} MiB limit; "
                "store the input in smaller chunks, set dask_clust.chunk-bytes lower, or give "
                "workers more memory"
            )
        if limit and need > _pause() * limit:
            logger.warning(
                "worker %s will need about %.0f MiB of its %.0f MiB while streaming, past distributed's pause "
                "threshold: it will pause (and log it) until it frees memory; smaller stored blocks or "
                "dask_clust.chunk-bytes, or more memory per worker, avoid it",
                addr,
                need / 2**20,
                limit / 2**20,
            )
    return int(largest)


def resident_bytes(source, state, workers, total_memory, in_files=False):
    """Rule 4, what fits stays: per worker address, (the bytes of streamed rows its partition may keep from
    one pass to the next, up to ``KEEP_FRACTION`` of its memory limit (of ``total_memory`` shared by the
    workers when it has none) less what it needs to stream the rest (``streaming_memory``); whether it reads
    a chunk ahead)."""
    out = {}
    for addr, w in workers.items():
        limit = w.get("memory_limit") or total_memory / max(1, len(workers))
        need, *_, ahead = _worker_need(source, state, w, len(workers), in_files)
        out[addr] = int(max(0, KEEP_FRACTION * limit - need)), ahead
    return out


def loaders(source, ids):
    """Per chunk, its ``ChunkLoader``: what a streaming partition reads on every pass."""
    return [source.loader(i) for i in ids]


class BlockCache:
    """The stored blocks a partition's streamed chunks are cut from, while a call reads them: each decoded once
    per call, by the first chunk that asks (the others wait for it), and dropped when the last of the
    partition's chunks cut from it has run; a chunk that starts reading has the blocks of the next chunk not
    yet started read on a thread of its own meanwhile (at most ``threads`` + 1 chunks' blocks held).
    ``read``: the bytes decoded so far (the passes a fit makes are ``read`` ÷ the data's size)."""

    def __init__(self, loaders, threads=1, ahead=True):
        """loaders: [(chunk index, ChunkLoader)] of the partition's streamed chunks, in chunk order; ahead:
        whether the next chunk's blocks are read ahead (not where the worker's memory is short)."""
        self._order = list(loaders)
        self._uses = collections.Counter(k for _, ld in self._order for k in ld.keys)
        self.first = self._order[0][0] if self._order else None
        per_chunk = max((len(ld.parts) for _, ld in self._order), default=1)
        self._limit = (max(1, int(threads)) + 1) * per_chunk
        self._lock = threading.Lock()
        self._pool = None
        self._kept = set()  # chunks that keep what they read (resident), once they have read it
        self._ahead = ahead
        self.read = 0
        self.begin()

    def begin(self):
        """A new call: no chunk started, every block to be read again."""
        with self._lock:
            self._left = dict(self._uses)
            self._blocks = {}
            self._started = set()

    def started(self, chunk):
        with self._lock:
            self._started.add(chunk.index)

    def block(self, key, graph):
        """Stored block ``key``, decoded from its ``graph`` here unless it is (being) decoded already."""
        with self._lock:
            fut = self._blocks.get(key)
            mine = fut is None
            if mine:
                fut = self._blocks[key] = Future()
        if mine:
            self._decode(key, graph, fut)
        return fut.result()

    def _decode(self, key, graph, fut):
        try:
            block = run_graph(graph)
            block = block if is_csr(block) else np.ascontiguousarray(block)
        except BaseException as exc:
            with self._lock:
                if self._blocks.get(key) is fut:
                    del self._blocks[key]
            fut.set_exception(exc)
            return
        nbytes = csr_bytes(block) if is_csr(block) else block.nbytes
        with self._lock:
            self.read += nbytes
        count("read", nbytes=nbytes)
        fut.set_result(block)

    def read_ahead(self):
        """Start decoding the blocks of the next chunk no thread has started, on the read-ahead thread, while
        the blocks held stay within the limit."""
        if not self._ahead:
            return
        with self._lock:
            for i, ld in self._order:
                if i in self._started or i in self._kept:
                    continue
                missing = [(k, g) for k, g, *_ in ld.parts if k not in self._blocks]
                if not missing or len(self._blocks) + len(missing) > self._limit:
                    return
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="dask_clust-read-ahead")
                for k, g in missing:
                    fut = self._blocks[k] = Future()
                    self._pool.submit(self._decode, k, g, fut)
                return

    def release(self, chunk):
        """The chunk has run: a block no other chunk of the call still needs is dropped."""
        with self._lock:
            if chunk.resident and chunk.loaded:
                self._kept.add(chunk.index)
            for k in chunk.loader.keys:
                self._left[k] -= 1
                if self._left[k] <= 0:
                    self._blocks.pop(k, None)

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
