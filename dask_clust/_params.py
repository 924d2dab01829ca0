"""Parameter constraints, declared once on each algorithm's config dataclass and checked at the edge
(``api``), as scikit-learn's ``_parameter_constraints``. Below the edge, parameters are trusted."""

import math
import numbers
from dataclasses import dataclass, fields

import numpy as np

from .errors import InvalidParameterError

# a Gaussian mixture's covariance types (vc-GMM's ``covariance_type``, ``MixtureModel``): one σ² shared by
# every component, one per component, one per component and feature
COVARIANCE_TYPES = ("tied-spherical", "spherical", "diag", "full", "tied")


@dataclass(frozen=True)
class Interval:
    kind: type  # numbers.Integral or numbers.Real
    low: float | None
    high: float | None
    closed: str = "both"  # "both", "left", "right", "neither"

    def holds(self, v):
        if isinstance(v, bool) or not isinstance(v, self.kind):
            return False
        if isinstance(v, numbers.Real) and not math.isfinite(v) and self.kind is numbers.Real:
            return False
        lo_ok = self.low is None or (v >= self.low if self.closed in ("both", "left") else v > self.low)
        hi_ok = self.high is None or (v <= self.high if self.closed in ("both", "right") else v < self.high)
        return lo_ok and hi_ok

    def __str__(self):
        name = "an int" if self.kind is numbers.Integral else "a float"
        left = "[" if self.closed in ("both", "left") else "("
        right = "]" if self.closed in ("both", "right") else ")"
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        return f"{name} in the range {left}{lo}, {hi}{right}"

    def bad_value(self):
        if self.low is not None:
            return self.low - 1 if self.kind is numbers.Integral else self.low - 0.5
        return self.high + 1


@dataclass(frozen=True)
class Options:
    values: tuple

    def holds(self, v):
        return isinstance(v, str) and v in self.values

    def __str__(self):
        return "a str among {" + ", ".join(repr(v) for v in self.values) + "}"

    def bad_value(self):
        return "not-a-valid-option"


@dataclass(frozen=True)
class FiniteArray:
    """An array-like of finite numbers with one of ``ndims`` dimensions (its shape checked against the data
    by the algorithm)."""

    ndims: tuple = (2,)

    def holds(self, v):
        if isinstance(v, (str, bytes)) or not hasattr(v, "__len__"):
            return False
        a = np.asarray(v)
        return a.ndim in self.ndims and a.dtype.kind in "biuf" and bool(np.all(np.isfinite(a)))

    def __str__(self):
        return "a " + " or ".join(f"{n}-D" for n in self.ndims) + " array-like of finite numbers"

    def bad_value(self):
        return np.ones((1,) * (max(self.ndims) + 1)).tolist()


class Boolean:
    def holds(self, v):
        return isinstance(v, (bool, np.bool_))

    def __str__(self):
        return "a bool"

    def bad_value(self):
        return "yes"


class NoneOK:
    def holds(self, v):
        return v is None

    def __str__(self):
        return "None"

    def bad_value(self):
        return None


# the meaning of the parameters most algorithms share; a config's ``docs`` adds or overrides its own
COMMON_DOCS = {
    "n_clusters": "Number of clusters (centres) to find; at most the number of rows.",
    "init": "Seeding: 'k-means||' (Bahmani et al., oversampled rounds), 'k-means++' (greedy, "
    "n_local_trials candidates per centre), 'afkmc2' (Bachem et al.'s Markov-chain approximation of "
    "k-means++), 'random' (distinct rows), or an (n_clusters, n_features) array of initial centres.",
    "max_iter": "Most iterations of the main loop; the fit stops earlier when tol is met.",
    "oversampling_factor": "k-means||: candidates drawn per round, as a multiple of n_clusters (l = factor * k).",
    "init_max_iter": "k-means||: most sampling rounds (fewer when the candidates' cost stops falling).",
    "n_local_trials": "Greedy k-means++: candidates tried per centre (None: 2 + ln k, scikit-learn's choice).",
    "chain_length": "AFK-MC2: Markov-chain length m per centre (the paper's default is 20).",
    "coreset_size": "Rows of the lightweight coreset (Bachem et al., KDD 2018) the algorithm runs on; "
    "None runs on all rows. The model's objective is still the QE over all rows.",
    "batch_size": "Rows per mini-batch.",
}


def check(owner, name, value, constraints):
    if any(c.holds(value) for c in constraints):
        return
    allowed = " or ".join(str(c) for c in constraints)
    shown = repr(value) if not hasattr(value, "shape") else f"array of shape {np.shape(value)}"
    raise InvalidParameterError(
        f"The {name!r} parameter of {owner} must be {allowed}; got {shown} ({type(value).__name__})"
    )


def build_config(config_cls, owner, params):
    """Instantiate ``config_cls`` from ``params``, rejecting unknown names and invalid values."""
    names = [f.name for f in fields(config_cls)]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise InvalidParameterError(f"{owner} got unknown parameter(s) {unknown}; valid parameters are {sorted(names)}")
    for name, value in params.items():
        check(owner, name, value, config_cls.constraints[name])
    return config_cls(**params)


def describe(config_cls, name):
    """The meaning of parameter ``name`` of ``config_cls``: its ``docs`` entry, else the shared one."""
    return {**COMMON_DOCS, **getattr(config_cls, "docs", {})}.get(name)
