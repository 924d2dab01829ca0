"""vc-GMM at cluster scale (issue #17), on loopback LocalClusters of single-thread worker processes.

--parts weak     Weak scaling of the EM: 64k x 256 working-set rows per worker (generated on the workers),
                 C = 4096, C' = G = 5, at 1, 2 and 4 workers, with the means on the driver and sharded on
                 the workers (model-bytes 1 B): the driver's peak memory, the bytes into the driver per EM
                 iteration, EM wall time per iteration and the workers' CPU per iteration (difference of a
                 6- and a 2-iteration fit). This box has 2 cores: wall time at 4 workers is CPU-bound.
--parts afkmc2   AFK-MC2 at D = 256 on 4 workers, C = 512 .. 4096 on N' = 64 C rows (the auto coreset
                 size): wall time per centre, round trips, the distance evaluations on the driver against
                 all (counted in this process), the driver's CPU; and the cost per centre the driver-thread
                 chains had (all m·j evaluations of chain j on the driver), measured here at j = C/2.
--parts budget   The Tiny Images plan (N = 78.3 M x 3072 float32, N' = 10 M, C = 32,768, G = C' = 5, m = 20,
                 16 nodes x 16 cores, 10 GbE) from unit costs measured in this run: seeding, EM per
                 iteration, bytes moved and memory per node.
"""

import argparse
import math
import statistics
import time

import dask
import numpy as np

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.engine import as_source, open_engine
from dask_clust.engine.data import auto_chunk_rows
from harness.common import emit, local_cluster
from harness.scaling import DriverBytes, PeakRSS

ROWS_PER_WORKER, D, C = 65_536, 256, 4096
WEAK_WORKERS = (1, 2, 4)
AFK_C = (512, 1024, 2048, 4096)
M = 20
TARGET = dict(N=78.3e6, D=3072, coreset=10e6, C=32_768, G=5, m=20, nodes=16, cores=16, nic_bytes_s=1.25e9)


def workers_cpu(client):
    import psutil

    def cpu():
        t = psutil.Process().cpu_times()
        return t.user + t.system

    return sum(client.run(cpu).values())


def weak_fit(client, n_workers, max_iter, sharded):
    X, _ = make_blobs(n_workers * ROWS_PER_WORKER, D, 64, chunks=ROWS_PER_WORKER // 2, random_state=0)
    seen, walls = [], []
    settings = {"dask_clust.model-bytes": "1" if sharded else "1TiB"}
    cpu0 = workers_cpu(client)
    with dask.config.set(settings), PeakRSS() as rss, DriverBytes() as io:
        m = dask_clust.fit(
            X,
            algo="vargmm",
            n_clusters=C,
            init="random",
            truncated_init="random",
            max_iter=max_iter,
            tol=0,
            random_state=0,
            client=client,
            callback=lambda rec: (seen.append(io.read), walls.append(rec["wall_s"])),
        )
    return m, workers_cpu(client) - cpu0, rss.extra, [b - a for a, b in zip(seen, seen[1:])], walls


def weak():
    rows = []
    for n_workers in WEAK_WORKERS:
        with local_cluster(n_workers, 1) as client:
            dask_clust.fit(
                np.random.default_rng(0).standard_normal((4000, 8)).astype(np.float32),
                algo="vargmm",
                n_clusters=8,
                client=client,
                max_iter=1,
            )  # warm the workers
            for sharded in (False, True):
                short = weak_fit(client, n_workers, 2, sharded)
                m, cpu, peak, bytes_in, walls = weak_fit(client, n_workers, 6, sharded)
                row = {
                    "part": "weak",
                    "workers": n_workers,
                    "rows": n_workers * ROWS_PER_WORKER,
                    "d": D,
                    "C": C,
                    "means": "sharded" if sharded else "driver",
                    "driver_peak_extra": peak,
                    "bytes_in_per_iter": statistics.median(bytes_in[1:]),
                    "s_per_iter": statistics.median(walls[2:]),
                    "worker_cpu_s_per_iter": (cpu - short[1]) / 4,
                }
                emit("vcgmm_scale", row)
                rows.append(row)
    print("\nweak scaling, 64k x 256 rows per worker, C = 4096 (EM per iteration)")
    for r in rows:
        base = next(b for b in rows if b["workers"] == 1 and b["means"] == r["means"])
        print(
            f"  {r['means']:8s} {r['workers']} workers: driver peak {r['driver_peak_extra'] / 2**20:7.1f} MiB "
            f"({r['driver_peak_extra'] / max(base['driver_peak_extra'], 1):.2f}x), "
            f"in {r['bytes_in_per_iter'] / 2**20:7.2f} "
            f"MiB/iter ({r['bytes_in_per_iter'] / base['bytes_in_per_iter']:.2f}x), {r['s_per_iter']:.2f} s/iter "
            f"({r['s_per_iter'] / base['s_per_iter']:.2f}x), worker CPU {r['worker_cpu_s_per_iter']:.2f} s/iter "
            f"({r['worker_cpu_s_per_iter'] / base['worker_cpu_s_per_iter'] / r['workers']:.2f}x per worker)"
        )
    return rows


def chain_cost_on_driver(k, d, m=M, repeats=3):
    """Seconds the driver-thread chains spent on centre j = k/2: m proposals against j centres."""
    from dask_clust.kernels.assign import update_mind

    rng = np.random.default_rng(0)
    rows, centers = rng.standard_normal((m, d)).astype(np.float32), rng.standard_normal((k // 2, d))
    update_mind(rows[:1], centers[:1], np.full(1, np.inf))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        update_mind(rows, centers, np.full(m, np.inf))
        times.append(time.perf_counter() - t)
    return min(times)


def afkmc2_part(n_workers=4):
    from dask_clust.blocks import seeding

    on_driver = [0]
    plain = seeding.update_mind

    def counted(rows, centers, mind):
        e = plain(rows, centers, mind)
        on_driver[0] += e
        return e

    rows = []
    with local_cluster(n_workers, 1) as client:
        for k in AFK_C:
            X, _ = make_blobs(64 * k, D, 100, chunks=32_768, random_state=1)
            with open_engine(as_source(X), client, 0) as eng:
                overhead = eng.overhead_ms(5)
                on_driver[0], trips = 0, eng.round_trips
                seeding.update_mind = counted
                try:
                    t, cpu = time.perf_counter(), time.process_time()
                    _, evals = seeding.afkmc2(eng, k, 0, chain_length=M)
                    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
                finally:
                    seeding.update_mind = plain
                row = {
                    "part": "afkmc2",
                    "workers": eng.n_workers,
                    "C": k,
                    "d": D,
                    "rows": 64 * k,
                    "m": M,
                    "wall_s": wall,
                    "ms_per_centre": 1000 * wall / (k - 1),
                    "driver_cpu_s": cpu,
                    "round_trips": eng.round_trips - trips,
                    "overhead_ms": overhead,
                    "evals": evals,
                    "driver_evals": on_driver[0],
                    "driver_share": on_driver[0] / evals,
                    "driver_thread_ms_per_centre": 1000 * chain_cost_on_driver(k, D),
                }
            emit("vcgmm_scale", row)
            rows.append(row)
    print(f"\nAFK-MC2, D = {D}, m = {M}, {n_workers} workers (N' = 64 C rows)")
    for r in rows:
        print(
            f"  C = {r['C']:5d}: {r['wall_s']:6.1f} s, {r['ms_per_centre']:.2f} ms per centre "
            f"(driver-thread chains: {r['driver_thread_ms_per_centre']:.2f} ms), {r['round_trips']} round trips "
            f"x {r['overhead_ms']:.1f} ms, driver evaluations {100 * r['driver_share']:.2f} % of "
            f"{r['evals']:.3g}, driver CPU {r['driver_cpu_s']:.1f} s"
        )
    return rows


def unit_costs():
    """Single-core unit costs at D = 3072 measured here: a direct distance evaluation (AFK-MC2's kernel),
    one coreset row's EM iteration (search over C'·G + 1 clusters and the posteriors, in-process vargmm
    at C = 256 so that the dense statistics do not count), and adding one statistic value of a chunk's
    partial into the worker's exact fixed-point sum (``Sum.accumulate``; dense values, no zero skipped)."""
    from dask_clust.engine.combine import Sum
    from dask_clust.kernels.assign import update_mind
    from dask_clust.kernels.stats import fixed_top_exponent

    d = TARGET["D"]
    rng = np.random.default_rng(0)
    rows, centers = rng.standard_normal((200, d)).astype(np.float32), rng.standard_normal((500, d))
    update_mind(rows[:1], centers[:1], np.full(1, np.inf))
    t = time.perf_counter()
    evals = update_mind(rows, centers, np.full(200, np.inf))
    eval_s = (time.perf_counter() - t) / evals

    n, c = 16_384, 256
    X, _ = make_blobs(n, d, 64, random_state=2)
    X = np.asarray(X)
    dask_clust.fit(X[:2000], algo="vargmm", n_clusters=16, init="random", max_iter=2, client="in-process")
    m = dask_clust.fit(
        X,
        algo="vargmm",
        n_clusters=c,
        init="random",
        truncated_init="random",
        max_iter=6,
        tol=0,
        random_state=0,
        client="in-process",
    )
    row_iter_s = statistics.median(h["wall_s"] for h in m.history_[2:]) / n

    values = rng.standard_normal((1024, 1024))
    top = fixed_top_exponent(1e7, d, 300.0)
    s = Sum()
    acc = s.lift(values, 0, top)
    s.accumulate(acc, values, 0, top)
    t = time.perf_counter()
    for i in range(3):
        s.accumulate(acc, values, i, top)
    accumulate_s = (time.perf_counter() - t) / (3 * values.size)
    return {"eval_s": eval_s, "row_iter_s": row_iter_s, "accumulate_s_per_value": accumulate_s}


def budget():
    """The Tiny Images plan from this run's unit costs (see the module docstring)."""
    import json
    import os

    u = unit_costs()
    T = TARGET
    cores, C, Dt, m, Np = T["nodes"] * T["cores"], T["C"], T["D"], T["m"], T["coreset"]
    # the 16-process empty iteration on this box (suite-scaling, oversubscribed 8x): a pessimistic round trip
    path = os.path.join(os.path.dirname(__file__), "results", "suite-scaling.jsonl")
    trip_s = 0.028
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            if r.get("kind") == "overhead" and r.get("workers") == 16:
                trip_s = r["overhead_ms"] / 1000
    from dask_clust.blocks.seeding import CHAINS_PER_ROUND as B

    chain_evals = m * C * (C - 1) / 2
    driver_evals = m * (B - 1) / 2 * (C - 1)
    seeding = {
        "worker_evals": chain_evals,
        "worker_s": chain_evals * u["eval_s"] / cores,
        "round_trips": C / B,
        "round_trip_s": C / B * trip_s,
        "driver_evals": driver_evals,
        "driver_s": driver_evals * u["eval_s"],
        "bytes_to_driver": m * (C - 1) * Dt * 4,
    }
    seeding["total_s"] = seeding["worker_s"] + seeding["round_trip_s"] + seeding["driver_s"]
    stats_values = C * Dt
    # the working set's chunking (from its size alone): each chunk's dense C x D partial is added into its
    # worker's one exact sum by the thread that computed it, the threads on different row stripes
    chunks = math.ceil(Np / auto_chunk_rows(int(Np), Dt, 4))
    chunks_per_core = math.ceil(chunks / cores)
    em = {
        "row_s": Np * u["row_iter_s"] / cores,
        "chunks": chunks,
        "chunks_per_core": chunks_per_core,
        "lift_s": chunks_per_core * stats_values * u["accumulate_s_per_value"],
        "reduce_scatter_bytes_per_node": stats_values * 3 * 8 * (T["nodes"] - 1) / T["nodes"],
        "means_gather_bytes_per_node": C * Dt * 8 * (T["nodes"] - 1) / T["nodes"],
        "driver_bytes": C * T["G"] * 4 + C * 8,
    }
    em["network_s"] = (em["reduce_scatter_bytes_per_node"] + em["means_gather_bytes_per_node"]) / T["nic_bytes_s"]
    em["iteration_s"] = em["row_s"] + em["lift_s"] + em["network_s"] + 2 * trip_s
    memory = {
        "coreset_per_node": Np * Dt * 4 / T["nodes"],
        "means_per_node": C * Dt * 8,
        "partials_per_node": T["cores"] * stats_values * 8 + stats_values * 3 * 8,
        "proposals_per_node": m * C * Dt * 4 / T["nodes"],
    }
    row = {"part": "budget", "unit": u, "round_trip_s": trip_s, "seeding": seeding, "em": em, "memory": memory}
    emit("vcgmm_scale", row)
    gb = 1e9
    print(
        f"\nTiny Images plan (unit costs here: {u['eval_s'] * 1e6:.2f} µs per distance at D = 3072, "
        f"{u['row_iter_s'] * 1e3:.2f} ms per coreset row and EM iteration, {u['accumulate_s_per_value'] * 1e9:.1f} ns "
        f"per exact statistic value; round trip {trip_s * 1e3:.0f} ms)"
    )
    print(
        f"  seeding: {seeding['total_s'] / 60:.1f} min = workers {seeding['worker_s']:.0f} s + "
        f"{seeding['round_trips']:.0f} round trips {seeding['round_trip_s']:.0f} s + driver "
        f"{seeding['driver_s']:.0f} s; {seeding['bytes_to_driver'] / gb:.1f} GB of proposals to the driver in all"
    )
    print(
        f"  EM per iteration: {em['iteration_s']:.1f} s = rows {em['row_s']:.1f} s + exact statistics "
        f"{em['lift_s']:.1f} s ({em['chunks_per_core']} chunks of the C x D partial per core) + network "
        f"{em['network_s']:.1f} s; driver receives {em['driver_bytes'] / 1e6:.1f} MB; "
        f"EM <= 5 min while it converges in <= {int(300 // em['iteration_s'])} iterations"
    )
    print(
        f"  memory per node: coreset {memory['coreset_per_node'] / gb:.1f} GB, "
        f"means {memory['means_per_node'] / gb:.2f} GB, exact statistics {memory['partials_per_node'] / gb:.1f} GB "
        f"(a C x D partial per core, one sum), proposals {memory['proposals_per_node'] / gb:.2f} GB"
    )
    return row


PARTS = {"weak": weak, "afkmc2": afkmc2_part, "budget": budget}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="weak,afkmc2,budget")
    for part in ap.parse_args().parts.split(","):
        PARTS[part]()
