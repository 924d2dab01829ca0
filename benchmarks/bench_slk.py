"""SLK (issue #18): speed. Its quality (NMI / ACC of SLK-BO, SLK-MS and k-means on digits, mnist5k and
segment) is an experiment of the suites: ``python benchmarks/run.py --suite quick`` (``harness.paper.slk_quality``).

--parts speed    warm numba cache, in-process: digits whole fit (graph + σ + SLK); mnist5k graph alone and
                 whole fits (BO, MS); mnist5k BO on a 2-worker LocalCluster with the normalised rows on the
                 workers, one partition each: wall time, round trips, time per bound update against the
                 engine's empty round trip, and the z rows the halo moves between the partitions per update.
"""

import argparse
import contextlib
import time

import dask
import numpy as np

import dask_clust
from dask_clust.datasets import load_digits
from harness.common import emit, local_cluster
from harness.paper import labelled


def data(name):
    return labelled(name, tiny=False)


def timed(fn, repeats=3):
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


@contextlib.contextmanager
def counted_calls():
    """Round trips of every engine in the block (a fit opens several: input, normalised rows, graph)."""
    from dask_clust.engine import ops

    calls, original = {"all": 0, "halo": 0}, ops.Engine._call

    def _call(self, *args, **kwargs):
        calls["all"] += 1
        calls["halo"] += kwargs.get("halo") is not None
        return original(self, *args, **kwargs)

    ops.Engine._call = _call
    try:
        yield calls
    finally:
        ops.Engine._call = original


def speed():
    out = []
    Xd = load_digits()[0]
    Xm = data("mnist5k")[0]
    dask_clust.fit(Xd, algo="slk", n_clusters=10, random_state=0, client="in-process")  # warm
    s, _ = timed(lambda: dask_clust.fit(Xd, algo="slk", n_clusters=10, random_state=0, client="in-process"))
    out.append(
        f"digits, in-process, graph + σ + SLK-BO: {s:.2f} s (target <= 0.5 s; the authors' SLK loop alone ≈ 1.0 s)"
    )
    emit("slk_speed", {"case": "digits_bo_in_process", "s": s})
    g, _ = timed(lambda: dask_clust.kneighbors_graph(Xm, 4, normalize=True, client="in-process"), 1)
    out.append(f"mnist5k graph, in-process: {g:.2f} s (target <= 5 s; the authors' exact kNN: 86 s)")
    emit("slk_speed", {"case": "mnist5k_graph", "s": g})
    for mode, target, theirs in (("bo", 3.5, 7), ("ms", 8, 15)):
        s, m = timed(
            lambda: dask_clust.fit(Xm, algo="slk", n_clusters=10, mode=mode, random_state=0, client="in-process"), 1
        )
        out.append(
            f"mnist5k SLK-{mode.upper()} whole fit, in-process: {s:.2f} s (target <= {target} s; the authors' "
            f"loop alone ≈ {theirs} s), {sum(m.inner_iterations_)} bound updates"
        )
        emit("slk_speed", {"case": f"mnist5k_{mode}_in_process", "s": s, "updates": sum(m.inner_iterations_)})
    # the normalised rows on the workers (in-process-bytes 1 KiB), in two chunks: one partition per worker
    on_workers = {"dask_clust.in-process-bytes": "1KiB", "dask_clust.working-set-chunk-rows": len(Xm) // 2}
    with local_cluster(2, 1) as client, dask.config.set(on_workers):
        dask_clust.fit(Xd, algo="slk", n_clusters=10, random_state=0, client=client)  # warm the workers
        with counted_calls() as calls:
            s, m = timed(lambda: dask_clust.fit(Xm, algo="slk", n_clusters=10, random_state=0, client=client), 1)
        from dask_clust.engine import as_source, open_engine

        with open_engine(as_source(Xm), client, 0) as eng:
            empty_ms = eng.overhead_ms()
    with dask.config.set({"dask_clust.working-set-chunk-rows": len(Xm) // 2}):  # the same chunks, in-process
        here_s, here = timed(
            lambda: dask_clust.fit(Xm, algo="slk", n_clusters=10, random_state=0, client="in-process"), 1
        )
    same = bool(np.array_equal(here.labels_, m.labels_)) and here.inner_iterations_ == m.inner_iterations_
    updates = sum(m.inner_iterations_)
    ids = dask_clust.kneighbors_graph(Xm, 4, normalize=True, client="in-process").indices.reshape(len(Xm), 4)
    half = len(Xm) // 2
    # rows a partition reads from the other one per update (the graph is in input order: partition p holds
    # rows p·half ..): z rows of K floats each way
    imported = sum(
        len(np.unique(ids[p * half : (p + 1) * half][(ids[p * half : (p + 1) * half] // half) != p])) for p in (0, 1)
    )
    halo_bytes = imported * 10 * 8
    out.append(
        f"mnist5k SLK-BO on 2 workers: {s:.2f} s (target <= 7 s), {updates} bound updates, "
        f"{calls['all']} round trips ({calls['halo']} with a halo), {s / updates * 1e3:.1f} ms per update of "
        f"which ≈ {empty_ms:.1f} ms is the engine's empty round trip; halo {imported} rows = "
        f"{halo_bytes / 1e3:.0f} kB per update between the 2 partitions; in-process on the same 2 chunks "
        f"{here_s:.2f} s, the same labels and counts: {same}"
    )
    emit(
        "slk_speed",
        {
            "case": "mnist5k_bo_2_workers",
            "s": s,
            "updates": updates,
            "empty_iteration_ms": empty_ms,
            "round_trips": calls["all"],
            "halo_round_trips": calls["halo"],
            "halo_rows": imported,
            "halo_bytes_per_update": halo_bytes,
            "in_process_same_chunks_s": here_s,
            "same_model_in_process": same,
        },
    )
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="speed")
    lines = []
    for part in ap.parse_args().parts.split(","):
        lines += {"speed": speed}[part]()
    print()
    print("\n".join(lines))
