"""A fit on the Dask dashboard: the page ``/dask-clust`` of the scheduler's web server lists the fits that ran
or run on the cluster, each with its phase, its steps and its figures (the objective, per iteration).

Why a page of our own: a fit's work runs as calls on the workers' partitions, not as tasks, so the
dashboard's task stream, progress and fine-performance pages stay empty while the workers are busy. The
driver publishes each fit's progress into the scheduler's metadata (its ``set_metadata``, at most every
``PUBLISH_S`` seconds, and at every phase's start and end, without waiting for the answer); a scheduler
plugin registers the page, which reads it. The page needs dask_clust importable on the scheduler (always so
for a LocalCluster); without it the fit runs unseen there.
The scheduler holds the last ``KEPT_FITS`` fits: a few hundred bytes each, whatever N, D and k are.
"""

import asyncio
import html
import itertools
import logging
import os
import time

import distributed
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.http.utils import RequestHandler

logger = logging.getLogger("dask_clust")

ROUTE = "/dask-clust"
KEY = "dask-clust-fits"
PUBLISH_S = 0.25
KEPT_FITS = 20
_ids = itertools.count()


class FitsPage(RequestHandler):
    """The fits this scheduler's clients published, newest first."""

    def get(self):
        fits = self.server.get_metadata(keys=[KEY], default={})
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(v))}</td>"
                for v in (
                    fit_id,
                    f["algo"],
                    f["phase"],
                    f["steps"],
                    ", ".join(f"{k} {v}" for k, v in f["figures"].items()),
                    "finished" if f["done"] else "running",
                    time.strftime("%H:%M:%S", time.localtime(f["time"])),
                )
            )
            + "</tr>"
            for fit_id, f in sorted(fits.items(), key=lambda kv: -kv[1]["time"])
        )
        self.set_header("Content-Type", "text/html")
        self.write(
            "<html><head><title>dask_clust fits</title><meta http-equiv='refresh' content='2'></head>"
            "<body><h3>dask_clust fits</h3><table border='1' cellpadding='4'><tr><th>fit</th><th>algo</th>"
            f"<th>phase</th><th>steps</th><th>figures</th><th>state</th><th>updated</th></tr>{rows}"
            "</table></body></html>"
        )


class FitsPagePlugin(SchedulerPlugin):
    """Adds ``ROUTE`` to the scheduler's web server (once: registered by name)."""

    name = "dask-clust-fits-page"
    idempotent = True

    async def start(self, scheduler):
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            app.add_handlers(r".*$", [(ROUTE, FitsPage, {"dask_server": scheduler})])


def page_link(client):
    """The page's address for people (the dashboard's host and port), or None without a web server."""
    port = client.scheduler_info().get("services", {}).get("dashboard")
    if port is None:
        return None
    host = distributed.comm.get_address_host(client.scheduler.address)
    return f"http://{host}:{port}{ROUTE}"


class Publisher:
    """The listener ``progress.publishing`` calls: one fit's phase and steps into the scheduler's metadata.
    Sends go out on the client's event loop, in order, and the fit never waits for them: a scheduler that is
    slow or gone must cost the fit nothing (the engine reports a lost scheduler on its own)."""

    def __init__(self, client, algo):
        self.client, self.algo = client, algo
        self.fit_id = f"{os.getpid()}-{next(_ids)}"
        self.last = 0.0
        self._lock = asyncio.Lock()

    def __call__(self, name, n, total, figures, ended):
        now = time.time()
        if not ended and n and now - self.last < PUBLISH_S:  # a phase's start and end always go out
            return
        self.last = now
        steps = f"{n}/{total}" if total else str(n)
        self.client.loop.add_callback(
            self._send,
            {"algo": self.algo, "phase": name, "steps": steps, "figures": dict(figures), "done": False, "time": now},
        )

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


def publisher(client, algo):
    """A ``Publisher`` for a fit on ``client``'s cluster, after registering the page; None when the
    scheduler cannot take the plugin (dask_clust not importable there)."""
    try:
        client.register_plugin(FitsPagePlugin(), name=FitsPagePlugin.name)
    except Exception as exc:
        logger.info("no fit page on this scheduler (%s: %s)", type(exc).__name__, exc)
        return None
    logger.info("the fit on the dashboard: %s", page_link(client))
    return Publisher(client, algo)
