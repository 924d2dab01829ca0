"""A partition's side of ``Engine.state(backup=...)``: after each step, the fields of a state the model
cannot rebuild are copied to the partitions after it (its buddies); a rebuilt partition restores them from
the first buddy that has them, as the last call before the lost one left them, or, when every copy was lost
too, replays the state's build and every step since (``replay``). ``DeclaredStates`` is the driver's side:
the states an algorithm declared, and the steps it keeps to replay them."""

import contextlib
import copy
import logging
import weakref
from typing import NamedTuple

import numpy as np

from . import config
from .calls import Build, Step
from .chunk import pop_state
from .mailbox import PartitionView, RebuiltPartition, gather_all, keep_newest, peer_call

logger = logging.getLogger("dask_clust")

# copies of a partition's backed-up state, on the partitions after it: a state is lost only with
# BACKUP_COPIES + 1 consecutive partitions, so any two workers lost at once (or one lost while a rebuilt
# partition has not yet received its copies again) leave a copy
BACKUP_COPIES = 2


def buddies(peers, pid):
    """The peers (address, partition key, chunk ids) that keep partition ``pid``'s backups, nearest first."""
    n = len(peers)
    return [peers[(pid + j) % n] for j in range(1, min(BACKUP_COPIES, n - 1) + 1)]


def replay(chunk, steps):
    """A state as a list of calls left it: each (builder or step, params) of ``steps`` on this chunk in order,
    their partials dropped (a state lost with every copy of it)."""
    for step, params in steps:
        step(chunk, params)


class Backups:
    """The copies a partition keeps of its buddies' states."""

    def __init__(self, part):
        self._part: PartitionView = weakref.proxy(
            part
        )  # no cycle: the partition's rows go as soon as its host drops it
        self._kept = {}  # (state key, chunk index) -> [(call id, {field: array})], the two newest

    def of(self, call):
        """{(state key, chunk index): {field: array}} of the state ``call.backup`` names, as this call left it."""
        return {
            (key, c.index): {f: c.state[key][f] for f in fields}
            for key, fields in call.backup
            for c in self._part.chunks
            if key in c.state
        }

    async def copy(self, call, keepers):
        """This call's backed-up state, to the buddies."""
        arrays = self.of(call)
        await gather_all([self._part.tell(k, BackupPut(call.id, arrays)) for k in keepers])

    def put(self, call_id, arrays):
        """Keep another partition's state as ``call_id`` left it (the two newest calls)."""
        for where, fields in arrays.items():
            self._kept[where] = keep_newest(self._kept.get(where, []), (call_id, fields))

    def get(self, key, chunk_ids, before):
        """{chunk index: {field: array}} as the newest call before ``before`` left them, or None when a
        chunk has none (its state was never backed up: its builder makes it again)."""
        out = {}
        for c in chunk_ids:
            older = [b for b in self._kept.get((key, c), []) if b[0] < before]
            if not older:
                return None
            out[c] = older[-1][1]
        return out

    def restore(self, key, arrays):
        for c in self._part.chunks:
            c.state[key] = {f: np.array(a, copy=True) for f, a in arrays[c.index].items()}


@peer_call(Backups, Backups.put)
class BackupPut(NamedTuple):
    call_id: int
    arrays: dict


@peer_call(Backups, Backups.get)
class BackupGet(NamedTuple):
    key: object
    chunk_ids: list
    before: int


@peer_call(Backups, Backups.restore)
class BackupRestore(NamedTuple):
    key: object
    arrays: dict


def _nbytes(params):
    """The bytes of the arrays in a call's parameters (nested tuples, lists and dicts)."""
    if isinstance(params, np.ndarray):
        return params.nbytes
    if isinstance(params, (tuple, list)):
        return sum(map(_nbytes, params))
    if isinstance(params, dict):
        return sum(map(_nbytes, params.values()))
    return 0


class DeclaredStates:
    """The driver's side of ``Engine.state``: each declared state's builder, model and backed-up fields, and
    for a backed-up state on a cluster the log that replays it (its build and every step since) while the
    logs stay under ``replay-bytes``."""

    def __init__(self, keeps_replays):
        self._keeps_replays = keeps_replays  # on a cluster: in-process, no worker is ever lost
        self._states = {}  # key -> (builder, model, backup fields): replayed on a rebuilt partition
        self._stepped = set()  # states with backup fields that a step has run with since they were built
        self._replay = {}  # such a state -> its build and steps since, or None (past replay-bytes)
        self._replayed = {}  # ... and the bytes of their arrays

    @contextlib.contextmanager
    def block(self, key, builder, model, build, backup, send):
        self._states[key] = (builder, model, tuple(backup))
        self._stepped.discard(key)
        params = model() if build else None
        if backup and self._keeps_replays:
            self._replay[key] = [(builder, copy.deepcopy(params))] if build else []
            self._replayed[key] = _nbytes(params)
        try:
            if build:
                send(Build, step=builder, params=params)
            yield
        except BaseException:
            self._drop(key)
            raise
        self._drop(key)
        send(Build, step=pop_state, params=key)

    def _drop(self, key):
        for kept in (self._states, self._replay, self._replayed):
            kept.pop(key, None)

    def backup(self):
        """A step's ``backup``: ((state key, fields), ...) every partition copies to its buddies after it."""
        return tuple((key, fields) for key, (_, _, fields) in self._states.items() if fields)

    def builders(self):
        """(key, builder, model, backup fields, replay) per declared state, for a rebuilt partition; the fields
        only once a step has run with the state (before that, its builder makes it exactly as it was);
        replay: the (step, params) that make it as the last step left it, or None."""
        return [
            (key, builder, model(), fields if key in self._stepped else (), self._replay.get(key))
            for key, (builder, model, fields) in self._states.items()
        ]

    def ran(self, call):
        """``call`` ran on every partition: a step joins the replay of every backed-up state it ran with, while
        the replays stay under ``replay-bytes`` and the call can run again on its own (no halo, scatter or
        sharded model: those depend on other partitions' or the model's past versions)."""
        if not isinstance(call, Step):
            return
        self._stepped.update(key for key, _ in call.backup)
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


def restore_state(part: RebuiltPartition, order, key, builder, params, fields, steps, call_id):
    """The recovery hook of a declared state (``DeclaredStates.builders`` gives the rest): on the rebuilt
    partition ``part`` (``recovery.Rebuilding``), its backed-up ``fields`` from the first buddy that kept
    them as the last call before ``call_id`` left them; else, where a step has changed them since the build
    (the builder would make another state), its build and every step since replayed; else the builder.
    Returns None, or why the state cannot be made as it was (the fit then ends in one line)."""
    kept = part.from_buddies(BackupGet(key, part.ids, call_id)) if fields else None
    if kept is not None:
        logger.info("restoring state %r of partition %d from its buddy's copy", key, part.pid)
        part.call(BackupRestore(key, kept))
        return None
    if fields:
        if steps is None:
            return (
                f"its state {key!r} and every copy of it were lost (its worker and those of the "
                f"{BACKUP_COPIES} partitions after it), and its steps are not kept to replay (replay-bytes); "
                "the fit cannot continue to the same model: fit again, or resume from a checkpoint"
            )
        logger.warning(
            "state %r of partition %d and every copy of it were lost: replaying its %d steps", key, part.pid, len(steps)
        )
        builder, params = replay, steps
    part.run(Build(-1 - order, builder, params))
    return None
