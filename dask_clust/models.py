"""ClusteringModel: the result of a fit, its lazy one-shot passes, and its on-disk form.

Saved as a directory: ``model.json`` (metadata) + ``arrays.npz`` (centres and other arrays); never a
pickle, so a model can be read by any version and inspected by hand.
"""

import json
import math
import os

import dask.array as da
import numpy as np

from .engine.data import (
    as_dask_rows,
    check_finite_block,
    csr_rows,
    frame_dtype,
    frame_rows,
    is_frame,
    is_pandas,
    is_sparse_input,
    l2_rows,
    map_rows,
    unit_rows,
)
from .errors import InputError, InvalidModelError, install_hint
from .kernels.assign import Prepared, is_csr, nearest, squared_distances
from .outputs import UNREADABLE, check_model_dir, regular_size, replacing, stored_arrays
from .progress import line_svg

FORMAT_VERSION = 1


# bytes of the rows × C distance buffer of the truncated search (and of a dense posterior block)
PROBA_BLOCK_BYTES = 32 << 20


def _labels(x, centers):
    """The label of each row: its nearest centre (``Prepared``), or its likeliest component (a mixture's
    costs, ``mixture.MixtureCosts``, in row blocks of PROBA_BLOCK_BYTES)."""
    x = x if is_csr(x) else np.ascontiguousarray(x)
    if isinstance(centers, Prepared):
        return nearest(x, centers)[0]
    rows = max(1, PROBA_BLOCK_BYTES // (8 * len(centers.mu)))
    out = np.empty(len(x), np.int32)
    for b0 in range(0, len(x), rows):
        out[b0 : b0 + rows] = np.argmin(centers.costs(x[b0 : b0 + rows]), axis=1)
    return out


def _predict_block(x, centers, block_info=None):
    check_finite_block(x, block_info)
    return _labels(x, centers)


def _frame_labels(frame, centers, normalise, partition_info=None):
    """A DataFrame partition's labels as a Series on its index (dask's ``map_partitions`` passes
    ``partition_info``, so an error names the partition)."""
    import pandas as pd

    x = checked_frame_rows(frame, partition_info)
    if normalise == "l2":
        x = l2_rows(x)
    elif normalise == "unit":
        x = unit_rows(x)
    return pd.Series(_labels(x, centers), index=frame.index, name="label")


def checked_frame_rows(frame, partition_info=None):
    """A DataFrame partition's rows, refused with the partition named when one holds NaN or infinity."""
    x = frame_rows(frame, partition_info)
    check_finite_block(x, where=f" of partition {partition_info['number']}" if partition_info else "")
    return x


def _l2_rows(x, block_info=None):
    check_finite_block(x, block_info)
    return l2_rows(x)


def _unit_rows(x, block_info=None):
    return unit_rows(x, block_info[0]["array-location"][0][0] if block_info else 0)


def _transform_block(x, C, block_info=None):
    check_finite_block(x, block_info)
    return np.sqrt(squared_distances(x, C))


def _qe_block(x, centers, block_info=None):
    check_finite_block(x, block_info)
    _, mind, _ = nearest(x if is_csr(x) else np.ascontiguousarray(x), centers)
    return mind


# the model classes by the "model" key of their model.json (absent: "clustering")
MODEL_KINDS = {}


class ClusteringModel:
    """A fitted clustering model (returned by ``fit``).

    Attributes: ``algo``, ``params``, ``cluster_centers_`` (k × d, float64), ``n_iter_``, ``converged_``,
    ``history_`` (one dict per iteration), ``n_distance_evals_``, ``objective_`` (the algorithm's final
    objective; QE for k-means), ``extras_`` (algorithm-specific figures), ``engine_`` (where it ran), and
    ``feature_names_in_`` (the column names) when it was fitted on a table.
    """

    kind = "clustering"
    # extras a model of another kind keeps, which this kind's model.json may not hold
    FIELDS = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        MODEL_KINDS[cls.kind] = cls

    def __init__(
        self,
        algo,
        params,
        cluster_centers_,
        *,
        n_iter_=0,
        converged_=False,
        history_=(),
        n_distance_evals_=0,
        objective_=None,
        extras_=None,
        engine_=None,
        feature_names_in_=None,
        written_by=None,
    ):
        self.algo = algo
        # the dask_clust that saved the model ("dask_clust 0.1.0"), None for one fitted here or saved without it
        self.written_by = written_by
        self.params = dict(params)
        self.cluster_centers_ = np.asarray(cluster_centers_, dtype=np.float64)
        self.n_iter_ = int(n_iter_)
        self.converged_ = bool(converged_)
        self.history_ = list(history_)
        self.n_distance_evals_ = int(n_distance_evals_)
        self.objective_ = None if objective_ is None else float(objective_)
        self.extras_ = dict(extras_ or {})
        self.engine_ = dict(engine_ or {})
        if feature_names_in_ is not None:  # as scikit-learn: only a model fitted on a table has it
            self.feature_names_in_ = np.asarray(list(feature_names_in_), dtype=object)

    def __getattr__(self, name):
        # algorithm extras read as fitted attributes: model.sigma2_, model.coreset_size_, ...
        extras = self.__dict__.get("extras_", {})
        if name.endswith("_") and name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__} ({self.__dict__.get('algo')}) has no attribute {name!r}")

    @property
    def n_clusters(self):
        return self.cluster_centers_.shape[0]

    @property
    def n_features_in_(self):
        return self.cluster_centers_.shape[1]

    @property
    def _cosine(self):
        """Whether the model is spherical (``metric="cosine"``): it reads rows on the unit sphere, as its fit did."""
        return self.params.get("metric") == "cosine"

    def _input(self, X):
        """X as row chunks, L2-normalised (lazily, float64) for a model fitted on the normalised rows (SLK), on
        the unit sphere in their own dtype for a spherical one (a zero row refused, as in its fit)."""
        X = as_dask_rows(X, self.n_features_in_)
        if is_csr(X._meta):
            self._takes_sparse()
        if self.extras_.get("row_normalization_") == "l2":
            X = X.map_blocks(_l2_rows, dtype=np.float64, meta=np.empty((0, 0)))
        elif self._cosine:
            X = X.map_blocks(_unit_rows, dtype=X.dtype, meta=X._meta)
        return X

    def _rows(self, X):
        X = self._input(X)
        return X, self._prepared(X.dtype)

    def _csr(self, X):
        """A scipy sparse X as the CSR rows the model reads (``csr_rows``; on the sphere for a spherical
        model), or None for any other input. A model of an algorithm that takes no sparse rows refuses it."""
        if not is_sparse_input(X):
            return None
        self._takes_sparse()
        return csr_rows(X, self.n_features_in_, unit=self._cosine)

    def _takes_sparse(self):
        from .algorithms import get, sparse

        if not get(self.algo).sparse:
            raise InputError(f"a {self.algo} model reads dense rows (the algorithms that take sparse ones: {sparse()})")

    def _csr_blocks(self, S, fn):
        """``fn(block)`` over row blocks of CSR rows S (each at most PROBA_BLOCK_BYTES of a k-wide result),
        concatenated: what predict, transform and score give for sparse rows (computed now: the rows are in
        memory)."""
        rows = max(1, PROBA_BLOCK_BYTES // (8 * self.n_clusters))
        return np.concatenate([fn(S[a : a + rows]) for a in range(0, max(S.shape[0], 1), rows)])

    def _prepared(self, dtype):
        """The centres for the GEMM kernels in the rows' dtype, refused when they do not fit it (a float64
        model beyond float32's range would turn into infinities and give every float32 row label 0)."""
        top = float(np.abs(self.cluster_centers_).max())
        if top > float(np.finfo(dtype).max):
            raise InputError(
                f"the model's centres reach {top:.3g}, beyond {np.dtype(dtype).name}'s range: pass X as float64"
            )
        return Prepared(self.cluster_centers_, dtype)

    def _mixture(self):
        """A mixture's costs, which its predictions read instead of the nearest centre (``MixtureModel``)."""
        return None

    def predict(self, X):
        """Index of the nearest centre of each row (int32, exact, blocked GEMM; for a mixture with per-component
        variances or weights, its likeliest component): a lazy dask array; for a
        DataFrame a Series named "label" on X's index, lazy with X's partitions for a dask DataFrame (so
        ``ddf[["id"]].assign(cluster=model.predict(ddf[features]))`` puts each label beside its key), computed
        for a pandas one."""
        if is_frame(X):
            return self._predict_frame(X)
        return self.predict_array(X)

    def predict_array(self, X):
        """``predict`` as a lazy dask array of int32 whatever X is (a DataFrame too): the estimators' form; of a
        scipy sparse matrix, computed now (its rows are in memory), by the CSR kernels."""
        S = self._csr(X)
        if S is not None:
            centers = self._prepared(S.dtype)
            return da.from_array(self._csr_blocks(S, lambda b: nearest(b, centers)[0]))
        X, centers = self._rows(X)
        return map_rows(X, _predict_block, np.int32, None, self._mixture() or centers)

    def _check_frame(self, X):
        """Refuse a DataFrame whose columns are not the fitted features (a frame is read by name)."""
        if getattr(X, "ndim", 2) != 2:
            raise InputError("Expected a 2-D input; got a Series")
        names, fitted = [str(c) for c in X.columns], self.__dict__.get("feature_names_in_")
        if fitted is not None and names != list(fitted):
            raise InputError(
                f"X's columns {names} are not the ones the model was fitted on, {list(fitted)}: "
                "pass X[model.feature_names_in_]"
            )
        if len(names) != self.n_features_in_:
            raise InputError(
                f"X has {len(names)} features, but the model was fitted with {self.n_features_in_} features"
            )

    def _predict_frame(self, X):
        import pandas as pd

        self._check_frame(X)
        normalise = "l2" if self.extras_.get("row_normalization_") == "l2" else "unit" if self._cosine else None
        centers = self._mixture() or self._prepared(np.dtype(np.float64) if normalise == "l2" else frame_dtype(X))
        if is_pandas(X):
            return _frame_labels(X, centers, normalise)
        meta = pd.Series(np.empty(0, np.int32), name="label", index=X._meta.index)
        return X.map_partitions(_frame_labels, centers, normalise, meta=meta)

    def transform(self, X):
        """Euclidean distance of each row to every centre (of a spherical model, of each row on the unit sphere:
        √(2 − 2 cos)): a lazy (n, k) float64 dask array."""
        S = self._csr(X)
        if S is not None:
            return da.from_array(self._csr_blocks(S, lambda b: _transform_block(b, self.cluster_centers_)))
        X = self._input(X)
        return map_rows(X, _transform_block, np.float64, self.n_clusters, self.cluster_centers_)

    def predict_proba(self, X, output="truncated"):
        """Posteriors: only a probabilistic fit's model has them (``MixtureModel.predict_proba``)."""
        raise AttributeError(f"predict_proba: {self.algo!r} models are not probabilistic")

    def quantization_error(self, X, sample_weight=None):
        """Σ w min_c ||x − c||² over X (computed now, float64); for a spherical model, over X's rows on the
        unit sphere (twice Σ w (1 − cos), its objective)."""
        S = self._csr(X)
        if S is not None:
            centers = self._prepared(S.dtype)
            d2 = da.from_array(self._csr_blocks(S, lambda b: nearest(b, centers)[1]))
        else:
            X, centers = self._rows(X)
            d2 = map_rows(X, _qe_block, np.float64, None, centers)
        if sample_weight is not None:
            w = (
                sample_weight
                if isinstance(sample_weight, da.Array)
                else da.from_array(np.asarray(sample_weight, float))
            )
            if w.shape != d2.shape:
                raise ValueError(f"sample_weight must have shape {d2.shape}; got {w.shape}")
            d2 = d2 * w.rechunk(d2.chunks)
        return float(d2.sum().compute())

    def score(self, X, sample_weight=None):
        """Negative quantization error, as scikit-learn's ``KMeans.score``; for a spherical model the negative
        of its objective, Σ w (1 − cos)."""
        qe = self.quantization_error(X, sample_weight)
        return -qe / 2 if self._cosine else -qe

    def _summary(self):
        """(name, value) pairs of the fit's summary, for the text and HTML reprs."""
        objective = "not computed" if self.objective_ is None else f"{self.objective_:.6g}"
        rows = [
            ("algo", self.algo),
            ("n_clusters", self.n_clusters),
            ("n_features", self.n_features_in_),
            ("n_iter", self.n_iter_),
            ("converged", self.converged_),
            ("objective", objective),
        ]
        if "wall_s" in self.engine_:
            rows.append(("wall_s", f"{self.engine_['wall_s']:.3g}"))
        return rows

    def __repr__(self):
        return (
            f"{type(self).__name__}("
            + ", ".join(f"{k}={v!r}" if k == "algo" else f"{k}={v}" for k, v in self._summary())
            + ")"
        )

    def _figure(self):
        """What the history's per-iteration "objective" is called (``AlgorithmSpec.figure``)."""
        from .algorithms import get

        return get(self.algo).figure

    def plot(self):
        """A matplotlib Figure: the objective against the iteration, and the centres in the plane of their two
        features (D = 2) or of their first two principal axes. Needs matplotlib (the ``notebook`` extra)."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError(f"model.plot needs matplotlib: {install_hint('notebook')}") from None
        fig, (history, centres) = plt.subplots(1, 2, figsize=(10, 3.8))
        objective = [h.get("objective") for h in self.history_]
        history.plot(range(1, len(objective) + 1), [np.nan if v is None else v for v in objective], marker=".")
        figure = self._figure()
        history.set(xlabel="iteration", ylabel=figure, title=f"{self.algo}: {figure}")
        C = self.cluster_centers_
        if C.shape[1] == 2:
            xy, axes = C, ("feature 0", "feature 1")
        else:  # the plane that keeps most of the centres' spread
            centred = C - C.mean(axis=0)
            xy, axes = (
                centred @ np.linalg.svd(centred, full_matrices=False)[2][:2].T,
                ("principal axis 1", "principal axis 2"),
            )
        if C.shape[1] > 1:
            centres.scatter(xy[:, 0], xy[:, 1], s=12)
        centres.set(xlabel=axes[0], ylabel=axes[1], title=f"{self.n_clusters} centres")
        fig.tight_layout()
        return fig

    def _repr_html_(self):
        """Jupyter's view: the summary as a table beside the objective against the iteration (inline SVG)."""
        import html

        cells = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
            for k, v in self._summary()
        )
        return (
            f"<div style='display:flex;gap:2em;align-items:flex-start'><table>{cells}</table>"
            f"{line_svg(list(enumerate((h.get('objective') for h in self.history_), 1)), self._figure())}</div>"
        )

    # ---------------------------------------------------------------- persistence
    def save(self, path):
        """Write the model to the directory ``path``: into a temporary directory beside it, moved into place
        when complete (a model already there is replaced only then; any other directory is refused)."""
        check_model_dir(path, "model directory")
        arrays = {"cluster_centers_": self.cluster_centers_}
        params = {}
        for k, v in self.params.items():
            if isinstance(v, np.ndarray) or (hasattr(v, "__array__") and np.ndim(v) > 0):
                arrays[f"param:{k}"] = np.asarray(v)  # an init given as a DataFrame or dask array, as its values
            else:
                params[k] = v
        extras = {}
        for k, v in self.extras_.items():
            if isinstance(v, np.ndarray):
                arrays[f"extra:{k}"] = v
            else:
                extras[k] = v
        meta = {
            "format_version": FORMAT_VERSION,
            "written_by": f"dask_clust {_installed_version()}",
            **({} if self.kind == "clustering" else {"model": self.kind}),
            "algo": self.algo,
            "params": params,
            "n_iter_": self.n_iter_,
            "converged_": self.converged_,
            "history_": self.history_,
            "n_distance_evals_": self.n_distance_evals_,
            "objective_": self.objective_,
            "extras_": extras,
            "engine_": self.engine_,
        }
        if "feature_names_in_" in self.__dict__:
            meta["feature_names_in_"] = list(self.feature_names_in_)
        text = json.dumps(meta, indent=1, default=_json_default)  # fails here, before anything is written
        with replacing(path) as tmp:
            os.makedirs(tmp)
            np.savez(os.path.join(tmp, "arrays.npz"), **arrays)
            with open(os.path.join(tmp, "model.json"), "w") as f:
                f.write(text)
        return path

    @classmethod
    def load(cls, path):
        """Read a model written by ``save``, refusing (``InvalidModelError``, one line) anything that does not
        match the schema: every key and its type, the centres' shape and finiteness, a known algorithm
        and parameters it accepts, the extras its predict reads (and no other algorithm's), a format this
        version reads; and, before reading them, files that are not regular, arrays whose stored bytes do
        not match their headers (or are compressed), model.json over MAX_META_BYTES or nested too deeply."""
        meta, arrays = _read(path)
        try:
            params, extras = _check_model(meta, arrays)
            from .algorithms import get

            # a probabilistic fit's model saved before every one was a mixture model has no "model" key
            kind = MODEL_KINDS[meta.get("model", "mixture" if get(meta["algo"]).probabilistic else "clustering")]
            if cls is not ClusteringModel and kind is not cls:
                raise ValueError(f"it holds a {kind.kind} model, not a {cls.kind} one")
            kind.check_fields(params, extras, arrays["cluster_centers_"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidModelError(f"{path} is not a valid dask_clust model: {_reason(exc)}") from None
        return kind(
            meta["algo"],
            params,
            arrays["cluster_centers_"],
            n_iter_=meta["n_iter_"],
            converged_=meta["converged_"],
            history_=meta["history_"],
            n_distance_evals_=meta["n_distance_evals_"],
            objective_=meta["objective_"],
            extras_=extras,
            engine_=meta.get("engine_"),
            feature_names_in_=meta.get("feature_names_in_"),
            written_by=meta.get("written_by"),  # (absent from a model saved before 0.1.0 recorded it)
        )

    @staticmethod
    def check_fields(params, extras, centers):
        """The schema of this kind's own fields (a subclass's); a clustering model holds none of a mixture's."""
        other = sorted(set(extras) & {f for k in MODEL_KINDS.values() for f in k.FIELDS})
        if other:
            raise ValueError(f"extras_ holds {other[0]!r}, which only a mixture model has")


MODEL_KINDS["clustering"] = ClusteringModel


def _installed_version():
    """The installed dask_clust's version (its package metadata: this layer does not import the package's
    top), or "(not installed)" for a checkout run from its source tree."""
    import importlib.metadata

    try:
        return importlib.metadata.version("dask_clust")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


# model.json's largest size: a model's metadata is kilobytes (its history a few hundred records)
MAX_META_BYTES = 64 << 20


def _read(path):
    """model.json and arrays.npz, read as untrusted input (models move between machines and people): both
    regular files (a FIFO would block the read for ever), model.json bounded in size and nesting, and every
    array's size checked against the bytes stored for it before any memory is allocated (``stored_arrays``)."""
    meta_path = os.path.join(path, "model.json")
    if not os.path.lexists(meta_path):
        raise FileNotFoundError(f"{path} is not a saved dask_clust model (no model.json)")
    try:
        if regular_size(meta_path) > MAX_META_BYTES:
            raise ValueError(f"model.json is over {MAX_META_BYTES >> 20} MiB")
        with open(meta_path) as f:
            text = f.read()
        try:
            meta = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"model.json is not valid JSON ({exc})") from None
        except RecursionError:
            raise ValueError("model.json nests too deeply") from None
        arrays = stored_arrays(os.path.join(path, "arrays.npz"))
    except UNREADABLE as exc:
        raise InvalidModelError(f"{path} is not a valid dask_clust model: {_reason(exc)}") from None
    return meta, arrays


def _reason(exc):
    text = str(exc).strip("'\"") or type(exc).__name__
    return f"missing key {text!r}" if isinstance(exc, KeyError) else text.splitlines()[0]


# model.json's keys and their types (``engine_`` is optional: informative only)
_SCHEMA = {
    "format_version": int,
    "algo": str,
    "params": dict,
    "n_iter_": int,
    "converged_": bool,
    "history_": list,
    "n_distance_evals_": int,
    "objective_": (int, float, type(None)),
    "extras_": dict,
}


def _check_model(meta, arrays):
    """The model's params and extras (arrays folded back in), after checking every part of the schema."""
    from ._params import build_config
    from .algorithms import get

    if not isinstance(meta, dict):
        raise TypeError("model.json must hold a JSON object")
    for key, kind in _SCHEMA.items():
        value = meta[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError(f"{key} has type {type(value).__name__}")
    if not 1 <= meta["format_version"] <= FORMAT_VERSION:
        raise ValueError(
            f"format_version {meta['format_version']} is not one this dask_clust reads "
            f"(1..{FORMAT_VERSION}; a newer dask_clust wrote it?)"
        )
    if meta["n_iter_"] < 0 or meta["n_distance_evals_"] < 0:
        raise ValueError("n_iter_ and n_distance_evals_ must be >= 0")
    if meta["objective_"] is not None and not math.isfinite(meta["objective_"]):
        raise ValueError(f"objective_ is {meta['objective_']}")
    if not all(isinstance(h, dict) for h in meta["history_"]):
        raise TypeError("history_ must be a list of objects")
    spec = get(meta["algo"])
    centers = arrays["cluster_centers_"]
    if centers.ndim != 2 or centers.dtype.kind != "f" or 0 in centers.shape:
        raise ValueError(f"cluster_centers_ must be a non-empty 2-D float array; got {centers.dtype} {centers.shape}")
    if not np.isfinite(centers).all():
        raise ValueError("cluster_centers_ holds NaN or infinity")
    names = meta.get("feature_names_in_")
    if names is not None and not (
        isinstance(names, list) and all(isinstance(c, str) for c in names) and len(names) == centers.shape[1]
    ):
        raise ValueError(f"feature_names_in_ must be a list of {centers.shape[1]} column names")
    params, extras = dict(meta["params"]), dict(meta["extras_"])
    for k, v in arrays.items():
        if k.startswith("param:"):
            params[k[6:]] = v
        elif k.startswith("extra:"):
            extras[k[6:]] = v
        elif k != "cluster_centers_":
            raise ValueError(f"arrays.npz holds an unknown array {k!r}")
    given = {k: v for k, v in params.items() if k != "random_state"}
    build_config(spec.config, f"algo={meta['algo']!r}", given)
    if given.get("n_clusters") != centers.shape[0]:
        raise ValueError(
            f"params n_clusters={given.get('n_clusters')} but cluster_centers_ has {centers.shape[0]} rows"
        )
    _check_used_extras(spec, extras, centers.shape[0])
    return params, extras


def _check_used_extras(spec, extras, n_clusters):
    """The extras that predict and transform read (``AlgorithmSpec.model_extras``): present, valid, and only in
    the models of the algorithms that declare them (a k-means model carrying SLK's ``row_normalization_``
    would have its rows normalised)."""
    from .algorithms import REGISTRY

    used = {name for s in REGISTRY.values() for name, _, _ in s.model_extras}
    foreign = sorted(used & extras.keys() - {name for name, _, _ in spec.model_extras})
    if foreign:
        raise ValueError(f"extras_ holds {foreign[0]!r}, which an algo={spec.name!r} model does not have")
    for name, check, what in spec.model_extras:
        if not check(extras[name], n_clusters):
            raise ValueError(f"extras_ {name} must be {what}; got {extras[name]!r}")


def _json_default(v):
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"cannot store {type(v).__name__} in model.json")
