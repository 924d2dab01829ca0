"""Partition to partition: the calls one partition makes on another (straight to its worker over
distributed's comms, no scheduler hop), typed (``peer_call``); the box a partition collects a call's
messages in, and the memory of its last answer, by which a call repeated after a lost worker changes no
state twice."""

import asyncio
from typing import Protocol

# the message types a partition answers: NamedTuples registered by ``peer_call``
PEER_CALLS = set()


def peer_call(feature, method):
    """Class decorator of a NamedTuple: a call on the receiving partition's part of class ``feature`` (the
    ``Partition`` itself, or one of its features: ``Partition.feature``) answered by ``method``, a function of
    that class, with the message's fields as its arguments. The receiver (``host.PartitionHost.call``)
    answers registered types only; what travels is the message, not a method's name."""

    def register(cls):
        cls.feature, cls.method = feature, method
        PEER_CALLS.add(cls)
        return cls

    return register


class PartitionView(Protocol):
    """What a partition's features (its halo, shards and backups: ``Partition.feature``) may use of it."""

    pid: int  # its number among the fit's partitions
    n_parts: int
    chunks: list  # its ``Chunk``s, in row order
    mail: "Mailbox"  # the other partitions' messages to it

    def each(self, step, params):
        """``step(chunk, params)`` on every chunk; the results in chunk order."""

    def tell(self, peer, message):
        """``message`` (a ``peer_call`` type) to the partition ``peer``: an awaitable of its answer."""

    async def offload(self, fn, *args):
        """``fn(*args)`` off the worker's event loop."""

    def answered(self, call):
        """Whether this partition has answered ``call`` already (a repetition after a lost worker)."""


class RebuiltPartition(Protocol):
    """What a recovery hook (``DeclaredStates``' ``restore_state``, ``sharded.restore_shards``) may use of the
    partition it rebuilds, from the driver (``recovery.Rebuilding``)."""

    pid: int
    ids: list  # its chunk indices

    def from_buddies(self, message):
        """The first non-None answer of its buddies to ``message``, or None."""

    def call(self, message):
        """``message`` on the rebuilt partition: its answer."""

    def run(self, call):
        """A driver call (a build, a replay) on the rebuilt partition alone."""

    def tell_keepers(self, message):
        """``message(peers)`` on it and the partitions whose copies it keeps."""


async def remote_call(rpc, key, message):
    """``message`` (a ``peer_call`` type) on the partition ``key`` behind ``rpc``: its answer. Its type goes
    by reference and each field on its own, as distributed serialises a call's arguments (an array in frames
    of its own, not inside one pickle of the message)."""
    from distributed.protocol import to_serialize

    msg = await rpc.dask_clust_call(
        key=key, kind=to_serialize(type(message)), fields=[to_serialize(f) for f in message]
    )
    if msg["status"] != "OK":
        raise msg["exception"]
    return msg["result"]


async def gather_all(awaitables):
    """``asyncio.gather`` that needs no event loop when there is nothing to wait for (an in-process
    partition has no peers)."""
    return await asyncio.gather(*awaitables) if awaitables else []


def drive(coroutine):
    """The result of a coroutine that never suspends (an in-process partition's call: it has no peer to
    wait for), without an event loop: a notebook's running loop cannot run another."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError("an in-process partition's call waited for a message from another partition")


def keep_newest(entries, *new, n=2):
    """``entries`` ((version, ...) tuples) with ``new`` added, a new one replacing an entry of its version,
    the ``n`` newest versions kept, oldest first."""
    kept = {e[0]: e for e in entries}
    kept.update({e[0]: e for e in new})
    return sorted(kept.values(), key=lambda e: e[0])[-n:]


class Answer:
    """The answer to the newest call that reached here, by call id: a repeated call gets it again without
    running anything."""

    def __init__(self):
        self.id, self.value = None, None

    def has(self, call_id):
        return self.id == call_id

    def of(self, call_id, compute):
        if self.id != call_id:
            self.value, self.id = compute(), call_id
        return self.value


class Mailbox:
    """A partition's messages from the others, by (call id, what): a call's halo values or its
    reduce-scatter pieces. A box stays until a newer call: a first attempt still waiting after a lost
    partition and its repetition both fill from it."""

    def __init__(self):
        self._mail = {}
        self._event = None
        self.newest = -1  # the newest call id seen: waiters of older calls give up

    def put(self, where, sender, message):
        self._mail.setdefault(where, {})[int(sender)] = message
        self._wake()

    def _wake(self):
        if self._event is None:
            self._event = asyncio.Event()
        self._event.set()

    def advance(self, call_id):
        """A new call: earlier calls' mail is stale, and their waiters give up."""
        if call_id > self.newest:
            self.newest = call_id
            for old in [m for m in self._mail if m[0] < call_id]:
                del self._mail[old]
            self._wake()

    async def collect(self, where, senders):
        """The mail of ``where`` once every partition in ``senders`` has sent its part."""
        box = self._mail.setdefault(where, {})
        while not set(senders) <= set(box):
            if self.newest > where[0]:
                raise RuntimeError(f"call {where[0]} was superseded by call {self.newest}")
            self._event.clear()
            await self._event.wait()
        return box
