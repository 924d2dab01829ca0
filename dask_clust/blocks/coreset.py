"""Lightweight coresets: a weighted sample on which any weighted algorithm runs.

O. Bachem, M. Lucic, A. Krause, "Scalable k-Means Clustering via Lightweight Coresets", KDD 2018,
doi:10.1145/3219819.3219973.

  1. u = the (weighted) mean of X                                   pass 1 (the engine's first pass)
  2. d²_n = ||x_n − u||², q_n = ½ w_n/Σw + ½ w_n d²_n/Σ w d²         each chunk's share of q from the
                                                                    first pass's per-chunk moments
  3. N' rows i.i.d. ∝ q with replacement, weight w_n/(N' q_n)       per-chunk Multinomial counts,
                                                                    then local sampling per chunk (pass 2)
Duplicates stay separate rows; Σ weights ≈ Σw (unbiased). All rows equal (Σ w d² = 0): q = w/Σw.
Input sample weights generalise the paper's unit weights (w_n = 1 gives its q and 1/(N' q)).

Step 2 takes a chunk's Σ w d² as Σ w ||x||² − 2 u·Σ w x + ||u||² Σ w from the first pass (no pass of its
own), which rounding makes slightly off the row-by-row sum; so a row's weight is w_n/(N' p_n) with p_n the
probability it was actually drawn with (its chunk's share times q_n over the chunk's own Σ q, computed as
it draws): unbiased whatever the shares. Where that difference cancels too many digits (data far from the
origin for its spread), the shares come from a pass of their own, row by row, as before.

``uniform_sample`` draws the same way with q = w/Σw (every row weighing Σw/size): vc-GMM re-estimates its
means on such a sample (``algorithms/vcgmm.py: refit_means``).
"""

import contextlib
import time
from typing import NamedTuple

import numpy as np

from .. import progress
from .._random import stream
from ..engine.combine import Fold, Rows
from ..errors import InvalidParameterError
from ..kernels.assign import update_mind
from ..kernels.sampling import draw_proportional


class WeightedSums(NamedTuple):
    """Σ w x and Σ w."""

    sums: np.ndarray
    weight: float


class Masses(NamedTuple):
    """Σ w d² and Σ w per chunk (in chunk order), and their totals (``MASSES``)."""

    chunk_d2: np.ndarray
    chunk_w: np.ndarray
    d2: float
    w: float


class Sampled(NamedTuple):
    """Rows drawn and their weights (the inverse of the probability each was drawn with, times w)."""

    rows: object
    weights: np.ndarray


class TwoSamples(NamedTuple):
    """A coreset's rows and weights, and those of a uniform sample drawn beside it."""

    rows: object
    weights: np.ndarray
    aside_rows: object
    aside_weights: np.ndarray


class ChunkWeights(NamedTuple):
    """Σ w per chunk, in chunk order."""

    weights: np.ndarray


def _weighted_sums(chunk, params) -> WeightedSums:
    return WeightedSums(chunk.w @ chunk.x.astype(np.float64), float(chunk.w.sum()))


def _d2(chunk, u):
    d2 = np.full(chunk.x.shape[0], np.inf)
    update_mind(chunk.x, u, d2)
    return d2


def chunk_masses(s, w):
    """A chunk's Σ w d² and Σ w, per chunk (for the per-chunk counts) and summed in chunk order (MASSES)."""
    return Masses(np.array([s]), np.array([w]), s, w)


MASSES = (Rows(), Rows(), Fold(), Fold())


def proposal_masses(m: Masses):
    """Each chunk's share of q = ½ w d²/Σ w d² + ½ w/Σ w (all of it ∝ w when Σ w d² = 0), from the
    chunks' Σ w d², Σ w and their totals: the proposal of the coreset and of AFK-MC2."""
    return 0.5 * m.chunk_d2 / m.d2 + 0.5 * m.chunk_w / m.w if m.d2 > 0 else m.chunk_w / m.w


def proposal(w, d2, S, W):
    """Per row, q = ½ w d²/S + ½ w/W (∝ w when S = Σ w d² is 0): the proposal of the lightweight coreset and
    of AFK-MC2's chains (Bachem et al., KDD 2018 and NeurIPS 2016), whose chunk shares are
    ``proposal_masses``."""
    return 0.5 * w * d2 / S + 0.5 * w / W if S > 0 else w / W


def _masses(chunk, u) -> Masses:
    """Pass 2: this chunk's Σ w d² and Σ w (MASSES)."""
    return chunk_masses(float(np.dot(chunk.w, _d2(chunk, u))), float(chunk.w.sum()))


class Draw(NamedTuple):
    """``_sample``'s parameters: the proposal's centre u (1 × D; None: ∝ w), each chunk's count, Σ w d² (S)
    and Σ w (W), the draw's size and stream tag, and the chunks' shares of q when not exact (or None)."""

    u: np.ndarray | None
    counts: np.ndarray
    S: float
    W: float
    size: int
    tag: str
    shares: np.ndarray | None


def _sample(chunk, params: Draw) -> Sampled:
    """Draw this chunk's count of rows ∝ q (S = 0: ∝ w); return (rows, their weights). Needs no state (d² is
    computed again), so it also runs as a one-shot task where the chunk's rows live. ``shares``: the chunks'
    shares of q the counts were drawn with, when not the chunks' exact Σ q: a row then weighs
    w/(size · share · q/Σ_chunk q), the probability it was drawn with."""
    m = int(params.counts[chunk.index])
    if m == 0:
        return Sampled(chunk.x[:0], np.empty(0))
    q = proposal(chunk.w, _d2(chunk, params.u) if params.S > 0 else None, params.S, params.W)
    idx = np.sort(draw_proportional(q, chunk.rng(params.tag), m))
    p = q[idx] if params.shares is None else params.shares[chunk.index] * q[idx] / q.sum()
    return Sampled(chunk.x[idx], chunk.w[idx] / (params.size * p))


def _mean(engine):
    """Step 1: the weighted mean of the rows, from the engine's first pass (its per-chunk Σ w x when
    weighted), or from a pass of its own (an engine given its summary)."""
    if getattr(engine.source, "weights", None) is None:
        return engine.summary.mean
    if engine.chunk_moments is not None:
        w, wx, _ = engine.chunk_moments
        return wx.sum(axis=0) / w.sum()
    out = engine.reduce(_weighted_sums)
    return out.sums / out.weight


# the digits step 2's sum may lose to cancellation before the shares come from a pass of their own: its
# error is within about d·2^-52 of Σ w ||x||², kept below a millionth of Σ w d²
CANCELLATION = 1e-6


def chunk_shares(engine, u):
    """Each chunk's Σ w d² about u, Σ w, and their totals (MASSES) from the first pass's per-chunk moments,
    or None where there are none (an engine given its summary) or cancellation would make them inexact."""
    if engine.chunk_moments is None:
        return None
    w, wx, wxx = engine.chunk_moments
    s = np.maximum(wxx - 2.0 * (wx @ u) + w * float(u @ u), 0.0)
    S, W = float(s.sum()), float(w.sum())
    if not S > CANCELLATION * float(wxx.sum()):
        return None
    return Masses(s, w, S, W)


def coreset_draw(engine, size, entropy):
    """How many of the ``size`` rows each chunk draws, and the parameters of ``_sample`` that draws them (the
    driver handles per-chunk counts, never rows): from the first pass alone (``chunk_shares``), or from
    a pass of their own."""
    u = _mean(engine)
    shared = chunk_shares(engine, u)
    m = engine.reduce(_masses, u[None, :], MASSES) if shared is None else shared
    masses = proposal_masses(m)
    shares = masses / masses.sum()
    counts = stream(entropy, "coreset", "counts").multinomial(size, shares)
    return Draw(u[None, :], counts, m.d2, m.w, size, "coreset", None if shared is None else shares), counts


def _chunk_weight(chunk, _) -> ChunkWeights:
    return ChunkWeights(np.array([float(chunk.w.sum())]))


class TwoDraws(NamedTuple):
    """``_sample_both``'s parameters: the coreset's draw and the uniform sample's."""

    coreset: Draw
    aside: Draw


def _sample_both(chunk, params: TwoDraws) -> TwoSamples:
    """``_sample`` of two draws (the coreset, and a uniform sample set aside) from one read of the chunk."""
    coreset, aside = _sample(chunk, params.coreset), _sample(chunk, params.aside)
    return TwoSamples(coreset.rows, coreset.weights, aside.rows, aside.weights)


def uniform_draw(engine, size, entropy):
    """How many of ``size`` rows drawn ∝ w each chunk draws (from the chunks' Σ w, read without the rows),
    the parameters of ``_sample`` that draws them, and the entropy of the engine over them."""
    w = engine.reduce(_chunk_weight, None, (Rows(),)).weights
    counts = stream(entropy, "uniform", "counts").multinomial(size, w / w.sum())
    sub_entropy = int(stream(entropy, "uniform", "engine").integers(2**63))
    return Draw(None, counts, 0.0, float(w.sum()), size, "uniform", None), counts, sub_entropy


@contextlib.contextmanager
def uniform_sample(engine, size, entropy, drawn=None):
    """An engine over ``size`` rows drawn ∝ w with replacement, each weighing Σw/size (an unbiased sample
    of the rows' mass, like the coreset with q = w/Σw). The driver handles per-chunk Σw and counts.
    ``drawn``: the same rows drawn already, with the coreset (``coreset_and_sample``)."""
    if drawn is not None:
        with engine.working_set(*drawn) as rows:
            yield rows
        return
    params, counts, sub_entropy = uniform_draw(engine, size, entropy)
    with engine.sample(_sample, params, counts, sub_entropy) as rows:
        yield rows


def lightweight_coreset(engine, size, entropy):
    """``size`` rows drawn ∝ q with replacement and their weights: (rows in the data's dtype, float64),
    brought to this process."""
    params, _ = coreset_draw(engine, size, entropy)
    return engine.reduce(_sample, params, (Rows(), Rows()))


def default_size(n_samples, n_clusters, per_cluster=64):
    """The vc-GMM paper's default N' = min(N, max(2^15, 64·C)), or ``per_cluster`` rows a cluster in place of
    its 64 (a model whose components have more parameters to estimate)."""
    return int(min(n_samples, max(2**15, per_cluster * n_clusters)))


@contextlib.contextmanager
def working_set(engine, size, entropy, n_clusters, phases=None):
    """The engine an algorithm iterates on: a lightweight coreset of ``size`` rows (one partition when it
    fits one worker), or ``engine`` itself when ``size`` is None. Records phases["coreset"] (seconds) when
    given a dict."""
    with coreset_and_sample(engine, size, None, entropy, n_clusters, phases) as (work, _):
        yield work


@contextlib.contextmanager
def coreset_and_sample(engine, size, aside, entropy, n_clusters, phases=None):
    """``working_set``, and ``aside`` rows drawn ∝ w (``uniform_sample``'s) in the same pass when both sets
    come to this process: (the engine, (rows, weights, entropy) for ``uniform_sample(drawn=)``, or None)."""
    phases = {} if phases is None else phases
    if size is not None and n_clusters > size:
        raise InvalidParameterError(
            f"n_clusters={n_clusters} exceeds coreset_size={size}: a coreset needs "
            f"at least one row per cluster (use coreset_size >= n_clusters or None)"
        )
    if size is None:
        phases["coreset"] = 0.0
        yield engine, None
        return
    t = time.perf_counter()
    drawn = None
    with contextlib.ExitStack() as stack:
        with progress.phase(f"coreset of {size:,} rows", 1, "draw") as shown:
            params, counts = coreset_draw(engine, size, entropy)
            sub_entropy = int(stream(entropy, "coreset", "engine").integers(2**63))
            if aside and engine.samples_here(size) and engine.samples_here(aside):
                other, _, other_entropy = uniform_draw(engine, aside, entropy)
                both = engine.reduce(_sample_both, TwoDraws(params, other), (Rows(),) * 4)
                work = stack.enter_context(engine.working_set(both.rows, both.weights, sub_entropy))
                drawn = (both.aside_rows, both.aside_weights, other_entropy)
            else:
                work = stack.enter_context(engine.sample(_sample, params, counts, sub_entropy))
            shown.update()
        phases["coreset"] = time.perf_counter() - t
        yield work, drawn
