"""Variance-reduced k-means (``algo="vrkm"``): epochs of one full assignment pass with position
correction, then T single-sample steps with a constant learning rate whose gradients are corrected by
the same sample's gradient at the epoch's anchor.

Y. Zhao, Y. Ming, X. Liu, E. Zhu, K. Zhao, J. Yin, "Large-scale k-means clustering via variance
reduction", Neurocomputing 307, 2018, doi:10.1016/j.neucom.2018.03.059 (Alg. 3 "vrkm", Alg. 4
"vrkm++"); reference code YaweiZhao/VRKM_sofia-ml (only VRKM++ runs there). An empty cluster keeps its
centre where that code zeroes it.

  repeat (an epoch)
  1. anchor_pass: a_n = nearest centre under C̃ for every row; the pass's QE is the epoch's objective
  2. position_correction: A = C0 = the clusters' means (a cluster with no row keeps its centre)
     ("vrkm" also computes the batch gradient ∇f̃(A) over the anchor partition, 0 up to rounding)
  3. variance_reduced_steps: T rows drawn uniformly; j = nearest under C_t;
     j == a: c_j −= η (c_j − A_j);  else c_j −= η (c_j − x), c_a += η (A_a − x)   ("vrkm": − η ∇f̃(A))
  4. C̃ = C_T
  until the epoch QE changes by less than tol (relative), or rises above the lowest so far, or max_epochs.

Distributed: step 3 runs chunk-local: every chunk runs its share of the T steps (∝ its rows)
sequentially on its own rows, with its own random stream, from the same C0, and returns C_T − C0; the
driver applies C0 + Σ (C_T − C0) in chunk order. With one chunk this is exactly the sequential algorithm;
with several it is a first-order-in-η approximation of it (the chunks do not see each other's steps
within an epoch). The model depends on the chunking, not on the number of workers.
"""

import contextlib
import numbers
import warnings
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from .._params import FiniteArray, Interval, NoneOK, Options
from ..blocks.seeding import ROW_BYTES, SEEDERS, seed
from ..engine.combine import Fold, Sum
from ..kernels.assign import Prepared, accumulate, nearest
from ..kernels.variance_reduced import variance_reduced_steps
from .registry import COUNT, MAYBE, AlgorithmSpec, centres, finish, register


@dataclass
class VRKMConfig:
    n_clusters: int = 8
    variant: str = "vrkm++"
    init: object = "k-means++"
    learning_rate: float | None = None
    epoch_size: object = None
    max_epochs: int = 100
    tol: float = 1e-4

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "variant": [Options(("vrkm++", "vrkm"))],
        "init": [Options(SEEDERS), FiniteArray()],
        "learning_rate": [Interval(numbers.Real, 0, None, "neither"), NoneOK()],
        "epoch_size": [Interval(numbers.Integral, 0, None), Interval(numbers.Real, 0, 1, "right"), NoneOK()],
        "max_epochs": [Interval(numbers.Integral, 1, None)],
        "tol": [Interval(numbers.Real, 0, None, "left")],
    }

    docs: ClassVar = {
        "variant": "'vrkm++' (Alg. 4, with position correction only) or 'vrkm' (Alg. 3, with the batch "
        "gradient correction).",
        "learning_rate": "eta, the constant step of the variance-reduced updates (None: n_clusters / n_samples).",
        "epoch_size": "T, single-row steps per epoch: an int, a fraction of the rows in (0, 1], or None (all rows).",
        "max_epochs": "Most epochs (one full assignment pass plus T steps each).",
        "tol": "Stop when an epoch's QE is less than tol (relative) below the lowest so far (it changed by less "
        "than tol, or it rose).",
    }


# ---------------------------------------------------------------- per-chunk steps


class Anchor(NamedTuple):
    """A chunk's part of the anchor pass: Σ x and the count per anchor label, the QE, evaluations."""

    sums: np.ndarray
    counts: np.ndarray
    qe: float
    evals: np.int64


class Gradient(NamedTuple):
    """VRKM's batch gradient before its mean: Σ (A_a − x) per anchor label."""

    sums: np.ndarray


class EpochSteps(NamedTuple):
    """A chunk's share of the epoch's steps: C_T − C0 (folded onto A by the call's combine: the new centres),
    steps off the anchor label, evaluations."""

    centres: np.ndarray
    moved: np.int64
    evals: np.int64


def _anchor_pass(chunk, centers) -> Anchor:
    """Step 1: keep the rows' labels as the epoch's anchor partition, with a bound on their distance to
    every other centre (it spares most steps a search); (Σ x, count, QE, evaluations). Also the state's
    builder: a rebuilt partition recomputes the epoch's anchor from its centres."""
    n = chunk.x.shape[0]
    lower2 = np.empty(n)
    labels, mind, evals = nearest(chunk.x, centers, mind2=lower2)
    k, d = centers.C.shape
    sums, counts = np.zeros((k, d)), np.zeros(k)
    qe = accumulate(chunk.x, chunk.w, labels, mind, sums, counts)
    chunk.state["vrkm"] = (labels, lower2)
    return Anchor(sums, counts, qe, np.int64(evals))


def _gradient_pass(chunk, A) -> Gradient:
    """Step 2 of "vrkm": Σ (A_a − x) over the chunk's rows, by anchor label."""
    labels = chunk.state["vrkm"][0]
    out = np.zeros_like(A)
    np.add.at(out, labels, A[labels] - chunk.x)
    return Gradient(out)


class Epoch(NamedTuple):
    """``_steps``' parameters: the anchor's centres C̃ and A, the step size η, each chunk's
    share of the T steps, the epoch (its draws' stream), and VRKM's batch gradient (None for VRKM++)."""

    anchor: object
    A: np.ndarray
    eta: float
    shares: np.ndarray
    epoch: int
    grad: np.ndarray | None


def _steps(chunk, params: Epoch) -> EpochSteps:
    """Step 3 on the chunk's share of the T steps: (C_T − C0, steps off the anchor label, evaluations)."""
    Ct, A, eta, epoch, grad = params.anchor, params.A, params.eta, params.epoch, params.grad
    T = int(params.shares[chunk.index])
    C = A.copy()
    if T == 0:
        return EpochSteps(C - A, np.int64(0), np.int64(0))
    idx = chunk.rng("vrkm", epoch).integers(0, chunk.n, T)
    labels, lower2 = chunk.state["vrkm"]
    moved, evals = variance_reduced_steps(chunk.x, idx, labels, lower2, Ct, A, C, eta)
    if grad is not None:  # the batch gradient enters every step; it does not depend on C, so it sums up
        C -= T * eta * grad
    return EpochSteps(C - A, moved, evals)


# ---------------------------------------------------------------- driver


def epoch_steps(cfg, n_samples):
    """T: ``epoch_size`` steps, a fraction of N, or N."""
    size = cfg.epoch_size
    if size is None:
        return n_samples
    if isinstance(size, numbers.Integral):
        return int(size)
    return int(round(size * n_samples))


def chunk_shares(T, starts):
    """T steps split in proportion to the chunks' rows (cumulative rounding: the shares sum to T)."""
    starts = np.asarray(starts, np.float64)
    edges = np.floor(T * starts / starts[-1] + 0.5).astype(np.int64)
    return np.diff(edges)


def position_correction(sums, counts, centers):
    """Step 2: A = the clusters' means; a cluster without rows keeps its centre."""
    A = centers.copy()
    live = counts > 0
    A[live] = sums[live] / counts[live, None]
    return A


@contextlib.contextmanager
def diverged(eta, loop):
    """A learning rate the centres run away with overflows the exact sums of the next pass; say so in the
    fit's own terms rather than the engine's (whose message blames the data's scale)."""
    try:
        yield
    except FloatingPointError as exc:
        raise FloatingPointError(
            f"vrkm diverged after {loop.n_iter} epochs: with learning_rate={eta:.3g} the "
            "centres ran away from the data (their sums overflowed); lower learning_rate "
            "(default n_clusters / n_samples)"
        ) from exc


def fit(engine, cfg, entropy, loop):
    N, k = engine.n_samples, cfg.n_clusters
    eta = cfg.learning_rate if cfg.learning_rate is not None else k / N
    T = epoch_steps(cfg, N)
    shares = chunk_shares(T, engine.source.starts)
    restored = loop.restored  # a resumed fit: the state is the centres (the anchor pass rebuilds the rows')
    if restored is None:
        C, seed_evals = seed(engine, k, cfg.init, entropy)
        evals_total, best, warned = seed_evals, None, False
    else:
        C, seed_evals = restored["C"], restored["seed_evals"]
        evals_total, best, warned = restored["evals"], restored["best"], restored["warned"]
    loop.keep(seed_evals=int(seed_evals))
    anchor = [None]
    with (
        engine.state("vrkm", _anchor_pass, lambda: Prepared(anchor[0], engine.dtype), build=False),
        diverged(eta, loop),
    ):
        for epoch in loop:
            C_anchor = anchor[0] = C
            anchored = engine.reduce(_anchor_pass, Prepared(C, engine.dtype))
            qe, evals, counts = anchored.qe, anchored.evals, anchored.counts
            A = position_correction(anchored.sums, counts, C)
            grad = None
            if cfg.variant == "vrkm":
                g = engine.reduce(_gradient_pass, A).sums
                grad = np.where(counts[:, None] > 0, g / np.maximum(counts, 1)[:, None], 0.0)
            C, moved = A.copy(), 0
            if T:  # C = A + the chunks' C_T − C0, added in chunk order
                params = Epoch(C_anchor, A, eta, shares, epoch, grad)
                stepped = engine.reduce(_steps, params, (Fold(A), Sum(), Sum()))
                C, moved = stepped.centres, stepped.moved
                evals += stepped.evals
            evals_total += int(evals)
            loop.record(qe, evals, moved, centers=C, epoch_size=T, learning_rate=eta)
            # the paper's rule (the epoch QE changed by less than tol) while the QE falls; an epoch above the
            # best one ends the fit too: with a constant step the QE ends up wandering by more than tol
            # (100 epochs at k = 200 on the image patches without it)
            if best is not None and best - qe < cfg.tol * qe:
                loop.converged = True
            if best is not None and qe > 2 * best and not warned:
                warned = True
                warnings.warn(
                    f"vrkm: the epoch QE grew from {best:.6g} to {qe:.6g}; with {len(shares)} chunks "
                    f"summing their steps, learning_rate={eta:.3g} overshoots (each chunk takes about "
                    f"{T / len(shares) / k:.3g} steps per centre). Lower learning_rate or use fewer, larger "
                    "chunks.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            best = qe if best is None else min(best, qe)
            loop.save(lambda: {"C": C, "evals": int(evals_total), "best": best, "warned": warned})
    return finish(
        engine,
        C,
        loop,
        evals_total,
        {"learning_rate_": eta, "epoch_size_": T, "seeding_distance_evals": int(seed_evals)},
    )


def saved(cfg, n_samples, n_features):
    """What a vrkm checkpoint holds: the centres (the anchor pass rebuilds the rows' state)."""
    return {"C": centres(cfg, n_features), "evals": COUNT, "best": MAYBE, "warned": ("bool",), "seed_evals": COUNT}


register(
    AlgorithmSpec(
        name="vrkm",
        config=VRKMConfig,
        fit=fit,
        estimator="VRKMeans",
        summary="variance-reduced k-means (VRKM++ / VRKM): position-corrected epochs, constant-rate steps",
        reference="Zhao et al., Neurocomputing 2018, doi:10.1016/j.neucom.2018.03.059",
        objective="QE of the epoch's anchor pass over all rows",
        loop_length="max_epochs",
        weighted=False,
        unweighted_because="it draws rows uniformly",
        state_bytes=lambda cfg: max(ROW_BYTES, 4 + 8),  # the anchor's label (int32) and lower bound (float64)
        resumable=True,
        saved=saved,
    )
)
