"""A partition's side of ``Engine.halo``: a fixed gather plan, then, per call with a ``Halo``, the previous
values of the rows each chunk reads pushed partition to partition before any step runs (Jacobi: no step sees
another's update of the same call). The values never pass through the driver; a rebuilt partition is sent
the plan again. ``HaloPlans`` is the driver's side: the plans of the open ``Engine.halo`` blocks."""

import contextlib
import weakref
from typing import NamedTuple

import numpy as np

from .calls import Build, Plan
from .mailbox import Answer, PartitionView, gather_all, peer_call


def pop_halo(chunk, params):
    """Drop a gather plan's rows and the values it filled in (the end of ``Engine.halo``)."""
    key, fields = params
    chunk.state.pop(("halo", key), None)
    chunk.state.pop(("halo-pos", key), None)
    for field in fields:
        chunk.halo.pop(field, None)


class HaloExchange:
    """The plans a partition's chunks read by, and what it sends the others under each."""

    def __init__(self, part):
        self._part: PartitionView = weakref.proxy(
            part
        )  # no cycle: the partition's rows go as soon as its host drops it
        self._sources = {}  # plan key -> the partitions holding rows this partition's chunks read
        self._sends = {}  # plan key -> (plan call id, {partition: the rows it reads from here})
        self._sent = Answer()  # the values sent for the newest call: the same when it is repeated

    # -- the plan (a ``Plan`` call)

    def needs(self, call, owner):
        """Run the plan's step: the global rows each chunk reads (any order, repeats allowed), kept per chunk;
        returns {owner partition: rows this partition reads there}."""
        part, key = self._part, call.key
        for c, ids in zip(part.chunks, part.each(call.need_step, call.params)):
            c.state[("halo", key)] = np.asarray(ids, dtype=np.int64)
        rows = np.unique(np.concatenate([c.state[("halo", key)] for c in part.chunks]))
        who = owner(rows)
        by_owner = {int(q): rows[who == q] for q in np.unique(who)}
        self._sources[key] = set(by_owner)
        return by_owner

    def request(self, plan_id, key, requester, rows):
        """Partition ``requester`` reads ``rows`` of this partition under plan ``key``."""
        if self._sends.get(key, (None,))[0] != plan_id:
            self._sends[key] = (plan_id, {})
        self._sends[key][1][int(requester)] = rows

    async def plan(self, call, peers):
        """Every partition tells each owner of rows its chunks read which rows they are."""
        part = self._part
        starts = np.array([min(p[2]) for p in peers])  # the first chunk of each partition, ascending

        def owner(rows):
            chunk = np.searchsorted(call.starts, rows, side="right") - 1
            return np.searchsorted(starts, chunk, side="right") - 1

        by_owner = await part.offload(self.needs, call, owner)
        sends = []
        for q, rows in by_owner.items():
            if q == part.pid:
                self.request(call.id, call.key, q, rows)
            else:
                sends.append(part.tell(peers[q], HaloRequest(call.id, call.key, part.pid, rows)))
        await gather_all(sends)

    # -- a call with a halo

    def _own_values(self, field, rows, out=None):
        """The state ``field`` of this partition's rows ``rows`` (ascending), into ``out`` when given."""
        vals = []
        for c in self._part.chunks:
            lo, hi = np.searchsorted(rows, [c.start, c.stop])
            if hi > lo:
                vals.append(c.state[field][rows[lo:hi] - c.start])
        return np.concatenate(vals, out=out)

    def values(self, call):
        """{partition: (rows, values)} this partition sends for ``call``: the field's values before the call's
        step runs anywhere. Its own part's values are None: they are read straight into the assembled halo
        (``fill``, before this partition's step runs)."""
        pid = self._part.pid

        def compute():
            sends = self._sends.get(call.halo.key, (None, {}))[1]
            # a copy of the others' values: steps change the state
            return {
                q: (rows, None if q == pid else self._own_values(call.halo.field, rows)) for q, rows in sends.items()
            }

        return self._sent.of(call.id, compute)

    async def put(self, call_id, key, sender, rows, values):
        self._part.mail.put((call_id, "halo", key), sender, (rows, values))

    async def exchange(self, call, peers):
        """Send this partition's values to every partition reading them; then, unless this call was answered
        before, fill the chunks' halo from what the others sent."""
        part, key = self._part, call.halo.key
        part.mail.advance(call.id)
        sent = self.values(call)
        pushes = [part.tell(peers[q], HaloPut(call.id, key, part.pid, *rv)) for q, rv in sent.items() if q != part.pid]
        if part.pid in sent:
            await self.put(call.id, key, part.pid, *sent[part.pid])
        await gather_all(pushes)
        if part.answered(call):  # a repeated call this partition has answered: it only resends
            return
        self.fill(call, await part.mail.collect((call.id, "halo", key), self._sources[key]))

    def fill(self, call, received):
        """Every chunk's ``halo[field]``: the values of the rows it reads, in the order its plan step named them;
        with an indexed halo, the partition's received values and where each named row sits among them, so no
        chunk copies them. One array of the rows read: the largest per-row state (SLK's z) is held once more,
        not three times."""
        chunks, key, field = self._part.chunks, call.halo.key, call.halo.field
        parts = [received[q] for q in sorted(received)]  # partitions hold ascending row ranges
        for c in chunks:  # the previous call's values go before the new ones are assembled
            c.halo.pop(field, None)
        rows = np.concatenate([p[0] for p in parts] + [np.empty(0, np.int64)])  # none: no chunk reads a row
        like = chunks[0].state[field]
        values = np.empty((len(rows),) + like.shape[1:], like.dtype)
        at = 0
        for part_rows, part_values in parts:
            piece = values[at : at + len(part_rows)]
            if part_values is None:
                self._own_values(field, part_rows, out=piece)
            else:
                piece[...] = part_values
            at += len(part_rows)
        for c in chunks:
            # the plan fixes the rows received, so where each read row sits among them is found once
            pos = c.state.get(("halo-pos", key))
            if pos is None or pos[0] is not c.state[("halo", key)] or pos[1] != len(rows):
                pos = c.state[("halo", key)], len(rows), np.searchsorted(rows, c.state[("halo", key)])
                c.state[("halo-pos", key)] = pos
            c.halo[field] = (values, pos[2]) if call.halo.indexed else values[pos[2]]


@peer_call(HaloExchange, HaloExchange.request)
class HaloRequest(NamedTuple):
    plan_id: int
    key: object
    requester: int
    rows: object


@peer_call(HaloExchange, HaloExchange.put)
class HaloPut(NamedTuple):
    call_id: int
    key: object
    sender: int
    rows: object
    values: object


class HaloPlans:
    """The driver's side of ``Engine.halo``: the plans of the open blocks, those not sent yet (a plan is made
    when the first call uses it, after the steps before it made the state its ``need_step`` may read; again
    after a ``rerun`` restart), and the state fields their calls filled in (dropped with the plan)."""

    def __init__(self, starts):
        self._starts = starts
        self._plans = {}  # key -> (need_step, params)
        self._unsent = set()
        self._fields = {}

    @contextlib.contextmanager
    def block(self, key, need_step, params, send):
        self._plans[key] = (need_step, params)
        self._fields[key] = set()
        self._unsent.add(key)
        try:
            yield
            send(Build, step=pop_halo, params=(key, tuple(self._fields[key])))
        finally:
            self._plans.pop(key, None)
            self._fields.pop(key, None)
            self._unsent.discard(key)

    def used(self, halo):
        """A call with ``halo`` is sent: the fields of the plan's state it fills in."""
        self._fields[halo.key].add(halo.field)

    def unsent(self, halo):
        """The fields of the ``Plan`` call to send before a call with ``halo`` (once per plan), or None."""
        if halo is None or halo.key not in self._unsent:
            return None
        self._unsent.discard(halo.key)
        return self.fields(halo.key)

    def fields(self, key):
        need_step, params = self._plans[key]
        return dict(need_step=need_step, key=key, params=params, starts=self._starts)

    def sent(self, ids):
        """The plans sent so far, as calls numbered from ``ids``: for a partition rebuilt before a call is
        repeated (the others go when used)."""
        return [Plan(next(ids), **self.fields(key)) for key in self._plans if key not in self._unsent]

    def restarted(self):
        """A ``rerun`` phase restarts: every plan is made again when next used."""
        self._unsent.update(self._plans)
