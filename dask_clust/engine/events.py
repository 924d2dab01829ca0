"""The engine's rare events, counted in the process where they happen, so that tests, benchmarks and
dashboards observe recovery and placement without reaching into the engine's classes: ``COUNTS[event]``
(read it before and after a fit) and ``watch(event, fn)``, a block in which ``fn(**detail)`` runs at each
such event, in the thread that counts it.

=============  ==================  ==========================================================================
event          detail              when
=============  ==================  ==========================================================================
``lost``       pid                 a partition's worker was found lost: its rebuild on another worker starts
``rebuilt``    pid, addr           ... and ended: the partition runs on ``addr`` with its declared states
``placed``     pid, addr           a partition was started on a worker (when an engine opens, and in a rebuild)
``busy``       addr                a worker that did not answer in time was found running, not frozen: kept
``drawn``      rows                a sample stayed on the workers that drew it (``Engine.sample``)
``partition``  partition           a ``Partition`` was made in this process
``ran``        partition, call     a partition's chunks ran a call in this process (once per call id)
=============  ==================  ==========================================================================
"""

import collections
import contextlib
import threading

COUNTS = collections.Counter()
_watchers = collections.defaultdict(list)
_lock = threading.Lock()


def count(event, **detail):
    with _lock:
        COUNTS[event] += 1
        watchers = tuple(_watchers.get(event, ()))
    for fn in watchers:
        fn(**detail)


@contextlib.contextmanager
def watch(event, fn):
    """``fn(**detail)`` at each ``event`` counted in this process while the block runs."""
    with _lock:
        _watchers[event].append(fn)
    try:
        yield
    finally:
        with _lock:
            _watchers[event].remove(fn)
