"""Command line: ``dask-clust fit | predict | demo | compile`` (the benchmark suites are ``benchmarks/run.py`` in the
repository, outside the installed package).

Algorithm flags are generated from the registry's config dataclasses (their help is each parameter's
meaning and every algorithm's default). Bad input, including an output path that cannot be written or an
unreachable scheduler, exits with status 2 and one line on stderr before any work; Ctrl-C exits with 130
and one line; an unexpected failure exits with 1 and its traceback. Heavy modules (numba, dask,
scikit-learn) are imported only by the command that runs, so ``--help`` and ``--version`` answer at once.
"""

import argparse
import ast
import contextlib
import json
import logging
import os
import signal
import statistics
import sys
import threading
import time

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
COMMANDS = ("fit", "sweep", "predict", "show", "demo", "compile")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (status 2) that points at --help, and a flag is only its whole
    name: argparse's abbreviations took ``--n-init 3`` silently as ``--n-init-esteps 3``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """A flag's default in its help, once: not where the help already says it, nor for a flag without one
    (None) or a switch (False)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.default in (None, False):
            return text
        return super()._get_help_string(action)


def _value(text):
    """A flag value: a Python literal (int, float, None, tuple) or, failing that, the text itself;
    a path ending in .npy is loaded (an initial-centres array for ``--init``)."""
    if text.endswith(".npy") and os.path.exists(text):
        import numpy as np

        return np.load(text, allow_pickle=False)
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _positive_int(text):
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {value}")
    return value


def _algorithm_flags(parser):
    """One flag per parameter of any registered algorithm, its help the parameter's meaning and defaults."""
    from dataclasses import MISSING, fields

    from . import algorithms
    from ._params import describe

    seen = {}
    for spec in algorithms.REGISTRY.values():
        for f in fields(spec.config):
            default = f.default if f.default is not MISSING else f.default_factory()
            seen.setdefault(f.name, []).append((spec, default))
    group = parser.add_argument_group("algorithm parameters (from the registry; each algorithm has its own default)")
    for name, uses in sorted(seen.items()):
        flags = ["-k", "--n-clusters"] if name == "n_clusters" else ["--" + name.replace("_", "-").lower()]
        if name != name.lower():  # the paper's G: lower case as every other flag, its own name still taken
            flags.append("--" + name)
        defaults = "; ".join(f"{spec.name}: {default!r}" for spec, default in uses)
        meaning = describe(uses[0][0].config, name)
        group.add_argument(
            *flags,
            dest="p_" + name,
            type=_value,
            default=argparse.SUPPRESS,
            metavar="VALUE",
            help=f"{meaning} Default {defaults}.".replace("%", "%%"),
        )
    return algorithms


def _params(args):
    return {k[2:]: v for k, v in vars(args).items() if k.startswith("p_") and v is not None}


def _progress(args):
    """--progress / --quiet, else None: bars only when stderr is a terminal."""
    return True if args.progress else False if args.quiet else None


def _summary(model, wall):
    its = [h["wall_s"] for h in model.history_]
    return {
        "algo": model.algo,
        "n_clusters": model.n_clusters,
        "objective": model.objective_,
        "n_iter": model.n_iter_,
        "converged": model.converged_,
        "distance_evals": model.n_distance_evals_,
        "s_per_iter": statistics.median(its) if its else None,
        "wall_s": wall,
        **({"features": list(model.feature_names_in_)} if "feature_names_in_" in model.__dict__ else {}),
        **model.engine_,
    }


@contextlib.contextmanager
def _client(address):
    from .engine.local import connect
    from .errors import ClusterLost

    if not address:
        yield None
        return
    with connect(address) as client:
        try:
            yield client
        except ClusterLost:
            # the client's reconnecting and closing would log, over tens of lines, the loss the one line names
            logging.disable(logging.CRITICAL)
            raise


def _names(text):
    """A comma-separated list of column names (None when the flag is not given)."""
    return None if text is None else [c.strip() for c in text.split(",")]


def _columns(text, path):
    """``--columns``: names, shell patterns (``f_*``) and exclusions (``-id``, after ``--columns=``), resolved
    against the table's columns in their order; the names as given when there is no pattern; None when the
    flag is not given. Only exclusions: every other column."""
    import fnmatch

    from .engine.data import feature_names
    from .errors import InputError

    names = _names(text)
    if names is None or not any(n.startswith("-") or any(ch in n for ch in "*?[") for n in names):
        return names
    table = feature_names(path)
    if table is None:
        raise InputError(f"--columns selects columns of a table (a parquet dataset); {path} is not one")
    keep = [n for n in names if not n.startswith("-")]
    drop = [n[1:] for n in names if n.startswith("-")]
    unmatched = [p for p in keep + drop if not fnmatch.filter(table, p)]
    if unmatched:
        raise InputError(f"--columns {unmatched} match no column; the columns are {table}")
    chosen = [c for c in table if (not keep or any(fnmatch.fnmatchcase(c, p) for p in keep))]
    chosen = [c for c in chosen if not any(fnmatch.fnmatchcase(c, p) for p in drop)]
    if not chosen:
        raise InputError(f"--columns {text} leaves no column of {table}")
    return chosen


def cmd_fit(args):
    from . import api
    from .engine.data import select_columns
    from .outputs import check_labels_path, check_model_dir, write_rows

    if args.out:
        check_model_dir(args.out, "--out")
    if args.labels_out:
        check_labels_path(args.labels_out, "--labels-out")
    params = _params(args)
    columns = _columns(args.columns, args.input)
    X = select_columns(args.input, columns)  # a bad column name is refused before a cluster starts
    with _client(args.scheduler) as client:
        t = time.perf_counter()
        model = api.fit(
            args.input,
            args.algo,
            columns=columns,
            random_state=args.seed,
            client=client,
            progress=_progress(args),
            checkpoint=args.checkpoint,
            checkpoint_every=args.checkpoint_every,
            **params,
        )
        wall = time.perf_counter() - t
        if args.out:
            model.save(args.out)
        if args.labels_out:
            write_rows(model.predict(X if args.columns else args.input), args.labels_out)
    print(json.dumps(_summary(model, wall)))


def cmd_sweep(args):
    from . import sweeps

    params = _params(args)
    ks = params.pop("n_clusters", None)
    ks = [ks] if isinstance(ks, int) else ks
    columns = _columns(args.columns, args.input)
    with _client(args.scheduler) as client:
        result = sweeps.sweep(
            args.input,
            args.algo,
            ks,
            columns=columns,
            criterion=args.criterion,
            random_state=args.seed,
            client=client,
            silhouette_size=args.silhouette_size or None,
            shared_seeding=not args.own_seeding,
            progress=_progress(args),
            **params,
        )
    if args.table_out:
        result.table.to_csv(args.table_out)
    table = result.table.reset_index().to_dict(orient="records")
    print(json.dumps({"algo": result.algo, "criterion": result.criterion, "best_k": result.best_k_, "table": table}))


def _features(model, path, columns):
    """A table's feature columns (by default those the model was fitted on), lazily."""
    from .engine.data import open_path, select_columns

    table = open_path(path)
    if columns is None and hasattr(model, "feature_names_in_"):
        columns = list(model.feature_names_in_)
    return table, select_columns(table, columns) if columns else table


def _labels_of_table(model, path, columns, keep):
    """``predict`` of a table's feature columns, with the ``keep`` columns beside the labels."""
    from .engine.data import select_columns

    table, X = _features(model, path, columns)
    labels = model.predict(X)
    return select_columns(table, keep).assign(label=labels) if keep else labels


def _posteriors(model, path, table, columns, keep, suffix):
    """``predict --proba-out``: a .parquet gets each row's C' likeliest components and their probabilities
    (``predict_proba`` of a DataFrame), beside the ``keep`` columns; a .npy or .zarr the dense (n, k) matrix.
    ``table``: whether ``path`` is a parquet dataset."""
    import dask.dataframe as dd

    from .engine.data import as_dask_rows, select_columns
    from .errors import InputError

    if model.kind != "mixture":
        raise InputError(
            f"--proba-out: a {model.algo} model has no probabilities (a mixture's has: vcgmm, vargmm, GaussianMixture)"
        )
    rows, X = _features(model, path, columns) if table else (None, as_dask_rows(path, model.n_features_in_))
    if suffix != ".parquet":
        return model.predict_proba(X, output="dense")
    if not table:  # read as a frame, by position
        X = dd.from_dask_array(X, columns=[str(j) for j in range(X.shape[1])])
    proba = model.predict_proba(X, output="truncated")
    return select_columns(rows, keep).assign(**{c: proba[c] for c in proba.columns}) if keep else proba


def cmd_predict(args):
    from . import api, progress
    from .engine.counted import compute
    from .engine.data import feature_names
    from .errors import InputError
    from .outputs import check_labels_path, write_rows

    if not (args.out or args.proba_out):
        raise InputError("predict writes --out (the labels), --proba-out (the probabilities) or both; give one")
    outputs = [
        (flag, path, check_labels_path(path, flag))
        for flag, path in (("--out", args.out), ("--proba-out", args.proba_out))
        if path
    ]
    columns, keep = _columns(args.columns, args.input), _names(args.keep)
    wrong = [(flag, path) for flag, path, suffix in outputs if suffix != ".parquet"]
    if keep and wrong:
        raise InputError(
            f"--keep writes columns beside the labels or probabilities: {wrong[0][0]} must be a .parquet path; "
            f"got {wrong[0][1]}"
        )
    table = feature_names(args.input) is not None
    if (columns or keep) and not table:
        raise InputError(f"--columns and --keep name columns of a table (a parquet dataset); {args.input} is not one")
    model = api.load(args.model)
    with progress.reporting(_progress(args)), _client(args.scheduler):
        for flag, path, suffix in outputs:
            if flag == "--out":
                rows = _labels_of_table(model, args.input, columns, keep) if table else model.predict(args.input)
            else:
                rows = _posteriors(model, args.input, table, columns, keep, suffix)
            write_rows(
                rows,
                path,
                lambda collection: compute(collection, "writing " + ("labels" if flag == "--out" else "probabilities")),
            )
    print(json.dumps({"model": args.model, "labels": args.out, "probabilities": args.proba_out}))


def cmd_show(args):
    import numpy as np

    from . import api

    model = api.load(args.model)
    centers = model.cluster_centers_
    names = model.__dict__.get("feature_names_in_")
    print(
        json.dumps(
            {
                "model": args.model,
                "kind": model.kind,
                "algo": model.algo,
                "n_clusters": int(centers.shape[0]),
                "n_features": int(centers.shape[1]),
                "feature_names": None if names is None else [str(n) for n in names],
                "objective": model.objective_,
                "n_iter": model.n_iter_,
                "converged": model.converged_,
                "written_by": model.written_by,
                "params": {k: f"array {v.shape}" if isinstance(v, np.ndarray) else v for k, v in model.params.items()},
            },
            indent=1,
            default=str,
        )
    )


def _table(rows):
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    line = "  ".join(k.ljust(w) for k, w in zip(keys, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(str(r[k]).ljust(w) for k, w in zip(keys, widths)) for r in rows]
    return "\n".join(out)


def cmd_compile(args):
    import numba

    from . import warmup

    where = numba.config.CACHE_DIR or "the package's __pycache__ (set NUMBA_CACHE_DIR to choose)"
    cpu = numba.config.CPU_NAME or "this machine's CPU (set NUMBA_CPU_NAME for a cache other machines can use)"
    print(f"compiling dask_clust's kernels into {where}, for {cpu}", flush=True)
    t = time.perf_counter()
    try:
        warmup.compile_kernels()
    except RuntimeError as exc:  # the failing part's traceback is above: one line more, status 1
        raise SystemExit(f"dask-clust: error: {exc}") from None
    print(f"done in {time.perf_counter() - t:.0f} s")


def cmd_demo(args):
    from . import api
    from .datasets import make_blobs
    from .errors import InputError

    if args.k > args.n or args.true_clusters > args.n:
        raise InputError(f"demo: -k ({args.k}) and --true-clusters ({args.true_clusters}) must be <= --n ({args.n})")
    X, _ = make_blobs(args.n, args.d, args.true_clusters, random_state=args.seed)
    print(
        f"dask_clust demo: k-means on {args.n:,} x {args.d} synthetic blobs ({args.true_clusters} true "
        f"clusters + 10% background), generated lazily, on a LocalCluster",
        flush=True,
    )
    t = time.perf_counter()
    model = api.fit(X, "kmeans", args.k, init="k-means||", random_state=args.seed, progress=_progress(args))
    wall = time.perf_counter() - t
    its = [h["wall_s"] for h in model.history_]
    print(
        _table(
            [
                {
                    "algorithm": "kmeans (k-means||)",
                    "k": args.k,
                    "QE": f"{model.objective_:.6g}",
                    "time_s": f"{wall:.1f}",
                    "iterations": model.n_iter_,
                    "converged": model.converged_,
                    "s/iteration": f"{statistics.median(its):.3f}",
                    "distance_evals": f"{model.n_distance_evals_:.3g}",
                    "workers": model.engine_.get("workers"),
                }
            ]
        )
    )


def _command(argv):
    """The subcommand named in argv (the first word that is one), so only its flags are built."""
    return next((a for a in argv if a in COMMANDS), None)


def build_parser(argv=()):
    """The parser; the algorithm flags (which import the registry) only when argv's command is ``fit``."""
    from . import __version__

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log on stderr (-v info, -vv debug); accepted before or after the command",
    )
    p = _Parser(prog="dask-clust", description="Clustering for data too large for one machine.", parents=[common])
    p.add_argument("--version", action="version", version=f"dask-clust {__version__}")
    sub = p.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="{fit,sweep,predict,demo,compile}"
    )

    def progress_flags(parser):
        parser.add_argument(
            "--progress",
            action="store_true",
            help="show progress even when stderr is not a terminal (one line per phase)",
        )
        parser.add_argument("--quiet", action="store_true", help="no progress display")

    def fitting_flags(parser):
        """What ``fit`` and ``sweep`` both read: the input, its feature columns, the seed and the scheduler."""
        parser.add_argument("input", help="a .npy file, a zarr array or group, or a parquet dataset (rows are samples)")
        parser.add_argument(
            "--columns",
            metavar="A,B,...",
            help="the feature columns of a parquet input: names, shell patterns (f_*), exclusions "
            "(--columns=-id,-label: every other column) (default: all)",
        )
        parser.add_argument("--seed", type=int, default=None, help="random_state")
        parser.add_argument("--scheduler", help="address of a running Dask scheduler (default: a LocalCluster)")

    def algorithm_flags(parser, command):
        """The progress flags, and when argv's command is ``command`` the registry's (which import it)."""
        progress_flags(parser)
        if _command(argv) == command:
            algorithms = _algorithm_flags(parser)
            choices = sorted(algorithms.REGISTRY)
            parser.add_argument("--algo", default=algorithms.DEFAULT, choices=choices, help="the algorithm")

    f = sub.add_parser(
        "fit",
        parents=[common],
        help="fit a model to a .npy file, a zarr array/group or a parquet dataset",
        formatter_class=_Defaults,
    )
    fitting_flags(f)
    f.add_argument("--out", help="directory to save the model to (checked before the fit)")
    f.add_argument("--labels-out", help="write the training labels here: .npy, .parquet or .zarr (by suffix)")
    f.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="write the fit's state here as it runs; run the same command again to continue from it "
        "(on a cluster: a directory the workers share)",
    )
    f.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        default=10,
        metavar="N",
        help="iterations between checkpoints (one is also written every 5 minutes and at the end)",
    )
    algorithm_flags(f, "fit")
    f.set_defaults(func=cmd_fit)

    sw = sub.add_parser(
        "sweep",
        parents=[common],
        help="fit one algorithm for many k (-k 2,4,8,16) and print each k's criteria and the k they pick, as JSON",
        formatter_class=_Defaults,
    )
    fitting_flags(sw)
    sw.add_argument(
        "--criterion",
        help="the criterion that picks k: inertia, calinski_harabasz, davies_bouldin, simplified_silhouette, "
        "silhouette, bic, aic (default: bic for a mixture, else simplified_silhouette)",
    )
    sw.add_argument(
        "--silhouette-size", type=int, default=10_000, help="rows of the exact silhouette's sample (0: none)"
    )
    sw.add_argument(
        "--own-seeding",
        action="store_true",
        help="each k draws its own k-means|| rounds, so its model is fit's (default: drawn once, for the largest k)",
    )
    sw.add_argument("--table-out", metavar="CSV", help="write the table (one row per k) here as CSV")
    algorithm_flags(sw, "sweep")
    sw.set_defaults(func=cmd_sweep)

    pr = sub.add_parser("predict", parents=[common], help="label rows with a saved model")
    pr.add_argument("model", help="a directory written by fit --out")
    pr.add_argument("input", help="a .npy file, a zarr array or group, or a parquet dataset")
    pr.add_argument("--out", help="where to write the labels: .npy, .parquet or .zarr (by suffix)")
    pr.add_argument(
        "--proba-out",
        help="where to write a mixture model's probabilities: a .parquet gets each row's likeliest components "
        "and their probabilities (component_1, probability_1, ...; every other component's is 0), a .npy or "
        ".zarr the dense rows x k matrix",
    )
    pr.add_argument(
        "--columns",
        metavar="A,B,...",
        help="the feature columns of a parquet input (default: those the model was fitted on)",
    )
    pr.add_argument(
        "--keep",
        metavar="A,B,...",
        help="columns of a parquet input written beside the labels (keys, say); needs a .parquet --out",
    )
    pr.add_argument("--scheduler", help="address of a running Dask scheduler (default: in-process or a LocalCluster)")
    progress_flags(pr)
    pr.set_defaults(func=cmd_predict)

    sh = sub.add_parser("show", parents=[common], help="what a saved model holds, as JSON")
    sh.add_argument("model", help="a directory written by fit --out")
    sh.set_defaults(func=cmd_show)

    d = sub.add_parser(
        "demo",
        parents=[common],
        help="fit k-means to 2M x 32 lazily generated blobs on a LocalCluster",
        formatter_class=_Defaults,
    )
    d.add_argument("--n", type=_positive_int, default=2_000_000, help="rows")
    d.add_argument("--d", type=_positive_int, default=32, help="features")
    d.add_argument("-k", type=_positive_int, default=100, help="clusters to fit")
    d.add_argument("--true-clusters", type=_positive_int, default=100, help="blobs generated")
    d.add_argument("--seed", type=int, default=0, help="random_state of the data and the fit")
    progress_flags(d)
    d.set_defaults(func=cmd_demo)

    c = sub.add_parser(
        "compile",
        parents=[common],
        help="compile every numba kernel into numba's cache ahead of the first fit (an image's build, a "
        "shared environment)",
    )
    c.set_defaults(func=cmd_compile)

    return p


def _bad_input(exc):
    """Whether ``exc`` is the user's input being refused (status 2, one line), not a defect."""
    from .errors import InputError, InvalidModelError, InvalidParameterError, SchedulerUnreachable

    return isinstance(
        exc, (InputError, InvalidParameterError, InvalidModelError, SchedulerUnreachable, FileNotFoundError)
    )


def _one_line(exc):
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:397] + "..."


_INTERRUPTED = threading.Event()


def _interrupted(signum, frame):
    """Ctrl-C: one line; the worker processes of a cluster this command started are stopped at once (they
    ignore SIGINT, ``local._local_cluster``, and would log the cancelled work), then the driver unwinds
    quietly. A second Ctrl-C leaves at once.

    Python drops an exception raised while a finaliser runs (a distributed ``Future`` released by the
    garbage collector, say): the KeyboardInterrupt can be lost, and the fit would recover from its killed
    workers and end as if nothing happened. So the interruption is also remembered (``main`` then exits
    130 whatever the command returned) and the process leaves by itself if it has not unwound in 30 s."""
    import psutil

    _INTERRUPTED.set()
    signal.signal(signal.SIGINT, lambda *_: os._exit(EXIT_INTERRUPTED))
    leave = threading.Timer(30.0, os._exit, (EXIT_INTERRUPTED,))
    leave.daemon = True
    leave.start()
    sys.stderr.write("dask-clust: interrupted\n")
    sys.stderr.flush()
    logging.disable(logging.CRITICAL)
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()
    raise KeyboardInterrupt


def main(argv=None):
    """The ``dask-clust`` command (argv None: the process's own arguments, and Ctrl-C handled as above)."""
    from .errors import ClusterLost

    if argv is None:
        signal.signal(signal.SIGINT, _interrupted)
    args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(getattr(args, "verbose", 0), logging.DEBUG)
    if level > logging.INFO and argv is None:
        # distributed sets its loggers from dask's config when first imported, after the level below, and
        # a LocalCluster's processes inherit the environment: without -v, its INFO lines stay out (only
        # in the command's own process: main(argv) called in a program leaves its environment alone)
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("distributed").setLevel(max(level, logging.WARNING))
    try:
        args.func(args)
    except KeyboardInterrupt:
        if argv is not None:
            print("dask-clust: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ClusterLost as exc:  # not a defect of this program: its traceback would hide the one line
        print(f"dask-clust: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        if not _bad_input(exc):
            raise
        print(f"dask-clust: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_INTERRUPTED if _INTERRUPTED.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
