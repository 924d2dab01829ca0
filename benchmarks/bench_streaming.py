"""Beyond memory (issue #51): streamed fits on a zarr store several times the memory of a LocalCluster whose
workers' ``memory_limit`` is set low (the experiment: ``harness/streaming.py``; ``python benchmarks/run.py
--suite streaming`` runs both of its cases and puts them in BENCHMARKS.md). One case here, its rows to
``results/streaming.jsonl`` and a line each:

    python benchmarks/bench_streaming.py [--times 2] [--workers 2] [--worker-mib 700] [--algos kmeans,vcgmm]
    python benchmarks/bench_streaming.py --times 10 --algos kmeans,nmbatch    # the state in the workers' files
"""

import argparse
import logging

from harness.common import emit
from harness.streaming import CHUNK_MIB, FITS, STORE_ROWS, WORKER_MIB, streamed


def show(row):
    emit("streaming", row)
    passes, wall = row["passes"], row["wall_s"]
    per_pass = (
        f"{passes:.2f} passes, {wall / passes:.1f} s a pass ({row['pass_vs_floor']:.2f}x floor), " if passes else ""
    )
    print(
        f"{row['algo']} at {row['times_memory']:g}x memory: {row['outcome'][:200]}; {wall:.1f} s, {per_pass}worker "
        f"peak {row['peak_worker_bytes'] / 2**20:.0f} MiB ({row['peak_of_limit']:.0%} of the limit), "
        f"{row['pausing_events']} pauses; floor {row['floor_pass_s']:.1f} s ({'cold' if row['cold'] else 'warm'}); "
        f"estimated {(row['estimate_bytes'] or 0) / 2**20:.0f} MiB",
        flush=True,
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--times", type=float, default=2.0, help="the store's size over the cluster's memory")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-mib", type=int, default=WORKER_MIB)
    p.add_argument("--store-rows", type=int, default=STORE_ROWS, help="rows per zarr chunk (30 MiB at 32-d)")
    p.add_argument("--chunk-mib", type=int, default=CHUNK_MIB, help="dask_clust.chunk-bytes, in MiB")
    p.add_argument("--algos", default="kmeans,vcgmm,GaussianMixture", help=f"of {', '.join(FITS)}")
    p.add_argument("--scratch", default=None, help="where the store is written (default: the temp directory)")
    p.add_argument("--format", default="zarr", choices=["zarr", "parquet"], help="how the store is written")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    streamed(
        show,
        args.times,
        args.algos.split(","),
        args.workers,
        args.worker_mib,
        args.store_rows,
        args.chunk_mib,
        args.scratch,
        kind=args.format,
    )


if __name__ == "__main__":
    main()
