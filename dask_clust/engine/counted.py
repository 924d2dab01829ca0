"""A plain dask computation (``predict``'s labels or posteriors written by the command line) shown as a
progress phase of its tasks: the fits count their own steps, but a write is a dask graph, whose tasks only
dask's schedulers see finish.

On the default client's cluster, the scheduler's progress feed (distributed's ``ProgressBar``, the one its
``progress()`` reads) tells every 100 ms how many of the graph's tasks remain, including those it waits on;
without a client, a callback of dask's local scheduler counts each task as it ends. The driver holds two
counts, whatever N is.
"""

import distributed
from dask.callbacks import Callback
from distributed.diagnostics.progressbar import ProgressBar

from .. import progress


def compute(collection, name, unit="task"):
    """``collection``'s value, computed where dask would compute it, its tasks counted on a phase ``name``."""
    try:
        client = distributed.default_client()
    except ValueError:
        client = None
    with progress.phase(name, None, unit) as shown:
        if client is None:
            with _LocalTasks(shown):
                return collection.compute()
        future = client.compute(collection)
        client.sync(_ClusterTasks([future], client.scheduler.address, shown).listen)
        return future.result()


class _LocalTasks(Callback):
    """The local scheduler's tasks: each computation adds its tasks to the total, each finished task one step."""

    def __init__(self, shown):
        super().__init__()
        self.shown, self.total = shown, 0

    def _start_state(self, dsk, state):
        self.total += len(state["ready"]) + len(state["waiting"])
        self.shown.set_total(self.total)

    def _posttask(self, key, result, dsk, state, worker_id):
        self.shown.update(1)


class _ClusterTasks(ProgressBar):
    """The scheduler's feed of a graph's remaining tasks, as steps of the phase."""

    def __init__(self, futures, scheduler, shown):
        super().__init__(futures, scheduler)
        self.shown, self.done = shown, 0

    def _draw_bar(self, remaining=0, all=0, **kwargs):
        if self.shown.n == 0 and all:
            self.shown.set_total(all)
        self.shown.update(all - remaining - self.done)
        self.done = all - remaining
