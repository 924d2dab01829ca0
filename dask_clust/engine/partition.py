"""Partition: one per worker, holding its row chunks and their per-algorithm state (ARCHITECTURE.md, rules 1-2).

Rows are held in memory, or, for data larger than the cluster's memory (rule 4), a chunk holds only
its loader (the chunk's pickled dask graph, e.g. a zarr or parquet read) and loads its rows for the
duration of each step; its state stays resident either way.

A step is a module-level function ``step(chunk, params)`` of an algorithm; it sees one ``Chunk`` (rows,
weights, global offset, its own state dict, its own random streams). The partition runs the step over
all of its chunks on the worker's threads and combines their partials with the declared combines
(``combine.py``). On a cluster the partitions form a tree of fan-in ``split-every``: a call reaches the
root straight from the driver (no scheduler hop), each partition passes it on to its children directly,
worker to worker, runs its own chunks meanwhile, adds its children's partials to its own, and only the
root's finished result goes back to the driver. A partition keeps its last call's own partial, so a call
repeated after a lost worker (same id) never applies a step's state change twice.

A model too large for the driver lives here too, split by rows over the partitions (``Engine.sharded``):
each partition keeps the two newest versions of its rows and a copy of the previous partition's; a
reduce-scatter sends every partition the rows it owns of the others' partials, worker to worker.
"""

import asyncio
import copy
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import threadpool_limits

from .._random import stream
from . import combine as combines
from .calls import Build, Gather, Plan, ShardApply, ShardDrop, ShardKeep, Step, resolved_params


class Chunk:
    """One row chunk as a step sees it: rows ``x`` (n × d), weights ``w`` (n,), global rows
    ``start``..``stop``, its own ``state`` dict and random streams, and ``scratch``: a per-thread namespace
    for buffers a step reuses from chunk to chunk (a thread runs one chunk at a time), shared by the
    partition's chunks and gone with the partition."""

    __slots__ = ("index", "start", "stop", "x", "w", "state", "entropy", "loader", "halo", "ids", "scratch")

    def __init__(self, index, start, stop, data, entropy, scratch=None):
        """data: (x, w) or (x, w, input ids) rows held in memory, or bytes: a pickled dask object computing
        (x, w). Input ids are the rows' global ids in the input (``Engine.reorder``); by default
        start..stop. scratch: the partition's ``threading.local`` (a chunk of its own gets a new one)."""
        self.scratch = threading.local() if scratch is None else scratch
        self.index = int(index)
        self.start = int(start)
        self.stop = int(stop)
        self.state = {}
        self.halo = {}  # field -> the previous call's values of the rows this chunk reads (Engine.halo)
        self.entropy = entropy
        self.loader = data if isinstance(data, bytes) else None
        self.x = self.w = self.ids = None
        if self.loader is None:
            self._hold(*data)

    def _hold(self, x, w, ids=None):
        self.x = x
        self.w = np.ones(x.shape[0]) if w is None else w
        self.ids = ids

    def input_ids(self):
        """The rows' ids in the input (their global ids unless the engine was reordered)."""
        return np.arange(self.start, self.stop, dtype=np.int64) if self.ids is None else self.ids

    def run(self, step, params):
        if self.loader is None:
            return step(self, params)
        self._hold(*pickle.loads(self.loader).compute(scheduler="sync"))
        try:
            return step(self, params)
        finally:
            self.x = self.w = None

    def rng(self, *tag):
        """This chunk's random stream for ``tag``: independent of which worker holds the chunk."""
        return stream(self.entropy, *tag, self.index)


def route(chunk, plan):
    """Where ``Engine.reorder`` sends each of the chunk's rows: its key's first position for this chunk plus
    the row's rank among the chunk's rows of that key (rows keep their order within a key)."""
    key_step, key_params, keys, chunks, first = plan
    k = np.asarray(key_step(chunk, key_params), dtype=np.int64)
    mine = chunks == chunk.index
    table, base = keys[mine], first[mine]  # np.unique order: ascending keys
    order = np.argsort(k, kind="stable")
    slot = np.searchsorted(table, k[order])
    pos = np.empty(len(k), np.int64)
    pos[order] = base[slot] + np.arange(len(k)) - np.searchsorted(k[order], table)[slot]
    return pos


def routed_rows(chunk, plan):
    """The chunk's rows with their new positions: (positions, x, w, input ids)."""
    return route(chunk, plan), chunk.x, chunk.w, chunk.input_ids()


# copies of a partition's backed-up state (``Engine.state(backup=...)``), on the partitions after it: a state is
# lost only with BACKUP_COPIES + 1 consecutive partitions, so any two workers lost at once (or one lost while
# a rebuilt partition has not yet received its copies again) leave a copy
BACKUP_COPIES = 2


def buddies(peers, pid):
    """The peers (address, partition key, chunk ids) that keep partition ``pid``'s backups, nearest first."""
    n = len(peers)
    return [peers[(pid + j) % n] for j in range(1, min(BACKUP_COPIES, n - 1) + 1)]


def pop_state(chunk, key):
    """Drop one kind of per-chunk state (the end of ``Engine.state``)."""
    chunk.state.pop(key, None)


def replay(chunk, steps):
    """A state as a list of calls left it: each (builder or step, params) of ``steps`` on this chunk in order,
    their partials dropped (``Engine.state``: a state lost with every copy of it)."""
    for step, params in steps:
        step(chunk, params)


def pop_halo(chunk, params):
    """Drop a gather plan's rows and the values it filled in (the end of ``Engine.halo``)."""
    key, fields = params
    chunk.state.pop(("halo", key), None)
    chunk.state.pop(("halo-pos", key), None)
    for field in fields:
        chunk.halo.pop(field, None)


_PINNED = []


def pin_blas():
    """BLAS at one thread in this worker process, once: the partition runs one chunk per worker thread, a
    multi-threaded BLAS inside each would oversubscribe the cores, and its split of a dot product would make
    the model depend on the worker's core count (rule 5). Dask's nanny already starts workers with
    OMP/MKL/OPENBLAS_NUM_THREADS = 1; a worker without a nanny gets the same here. Kept for the life of the
    process, as the nanny's setting is."""
    if not _PINNED:
        _PINNED.append(threadpool_limits(1, user_api="blas"))


class Partition:
    """Long-lived holder of row chunks on one worker (hosted by ``cluster.PartitionHost`` on a cluster, a plain
    object in-process)."""

    def __init__(self, meta, *blocks):
        """meta: {"chunks": [(index, start, stop), ...], "entropy": int, "threads": int};
        blocks: per chunk, (x, w) rows or a loader (see ``Chunk``)."""
        # steps' per-thread buffers live as long as the partition, not as long as its worker's threads (a
        # module-level threading.local kept vc-GMM's ~40 MB per thread in the driver's and workers' threads
        # after every fit)
        scratch = threading.local()
        self.chunks = [
            Chunk(i, a, b, data, meta["entropy"], scratch) for (i, a, b), data in zip(meta["chunks"], blocks)
        ]
        self.threads = max(1, int(meta.get("threads", 1)))
        if meta.get("worker"):
            pin_blas()
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 and len(self.chunks) > 1 else None
        self._runner = None  # the thread that drives this partition's chunks while the event loop serves calls
        self._last = (None, None)
        self.pid = int(meta.get("partition", 0))
        self._sources = {}  # halo key -> the partitions holding rows this partition's chunks read
        self._sends = {}  # halo key -> (plan call id, {partition: the rows it reads from here})
        self._sent = (None, None)  # (call id, {partition: values}) kept for a repeated call
        self._mail = {}  # (call id, halo key) -> {partition: (rows, values)}
        self._mail_event = None
        self._newest = -1  # the newest call id seen: waiters of older calls give up
        self._backups = {}  # (state key, chunk index) -> [(call id, {field: array})], the two newest
        self.n_parts = int(meta.get("partitions", 1))
        self._shards = {}  # model key -> [(version, lo, arrays)], the two newest of this partition's rows
        self._shard_backups = {}  # (model key, partition) -> its copies [(version, lo, arrays)] kept here
        self._gathered = {}  # (model key, field) -> (version, the whole field) assembled for steps
        self._wrote = None  # (model key, version) this call wrote: copied to the buddies
        self._shard_done = (None, None)  # (call id, at_shard's small partial) kept for a repeated call
        self.worker = None  # the distributed Worker hosting it, set by its host; None in-process

    def _each(self, step, params):
        if self._pool is None:
            return [c.run(step, params) for c in self.chunks]
        return list(self._pool.map(lambda c: c.run(step, params), self.chunks))

    def local(self, call):
        """This partition's own combined partial of ``call`` (lifted, see ``combine.lift``); computed once
        per call id."""
        if self._last[0] == call.id:
            return self._last[1]
        self._wrote = None
        acc = self.HANDLERS[type(call)](self, call)
        self._last = (call.id, acc)
        return acc

    def _build(self, call):
        self._each(call.step, call.params)

    def _accumulate(self, call):
        """The chunks' partials of a step, each added into this partition's lifted sum as soon as it is
        computed: a worker holds one partial per thread and one sum (at large C a partial is C x D), not a
        partial per chunk."""
        if self._pool is None:
            acc = None
            for c in self.chunks:
                acc = combines.accumulate(call.combine, acc, c.run(call.step, call.params), c.index, call.top)
            return acc
        shared = combines.Shared(call.combine, call.top, self.threads)
        for _ in self._pool.map(lambda c: shared.add(c.run(call.step, call.params), c.index), self.chunks):
            pass
        return shared.result()

    async def run(self, call, children, root=False, peers=None):
        """Entry point of a call: pass ``call`` on to the ``children`` subtrees [(address, key, subtree)], run
        this partition's chunks, add the children's partials; the root returns the finished result.
        ``peers``: per partition (address, key, chunk ids), for the halo's partition-to-partition
        messages."""
        worker = self.worker
        pending = [
            asyncio.ensure_future(remote_run(worker.rpc(addr), key, call, sub, peers=peers))
            for addr, key, sub in children
        ]
        if self._runner is None:
            self._runner = ThreadPoolExecutor(1)
        loop = asyncio.get_running_loop()
        try:
            call = await self._resolve(call, peers, worker)
            if isinstance(call, Plan):
                await self._plan(call, peers, worker, loop)
            elif call.halo is not None:
                await self._exchange(call, peers, worker)
            mine = await loop.run_in_executor(self._runner, self.local, call)
            keepers = buddies(peers, self.pid) if peers else []
            if call.scatter is not None:
                mine = self.tree_part(call, mine, await self._scatter(call, mine, peers, worker, loop))
            if isinstance(call, Step) and call.backup and keepers:
                arrays = self.backup_of(call)
                await asyncio.gather(
                    *(remote_call(worker.rpc(addr), key, "backup_put", call.id, arrays) for addr, key, _ in keepers)
                )
            if self._wrote is not None and keepers:
                newest = self._shards[self._wrote[0]][-1:]
                await asyncio.gather(
                    *(
                        remote_call(worker.rpc(addr), key, "shard_backup_put", self._wrote[0], self.pid, newest)
                        for addr, key, _ in keepers
                    )
                )
        finally:
            got = await asyncio.gather(*pending, return_exceptions=True)
        for g in got:
            if isinstance(g, BaseException):
                raise g
        acc = copy.deepcopy(mine) if got else mine  # the kept partial must not absorb the children's
        for g in got:
            acc = combines.add(call.tree, acc, g)
        return call.finished(acc) if root else acc

    # -- halo: a fixed gather plan, then per call the previous values pushed partition to partition

    def plan_needs(self, call, owner):
        """Run the plan's step: the global rows each chunk reads (any order, repeats allowed), kept per chunk;
        returns {owner partition: rows this partition reads there}."""
        key = call.key
        needs = self._each(call.need_step, call.params)
        for c, ids in zip(self.chunks, needs):
            c.state[("halo", key)] = np.asarray(ids, dtype=np.int64)
        rows = np.unique(np.concatenate([c.state[("halo", key)] for c in self.chunks]))
        who = owner(rows)
        by_owner = {int(q): rows[who == q] for q in np.unique(who)}
        self._sources[key] = set(by_owner)
        return by_owner

    def halo_request(self, plan_id, key, requester, rows):
        """Partition ``requester`` reads ``rows`` of this partition under plan ``key``."""
        if self._sends.get(key, (None,))[0] != plan_id:
            self._sends[key] = (plan_id, {})
        self._sends[key][1][int(requester)] = rows

    def _own_values(self, field, rows, out=None):
        """The state ``field`` of this partition's rows ``rows`` (ascending), into ``out`` when given."""
        vals = []
        for c in self.chunks:
            lo, hi = np.searchsorted(rows, [c.start, c.stop])
            if hi > lo:
                vals.append(c.state[field][rows[lo:hi] - c.start])
        return np.concatenate(vals, out=out)

    def halo_values(self, call):
        """{partition: (rows, values)} this partition sends for ``call``: the field's values before the call's
        step runs anywhere (kept, so a repeated call sends the same). Its own part's values are None: they
        are read straight into the assembled halo (``halo_fill``, before this partition's step runs)."""
        if self._sent[0] == call.id:
            return self._sent[1]
        key, field = call.halo.key, call.halo.field
        out = {
            q: (rows, None if q == self.pid else self._own_values(field, rows))  # a copy: steps change state
            for q, rows in self._sends.get(key, (None, {}))[1].items()
        }
        self._sent = (call.id, out)
        return out

    def halo_fill(self, call, received):
        """Every chunk's ``halo[field]``: the values of the rows it reads, in the order its plan step named them;
        with an indexed halo (``call.halo.indexed``), the partition's received values and where each named row sits
        among them, so no chunk copies them. One array of the rows read: the largest per-row state (SLK's z)
        is held once more, not three times."""
        key, field = call.halo.key, call.halo.field
        parts = [received[q] for q in sorted(received)]  # partitions hold ascending row ranges
        for c in self.chunks:  # the previous call's values go before the new ones are assembled
            c.halo.pop(field, None)
        rows = np.concatenate([p[0] for p in parts] + [np.empty(0, np.int64)])  # none: no chunk reads a row
        like = self.chunks[0].state[field]
        values = np.empty((len(rows),) + like.shape[1:], like.dtype)
        at = 0
        for part_rows, part_values in parts:
            piece = values[at : at + len(part_rows)]
            if part_values is None:
                self._own_values(field, part_rows, out=piece)
            else:
                piece[...] = part_values
            at += len(part_rows)
        indexed = call.halo.indexed
        for c in self.chunks:
            # the plan fixes the rows received, so where each read row sits among them is found once
            pos = c.state.get(("halo-pos", key))
            if pos is None or pos[0] is not c.state[("halo", key)] or pos[1] != len(rows):
                pos = c.state[("halo", key)], len(rows), np.searchsorted(rows, c.state[("halo", key)])
                c.state[("halo-pos", key)] = pos
            c.halo[field] = (values, pos[2]) if indexed else values[pos[2]]

    async def halo_put(self, call_id, key, sender, rows, values):
        self._mail.setdefault((call_id, key), {})[int(sender)] = (rows, values)
        self._wake()

    def _wake(self):
        if self._mail_event is None:
            self._mail_event = asyncio.Event()
        self._mail_event.set()

    async def _plan(self, call, peers, worker, loop):
        starts = np.array([min(p[2]) for p in peers])  # the first chunk of each partition, ascending
        chunk_starts = call.starts

        def owner(rows):
            return np.searchsorted(starts, np.searchsorted(chunk_starts, rows, side="right") - 1, side="right") - 1

        by_owner = await loop.run_in_executor(self._runner, self.plan_needs, call, owner)
        key = call.key
        sends = []
        for q, rows in by_owner.items():
            if q == self.pid:
                self.halo_request(call.id, key, q, rows)
            else:
                sends.append(
                    remote_call(worker.rpc(peers[q][0]), peers[q][1], "halo_request", call.id, key, self.pid, rows)
                )
        await asyncio.gather(*sends)

    async def _exchange(self, call, peers, worker):
        key = call.halo.key
        self._advance(call)
        sent = self.halo_values(call)
        pushes = [
            remote_call(worker.rpc(peers[q][0]), peers[q][1], "halo_put", call.id, key, self.pid, *rv)
            for q, rv in sent.items()
            if q != self.pid
        ]
        if self.pid in sent:
            await self.halo_put(call.id, key, self.pid, *sent[self.pid])
        await asyncio.gather(*pushes)
        if self._last[0] == call.id:  # a repeated call this partition has answered: it only resends
            return
        self.halo_fill(call, await self._mailbox((call.id, key), self._sources[key]))

    def _advance(self, call):
        """A new call: earlier calls' mail is stale, and their waiters give up."""
        if call.id > self._newest:
            self._newest = call.id
            for old in [m for m in self._mail if m[0] < call.id]:
                del self._mail[old]
            self._wake()

    async def _mailbox(self, where, senders):
        """The mail of (call id, kind) once every partition in ``senders`` has sent its part. The box stays
        until a newer call: a first attempt still waiting here after a lost partition and its repetition
        both fill from it (``local`` then runs once per call id)."""
        box = self._mail.setdefault(where, {})
        while not set(senders) <= set(box):
            if self._newest > where[0]:
                raise RuntimeError(f"call {where[0]} was superseded by call {self._newest}")
            self._mail_event.clear()
            await self._mail_event.wait()
        return box

    # -- a sharded model: every partition holds rows shard_bounds(rows, partitions)[pid:pid + 2]

    def bounds(self, n_rows):
        b = combines.shard_bounds(n_rows, self.n_parts)
        return int(b[self.pid]), int(b[self.pid + 1])

    def shard_at(self, key, version, before=False):
        """This partition's (lo, arrays) of model ``key``: version ``version``, or the newest before it."""
        for v, lo, arrays in reversed(self._shards.get(key, [])):
            if v == version or (before and v < version):
                return lo, arrays
        raise KeyError(f"partition {self.pid} holds no version {'before ' if before else ''}{version} of {key!r}")

    def _keep(self, key, version, lo, arrays):
        kept = [s for s in self._shards.get(key, []) if s[0] != version] + [(version, lo, tuple(arrays))]
        self._shards[key] = sorted(kept, key=lambda s: s[0])[-2:]
        self._wrote = (key, version)

    def _gather(self, call):
        """This partition's rows of the field, on their way to the driver."""
        lo, arrays = self.shard_at(call.ref.key, call.ref.version)
        return ([(self.pid, arrays[call.ref.field])],)

    def _keep_shard(self, call):
        lo, hi = self.bounds(len(call.arrays[0]))
        self._keep(call.key, call.id, lo, [np.array(a[lo:hi], copy=True) for a in call.arrays])

    def _drop_shard(self, call):
        self._shards.pop(call.key, None)
        for where in [w for w in (*self._shard_backups, *self._gathered) if w[0] == call.key]:
            self._shard_backups.pop(where, None)
            self._gathered.pop(where, None)

    def _apply_shard(self, call):
        """The next step where each shard lives, from the shard as the last call left it."""
        lo, old = self.shard_at(call.key, call.id, before=True)
        new, small = call.fn(old, call.fn_params, lo)
        self._keep(call.key, call.id, lo, new)
        return combines.lift(call.small, small, self.pid, call.top)

    def shard_get(self, key, version, field):
        return self.shard_at(key, version)[1][field]

    def shard_backup_put(self, key, pid, versions):
        """Keep partition ``pid``'s shard versions (the two newest of what it has sent)."""
        kept = {v[0]: v for v in self._shard_backups.get((key, int(pid)), [])}
        kept.update({v[0]: v for v in versions})
        self._shard_backups[(key, int(pid))] = sorted(kept.values(), key=lambda v: v[0])[-2:]

    def shard_backup_get(self, key, pid):
        return self._shard_backups.get((key, int(pid)))

    def shard_restore(self, key, versions):
        self._shards[key] = list(versions)

    async def shard_rebackup(self, peers):
        """Copy every shard to the buddies again (one was rebuilt and lost its copies); a buddy given as None
        is lost and not rebuilt yet (its rebuild asks for the copies again)."""
        keepers = [b for b in buddies(peers, self.pid) if b is not None]
        for key, versions in self._shards.items():
            await asyncio.gather(
                *(
                    remote_call(self.worker.rpc(addr), part, "shard_backup_put", key, self.pid, versions)
                    for addr, part, _ in keepers
                )
            )

    def assemble(self, ref, pieces):
        """A whole field from every partition's piece (partition order is row order), kept for later steps."""
        cached = self._gathered.get((ref.key, ref.field))
        if cached is None or cached[0] != ref.version:
            whole = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            self._gathered[(ref.key, ref.field)] = cached = (ref.version, whole)
        return cached[1]

    def resolved(self, call, fetched=None):
        """``call`` with every ShardRef of its parameters replaced by the whole field (``fetched``: the other
        partitions' pieces, {ref: {partition: piece}})."""
        refs = call.refs()
        if not refs:
            return call
        values = {}
        for ref in refs:
            cached = self._gathered.get((ref.key, ref.field))
            if cached is not None and cached[0] == ref.version:
                values[ref] = cached[1]
                continue
            pieces = dict((fetched or {}).get(ref, {}))
            pieces[self.pid] = self.shard_get(ref.key, ref.version, ref.field)
            values[ref] = self.assemble(ref, [pieces[q] for q in sorted(pieces)])
        return resolved_params(call, values)

    async def _resolve(self, call, peers, worker):
        """Fetch the other partitions' pieces of every ShardRef this partition has not assembled yet: each
        partition reads them straight from the others (an allgather), never through the driver."""
        refs = [r for r in call.refs() if self._gathered.get((r.key, r.field), (None,))[0] != r.version]
        fetched = {}
        for ref in refs:
            others = [q for q in range(len(peers or ())) if q != self.pid]
            got = await asyncio.gather(
                *[
                    remote_call(worker.rpc(peers[q][0]), peers[q][1], "shard_get", ref.key, ref.version, ref.field)
                    for q in others
                ]
            )
            fetched[ref] = dict(zip(others, got))
        return self.resolved(call, fetched)

    # -- reduce-scatter: every partition sends each other partition its rows of the scattered fields

    def scatter_parts(self, call, mine):
        """Per partition q, the rows q owns of this partition's scattered fields (lifted), and where this
        partition's own rows start."""
        idx = call.scattered
        n_rows = {call.combine[i].rows(mine[i]) for i in idx}
        if len(n_rows) != 1:
            raise ValueError(f"the scattered fields must have the same number of rows, got {sorted(n_rows)}")
        b = combines.shard_bounds(n_rows.pop(), self.n_parts)
        parts = [tuple(call.combine[i].slice(mine[i], b[q], b[q + 1]) for i in idx) for q in range(self.n_parts)]
        return parts, int(b[self.pid])

    def shard_step(self, call, box, lo):
        """Where each shard lives: the scattered fields' rows lo..hi from every partition combined, then
        ``at_shard(fields, shard, params, lo)`` -> (new shard, small fields) with the model's shard as the
        last call left it; the new shard is kept, the small fields go up the tree. Once per call id."""
        if self._shard_done[0] == call.id:
            return self._shard_done[1]
        parts = [call.combine[i] for i in call.scattered]
        acc = None
        for q in sorted(box):
            acc = combines.add(parts, acc, box[q])
        fields = combines.finish(parts, acc, call.top)
        key = call.scatter.model
        old = self.shard_at(key, call.id, before=True)[1] if key in self._shards else None
        new, small = call.scatter.at_shard(fields, old, call.params, lo)
        self._keep(key, call.id, lo, new)
        out = combines.lift(call.scatter.small, small, self.pid, call.top)
        self._shard_done = (call.id, out)
        return out

    def tree_part(self, call, mine, small):
        """What this partition sends up the tree: its fields that are not scattered, then the small ones."""
        return tuple(f for i, f in enumerate(mine) if i not in call.scattered) + tuple(small)

    async def scatter_put(self, call_id, sender, part):
        self._mail.setdefault((call_id, "scatter"), {})[int(sender)] = part
        self._wake()

    async def _scatter(self, call, mine, peers, worker, loop):
        self._advance(call)
        parts, lo = self.scatter_parts(call, mine)
        sends = [
            remote_call(worker.rpc(peers[q][0]), peers[q][1], "scatter_put", call.id, self.pid, parts[q])
            for q in range(self.n_parts)
            if q != self.pid
        ]
        await self.scatter_put(call.id, self.pid, parts[self.pid])
        await asyncio.gather(*sends)
        box = await self._mailbox((call.id, "scatter"), range(self.n_parts))
        return await loop.run_in_executor(self._runner, self.shard_step, call, box, lo)

    # -- state backups on the next BACKUP_COPIES partitions, for state the model cannot rebuild

    def backup_of(self, call):
        """{(state key, chunk index): {field: array}} of the state ``call.backup`` names, as this call left it."""
        return {
            (key, c.index): {f: c.state[key][f] for f in fields}
            for key, fields in call.backup
            for c in self.chunks
            if key in c.state
        }

    def backup_put(self, call_id, arrays):
        """Keep another partition's state as ``call_id`` left it (the two newest calls)."""
        for where, fields in arrays.items():
            kept = [b for b in self._backups.get(where, []) if b[0] != call_id] + [(call_id, fields)]
            self._backups[where] = sorted(kept, key=lambda b: b[0])[-2:]

    def backup_get(self, key, chunk_ids, before):
        """{chunk index: {field: array}} as the newest call before ``before`` left them, or None when a
        chunk has none (its state was never backed up: its builder makes it again)."""
        out = {}
        for c in chunk_ids:
            older = [b for b in self._backups.get((key, c), []) if b[0] < before]
            if not older:
                return None
            out[c] = older[-1][1]
        return out

    def restore(self, key, arrays):
        for c in self.chunks:
            c.state[key] = {f: np.array(a, copy=True) for f, a in arrays[c.index].items()}

    def close(self):
        for pool in (self._pool, self._runner):
            if pool is not None:
                pool.shutdown()
        for c in self.chunks:  # the last references to the steps' per-thread buffers
            c.scratch = None

    # what a partition does with each kind of call (``local``); a plan's step ran in ``plan_needs``
    HANDLERS = {
        Step: _accumulate,
        Build: _build,
        Plan: lambda self, call: None,
        ShardKeep: _keep_shard,
        ShardDrop: _drop_shard,
        ShardApply: _apply_shard,
        Gather: _gather,
    }


async def remote_call(rpc, key, method, *args):
    """``method(*args)`` of the partition ``key`` behind ``rpc``, straight to its worker (distributed's comms;
    ``cluster.PartitionHost.call`` answers)."""
    from distributed.protocol import to_serialize

    msg = await rpc.dask_clust_call(key=key, method=method, args=[to_serialize(a) for a in args])
    if msg["status"] != "OK":
        raise msg["exception"]
    return msg["result"]


async def remote_run(rpc, key, call, children, root=False, peers=None):
    """``Partition.run`` on the partition ``key`` behind ``rpc``."""
    return await remote_call(rpc, key, "run", call, children, root, peers)
