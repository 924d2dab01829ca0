"""Initial centres: greedy k-means++, k-means|| (scalable), AFK-MC2, random rows, or a given array.

Every seeder is written against the Engine verbs (it never sees Dask) and returns float64 centres plus
the number of distance evaluations it spent. Random draws come from the fit's entropy: per chunk for
row-level draws, on the driver for choices between chunks, so the seeds do not depend on the number of
workers (rule 5). Inputs are validated by ``api``; nothing here re-checks them.

References
- k-means++: Arthur & Vassilvitskii, SODA 2007; greedy variant (2 + ⌊ln k⌋ trials) as scikit-learn.
- k-means||: Bahmani et al., VLDB 2012, doi:10.14778/2180912.2180915 (ℓ = 2k, weighted recluster).
- AFK-MC2: Bachem, Lucic, Hassani, Krause, NeurIPS 2016 (assumption-free K-MC², chain length m).
"""

import contextlib
import contextvars
import math
from typing import NamedTuple

import numpy as np

from .. import progress
from .._random import stream
from ..engine import open_local
from ..engine.combine import Fold, Max, Rows, Sum
from ..kernels.assign import (
    Prepared,
    candidate_gaps,
    candidate_potentials,
    direct_limit,
    is_csr,
    lower_near,
    nearest,
    stacked,
    update_mind,
)
from ..kernels.distance import gemm_tolerance
from ..kernels.sampling import draw_proportional, greedy_plusplus
from .coreset import MASSES, Masses, chunk_masses, proposal, proposal_masses
from .lloyd import lloyd

SEEDERS = ("k-means||", "k-means++", "afkmc2", "random")
# the seeding by the rows' layout: k-means|| on dense rows; greedy k-means++ on CSR rows (documents), whose
# k-means|| seeds ended 3-4 % above k-means++'s in QE after Lloyd or mini-batches (200k and 20k TF-IDF rows of
# 50,000 terms, k = 256 and 32: the oversampled rounds pick rare long documents, which the weighted recluster
# keeps as centres)
AUTO = "auto"


# ---------------------------------------------------------------- per-chunk steps


def _lower_mind(x, centers, mind, near=None, offset=0):
    """mind ← min(mind, distance² to the nearest of ``centers``) by the GEMM kernel; where it falls, ``near``
    (when given) ← that centre's index + ``offset`` (an earlier centre keeps a tie); returns evaluations."""
    labels, d2, evals = nearest(x, Prepared(centers, x.dtype))
    if near is not None:
        closer = d2 < mind
        near[closer] = labels[closer] + offset
    np.minimum(mind, d2, out=mind)
    return evals


def _init_mind(chunk, centers):
    """State: squared distance of each row to its nearest chosen centre (rebuildable from the centres)."""
    mind = np.full(chunk.n, np.inf)
    if centers is not None and len(centers):
        _lower_mind(chunk.x, centers, mind)
    chunk.state["mind"] = mind


class Proposal(NamedTuple):
    """``_propose``'s parameters: the centre chosen last (None: none yet), rows to propose, the draw's
    stream tag, and whether ∝ w alone."""

    new_center: np.ndarray | None
    trials: int
    step: tuple
    uniform: bool


class Proposals(NamedTuple):
    """A chunk's proposals: its mass (Σ of what it draws by), the evaluations, and the rows it proposes."""

    masses: np.ndarray
    evals: np.int64
    rows: object


class ProposedRow(NamedTuple):
    """The one row a chunk proposes (none from the other chunks)."""

    rows: object


class ChunkMass(NamedTuple):
    """Σ w per chunk, in chunk order."""

    masses: np.ndarray


class Potentials(NamedTuple):
    """Greedy k-means++'s potential of each candidate, and the evaluations."""

    potentials: np.ndarray
    evals: np.int64


class CandidateWeights(NamedTuple):
    """Σ w of the rows nearest each k-means|| candidate, and the evaluations."""

    weights: np.ndarray
    evals: np.int64


class Chained(NamedTuple):
    """A round's AFK-MC2 proposals: their slots, d² to the round's centres, rows, weights, proposal
    probabilities, and the evaluations."""

    slots: np.ndarray
    d2: np.ndarray
    rows: object
    w: np.ndarray
    q: np.ndarray
    evals: np.int64


def _propose(chunk, params: Proposal) -> Proposals:
    """Commit the last chosen centre, then propose ``trials`` rows ∝ w·mind (∝ w when ``uniform``, which
    needs no state): (the chunk's mass, evaluations, its proposals' rows; none when its mass is 0)."""
    evals = 0
    if params.uniform:
        p = chunk.w
    else:
        mind = chunk.state["mind"]
        if params.new_center is not None:
            evals = update_mind(chunk.x, params.new_center[None, :], mind)
        p = chunk.w * mind
    mass = float(p.sum())
    if mass <= 0:
        return Proposals(np.zeros(1), np.int64(evals), chunk.rows(slice(0, 0)))
    idx = draw_proportional(p, chunk.rng("propose", params.step), params.trials)
    return Proposals(np.array([mass]), np.int64(evals), chunk.rows(idx))


# per chunk its mass and proposals, in chunk order (trials rows per chunk: small); evaluations summed
PROPOSALS = (Rows(), Sum(), Rows())


def _chunk_mass(chunk, _) -> ChunkMass:
    return ChunkMass(np.array([chunk.w.sum()]))


class OneRow(NamedTuple):
    """``_propose_in``'s parameters: the chunk drawn from, the draw's stream tag, the rows' width and dtype."""

    chunk: int
    step: tuple
    n_features: int
    dtype: np.dtype


def _propose_in(chunk, params: OneRow) -> ProposedRow:
    """``_propose``'s uniform proposal of one row, from chunk ``params.chunk`` alone (no other chunk is read)."""
    if chunk.index != params.chunk:
        return ProposedRow(np.empty((0, params.n_features), params.dtype))
    return ProposedRow(_propose(chunk, Proposal(None, 1, params.step, True)).rows)


_propose_in.prefetch = False


def _potentials(chunk, centers) -> Potentials:
    pot = np.zeros(centers.C.shape[0])
    evals = candidate_potentials(chunk.x, chunk.w, chunk.state["mind"], centers, pot)
    return Potentials(pot, np.int64(evals))


def _init_candidates(chunk, cands):
    """State of k-means||: each row's min d² to the candidates so far and the index of the nearest (the
    lowest on ties), rebuildable from the candidates."""
    n = chunk.n
    st = {"mind": np.full(n, np.inf), "near": np.full(n, -1, np.int32)}
    if cands is not None and cands.shape[0]:
        _lower_mind(chunk.x, cands, st["mind"], st["near"])
    chunk.state["k-means||"] = st


class Round(NamedTuple):
    """A k-means|| round's update (``_round``): its candidates numbered from ``offset``, and the known ones
    before them, or None."""

    new: np.ndarray
    offset: int
    known: np.ndarray | None


def _update_potential(chunk, params: Round):
    """Add a round's candidates ``new`` (numbered from ``offset``) to mind and near; return Σ w·mind (φ).
    With ``known``, the candidates numbered below ``offset`` (sent where the table costs little: ``_round``),
    the triangle inequality spares most rows most of the round's candidates (``lower_near``)."""
    new, offset, known = params.new, params.offset, params.known
    st = chunk.state["k-means||"]
    evals = 0
    if known is None or len(known) * TABLE_SHARE > chunk.n or is_csr(chunk.x):  # (CSR rows: no table yet)
        evals = _lower_mind(chunk.x, new, st["mind"], st["near"], offset) if new.shape[0] else 0
    elif len(new):
        new = Prepared(new, chunk.x.dtype)
        most = direct_limit(len(new.C))
        order, gaps = candidate_gaps(known, new.C, min(len(new.C), most + 1))
        evals = lower_near(
            chunk.x, new.Cd, new.cnorm, new.C, new.tol, new.block, order, gaps, most, offset, st["mind"], st["near"]
        )
    st["phi"] = float(np.dot(chunk.w, st["mind"]))
    return st["phi"], np.int64(evals)


# the triangle test's table (known × new candidates, built per chunk) is used where a chunk has this many
# rows a known candidate: it then costs a small share of the search it spares
TABLE_SHARE = 16


def _round(engine, cands, offset):
    """A round's update as ``_update_potential`` takes it: (the candidates numbered from ``offset``,
    ``offset``, the known ones before them or None). The known ones travel (rounds·ℓ·d floats to every
    partition) only where the largest chunk would build the table from them."""
    known = stacked(cands)
    rows = int(np.diff(engine.source.starts).max())
    table = 0 < offset * TABLE_SHARE <= rows and not is_csr(known)
    return Round(known[offset:], offset, known[:offset] if table else None)


class Draw(NamedTuple):
    """A k-means|| round's draw: ℓ, φ (the potential it draws against: before its update where the draw
    rides on the update's pass, ``RoundDraw``) and the round's number."""

    ell: float
    phi: float
    rnd: int


def _oversample(chunk, params: Draw):
    """k-means|| round: keep each row independently with probability min(1, ℓ w mind / φ)."""
    prob = np.minimum(1.0, params.ell * chunk.w * chunk.state["k-means||"]["mind"] / params.phi)
    keep = np.flatnonzero(chunk.rng("k-means||", params.rnd).random(chunk.n) < prob)
    return keep + chunk.start, chunk.x[keep]


class RoundDraw(NamedTuple):
    """``_update_and_draw``'s parameters: the last round's update, then this round's draw (φ the one before the
    update) and the rows' total weight."""

    update: Round
    draw: Draw
    weight: float


def _update_and_draw(chunk, params: RoundDraw):
    """``_update_potential``, then round ``rnd``'s draw in the same read of the rows, before φ (the sum of
    every chunk's) is known: a row is kept when u < ℓ w mind / φ, i.e. when its key ℓ w mind / u exceeds φ,
    so the chunk returns its rows of the largest keys (``budget``, about 3ℓ times its expected share of φ)
    and the largest key it left out. When φ is above that key, the rows it returned hold every row the draw
    keeps, and the driver keeps those with ``_oversample``'s own test (the same rows, the same bits); when
    not, the driver draws with a pass of its own. (φ, evaluations, global ids, rows, w, mind, u, largest key
    left out)."""
    ell, phi_before, rnd = params.draw.ell, params.draw.phi, params.draw.rnd
    st = chunk.state["k-means||"]
    share = st["phi"] / phi_before if "phi" in st and phi_before > 0 else chunk.w.sum() / params.weight
    phi, evals = _update_potential(chunk, params.update)
    u = chunk.rng("k-means||", rnd).random(chunk.n)
    a = ell * chunk.w * st["mind"]
    live = np.flatnonzero(a > 0)  # a row of a = 0 is never kept
    key = a[live] / u[live]
    budget = int(math.ceil(3 * ell * share)) + 16
    left_out = 0.0
    if len(live) > budget:
        part = np.argpartition(-key, budget)
        left_out = float(key[part[budget:]].max())
        live = np.sort(live[part[:budget]])
    return (
        phi,
        evals,
        live + chunk.start,
        chunk.x[live],  # CSR rows stay CSR: the candidates are rows
        chunk.w[live],
        st["mind"][live],
        u[live],
        left_out,
    )


# φ and evaluations summed; the returned rows in chunk order; the largest key left out
FUSED_DRAW = (Sum(), Sum(), Rows(), Rows(), Rows(), Rows(), Rows(), Max())
# the first round's: φ in chunk order, which needs no grid, so that the round can carry the engine's first pass
FIRST_DRAW = (Fold(),) + FUSED_DRAW[1:]
# φ may exceed a key left out by this much relative rounding before the rows returned are all that can be kept
KEY_MARGIN = 1e-9


def _kept(ell, phi, fused):
    """The rows of a fused draw that ``_oversample`` keeps, or None when a row left out could be kept too."""
    _, _, ids, rows, w, mind, u, left_out = fused
    if not phi > left_out * (1 + KEY_MARGIN):
        return None
    keep = u < np.minimum(1.0, ell * w * mind / phi)
    return ids[keep], rows[keep]


class LastRound(NamedTuple):
    """``_update_and_weigh``'s parameters: the last round's update and the number of candidates."""

    update: Round
    n_cands: int


def _update_and_weigh(chunk, params: LastRound) -> CandidateWeights:
    """The last round's ``_update_potential`` and ``_candidate_weights`` in one read of the rows."""
    _, evals = _update_potential(chunk, params.update)
    return CandidateWeights(_candidate_weights(chunk, params.n_cands), np.int64(evals))


def _candidate_weights(chunk, n_cands):
    """Σ w of the rows nearest each candidate, from the rounds' own record of it (no pass over the
    candidates)."""
    return np.bincount(chunk.state["k-means||"]["near"], weights=chunk.w, minlength=n_cands)


def _nearest_weights(chunk, centers) -> CandidateWeights:
    """Σ w of the rows nearest each of ``centers`` (a Prepared), by a pass over them."""
    labels, _, evals = nearest(chunk.x, centers)
    return CandidateWeights(np.bincount(labels, weights=chunk.w, minlength=centers.C.shape[0]), np.int64(evals))


def _afk_build(chunk, model):
    """State: d² of every row to the first centre; once the proposals are drawn (``plan`` given), this
    chunk's proposals instead, in chain-slot order, with their min d² to the centres chosen so far
    (rebuildable: the draw is row-keyed and the driver holds the chosen centres)."""
    first, plan, centers = model
    d2 = np.full(chunk.n, np.inf)
    update_mind(chunk.x, first, d2)
    chunk.state["afkmc2"] = {"d2": d2}
    if plan is not None:
        _afk_draw(chunk, plan)
        st = chunk.state["afkmc2"]
        if len(centers) > 1:
            update_mind(st["rows"], centers[1:], st["mind"])


def _afk_masses(chunk, _) -> Masses:
    """The chunk's Σ w d² and Σ w (see MASSES), from d² to the first centre."""
    return chunk_masses(float(np.dot(chunk.w, chunk.state["afkmc2"]["d2"])), float(chunk.w.sum()))


def _afk_draw(chunk, plan):
    """Draw this chunk's share of the AFK-MC2 proposals ∝ q = ½ w d²/S + ½ w/W and keep them here, sorted by
    the chain slot the driver's permutation gives them (``slot_of``, indexed by the proposal's place in
    chunk order); returns how many."""
    counts, S, W, slot_of = plan
    st = chunk.state["afkmc2"]
    d2 = st.pop("d2")
    m = int(counts[chunk.index])
    q = proposal(chunk.w, d2, S, W)
    idx = draw_proportional(q, chunk.rng("afkmc2"), m) if m else np.empty(0, np.int64)
    first = int(counts[: chunk.index].sum())
    slot = slot_of[first : first + m]
    order = np.argsort(slot)
    idx = idx[order]
    st.update(slot=slot[order], rows=chunk.rows(idx), q=q[idx], w=chunk.w[idx], mind=d2[idx].copy(), pending=[])
    return (np.int64(m),)


class Chains(NamedTuple):
    """``_afk_chains``' parameters: the first chain's centre j, the centres chosen since the last round, the
    round's chains and their length."""

    j: int
    new_centers: list
    n_chains: int
    chain_length: int


def _afk_chains(chunk, params: Chains) -> Chained:
    """A round from centre j on: commit the centres chosen since the last round (applied to every proposal
    still ahead in blocks of ``AFK_BLOCK`` centres: one read of the proposals per block), then return this
    chunk's proposals of chains j .. j + n_chains − 1 with their min d² to centres 1..j−1: (position from
    chain j's first slot, min d², row, w, q, evaluations)."""
    j, new_centers, n_chains, chain_length = params.j, params.new_centers, params.n_chains, params.chain_length
    st = chunk.state["afkmc2"]
    evals = 0
    st["pending"].extend(new_centers)
    a, b = np.searchsorted(st["slot"], [(j - 1) * chain_length, (j - 1 + n_chains) * chain_length])
    pending = np.array(st["pending"]).reshape(-1, st["rows"].shape[1])
    if len(pending) >= AFK_BLOCK:
        evals += update_mind(st["rows"][a:], pending, st["mind"][a:])
        st["pending"], pending = [], pending[:0]
    d2 = st["mind"][a:b].copy()
    evals += update_mind(st["rows"][a:b], pending, d2)
    slots = st["slot"][a:b] - (j - 1) * chain_length
    return Chained(slots, d2, st["rows"][a:b], st["w"][a:b], st["q"][a:b], np.int64(evals))


# the most state a seeder keeps per row: k-means||'s min d² to the candidates (float64) and its nearest
# candidate (int32); k-means++ and AFK-MC2's first pass keep the min d² alone
ROW_BYTES = 8 + 4
# the round's proposals from every chunk, in chunk order; evaluations summed
CHAINS = (Rows(),) * 5 + (Sum(),)
# centres committed to the proposals ahead at once: each proposal row is read once per block
AFK_BLOCK = 32
# chains per round trip: the driver scores each against the centres chosen earlier in the same round
# (≤ n−1 per proposal, a share (n−1)/k of the work; 0.4 % at k = 4096), for k/n round trips instead of k
CHAINS_PER_ROUND = 16


# ---------------------------------------------------------------- driver side


def _pick_proposals(masses, rows, trials, rng):
    """Turn per-chunk proposals (``trials`` rows from each chunk of positive mass, in chunk order) into
    ``trials`` i.i.d. draws ∝ w·mind over all rows: a chunk ∝ its mass, then that chunk's t-th proposal."""
    total = masses.sum()
    if not total > 0:
        return None
    chunks = rng.choice(len(masses), size=trials, p=masses / total)
    live = masses > 0
    first = (np.cumsum(live) - live) * trials  # where each chunk's proposals start
    return rows[first[chunks] + np.arange(trials)]


def first_center(engine, rng_tag, entropy):
    """One row ∝ w: its chunk ∝ the chunk's Σ w (its size when no row has a weight of its own: no call; else
    read without the rows), then that chunk's proposal, the one chunk read (the draws of ``_propose`` over
    every chunk, and ``_pick_proposals``'s choice among them). Unweighted, the read may come before the
    engine's first pass, so that the next call can carry it."""
    if engine.unweighted:
        masses = np.diff(engine.source.starts).astype(np.float64)
    else:
        masses = engine.reduce(_chunk_mass, None, (Rows(),)).masses
    total = masses.sum()
    c = int(stream(entropy, rng_tag, "driver", 0).choice(len(masses), size=1, p=masses / total)[0])
    return engine.reduce(
        _propose_in,
        OneRow(c, (rng_tag, 0), engine.n_features, engine.dtype),
        (Rows(),),
        first_pass="after" if engine.unweighted else "before",
    ).rows


def kmeans_plusplus(engine, k, entropy, n_local_trials=None):
    """Greedy k-means++ over all rows: per centre, one pass proposes candidates ∝ w·D², one scores them."""
    trials = n_local_trials or 2 + int(np.log(k))
    centers = np.empty((k, engine.n_features))
    chosen = [0]
    with (
        engine.state("mind", _init_mind, lambda: centers[: chosen[0]]),
        progress.phase("seeding k-means++", k, "centre") as shown,
    ):
        centers[0] = first_center(engine, "k-means++", entropy)[0]
        chosen[0] = 1
        shown.update()
        evals = 0
        new = centers[0]
        for j in range(1, k):
            proposed = engine.reduce(_propose, Proposal(new, trials, ("k-means++", j), False), PROPOSALS)
            evals += int(proposed.evals)
            cands = _pick_proposals(proposed.masses, proposed.rows, trials, stream(entropy, "k-means++", "driver", j))
            if cands is None:  # every row already coincides with a centre: duplicates are all that is left
                cands = engine.take(stream(entropy, "k-means++", "dup", j).integers(0, engine.n_samples, 1))
                new = cands[0].astype(np.float64)
            else:
                scored = engine.reduce(_potentials, Prepared(cands, engine.dtype))
                evals += int(scored.evals)
                new = cands[int(np.argmin(scored.potentials))].astype(np.float64)
            centers[j] = new
            chosen[0] = j + 1
            shown.update()
    return centers, evals


def kmeans_parallel(engine, k, entropy, oversampling_factor=2.0, recluster_iter=30, max_rounds=5):
    """k-means||: ⌈ln φ⌉ ≤ 5 rounds of independent sampling with ℓ = factor·k, then the candidates,
    weighted by the mass of rows closest to them (recorded by the rounds themselves), reduced to k by
    weighted greedy k-means++ (one kernel call) and Lloyd (in-process: the candidate set is small).

    Within ``shared_candidates`` (a sweep over k) the rounds run once, with the ℓ of the largest k, and their
    weighted candidates serve every k: a smaller k's seeds are then its recluster of that larger set."""
    ell = oversampling_factor * k
    shared = _SHARED.get()
    if shared is not None and shared.serves(engine, entropy, ell):
        cands, weights, evals = shared.candidates(engine, entropy, max_rounds)
    else:
        cands, weights, evals = parallel_candidates(engine, ell, entropy, max_rounds)
    cands, weights, e = _topped_up(engine, cands, weights, k, entropy)
    centers, e2 = recluster(cands, weights, k, entropy, recluster_iter)
    return centers, evals + e + e2


def parallel_candidates(engine, ell, entropy, max_rounds=5):
    """k-means||'s rounds (Bahmani et al., Algorithm 2, steps 1-7): the candidates (float64, or CSR rows),
    the weight of the rows nearest each, and the distance evaluations."""
    cands = []
    with (
        engine.state("k-means||", _init_candidates, lambda: stacked(cands) if cands else None),
        progress.phase("seeding k-means||", None, "round") as shown,
    ):
        cands.append(first_center(engine, "k-means||", entropy).astype(np.float64))
        offset, phi, evals, rounds = 0, 0.0, 0, 1
        weight = float(engine.n_samples) if engine.unweighted else engine.summary.total_weight
        for r in range(max_rounds):
            if r >= rounds:
                break
            # the round's draw rides on the pass that adds the last round's candidates to the potential; the
            # first round's on the engine's first pass too, when that has not run
            fused = engine.reduce(
                _update_and_draw,
                RoundDraw(_round(engine, cands, offset), Draw(ell, phi, r), weight),
                FIRST_DRAW if r == 0 else FUSED_DRAW,
                first_pass="with",
            )
            phi, evals = fused[0], evals + int(fused[1])
            if r == 0:
                rounds = max(1, min(max_rounds, math.ceil(math.log(phi)))) if phi > 1 else 1
            if not phi > 0:
                break
            drawn = _kept(ell, phi, fused)
            if drawn is None:  # a chunk left out a row the draw could keep: the round's draw alone
                drawn = engine.reduce(_oversample, Draw(ell, phi, r), (Rows(), Rows()))
            offset = sum(c.shape[0] for c in cands)
            new = drawn[1].astype(np.float64)
            if new.shape[0]:
                cands.append(new)
                shown.update(candidates=offset + new.shape[0])
        n_cands = sum(c.shape[0] for c in cands)
        # after a round with φ = 0 its candidates are already in: nothing to add
        last = _round(engine, cands, offset if phi > 0 else n_cands)
        weighed = engine.reduce(_update_and_weigh, LastRound(last, n_cands))
    return stacked(cands), weighed.weights, evals + int(weighed.evals)


def _topped_up(engine, cands, weights, k, entropy):
    """Too few distinct candidates for k: topped up with uniformly random rows, all weighed again by the rows
    nearest each (one pass); then those no row chose dropped while k remain. (candidates, weights, evals)."""
    evals = 0
    if cands.shape[0] < k:
        extra = stream(entropy, "k-means||", "top-up").choice(engine.n_samples, k - cands.shape[0], replace=False)
        cands = stacked([cands, engine.take(extra, dense=False).astype(np.float64)])
        weighed = engine.reduce(_nearest_weights, Prepared(cands, engine.dtype))
        weights, evals = weighed.weights, weighed.evals
    keep = weights > 0
    if keep.sum() >= k:
        return cands[keep], weights[keep], int(evals)
    return cands, np.maximum(weights, np.finfo(float).tiny), int(evals)


def recluster(cands, weights, k, entropy, recluster_iter):
    """k-means||'s step 8: the weighted candidates reduced to k centres by greedy k-means++ and Lloyd, on the
    driver (the candidate set is small). (centres, evals)."""
    with (
        open_local(cands, weights, entropy) as local,
        progress.reporting(False),
    ):  # the recluster of a few candidates is quick: no bars of its own
        if is_csr(cands):  # documents: the greedy k-means++ on CSR rows, O(nnz) a candidate, not O(D)
            seeds, e = kmeans_plusplus(local, k, stream(entropy, "k-means||", "recluster").integers(2**63))
        else:
            seeds, e = plusplus_in_memory(cands, weights, k, stream(entropy, "k-means||", "recluster"))
        result = lloyd(local, seeds, max_iter=recluster_iter, tol=0.0)
    return result.centers, e + result.distance_evals


class _Shared:
    """One sweep's k-means|| candidates: drawn on its engine at the first k's seeding with the largest k's ℓ,
    then kept for every later k (with the same entropy: a sweep's)."""

    def __init__(self, engine, ell):
        self.engine, self.ell, self.entropy, self.drawn = engine, ell, None, None

    def serves(self, engine, entropy, ell):
        return engine is self.engine and ell <= self.ell and self.entropy in (None, entropy)

    def candidates(self, engine, entropy, max_rounds):
        """(candidates, weights, evals): the evaluations are the first k's; later ones spend none here."""
        if self.drawn is None:
            self.entropy = entropy
            self.drawn = parallel_candidates(engine, self.ell, entropy, max_rounds)
            return self.drawn
        return (*self.drawn[:2], 0)


_SHARED = contextvars.ContextVar("kmeans_parallel_shared", default=None)


@contextlib.contextmanager
def shared_candidates(engine, ell):
    """k-means||'s candidates drawn once on ``engine``, with ℓ = ``ell`` (the largest k's), for every seeding
    on it within (a sweep's; a working set's seeding draws its own): each k's seeds are its recluster of them.
    Seeds of a k below the largest differ from a separate fit's, whose rounds draw ℓ = factor·k; the largest
    k's are the same."""
    token = _SHARED.set(_Shared(engine, ell))
    try:
        yield
    finally:
        _SHARED.reset(token)


def plusplus_in_memory(X, w, k, rng, n_local_trials=None):
    """Greedy weighted k-means++ over rows the driver holds (float64 (M, D), weights > 0), in one kernel call:
    the first centre ∝ w, then 2 + ⌊ln k⌋ trials per centre. Returns the centres and the evaluations."""
    trials = n_local_trials or 2 + int(np.log(k))
    first = int(np.searchsorted(np.cumsum(w), rng.random() * w.sum(), side="right"))
    chosen = np.empty(k, np.int64)
    evals = greedy_plusplus(
        np.ascontiguousarray(X, dtype=np.float64),
        np.ascontiguousarray(w, dtype=np.float64),
        min(first, len(w) - 1),
        rng.random((k - 1, trials)),
        gemm_tolerance(np.float64, X.shape[1]),
        chosen,
    )
    return X[chosen].astype(np.float64), int(evals)


def afkmc2(engine, k, entropy, chain_length=20):
    """AFK-MC2: first centre ∝ w; proposal q = ½ w d²(x, c1)/Σ w d² + ½ w/Σ w (one pass); for each further
    centre a Markov chain of ``chain_length`` proposals (the first draw included) with acceptance
    (score_y/q_y)/(score_x/q_x) > U, score = w·min_j d²(·, c_j). The proposals do not depend on the chains,
    so all are drawn at once and stay where they were drawn, each chunk keeping their min d² to the chosen
    centres. One round trip per ``CHAINS_PER_ROUND`` centres: the workers commit the centres chosen since
    the last round and return the next chains' proposals with their min d² (O(m·k·d / P) each round); the
    driver completes each chain's d² with the centres chosen earlier in the round and runs its acceptance.
    The driver receives m·n proposal rows per round and evaluates a share ≈ n/k of the distances."""
    first = first_center(engine, "afkmc2", entropy).astype(np.float64)
    rng = stream(entropy, "afkmc2", "driver")
    m = chain_length * (k - 1)
    centers = np.empty((k, engine.n_features))
    centers[0] = first[0]
    chosen, plan = [1], [None]
    with engine.state("afkmc2", _afk_build, lambda: (first, plan[0], centers[: chosen[0]])):
        shares = engine.reduce(_afk_masses, None, MASSES)
        masses = proposal_masses(shares)
        counts = rng.multinomial(m, masses / masses.sum())
        slot_of = np.argsort(rng.permutation(m))  # the proposal at place i in chunk order goes to this slot
        u = rng.random(m).reshape(-1, chain_length) if k > 1 else None
        plan[0] = (counts, shares.d2, shares.w, slot_of)
        engine.reduce(_afk_draw, plan[0])
        evals = engine.n_samples
        with progress.phase("seeding afkmc2 chains", k - 1, "chain") as shown:
            for j in range(1, k, CHAINS_PER_ROUND):
                n = min(CHAINS_PER_ROUND, k - j)
                new = centers[max(1, j - CHAINS_PER_ROUND) : j] if j > 1 else centers[:0]
                chained = engine.reduce(_afk_chains, Chains(j, list(new), n, chain_length), CHAINS)
                order = np.argsort(chained.slots)
                d2, rows, w, q = (chained.d2[order], chained.rows[order], chained.w[order], chained.q[order])
                evals += int(chained.evals)
                for b in range(n):
                    sl = slice(b * chain_length, (b + 1) * chain_length)
                    evals += update_mind(rows[sl], centers[j : j + b], d2[sl])
                    centers[j + b] = rows[sl][accepted(w[sl] * d2[sl] / q[sl], u[j + b - 1])]
                    chosen[0] = j + b + 1
                    shown.update()
    return centers, evals


def accepted(score, u):
    """The Markov chain over one centre's proposals: the state moves to proposal t when
    score_t / score_x > u_t (or the state's score is 0); returns the final state."""
    x = 0
    for t in range(1, len(score)):
        if score[x] == 0 or score[t] / score[x] > u[t]:
            x = t
    return x


def random_rows(engine, k, entropy):
    ids = stream(entropy, "random").choice(engine.n_samples, size=k, replace=False)
    return engine.take(np.sort(ids)).astype(np.float64), 0


def seed_rows(engine, rows, weights, k, init, entropy):
    """``seed`` on rows the driver holds (a sample of the engine's), seeded where ``working_set`` puts them."""
    with engine.working_set(rows, weights, entropy) as work:
        return seed(work, k, init, entropy)


def sample_ids(engine, entropy, m, tag):
    """The row ids ``seed_sample`` seeds on: m drawn uniformly with replacement from the stream ``tag`` (at
    most all rows); a method may fetch them in a gather of its own."""
    return stream(entropy, tag, "seeding").integers(0, engine.n_samples, min(m, engine.n_samples))


def seed_sample(engine, k, init, entropy, m, tag):
    """``seed`` on m rows drawn uniformly with replacement (their weights kept) from the stream ``tag``: the
    stochastic methods' seeding, whose cost must not grow with N (scikit-learn's MiniBatchKMeans seeds on
    3·batch_size rows); a given array is returned as it is."""
    if not isinstance(init, str):
        return seed(engine, k, init, entropy)
    rows, w = engine.take(sample_ids(engine, entropy, m, tag), weights=True)
    return seed_rows(engine, rows, w, k, init, entropy)


def seed(engine, k, init, entropy, *, n_local_trials=None, oversampling_factor=2.0, init_max_iter=30, chain_length=20):
    """Initial centres (k, d) float64 and the distance evaluations spent on them."""
    if not isinstance(init, str):
        return np.array(init, dtype=np.float64), 0
    if init == AUTO:
        init = "k-means++" if engine.sparse else "k-means||"
    if init == "k-means++":
        return kmeans_plusplus(engine, k, entropy, n_local_trials)
    if init == "k-means||":
        return kmeans_parallel(engine, k, entropy, oversampling_factor, init_max_iter)
    if init == "afkmc2":
        return afkmc2(engine, k, entropy, chain_length)
    return random_rows(engine, k, entropy)
