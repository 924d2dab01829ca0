"""Command line: ``dask-clust fit | predict | demo | bench``.

Algorithm flags are generated from the registry's config dataclasses. Bad input exits with status 2
and one line on stderr; an unexpected failure exits with 1 and its traceback.
"""
import argparse
import ast
import contextlib
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import fields

import numpy as np

from . import algorithms, api
from ._params import InvalidParameterError
from .engine.cluster import connect
from .engine.data import InputError

EXIT_BAD_INPUT = 2


def _value(text):
    """A flag value: a Python literal (int, float, None, tuple) or, failing that, the text itself;
    a path ending in .npy is loaded (an initial-centres array for ``--init``)."""
    if text.endswith(".npy") and os.path.exists(text):
        return np.load(text, allow_pickle=False)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _algorithm_flags(parser):
    seen = {}
    for spec in algorithms.REGISTRY.values():
        for f in fields(spec.config):
            seen.setdefault(f.name, []).append(spec.name)
    group = parser.add_argument_group("algorithm parameters (from the registry; defaults are each algorithm's)")
    for name, algos in sorted(seen.items()):
        flags = ["-k", "--n-clusters"] if name == "n_clusters" else ["--" + name.replace("_", "-")]
        group.add_argument(*flags, dest="p_" + name, type=_value, default=None, metavar="VALUE",
                           help=f"{name} (for {', '.join(algos)})")


def _params(args):
    return {k[2:]: v for k, v in vars(args).items() if k.startswith("p_") and v is not None}


@contextlib.contextmanager
def _client(address):
    """A client for --scheduler, kept current for the whole command so lazy outputs compute there."""
    if not address:
        yield None
        return
    with connect(address) as client:
        yield client


def _write_labels(labels, path):
    if path.endswith(".npy"):
        np.save(path, labels.compute())
    elif path.endswith(".parquet"):
        import dask.dataframe as dd

        dd.from_dask_array(labels, columns=["label"]).to_parquet(path)
    else:
        labels.to_zarr(path, overwrite=True)


def _summary(model, wall):
    its = [h["wall_s"] for h in model.history_]
    return {"algo": model.algo, "n_clusters": model.n_clusters, "objective": model.objective_,
            "n_iter": model.n_iter_, "converged": model.converged_, "distance_evals": model.n_distance_evals_,
            "s_per_iter": statistics.median(its) if its else None, "wall_s": wall, **model.engine_}


def cmd_fit(args):
    params = _params(args)
    algo = args.algo
    with _client(args.scheduler) as client:
        t = time.perf_counter()
        model = api.fit(args.input, algo, random_state=args.seed, client=client, progress=not args.quiet,
                        **params)
        wall = time.perf_counter() - t
        if args.out:
            model.save(args.out)
        if args.labels_out:
            _write_labels(model.predict(args.input), args.labels_out)
    print(json.dumps(_summary(model, wall)))


def cmd_predict(args):
    model = api.load(args.model)
    with _client(args.scheduler):
        _write_labels(model.predict(args.input), args.out)
    print(json.dumps({"model": args.model, "labels": args.out}))


def _table(rows):
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    line = "  ".join(k.ljust(w) for k, w in zip(keys, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(str(r[k]).ljust(w) for k, w in zip(keys, widths)) for r in rows]
    return "\n".join(out)


def cmd_demo(args):
    from .datasets import make_blobs

    X, _ = make_blobs(args.n, args.d, args.true_clusters, random_state=args.seed)
    print(f"dask_clust demo: k-means on {args.n:,} x {args.d} synthetic blobs ({args.true_clusters} true "
          f"clusters + 10% background), generated lazily, on a LocalCluster", flush=True)
    t = time.perf_counter()
    model = api.fit(X, "kmeans", args.k, init="k-means||", random_state=args.seed, progress=True)
    wall = time.perf_counter() - t
    its = [h["wall_s"] for h in model.history_]
    print(_table([{
        "algorithm": "kmeans (k-means||)", "k": args.k, "QE": f"{model.objective_:.6g}",
        "time_s": f"{wall:.1f}", "iterations": model.n_iter_, "converged": model.converged_,
        "s/iteration": f"{statistics.median(its):.3f}", "distance_evals": f"{model.n_distance_evals_:.3g}",
        "workers": model.engine_.get("workers"),
    }]))


def cmd_bench(args):
    from .bench import report, suites

    os.makedirs(args.results, exist_ok=True)
    if args.suite:
        out = args.out or os.path.join(args.results, f"suite-{args.suite}{'-tiny' if args.tiny else ''}.jsonl")
        # a suite's file holds its latest run only: the page is always one run's measurements
        with open(out, "w") as f, connect(args.scheduler) as client:
            suites.run_suite(args.suite, f, client, tiny=args.tiny)
    if args.report or (args.suite and not args.tiny and not args.out):
        print(f"wrote {report.write(args.results, args.page, tiny=args.tiny)}", file=sys.stderr)


def build_parser():
    p = argparse.ArgumentParser(prog="dask-clust", description="Clustering for data too large for one machine.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log on stderr (-v info, -vv debug)")
    sub = p.add_subparsers(dest="command", required=True)

    f = sub.add_parser("fit", help="fit a model to a .npy file, a zarr array/group or a parquet dataset")
    f.add_argument("input")
    f.add_argument("--algo", default="kmeans", choices=sorted(algorithms.REGISTRY))
    f.add_argument("--seed", type=int, default=None, help="random_state")
    f.add_argument("--scheduler", help="address of a running Dask scheduler (default: a LocalCluster)")
    f.add_argument("--out", help="directory to save the model to")
    f.add_argument("--labels-out", help="write the training labels (.npy, .parquet, or a zarr path)")
    f.add_argument("--quiet", action="store_true", help="no progress display")
    _algorithm_flags(f)
    f.set_defaults(func=cmd_fit)

    pr = sub.add_parser("predict", help="label rows with a saved model")
    pr.add_argument("model")
    pr.add_argument("input")
    pr.add_argument("--out", required=True, help="where to write the labels (.npy, .parquet, or a zarr path)")
    pr.add_argument("--scheduler")
    pr.set_defaults(func=cmd_predict)

    d = sub.add_parser("demo", help="fit k-means to 2M x 32 lazily generated blobs on a LocalCluster")
    d.add_argument("--n", type=int, default=2_000_000)
    d.add_argument("--d", type=int, default=32)
    d.add_argument("-k", type=int, default=100)
    d.add_argument("--true-clusters", type=int, default=100)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="benchmark suites (JSON lines) and the BENCHMARKS.md page they make")
    b.add_argument("--suite", choices=["quick", "paper", "scaling"],
                   help="quick: every algorithm and competitor on 5 data sets (< 10 min); paper: the papers' "
                        "experiments too (< 60 min); scaling: 1 vs 2 workers and overhead vs workers")
    b.add_argument("--tiny", action="store_true", help="2,000 rows per data set, one repeat: a smoke run")
    b.add_argument("--results", default=os.path.join("benchmarks", "results"),
                   help="directory of the suites' JSON lines and the plots (default: benchmarks/results)")
    b.add_argument("--out", help="write the JSON lines here instead (the page is then not rewritten)")
    b.add_argument("--page", default=os.path.join("benchmarks", "BENCHMARKS.md"), help="the page to write")
    b.add_argument("--report", action="store_true", help="rewrite the page from the results directory")
    b.add_argument("--scheduler", help="address of a running scheduler (default: a LocalCluster)")
    b.set_defaults(func=cmd_bench)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("distributed").setLevel(max(level, logging.WARNING))
    try:
        args.func(args)
    except (InputError, InvalidParameterError, FileNotFoundError) as exc:
        print(f"dask-clust: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("dask-clust: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
