"""Progress of a fit's phases on stderr: loading, coreset, seeding, iterations, final pass.

``progress=None`` (the default of ``fit``, the estimators and the CLI) shows bars only when stderr is a
terminal, so logs of scripts, CI and schedulers get no carriage-return lines; ``True`` asks for progress
anywhere: bars on a terminal, one line per finished phase elsewhere; ``False`` is silent. Bars are tqdm's.
"""
import contextlib
import contextvars
import sys
import threading
import time

_MODE = contextvars.ContextVar("dask_clust_progress", default="off")
_CURRENT = contextvars.ContextVar("dask_clust_phase", default=None)


def mode_for(progress):
    """"bars", "lines" or "off" for a ``progress`` argument (None: bars on a terminal, else off)."""
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    if progress is None:
        return "bars" if tty else "off"
    if not progress:
        return "off"
    return "bars" if tty else "lines"


@contextlib.contextmanager
def reporting(progress):
    """Report the phases run inside the block as ``progress`` asks."""
    token = _MODE.set(mode_for(progress))
    try:
        yield
    finally:
        _MODE.reset(token)


def enabled():
    return _MODE.get() != "off"


def note(text):
    """One line on stderr (between bars, not through them) when progress is on."""
    if _MODE.get() == "bars":
        from tqdm.std import tqdm

        tqdm.write(text, file=sys.stderr)
    elif _MODE.get() == "lines":
        print(text, file=sys.stderr, flush=True)


class _Silent:
    n = 0

    def update(self, n=1, **figures):
        pass


SILENT = _Silent()


class _Lines:
    """Counts the steps and writes one line when the phase ends."""

    def __init__(self, name, total, unit):
        self.name, self.total, self.unit, self.n, self.figures = name, total, unit, 0, {}
        self.t0 = time.perf_counter()

    def update(self, n=1, **figures):
        self.n += n
        self.figures = figures or self.figures

    def close(self):
        steps = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        unit = self.unit if self.n == 1 or self.unit == "it" else self.unit + ("es" if self.unit.endswith("s") else "s")
        extra = "".join(f", {k} {v}" for k, v in self.figures.items())
        note(f"{self.name}: {steps} {unit} in {time.perf_counter() - self.t0:.1f} s{extra}")


class _Bar:
    """A tqdm bar whose elapsed time keeps moving while one long step runs (a pass over the data)."""

    def __init__(self, name, total, unit):
        from tqdm.std import tqdm

        self.bar = tqdm(total=total, desc=name, unit=unit, file=sys.stderr, leave=True, dynamic_ncols=True,
                        mininterval=0.2)
        self._done = threading.Event()
        threading.Thread(target=self._tick, daemon=True, name="dask-clust-progress").start()

    @property
    def n(self):
        return self.bar.n

    def _tick(self):
        while not self._done.wait(1.0):
            self.bar.refresh()

    def update(self, n=1, **figures):
        if figures:
            self.bar.set_postfix(figures, refresh=False)
        self.bar.update(n)

    def done(self):
        """A phase that ended before its planned total (a converged loop) shows as complete."""
        if self.bar.total and self.bar.n < self.bar.total:
            self.bar.total = self.bar.n

    def close(self):
        self._done.set()
        self.bar.close()


@contextlib.contextmanager
def phase(name, total=None, unit="step"):
    """A phase of ``total`` steps (None: unknown); the block calls ``.update(n, **figures)`` as it goes."""
    mode = _MODE.get()
    if mode == "off":
        yield SILENT
        return
    shown = (_Bar if mode == "bars" else _Lines)(name, total, unit)
    token = _CURRENT.set(shown)
    try:
        yield shown
        if mode == "bars":
            shown.done()
    finally:
        _CURRENT.reset(token)
        shown.close()


def advance(n=1, **figures):
    """Move the innermost open phase on (for layers that do not hold its bar, e.g. loading chunks)."""
    shown = _CURRENT.get()
    if shown is not None:
        shown.update(n, **figures)
