"""Stochastic Backward Euler k-means (``algo="sbe"``): implicit gradient steps x_{k+1} = x_k − γ ∇f(x_{k+1})
on f = QE/(2N), each solved by a stochastic fixed-point iteration over mini-batches whose running average
is the next iterate; the step γ decays geometrically.

P. Yin, M. Pham, A. Oberman, S. Osher, "Stochastic Backward Euler: An Implicit Gradient Descent Algorithm
for k-means Clustering", J. Sci. Comput. 77, 2018, doi:10.1007/s10915-018-0744-4 (arXiv:1710.07746).
The paper's formulas did not survive in its text; the steps below are a reconstruction, checked against
its Iris figures (tests/test_sbe.py) and its 784-d table (benchmarks/bench_sbe.py).

  1. seed on init_size rows drawn uniformly (k-means|| by default; random rows, init="random", with
     step_size=1.0 is the paper's protocol); γ = step_size · k
  repeat omaxit times (an outer step)
  2. draw_batches: imaxit mini-batches of b rows (without replacement within a batch), gathered for
     several outer steps at once (the batches do not depend on the iterates)
  3. backward_euler_step: y = z = x; per batch y ← x − γ g_B(y), z ← α z + (1 − α) y; x ← z
  4. γ ← decay · γ
The objective of an outer step is f at its starting centres estimated on its first batch (that batch's
assignment costs nothing more); ``eval_every`` adds f on all rows (a pass over the data each time), and
the fit ends with the exact QE of its centres.

The batches are drawn from one random stream keyed by the outer step and gathered by global row, so the
model depends on random_state only. The driver holds the centres and one block of batches, O(k·D +
steps·imaxit·b·D) with the block capped at ``batches.GATHER_BYTES`` (``STREAMED_GATHER_BYTES`` streamed),
whatever N; the steps run in its process. The step-size schedule is the paper's lost detail: γ0 =
step_size · k makes the dimensionless step γ|C_j|/N ≈ step_size for balanced clusters; both are parameters.
"""

import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._params import FiniteArray, Interval, NoneOK, Options
from .._random import stream
from ..blocks.batches import steps_per_gather
from ..blocks.lloyd import quantization_error
from ..blocks.seeding import ROW_BYTES, SEEDERS, seed_sample
from ..kernels.backward_euler import backward_euler_step
from ..kernels.distance import gemm_tolerance, rows_per_block
from ..loop import FitResult
from .registry import BIG, COUNT, AlgorithmSpec, centres, final_pass, register

# centres beyond this many times the data's largest magnitude have left the data: the iteration diverged
ESCAPE = 1e3


@dataclass
class SBEConfig:
    n_clusters: int = 8
    init: object = "k-means||"
    init_size: int | None = None
    batch_size: int = 1000
    omaxit: int = 150
    imaxit: int = 10
    alpha: float = 0.75
    step_size: float = 0.3
    decay: float = 0.95
    eval_every: int | None = None

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "init": [Options(SEEDERS), FiniteArray()],
        "init_size": [Interval(numbers.Integral, 1, None), NoneOK()],
        "batch_size": [Interval(numbers.Integral, 1, None)],
        "omaxit": [Interval(numbers.Integral, 1, None)],
        "imaxit": [Interval(numbers.Integral, 1, None)],
        "alpha": [Interval(numbers.Real, 0, 1, "left")],
        "step_size": [Interval(numbers.Real, 0, None, "neither")],
        "decay": [Interval(numbers.Real, 0, 1, "right")],
        "eval_every": [Interval(numbers.Integral, 1, None), NoneOK()],
    }

    docs: ClassVar = {
        "init": "As k-means' init, run on init_size sampled rows; 'random' (distinct rows) is the paper's protocol.",
        "init_size": "Rows drawn (uniformly, with replacement) to seed on (None: max(imaxit * batch_size, "
        "100 * n_clusters); at most all rows).",
        "batch_size": "Rows per mini-batch of the inner fixed-point iteration.",
        "omaxit": "Outer (backward Euler) steps.",
        "imaxit": "Mini-batches per outer step (inner fixed-point iterations).",
        "alpha": "Averaging weight of the inner iterates: z <- alpha z + (1 - alpha) y.",
        "step_size": "First step gamma0 = step_size * n_clusters (a dimensionless step of about step_size "
        "per balanced cluster). 1.0 lets random seeds escape (the paper's Iris protocol); from a "
        "k-means|| seeding it throws the centres of large clusters around (+11 % QE on the image "
        "patches at k = 50, against +4.8 % at 0.3).",
        "decay": "gamma is multiplied by decay after every outer step.",
        "eval_every": "Also compute f on all rows after every this many outer steps (a pass over the data each; "
        "None: only the final QE).",
    }


def draw_batches(entropy, outer, n_samples, batch_size, imaxit):
    """Step 2's global row ids of one outer step, (imaxit, b): each batch without replacement."""
    rng = stream(entropy, "sbe", outer)
    b = min(batch_size, n_samples)
    return np.stack([rng.choice(n_samples, b, replace=False) for _ in range(imaxit)])


def draw_block(engine, entropy, first, last, cfg):
    """The batches of outer steps [first, last), (steps, imaxit, b, D): one gather."""
    ids = np.stack([draw_batches(entropy, o, engine.n_samples, cfg.batch_size, cfg.imaxit) for o in range(first, last)])
    return engine.take(ids.ravel()).reshape(ids.shape + (engine.n_features,))


def seeding_rows(cfg, n_samples):
    """init_size, else max(imaxit·b, 100·k), at most all rows."""
    return min(n_samples, cfg.init_size or max(cfg.imaxit * cfg.batch_size, 100 * cfg.n_clusters))


def fit(engine, cfg, entropy, loop):
    N, k = engine.n_samples, cfg.n_clusters
    restored = loop.restored
    if restored is None:
        x, seed_evals = seed_sample(engine, k, cfg.init, entropy, seeding_rows(cfg, N), "sbe")
        gamma, evals_total = cfg.step_size * k, seed_evals
    else:  # a resumed fit: the batches are keyed by the outer step, so the centres and γ are the state
        x, seed_evals, gamma, evals_total = (restored[name] for name in ("x", "seed_evals", "gamma", "evals"))
    loop.keep(seed_evals=int(seed_evals))
    z = np.empty_like(x)
    limit = ESCAPE * (engine.summary.max_abs + 1.0)
    tol, block = gemm_tolerance(engine.dtype, engine.n_features), rows_per_block(k)
    batches, first = None, None
    for outer in loop:
        if first is None or not first <= outer < first + len(batches):
            first = outer
            length = steps_per_gather(engine, cfg.imaxit * cfg.batch_size, loop.max_iter - outer)
            batches = draw_block(engine, entropy, outer, outer + length, cfg)
        qe = backward_euler_step(batches[outer - first], x, gamma, cfg.alpha, tol, block, z)
        if not np.all(np.isfinite(z)) or float(np.abs(z).max()) > limit:
            raise FloatingPointError(
                f"sbe diverged at outer step {outer + 1}: the centres left the data (|c| > {limit:.3g}) with "
                f"gamma = {gamma:.3g}; lower step_size (now {cfg.step_size}) or raise batch_size"
            )
        x = z.copy()
        evals = batches[0].shape[0] * batches[0].shape[1] * k
        f, f_all = qe / (2 * batches.shape[2]), None
        if cfg.eval_every is not None and (outer + 1) % cfg.eval_every == 0:
            qe_all, e = quantization_error(engine, x)
            evals += e
            f_all = qe_all / (2 * engine.summary.total_weight)
        evals_total += evals
        loop.record(f, evals, None, centers=x, gamma=gamma, f_all_rows=f_all)
        gamma *= cfg.decay
        loop.save(lambda: {"x": x, "gamma": gamma, "evals": int(evals_total)})
    qe, e = final_pass(engine, x, loop=loop)
    # the paper runs omaxit outer steps and has no convergence test: converged_ is False
    return FitResult(
        x,
        qe,
        loop.n_iter,
        False,
        evals_total + e,
        loop.history,
        {"f_": qe / (2 * engine.summary.total_weight), "seeding_distance_evals": int(seed_evals)},
    )


def saved(cfg, n_samples, n_features):
    """What an sbe checkpoint holds: the centres and the step size."""
    return {"x": centres(cfg, n_features), "gamma": ("float", 0.0, BIG, False), "evals": COUNT, "seed_evals": COUNT}


register(
    AlgorithmSpec(
        name="sbe",
        config=SBEConfig,
        fit=fit,
        estimator="SBEKMeans",
        summary="stochastic backward Euler k-means: implicit steps solved by averaged mini-batch fixed-point "
        "iterations",
        reference="Yin, Pham, Oberman, Osher, J. Sci. Comput. 2018, doi:10.1007/s10915-018-0744-4",
        objective="f = QE / (2 b) of the step's starting centres on its first batch (f on all rows: f_all_rows)",
        loop_length="omaxit",
        weighted=False,
        unweighted_because="it draws uniform mini-batches",
        state_bytes=lambda cfg: ROW_BYTES,  # the seeder's; the batches keep none
        resumable=True,
        saved=saved,
    )
)
