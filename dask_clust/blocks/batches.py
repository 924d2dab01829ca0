"""The batches of the stochastic methods: each step's b rows drawn uniformly with replacement (Sculley's
mini-batches), keyed by step, so how they travel never changes the model; on a streamed input, a whole
window of steps' draws made in one pass and held by the workers until used.

Windows. Steps are grouped into windows of W = ⌈N / b⌉ steps: about one draw per row. A window's M = W·b
draws are made in three parts: how many fall in each stratum of ``STRATUM_ROWS`` rows (one multinomial
draw on the driver), where each lands within its stratum (uniform, by a counter-based hash of its
position), and which (step, slot) it serves (a keyed pseudo-random permutation of the positions,
``_random.permute``). The draws are then i.i.d. uniform over the rows, and any range of rows finds its own
without making the others: a chunk walks only its strata (``kernels/sampling.py: chunk_draws``). Strata, not
chunks, cut the rows, so the batches depend on N, b and the seed alone, never on the storage, the chunking
or the workers.

Gathers. A batch's arithmetic costs far less than a round trip, so one gather brings several steps' rows
(``GATHER_BYTES``, at most ``MOST_STEPS``). In memory a gather is an ``engine.take`` (no pass). On a streamed
input a take would read every stored block (a uniform batch touches them all), so there the first call of a
window has each chunk keep its draws for the window's steps (``hold_draws``: labels, rows and weights, in
the workers' local files, ``AlgorithmSpec.holds_draws``) and every gather reads those: one pass per window,
the first carrying the engine's first pass and the seeding sample. A worker lost meanwhile has its chunks'
draws made again from the store. Where the state may not live in files (``state-files`` = False), streamed
gathers fall back to takes, each a pass, as large as ``STREAMED_GATHER_BYTES`` and
``STREAMED_GATHER_SHARE`` allow.

The driver holds per window the strata's counts (8·⌈N / STRATUM_ROWS⌉ bytes) and per gather its rows; the
workers about a copy of their rows per window, on disk.
"""

import contextlib
from typing import NamedTuple

import numpy as np

from .._random import stream
from ..engine.combine import Rows
from ..kernels.assign import densified, is_csr
from ..kernels.sampling import chunk_draws, drawn_rows

# bytes of float32 rows one gather brings at most, and the most steps it serves: one step of SBE's defaults is
# 4.3 MB at 108 features, so an 8 MB gather brought one step a round trip (153 trips of ~11 ms for 150 steps
# of ~25 ms on the image patches; 13 trips: 7.2 -> 5.2 s a fit)
GATHER_BYTES = 64 << 20
MOST_STEPS = 64
# a take from a streamed input is a pass over its store (a uniform batch touches every stored block), so
# there one gather brings as many steps as the least of these holds, however many that is: bytes the driver
# holds (O(this) whatever N), and a share of the smallest worker's memory, since the gathered rows meet at the
# root partition's worker on their way (a quarter of a 700 MiB worker's limit took it past its limit, next to
# the chunks it keeps up to ``streaming.KEEP_FRACTION``)
STREAMED_GATHER_BYTES = 256 << 20
STREAMED_GATHER_SHARE = 0.05
# rows of a stratum: the grid the draws are laid on; the driver holds one count per stratum and window
STRATUM_ROWS = 1 << 16
HELD = "held-draws"


def steps_per_gather(engine, rows_per_step, last, streamed=None):
    """Steps one gather serves, at most ``last`` (the steps left): GATHER_BYTES of rows and at most
    MOST_STEPS; where a gather is a pass over a streamed store (``streamed``, by default whether the engine
    streams), STREAMED_GATHER_BYTES or STREAMED_GATHER_SHARE of the smallest worker's memory, whichever is
    less; at least 1."""
    # a row as float32, or CSR rows' average stored bytes where that is less (a batch of documents stays CSR)
    step_bytes = rows_per_step * min(engine.n_features * 4, engine.row_bytes)
    if engine.streaming if streamed is None else streamed:
        memory = min(m for _, m in engine.partitions())
        budget = min(STREAMED_GATHER_BYTES, int(STREAMED_GATHER_SHARE * memory))
        return int(np.clip(budget // step_bytes, 1, max(last, 1)))
    return int(np.clip(GATHER_BYTES // step_bytes, 1, min(MOST_STEPS, max(last, 1))))


class Window(NamedTuple):
    """A window of steps' draws: its first step, its steps, rows per step, the rows drawn from, the keys of
    its permutation and of its draws within strata, and its draws before each stratum (G + 1,)."""

    first: int
    steps: int
    b: int
    n_rows: int
    key: int
    salt: int
    cum: np.ndarray


def window_at(entropy, tag, step, n_rows, b):
    """The window holding ``step`` of the method ``tag``: its strata's counts drawn from its own stream."""
    steps = -(-n_rows // b)
    index = step // steps
    rng = stream(entropy, tag, "window", index)
    key, salt = (int(v) for v in rng.integers(2**63, size=2))
    strata = -(-n_rows // STRATUM_ROWS)
    sizes = np.full(strata, float(STRATUM_ROWS))
    sizes[-1] = n_rows - (strata - 1) * STRATUM_ROWS
    counts = rng.multinomial(steps * b, sizes / n_rows)
    cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Window(index * steps, steps, b, n_rows, key, salt, cum)


def batch_ids(window, first, last):
    """The rows of the window's steps [first, last), (last - first, b)."""
    labels = np.arange((first - window.first) * window.b, (last - window.first) * window.b, dtype=np.int64)
    out = np.empty_like(labels)
    drawn_rows(labels, window.key, window.salt, window.cum, STRATUM_ROWS, window.n_rows, out)
    return out.reshape(last - first, window.b)


class Held(NamedTuple):
    """What a chunk holds: the draws of ``window``'s steps [first, last)."""

    window: object
    first: int
    last: int


def hold_draws(chunk, params: Held):
    """Builder of the held draws: the chunk's draws of the window's steps [first, last), by label (ascending),
    with their rows and weights."""
    window, first, last = params.window, params.first, params.last
    cum = window.cum
    g0, g1 = chunk.start // STRATUM_ROWS, (chunk.stop - 1) // STRATUM_ROWS + 1
    rows = np.empty(cum[g1] - cum[g0], np.int64)
    labels = np.empty_like(rows)
    lo, hi = (first - window.first) * window.b, (last - window.first) * window.b
    c = chunk_draws(
        window.key, window.salt, cum, STRATUM_ROWS, window.n_rows, chunk.start, chunk.stop, lo, hi, rows, labels
    )
    order = np.argsort(labels[:c])
    rows = rows[order]
    chunk.state[HELD] = {"labels": labels[order], "x": chunk.x[rows], "w": chunk.w[rows]}


class HoldAndTake(NamedTuple):
    """``_hold_and_take``'s parameters: the draws to hold, and the row ids (sorted) to take."""

    held: Held
    ids: np.ndarray


class Taken(NamedTuple):
    """Rows and their weights."""

    rows: object
    w: np.ndarray


class HeldRows(NamedTuple):
    """Held draws: each one's place among the steps' draws (its label less the first), its row and weight."""

    at: np.ndarray
    rows: object
    w: np.ndarray


def _hold_and_take(chunk, params: HoldAndTake) -> Taken:
    """The first call of a window: the chunk's draws held, and the rows of ``ids`` (sorted) it holds."""
    hold_draws(chunk, params.held)
    lo, hi = np.searchsorted(params.ids, [chunk.start, chunk.stop])
    rows = params.ids[lo:hi] - chunk.start
    return Taken(chunk.x[rows], chunk.w[rows])


class Labels(NamedTuple):
    """``_held_rows``' parameters: the labels [lo, hi) to read."""

    lo: int
    hi: int


def _held_rows(chunk, params: Labels) -> HeldRows:
    """The chunk's held draws with labels in [lo, hi): (label - lo, rows, weights)."""
    lo, hi = params.lo, params.hi
    held = chunk.state[HELD]
    a, z = np.searchsorted(held["labels"], [lo, hi])
    x = held["x"][a:z]
    return HeldRows(held["labels"][a:z] - lo, x if is_csr(x) else np.array(x), np.array(held["w"][a:z]))


class Batches:
    """A stochastic method's batches of b rows, keyed by step: ``batches.get(step)`` → (rows (b, D), weights
    (b,)), for steps below ``last``; a context (the held draws are dropped at its end). ``start(step, ids)``
    makes the first gather, which carries the engine's first pass and brings the rows ``ids`` (the seeding
    sample) too. ``dense=False``: CSR rows come as CSR matrices (a method whose steps read them)."""

    def __init__(self, engine, entropy, tag, b, last, dense=True):
        self.engine, self.entropy, self.tag, self.b, self.last = engine, entropy, tag, b, last
        self.dense = dense
        self.held = engine.streaming and engine.state_in_files
        self.window = None
        self.block = (0, np.empty((0, engine.n_features)), np.empty(0))  # a gather's steps' rows, end to end
        self._state = contextlib.ExitStack()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._state.close()

    def start(self, step, ids=()):
        """The gather serving ``step``, carrying the engine's first pass: (rows, weights) of ``ids`` too."""
        uniq, inverse = np.unique(np.asarray(ids, np.int64), return_inverse=True)
        if self.held:
            self._move_to(step)
            params = self._open(step, build=False)
            taken = self.engine.reduce(_hold_and_take, HoldAndTake(params, uniq), (Rows(), Rows()), first_pass="with")
            return self._form(taken.rows[inverse]), taken.w[inverse]
        return self._take(step, uniq, inverse)

    def get(self, step):
        first, rows, w = self.block
        if not first <= step < first + len(w) // self.b:
            if self.held:
                self._fetch(step)
            else:
                self._take(step)
            first, rows, w = self.block
        at = (step - first) * self.b
        return rows[at : at + self.b], w[at : at + self.b]

    def _form(self, rows):
        return densified(rows) if self.dense else rows

    def _move_to(self, step):
        """Whether ``step`` is in another window than the last one's (then ``self.window`` becomes its)."""
        w = self.window
        if w is not None and w.first <= step < w.first + w.steps:
            return False
        self.window = window_at(self.entropy, self.tag, step, self.engine.n_samples, self.b)
        return True

    def _end(self, step):
        """The end of the gather from ``step``: within its window, below ``last``, within the budget."""
        self._move_to(step)
        left = min(self.window.first + self.window.steps, self.last) - step
        streamed = self.engine.streaming and not self.held
        return step + steps_per_gather(self.engine, self.b, left, streamed)

    def _take(self, step, uniq=np.empty(0, np.int64), inverse=np.empty(0, np.int64)):
        end = self._end(step)
        ids = batch_ids(self.window, step, end).ravel()
        m = len(uniq)
        rows, w = self.engine.take(np.concatenate([uniq, ids]), weights=True, first_pass="with", dense=self.dense)
        self.block = (step, rows[m:], w[m:])
        return rows[:m][inverse], w[:m][inverse]

    def _open(self, step, build):
        """The held draws of the current window, from ``step`` to the window's end or ``last``."""
        self._state.close()
        params = Held(self.window, step, min(self.window.first + self.window.steps, self.last))
        self._state.enter_context(self.engine.state(HELD, hold_draws, lambda: params, build=build))
        return params

    def _fetch(self, step):
        if self._move_to(step):
            self._open(step, build=True)
        end = self._end(step)
        lo = (step - self.window.first) * self.b
        hi = (end - self.window.first) * self.b
        held = self.engine.reduce(_held_rows, Labels(lo, hi), (Rows(), Rows(), Rows()))
        if len(held.at) != hi - lo:
            raise RuntimeError(f"held draws of steps {step}-{end}: {len(held.at)} rows of {hi - lo}")
        order = np.argsort(held.at)  # each label once: the draws in step order
        self.block = (step, self._form(held.rows[order]), held.w[order])
