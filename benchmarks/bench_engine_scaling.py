"""The engine against the number of workers (issue #15's acceptance figures), measured by the scaling
suite's own functions (``harness.scaling``): loopback LocalClusters of P single-thread worker
processes, one real partition each,

- empty iteration (median wall time) and the driver's CPU per round trip, P = 1, 2, 4, 8, 16;
- bytes the driver process reads and writes per Lloyd iteration (k = 256, D = 32), counted on its sockets;
- bytes into the driver per EM iteration of var-GMM-S on 400k x 64 rows, C = 2000, 4 workers, at 16 and
  64 chunks (limit 2·C·D·8 + 1 MB);
- the driver's peak memory while a 1 M x 64 float32 coreset is drawn from a dask array on 4 workers and
  Lloyd runs on it (in-process-bytes set to 64 MiB, so that it stays on the workers);
- Lloyd at k = 4096, D = 64 with the centres on the driver and sharded on the workers (reduce-scatter),
  P = 1, 2, 4: bytes into and out of the driver and time per iteration.

    python benchmarks/bench_engine_scaling.py [--workers 1,2,4,8,16] [--parts overhead,vcgmm,coreset,sharded]
"""

import argparse

from harness.common import emit
from harness.scaling import coreset_driver_memory, em_bytes, engine_round, sharded_lloyd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="1,2,4,8,16")
    p.add_argument("--parts", default="overhead,vcgmm,coreset,sharded")
    args = p.parse_args()
    parts = args.parts.split(",")
    if "overhead" in parts:
        rows = []
        for w in args.workers.split(","):
            rows.append(engine_round(int(w)))
            emit("engine_scaling", rows[-1])
        for r in rows:
            print(
                f"P={r['workers']:2d}: empty iteration {r['overhead_ms']:.2f} ms "
                f"({r['overhead_ms'] / rows[0]['overhead_ms']:.2f}x P={rows[0]['workers']}), driver CPU "
                f"{r['driver_cpu_ms']:.2f} ms per round trip, Lloyd bytes in {r['lloyd_bytes_in'] / 1e3:.1f} kB, "
                f"out {r['lloyd_bytes_out'] / 1e3:.1f} kB"
            )
        ins = [r["lloyd_bytes_in"] for r in rows]
        print(f"Lloyd bytes in: largest / smallest = {max(ins) / min(ins):.3f}")
    if "vcgmm" in parts:
        limit = 2 * 2000 * 64 * 8 + 2**20
        for chunks in (16, 64):
            r = em_bytes(chunks)
            emit("engine_scaling_vcgmm", {**r, "limit": limit})
            print(
                f"vc-GMM EM: {r['bytes_in'] / 1e6:.3f} MB into the driver per iteration at {r['chunks']} chunks "
                f"(limit {limit / 1e6:.3f} MB)"
            )
    if "coreset" in parts:
        r = coreset_driver_memory()
        emit("engine_scaling_coreset", r)
        print(
            f"coreset of {r['coreset_rows']} x {r['d']} float32 ({r['coreset_bytes'] / 1e6:.0f} MB) on "
            f"{r['workers']} workers: driver peak +{r['driver_peak_extra'] / 1e6:.1f} MB = {r['ratio']:.3f} x"
        )
    if "sharded" in parts:
        for w in (1, 2, 4):
            r = sharded_lloyd(w)
            emit("engine_scaling_sharded", r)
            print(
                f"Lloyd k={r['k']} D={r['d']} ({r['model_bytes'] / 1e6:.1f} MB of centres), P={w}: driver "
                f"{r['driver_bytes_in'] / 1e6:.3f} MB in / {r['driver_bytes_out'] / 1e6:.3f} MB out, "
                f"{r['driver_s_per_iteration'] * 1e3:.0f} ms per iteration; sharded "
                f"{r['sharded_bytes_in'] / 1e6:.3f} MB in / {r['sharded_bytes_out'] / 1e6:.3f} MB out, "
                f"{r['sharded_s_per_iteration'] * 1e3:.0f} ms; same bits: {r['same_bits']}"
            )


if __name__ == "__main__":
    main()
