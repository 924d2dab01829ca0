"""``python benchmarks/run.py``: run a suite (its JSON lines to ``results/suite-<suite>.jsonl``) and write
BENCHMARKS.md and its plots from the results directory."""

import argparse
import logging
import os
import sys

from . import report, suites
from .common import HERE


def build_parser():
    p = argparse.ArgumentParser(
        prog="python benchmarks/run.py",
        description="Benchmark suites (JSON lines) and the BENCHMARKS.md page they make.",
    )
    p.add_argument(
        "--suite",
        choices=["quick", "paper", "scaling", "sweep", "streaming"],
        help="quick: every algorithm and competitor on 5 data sets (< 10 min); paper: the papers' "
        "experiments too (< 60 min); scaling: 1 vs 2 workers and overhead vs workers; sweep: "
        "time against C = 500 to 4,096 on blobs 1M x 32 (about 60 min); streaming: fits on zarr stores 2x and "
        "10x the memory of memory-limited workers (about 30 min)",
    )
    p.add_argument("--tiny", action="store_true", help="2,000 rows per data set, one repeat: a smoke run")
    p.add_argument(
        "--results",
        default=os.path.join(HERE, "results"),
        help="directory of the suites' JSON lines and the plots (default: benchmarks/results)",
    )
    p.add_argument("--out", help="write the JSON lines here instead (the page is then not rewritten)")
    p.add_argument("--page", default=os.path.join(HERE, "BENCHMARKS.md"), help="the page to write")
    p.add_argument("--report", action="store_true", help="rewrite the page from the results directory")
    p.add_argument("--scheduler", help="address of a running scheduler (default: dask_clust's LocalCluster)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress on stderr")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not (args.suite or args.report):
        build_parser().error("nothing to do: give --suite and/or --report")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    from dask_clust.engine.local import connect

    os.makedirs(args.results, exist_ok=True)
    if args.suite:
        out = args.out or os.path.join(args.results, f"suite-{args.suite}{'-tiny' if args.tiny else ''}.jsonl")
        # a suite's file holds its latest run only: the page is always one run's measurements
        with open(out, "w") as f, connect(args.scheduler) as client:
            suites.run_suite(args.suite, f, client, tiny=args.tiny)
    if args.report or (args.suite and not args.tiny and not args.out):
        print(f"wrote {report.write(args.results, args.page, tiny=args.tiny)}", file=sys.stderr)
    return 0
