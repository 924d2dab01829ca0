"""Lloyd iterations: the building block of ``algo="kmeans"``, of k-means||'s recluster, and of every
algorithm that refines centres on weighted data.

S. P. Lloyd, "Least squares quantization in PCM", IEEE Trans. Inf. Theory 28(2), 1982,
doi:10.1109/TIT.1982.1056489.

One iteration (``lloyd_step`` on every chunk, exact sum, ``m_step``):
  1. assign every row to its nearest centre (blocked GEMM, float64 re-search near ties); after the first
     step, a row whose own centre is nearer than any other can have come (its second-nearest bound less
     the largest move of another centre: Hamerly's test, SDM 2010) keeps its label and is measured against
     that centre alone, so the labels are those of a full search at a fraction of its cost;
  2. accumulate Σ w x, Σ w and Σ w d² per centre (float64);
  1-2 at small k·d (dense rows, ``lazy_for``): each row's bounds are kept lazily, against its centre's
     moves accumulated since the fit began, so a row the test keeps is not read at all, and each chunk keeps
     its clusters' Σ w x, Σ w and Σ w ||x − mean||² as exact fixed-point words, into which only the rows that
     change label move their shares (``kernels/lazy.py``); the step's QE comes from those sums, the fit's
     objective from a last pass that measures every row;
  3. centres ← Σ w x / Σ w; an empty cluster takes the row farthest from its centre (as scikit-learn);
  4. stop when no label changed, or when Σ ||Δc||² ≤ tol (scikit-learn's rule, tol already scaled by
     the mean feature variance), then one assignment pass so that the returned labels and QE belong to
     the returned centres.

Spherical k-means (``unit``: rows on the unit sphere, metric="cosine"; Dhillon & Modha, "Concept
decompositions for large sparse text data using clustering", Machine Learning 42, 2001, §3): on unit rows
||x − c||² = 2 − 2 x·c, so the nearest centre is the one of largest inner product and steps 1-2 are
unchanged; step 3 takes each cluster's mean direction Σ w x / ||Σ w x||, the unit vector maximising Σ w x·c
over its rows (the concept vector), so the objective Σ w (1 − x·c), half the QE, still never rises. Hamerly's
test needs only the triangle inequality and each centre's actual move, so it holds on the sphere as it is.

Centres larger than the engine's ``model-bytes`` live sharded on the workers (rule 1): step 2's sums are
reduce-scattered by cluster, step 3 runs where each cluster range lives, and the driver receives Σ w and
||Δc||² per cluster (O(k)), never a k × d array until the end. Both paths give the same bits.
"""

import contextlib
import functools
import itertools
from typing import NamedTuple

import numpy as np

from ..engine.combine import Entries, Rows, Scatter, Sum, Top, Words
from ..kernels.assign import Prepared, accumulate, is_csr, nearest, nearest_after_move
from ..kernels.distance import rows_per_block, sqdist_to_labels
from ..kernels.lazy import add_shares, lazy_bounds, lazy_qe, lazy_search
from ..kernels.sparse import csr_sum_entries
from ..kernels.stats import N_WORDS
from ..loop import FitResult, Loop

# what ``lloyd_step`` keeps per row through the fit: the labels, the previous iteration's (int32 each), the
# min d² and the bound of the second-nearest d² (float64 each)
LLOYD_ROW_BYTES = 4 + 4 + 8 + 8
# over lazy bounds (``Lazy``): the labels and two float32 bounds; each chunk holds its clusters' sums besides,
# as exact words (24 bytes a value), which must fit in the difference, on average over the chunks
LAZY_ROW_BYTES = 4 + 4 + 4
# the largest k·d whose fits keep their bounds lazily: the share of rows that fail the test grows with k
LAZY_VALUES = 1 << 14
# relative slack on a centre's move: far above the rounding of its float64 distance
SHIFT_SLACK = 1e-9
# rows a Lloyd step searches and sums at a time: while they sit in the 2-4 MB of a core's cache, the sums read
# them there (1M x 32 float32 in 16 chunks, k = 8: the sums read them from memory in 14 of 62 ms per
# iteration)
SLAB_BYTES = 1 << 20
# a chunk of CSR rows sends its Lloyd sums as terms below k·d / 8 non-zeros: each term is an exact add at a
# random place, and the dense partial sums repeats in float64 and lifts in order (200k TF-IDF rows, k = 256,
# D = 50,000: terms 18 % faster at 0.09 k·d non-zeros a chunk, even at 0.18, 17 % slower at 0.36)
ENTRIES_SHARE = 8


class Lazy(NamedTuple):
    """What a step over lazily kept bounds needs besides its centres (``kernels/lazy.py``): the fit it
    belongs to (a chunk's state from another fit is searched afresh), each centre's moves since the fit
    began and the sum of the largest (upper bounds), the point the squared norms are taken about (the
    data's mean) and the fixed-point grid of the words."""

    fit: int
    drift: np.ndarray
    far: float
    ref: np.ndarray
    top: int


class Moved(NamedTuple):
    """The centres of a Lloyd step (a ``Prepared``), called ``token``, each at most ``shift`` from those of
    the step ``since``: a chunk whose labels belong to that step searches only the rows whose label may
    have changed (``nearest_after_move``). ``since`` None: no earlier step to start from. ``lazy``: the
    step keeps its bounds lazily (``Lazy``), which any earlier state of the same fit starts from."""

    centers: Prepared
    token: int
    since: int | None = None
    shift: np.ndarray | None = None
    lazy: Lazy | None = None


class LloydPartial(NamedTuple):
    """A chunk's part of a Lloyd step: Σ w x and Σ w per centre, the QE of its assignment, the labels that
    changed and the distance evaluations."""

    sums: np.ndarray
    weights: np.ndarray
    qe: float
    changed: np.int64
    evals: np.int64


class Assigned(NamedTuple):
    """The QE of an assignment and the distance evaluations it took."""

    qe: float
    evals: np.int64


class Stepped(NamedTuple):
    """What a Lloyd step tells the loop: the QE before the move, changed labels, evaluations, Σ w and ||Δc||²
    per cluster."""

    qe: float
    changed: int
    evals: int
    weights: np.ndarray
    moves: np.ndarray


class Farthest(NamedTuple):
    """The rows farthest from their centre (``Top``'s field: distance², global id, row, label, weight)."""

    rows: tuple


def lloyd_step(chunk, centers) -> LloydPartial:
    """Assign the chunk's rows and return the partial (Σ w x, Σ w, QE, changed labels, evaluations).
    ``centers``: a ``Moved`` (its centres a ``Prepared``, or a sharded model's float64 array), or a bare
    ``Prepared`` (every row searched).

    State: the labels of the previous step (to count changes, and with the distances to start the next
    step's search from; a rebuilt chunk counts all rows as changed, which can only delay convergence, and
    searches every row), the distances (for empty-cluster relocation) and the step they belong to (none
    recorded: a checkpoint's, the step RESUMED); over lazy bounds, ``_lazy_step``'s.
    """
    st = chunk.state
    moved = _moved(centers, chunk.x.dtype)
    if moved.lazy is not None:
        return _lazy_step(chunk, moved)
    _drop(st, _LAZY_KEYS)
    prev = st.get("lloyd_labels")
    after_move = moved.since is not None and "lloyd_mind2" in st and st.get("lloyd_step", RESUMED) == moved.since
    labels, mind, mind2 = (st.get(key) for key in ("lloyd_spare", "lloyd_mind", "lloyd_mind2"))
    labels = np.empty(chunk.n, np.int32) if labels is None else labels
    mind = np.empty(chunk.n) if mind is None else mind
    mind2 = np.empty(chunk.n) if mind2 is None else mind2

    def search(a, b):
        if after_move:
            return nearest_after_move(
                chunk.x[a:b], moved.centers, moved.shift, prev[a:b], labels[a:b], mind[a:b], mind2[a:b]
            )[2]
        return nearest(chunk.x[a:b], moved.centers, labels[a:b], mind[a:b], mind2[a:b])[2]

    if is_csr(chunk.x):
        evals = search(0, chunk.n)
        sums, weights, qe = _sums(chunk, moved.centers, labels, mind)
    else:  # in slabs that stay in cache from the search to the sums: one read of the rows from memory, not two
        k, d = moved.centers.C.shape
        sums, weights, qe, evals = np.zeros((k, d)), np.zeros(k), 0.0, 0
        # (never below a GEMM block: wide rows would otherwise go to the GEMM a few at a time)
        step = max(rows_per_block(k), SLAB_BYTES // max(1, chunk.x.itemsize * d))
        for a in range(0, chunk.n, step):
            b = min(chunk.n, a + step)
            evals += search(a, b)
            qe = accumulate(chunk.x[a:b], chunk.w[a:b], labels[a:b], mind[a:b], sums, weights, qe)
    changed = chunk.n if prev is None else int(np.count_nonzero(prev != labels))
    st["lloyd_labels"], st["lloyd_spare"], st["lloyd_mind"], st["lloyd_mind2"] = labels, prev, mind, mind2
    st["lloyd_step"] = moved.token
    return LloydPartial(sums, weights, qe, np.int64(changed), np.int64(evals))


_LAZY_KEYS = ("lazy_fit", "lazy_ub", "lazy_lb", "lazy_words", "lazy_centers")
_EAGER_KEYS = ("lloyd_spare", "lloyd_mind", "lloyd_mind2", "lloyd_step")


def _drop(st, keys):
    """Forget the other kind of step's state (a fit of another k on the same rows)."""
    for key in keys:
        st.pop(key, None)


def _lazy_step(chunk, moved) -> LloydPartial:
    """``lloyd_step`` over lazily kept bounds (dense rows, k·d ≤ ``LAZY_VALUES``): the partial's sums are the
    chunk's exact words (``Words``) and its QE comes from them (``kernels/lazy.py``).

    State: the labels, the lazy bounds, the words and the fit they belong to; a chunk without them (the fit's
    first step, a rebuilt chunk) searches every row and sums it into new words; one given a checkpoint's
    labels and bounds sums its words from those labels. The centres are kept too, for a relocation's
    distances (``farthest_rows``)."""
    st, lazy, P = chunk.state, moved.lazy, moved.centers
    k, d = P.C.shape
    bad = 0
    if "lazy_fit" not in st and "lazy_ub" in st:  # a checkpoint's labels and bounds: the words from them
        words = _new_words(k, d)
        bad = add_shares(chunk.x, chunk.w, st["lloyd_labels"], lazy.ref, lazy.top, *words)
        st.update(lazy_words=words, lazy_fit=lazy.fit)
    if st.get("lazy_fit") == lazy.fit:
        labels, ub, lb, words = st["lloyd_labels"], st["lazy_ub"], st["lazy_lb"], st["lazy_words"]
        evals, changed, found = lazy_search(
            chunk.x,
            chunk.w,
            P.Cd,
            P.cnorm,
            P.C,
            P.tol,
            P.block,
            lazy.drift,
            lazy.far,
            lazy.ref,
            lazy.top,
            labels,
            ub,
            lb,
            *words,
        )
        bad += found
    else:
        _drop(st, _EAGER_KEYS)
        prev = st.get("lloyd_labels")
        labels, mind, mind2 = np.empty(chunk.n, np.int32), np.empty(chunk.n), np.empty(chunk.n)
        evals = nearest(chunk.x, P, labels, mind, mind2)[2]
        words = _new_words(k, d)
        bad = add_shares(chunk.x, chunk.w, labels, lazy.ref, lazy.top, *words)
        ub, lb = np.empty(chunk.n, np.float32), np.empty(chunk.n, np.float32)
        lazy_bounds(labels, mind, mind2, lazy.drift, lazy.far, ub, lb)
        changed = chunk.n if prev is None else int(np.count_nonzero(prev != labels))
        st.update(lloyd_labels=labels, lazy_ub=ub, lazy_lb=lb, lazy_words=words, lazy_fit=lazy.fit)
    if bad:
        raise FloatingPointError(f"a Lloyd sum exceeds 2^{lazy.top}; the data's scale was misjudged")
    st["lazy_centers"] = P
    qe = lazy_qe(P.C, lazy.ref, *words, lazy.top)
    sums, weights = Words(words[0].copy(), (k, d)), Words(words[1].copy(), (k,))
    return LloydPartial(sums, weights, qe, np.int64(changed), np.int64(evals))


def _new_words(k, d):
    """Empty exact words for a chunk's Σ w x, Σ w and Σ w ||x − ref||² per cluster."""
    return np.zeros((k * d, N_WORDS), np.int64), np.zeros((k, N_WORDS), np.int64), np.zeros((k, N_WORDS), np.int64)


def _sums(chunk, centers, labels, mind):
    """Σ w x and Σ w per centre and the QE of the chunk's assigned rows. Of CSR rows with fewer non-zeros
    than k·d / ``ENTRIES_SHARE``, Σ w x comes as their terms (``Entries``), where the chunk's dense k × d
    partial would cost more to fill and lift than its rows."""
    k, d = centers.C.shape
    weights = np.zeros(k)
    x = chunk.x
    nnz = int(x.indptr[-1] - x.indptr[0]) if is_csr(x) else 0
    if is_csr(x) and ENTRIES_SHARE * nnz < k * d:
        keys, values = np.empty(nnz, np.int64), np.empty(nnz)
        qe = csr_sum_entries(x.indptr, x.indices, x.data, chunk.w, labels, mind, d, keys, values, weights)
        return Entries(keys, values, (k, d)), weights, qe
    sums = np.zeros((k, d))
    qe = accumulate(x, chunk.w, labels, mind, sums, weights)
    return sums, weights, qe


def _moved(centers, dtype):
    """``centers`` as a ``Moved`` of a ``Prepared``: a bare ``Prepared`` starts from no step; a sharded
    model's float64 array is prepared here."""
    if not isinstance(centers, Moved):
        centers = Moved(centers, None)
    if not isinstance(centers.centers, Prepared):
        centers = centers._replace(centers=Prepared(centers.centers, dtype))
    return centers


def _update_step(chunk, centers) -> LloydPartial:
    """``lloyd_step``'s partial without its state (nothing is kept per row; no label counts as changed)."""
    prepared = _moved(centers, chunk.x.dtype).centers
    labels, mind, evals = nearest(chunk.x, prepared)
    sums, weights, qe = _sums(chunk, prepared, labels, mind)
    return LloydPartial(sums, weights, qe, np.int64(0), np.int64(evals))


def _assigned_qe(chunk, centers) -> Assigned:
    """``lloyd_step``'s QE and evaluations alone (the last assignment pass). Over lazy bounds every row is
    measured, as ``quantization_error`` does: a fit's objective is a sum of the rows' distances, where a
    lazy step's QE is formed from its sums."""
    if centers.lazy is not None:
        return _qe_step(chunk, _moved(centers, chunk.x.dtype).centers)
    part = lloyd_step(chunk, centers)
    return Assigned(part.qe, part.evals)


def farthest_rows(chunk, m) -> Farthest:
    """The chunk's m rows farthest from their centre: (distance², global id, row, label, weight). Over lazy
    bounds the rows' distances to the step's centres are measured here: its kept rows were not."""
    st = chunk.state
    if "lazy_fit" in st:
        labels, mind = st["lloyd_labels"], np.empty(chunk.n)
        sqdist_to_labels(chunk.x, 0, chunk.n, st["lazy_centers"].C, labels, mind, labels[:0])
    else:
        mind = st["lloyd_mind"]
    idx = np.lexsort((np.arange(mind.shape[0]), -mind))[:m]
    return Farthest((mind[idx], idx + chunk.start, chunk.rows(idx), chunk.state["lloyd_labels"][idx], chunk.w[idx]))


def relocation(engine, weights):
    """scikit-learn's policy for empty clusters: each takes the row farthest from its centre, whose mass
    leaves its old cluster unless that would empty it. Returns the moves in order, (empty cluster, row
    (float64), old cluster, weight, whether the old cluster gives up the row), or None."""
    empty = np.flatnonzero(weights == 0)
    if not len(empty):
        return None
    _, _, rows, labels, w = engine.reduce(farthest_rows, len(empty), (Top(len(empty), largest=True),)).rows
    left = weights.copy()
    gives = np.zeros(len(rows), bool)
    for i, (e, old, wi) in enumerate(zip(empty, labels, w)):
        gives[i] = left[old] - wi > 0
        if gives[i]:
            left[old] -= wi
        left[e] = wi
    return empty[: len(rows)], rows.astype(np.float64), labels, w, gives


def apply_moves(sums, weights, moves, lo=0):
    """The relocation's moves on clusters lo .. lo + len(weights) (all of them, or one shard), in order."""
    hi = lo + len(weights)
    for e, x, old, wi, gives in zip(*moves):
        if gives and lo <= old < hi:
            sums[old - lo] -= wi * x
            weights[old - lo] -= wi
        if lo <= e < hi:
            sums[e - lo] = wi * x
            weights[e - lo] = wi


def m_step(sums, weights, old, unit=False):
    """New centres; a cluster that is still empty keeps its old centre. ``unit``: the mean direction (a
    cluster whose rows cancel out, Σ w x = 0, has none and keeps its old centre too)."""
    new = old.copy()
    if unit:
        nz = (weights > 0) & ((sums * sums).sum(axis=1) > 0)
        new[nz] = to_sphere(sums[nz])
        return new
    nz = weights > 0
    new[nz] = sums[nz] / weights[nz, None]
    return new


def to_sphere(centers):
    """Centres (float64) divided by their norms: spherical k-means' start from seeds that need not be unit (a
    k-means|| recluster's means, a given init); a zero row, which has no direction, stays zero until the
    first M-step gives it its cluster's."""
    norms = np.sqrt((centers * centers).sum(axis=1))
    out = centers.copy()
    out[norms > 0] /= norms[norms > 0, None]
    return out


def shifts(new, old):
    """||Δc||² per cluster (their sum is the tol rule's shift, in the same order on both paths)."""
    return ((new - old) ** 2).sum(axis=1)


# names of the steps' centres, so that a chunk knows whether its labels belong to the last step's; RESUMED
# names the step a checkpoint's per-row state belongs to
_STEPS = itertools.count()
RESUMED = -1


class Steps:
    """What the centres tell each step, wherever they live: its name, the last step's, and how far each
    centre moved since (``Moved``). ``moves``: ||Δc||² per cluster since the last step, which the M-step and
    the relocation set; from a checkpoint, the saved ones and the step RESUMED. ``lazy``: a fit over lazy
    bounds (``Lazy``), whose moves accumulate here."""

    def __init__(self, since=None, moves=None, lazy=None):
        self._token, self.moves, self.lazy = since, moves, lazy

    def _moved(self, centers):
        token = next(_STEPS)
        shift = None if self.moves is None else np.sqrt(self.moves) * (1.0 + SHIFT_SLACK)
        if self.lazy is not None and shift is not None:
            lazy = self.lazy
            self.lazy = lazy._replace(drift=lazy.drift + shift, far=lazy.far + float(shift.max(initial=0.0)))
        moved = Moved(centers, token, self._token, shift, self.lazy)
        self._token = token
        return moved


def lazy_for(engine, centers):
    """A new fit's ``Lazy`` where its bounds are kept lazily (dense rows, k·d ≤ ``LAZY_VALUES``, the words of
    every chunk within the state the eager bounds would take), else None: a choice of the data, its chunks
    and k alone, so a fit takes it alike on any worker count and after a resume."""
    k, d = centers.shape
    words = (k * d + 2 * k) * N_WORDS * 8
    room = (LLOYD_ROW_BYTES - LAZY_ROW_BYTES) * engine.n_samples
    if engine.sparse or k * d > LAZY_VALUES or words * engine.n_chunks > room:
        return None
    return Lazy(next(_STEPS), np.zeros(k), 0.0, np.asarray(engine.summary.mean, np.float64), engine.fixed_grid())


# a step's fields: Σ w x and Σ w go to the centres' shards (reduce-scattered by cluster when sharded); QE,
# changed labels and evaluations summed
SHARDED_STEP = (Scatter(), Scatter(), Sum(), Sum(), Sum())


def sharded_m_step(fields, shard, params, lo, unit=False):
    """Step 3 where clusters lo.. live: the new centres; the shard keeps (centres, Σ w x, Σ w, old centres)
    for a relocation; Σ w and ||Δc||² per cluster go to the driver."""
    sums, weights = fields
    old = shard[0]
    new = m_step(sums, weights, old, unit)
    return (new, sums, weights, old), (weights, shifts(new, old))


class Relocation(NamedTuple):
    """``sharded_relocation``'s parameters: the relocation's moves, and whether the M-step is spherical."""

    moves: tuple
    unit: bool


def sharded_relocation(shard, params: Relocation, lo):
    """The relocation's moves on one shard, then its M-step again."""
    _, sums, weights, old = shard
    sums, weights = sums.copy(), weights.copy()
    apply_moves(sums, weights, params.moves, lo)
    new = m_step(sums, weights, old, params.unit)
    return (new, sums, weights, old), (shifts(new, old),)


def _qe_step(chunk, centers) -> Assigned:
    _, mind, evals = nearest(chunk.x, centers)
    return Assigned(float(np.dot(chunk.w, mind)), np.int64(evals))


def quantization_error(engine, centers):
    """Σ w min_c ||x − c||² over the engine's rows (exact nearest centre) and the evaluations spent."""
    out = engine.reduce(_qe_step, Prepared(centers, engine.dtype))
    return float(out.qe), int(out.evals)


class Centres(Steps):
    """Lloyd's centres in an engine model (``Engine.model``: on the driver while within ``model-bytes``, else
    sharded on the workers by cluster range, rule 1). Step 2's sums go to step 3 where the centres live
    (reduce-scattered when sharded), the same shard functions either way, so the same bits. Per step the
    driver receives Σ w and ||Δc||² per cluster (16·k bytes) and three counters, and the sums themselves
    (k·(D + 1)) where the centres are on the driver; the callback gets the centres only from there."""

    def __init__(self, engine, model, unit=False, **steps):
        super().__init__(**steps)
        self.engine, self.model, self.unit = engine, model, unit
        self._at_shard = functools.partial(sharded_m_step, unit=True) if unit else sharded_m_step

    def _ref(self):
        """The centres for a step: prepared once on the driver when they are there."""
        ref = self.model.ref()
        return Prepared(ref, self.engine.dtype) if isinstance(ref, np.ndarray) else ref

    def step(self, step=lloyd_step):
        """Steps 1-3 from the current centres (``Stepped``)."""
        moved = self._moved(self._ref())
        out = Stepped(*self.model.step(step, moved, SHARDED_STEP, self._at_shard, (Rows(), Rows())))
        self.moves = out.moves
        return out

    def relocate(self, moves):
        """The relocation's moves on the step's sums, and step 3 again: ||Δc||² per cluster."""
        (self.moves,) = self.model.apply(sharded_relocation, Relocation(moves, self.unit), (Rows(),))
        return self.moves

    def local(self):
        """The centres, for the callback (None where they are not on the driver)."""
        return self.model.local()

    def gather(self):
        return self.model.gather()

    def assigned_qe(self):
        """One assignment pass for the labels and QE of the current centres (``Assigned``)."""
        return self.engine.reduce(_assigned_qe, self._moved(self._ref()))


@contextlib.contextmanager
def centres_on(engine, key, centers, unit=False, **steps):
    """Lloyd's centres for a fit, wherever ``Engine.model`` keeps them; ``unit``: spherical k-means' M-step;
    ``steps``: ``Steps``' (a checkpoint's, a ``lazy_for``)."""
    with engine.model(key, (centers,)) as model:
        yield Centres(engine, model, unit, **steps)


def lloyd_update(engine, centers, unit=False):
    """One Lloyd step from ``centers`` without relocation (a cluster no row chose keeps its centre) and no
    state kept on the rows (``unit``: spherical): the new centres and the evaluations."""
    with centres_on(engine, "lloyd update", centers, unit) as model:
        evals = int(model.step(_update_step).evals)
        return model.gather(), evals


# Lloyd's per-row state in a checkpoint: each key's fields as ``restored_rows`` checks them (the bound is
# any float: a wrong one can only search rows, or keep a label, that the checksum would have refused). Over
# lazy bounds the labels and the two bounds (any float), from which a chunk rebuilds its words.
def _row_fields(k, lazy=False):
    labels = {"lloyd_labels": {"": ("int32", (), 0, k)}}
    if lazy:
        return {**labels, "lazy_ub": {"": ("float32", (), None, None)}, "lazy_lb": {"": ("float32", (), None, None)}}
    return {
        **labels,
        "lloyd_mind": {"": ("float64", (), 0.0, np.inf)},
        "lloyd_mind2": {"": ("float64", (), None, None)},
    }


def _restored(engine, centers, loop, lazy):
    """(centres, evaluations, QE, whether no label moved, ``Steps``' arguments) to start from: the
    checkpoint's, with every chunk's labels and distances (or lazy bounds, and the moves they are kept
    against) of its last iteration (so ``changed`` counts and the next search skips rows as they would
    have), or ``centers``."""
    state = loop.restored
    if state is None:
        return centers, 0, None, False, {"lazy": lazy}
    if loop.restored_rows is None:
        return state["centers"], state["evals"], state["objective"], state["strict"], {"lazy": lazy}
    for key, fields in _row_fields(len(state["centers"]), lazy is not None).items():
        engine.load_rows(loop.restored_rows, key, fields)
    if lazy is not None:
        lazy = lazy._replace(drift=state["drift"], far=state["far"])
    steps = {"since": RESUMED, "moves": state["moves"], "lazy": lazy}
    return state["centers"], state["evals"], state["objective"], state["strict"], steps


def _save(engine, loop, model, evals, objective, strict, lazy):
    """A checkpoint when one is due: the centres, how far they moved in the last step, the counters and
    every chunk's labels and distances (``lazy``: its lazy bounds, and the moves they are kept against)."""

    def rows(directory):
        keys = _row_fields(0, lazy)
        return {name: sha for key in keys for name, sha in engine.dump_rows(directory, key).items()}

    loop.save(
        lambda: {
            "centers": model.gather(),
            "moves": model.moves,
            "evals": int(evals),
            "objective": objective,
            "strict": strict,
            # the moves the lazy bounds are kept against (none where the fit keeps its bounds eagerly)
            "drift": model.lazy.drift if lazy else np.zeros_like(model.moves),
            "far": model.lazy.far if lazy else 0.0,
        },
        rows=rows,
    )


def lloyd(engine, centers, *, max_iter, tol, loop=None, unit=False):
    """Lloyd iterations from ``centers`` (float64, validated); ``tol`` is absolute (already scaled).
    ``unit``: spherical k-means on rows the engine holds on the unit sphere, from unit ``centers``.

    Returns a ``FitResult`` whose objective is the QE of the returned centres on ``engine``'s rows (with
    ``unit``, Σ w (1 − x·c), half of it, in the records too).
    """
    loop = loop or Loop("lloyd", max_iter)
    half = 0.5 if unit else 1.0
    lazy = lazy_for(engine, centers if loop.restored is None else loop.restored["centers"])
    centers, evals, objective, strict, steps = _restored(engine, centers, loop, lazy)
    with centres_on(engine, "lloyd", centers, unit, **steps) as model:
        for _ in loop:
            stepped = model.step()
            qe, changed, shift = stepped.qe, stepped.changed, stepped.moves
            evals += stepped.evals
            moves = relocation(engine, stepped.weights)
            if moves is not None:
                shift = model.relocate(moves)
            relocated = 0 if moves is None else len(moves[0])
            shift = float(shift.sum())
            loop.record(
                half * qe, stepped.evals, changed, centers=model.local(), center_shift=shift, relocated=relocated
            )
            strict = changed == 0 and relocated == 0
            objective = half * qe
            if strict or shift <= tol:
                loop.converged = True
            _save(engine, loop, model, evals, objective, strict, lazy is not None)
        if lazy is not None or not strict:  # the last M-step moved the centres, or a lazy step's QE is its sums'
            # one assignment pass for the labels and QE
            assigned = model.assigned_qe()
            objective = half * assigned.qe
            evals += assigned.evals
        centers = model.gather()
    return FitResult(centers, float(objective), loop.n_iter, loop.converged, int(evals), loop.history)
