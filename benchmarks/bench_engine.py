"""Engine overhead: one empty iteration (a reduce of an empty step over every partition) on
LocalCluster(n_workers=2, threads_per_worker=1) at 16 and 128 chunks (issue #2: <= 10 ms, and < 20 %
growth from 16 to 128 chunks).

On 2 cores the scheduler, both workers and the driver share the machine, so sequential medians drift
by tens of percent between runs. Both engines are therefore open at once and their empty iterations
interleaved, round by round, so drift hits both alike; the medians of the two interleaved series and
the median of the per-round ratios are reported.
"""

import argparse
import contextlib
import statistics

import numpy as np

from dask_clust.engine import as_source, open_engine
from harness.common import emit, local_cluster


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=100)
    args = p.parse_args()
    X = np.random.default_rng(0).random((128 * 1000, 16), dtype=np.float32)
    sizes = (16, 128)
    with local_cluster(2, 1) as client, contextlib.ExitStack() as stack:
        engines = {
            c: stack.enter_context(open_engine(as_source(X, chunk_rows=X.shape[0] // c), client, 0)) for c in sizes
        }
        for c, eng in engines.items():
            assert eng.n_chunks == c and eng.n_workers == 2
            eng.overhead_ms(10)  # warm up
        series = {c: [] for c in sizes}
        for _ in range(args.rounds):
            for c in sizes:
                series[c].append(engines[c].empty_iteration_ms())
    med = {c: statistics.median(series[c]) for c in sizes}
    ratio = statistics.median(b / a for a, b in zip(series[16], series[128]))
    for c in sizes:
        emit(
            "engine_overhead",
            {
                "backend": "cluster",
                "workers": 2,
                "threads_per_worker": 1,
                "chunks": c,
                "rounds": args.rounds,
                "median_ms_per_empty_iteration": med[c],
            },
        )
    emit("engine_overhead_growth", {"chunks": list(sizes), "median_ratio_128_over_16": ratio})
    with open_engine(as_source(X, chunk_rows=X.shape[0] // 16), "in-process", 0) as eng:
        emit(
            "engine_overhead",
            {"backend": "in-process", "chunks": 16, "median_ms_per_empty_iteration": eng.overhead_ms(20)},
        )
    print(
        f"\nempty iteration (median of {args.rounds} interleaved rounds): {med[16]:.2f} ms at 16 chunks, "
        f"{med[128]:.2f} ms at 128 chunks; per-round ratio 128/16 = {ratio:.3f} "
        f"(growth {100 * (ratio - 1):+.1f} %); target <= 10 ms and < 20 %"
    )


if __name__ == "__main__":
    main()
