"""The messages the driver sends to the partitions: one class per kind of call, with typed fields. Each says
what goes up the tree of partitions (``tree``: one combine per field) and what of the combined partial
reaches the driver (``finished``); what a partition does with each is its handler table
(``Partition.HANDLERS``). ``Halo`` and ``ReduceScatter`` are the records a step's call carries for the two
partition-to-partition exchanges, and ``ShardRef`` names a sharded model's field in a call's parameters.
"""

import dataclasses
from dataclasses import dataclass

from . import combine as combines


@dataclass(frozen=True)
class Halo:
    """``Engine.reduce(..., halo=Halo(key, field))``: before the step runs, every chunk's ``halo[field]``
    gets the values of state ``field`` of the rows gather plan ``key`` names, as the previous call left them.
    ``indexed``: give it as (the partition's received values, where each named row sits among them), so no
    chunk copies them (large per-row state)."""

    key: str
    field: str
    indexed: bool = False


@dataclass(frozen=True)
class ReduceScatter:
    """``Engine.reduce(..., scatter=ReduceScatter(model, at_shard, small))``: the fields whose combine is
    ``combine.Scatter`` are reduce-scattered by rows of the sharded ``model`` (a ``ShardedModel``; in a call,
    its key), ``at_shard(fields, shard, params, lo) -> (new shard, small fields)`` runs where each shard
    lives, and the small fields go up the tree combined by ``small`` (one combine each)."""

    model: object
    at_shard: object
    small: tuple = ()


@dataclass(frozen=True)
class ShardRef:
    """In a call's parameters (itself, or an element of a params tuple): field ``field`` of sharded model
    ``key`` as version ``version`` left it, assembled from every partition's shard before any step runs."""

    key: str
    version: int
    field: int = 0


def shard_refs(params):
    """The ShardRefs of a call's parameters."""
    if isinstance(params, ShardRef):
        return [params]
    if isinstance(params, tuple):
        return [p for p in params if isinstance(p, ShardRef)]
    return []


def substitute(params, values):
    """``params`` with every ShardRef replaced by its value in ``values``."""
    if isinstance(params, ShardRef):
        return values[params]
    items = [values.get(p, p) if isinstance(p, ShardRef) else p for p in params]
    return params._make(items) if hasattr(params, "_make") else tuple(items)  # a step's NamedTuple stays one


@dataclass(frozen=True)
class Call:
    """One round trip, numbered by the engine (a repeated call keeps its id; a partition answers it from
    memory). Nothing goes up the tree and nothing reaches the driver unless a kind says otherwise; only a
    ``Step`` has a halo, a reduce-scatter or backups."""

    id: int
    halo = None  # not fields here: a Step's fields
    scatter = None
    backup = ()

    @property
    def tree(self):
        return ()

    def finished(self, acc):
        return None

    def refs(self):
        """The ShardRefs its parameters read (resolved on every partition before it runs)."""
        return []

    @property
    def writes(self):
        """The sharded model a call writes a new version of (its id), or None."""
        return None


@dataclass(frozen=True)
class Step(Call):
    """``step(chunk, params)`` on every chunk, fields combined by ``combine`` on the fit's fixed-point grid
    ``top``, then ``at_root(fields, params)`` where the result is finished; with a ``halo`` first, with a
    ``scatter`` after (``ReduceScatter``, its model given by key); ``backup``: ((state key, fields), ...)
    each partition copies to its buddies after the step."""

    step: object
    params: object = None
    combine: tuple = None
    top: int = None
    at_root: object = None
    halo: Halo = None
    backup: tuple = ()
    scatter: ReduceScatter = None

    @property
    def scattered(self):
        """Indices of the fields combined by a reduce-scatter."""
        if self.scatter is None:
            return ()
        return tuple(i for i, c in enumerate(self.combine) if isinstance(c, combines.Scatter))

    @property
    def tree(self):
        """The fields not scattered, then at_shard's small fields."""
        if self.scatter is None:
            return self.combine
        return tuple(c for i, c in enumerate(self.combine) if i not in self.scattered) + tuple(self.scatter.small)

    def finished(self, acc):
        fields = combines.finish(self.tree, acc, self.top)
        return fields if self.at_root is None else self.at_root(fields, self.params)

    def refs(self):
        return shard_refs(self.params)

    @property
    def writes(self):
        return None if self.scatter is None else self.scatter.model


@dataclass(frozen=True)
class Build(Call):
    """``step(chunk, params)`` on every chunk for its effect on the chunk's state: a state's builder, a
    replay of its steps, or a drop."""

    step: object
    params: object = None

    def refs(self):
        return shard_refs(self.params)


@dataclass(frozen=True)
class Plan(Call):
    """Gather plan ``key``: ``need_step(chunk, params)`` names the global rows each chunk reads; ``starts``:
    the input's chunk boundaries, by which every partition finds the rows' owners (``Engine.halo``)."""

    need_step: object
    key: str
    params: object
    starts: object

    def refs(self):
        return [self.params] if isinstance(self.params, ShardRef) else []


@dataclass(frozen=True)
class ShardKeep(Call):
    """Keep this partition's rows of the arrays as model ``key``'s version ``id`` (``Engine.sharded``)."""

    key: str
    arrays: tuple

    @property
    def writes(self):
        return self.key


@dataclass(frozen=True)
class ShardDrop(Call):
    """Drop model ``key``: its shards, the copies kept for others and the assembled fields."""

    key: str


@dataclass(frozen=True)
class ShardApply(Call):
    """``fn(shard, fn_params, lo) -> (new shard, small fields)`` where each shard of model ``key`` lives; the
    small fields come back combined by ``small`` (``ShardedModel.apply``)."""

    key: str
    fn: object
    fn_params: object
    small: tuple
    top: int = None

    @property
    def writes(self):
        return self.key

    @property
    def tree(self):
        return self.small

    def finished(self, acc):
        return combines.finish(self.small, acc, self.top)


@dataclass(frozen=True)
class Gather(Call):
    """The field ``ref`` names, every partition's rows of it, to the driver (``ShardedModel.gather``)."""

    ref: ShardRef

    @property
    def tree(self):
        return (combines.Rows(),)

    def finished(self, acc):
        return combines.finish(self.tree, acc, None)[0]


def resolved_params(call, values):
    """``call`` with the ShardRefs of its parameters replaced by ``values`` ({ref: the whole field})."""
    return dataclasses.replace(call, params=substitute(call.params, values))
