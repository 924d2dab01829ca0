"""Stochastic Backward Euler k-means (``algo="sbe"``): implicit gradient steps x_{k+1} = x_k − γ ∇f(x_{k+1})
on f = QE/(2N), each solved by a stochastic fixed-point iteration over mini-batches whose running average
is the next iterate; the step γ decays geometrically.

P. Yin, M. Pham, A. Oberman, S. Osher, "Stochastic Backward Euler: An Implicit Gradient Descent Algorithm
for k-means Clustering", J. Sci. Comput. 77, 2018, doi:10.1007/s10915-018-0744-4 (arXiv:1710.07746).
ALGORITHMS.md §4 gives the reconstruction followed here (the paper's formulas were lost).

  1. seed (random rows, the paper's protocol, by default); γ = step_size · k
  repeat omaxit times (an outer step)
  2. draw_batches: imaxit mini-batches of b rows (without replacement within a batch), one gather
  3. backward_euler_step: y = z = x; per batch y ← x − γ g_B(y), z ← α z + (1 − α) y; x ← z
  4. γ ← decay · γ; every ``eval_every`` outer steps and at the last, f = QE/(2N) on all rows

The batches are drawn from one random stream keyed by the outer step and gathered by global row, so the
model depends on random_state only. The step-size schedule is the paper's lost detail: γ0 = step_size · k
makes the dimensionless step γ|C_j|/N ≈ step_size for balanced clusters; both are parameters.
"""
import math
import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._params import ArrayOf2D, Interval, Options
from ..loop import FitResult
from .._random import stream
from ..errors import InputError
from ..kernels.backward_euler import backward_euler_step
from ..blocks.lloyd import quantization_error
from ..blocks.seeding import ROW_BYTES, SEEDERS, seed
from .registry import BIG, COUNT, AlgorithmSpec, centres, final_pass, register

# centres beyond this many times the data's largest magnitude have left the data: the iteration diverged
ESCAPE = 1e3


@dataclass
class SBEConfig:
    n_clusters: int = 8
    init: object = "random"
    batch_size: int = 1000
    omaxit: int = 150
    imaxit: int = 10
    alpha: float = 0.75
    step_size: float = 1.0
    decay: float = 0.95
    eval_every: int = 10

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "init": [Options(SEEDERS), ArrayOf2D()],
        "batch_size": [Interval(numbers.Integral, 1, None)],
        "omaxit": [Interval(numbers.Integral, 1, None)],
        "imaxit": [Interval(numbers.Integral, 1, None)],
        "alpha": [Interval(numbers.Real, 0, 1, "left")],
        "step_size": [Interval(numbers.Real, 0, None, "neither")],
        "decay": [Interval(numbers.Real, 0, 1, "right")],
        "eval_every": [Interval(numbers.Integral, 1, None)],
    }

    docs: ClassVar = {
        "init": "As k-means' init; 'random' (distinct rows) is the paper's protocol.",
        "batch_size": "Rows per mini-batch of the inner fixed-point iteration.",
        "omaxit": "Outer (backward Euler) steps.",
        "imaxit": "Mini-batches per outer step (inner fixed-point iterations).",
        "alpha": "Averaging weight of the inner iterates: z <- alpha z + (1 - alpha) y.",
        "step_size": "First step gamma0 = step_size * n_clusters (a dimensionless step of about step_size "
                     "per balanced cluster).",
        "decay": "gamma is multiplied by decay after every outer step.",
        "eval_every": "Compute the objective on all rows every this many outer steps (and after the last).",
    }


def draw_batches(entropy, outer, n_samples, batch_size, imaxit):
    """Step 2's global row ids, (imaxit, b): each batch without replacement."""
    rng = stream(entropy, "sbe", outer)
    b = min(batch_size, n_samples)
    return np.stack([rng.choice(n_samples, b, replace=False) for _ in range(imaxit)])


def fit(engine, cfg, entropy, loop):
    if getattr(engine.source, "weights", None) is not None:
        raise InputError("algo='sbe' draws uniform mini-batches and does not take sample_weight")
    N, k, D = engine.n_samples, cfg.n_clusters, engine.n_features
    restored = loop.restored
    if restored is None:
        x, seed_evals = seed(engine, k, cfg.init, entropy)
        gamma = cfg.step_size * k
        evals_total, qe, qe_of_x = seed_evals, None, False
    else:   # a resumed fit: the batches are keyed by the outer step, so the centres and γ are the state
        x, seed_evals, gamma = restored["x"], restored["seed_evals"], restored["gamma"]
        evals_total, qe, qe_of_x = restored["evals"], restored["qe"], restored["qe_of_x"]
    loop.keep(seed_evals=int(seed_evals))
    z = np.empty_like(x)
    limit = ESCAPE * (engine.summary.max_abs + 1.0)
    for outer in loop:
        ids = draw_batches(entropy, outer, N, cfg.batch_size, cfg.imaxit)
        batches = engine.take(ids.ravel()).reshape(ids.shape + (D,))
        backward_euler_step(batches, x, gamma, cfg.alpha, z)
        if not np.all(np.isfinite(z)) or float(np.abs(z).max()) > limit:
            raise FloatingPointError(
                f"sbe diverged at outer step {outer + 1}: the centres left the data (|c| > {limit:.3g}) with "
                f"gamma = {gamma:.3g}; lower step_size (now {cfg.step_size}) or raise batch_size")
        x = z.copy()
        evals = ids.size * k
        f = math.nan
        if (outer + 1) % cfg.eval_every == 0 or outer + 1 == cfg.omaxit:
            qe, e = quantization_error(engine, x)
            evals += e
            f = qe / (2 * engine.summary.total_weight)
        qe_of_x = not math.isnan(f)
        evals_total += evals
        loop.record(f, evals, None, centers=x, gamma=gamma)
        gamma *= cfg.decay
        loop.save(lambda: {"x": x, "gamma": gamma, "evals": int(evals_total), "qe": qe, "qe_of_x": qe_of_x})
    if not qe_of_x:  # stopped between evaluations
        qe, e = final_pass(engine, x)
        evals_total += e
    # the paper runs omaxit outer steps and has no convergence test: converged_ is False
    return FitResult(x, qe, loop.n_iter, False, evals_total, loop.history,
                     {"f_": qe / (2 * engine.summary.total_weight), "seeding_distance_evals": int(seed_evals)})


def saved(cfg, n_samples, n_features):
    """What an sbe checkpoint holds: the centres, the step size and the last QE."""
    return {"x": centres(cfg, n_features), "gamma": ("float", 0.0, BIG, False), "evals": COUNT,
            "qe": ("float", 0.0, BIG, True), "qe_of_x": ("bool",), "seed_evals": COUNT}


register(AlgorithmSpec(
    name="sbe", config=SBEConfig, fit=fit, estimator="SBEKMeans",
    summary="stochastic backward Euler k-means: implicit steps solved by averaged mini-batch fixed-point iterations",
    reference="Yin, Pham, Oberman, Osher, J. Sci. Comput. 2018, doi:10.1007/s10915-018-0744-4",
    objective="f = QE / (2 Σw) on all rows every eval_every outer steps and at the last, NaN between",
    weighted=False,
    state_bytes=lambda cfg: ROW_BYTES,   # the seeder's; the batches keep none
    resumable=True,
    saved=saved,
))
