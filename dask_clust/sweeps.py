"""Choosing the number of clusters: ``sweep`` fits one algorithm for many k on one engine and scores each
fit by criteria that need no labels (``blocks/criteria.py``; BIC and AIC for the mixtures).

What the k share: the data are loaded once (one engine, its chunks and its first pass: the summary, the
checks, the grid of the exact sums), the silhouette's sample is drawn and read once, and k-means||'s rounds
run once, with the largest k's ℓ, their weighted candidates reclustered for each k (``shared_seeding``;
the rounds are O(N·ℓ·D) passes a k, their recluster is O(ℓ·k·D) on the driver). Each k's fit is otherwise
the fit ``dask_clust.fit`` makes with the same ``random_state``, bit for bit (with ``shared_seeding=False``,
or an algorithm not seeded by k-means||, or the largest k, the whole fit is), but for its final pass over
every row (the QE of its centres), which the criteria's first pass makes for it, to the same bits (its
distance count is that pass's). Each k then costs its criteria's passes: one
for the partition's sums (O(N·k·D)), one for Davies–Bouldin's spreads about the clusters' means (O(N·D)),
and for a mixture whose likeliest components are not its nearest means (scikit-learn's types) one for its
exact log-likelihood (O(N·C·D)); vc-GMM's log-likelihood over each row's C' nearest components comes with the
first.

What the driver holds: one model at a time (the models on request, or every k's until the end when the
silhouette picks), the criteria's k·(D + 3) sums, the silhouette's sample (``silhouette_size`` rows) and each
k's labels of it, whose silhouettes are computed together at the end (the sample's pairwise distances once
for every k: 10,000 rows x 32, 8 k: 0.84 s against 2.6 s one k at a time), outside any k's ``wall_s``.
"""

import contextlib
import math
import numbers
import time

import numpy as np

from . import algorithms
from . import progress as progress_
from ._random import check_random_state
from .api import DEFAULT, check_against_data, configured, fitted, model_of, opened, sourced
from .blocks import criteria, seeding
from .engine.data import select_columns, stored_row_bytes
from .errors import InvalidParameterError
from .loop import DeferredFinal

# each criterion: whether a larger value is better
HIGHER_IS_BETTER = {
    "inertia": False,
    "calinski_harabasz": True,
    "davies_bouldin": False,
    "simplified_silhouette": True,
    "silhouette": True,
    "bic": False,
    "aic": False,
}
MIXTURE_CRITERIA = ("bic", "aic")


class SweepResult:
    """The criteria of a sweep's fits, one row per k (``table``, a pandas DataFrame indexed by k), the k the
    criterion picks (``best_k_``), its model (``best_``) and every model when they were kept (``models_``)."""

    def __init__(self, table, criterion, models, algo):
        self.table, self.criterion, self.models_, self.algo = table, criterion, models, algo
        values = table[criterion]
        self.best_k_ = int(values.idxmax() if HIGHER_IS_BETTER[criterion] else values.idxmin())

    @property
    def best_(self):
        """The model at ``best_k_`` (kept by every sweep)."""
        return self.models_[self.best_k_]

    def __repr__(self):
        return f"SweepResult({self.algo}, k={list(self.table.index)}, best_k_={self.best_k_} by {self.criterion})"

    def plot(self, criteria=None, axes=None):
        """Each criterion against k (matplotlib), the chosen k marked; returns the axes."""
        import matplotlib.pyplot as plt

        names = [c for c in (criteria or HIGHER_IS_BETTER) if c in self.table and self.table[c].notna().any()]
        if axes is None:
            _, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 2.8), squeeze=False)
            axes = axes[0]
        for ax, name in zip(axes, names, strict=False):
            ax.plot(self.table.index, self.table[name], marker="o")
            ax.axvline(self.best_k_, color="0.6", linestyle="--", linewidth=1)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("k")
            ax.set_title(f"{name} ({'higher' if HIGHER_IS_BETTER[name] else 'lower'} is better)", fontsize=9)
        return axes


def _check_ks(n_clusters):
    ks = list(n_clusters) if isinstance(n_clusters, (list, tuple, range, np.ndarray)) else None
    if not ks or not all(isinstance(k, numbers.Integral) and not isinstance(k, bool) and k >= 2 for k in ks):
        raise InvalidParameterError(f"n_clusters must be a list of ints >= 2 (the k to compare); got {n_clusters!r}")
    if len(set(ks)) != len(ks):
        raise InvalidParameterError(f"n_clusters repeats a k: {ks}")
    return sorted(int(k) for k in ks)


def sweep(
    X,
    algo=algorithms.DEFAULT,
    n_clusters=(2, 4, 8, 16, 32),
    *,
    criterion=None,
    random_state=None,
    client=None,
    sample_weight=None,
    columns=None,
    silhouette_size=10_000,
    keep_models=False,
    shared_seeding=True,
    progress=None,
    **params,
):
    """Fit ``algo`` for every k in ``n_clusters`` on one engine and score each fit; returns a ``SweepResult``.

    Criteria (the table's columns): ``inertia`` (Σ w ||x − c||²), ``calinski_harabasz``, ``davies_bouldin``,
    ``simplified_silhouette``, ``silhouette`` (exact, on ``silhouette_size`` rows drawn uniformly, the same rows
    for every k; None: skipped; not defined for weighted rows), and for a mixture ``bic`` and ``aic``; each
    from the partition the model's centres (a mixture's means) make, equal to scikit-learn's score of those
    labels. ``criterion`` picks ``best_k_``: default ``bic`` for a mixture, else ``simplified_silhouette``.
    Beside them: ``objective`` (the fit's own), ``n_iter`` and ``wall_s`` (the fit's, then its criteria's).

    X, algo, random_state, client, sample_weight, columns and ``**params``: as ``fit``'s; every k's model is
    the one ``fit`` gives with the same arguments, but where ``shared_seeding``. keep_models: keep every k's
    model (``models_``), not only the best's. shared_seeding: k-means||'s candidates drawn once, for the
    largest k, and reclustered for each (Bahmani et al., VLDB 2012: one oversampled set serves any k up to
    ℓ/factor); a smaller k's seeds then differ from a separate fit's (its rounds draw ℓ = factor·k); False:
    every k's model is ``fit``'s, bit for bit. progress: as ``fit``'s, with a bar over the whole sweep.
    """
    ks = _check_ks(n_clusters)
    specs = [configured(algo, k, DEFAULT, DEFAULT, DEFAULT, params) for k in ks]
    spec = specs[0][0]
    names = list(HIGHER_IS_BETTER) if spec.probabilistic else [c for c in HIGHER_IS_BETTER if c not in MIXTURE_CRITERIA]
    criterion = ("bic" if spec.probabilistic else "simplified_silhouette") if criterion is None else criterion
    if criterion not in names:
        raise InvalidParameterError(f"criterion must be one of {names} for algo={spec.name!r}; got {criterion!r}")
    if silhouette_size is not None and not (
        isinstance(silhouette_size, numbers.Integral) and not isinstance(silhouette_size, bool) and silhouette_size >= 2
    ):
        raise InvalidParameterError(f"silhouette_size must be an int >= 2 or None; got {silhouette_size!r}")
    entropy = check_random_state(random_state)
    source, feature_names = sourced(X, columns, sample_weight, specs[-1][1])
    for s, cfg in specs:
        check_against_data(s, cfg, source)
    if silhouette_size is not None and source.weights is not None:
        silhouette_size = None
    if criterion == "silhouette" and silhouette_size is None:
        raise InvalidParameterError("criterion='silhouette' needs a silhouette_size (and rows without weights)")
    import pandas as pd

    rows, models, labelings = [], {}, []
    picked = None
    later = criterion == "silhouette"  # (its values come at the end: every model kept until then)
    with progress_.reporting(progress), contextlib.ExitStack() as stack:
        state = algorithms.state_of(spec, specs[-1][1], stored_row_bytes(source) + 8)
        engine = opened(stack, source, client, entropy, state)
        sample = None if silhouette_size is None else criteria.silhouette_sample(engine, silhouette_size, entropy)
        X_selected = select_columns(X, columns)  # (a mixture's exact BIC reads them; a table opened once)
        factor = getattr(specs[-1][1], "oversampling_factor", None)
        if shared_seeding and factor is not None:
            stack.enter_context(seeding.shared_candidates(engine, factor * ks[-1]))
        with progress_.phase(f"sweep over {len(ks)} k", len(ks), "k") as shown:
            for (s, cfg), k in zip(specs, ks, strict=True):
                t0 = time.perf_counter()
                with progress_.reporting(False):  # one bar over the sweep, not each fit's phases
                    final = DeferredFinal()
                    engine.forget_state()  # (the last k's: Lloyd's labels would count its first changes)
                    result, loop = fitted(engine, s, cfg, entropy, final=final)
                    info = {**engine.describe(), "wall_s": time.perf_counter() - t0}
                    model = model_of(s, cfg, entropy, result, loop, info, feature_names)
                    fit_s = time.perf_counter() - t0
                    row, sums, labels = _criteria(engine, s, model, sample, X_selected, sample_weight)
                    labelings.append(labels)
                    if final.taken:  # the fit's final pass is the criteria's first: its QE, the same bits
                        model.objective_ = sums.qe / 2 if algorithms.spherical(cfg) else sums.qe
                        model.n_distance_evals_ += sums.evals
                row.update(k=k, objective=model.objective_, n_iter=result.n_iter, fit_s=fit_s)
                row["wall_s"] = time.perf_counter() - t0
                rows.append(row)
                if keep_models or later:
                    models[k] = model
                elif picked is None or _better(criterion, row[criterion], picked[0]):
                    picked = (row[criterion], k)
                    models = {k: model}
                shown.update(1, k=k, **({} if later else {criterion: row[criterion]}))
        if sample is not None:  # every k's sample silhouette in one go: their distances computed once
            for row, value in zip(rows, criteria.silhouettes(sample, labelings), strict=True):
                row["silhouette"] = value
    table = pd.DataFrame(rows).set_index("k")
    if later and not keep_models:
        best = table["silhouette"].idxmax() if table["silhouette"].notna().any() else table.index[0]
        models = {best: models[best]}
    order = ["objective", *names, "n_iter", "fit_s", "wall_s"]
    return SweepResult(table[[c for c in order if c in table]], criterion, models, spec.name)


def _better(criterion, value, than):
    return value > than if HIGHER_IS_BETTER[criterion] else value < than


def _criteria(engine, spec, model, sample, X, sample_weight):
    """One model's criteria (a dict), its partition's sums and its labels of the silhouette's sample (None
    without one): the partition's sums (one pass), Davies–Bouldin's spreads (one more), and a mixture's BIC
    and AIC: for one whose likeliest components are its nearest means (vc-GMM's), from the first pass, over
    each row's C' nearest (``bic(X, exact=False)``); for the others from their exact log-likelihood (one more
    pass, O(N·C·D), over X). The sample's silhouette comes later, every k's at once."""
    C = criteria.check_centers(engine, model.cluster_centers_)
    nearest = model.nearest_costs() if spec.probabilistic else None
    sums = criteria.partition_sums(engine, C, nearest_costs=nearest)
    held = int((sums.weights > 0).sum())
    row = {
        "inertia": criteria.inertia(sums),
        "calinski_harabasz": criteria.calinski_harabasz(sums, C) if held >= 2 else math.nan,
        "davies_bouldin": criteria.davies_bouldin(sums, C) if held >= 2 else math.nan,
        "simplified_silhouette": criteria.simplified_silhouette(sums),
        "silhouette": math.nan,
    }
    labels = None if sample is None else criteria.sample_labels(sample, C)
    if spec.probabilistic:
        n, p = float(sums.weights.sum()), model.n_parameters()
        if nearest is not None:
            ll = sums.log_likelihood
        elif sample_weight is None:
            ll = model.score(X, exact=True) * n
        else:
            ll = math.nan  # (a mixture's exact log-likelihood of weighted rows: not yet)
        row["bic"] = -2.0 * ll + p * math.log(n)
        row["aic"] = -2.0 * ll + 2 * p
    return row, sums, labels
