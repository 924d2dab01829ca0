"""The papers' experiments, reproduced as far as offline data allows (``--suite paper``).

- vc-GMM, Table 1 / Fig. 1: η and speedup of vc-GMM, var-GMM-S, k-means on a lightweight coreset (LWCS)
  and AFK-MC2 alone against k-means++ (scikit-learn's, measured in the same run), and the trade-off over
  coreset sizes;
- nmbatch, Fig. 2: validation energy against time for Lloyd, mini-batch and nested mini-batch k-means
  (the paper's protocol: shuffle, first k rows as centres, b0 = 5000, ρ = 100);
- VRKM, Table 3: time to reach batch k-means' final loss, and final loss, of mini-batch, nested
  mini-batch ("growbatch"), VRKM and VRKM++ from the same centres;
- SBE: the Iris experiment (final objectives over 100 runs) and the 784-d digit-like table;
- SLK: NMI and ACC of SLK-BO and SLK-MS against the labels of the authors' three sets (digits, mnist5k
  shuffled, segment), with our k-means++ Lloyd on the same normalised rows (also in ``--suite quick``).

Every ratio is between two measurements of this run. The papers' own figures are in ``report.PAPER``.
"""

import logging
import time

import numpy as np

from dask_clust import api
from dask_clust.blocks.seeding import seed as seed_centers
from dask_clust.datasets import make_digitlike
from dask_clust.engine import as_source, open_engine

from . import measure

logger = logging.getLogger("harness")

B0, RHO = 5000, 100.0


# ------------------------------------------------------------------ shared by the experiments (and benchmarks/)


def energy(X, C):
    """Mean squared distance of X's rows to their nearest centre."""
    return measure.quantization_error(X, C) / len(X)


class Clock:
    """A fit callback recording (seconds of fitting so far, validation energy) after every iteration; the
    time spent evaluating the energy is not counted."""

    def __init__(self, Xv):
        self.Xv, self.points, self.spent, self.t0 = Xv, [], 0.0, time.perf_counter()

    def __call__(self, rec):
        t = time.perf_counter()
        self.points.append((t - self.t0 - self.spent, energy(self.Xv, rec["centers"])))
        self.spent += time.perf_counter() - t

    def time_to(self, target):
        return next((t for t, e in self.points if e <= target), None)


def sklearn_minibatch_curve(Xtr, Xv, init, batch_size=B0, seed=0):
    """scikit-learn's MiniBatchKMeans: its own fit gives the number of steps and the total time; the same
    steps replayed with partial_fit on uniform batches (as its fit draws them) give the curve."""
    from sklearn.cluster import MiniBatchKMeans

    kw = dict(n_clusters=len(init), init=init.astype(Xtr.dtype), n_init=1, batch_size=batch_size, random_state=seed)
    t = time.perf_counter()
    mb = MiniBatchKMeans(**kw).fit(Xtr)
    total = time.perf_counter() - t
    replay, rng = MiniBatchKMeans(**kw), np.random.default_rng(seed)
    elapsed, points = 0.0, []
    for _ in range(int(mb.n_steps_)):
        batch = Xtr[rng.integers(0, len(Xtr), batch_size)]
        t = time.perf_counter()
        replay.partial_fit(batch)
        elapsed += time.perf_counter() - t
        points.append((elapsed, energy(Xv, replay.cluster_centers_)))
    return points, total, int(mb.n_steps_)


def qe_curve(model):
    """(seconds, QE) per iteration from a fit's history, for algorithms whose records hold the full-data QE
    of the centres the iteration starts from (Lloyd, VRKM), ending with the final QE."""
    t, points = 0.0, []
    for h in model.history_:
        points.append((t, h["objective"]))
        t += h["wall_s"]
    points.append((t, model.objective_))
    return points


def time_to(points, target):
    return next((t for t, q in points if q <= target), None)


def _sized(run, k, rows):
    return max(2, min(k, rows // 8)) if run.tiny else k


# ------------------------------------------------------------------ vc-GMM, Table 1 and Fig. 1

# (data, C, N', seeds): the image patches at the C of the paper suite's table, so its baseline is shared
VCGMM_SETS = (("imgpatches", 50, 2**16, 2), ("mnist5k", 100, 2**12, 3), ("blobs200k_d32", 400, 2**16, 3))


def seeding_only(path, X, k, init, seed, client, **kw):
    """Centres of a seeding alone (no Lloyd): (wall s, QE, distance evaluations)."""
    t = time.perf_counter()
    with open_engine(as_source(path), client, seed) as engine:
        centers, evals = seed_centers(engine, k, init, seed, **kw)
    wall = time.perf_counter() - t
    return {
        "wall_s": wall,
        "wall_runs": [wall],
        "qe": measure.quantization_error(X, centers),
        "n_iter": 0,
        "distance_evals": int(evals),
    }


def vcgmm_fits(n_prime):
    """Table 1's columns: (label, algo, params)."""
    return (
        ("vc-GMM", "vcgmm", {"G": 5, "coreset_size": n_prime, "chain_length": 2}),
        ("var-GMM-S", "vargmm", {"G": 5}),
        ("LWCS k-means", "kmeans", {"coreset_size": n_prime, "init": "k-means++"}),
        ("k-means++ (ours)", "kmeans", {"init": "k-means++"}),
    )


def vcgmm_table(run):
    for name, k, n_prime, seeds in VCGMM_SETS:
        path, X = run.data(name)
        k = _sized(run, k, len(X))
        n_prime = min(n_prime, len(X) // 2) if run.tiny else n_prime
        overhead = measure.engine_overhead_ms(path, run.client)
        for seed in range(1 if run.tiny else seeds):
            logger.info("vc-GMM table %s C=%d seed %d", name, k, seed)
            base = run.baseline(name, path, X, k, seed)
            common = {
                "kind": "vcgmm_table",
                "data": name,
                "n": len(X),
                "d": X.shape[1],
                "k": k,
                "seed": seed,
                "coreset_size": n_prime,
            }
            run.emit({**common, "algo": "k-means++ (scikit-learn)", **base, **measure.versus(base, base)})
            for label, algo, params in vcgmm_fits(n_prime):
                got = run.ours_row(path, X, algo, k, seed, params, overhead, repeats=1)
                run.emit({**common, "algo": label, "params": params, **got, **measure.versus(got, base)})
            got = seeding_only(path, X, k, "afkmc2", seed, run.client, chain_length=2)
            run.emit({**common, "algo": "AFK-MC2 (m = 2)", **got, **measure.versus(got, base)})
            if seed == 0 and name == VCGMM_SETS[0][0]:
                coreset_tradeoff(run, path, X, k, base, overhead)


def coreset_tradeoff(run, path, X, k, base, overhead):
    """Fig. 1 (right): η against speedup over coreset sizes (vc-GMM, LWCS), chain lengths (AFK-MC2) and
    G (var-GMM-S), on the first set of the table."""
    sizes = (2**10, 2**11) if run.tiny else tuple(2**e for e in range(12, 18))
    common = {"kind": "tradeoff", "data": VCGMM_SETS[0][0], "n": len(X), "k": k}
    for n_prime in sizes:
        for label, algo, params in vcgmm_fits(n_prime)[0::2]:
            got = run.ours_row(path, X, algo, k, 0, params, overhead, repeats=1)
            run.emit({**common, "algo": label, "coreset_size": n_prime, **got, **measure.versus(got, base)})
    for m in (2, 5) if run.tiny else (2, 5, 10, 20):
        got = seeding_only(path, X, k, "afkmc2", 0, run.client, chain_length=m)
        run.emit({**common, "algo": "AFK-MC2", "chain_length": m, **got, **measure.versus(got, base)})
    for G, extra in ((3, True), (5, False), (7, False)):
        got = run.ours_row(path, X, "vargmm", k, 0, {"G": G, "extra_random": extra}, overhead, repeats=1)
        run.emit(
            {**common, "algo": "var-GMM-S", "G": f"{G}+1" if extra else str(G), **got, **measure.versus(got, base)}
        )


# ------------------------------------------------------------------ nmbatch, Fig. 2


def split(X, shuffle_seed=0):
    """The paper's protocol: shuffle once, 90 % train, 10 % validation."""
    X = X[np.random.default_rng(shuffle_seed).permutation(len(X))]
    cut = int(0.9 * len(X))
    return X[:cut], X[cut:]


def nmbatch_curves(run, name="imgpatches", k=50):
    _, X = run.data(name)
    Xtr, Xv = split(X)
    train = run.save(f"{name}-train", Xtr)
    k = _sized(run, k, len(Xtr))
    init = Xtr[:k].astype(np.float64)
    b0 = min(B0, len(Xtr) // 4)
    common = {"kind": "curve", "data": name, "n_train": len(Xtr), "n_validation": len(Xv), "k": k}
    for label, algo, params in (
        ("lloyd", "kmeans", {}),
        ("mbatch", "minibatch", {"batch_size": b0}),
        ("nmbatch", "nmbatch", {"batch_size": b0, "rho": RHO}),
    ):
        logger.info("Fig. 2 analog: %s", label)
        clock = Clock(Xv)
        m = api.fit(train, algo, k, init=init, random_state=0, client=run.client, callback=clock, **params)
        run.emit(
            {
                **common,
                "algo": label,
                "tool": "dask_clust",
                "points": clock.points,
                "n_iter": m.n_iter_,
                "distance_evals": int(m.n_distance_evals_),
            }
        )
    points, total, steps = sklearn_minibatch_curve(Xtr, Xv, init, b0)
    run.emit(
        {
            **common,
            "algo": "mbatch (scikit-learn)",
            "tool": "scikit-learn",
            "points": points,
            "n_iter": steps,
            "fit_s": total,
        }
    )


# ------------------------------------------------------------------ VRKM, Table 3

VRKM_SETS = (("mnist5k", 100), ("imgpatches", 100))


def vrkm_table(run):
    for name, k in VRKM_SETS:
        path, X = run.data(name)
        k = _sized(run, k, len(X))
        with open_engine(as_source(path), run.client, 0) as engine:  # the same k-means++ centres for every method
            init, _ = seed_centers(engine, k, "k-means++", 0)
        common = {"kind": "vrkm_table", "data": name, "n": len(X), "d": X.shape[1], "k": k}
        fits = (
            ("batch KM", "kmeans", {}),
            ("mini-batch KM", "minibatch", {}),
            ("growbatch (nmbatch)", "nmbatch", {}),
            ("VRKM", "vrkm", {"variant": "vrkm"}),
            ("VRKM++", "vrkm", {"variant": "vrkm++"}),
        )
        target = None
        for label, algo, params in fits:
            logger.info("VRKM table %s: %s", name, label)
            t = time.perf_counter()
            m = api.fit(path, algo, k, init=init, random_state=0, client=run.client, **params)
            wall = time.perf_counter() - t
            # Lloyd and VRKM record the full-data QE per iteration; the mini-batch methods only at the end
            curve = qe_curve(m) if algo in ("kmeans", "vrkm") else [(wall, m.objective_)]
            target = m.objective_ if target is None else target
            reach = time_to(curve, target)
            run.emit(
                {
                    **common,
                    "algo": label,
                    "wall_s": wall,
                    "loss": m.objective_,
                    "n_iter": m.n_iter_,
                    "time_to_batch_loss_s": reach,
                    "batch_loss": target,
                }
            )


# ------------------------------------------------------------------ SBE: Iris and 784-d

# f = QE/(2N) of Iris' global minimum (k = 3), and the bound above which a run sits in the local minimum
# near 0.48 (0.4758 .. 0.485 on this data)
IRIS_GLOBAL, IRIS_STUCK = (0.2628, 0.2640), 0.4


def sbe_iris(run, runs=100):
    """SBE's Iris experiment: ``runs`` fits from 3 random rows each (batch 30, (omaxit, imaxit) = (100, 10)),
    and Lloyd from the same rows; one row per run with both final f = QE/(2N)."""
    from dask_clust.datasets import load_iris

    X = load_iris()[0]
    runs = 5 if run.tiny else runs
    rng = np.random.default_rng(0)
    for r in range(runs):
        init = X[rng.choice(len(X), 3, replace=False)]
        s = api.fit(
            X,
            "sbe",
            3,
            init=init,
            batch_size=30,
            omaxit=5 if run.tiny else 100,
            imaxit=10,
            step_size=1.0,
            random_state=r,
            client="in-process",
        )
        km = api.fit(X, "kmeans", 3, init=init, client="in-process")
        run.emit(
            {
                "kind": "sbe_iris",
                "run_index": r,
                "f_sbe": s.objective_ / (2 * len(X)),
                "f_lloyd": km.objective_ / (2 * len(X)),
            }
        )


def iris_counts(rows):
    """(SBE runs ending at the global minimum, Lloyd runs stuck near 0.48) among ``sbe_iris`` rows."""
    good = sum(IRIS_GLOBAL[0] <= r["f_sbe"] <= IRIS_GLOBAL[1] for r in rows)
    return good, sum(r["f_lloyd"] > IRIS_STUCK for r in rows)


def sbe_digitlike(run, runs=10):
    """SBE's 784-d table: per k in (6, 8, 10), ``runs`` fits of SBE (batch 500, (100, 5)), Lloyd and Sculley's
    mini-batch (batch 500) from the same random rows; one row per fit with its f = QE/(2N)."""
    X, _, _ = make_digitlike(n_samples=2000 if run.tiny else 60_000)
    n, runs = len(X), 2 if run.tiny else runs
    for k in (6, 8, 10):
        rng = np.random.default_rng(k)
        for r in range(runs):
            init = X[rng.choice(n, k, replace=False)]
            common = dict(init=init, random_state=r, client="in-process")
            fits = {
                "SBE": api.fit(
                    X, "sbe", k, batch_size=500, omaxit=5 if run.tiny else 100, imaxit=5, step_size=1.0, **common
                ),
                "Lloyd": api.fit(X, "kmeans", k, **common),
                "mini-batch": api.fit(X, "minibatch", k, batch_size=500, **common),
            }
            for label, m in fits.items():
                run.emit({"kind": "sbe_784", "k": k, "run_index": r, "algo": label, "f": m.objective_ / (2 * n)})


# ------------------------------------------------------------------ SLK: the authors' sets, with labels

# (data, K, seeds): the sets of the authors' runs (issue #18); mnist5k shuffled (its file is sorted by
# label, and the fit must not lean on that)
SLK_SETS = (("digits", 10, 10), ("mnist5k", 10, 5), ("segment", 7, 10))


def labelled(name, tiny):
    """(X, labels) of an SLK set; tiny: its first ``TINY_ROWS`` rows (after mnist5k's shuffle)."""
    from dask_clust import datasets

    from .data import TINY_ROWS

    X, y = {"digits": datasets.load_digits, "mnist5k": datasets.load_mnist_5k, "segment": datasets.load_image_segments}[
        name
    ]()
    if name == "mnist5k":
        order = np.random.default_rng(0).permutation(len(X))
        X, y = X[order], y[order]
    return (X[:TINY_ROWS], y[:TINY_ROWS]) if tiny else (X, y)


def slk_quality(run):
    """Per set and seed (random_state 0..): NMI and ACC of SLK-BO, SLK-MS (σ from the graph, the authors'
    λ = 1.3) and our k-means++ Lloyd on the same L2-normalised rows, in-process (the sets are small)."""
    import warnings

    from dask_clust.metrics import acc, nmi

    for name, k, seeds in SLK_SETS:
        X, y = labelled(name, run.tiny)
        Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
        common = {"kind": "slk_quality", "data": name, "n": X.shape[0], "d": X.shape[1], "k": k}
        for seed in range(1 if run.tiny else seeds):
            fits = {
                "SLK-BO": lambda: api.fit(X, "slk", k, mode="bo", random_state=seed, client="in-process"),
                "SLK-MS": lambda: api.fit(X, "slk", k, mode="ms", random_state=seed, client="in-process"),
                "k-means++ (ours)": lambda: api.fit(
                    Xn, "kmeans", k, init="k-means++", random_state=seed, client="in-process"
                ),
            }
            for label, fit in fits.items():
                t = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # a lost cluster warns; it is in the row
                    m = fit()
                labels = m.labels_ if label.startswith("SLK") else np.asarray(m.predict(Xn))
                run.emit(
                    {
                        **common,
                        "seed": seed,
                        "algo": label,
                        "wall_s": time.perf_counter() - t,
                        "nmi": nmi(y, labels),
                        "acc": acc(y, labels),
                        "lost": bool(getattr(m, "lost_cluster_", False)),
                    }
                )


def run_all(run):
    vcgmm_table(run)
    nmbatch_curves(run)
    vrkm_table(run)
    sbe_iris(run)
    sbe_digitlike(run)
    slk_quality(run)
