"""Shared by the benchmark scripts: output, data, the 2 x 1 LocalCluster."""
import contextlib
import json
import os
import platform
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def emit(name, row):
    row = {"bench": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpus": os.cpu_count(),
           "machine": platform.machine(), **row}
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
    from dask_clust.engine.cluster import connect

    with connect(n_workers=n_workers, threads_per_worker=threads_per_worker) as client:
        yield client
