"""Clustering quality: quantization error (any size, lazy blockwise), and for label vectors that fit in
memory: NMI, ACC (Hungarian matching of clusters to classes) and purity."""

import numpy as np


def quantization_error(X, centers, sample_weight=None):
    """Σ_n w_n min_c ||x_n − c||² (float64); X as any input ``fit`` takes."""
    from .models import ClusteringModel

    return ClusteringModel("centers", {}, centers).quantization_error(X, sample_weight)


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
