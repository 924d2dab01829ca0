"""The Engine: the handful of verbs an algorithm is written against. ARCHITECTURE.md lists them, with what
each does and what the driver receives (the one list: ``tests/test_architecture.py`` checks it against this
class).

A step is a module-level function ``step(chunk, params)`` (see ``partition.Chunk``). Every call is one
round trip: one message from the driver to the root partition, a tree of partitions on the workers, one
finished result back (rule 2). What the driver receives per call is the size of the combined result,
whatever the number of chunks or workers (a ``Rows`` field excepted: its size is what the steps return).
"""

import contextlib
import functools
import itertools
import logging
import os
import statistics
import time

import numpy as np

from . import config
from .backups import DeclaredStates
from .calls import Plan, ReduceScatter, Step
from .chunk import routed_rows
from .cluster import IN_PROCESS
from .combine import Rows, Scatter
from .data import ArraySource, as_source, stored_row_bytes
from .first_pass import SUMMARY, FirstPass, carrying, summary_step
from .halo import HaloPlans
from .local import backend_for
from .recovery import LOSSES, Restarted
from .rowfiles import dump_chunk_rows, load_chunk_rows, rows_file
from .sharded import HeldModel, ShardedModels

logger = logging.getLogger("dask_clust")


def _take_step(chunk, params):
    ids, d, dtype, dense = params
    lo, hi = np.searchsorted(ids, [chunk.start, chunk.stop])
    if lo == hi:  # a streamed chunk holding none of the rows is not read (``Rows`` drops the empty piece)
        return np.empty((0, d), dtype), np.empty(0)
    rows = ids[lo:hi] - chunk.start
    return chunk.rows(rows) if dense else chunk.x[rows], chunk.w[rows]


_take_step.prefetch = False  # it reads the few chunks holding its rows: none read ahead


def _bytes_read(chunk, params):
    """The stored bytes the chunk's partition has decoded so far, counted once (by its first chunk)."""
    cache = chunk.cache
    return (np.int64(cache.read if cache is not None and cache.first == chunk.index else 0),)


def _empty_step(chunk, params):
    return ()


def _forget_step(chunk, params):
    chunk.state.clear()
    return ()


def _key_counts(chunk, params):
    """The chunk's distinct keys and their counts (for ``reorder``'s destinations)."""
    key_step, key_params = params
    keys, counts = np.unique(np.asarray(key_step(chunk, key_params), dtype=np.int64), return_counts=True)
    return keys, counts, np.full(len(keys), chunk.index, np.int64)


def _input_ids(chunk, params):
    return (chunk.input_ids(),)


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
        # each feature's driver side: declared states (backups, replays), gather plans, sharded models
        self._states = DeclaredStates(keeps_replays=not backend.in_process)
        self._halos = HaloPlans(source.starts)
        self._models = ShardedModels()
        self._sender = Sender(backend, self._states, self._halos, self._models)
        self._send = self._sender.send
        self._opened = SubEngines(self, self.fixed_grid)  # the engines opened from this one
        self._figures = Figures(self)
        # the first pass runs when first needed (``reduce``'s ``first_pass``)
        self._first = FirstPass(source, summary, top)

    @property
    def summary(self):
        """What the first pass learnt about the data (``Summary``), that pass made now if it has not run."""
        self._first_pass()
        return self._first.summary

    def _first_pass(self):
        if not self._first.done:
            self.reduce(summary_step, combine=SUMMARY)

    @property
    def unweighted(self):
        """Whether no row has a weight of its own (no sample_weight): each weighs 1, and a chunk's mass is its
        size, known without a pass."""
        return getattr(self.source, "weights", 0) is None

    def fixed_grid(self):
        """The exponent of the fixed-point grid every exact float ``Sum`` is made on (from the first pass);
        a step that keeps exact sums of its own makes them on it (``combine.Words``)."""
        self._first_pass()
        return self._first.top

    @property
    def chunk_moments(self):
        """Per chunk (Σ w, Σ w x, Σ w ||x||²) from the first pass, for a draw that needs the chunks' shares of
        a proposal about a centre (the lightweight coreset's); None for an engine given a summary."""
        self._first_pass()
        return self._first.moments

    @property
    def round_trips(self):
        """Calls to the partitions so far: with ``overhead_ms()``, the fit's engine overhead."""
        return self._sender.round_trips

    @property
    def n_workers(self):
        return self.backend.n_workers

    def _step(self, step, params=None, combine=None, at_root=None, halo=None, scatter=None):
        return self._send(
            Step,
            step=step,
            params=params,
            combine=combine,
            top=self._first.top,
            at_root=at_root,
            halo=halo,
            backup=self._states.backup(),
            scatter=scatter,
        )

    # -- verbs
    def reduce(self, step, params=None, combine=None, at_root=None, halo=None, scatter=None, first_pass="before"):
        """``step(chunk, params)`` on every chunk, its fields combined by ``combine`` (one per field; None:
        every field an exact ``Sum``); returns the tuple of combined fields (as the NamedTuple the step's
        return annotation names, when it names one: read by name), or ``at_root(fields, params)`` when given.

        ``first_pass``, while the engine's first pass (``summary``: the checks of the input, the grid of
        every exact float sum) has not run: "before" runs it first; "with" runs it in this call, which
        reads every row anyway (a pass saved; the step's combine must hold no float ``Sum``, which needs the
        grid, and no ``at_root``, halo or scatter); "after" lets this call run without it (a step that
        reads no weight and whose result waits for a later call that makes the first pass: one row).

        ``at_root``: a module-level function run where the result is finished (the root partition's worker),
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
        if first_pass not in ("before", "with", "after"):
            raise ValueError(f"first_pass must be 'before', 'with' or 'after'; got {first_pass!r}")
        if not self._first.done and step is not summary_step:
            if first_pass == "with":
                if at_root is not None or halo is not None or scatter is not None:
                    raise ValueError("a call that carries the first pass takes no at_root, halo or scatter")
                fields = self._step(carrying, (step, params), SUMMARY + tuple(combine))
                self._first.learn(fields[: len(SUMMARY)])
                return named(step, fields[len(SUMMARY) :])
            if first_pass == "before":
                self._first_pass()
        elif step is summary_step:
            fields = self._step(summary_step, None, SUMMARY)
            self._first.learn(fields)
            return fields
        if scatter is not None:
            if not any(isinstance(c, Scatter) for c in combine or ()):
                raise ValueError("a reduce-scatter needs at least one field whose combine is Scatter(...)")
            scatter = ReduceScatter(scatter.model.key, scatter.at_shard, tuple(scatter.small))
        if halo is not None:
            self._halos.used(halo)
        out = self._step(step, params, combine, at_root, halo, scatter)
        return out if at_root is not None or scatter is not None else named(step, out)

    def shards_model(self, nbytes):
        """Rule 1: whether a model of ``nbytes`` lives sharded on the workers (over ``model-bytes``)."""
        return nbytes > config.get_bytes("model-bytes")

    @contextlib.contextmanager
    def sharded(self, key, arrays):
        """A context: the model ``key`` (a tuple of arrays with the same number of rows, e.g. the means)
        split by rows over the partitions, partition p holding ``combine.shard_bounds(rows, P)[p:p + 2]``,
        each shard copied to the next partition (restored from there when its worker is lost). The driver
        sends the arrays once; yields a ``ShardedModel``; dropped everywhere when the block ends."""
        with self._models.block(key, arrays, self._send, self.fixed_grid(), self.reduce) as model:
            yield model

    @contextlib.contextmanager
    def model(self, key, arrays, nbytes=None):
        """A context: the model ``key`` (``sharded``'s arrays) on the driver while within ``model-bytes``
        (``HeldModel``), else sharded on the workers; the same calls and the same bits on either. ``nbytes``:
        what the model grows to, where its arrays take their width later (default: their bytes now)."""
        if nbytes is None:
            nbytes = sum(np.asarray(a).nbytes for a in arrays)
        if self.shards_model(nbytes):
            with self.sharded(key, arrays) as model:
                yield model
        else:
            yield HeldModel(arrays, self.reduce)

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
        with self._states.block(key, builder, model, build, backup, self._send):
            yield

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
        with self._halos.block(key, need_step, params, self._send):
            yield

    def rerun(self, phase, repair=None):
        """``phase(restarted)``, recovered by restarting it: within it, a call that loses a worker rebuilds
        the lost partitions (their declared states replayed, as always) but is not repeated; ``repair()``
        runs, then ``phase(True)`` from its start. For state that no builder can rebuild and no repeated
        step can redo on its own (an iterate: SLK's z, whose next value needs every partition's current
        one), the phase starts from what can be rebuilt (SLK's modes), so the result is the undisturbed one.
        Returns what the phase returns; a phase restarted ``recovery.LOSSES`` times ends in ``Restarted``."""
        return self._sender.rerun(phase, repair)

    def dump_rows(self, directory, key, fields=None, order=None):
        """Write every chunk's state ``key`` (of a dict-valued state, ``fields`` when given) into
        ``directory`` (a checkpoint), each chunk by the partition that holds it: on a cluster the directory
        must be on a filesystem every worker shares. ``order``: the field of a state that keeps its rows in
        another order, the row of each entry; the files hold them by row all the same, so that engines cut
        in other chunks read them. Returns {file name: sha256}: the driver receives 48 bytes a chunk."""
        bounds, digests = self.reduce(
            dump_chunk_rows, (os.fspath(directory), key, tuple(fields or ()), order), (Rows(), Rows())
        )
        return {os.path.basename(rows_file("", key, lo, hi)): bytes(d).hex() for (lo, hi), d in zip(bounds, digests)}

    def load_rows(self, rows, key, fields, order=None):
        """Every chunk's state ``key`` read back from ``dump_rows``'s files (``rows`` = (directory, their
        checksums), as a checkpoint gives them), its fields replacing those of a
        dict-valued state already there (a registered state whose builder rebuilds a lost partition from
        the model; one whose only source is the checkpoint takes ``restored_rows`` as its builder), each
        file checked against ``fields`` (``restored_rows``); ``order`` as ``dump_rows``'s."""
        self.reduce(load_chunk_rows, (rows, key, fields, order))

    def take(self, ids, weights=False, first_pass="before", dense=True):
        """Rows at the given global ids (any order, repeats allowed), as a (len(ids), d) array; with
        ``weights``, (rows, their sample weights). ``first_pass``: as ``reduce``'s. ``dense=False``: CSR rows
        come as a CSR matrix (a batch of documents), not densified."""
        ids = np.asarray(ids, dtype=np.int64)
        uniq, inverse = np.unique(ids, return_inverse=True)
        params = (uniq, self.n_features, self.dtype, dense)
        rows, w = self.reduce(_take_step, params, (Rows(), Rows()), first_pass=first_pass)
        return (rows[inverse], w[inverse]) if weights else rows[inverse]

    def working_set(self, X, weights, entropy):
        """A context: an Engine over a weighted set this process already holds (``SubEngines.working_set``)."""
        return self._opened.working_set(X, weights, entropy)

    @property
    def rebuilds(self):
        """Partitions rebuilt after their worker was lost, on this engine and on those opened from it."""
        return self.backend.n_rebuilds + self._opened.rebuilds

    def sample(self, step, params, counts, entropy, row_bytes=None):
        """A context: an Engine over the rows ``step`` draws from every chunk (``SubEngines.sample``)."""
        return self._opened.sample(step, params, counts, entropy, row_bytes)

    def samples_here(self, rows, row_bytes=None):
        """Whether ``sample`` brings a set of ``rows`` rows (``row_bytes`` each with its state, when more than
        the row) to this process: in-process, or within ``in-process-bytes`` (rule 6)."""
        nbytes = int(rows) * max(self.row_bytes, int(row_bytes or 0))
        return self.backend.in_process or nbytes <= config.get_bytes("in-process-bytes")

    def reorder(self, key_step, params=None):
        """A context: an Engine over the same rows sorted by a key (``SubEngines.reorder``)."""
        return self._opened.reorder(key_step, params)

    def to_input_order(self, values):
        """Per-row ``values`` in this engine's row order, put back in the input's row order."""
        (ids,) = self.reduce(_input_ids, None, (Rows(),))
        out = np.empty_like(values)
        out[ids] = values
        return out

    @property
    def sparse(self):
        """Whether the chunks hold their rows as CSR matrices (documents)."""
        return self.source.sparse

    @property
    def row_bytes(self):
        """The bytes of a row as the chunks hold it (CSR rows: their average stored bytes, ``stored_row_bytes``)."""
        return stored_row_bytes(self.source)

    @property
    def streaming(self):
        """Whether the partitions read their rows from the input's store on every pass."""
        return self.backend.streaming

    @property
    def state_in_files(self):
        """Whether the partitions keep their chunks' state in local files between calls (rule 4)."""
        return getattr(self.backend, "state_files", False)

    def bytes_read(self):
        """The stored bytes the partitions have decoded from a streamed source so far (``Figures``)."""
        return self._figures.bytes_read()

    def forget_state(self):
        """Drop every chunk's state, declared or not (a step's own keys, Lloyd's labels), on every partition:
        a fit that follows another on this engine (a sweep's next k) starts from none, as on a fresh engine,
        and keeps the first pass's summary and grid. One round trip that reads no rows."""
        self.reduce(_forget_step)

    def empty_iteration_ms(self):
        """Wall time of one empty iteration, in ms (``Figures``)."""
        return self._figures.empty_iteration_ms()

    def overhead_ms(self, repeats=20):
        """Median of ``repeats`` empty iterations after two warm-up ones, in ms (``Figures``)."""
        return self._figures.overhead_ms(repeats)

    def partitions(self):
        """Per partition: (rows, memory of the worker that holds it, bytes): what per-row state may cost."""
        return self.backend.partitions(self.source)

    def describe(self):
        """What ran the fit, for ``engine_`` (``Figures``)."""
        return self._figures.describe()

    def publisher(self, algo, figure, k=None):
        """A listener for ``progress.publishing`` that shows the fit where its cluster is watched, or None
        (``figure``: what its iterations' figure is called; k: its clusters)."""
        shape = {"N": self.source.n_samples, "D": self.source.n_features, "k": k}
        return self.backend.publisher(algo, shape, figure)


@functools.cache
def result_type(step):
    """The NamedTuple class a step's return annotation names (``def step(chunk, params) -> Partial``), or None."""
    kind = getattr(step, "__annotations__", {}).get("return")
    if isinstance(kind, str):  # (a module with postponed annotations)
        kind = getattr(step, "__globals__", {}).get(kind)
    return kind if isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields") else None


def named(step, fields):
    """A call's combined ``fields`` as the step's declared result type, when it declares one."""
    kind = result_type(step)
    return fields if kind is None else kind(*fields)


class Sender:
    """An engine's round trips: each call numbered and sent with what recovery needs (the declared states'
    builders, the halo plans sent so far, the sharded models' keys), and each feature told it ran. Within
    ``Engine.rerun`` (``restarting``) a lost worker raises ``Restarted`` instead of repeating the call."""

    def __init__(self, backend, states, halos, models):
        self.backend, self._states, self._halos, self._models = backend, states, halos, models
        self._ids = itertools.count()
        self.round_trips = 0
        self.restarting = 0

    def send(self, kind, **fields):
        """One round trip: a call of class ``kind`` with these fields and the next id, to every partition
        (after the gather plan a step's halo needs, when it has not been sent yet)."""
        self.round_trips += 1
        plan = self._halos.unsent(fields.get("halo"))
        if plan is not None:
            self.send(Plan, **plan)
        call = kind(next(self._ids), **fields)
        try:
            out = self.backend.call(
                call,
                self._states.builders,
                lambda: self._halos.sent(self._ids),
                self._models.keys,
                repeat=not self.restarting,
            )
        except Restarted:
            self._halos.restarted()
            raise
        self._states.ran(call)
        self._models.written(call)
        return out

    def rerun(self, phase, repair):
        """``Engine.rerun``: ``phase`` restarted after a loss, up to ``LOSSES`` times."""
        for attempt in range(LOSSES + 1):
            self.restarting += 1
            try:
                if attempt and repair is not None:
                    repair()
                return phase(attempt > 0)
            except Restarted:
                if attempt == LOSSES:
                    raise
            finally:
                self.restarting -= 1
        raise AssertionError("unreachable")


class Figures:
    """What an engine reports of itself: the bytes a streamed fit decoded, the cost of an empty iteration, and
    the description a fitted model keeps as ``engine_``."""

    def __init__(self, engine):
        self.engine = engine

    def bytes_read(self):
        """The stored bytes the partitions have decoded from a streamed source so far (0 when the rows are
        held in memory): the passes a fit made are this ÷ ``source.nbytes``. One round trip that reads no
        rows."""
        (read,) = self.engine.reduce(_bytes_read)
        return int(read)

    def empty_iteration_ms(self):
        """Wall time of one empty iteration (a reduce of an empty step over every partition), in ms."""
        t = time.perf_counter()
        self.engine.reduce(_empty_step)
        return 1000.0 * (time.perf_counter() - t)

    def overhead_ms(self, repeats=20):
        """Median of ``repeats`` empty iterations after two warm-up ones, in milliseconds."""
        times = [self.empty_iteration_ms() for _ in range(repeats + 2)]
        return statistics.median(times[2:])

    def describe(self):
        return {
            "backend": self.engine.backend.kind,
            "workers": self.engine.n_workers,
            "threads": self.engine.backend.threads,
            "chunks": self.engine.n_chunks,
            "streaming": self.engine.streaming,
            "state_files": self.engine.state_in_files,
            "stream_estimate_bytes": getattr(self.engine.backend, "stream_estimate", None),
            # the passes a streamed fit made over its source (the stored bytes decoded ÷ the data's size)
            "passes": self.bytes_read() / self.engine.source.nbytes if self.engine.streaming else None,
            "rebuilds": self.engine.rebuilds,
            "round_trips": self.engine.round_trips,
        }


class SubEngines:
    """The engines an ``Engine`` opens over other rows (a working set it holds, a sample it draws, its rows
    reordered), each on the backend that suits it; ``rebuilds``: their partitions rebuilt after a lost
    worker, counted as the opening engine's."""

    def __init__(self, origin, grid):
        self.origin = origin
        self.grid = grid  # the origin's fixed-point grid (its first pass made first), which a reorder keeps
        self.rebuilds = 0

    @contextlib.contextmanager
    def working_set(self, X, weights, entropy):
        """An Engine over a weighted set (X, weights) this process already holds (a sample): in this
        process when it fits ``in-process-bytes`` (rule 6: no cluster round trips), else on this engine's
        cluster; in chunks of ``working_set_rows`` either way, so the model does not depend on it."""
        source = as_source(X, weights, chunk_rows=working_set_rows(X.shape[0]))
        small = source.nbytes <= config.get_bytes("in-process-bytes")
        client = IN_PROCESS if small else getattr(self.origin.backend, "client", IN_PROCESS)
        with open_engine(source, client, entropy) as engine, self._below(engine):
            yield engine

    @contextlib.contextmanager
    def _below(self, engine):
        """While ``engine``, opened from this one, is open; then its rebuilds count as this one's."""
        try:
            yield
        finally:
            self.rebuilds += engine.rebuilds

    @contextlib.contextmanager
    def sample(self, step, params, counts, entropy, row_bytes=None):
        """An Engine over the rows ``step(chunk, params)`` draws from every chunk: (rows, weights), chunk c
        drawing ``counts[c]`` rows, in chunk order (a coreset). The step must need no state: on a cluster
        it runs as a one-shot task where the chunk's rows live. A set that fits ``in-process-bytes`` comes
        to this process (rule 6); a larger one stays on the workers that drew it, rebalanced there into the
        new engine's chunks (the driver handles counts and futures, never rows). Chunks of
        ``working_set_rows`` on every path, so the model does not depend on the path. ``row_bytes``:
        what the new engine will hold per row, its state included, when that is more than the row (the size
        that decides whether it comes to this process)."""
        counts = np.asarray(counts, dtype=np.int64)
        rows = working_set_rows(int(counts.sum()))
        if self.origin.samples_here(int(counts.sum()), row_bytes):
            X, w = self.origin.reduce(step, params, (Rows(), Rows()))
            source, client = as_source(X, w, chunk_rows=rows), IN_PROCESS
        else:
            source, client = self.origin.backend.rows.drawn(step, params, counts, rows), self.origin.backend.client
        with _releasing(source), open_engine(source, client, entropy) as engine, self._below(engine):
            yield engine

    @contextlib.contextmanager
    def reorder(self, key_step, params=None):
        """An Engine over the same rows sorted by the int key ``key_step(chunk, params)`` gives each row
        (ties in input order), rebalanced into chunks of this engine's sizes; every row keeps its input id
        (``chunk.input_ids()``; ``to_input_order`` maps per-row results back). ``key_step`` must need no
        state: on a cluster it runs as a one-shot task where each chunk's rows live, and the rows move
        worker to worker. The driver holds the keys' counts per chunk, never rows. The new engine keeps this
        one's summary and fixed-point grid, so an exact ``Sum`` gives the same bits on both."""
        keys, counts, chunks = self.origin.reduce(_key_counts, (key_step, params), (Rows(), Rows(), Rows()))
        distinct, where = np.unique(keys, return_inverse=True)
        totals = np.bincount(where, counts, len(distinct)).astype(np.int64)
        order = np.lexsort((chunks, keys))
        first = np.empty(len(keys), np.int64)
        first[order] = np.cumsum(counts[order]) - counts[order]
        plan = (key_step, params, keys, chunks, first)
        if self.origin.backend.in_process:
            pos, x, w, ids = self.origin.reduce(routed_rows, plan, (Rows(),) * 4)
            back = np.empty_like(pos)  # the row each position takes (a gather: CSR rows too)
            back[pos] = np.arange(len(pos))
            source, client = ArraySource(x[back], w[back], self.origin.source.starts, ids=ids[back]), IN_PROCESS
        else:
            source, client = self.origin.backend.rows.reordered(plan, counts, first, chunks), self.origin.backend.client
        with _releasing(source), backend_for(source, client, self.origin.entropy) as backend:
            engine = Engine(backend, source, self.origin.entropy, self.origin.summary, self.grid())
            engine.key_totals = distinct, totals
            with self._below(engine):
                yield engine


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


# a working set smaller than WORKING_SET_CHUNKS chunks of ``working-set-chunk-rows`` goes in that many
# chunks of at least WORKING_SET_MIN_ROWS (``working_set_rows``)
WORKING_SET_CHUNKS = 4
WORKING_SET_MIN_ROWS = 8192
# open_local's rows per chunk at least (a chunk is a task for one thread, and each costs a call)
LOCAL_CHUNK_ROWS = 1024


def working_set_rows(n):
    """Rows per chunk of a working set of ``n`` rows: ``working-set-chunk-rows`` (32,768), or for a smaller set
    WORKING_SET_CHUNKS chunks of at least WORKING_SET_MIN_ROWS, so that the threads share the paper's 2^15-row
    coreset (in one chunk it ran on one thread: GaussianMixture(64) on 300k x 16 took 1.0 s, in four 0.7 s;
    chunks of 4,096 cost more in calls than they gained). A function of the set alone, so the model does not
    depend on the machine (the chunking decides the per-chunk streams)."""
    most = int(config.get("working-set-chunk-rows"))
    return min(most, max(WORKING_SET_MIN_ROWS, -(-int(n) // WORKING_SET_CHUNKS)))


def open_local(X, sample_weight, entropy):
    """An in-process Engine over rows this process already holds (k-means||'s few candidates to recluster):
    the same steps as on the cluster, without a round trip; a context manager like ``open_engine``. The rows
    go in ``min-chunks`` chunks (of at least LOCAL_CHUNK_ROWS), not in the size-based chunks of an input,
    which put 10,000 candidates (2.6 MB) in one chunk and their recluster on one thread; the exact sums give
    the same bits for any chunking."""
    rows = max(LOCAL_CHUNK_ROWS, -(-X.shape[0] // int(config.get("min-chunks"))))
    return open_engine(as_source(X, sample_weight, chunk_rows=rows), IN_PROCESS, entropy)
