"""The iteration driver: max_iter, history, logging, progress, a per-iteration callback.

Convergence is the algorithm's decision (its tol rule); the loop records, reports and stops.
``history`` holds one dict per iteration with fixed keys — iteration, objective, wall_s,
distance_evals, changed — plus algorithm-specific extras.
"""

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TypedDict

from . import progress as progress_

logger = logging.getLogger("dask_clust")

FIXED_KEYS = ("iteration", "objective", "wall_s", "distance_evals", "changed")


@dataclass
class FitResult:
    """What every algorithm's fit returns; the model's fitted attributes come from it.

    centers        (k, d) float64.
    objective      the exact quantization error Σ w min_c ||x − c||² of ``centers`` over every row of the
                   input, for every algorithm (vc-GMM with ``final_objective="coreset"``: the coreset's
                   weighted QE; None: not computed). What an algorithm optimised on the way (vc-GMM's free
                   energy, a coreset's QE, SBE's f = QE/2N) is in ``extras``.
    converged      the algorithm's own stopping rule held before its iteration limit (SBE has none: False).
    distance_evals point-to-centre distance evaluations, seeding and final pass included.
    history        one record per iteration (``Loop.record``); extras: algorithm-specific results.
    """

    centers: object
    objective: float
    n_iter: int
    converged: bool
    distance_evals: int
    history: list
    extras: dict = field(default_factory=dict)


class DeferredFinal:
    """A fit's final pass over every row left to its caller (a sweep, whose criteria pass gives the same QE
    bits): ``final_pass`` returns (None, 0) and sets ``taken``; the loops of one fit share it."""

    def __init__(self):
        self.taken = False


class IterationRecord(TypedDict):
    """One ``history_`` entry: these keys for every algorithm, plus the extras its module names.
    ``objective`` is the algorithm's own per-iteration figure (its registry entry says which)."""

    iteration: int
    objective: float
    wall_s: float
    distance_evals: int
    changed: int | None


class StopFit(Exception):
    """Raised by a callback to end a fit early; the model is returned as it stands."""


class Loop:
    """``for it in Loop(...): ...; loop.record(...)``; ``loop.converged = True`` then break.
    ``progress``: show the iterations as a phase (``progress``; a fit's own loop, not a seeder's);
    ``stops_early``: a stopping rule may end it before ``max_iter``, so the phase counts the iterations
    without a total (a bar at 2/300 with its ETA would say the fit has 298 to go)."""

    def __init__(
        self,
        name,
        max_iter,
        *,
        callback=None,
        progress=False,
        checkpoint=None,
        stops_early=False,
        figure="objective",
        final=None,
    ):
        self.name = name
        self.final = final  # a ``DeferredFinal``: the caller measures the returned centres over every row itself
        self.figure = figure  # what the bar and the log call the record's objective (``AlgorithmSpec.figure``)
        self.max_iter = int(max_iter)
        self.stops_early = stops_early
        self.callback = callback
        self.progress = progress
        self.history = []
        self.converged = False
        self.stopped = False
        self._t = None
        self._shown = progress_.SILENT
        self.checkpoint = checkpoint
        self._kept = {}
        if checkpoint is not None and checkpoint.restored is not None:
            self.history = list(checkpoint.meta["history"])
            self.converged = checkpoint.meta["converged"]

    @property
    def restored(self):
        """The state ``save`` wrote at the checkpoint this fit resumes from (scalars and arrays by name), or
        None: the algorithm continues from it instead of starting (``__iter__`` starts after its iteration)."""
        return None if self.checkpoint is None else self.checkpoint.restored

    @property
    def restored_rows(self):
        """The per-row state the checkpoint holds, as (its directory, each file's sha256) for
        ``Engine.load_rows``, or None."""
        return None if self.checkpoint is None else self.checkpoint.restored_rows

    def keep(self, **state):
        """State from before the iterations (the seeding's evaluations, ...) that every checkpoint carries."""
        self._kept.update(state)

    def save(self, state, rows=None):
        """After an iteration's record and its convergence decision: write a checkpoint of ``state`` (plus
        what ``keep`` holds) when one is due, and always when the loop ends here. ``state()`` maps names to
        arrays, numbers or None (called only when a checkpoint is written: it may gather); ``rows(directory)``
        writes the per-row state there and returns each file's sha256 (``Engine.dump_rows``)."""
        final = self.converged or self.stopped or self.n_iter >= self.max_iter
        if self.checkpoint is None or not self.checkpoint.due(self.n_iter, final):
            return
        with progress_.phase(f"checkpoint after iteration {self.n_iter}", 1, "write") as shown:
            self.checkpoint.write(self.n_iter, self.history, self.converged, {**self._kept, **state()}, rows)
            shown.update()

    def __iter__(self):
        with (
            progress_.phase(*self._phase()) if self.progress else contextlib.nullcontext(progress_.SILENT)
        ) as self._shown:
            if self.history:
                self._shown.update(len(self.history))
            for it in range(len(self.history) if not self.converged else self.max_iter, self.max_iter):
                self._t = time.perf_counter()
                yield it
                if self.converged or self.stopped:
                    break

    def _phase(self):
        if self.stops_early:
            return f"{self.name} iterations (at most {self.max_iter:,})", None, "it"
        return f"{self.name} iterations", self.max_iter, "it"

    @property
    def n_iter(self):
        return len(self.history)

    def record(self, objective, distance_evals, changed=None, centers=None, **extras) -> IterationRecord:
        """Append one iteration's record; the callback also sees ``centers`` (the centres after this
        iteration's update, read-only), which the history does not keep: QE-against-time curves need them,
        a long history of k × d arrays would not."""
        rec = {
            "iteration": len(self.history) + 1,
            "objective": float(objective),
            "wall_s": time.perf_counter() - self._t,
            "distance_evals": int(distance_evals),
            "changed": None if changed is None else int(changed),
        }
        rec.update(extras)
        self.history.append(rec)
        logger.debug(
            "%s iteration %d: %s %.6g, %.3f s, %d distance evaluations, changed %s",
            self.name,
            rec["iteration"],
            self.figure,
            rec["objective"],
            rec["wall_s"],
            rec["distance_evals"],
            changed,
        )
        self._shown.update(1, **{self.figure: f"{rec['objective']:.6g}"})
        if self.callback is not None:
            try:
                self.callback(rec if centers is None else {**rec, "centers": centers})
            except StopFit:
                logger.info("%s stopped by the callback after iteration %d", self.name, rec["iteration"])
                self.stopped = True
        return rec
