"""A fit on the Dask dashboard: its work in the task stream of ``/status``, and the page ``/dask-clust`` (in the
dashboard's menu) with each fit's phase, steps, elapsed time and ETA, its figure against time and the
workers' share of its work.

Why: a fit's work runs as calls on the workers' partitions, not as tasks, so the dashboard's task stream,
progress and fine-performance pages would stay empty while the workers are busy.
- The work: each partition call's chunk work on a worker (``worked``) goes to the scheduler as an event
  (``Worker.log_event``, batched with the worker's other messages), named after its step (``lloyd_step``,
  ``truncated_estep``); the scheduler plugin puts it in the task stream's buffer as a finished task's record,
  so the task stream draws it where a user already looks. Calls under ``MIN_SPAN_S`` are not sent: the
  stream could not draw them, and a fast loop would send hundreds a second.
- The fits: the driver publishes each fit's progress into the scheduler's metadata (``set_metadata``, at
  most every ``PUBLISH_S`` seconds and at every phase's start and end, without waiting for the answer).
The plugin registers the page and its menu entry and reads both. It needs dask_clust importable on the
scheduler (always so for a LocalCluster); without it the fit runs unseen there.

What the scheduler holds: the last ``KEPT_FITS`` fits, each with at most ``HISTORY_POINTS`` points of its
figure (a few KB a fit, whatever N, D and k are), and the last ``KEPT_SPANS`` spans of work.
"""

import asyncio
import collections
import html
import itertools
import logging
import os
import threading
import time

from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.http.utils import RequestHandler

from .. import progress

logger = logging.getLogger("dask_clust")

ROUTE = "/dask-clust"
KEY = "dask-clust-fits"
WORK_TOPIC = "dask-clust-work"
PUBLISH_S = 0.25
KEPT_FITS = 20
HISTORY_POINTS = 200
KEPT_SPANS = 20_000
MIN_SPAN_S = 0.002
# the window of the workers' share on the page
SHARE_S = 60.0
_ids = itertools.count()
_spans = itertools.count()
# the pages' addresses already printed in this process: each once, beside the dashboard's when it is printed
_SHOWN = set()


def worked(worker, call, start, stop):
    """On a worker: a partition's work on ``call`` from ``start`` to ``stop`` (its clock), to the task stream."""
    if stop - start < MIN_SPAN_S:
        return
    step = getattr(call, "step", None)
    name = (getattr(getattr(step, "func", step), "__name__", None) or type(call).__name__.lower()).lstrip("_")
    span = {"name": name, "n": next(_spans), "thread": threading.get_ident(), "start": start, "stop": stop}
    try:
        worker.log_event(WORK_TOPIC, span)
    except Exception as exc:  # a view: a worker closing under the call must not fail it here
        logger.debug("could not show the work in the task stream: %s", exc)


class FitsPlugin(SchedulerPlugin):
    """On the scheduler: the page ``ROUTE`` and its menu entry, and the workers' spans of work into the task
    stream (registered once, by name)."""

    name = "dask-clust-fits-page"
    idempotent = True

    def __init__(self):
        self.spans = collections.deque(maxlen=KEPT_SPANS)

    async def start(self, scheduler):
        self.scheduler = scheduler
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            app.add_handlers(r".*$", [(ROUTE, FitsPage, {"dask_server": scheduler, "extra": {"plugin": self}})])
        pages = _menu(scheduler)
        if pages is not None and ROUTE.strip("/") not in pages:
            pages.append(ROUTE.strip("/"))

    def log_event(self, topic, msg):
        if topic != WORK_TOPIC:
            return
        worker = msg.get("worker")
        self.spans.append((worker, msg["start"], msg["stop"]))
        from distributed.diagnostics.task_stream import TaskStreamPlugin

        stream = self.scheduler.plugins.get(TaskStreamPlugin.name)
        if stream is None:
            stream = TaskStreamPlugin(self.scheduler)
            self.scheduler.add_plugin(stream)
        stream.buffer.append(
            {
                "key": f"{msg['name']}-{msg['n']}",
                "worker": worker,
                "thread": msg["thread"],
                "status": "OK",
                "startstops": [{"action": "compute", "start": msg["start"], "stop": msg["stop"]}],
            }
        )
        stream.index += 1

    def shares(self, now):
        """Per worker, its seconds of work in the last ``SHARE_S`` seconds."""
        busy = collections.Counter()
        for worker, start, stop in self.spans:
            if stop > now - SHARE_S:
                busy[worker] += stop - max(start, now - SHARE_S)
        return busy


def _menu(scheduler):
    """The dashboard's list of pages in its menu (distributed's template variables, one list shared by every
    page it renders), or None where this version of distributed has none."""
    try:
        from distributed.dashboard.scheduler import template_variables

        return template_variables(scheduler)["pages"]
    except Exception:  # the page's own link still works
        return None


class FitsPage(RequestHandler):
    """The fits this scheduler's clients published, newest first; the page fetches its own body every 2 s."""

    def get(self):
        body = _fits_html(self.server.get_metadata(keys=[KEY], default={}), self.extra["plugin"], time.time())
        self.set_header("Content-Type", "text/html")
        if self.get_argument("part", None) == "fits":
            self.write(body)
            return
        pages = _menu(self.server) or ["status"]
        menu = "".join(f"<li><a href='{html.escape(p)}'>{html.escape(p.title())}</a></li>" for p in pages)
        self.write(
            "<!DOCTYPE html><html><head><meta charset='utf-8'/><title>dask_clust fits</title>"
            "<link rel='stylesheet' href='statics/css/base.css'/>"
            "<link rel='shortcut icon' href='statics/images/favicon.ico'/>"
            "<style>.fit{margin:1em 1.5em;font-family:sans-serif}.fit table{border-collapse:collapse}"
            ".fit td,.fit th{padding:2px 10px;text-align:left}</style></head><body>"
            "<div class='navbar' id='myTopnav'><ul><li id='dask-logo'><a href='status'>"
            f"<img src='statics/images/dask-logo.svg'/></a></li>{menu}</ul></div>"
            f"<div class='content'><div id='fits'>{body}</div></div>"
            "<script>setInterval(async () => { const r = await fetch('dask-clust?part=fits');"
            " if (r.ok) document.getElementById('fits').innerHTML = await r.text(); }, 2000);</script>"
            "</body></html>"
        )


def _fits_html(fits, plugin, now):
    """Each fit (newest first): its shape, phase, steps, elapsed time and ETA, its figure against time; then
    the workers' share of the work in the last minute."""
    if not fits:
        return "<div class='fit'>No dask_clust fit has run on this cluster yet.</div>"
    out = []
    for fit_id, f in sorted(fits.items(), key=lambda kv: -kv[1]["time"]):
        running = not f.get("done")
        elapsed = (now if running else f["time"]) - f.get("started", f["time"])
        steps, total = f.get("n", 0), f.get("total")
        phase = f"{f['phase']}: {steps}/{total}" if total else f"{f['phase']}: {steps}"
        eta = ""
        if running and total and steps:
            left = (now - f.get("phase_started", now)) / steps * (total - steps)
            eta = f", about {_duration(left)} left in this phase"
        figures = ", ".join(f"{k} {v}" for k, v in f["figures"].items())
        updated = time.strftime("%H:%M:%S", time.localtime(f["time"]))
        shape = ", ".join(f"{k} = {v:,}" for k, v in f.get("shape", {}).items() if v is not None)
        out.append(
            f"<div class='fit'><h3>{html.escape(f['algo'])} ({shape}): "
            f"{'running' if running else 'finished'}, {_duration(elapsed)}</h3>"
            f"<p>{html.escape(phase)}{eta}{html.escape(', ' + figures if figures else '')}</p>"
            f"{progress.line_svg(f.get('history', []), html.escape(f.get('figure', 'objective')), 'seconds', 480)}"
            f"<p style='color:#888'>fit {html.escape(fit_id)}, updated {updated}</p>"
            "</div>"
        )
    busy = plugin.shares(now)
    if busy:
        whole = sum(busy.values())
        rows = "".join(
            f"<tr><td>{html.escape(str(w))}</td><td>{s:.1f} s</td><td>{100 * s / whole:.0f} %</td></tr>"
            for w, s in sorted(busy.items(), key=lambda kv: str(kv[0]))
        )
        out.append(
            f"<div class='fit'><h3>The workers' share of the work (last {SHARE_S:.0f} s)</h3>"
            f"<table><tr><th>worker</th><th>busy</th><th>share</th></tr>{rows}</table></div>"
        )
    return "".join(out)


def _duration(seconds):
    seconds = max(0.0, seconds)
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {int(seconds % 60)} s"


def page_link(client):
    """The page's address for people, beside the dashboard's (``Client.dashboard_link``, which follows
    ``distributed.dashboard.link``, a proxy's address included), or None without a web server."""
    if client.scheduler_info().get("services", {}).get("dashboard") is None:
        return None
    link = client.dashboard_link
    return (link[: -len("/status")] if link.endswith("/status") else link.rstrip("/")) + ROUTE


class Publisher:
    """The listener ``progress.publishing`` calls: one fit's phase and steps into the scheduler's metadata.
    Sends go out on the client's event loop, in order, and the fit never waits for them: a scheduler that is
    slow or gone must cost the fit nothing (the engine reports a lost scheduler on its own). The driver
    holds the fit's record and at most 2 ``HISTORY_POINTS`` points of its figure."""

    def __init__(self, client, algo, shape, figure):
        self.client = client
        self.fit_id = f"{os.getpid()}-{next(_ids)}"
        self.started = self.phase_started = time.time()
        self.record = {"algo": algo, "shape": shape, "figure": figure, "started": self.started, "history": []}
        self.last = 0.0
        self._phase = None
        self._lock = asyncio.Lock()

    def __call__(self, name, n, total, figures, ended):
        now = time.time()
        if name != self._phase:
            self._phase, self.phase_started = name, now
        value = figures.get(self.record["figure"], figures.get("objective"))
        if value is not None and n and not ended:  # a phase's end repeats its last step's figures
            self._keep(now - self.started, value)
        if not ended and n and now - self.last < PUBLISH_S:  # a phase's start and end always go out
            return
        self.last = now
        self.record.update(
            phase=name, n=n, total=total, figures=dict(figures), done=False, time=now, phase_started=self.phase_started
        )
        self.client.loop.add_callback(self._send, dict(self.record, history=list(self.record["history"])))

    def _keep(self, t, value):
        """The figure's points, every other one dropped when there are twice ``HISTORY_POINTS``."""
        history = self.record["history"]
        try:
            history.append((round(t, 3), float(value)))
        except (TypeError, ValueError):  # a figure shown as text
            return
        if len(history) >= 2 * HISTORY_POINTS:
            history[:] = history[::2]

    def finish(self):
        self.client.loop.add_callback(self._send, None)

    async def _send(self, record):
        async with self._lock:  # FIFO: the page never shows an older step after a newer one
            try:
                scheduler = self.client.scheduler
                if record is not None:
                    await scheduler.set_metadata(keys=[KEY, self.fit_id], value=record)
                    return
                await scheduler.set_metadata(keys=[KEY, self.fit_id, "done"], value=True)
                fits = await scheduler.get_metadata(keys=[KEY], default={})
                if len(fits) > KEPT_FITS:
                    kept = sorted(fits, key=lambda k: fits[k]["time"])[-KEPT_FITS:]
                    await scheduler.set_metadata(keys=[KEY], value={k: fits[k] for k in kept})
            except Exception as exc:  # the page is a view: losing it must not cost the fit
                logger.debug("could not publish the fit's progress: %s", exc)


def publisher(client, algo, shape, figure):
    """A ``Publisher`` for a fit on ``client``'s cluster, after registering the page; None when the
    scheduler cannot take the plugin (dask_clust not importable there). ``shape``: {"N": rows, "D": features,
    "k": clusters}; ``figure``: the name of the per-iteration figure (``AlgorithmSpec.figure``)."""
    try:
        client.register_plugin(FitsPlugin(), name=FitsPlugin.name)
    except Exception as exc:
        logger.info("no fit page on this scheduler (%s: %s)", type(exc).__name__, exc)
        return None
    link = page_link(client)
    logger.info("the fit on the dashboard: %s", link)
    if link and progress.enabled() and link not in _SHOWN:
        _SHOWN.add(link)
        progress.note(f"the fits on the dashboard: {link}")
    return Publisher(client, algo, shape, figure)


def shown_beside(client, dashboard):
    """The dashboard's line with the fits' page beside it (marked as printed), for ``dashboard``'s address."""
    link = page_link(client)
    if link is None:
        return f"dashboard: {dashboard}"
    _SHOWN.add(link)
    return f"dashboard: {dashboard}  (the fits: {link})"
