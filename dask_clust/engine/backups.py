"""A partition's side of ``Engine.state(backup=...)``: after each step, the fields of a state the model
cannot rebuild are copied to the partitions after it (its buddies); a rebuilt partition restores them from
the first buddy that has them, as the last call before the lost one left them, or, when every copy was lost
too, replays the state's build and every step since (``replay``: the driver keeps those steps)."""

import weakref

import numpy as np

from .mailbox import gather_all, keep_newest

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
        self._part = weakref.proxy(part)  # no cycle: the partition's rows go as soon as its host drops it
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
        await gather_all([self._part.tell(k, "backups.put", call.id, arrays) for k in keepers])

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
