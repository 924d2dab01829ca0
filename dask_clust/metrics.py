"""Clustering quality. Without labels, of the partition a set of centres makes on data of any size (one or
two passes, O(k·D) to the driver): quantization error, Calinski–Harabasz, Davies–Bouldin, the simplified
silhouette, and the exact silhouette of a uniform sample; each the same number as scikit-learn's score of
the labels the centres give. Against known classes, for label vectors that fit in memory: NMI, ACC
(Hungarian matching of clusters to classes) and purity."""

import contextlib

import numpy as np

from ._random import check_random_state
from .blocks import criteria
from .engine import as_source, open_engine
from .errors import InvalidParameterError


def quantization_error(X, centers, sample_weight=None):
    """Σ_n w_n min_c ||x_n − c||² (float64); X as any input ``fit`` takes."""
    from .models import ClusteringModel

    return ClusteringModel("centers", {}, centers).quantization_error(X, sample_weight)


@contextlib.contextmanager
def _partition(X, centers, sample_weight, client):
    """An engine over X and the centres checked against it."""
    centers = getattr(centers, "cluster_centers_", getattr(centers, "means_", centers))
    with open_engine(as_source(X, sample_weight), client) as engine:
        yield engine, criteria.check_centers(engine, centers)


def calinski_harabasz_score(X, centers, *, sample_weight=None, client=None):
    """The Calinski–Harabasz index (variance ratio) of the partition ``centers`` make on X, each row in its
    nearest centre's cluster: scikit-learn's ``calinski_harabasz_score`` of those labels, from one pass.

    X: any input ``fit`` takes (dense rows, or sparse ones as CSR); centers: (k, d), or a fitted model (its
    ``cluster_centers_`` or ``means_``); sample_weight: a row of weight w counts w times; client: as ``fit``'s."""
    with _partition(X, centers, sample_weight, client) as (engine, C):
        return criteria.calinski_harabasz(criteria.partition_sums(engine, C, spreads=False), C)


def davies_bouldin_score(X, centers, *, sample_weight=None, client=None):
    """The Davies–Bouldin index of the partition ``centers`` make on X (lower is better): scikit-learn's
    ``davies_bouldin_score`` of those labels, from two passes (the clusters' means, then the rows' distances
    to them). Arguments as ``calinski_harabasz_score``'s."""
    with _partition(X, centers, sample_weight, client) as (engine, C):
        return criteria.davies_bouldin(criteria.partition_sums(engine, C), C)


def simplified_silhouette_score(X, centers, *, sample_weight=None, client=None):
    """The simplified silhouette of the partition ``centers`` make on X: the mean over rows of (b − a) /
    max(a, b), a and b a row's distances to its nearest and second-nearest centre (Hruschka et al., Inf. Sci.
    176(13), 2006; Spark's ``ClusteringEvaluator``), from one pass. Arguments as
    ``calinski_harabasz_score``'s."""
    with _partition(X, centers, sample_weight, client) as (engine, C):
        return criteria.simplified_silhouette(criteria.partition_sums(engine, C, spreads=False))


def silhouette_score(X, centers, *, sample_size=10_000, random_state=None, client=None):
    """Rousseeuw's silhouette, exact, on ``sample_size`` rows of X drawn uniformly without replacement (every
    row when X has no more), each labelled by its nearest centre: scikit-learn's ``silhouette_score`` of the
    drawn rows and their labels. It costs O(sample_size² · D) on this process and reads only the chunks
    holding the drawn rows. random_state: the draw's (the same value draws the same rows on any chunking)."""
    if not (isinstance(sample_size, (int, np.integer)) and not isinstance(sample_size, bool) and sample_size >= 2):
        raise InvalidParameterError(f"sample_size must be an int >= 2; got {sample_size!r}")
    entropy = check_random_state(random_state)
    with _partition(X, centers, None, client) as (engine, C):
        return criteria.sample_silhouette(criteria.silhouette_sample(engine, int(sample_size), entropy), C)


def _contingency(labels_true, labels_pred):
    t = np.unique(np.asarray(labels_true), return_inverse=True)[1].ravel()
    p = np.unique(np.asarray(labels_pred), return_inverse=True)[1].ravel()
    if t.shape != p.shape:
        raise ValueError(f"label vectors differ in length: {t.shape[0]} and {p.shape[0]}")
    m = np.zeros((t.max() + 1, p.max() + 1), dtype=np.int64)
    np.add.at(m, (t, p), 1)
    return m


def nmi(labels_true, labels_pred):
    """Normalised mutual information with the arithmetic-mean normaliser (scikit-learn's default)."""
    m = _contingency(labels_true, labels_pred).astype(np.float64)
    n = m.sum()
    pt, pp = m.sum(1) / n, m.sum(0) / n
    nz = m > 0
    mi = float((m[nz] / n * np.log(m[nz] / n / np.outer(pt, pp)[nz])).sum())
    ht = -float((pt[pt > 0] * np.log(pt[pt > 0])).sum())
    hp = -float((pp[pp > 0] * np.log(pp[pp > 0])).sum())
    if ht == 0 and hp == 0:
        return 1.0
    return mi / max((ht + hp) / 2, np.finfo(float).tiny)


def acc(labels_true, labels_pred):
    """Accuracy under the best one-to-one matching of clusters to classes (Hungarian, scipy)."""
    from scipy.optimize import linear_sum_assignment

    m = _contingency(labels_true, labels_pred)
    r, c = linear_sum_assignment(-m)
    return float(m[r, c].sum() / m.sum())


def purity(labels_true, labels_pred):
    """Fraction of rows whose cluster's majority class is their class."""
    m = _contingency(labels_true, labels_pred)
    return float(m.max(0).sum() / m.sum())
