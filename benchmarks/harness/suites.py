"""The suites of ``benchmarks/run.py --suite quick|paper|scaling|sweep``: JSON lines, one per measurement.

Every row of a table carries ``eta`` (QE relative to scikit-learn's k-means++ Lloyd, minus 1) and
``speedup`` (that fit's wall time over this row's), both from measurements of the same run, the same data,
k and seed. ``--tiny`` (CI's smoke run) keeps 2,000 rows of each set, one repeat and one seed: it checks
that every experiment runs and reports, not how fast.
"""

import json
import logging
import os
import platform
import tempfile
import time
from dataclasses import fields

import numpy as np

from dask_clust import algorithms

from . import measure, paper, scaling, streaming, sweep
from .data import materialise, read
from .measure import TINY_LOOP

logger = logging.getLogger("harness")

BASELINE = "sklearn-lloyd"
BASELINE_CAP_S = 900.0
# (data, k): the data sets every algorithm is fitted to; the paper suite adds the largest real set (the
# page shows both suites' tables)
QUICK_TABLES = (("iris", 3), ("digits", 10), ("shuttle", 7), ("mnist5k", 10), ("blobs200k_d32", 100))
PAPER_TABLES = (("imgpatches", 50),)
# variants beyond each registered algorithm's defaults
VARIANTS = {"kmeans": [("kmeans++", {"init": "k-means++"})]}
# scored by their labels, not in the QE tables: SLK's modes live on the L2-normalised rows (``slk_quality``)
NOT_QE = ("slk",)


def our_fits(tiny=False):
    """(label, algo, params): every registered algorithm but ``NOT_QE`` with its defaults, plus ``VARIANTS``;
    tiny: with their loop cut to a few iterations (the smoke run checks that they run, not what they reach)."""
    for name, spec in algorithms.REGISTRY.items():
        if name in NOT_QE:
            continue
        cut = {f.name: TINY_LOOP[f.name] for f in fields(spec.config) if f.name in TINY_LOOP} if tiny else {}
        yield name, name, cut
        for label, params in VARIANTS.get(name, []):
            yield label, name, {**params, **cut}


class Run:
    """One suite run: where rows go, the cluster our fits use, the scratch directory of the data files."""

    def __init__(self, suite, out, client, tiny=False, repeats=3, cap_s=300.0):
        self.suite, self.out, self.client, self.tiny = suite, out, client, tiny
        self.repeats = 1 if tiny else repeats
        self.cap_s = cap_s
        self._baselines = {}
        self._warmed = set()
        self.scratch = tempfile.mkdtemp(prefix="dask-clust-bench-")
        self.run_id = time.strftime("%Y%m%dT%H%M%S")
        self.emit({"kind": "machine", **machine()})

    def emit(self, row):
        line = json.dumps({"suite": self.suite, "run": self.run_id, **row}, default=float)
        print(line, flush=True)
        self.out.write(line + "\n")
        self.out.flush()

    def data(self, name):
        path = materialise(name, self.scratch, self.tiny)
        return path, read(path)

    def save(self, name, X):
        """A derived array (a shuffled split, ...) as .npy in the scratch directory, for fits to read."""
        path = os.path.join(self.scratch, f"{name}.npy")
        np.save(path, X)
        return path

    def table(self, name, k, seeds):
        """Every fit of ``our_fits`` and every competitor on one data set, against the baseline."""
        path, X = self.data(name)
        k = min(k, len(X) // 4)
        overhead = measure.engine_overhead_ms(path, self.client)
        common = {"kind": "table", "data": name, "n": X.shape[0], "d": X.shape[1], "k": k}
        for seed in range(seeds):
            logger.info("table %s k=%d seed %d", name, k, seed)
            base = self.baseline(name, path, X, k, seed)
            rows = [("scikit-learn", BASELINE, {}, base)]
            for label, algo, params in our_fits(self.tiny):
                rows.append(("dask_clust", label, params, self.ours_row(path, X, algo, k, seed, params, overhead)))
            for comp in measure.COMPETITORS:
                if comp != BASELINE:
                    got = self.competitor(comp, path, X, k, seed)
                    rows.append(("scikit-learn" if comp.startswith("sklearn") else comp, comp, {}, got))
            for tool, label, params, got in rows:
                self.emit(
                    {
                        **common,
                        "seed": seed,
                        "tool": tool,
                        "algo": label,
                        "params": params,
                        **got,
                        **measure.versus(got, base),
                    }
                )

    def competitor(self, name, path, X, k, seed, repeats=None, cap_s=None):
        return measure.competitor(
            name,
            path,
            X,
            k,
            seed,
            repeats or self.repeats,
            cap_s or self.cap_s,
            isolated=not self.tiny,
            max_iter=TINY_LOOP["max_iter"] if self.tiny else None,
        )

    def baseline(self, data, path, X, k, seed):
        """scikit-learn's k-means++ Lloyd on (data, k, seed), measured once per run and shared by every
        table of the run; its cap is generous, since without it a table has no ratios at all."""
        key = (data, k, seed)
        if key not in self._baselines:
            self._baselines[key] = self.competitor(BASELINE, path, X, k, seed, cap_s=BASELINE_CAP_S)
        return self._baselines[key]

    def ours_row(self, path, X, algo, k, seed, params, overhead, repeats=None):
        """``measure.ours``, or the error in the row's status: one failing fit must not end the suite."""
        try:
            self._warm(X, algo)
            return measure.ours(path, X, algo, k, seed, self.client, params, repeats or self.repeats, overhead)
        except Exception as exc:
            logger.exception("%s on k=%d failed", algo, k)
            return {"status": f"error: {type(exc).__name__}: {exc}"[:300]}

    def _warm(self, X, algo):
        """One small fit of an algorithm before its first timed one, so that no timed fit pays numba's
        compilation (a fresh checkout has no kernel cache: 26 s of a 28 s vc-GMM fit) or a worker's first
        imports, as the competitors' warm-up fits spare theirs (``measure._competitor_fits``)."""
        if self.tiny or algo in self._warmed:
            return
        self._warmed.add(algo)
        import dask

        from dask_clust import api

        # in 16 chunks, a working set on the cluster too, so that every worker compiles: one chunk warmed one
        # worker, and the other compiled in a timed fit (vc-GMM at C = 500: 7.1 s of its 8.3 s)
        with dask.config.set(
            {
                "dask_clust.min-chunk-bytes": "1KiB",
                "dask_clust.in-process-bytes": "1KiB",
                "dask_clust.working-set-chunk-rows": 1000,
            }
        ):
            api.fit(np.ascontiguousarray(X[:20_000]), algo, 20, random_state=0, client=self.client)

    def close(self):
        import shutil

        shutil.rmtree(self.scratch, ignore_errors=True)


def machine():
    """What the figures were measured on."""
    import dask
    import numba
    import numpy

    cpu = next(
        (line.split(":", 1)[1].strip() for line in _lines("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    mem = next((int(line.split()[1]) * 1024 for line in _lines("/proc/meminfo") if line.startswith("MemTotal")), None)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_bytes": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": numpy.__version__,
        "numba": numba.__version__,
        "dask": dask.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def _lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def run_suite(suite, out, client, tiny=False):
    run = Run(suite, out, client, tiny=tiny, cap_s=120.0)
    try:
        if suite == "quick":
            for name, k in QUICK_TABLES:
                run.table(name, k, seeds=1)
            paper.slk_quality(run)  # small sets: the only place SLK's labels are scored
        elif suite == "paper":
            for name, k in PAPER_TABLES:
                run.table(name, k, seeds=1)
            paper.run_all(run)
        elif suite == "scaling":
            scaling.run_all(run)
        elif suite == "sweep":
            sweep.run_all(run)
        elif suite == "streaming":
            streaming.run_all(run)
        else:
            raise ValueError(f"suite={suite!r}: expected 'quick', 'paper', 'scaling', 'sweep' or 'streaming'")
    finally:
        run.close()
