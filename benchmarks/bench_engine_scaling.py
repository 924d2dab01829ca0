"""The engine against the number of workers, one real partition per worker (loopback LocalClusters of
P single-thread worker processes, P = 1, 2, 4, 8, 16):

- empty iteration: median wall time of a reduce of an empty step, and the driver's CPU per round trip;
- bytes the driver process reads and writes per Lloyd iteration (k = 256, D = 32) and per vc-GMM EM
  iteration (var-GMM-S's EM on 400k x 64 rows, C = 2000, on 4 workers with 16 and 64 chunks).

Bytes are the driver process's own read/write system calls (``/proc/self/io``: rchar, wchar) over the
iteration, so they count everything that reaches it, heartbeats included; nothing is estimated.

    python benchmarks/bench_engine_scaling.py [--workers 1,2,4,8,16] [--parts overhead,lloyd,vcgmm]
"""
import argparse
import statistics
import time

import dask
import numpy as np

from common import emit, local_cluster

import dask_clust
from dask_clust.engine import as_source, open_engine
from dask_clust.kernels.assign import Prepared
from dask_clust.lloyd import lloyd_step


def driver_io():
    """(bytes read, bytes written) by this process so far."""
    with open("/proc/self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def per_partition(P, rows_per_worker, d, seed=0):
    """Rows for P workers, chunked so that every worker holds a real partition of two chunks."""
    X = np.random.default_rng(seed).standard_normal((P * rows_per_worker, d)).astype(np.float32)
    return as_source(X, chunk_rows=rows_per_worker // 2)


def overhead_and_lloyd(P, repeats):
    src = per_partition(P, 20_000, 32)
    centers = np.random.default_rng(1).standard_normal((256, 32))
    with local_cluster(P, 1) as client, open_engine(src, client, 0) as eng:
        assert eng.n_workers == P, eng.describe()
        eng.overhead_ms(5)
        cpu0, t0 = time.process_time(), time.perf_counter()
        ms = [eng.empty_iteration_ms() for _ in range(repeats)]
        cpu_ms = 1000 * (time.process_time() - cpu0) / repeats
        got_in, got_out = [], []
        prepared = Prepared(centers, eng.dtype)
        for _ in range(10):
            r0, w0 = driver_io()
            eng.reduce(lloyd_step, prepared)
            r1, w1 = driver_io()
            got_in.append(r1 - r0)
            got_out.append(w1 - w0)
    row = {"workers": P, "chunks": src.n_chunks, "empty_iteration_ms": statistics.median(ms),
           "driver_cpu_ms_per_round_trip": cpu_ms, "lloyd_bytes_in": statistics.median(got_in),
           "lloyd_bytes_out": statistics.median(got_out), "k": 256, "d": 32,
           "wall_s": time.perf_counter() - t0}
    emit("engine_scaling", row)
    return row


def vcgmm_bytes(chunks):
    """Bytes into the driver per EM iteration of var-GMM-S on 400k x 64, C = 2000, 4 workers."""
    X = np.random.default_rng(2).standard_normal((400_000, 64)).astype(np.float32)
    seen = []

    def tick(rec):
        seen.append(driver_io())

    with local_cluster(4, 1) as client, dask.config.set({"dask_clust.min-chunks": chunks,
                                                          "dask_clust.min-chunk-bytes": "1KiB"}):
        m = dask_clust.fit(X, algo="vargmm", n_clusters=2000, init="random", max_iter=6, tol=0, random_state=0,
                           client=client, callback=tick)
    per_it = [b[0] - a[0] for a, b in zip(seen[1:], seen[2:])]   # iterations 3.. (σ² known, steady state)
    row = {"chunks": m.engine_["chunks"], "workers": 4, "C": 2000, "d": 64, "rows": 400_000,
           "bytes_in_per_em_iteration": statistics.median(per_it), "limit_2CD8_plus_1MB": 2 * 2000 * 64 * 8 + 2 ** 20}
    emit("engine_scaling_vcgmm", row)
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="1,2,4,8,16")
    p.add_argument("--parts", default="overhead,vcgmm")
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    parts = args.parts.split(",")
    if "overhead" in parts:
        rows = [overhead_and_lloyd(int(w), args.repeats) for w in args.workers.split(",")]
        base = rows[0]
        for r in rows:
            print(f"P={r['workers']:2d}: empty iteration {r['empty_iteration_ms']:.2f} ms "
                  f"({r['empty_iteration_ms'] / base['empty_iteration_ms']:.2f}x P={base['workers']}), driver CPU "
                  f"{r['driver_cpu_ms_per_round_trip']:.2f} ms/round trip, Lloyd bytes in {r['lloyd_bytes_in'] / 1e3:.1f} kB "
                  f"out {r['lloyd_bytes_out'] / 1e3:.1f} kB")
        ins = [r["lloyd_bytes_in"] for r in rows]
        print(f"Lloyd bytes in: largest / smallest = {max(ins) / min(ins):.3f}")
    if "vcgmm" in parts:
        a, b = vcgmm_bytes(16), vcgmm_bytes(64)
        print(f"vc-GMM EM bytes in per iteration: {a['bytes_in_per_em_iteration'] / 1e6:.2f} MB at {a['chunks']} chunks, "
              f"{b['bytes_in_per_em_iteration'] / 1e6:.2f} MB at {b['chunks']} chunks (limit "
              f"{a['limit_2CD8_plus_1MB'] / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
