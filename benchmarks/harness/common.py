"""Shared by the per-issue scripts: their JSON lines (``results/<name>.jsonl``), in-memory blobs, the LocalCluster."""

import contextlib
import json
import os
import platform
import subprocess
import sys
import time

# benchmarks/, where results/ is
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def emit(name, row):
    row = {
        "bench": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        **row,
    }
    line = json.dumps(row)
    print(line, flush=True)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", f"{name}.jsonl"), "a") as f:
        f.write(line + "\n")


def blobs(n, d, c, seed=0):
    """In-memory blobs, exactly the shared generator's stream (one chunk)."""
    from dask_clust.datasets import make_blobs

    X, y = make_blobs(n, d, c, random_state=seed, chunks=n)
    return X.compute(), y.compute()


@contextlib.contextmanager
def local_cluster(n_workers=2, threads_per_worker=1):
    """The LocalCluster dask_clust starts for a fit (its worker settings included), sized as asked."""
    from dask_clust.engine.local import connect

    with connect(n_workers=n_workers, threads_per_worker=threads_per_worker) as client:
        yield client


class Rows:
    """Where a per-issue script sends the rows of a suite's experiment function (``paper.sbe_iris(rows)``, ...),
    so the experiment exists once: each row goes to ``results/<name>.jsonl`` and stays in ``rows`` for the
    script's summary. Full size (``tiny`` False); the experiments that need a cluster get ``client``."""

    tiny = False

    def __init__(self, name, client="in-process"):
        self.name, self.client, self.rows = name, client, []

    def emit(self, row):
        self.rows.append(row)
        emit(self.name, row)


def dask_process(role, scheduler_file, nanny=True, env=None):
    """``dask scheduler`` or ``dask worker`` (one thread, under a nanny unless not ``nanny``) on 127.0.0.1 in a
    process of its own, as dask-jobqueue or a Helm chart starts them; the scheduler writes its address to
    ``scheduler_file``, where the workers read it."""
    args = {
        "scheduler": ["--port", "0", "--scheduler-file", scheduler_file],
        "worker": ["--scheduler-file", scheduler_file, "--nthreads", "1"] + ([] if nanny else ["--no-nanny"]),
    }[role]
    return subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "dask"), role, "--host", "127.0.0.1", "--no-dashboard", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
