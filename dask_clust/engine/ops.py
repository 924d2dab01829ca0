"""The Engine: the handful of verbs an algorithm is written against. ARCHITECTURE.md lists them, with what
each does and what the driver receives (the one list: ``tests/test_architecture.py`` checks it against this
class).

A step is a module-level function ``step(chunk, params)`` (see ``partition.Chunk``). Every call is one
round trip: one message from the driver to the root partition, a tree of partitions on the workers, one
finished result back (rule 2). What the driver receives per call is the size of the combined result,
whatever the number of chunks or workers (a ``Rows`` field excepted: its size is what the steps return).
"""

import contextlib
import copy
import itertools
import logging
import math
import os
import socket
import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..kernels.stats import chunk_summary, fixed_top_exponent
from ..outputs import UNREADABLE, file_sha256, stored_arrays
from . import config
from .calls import Build, Gather, Plan, ReduceScatter, ShardApply, ShardDrop, ShardKeep, ShardRef, Step
from .chunk import pop_state, routed_rows
from .cluster import IN_PROCESS
from .combine import ArgMax, Fold, Min, Rows, Scatter, Sum
from .data import ArraySource, as_source
from .halo import pop_halo
from .local import backend_for
from .recovery import LOSSES, Restarted

logger = logging.getLogger("dask_clust")


@dataclass(frozen=True)
class Summary:
    """What the first pass learns about the data (float64)."""

    n_samples: int
    total_weight: float
    mean: np.ndarray
    var: np.ndarray
    max_abs: float


NO_ROW = np.iinfo(np.int64).max
# log2 of the largest sum a fit may form: float64's range (2^1023) less the fixed-point grid's headroom
MAX_EXPONENT = 960
# the first pass: rows, Σx, Σx², Σw in chunk order (the bits every later tolerance is scaled by), max |x|
# with its first row, the first non-finite row and the first chunk with a bad weight
SUMMARY = (Sum(), Fold(), Fold(), Fold(), ArgMax(), Min(), Min())


def _summary_step(chunk, params):
    d = chunk.x.shape[1]
    sums, sumsq = np.empty(d), np.empty(d)
    max_abs, at, bad = chunk_summary(chunk.x, sums, sumsq)
    w = chunk.w
    w_ok = bool(np.all(np.isfinite(w)) and np.all(w >= 0))
    return (
        np.int64(chunk.x.shape[0]),
        sums,
        sumsq,
        float(w.sum()) if w_ok else 0.0,
        (np.array([max_abs]), np.array([chunk.start + at], np.int64)),
        np.int64(NO_ROW if bad < 0 else chunk.start + bad),
        np.int64(NO_ROW if w_ok else chunk.index),
    )


def _take_step(chunk, ids):
    lo, hi = np.searchsorted(ids, [chunk.start, chunk.stop])
    rows = ids[lo:hi] - chunk.start
    return chunk.x[rows], chunk.w[rows]


def _empty_step(chunk, params):
    return ()


def _key_counts(chunk, params):
    """The chunk's distinct keys and their counts (for ``reorder``'s destinations)."""
    key_step, key_params = params
    keys, counts = np.unique(np.asarray(key_step(chunk, key_params), dtype=np.int64), return_counts=True)
    return keys, counts, np.full(len(keys), chunk.index, np.int64)


def _input_ids(chunk, params):
    return (chunk.input_ids(),)


def _rows_file(directory, key, start, stop):
    return os.path.join(directory, f"{key}-{start:012d}-{stop:012d}.npz")


def _dump_rows(chunk, params):
    """Write the chunk's state ``key`` (a dict of per-row arrays, or one array; of a dict only ``fields``
    when given) beside its rows' range; its rows' range and the file's sha256 (``dump_rows``)."""
    directory, key, fields, order = params
    if not os.path.isdir(directory):
        raise InputError(
            f"the checkpoint directory {directory} is not visible on the worker "
            f"{socket.gethostname()}: per-row state is written where the rows live, so a checkpoint "
            "on a cluster needs a directory on a filesystem every worker shares"
        )
    state = chunk.state[key]
    if fields:
        state = {f: _by_row(state[f], state[order]) if order else state[f] for f in fields}
    where = _rows_file(directory, key, chunk.start, chunk.stop)
    np.savez(where, **(state if isinstance(state, dict) else {"": state}))
    return np.array([[chunk.start, chunk.stop]], np.int64), np.frombuffer(bytes.fromhex(file_sha256(where)), np.uint8)[
        None
    ]


def restored_rows(chunk, params):
    """A state builder: the chunk's state ``key`` as ``_dump_rows`` wrote it in the checkpoint's ``rows`` =
    (directory, {file name: sha256}), from the files that cover the chunk's rows (they need not be cut as
    this engine's chunks are). ``fields`` declares each field ({name: (dtype, shape of a row, least value,
    bound above)}, the values unchecked where those are None): a checkpoint is a file users move between
    machines, and a crafted one must not reach a kernel (cluster indices of 2**30 crashed the process), so
    every file is checked before any of it is used: its bytes against the checksum its generation recorded
    (a value edited within its range would resume to another model), its rows against its name, every
    declared field present with its dtype, shape and range."""
    (directory, digests), key, fields = params
    exact = os.path.basename(_rows_file(directory, key, chunk.start, chunk.stop))
    # the same chunks as the checkpoint's (the usual case): the chunk's own file, without sorting every chunk's
    names = [exact] if exact in digests else sorted(digests)
    pieces = []
    for name in names:  # zero-padded starts: sorted names are in row order
        parts = name[: -len(".npz")].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != key:
            continue
        lo, hi = int(parts[1]), int(parts[2])
        if hi > chunk.start and lo < chunk.stop:
            pieces.append((lo, hi, name))
    covered = chunk.start
    found = {}
    for lo, hi, name in pieces:
        if lo > covered:
            break
        where = os.path.join(directory, name)
        try:
            if file_sha256(where) != digests[name]:
                raise ValueError("its bytes do not match the checksum its generation recorded (edited or damaged)")
            values = stored_arrays(where)
        except UNREADABLE as exc:
            raise InputError(f"the checkpoint's rows file {where} cannot be read: {exc}") from None
        _check_rows(values, fields, hi - lo, where)
        a, b = covered - lo, min(hi, chunk.stop) - lo
        for f, v in values.items():
            found.setdefault(f, []).append(v[a:b])
        covered = min(hi, chunk.stop)
    if covered < chunk.stop:
        raise InputError(
            f"the checkpoint's per-row state {key!r} in {directory} lacks rows {covered}..{chunk.stop - 1}"
        )
    state = {f: np.concatenate(v) for f, v in found.items()}
    chunk.state[key] = state[""] if "" in state else state


def _check_rows(values, fields, n_rows, where):
    """One rows file against its declared fields (``restored_rows``); InputError naming the first problem."""
    if set(values) != set(fields):
        raise InputError(f"the checkpoint's rows file {where} holds fields {sorted(values)}, not {sorted(fields)}")
    for f, (dtype, width, least, bound) in fields.items():
        v = values[f]
        if v.dtype != np.dtype(dtype) or v.shape != (n_rows,) + tuple(width):
            raise InputError(
                f"the checkpoint's rows file {where}: {f!r} is {v.dtype} {v.shape}, not {np.dtype(dtype)} "
                f"{(n_rows,) + tuple(width)} (the rows its name covers)"
            )
        if least is not None and v.size and not (v.min() >= least and v.max() < bound):
            raise InputError(f"the checkpoint's rows file {where}: {f!r} holds values outside [{least}, {bound})")


def _load_rows(chunk, params):
    """The chunk's state ``key`` from the files; fields of a dict already there are replaced (put in its
    ``order`` when it keeps one), the rest kept."""
    rows, key, fields, order = params
    had = chunk.state.get(key)
    restored_rows(chunk, (rows, key, fields))
    if isinstance(had, dict):
        loaded = chunk.state[key]
        if order:
            loaded = {f: v[had[order]] for f, v in loaded.items()}
        chunk.state[key] = {**had, **loaded}
    return (np.int64(1),)


def _by_row(values, order):
    """Per-row values a state keeps in another order (``values[i]`` belongs to row ``order[i]``), by row."""
    out = np.empty_like(values)
    out[order] = values
    return out


def _nbytes(params):
    """The bytes of the arrays in a call's parameters (nested tuples, lists and dicts)."""
    if isinstance(params, np.ndarray):
        return params.nbytes
    if isinstance(params, (tuple, list)):
        return sum(map(_nbytes, params))
    if isinstance(params, dict):
        return sum(map(_nbytes, params.values()))
    return 0


class Engine:
    """Verbs over the partitions of one input; built by ``open_engine``."""

    def __init__(self, backend, source, entropy=0, summary=None, top=None):
        self.backend = backend
        self.source = source
        self.n_samples = source.n_samples
        self.n_features = source.n_features
        self.dtype = source.dtype
        self.n_chunks = source.n_chunks
        self.entropy = entropy
        self._states = {}  # key -> (builder, model, backup fields): replayed on a rebuilt partition
        self._stepped = set()  # states with backup fields that a step has run with since they were built
        self._replay = {}  # such a state -> its build and steps since, or None (``state``)
        self._replayed = {}  # ... and the bytes of their arrays
        self._halos = {}  # key -> (need_step, params): gather plans, rebuilt after a rebuild
        self._unsent = set()  # plans to send before their next use (new, or stale after a restart)
        self._restarting = 0  # within ``rerun``: a lost worker raises Restarted, the call is not repeated
        self._halo_fields = {}  # key -> the state fields its calls filled in (dropped with the plan)
        self._shards = {}  # sharded model key -> the id of the call that last wrote it
        self._ids = itertools.count()
        self.round_trips = 0  # calls to the partitions: with overhead_ms(), the fit's engine overhead
        self.top = None
        if summary is None:
            summary = self._first_pass()
            top = fixed_top_exponent(summary.total_weight, self.n_features, summary.max_abs)
        self.summary, self.top = summary, top

    @property
    def n_workers(self):
        return self.backend.n_workers

    def _builders(self):
        """(key, builder, model, backup fields, replay) per declared state; the fields only once a step has
        run with the state (before that, its builder makes it exactly as it was); replay: the (step, params)
        that make it as the last step left it, or None (``state``)."""
        return [
            (key, builder, model(), fields if key in self._stepped else (), self._replay.get(key))
            for key, (builder, model, fields) in self._states.items()
        ]

    def _drop_state(self, key):
        for kept in (self._states, self._replay, self._replayed):
            kept.pop(key, None)

    def _log(self, call):
        """A step's call joins the replay of every backed-up state it ran with, while the replays stay under
        ``replay-bytes`` and the call can run again on its own (no halo, scatter or sharded model: those
        depend on other partitions' or the model's past versions)."""
        logs = [key for key, _ in call.backup if self._replay.get(key) is not None]
        if not logs:
            return
        replayable = call.halo is None and call.scatter is None and not call.refs()
        params = copy.deepcopy(call.params) if replayable else None  # the driver may change its arrays in place
        limit, size = config.get_bytes("replay-bytes"), _nbytes(params)
        for key in logs:
            log = self._replay[key]
            if replayable and self._replayed[key] + size <= limit:
                log.append((call.step, params))
                self._replayed[key] += size
            else:
                self._replay[key] = None
                logger.info(
                    "state %r of the fit is no longer replayed after its copies are lost: %s",
                    key,
                    "a step of it depends on other partitions"
                    if not replayable
                    else f"its steps' parameters would pass replay-bytes ({limit / 2**20:.0f} MiB)",
                )

    def _send(self, kind, **fields):
        """One round trip: a call of class ``kind`` with these fields and the next id, to every partition
        (after the gather plan a step's halo needs, when it has not been sent yet)."""
        self.round_trips += 1
        halo = fields.get("halo")
        if halo is not None and halo.key in self._unsent:
            self._unsent.discard(halo.key)
            self._send(Plan, **self._plan_fields(halo.key))
        call = kind(next(self._ids), **fields)
        try:
            out = self.backend.call(
                call, self._builders, self._plans, lambda: list(self._shards), repeat=not self._restarting
            )
        except Restarted:
            self._unsent.update(self._halos)
            raise
        if isinstance(call, Step):
            self._stepped.update(key for key, _ in call.backup)
            self._log(call)
        written = call.scatter.model if isinstance(call, Step) and call.scatter is not None else None
        if isinstance(call, (ShardKeep, ShardApply)):
            written = call.key
        if written is not None:
            self._shards[written] = call.id
        return out

    def _step(self, step, params=None, combine=None, at_root=None, halo=None, scatter=None):
        backup = tuple((key, fields) for key, (_, _, fields) in self._states.items() if fields)
        return self._send(
            Step,
            step=step,
            params=params,
            combine=combine,
            top=self.top,
            at_root=at_root,
            halo=halo,
            backup=backup,
            scatter=scatter,
        )

    def _plan_fields(self, key):
        need_step, params = self._halos[key]
        return dict(need_step=need_step, key=key, params=params, starts=self.source.starts)

    def _plans(self):
        """The plans sent so far, for a partition rebuilt before a call is repeated (the others go when used)."""
        return [Plan(next(self._ids), **self._plan_fields(key)) for key in self._halos if key not in self._unsent]

    def _first_pass(self):
        n, sums, sumsq, total_w, (max_abs, at), bad, bad_w = self.reduce(_summary_step, combine=SUMMARY)
        max_abs, at = float(max_abs[0]), int(at[0])
        if bad != NO_ROW:
            raise InputError(f"Input contains NaN or infinity at {self._where(bad)}")
        if bad_w != NO_ROW:
            raise InputError(
                f"sample_weight has a negative, NaN or infinite value in chunk {bad_w} "
                f"(rows {self.source.starts[bad_w]}..{self.source.starts[bad_w + 1] - 1})"
            )
        if not total_w > 0:
            raise InputError("sample_weight must have a positive sum; got weights that are all zero")
        # every exact sum is bounded by W·D·(2 max|x| + 1)² (``fixed_top_exponent``): it must be a float64
        if math.log2(max(total_w, 1.0)) + math.log2(self.n_features) + 2 * math.log2(2 * max_abs + 1) > MAX_EXPONENT:
            raise InputError(
                f"Input values reach {max_abs:.3g} in magnitude (at {self._where(at)}): sums of "
                "squared distances over these rows would overflow float64; rescale the data (e.g. "
                "scikit-learn's StandardScaler)"
            )
        mean = sums / n
        var = np.maximum(sumsq / n - mean * mean, 0.0)
        return Summary(n, total_w, mean, var, max_abs)

    def _where(self, row):
        """A global row as the user finds it: its index, its chunk and its row within the chunk."""
        i = int(np.searchsorted(self.source.starts, row, side="right")) - 1
        return f"row {row:,} (chunk {i}, row {row - int(self.source.starts[i]):,} of the chunk)"

    # -- verbs
    def reduce(self, step, params=None, combine=None, at_root=None, halo=None, scatter=None):
        """``step(chunk, params)`` on every chunk, its fields combined by ``combine`` (one per field; None:
        every field an exact ``Sum``); returns the tuple of combined fields, or ``at_root(fields, params)``
        when given: a module-level function run where the result is finished (the root partition's worker),
        which turns a large combined result into the small one the driver needs. ``halo`` = ``Halo(plan key,
        state field)`` fills ``chunk.halo[field]`` first (see ``halo``); ``Halo(key, field, indexed=True)``
        gives it as (values, positions): the rows every chunk of the partition reads, once, and where the
        chunk's named rows sit among them (``values[positions]`` is the plain form; large per-row state avoids
        the copy per chunk).

        ``scatter`` = ``ReduceScatter(model, at_shard, small)``: a reduce-scatter. The fields whose combine is
        ``Scatter(...)`` (arrays with the same number of rows R) are never assembled: each partition gets
        the combined rows of the sharded ``model`` it owns, lo..hi, and runs ``at_shard(fields, shard,
        params, lo)`` there, with its shard as the last call left it; it returns (the new shard: a tuple of
        arrays of hi − lo rows, small fields), the new shard is kept, and the small fields are combined by
        ``small`` (one combine each) up the tree. Returns the other fields, then the small ones. An exact
        combine and a row-wise ``at_shard`` give the same bits for any number of partitions."""
        if scatter is not None:
            if not any(isinstance(c, Scatter) for c in combine or ()):
                raise ValueError("a reduce-scatter needs at least one field whose combine is Scatter(...)")
            scatter = ReduceScatter(scatter.model.key, scatter.at_shard, tuple(scatter.small))
        if halo is not None:
            self._halo_fields[halo.key].add(halo.field)
        return self._step(step, params, combine, at_root, halo, scatter)

    def shards_model(self, nbytes):
        """Rule 1: whether a model of ``nbytes`` lives sharded on the workers (over ``model-bytes``)."""
        return nbytes > config.get_bytes("model-bytes")

    @contextlib.contextmanager
    def sharded(self, key, arrays):
        """A context: the model ``key`` (a tuple of arrays with the same number of rows, e.g. the means)
        split by rows over the partitions, partition p holding ``combine.shard_bounds(rows, P)[p:p + 2]``,
        each shard copied to the next partition (restored from there when its worker is lost). The driver
        sends the arrays once; yields a ``ShardedModel``; dropped everywhere when the block ends."""
        arrays = tuple(np.asarray(a) for a in arrays)
        if len({len(a) for a in arrays}) != 1:
            raise ValueError("the arrays of a sharded model must have the same number of rows")
        self._send(ShardKeep, key=key, arrays=arrays)
        try:
            yield ShardedModel(self, key)
        finally:
            self._shards.pop(key, None)
            self._send(ShardDrop, key=key)

    @contextlib.contextmanager
    def state(self, key, builder, model=lambda: None, *, build=True, backup=()):
        """Per-chunk state ``key`` for the block: ``builder(chunk, model())`` runs on every chunk now
        (``build``; else the first step makes it) and on the chunks of any partition rebuilt after a lost
        worker, with ``model()`` as it is then. The state is dropped everywhere when the block ends.

        ``backup``: fields of a dict-valued state that the model cannot rebuild (they depend on every
        earlier step): after each step, every partition copies them to the next ``BACKUP_COPIES`` partitions,
        and a rebuilt partition takes them from the first that has them, as the last call before the lost one
        left them. The builder runs only where no step has changed the state yet. Where a step has and every
        copy was lost too (every worker leaving at once: a jobqueue lifetime, a node of them all), the
        partition replays the build and every step since, which the driver keeps on a cluster while their
        parameters stay under ``replay-bytes``; past that, the fit ends in one line (``WorkerLost``) rather
        than go on to another model."""
        self._states[key] = (builder, model, tuple(backup))
        self._stepped.discard(key)
        params = model() if build else None
        if backup and not self.backend.in_process:
            self._replay[key] = [(builder, copy.deepcopy(params))] if build else []
            self._replayed[key] = _nbytes(params)
        try:
            if build:
                self._send(Build, step=builder, params=params)
            yield
        except BaseException:
            self._drop_state(key)
            raise
        self._drop_state(key)
        self._send(Build, step=pop_state, params=key)

    @contextlib.contextmanager
    def halo(self, key, need_step, params=None):
        """A fixed gather plan ``key`` for the block: ``need_step(chunk, params)`` names the global rows the
        chunk reads (any order, repeats allowed), once. Then ``reduce(..., halo=Halo(key, field))`` gives every
        chunk, before any step of that call runs, ``chunk.halo[field]``: those rows' values of the per-chunk
        state ``field`` as the previous call left them (Jacobi: no step sees another's update of the same
        call), in the order ``need_step`` named them. The values go partition to partition, never through
        the driver; a partition rebuilt after a lost worker gets the plan again. The plan is made when the
        first call uses it (after the steps before it have made the state ``need_step`` may read), and made
        again after a ``rerun`` restart."""
        self._halos[key] = (need_step, params)
        self._halo_fields[key] = set()
        self._unsent.add(key)
        try:
            yield
            self._send(Build, step=pop_halo, params=(key, tuple(self._halo_fields[key])))
        finally:
            self._halos.pop(key, None)
            self._halo_fields.pop(key, None)
            self._unsent.discard(key)

    def rerun(self, phase, repair=None):
        """``phase(restarted)``, recovered by restarting it: within it, a call that loses a worker rebuilds
        the lost partitions (their declared states replayed, as always) but is not repeated; ``repair()``
        runs, then ``phase(True)`` from its start. For state that no builder can rebuild and no repeated
        step can redo on its own (an iterate: SLK's z, whose next value needs every partition's current
        one), the phase starts from what can be rebuilt (SLK's modes), so the result is the undisturbed one.
        Returns what the phase returns; a phase restarted ``recovery.LOSSES`` times ends in ``Restarted``."""
        for attempt in range(LOSSES + 1):
            self._restarting += 1
            try:
                if attempt and repair is not None:
                    repair()
                return phase(attempt > 0)
            except Restarted:
                if attempt == LOSSES:
                    raise
            finally:
                self._restarting -= 1
        raise AssertionError("unreachable")

    def dump_rows(self, directory, key, fields=None, order=None):
        """Write every chunk's state ``key`` (of a dict-valued state, ``fields`` when given) into
        ``directory`` (a checkpoint), each chunk by the partition that holds it: on a cluster the directory
        must be on a filesystem every worker shares. ``order``: the field of a state that keeps its rows in
        another order, the row of each entry; the files hold them by row all the same, so that engines cut
        in other chunks read them. Returns {file name: sha256}: the driver receives 48 bytes a chunk."""
        bounds, digests = self.reduce(
            _dump_rows, (os.fspath(directory), key, tuple(fields or ()), order), (Rows(), Rows())
        )
        return {os.path.basename(_rows_file("", key, lo, hi)): bytes(d).hex() for (lo, hi), d in zip(bounds, digests)}

    def load_rows(self, rows, key, fields, order=None):
        """Every chunk's state ``key`` read back from ``dump_rows``'s files (``rows`` = (directory, their
        checksums), as a checkpoint gives them), its fields replacing those of a
        dict-valued state already there (a registered state whose builder rebuilds a lost partition from
        the model; one whose only source is the checkpoint takes ``restored_rows`` as its builder), each
        file checked against ``fields`` (``restored_rows``); ``order`` as ``dump_rows``'s."""
        self.reduce(_load_rows, (rows, key, fields, order))

    def take(self, ids, weights=False):
        """Rows at the given global ids (any order, repeats allowed), as a (len(ids), d) array; with
        ``weights``, (rows, their sample weights)."""
        ids = np.asarray(ids, dtype=np.int64)
        uniq, inverse = np.unique(ids, return_inverse=True)
        rows, w = self.reduce(_take_step, uniq, (Rows(), Rows()))
        return (rows[inverse], w[inverse]) if weights else rows[inverse]

    @contextlib.contextmanager
    def working_set(self, X, weights, entropy):
        """An Engine over a weighted set (X, weights) this process already holds (a sample): in this
        process when it fits ``in-process-bytes`` (rule 6: no cluster round trips), else on this engine's
        cluster; in chunks of ``working-set-chunk-rows`` either way, so the model does not depend on it."""
        small = X.nbytes <= config.get_bytes("in-process-bytes")
        source = as_source(X, weights, chunk_rows=int(config.get("working-set-chunk-rows")))
        client = IN_PROCESS if small else getattr(self.backend, "client", IN_PROCESS)
        with open_engine(source, client, entropy) as engine:
            yield engine

    @contextlib.contextmanager
    def sample(self, step, params, counts, entropy, row_bytes=None):
        """An Engine over the rows ``step(chunk, params)`` draws from every chunk: (rows, weights), chunk c
        drawing ``counts[c]`` rows, in chunk order (a coreset). The step must need no state: on a cluster
        it runs as a one-shot task where the chunk's rows live. A set that fits ``in-process-bytes`` comes
        to this process (rule 6); a larger one stays on the workers that drew it, rebalanced there into the
        new engine's chunks (the driver handles counts and futures, never rows). Chunks of
        ``working-set-chunk-rows`` on every path, so the model does not depend on the path. ``row_bytes``:
        what the new engine will hold per row, its state included, when that is more than the row (the size
        that decides whether it comes to this process)."""
        counts = np.asarray(counts, dtype=np.int64)
        rows = int(config.get("working-set-chunk-rows"))
        nbytes = int(counts.sum()) * max(self.n_features * self.dtype.itemsize, int(row_bytes or 0))
        if self.backend.in_process or nbytes <= config.get_bytes("in-process-bytes"):
            X, w = self.reduce(step, params, (Rows(), Rows()))
            source, client = as_source(X, w, chunk_rows=rows), IN_PROCESS
        else:
            source, client = self.backend.drawn(step, params, counts, rows), self.backend.client
        with _releasing(source), open_engine(source, client, entropy) as engine:
            yield engine

    @contextlib.contextmanager
    def reorder(self, key_step, params=None):
        """An Engine over the same rows sorted by the int key ``key_step(chunk, params)`` gives each row
        (ties in input order), rebalanced into chunks of this engine's sizes; every row keeps its input id
        (``chunk.input_ids()``; ``to_input_order`` maps per-row results back). ``key_step`` must need no
        state: on a cluster it runs as a one-shot task where each chunk's rows live, and the rows move
        worker to worker. The driver holds the keys' counts per chunk, never rows. The new engine keeps this
        one's summary and fixed-point grid, so an exact ``Sum`` gives the same bits on both."""
        keys, counts, chunks = self.reduce(_key_counts, (key_step, params), (Rows(), Rows(), Rows()))
        distinct, where = np.unique(keys, return_inverse=True)
        totals = np.bincount(where, counts, len(distinct)).astype(np.int64)
        order = np.lexsort((chunks, keys))
        first = np.empty(len(keys), np.int64)
        first[order] = np.cumsum(counts[order]) - counts[order]
        plan = (key_step, params, keys, chunks, first)
        if self.backend.in_process:
            pos, x, w, ids = self.reduce(routed_rows, plan, (Rows(),) * 4)
            X, W, I = np.empty_like(x), np.empty_like(w), np.empty_like(ids)
            X[pos], W[pos], I[pos] = x, w, ids
            source, client = ArraySource(X, W, self.source.starts, ids=I), IN_PROCESS
        else:
            source, client = self.backend.reordered(plan, counts, first, chunks), self.backend.client
        with _releasing(source), backend_for(source, client, self.entropy) as backend:
            engine = Engine(backend, source, self.entropy, self.summary, self.top)
            engine.key_totals = distinct, totals
            yield engine

    def to_input_order(self, values):
        """Per-row ``values`` in this engine's row order, put back in the input's row order."""
        (ids,) = self.reduce(_input_ids, None, (Rows(),))
        out = np.empty_like(values)
        out[ids] = values
        return out

    def empty_iteration_ms(self):
        """Wall time of one empty iteration (a reduce of an empty step over every partition), in ms."""
        t = time.perf_counter()
        self.reduce(_empty_step)
        return 1000.0 * (time.perf_counter() - t)

    def overhead_ms(self, repeats=20):
        """Median of ``repeats`` empty iterations after two warm-up ones, in milliseconds."""
        times = [self.empty_iteration_ms() for _ in range(repeats + 2)]
        return statistics.median(times[2:])

    def partitions(self):
        """Per partition: (rows, memory of the worker that holds it, bytes): what per-row state may cost."""
        return self.backend.partitions(self.source)

    def publisher(self, algo):
        """A listener for ``progress.publishing`` that shows the fit where its cluster is watched, or None."""
        return self.backend.publisher(algo)

    def describe(self):
        return {
            "backend": self.backend.kind,
            "workers": self.n_workers,
            "threads": self.backend.threads,
            "chunks": self.n_chunks,
            "streaming": self.backend.streaming,
            "stream_estimate_bytes": getattr(self.backend, "stream_estimate", None),
            "rebuilds": self.backend.n_rebuilds,
            "round_trips": self.round_trips,
        }


class ShardedModel:
    """A model that lives on the workers, split by rows over the partitions (``Engine.sharded``)."""

    def __init__(self, engine, key):
        self.engine = engine
        self.key = key

    def ref(self, field=0):
        """For a call's parameters: the whole field as it is now, assembled on every partition from the
        others' shards (straight from them, never through the driver; once per version)."""
        return ShardRef(self.key, self.engine._shards[self.key], field)

    def apply(self, fn, params=None, small=()):
        """``fn(shard, params, lo)`` -> (new shard, small fields) where each shard lives (the next step of a
        sharded M-step); the small fields combined by ``small`` come back."""
        return self.engine._send(
            ShardApply, key=self.key, fn=fn, fn_params=params, small=tuple(small), top=self.engine.top
        )

    def gather(self, field=0):
        """The whole field on the driver (the end of a fit)."""
        return self.engine._send(Gather, ref=self.ref(field))


@contextlib.contextmanager
def open_engine(source, client=None, entropy=0, state=(0, "the fit")):
    """An Engine over ``source`` for the duration of a fit (see ``local.backend_for`` for ``client`` and
    ``state``, the per-row state the fit will keep)."""
    with backend_for(source, client, entropy, state) as backend:
        yield Engine(backend, source, entropy)


@contextlib.contextmanager
def _releasing(source):
    """Rows drawn or moved on the cluster for one engine are released when it closes, or fails."""
    try:
        yield
    finally:
        if hasattr(source, "release"):
            source.release()


# open_local's rows per chunk at least (a chunk is a task for one thread, and each costs a call)
LOCAL_CHUNK_ROWS = 1024


def open_local(X, sample_weight, entropy):
    """An in-process Engine over rows this process already holds (k-means||'s few candidates to recluster):
    the same steps as on the cluster, without a round trip; a context manager like ``open_engine``. The rows
    go in ``min-chunks`` chunks (of at least LOCAL_CHUNK_ROWS), not in the size-based chunks of an input,
    which put 10,000 candidates (2.6 MB) in one chunk and their recluster on one thread; the exact sums give
    the same bits for any chunking."""
    rows = max(LOCAL_CHUNK_ROWS, -(-len(X) // int(config.get("min-chunks"))))
    return open_engine(as_source(X, sample_weight, chunk_rows=rows), IN_PROCESS, entropy)
