"""A partition's side of ``Engine.sharded``: a model too large for the driver, split by rows over the
partitions (partition p owns rows ``combine.shard_bounds(rows, P)[p:p + 2]``). Each partition keeps the two
newest versions of its rows and copies of its buddies' (``backups.buddies``: the partitions before it);
every partition assembles a whole field a step reads (``ShardRef``) straight from the others, once per
version; a reduce-scatter sends every partition the rows it owns of the others' partials, worker to worker,
and runs ``at_shard`` where each shard lives. ``ShardedModels`` and ``ShardedModel`` are the driver's side."""

import contextlib
import functools
import logging
import weakref
from typing import NamedTuple

import numpy as np

from . import combine as combines
from .backups import BACKUP_COPIES, buddies
from .calls import Gather, ReduceScatter, ShardApply, ShardDrop, ShardKeep, ShardRef, resolved_params
from .mailbox import Answer, PartitionView, RebuiltPartition, gather_all, keep_newest, peer_call

logger = logging.getLogger("dask_clust")


class ShardStore:
    """The shards of every sharded model on one partition, the copies it keeps for others, and the whole
    fields it assembled for its steps."""

    def __init__(self, part):
        self._part: PartitionView = weakref.proxy(
            part
        )  # no cycle: the partition's rows go as soon as its host drops it
        self._shards = {}  # model key -> [(version, lo, arrays)], the two newest of this partition's rows
        self._backups = {}  # (model key, partition) -> its copies [(version, lo, arrays)] kept here
        self._gathered = {}  # (model key, field) -> (version, the whole field) assembled for steps
        self._done = Answer()  # at_shard's small partial of the newest reduce-scatter
        self.wrote = None  # (model key, version) the current call wrote: copied to the buddies

    def bounds(self, n_rows):
        part = self._part
        b = combines.shard_bounds(n_rows, part.n_parts)
        return int(b[part.pid]), int(b[part.pid + 1])

    def at(self, key, version, before=False):
        """This partition's (lo, arrays) of model ``key``: version ``version``, or the newest before it."""
        for v, lo, arrays in reversed(self._shards.get(key, [])):
            if v == version or (before and v < version):
                return lo, arrays
        raise KeyError(f"partition {self._part.pid} holds no version {'before ' if before else ''}{version} of {key!r}")

    def _keep(self, key, version, lo, arrays):
        self._shards[key] = keep_newest(self._shards.get(key, []), (version, lo, tuple(arrays)))
        self.wrote = (key, version)

    # -- the calls without a chunk step (``Partition.HANDLERS``)

    def keep(self, call):
        lo, hi = self.bounds(len(call.arrays[0]))
        self._keep(call.key, call.id, lo, [np.array(a[lo:hi], copy=True) for a in call.arrays])

    def drop(self, call):
        self._shards.pop(call.key, None)
        for where in [w for w in (*self._backups, *self._gathered) if w[0] == call.key]:
            self._backups.pop(where, None)
            self._gathered.pop(where, None)

    def apply(self, call):
        """The next step where each shard lives, from the shard as the last call left it."""
        lo, old = self.at(call.key, call.id, before=True)
        new, small = call.fn(old, call.fn_params, lo)
        self._keep(call.key, call.id, lo, new)
        return combines.lift(call.small, small, self._part.pid, call.top)

    def gather(self, call):
        """This partition's rows of the field, on their way to the driver."""
        lo, arrays = self.at(call.ref.key, call.ref.version)
        return ([(self._part.pid, arrays[call.ref.field])],)

    # -- copies on the buddies, and a rebuilt partition's shards from them

    def get(self, key, version, field):
        return self.at(key, version)[1][field]

    def backup_put(self, key, pid, versions):
        """Keep partition ``pid``'s shard versions (the two newest of what it has sent)."""
        self._backups[(key, int(pid))] = keep_newest(self._backups.get((key, int(pid)), []), *versions)

    def backup_get(self, key, pid):
        return self._backups.get((key, int(pid)))

    def restore(self, key, versions):
        self._shards[key] = list(versions)

    async def copy_newest(self, keepers):
        """The version this call wrote, to the buddies."""
        part, (key, _) = self._part, self.wrote
        newest = self._shards[key][-1:]
        await gather_all([part.tell(k, ShardBackupPut(key, part.pid, newest)) for k in keepers])

    async def rebackup(self, peers):
        """Copy every shard to the buddies again (one was rebuilt and lost its copies); a buddy given as None
        is lost and not rebuilt yet (its rebuild asks for the copies again)."""
        part = self._part
        keepers = [b for b in buddies(peers, part.pid) if b is not None]
        for key, versions in self._shards.items():
            await gather_all([part.tell(k, ShardBackupPut(key, part.pid, versions)) for k in keepers])

    # -- the whole fields a step reads

    def assemble(self, ref, pieces):
        """A whole field from every partition's piece (partition order is row order), kept for later steps."""
        cached = self._gathered.get((ref.key, ref.field))
        if cached is None or cached[0] != ref.version:
            whole = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
            self._gathered[(ref.key, ref.field)] = cached = (ref.version, whole)
        return cached[1]

    def resolved(self, call, fetched):
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
            pieces = dict(fetched.get(ref, {}))
            pieces[self._part.pid] = self.get(ref.key, ref.version, ref.field)
            values[ref] = self.assemble(ref, [pieces[q] for q in sorted(pieces)])
        return resolved_params(call, values)

    async def resolve(self, call, peers):
        """Fetch the other partitions' pieces of every ShardRef this partition has not assembled yet: each
        partition reads them straight from the others (an allgather), never through the driver."""
        part = self._part
        refs = [r for r in call.refs() if self._gathered.get((r.key, r.field), (None,))[0] != r.version]
        fetched = {}
        for ref in refs:
            others = [q for q in range(len(peers)) if q != part.pid]
            got = await gather_all([part.tell(peers[q], ShardGet(ref.key, ref.version, ref.field)) for q in others])
            fetched[ref] = dict(zip(others, got))
        return self.resolved(call, fetched)

    # -- reduce-scatter: every partition sends each other partition its rows of the scattered fields

    def scatter_parts(self, call, mine):
        """Per partition q, the rows q owns of this partition's scattered fields (lifted), and where this
        partition's own rows start."""
        part, idx = self._part, call.scattered
        n_rows = {call.combine[i].rows(mine[i]) for i in idx}
        if len(n_rows) != 1:
            raise ValueError(f"the scattered fields must have the same number of rows, got {sorted(n_rows)}")
        b = combines.shard_bounds(n_rows.pop(), part.n_parts)
        parts = [tuple(call.combine[i].slice(mine[i], b[q], b[q + 1]) for i in idx) for q in range(part.n_parts)]
        return parts, int(b[part.pid])

    def step(self, call, box, lo):
        """Where each shard lives: the scattered fields' rows lo..hi from every partition combined, then
        ``at_shard(fields, shard, params, lo)`` -> (new shard, small fields) with the model's shard as the
        last call left it; the new shard is kept, the small fields go up the tree. Once per call id."""

        def compute():
            parts = [call.combine[i] for i in call.scattered]
            acc = None
            for q in sorted(box):
                acc = combines.add(parts, acc, box[q])
            fields = combines.finish(parts, acc, call.top)
            key = call.scatter.model
            old = self.at(key, call.id, before=True)[1] if key in self._shards else None
            new, small = call.scatter.at_shard(fields, old, call.params, lo)
            self._keep(key, call.id, lo, new)
            return combines.lift(call.scatter.small, small, self._part.pid, call.top)

        return self._done.of(call.id, compute)

    async def scatter_put(self, call_id, sender, piece):
        self._part.mail.put((call_id, "scatter"), sender, piece)

    async def scatter(self, call, mine, peers):
        """The reduce-scatter of ``call``'s partial ``mine``; what this partition sends up the tree: its fields
        that are not scattered, then at_shard's small ones."""
        part = self._part
        part.mail.advance(call.id)
        parts, lo = self.scatter_parts(call, mine)
        sends = [
            part.tell(peers[q], ShardScatterPut(call.id, part.pid, parts[q]))
            for q in range(part.n_parts)
            if q != part.pid
        ]
        await self.scatter_put(call.id, part.pid, parts[part.pid])
        await gather_all(sends)
        box = await part.mail.collect((call.id, "scatter"), range(part.n_parts))
        small = await part.offload(self.step, call, box, lo)
        return tuple(f for i, f in enumerate(mine) if i not in call.scattered) + tuple(small)


@peer_call(ShardStore, ShardStore.get)
class ShardGet(NamedTuple):
    key: object
    version: int
    field: int


@peer_call(ShardStore, ShardStore.backup_put)
class ShardBackupPut(NamedTuple):
    key: object
    pid: int
    versions: list


@peer_call(ShardStore, ShardStore.backup_get)
class ShardBackupGet(NamedTuple):
    key: object
    pid: int


@peer_call(ShardStore, ShardStore.restore)
class ShardRestore(NamedTuple):
    key: object
    versions: list


@peer_call(ShardStore, ShardStore.rebackup)
class ShardRebackup(NamedTuple):
    peers: list


@peer_call(ShardStore, ShardStore.scatter_put)
class ShardScatterPut(NamedTuple):
    call_id: int
    sender: int
    piece: object


class ShardedModels:
    """The driver's side of ``Engine.sharded``: per open sharded model, the id of the call that last wrote
    it (the version a ``ShardRef`` names, and a rebuilt partition restores)."""

    def __init__(self):
        self.versions = {}

    def written(self, call):
        if call.writes is not None:
            self.versions[call.writes] = call.id

    def keys(self):
        return list(self.versions)

    @contextlib.contextmanager
    def block(self, key, arrays, send, top, reduce):
        arrays = tuple(np.asarray(a) for a in arrays)
        if len({len(a) for a in arrays}) != 1:
            raise ValueError("the arrays of a sharded model must have the same number of rows")
        send(ShardKeep, key=key, arrays=arrays)
        try:
            yield ShardedModel(key, self.versions, send, top, reduce)
        finally:
            self.versions.pop(key, None)
            send(ShardDrop, key=key)


class HeldModel:
    """A model small enough for the driver (``Engine.model`` within ``model-bytes``): one shard, the whole of
    it, held here. A step's ``Scatter`` fields are combined whole and the shard function runs on the one
    shard (``lo`` = 0) where they are finished (``at_root``: the root partition), so a fit writes its shard
    functions once, has the same bits on either model, and the driver receives the new shard and the small
    fields, never a large combined field (the pair statistics of a truncated E-step)."""

    def __init__(self, arrays, reduce):
        self.shard = tuple(arrays)
        self._reduce = reduce

    def ref(self, field=0):
        """For a call's parameters: the field itself."""
        return self.shard[field]

    def local(self, field=0):
        """The field where it is on the driver (None on a ``ShardedModel``)."""
        return self.shard[field]

    def step(self, step, params, combine, at_shard, small):
        """``Engine.reduce(step, params, combine, scatter=ReduceScatter(model, at_shard, small))`` on the one
        shard: the other fields, then ``at_shard``'s small ones."""
        whole = tuple(c.inner if isinstance(c, combines.Scatter) else c for c in combine)
        spread = tuple(i for i, c in enumerate(combine) if isinstance(c, combines.Scatter))
        shard, fields = self._reduce(
            step, params, whole, at_root=functools.partial(held_shard_step, at_shard, spread, self.shard)
        )
        self.shard = self.shard if shard is None else shard
        return fields

    def apply(self, fn, params=None, small=()):
        """``fn(shard, params, 0)`` -> (new shard, small fields): the small fields."""
        self.shard, small_fields = fn(self.shard, params, 0)
        return tuple(small_fields)

    def gather(self, field=0):
        return self.shard[field]


def held_shard_step(at_shard, spread, shard, fields, params):
    """``HeldModel.step`` where the combined fields are finished: ``at_shard`` on the whole ``shard`` with the
    fields at the indices ``spread``; returns (the new shard, None where ``at_shard`` left it as it was: it
    need not travel back; the other fields then the small ones)."""
    new, small = at_shard(tuple(fields[i] for i in spread), shard, params, 0)
    new = None if new is shard else tuple(new)
    return new, tuple(f for i, f in enumerate(fields) if i not in spread) + tuple(small)


class ShardedModel:
    """A model that lives on the workers, split by rows over the partitions (``Engine.sharded``)."""

    def __init__(self, key, versions, send, top, reduce):
        self.key = key
        self._versions = versions
        self._send = send
        self._top = top
        self._reduce = reduce

    def ref(self, field=0):
        """For a call's parameters: the whole field as it is now, assembled on every partition from the
        others' shards (straight from them, never through the driver; once per version)."""
        return ShardRef(self.key, self._versions[self.key], field)

    def apply(self, fn, params=None, small=()):
        """``fn(shard, params, lo)`` -> (new shard, small fields) where each shard lives (the next step of a
        sharded M-step); the small fields combined by ``small`` come back."""
        return self._send(ShardApply, key=self.key, fn=fn, fn_params=params, small=tuple(small), top=self._top)

    def gather(self, field=0):
        """The whole field on the driver (the end of a fit)."""
        return self._send(Gather, ref=self.ref(field))

    def local(self, field=0):
        return None

    def step(self, step, params, combine, at_shard, small):
        """``Engine.reduce(step, params, combine, scatter=ReduceScatter(self, at_shard, small))``: the fields
        the shards' rows need reduce-scattered to them, ``at_shard`` run where each shard lives."""
        return self._reduce(step, params, combine, scatter=ReduceScatter(self, at_shard, tuple(small)))


def restore_shards(part: RebuiltPartition, models):
    """The recovery hook of the sharded ``models`` (their keys): the rebuilt partition ``part``
    (``recovery.Rebuilding``) takes its shard of each from the first of its buddies that kept a copy, then
    sends its copies to its buddies again, and the partitions whose copies the lost one kept send theirs.
    Returns None, or why a shard cannot be restored (the fit then ends in one line)."""
    if not models:
        return None
    for key in models:
        kept = part.from_buddies(ShardBackupGet(key, part.pid))
        if kept is None:
            return (
                f"its shard of the sharded model {key!r} and every copy of it were lost (its worker and those "
                f"of the {BACKUP_COPIES} partitions after it)"
            )
        logger.info("restoring partition %d's shard of %r from its buddy's copy", part.pid, key)
        part.call(ShardRestore(key, kept))
    part.tell_keepers(ShardRebackup)
    return None
