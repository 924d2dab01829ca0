"""Progress of a fit's phases on stderr: loading, coreset, seeding, iterations, final pass.

``progress=None`` (the default of ``fit``, the estimators and the CLI) shows bars only when stderr is a
terminal or the process is a Jupyter kernel (whose stderr is no terminal but shows bars), so logs of
scripts, CI and schedulers get no carriage-return lines; ``True`` asks for progress anywhere: bars on a
terminal or in a kernel, one line per finished phase elsewhere; ``False`` is silent. Bars are tqdm's: its
notebook widgets in a kernel where ipywidgets is installed, its text bars otherwise.
"""

import contextlib
import contextvars
import math
import sys
import threading
import time

_MODE = contextvars.ContextVar("dask_clust_progress", default="off")
_CURRENT = contextvars.ContextVar("dask_clust_phase", default=None)
_LISTENER = contextvars.ContextVar("dask_clust_listener", default=None)


def in_kernel():
    """Whether this process is a Jupyter kernel."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def mode_for(progress):
    """ "widgets", "bars", "lines" or "off" for a ``progress`` argument (None: bars on a terminal or in a
    kernel, else off)."""
    if progress is not None and not progress:
        return "off"
    if in_kernel():
        import importlib.util

        return "widgets" if importlib.util.find_spec("ipywidgets") is not None else "bars"
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    if progress is None:
        return "bars" if tty else "off"
    return "bars" if tty else "lines"


@contextlib.contextmanager
def reporting(progress):
    """Report the phases run inside the block as ``progress`` asks."""
    token = _MODE.set(mode_for(progress))
    try:
        yield
    finally:
        _MODE.reset(token)


@contextlib.contextmanager
def publishing(listener):
    """Inside the block every phase also tells ``listener(name, steps, total, figures, ended)`` of its start,
    its steps and its end, whatever is displayed (the cluster's page of fits, ``engine.dashboard``)."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def enabled():
    return _MODE.get() != "off"


def note(text):
    """One line on stderr (between bars, not through them) when progress is on."""
    if _MODE.get() in ("bars", "widgets"):
        from tqdm.std import tqdm

        tqdm.write(text, file=sys.stderr)
    elif _MODE.get() == "lines":
        print(text, file=sys.stderr, flush=True)


class _Silent:
    n = 0

    def update(self, n=1, **figures):
        pass

    def set_total(self, total):
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

    def set_total(self, total):
        self.total = total

    def close(self):
        steps = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        unit = self.unit if self.n == 1 or self.unit == "it" else self.unit + ("es" if self.unit.endswith("s") else "s")
        extra = "".join(f", {k} {v}" for k, v in self.figures.items())
        note(f"{self.name}: {steps} {unit} in {time.perf_counter() - self.t0:.1f} s{extra}")


class _Bar:
    """A tqdm bar (a notebook widget with ``widget``) whose elapsed time keeps moving while one long step
    runs (a pass over the data)."""

    def __init__(self, name, total, unit, widget=False):
        if widget:
            from tqdm.notebook import tqdm
        else:
            from tqdm.std import tqdm

        self.bar = tqdm(
            total=total, desc=name, unit=unit, file=sys.stderr, leave=True, dynamic_ncols=True, mininterval=0.2
        )
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

    def set_total(self, total):
        """A total learnt once the phase runs (the tasks of a dask graph)."""
        self.bar.total = total
        self.bar.refresh()

    def done(self):
        """A phase that ended before its planned total (a converged loop) shows as complete."""
        if self.bar.total and self.bar.n < self.bar.total:
            self.bar.total = self.bar.n

    def close(self):
        self._done.set()
        self.bar.close()


class _Told:
    """A phase's display that also tells the listener (``publishing``) of each step."""

    def __init__(self, shown, listener, name, total):
        self.shown, self.listener, self.name, self.total, self.n, self.figures = shown, listener, name, total, 0, {}
        listener(name, 0, total, {}, False)

    def update(self, n=1, **figures):
        self.shown.update(n, **figures)
        self.n += n
        self.figures = figures or self.figures
        self.listener(self.name, self.n, self.total, self.figures, False)

    def set_total(self, total):
        self.total = total
        self.shown.set_total(total)

    def done(self):
        self.shown.done()

    def close(self):
        if self.shown is not SILENT:
            self.shown.close()
        self.listener(self.name, self.n, self.total, self.figures, True)


@contextlib.contextmanager
def phase(name, total=None, unit="step"):
    """A phase of ``total`` steps (None: unknown); the block calls ``.update(n, **figures)`` as it goes."""
    mode, listener = _MODE.get(), _LISTENER.get()
    if mode == "off" and listener is None:
        yield SILENT
        return
    shown = (
        SILENT
        if mode == "off"
        else _Lines(name, total, unit)
        if mode == "lines"
        else _Bar(name, total, unit, widget=mode == "widgets")
    )
    if listener is not None:
        shown = _Told(shown, listener, name, total)
    token = _CURRENT.set(shown)
    try:
        yield shown
        if mode in ("bars", "widgets"):
            shown.done()
    finally:
        _CURRENT.reset(token)
        shown.close()


def advance(n=1, **figures):
    """Move the innermost open phase on (for layers that do not hold its bar, e.g. loading chunks)."""
    shown = _CURRENT.get()
    if shown is not None:
        shown.update(n, **figures)


def line_svg(points, figure="objective", against="iteration", width=320, height=160, pad=28):
    """A figure against a step or the time, as an inline SVG line (empty when there is nothing to draw):
    a model's view in Jupyter and the dashboard's page of fits. ``points``: (x, value) pairs, a value None
    or not finite skipped."""
    points = [(float(x), float(v)) for x, v in points if v is not None and math.isfinite(v)]
    if len(points) < 2:
        return ""
    lo, hi = min(v for _, v in points), max(v for _, v in points)
    x0, x1 = points[0][0], points[-1][0]
    span, run = (hi - lo) or 1.0, (x1 - x0) or 1.0
    xy = " ".join(
        f"{pad + (x - x0) * (width - 2 * pad) / run:.1f},{height - pad - (v - lo) * (height - 2 * pad) / span:.1f}"
        for x, v in points
    )
    return (
        f"<svg width='{width}' height='{height}' role='img' aria-label='{figure} against {against}'>"
        f"<polyline points='{xy}' fill='none' stroke='#1f77b4' stroke-width='1.5'/>"
        f"<text x='{pad}' y='{pad - 10}' font-size='11'>{figure}: max {hi:.4g}</text>"
        f"<text x='{pad}' y='{height - 8}' font-size='11'>min {lo:.4g}; {against} {x0:.4g} to {x1:.4g}</text>"
        f"</svg>"
    )
