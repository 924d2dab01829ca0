"""Nearest-centre assignment fused with the Lloyd partial sums; one kernel for fit, predict and score."""

import numpy as np
from numba import njit

from .distance import cross_products, gemm_tolerance, nearest_rows, rows_per_block, sqdist


@njit(nogil=True, cache=True)
def assign(X, Cd, cnorm, C, tol, block, labels, mind, mind2):
    """Label every row of X with its nearest centre; returns distance evaluations.

    X      : IN  float32/float64 (n, d)
    Cd     : IN  X's dtype (k, d) contiguous;  cnorm : IN float64 (k,);  C : IN float64 (k, d)
    tol    : IN  float  (``gemm_tolerance``);   block : IN int (``rows_per_block``)
    labels : OUT int32 (n,);  mind : OUT float64 (n,) exact squared distance to the label's centre
    mind2  : OUT float64 (n,) lower bound of the squared distance to every other centre, or (0,): skipped
    """
    n = X.shape[0]
    block = max(1, min(block, n))  # a chunk may hold no row of a sample
    G = np.empty((C.shape[0], block), dtype=X.dtype)
    best = np.empty(block, dtype=X.dtype)
    second = np.empty(block, dtype=X.dtype)
    jb = np.zeros(block, dtype=np.int32)
    top = np.empty(block)
    band = np.empty(block)
    evals = 0
    for b0 in range(0, n, block):
        evals += nearest_rows(
            X, b0, min(n, b0 + block), Cd, cnorm, C, tol, G, best, second, jb, top, band, labels, mind, mind2
        )
    return evals


@njit(nogil=True, cache=True)
def accumulate(X, w, labels, mind, sums, weights):
    """Lloyd's partial sufficient statistics for labelled rows; returns Σ w·mind (the block's QE).

    X       : IN    float32/float64 (n, d)
    w       : IN    float64 (n,) sample weights (ones when unweighted)
    labels  : IN    int32 (n,);   mind : IN float64 (n,)
    sums    : INOUT float64 (k, d)   Σ w x per centre
    weights : INOUT float64 (k,)     Σ w per centre
    """
    qe = 0.0
    for i in range(X.shape[0]):
        j = labels[i]
        wi = w[i]
        weights[j] += wi
        qe += wi * mind[i]
        for t in range(X.shape[1]):
            sums[j, t] += wi * np.float64(X[i, t])
    return qe


@njit(nogil=True, cache=True)
def all_sqdist(X, C, out):
    """out[i, j] = ||X[i] − C[j]||² (direct float64 form, for ``transform``); returns evaluations.

    X : IN float32/float64 (n, d);  C : IN float64 (k, d);  out : OUT float64 (n, k)
    """
    for i in range(X.shape[0]):
        for j in range(C.shape[0]):
            out[i, j] = sqdist(X, i, C, j)
    return X.shape[0] * C.shape[0]


@njit(nogil=True, cache=True)
def candidate_potentials(X, w, mind, Cd, cnorm, block, pot):
    """Greedy k-means++ scoring: pot[j] += Σ_i w_i min(mind_i, ||x_i − c_j||²); returns evaluations.

    X    : IN    float32/float64 (n, d);  w : IN float64 (n,);  mind : IN float64 (n,)
    Cd   : IN    X's dtype (m, d) contiguous;  cnorm : IN float64 (m,)
    pot  : INOUT float64 (m,)
    """
    n = X.shape[0]
    block = max(1, min(block, n))  # a chunk may hold no row of a sample
    G = np.empty((Cd.shape[0], block), dtype=X.dtype)
    xx = np.empty(block)
    for b0 in range(0, n, block):
        b1 = min(n, b0 + block)
        Gv = cross_products(X, b0, b1, Cd, G)
        for r in range(b1 - b0):
            s = 0.0
            for t in range(X.shape[1]):
                xv = np.float64(X[b0 + r, t])
                s += xv * xv
            xx[r] = s
        for j in range(Cd.shape[0]):
            acc = 0.0
            for r in range(b1 - b0):
                d = max(0.0, xx[r] - 2.0 * np.float64(Gv[j, r]) + cnorm[j])
                acc += w[b0 + r] * min(mind[b0 + r], d)
            pot[j] += acc
    return n * Cd.shape[0]


@njit(nogil=True, cache=True)
def update_mind(X, C, mind):
    """mind_i ← min(mind_i, min_j ||x_i − c_j||²) with the direct form; returns evaluations.

    X : IN float32/float64 (n, d);  C : IN float64 (m, d);  mind : INOUT float64 (n,)
    """
    for i in range(X.shape[0]):
        for j in range(C.shape[0]):
            d = sqdist(X, i, C, j)
            if d < mind[i]:
                mind[i] = d
    return X.shape[0] * C.shape[0]


class Prepared:
    """Centres in the forms the GEMM kernels want, computed once per broadcast (plain Python, not numba)."""

    __slots__ = ("C", "Cd", "cnorm", "tol", "block")

    def __init__(self, C, dtype):
        self.C = np.ascontiguousarray(C, dtype=np.float64)
        self.Cd = np.ascontiguousarray(self.C, dtype=dtype)
        self.cnorm = np.einsum("ij,ij->i", self.C, self.C)
        self.tol = gemm_tolerance(dtype, self.C.shape[1])
        self.block = rows_per_block(self.C.shape[0])

    def __reduce__(self):
        # ship only C: the receiving side rebuilds the rest in the block's dtype
        return (Prepared, (self.C, self.Cd.dtype))


def nearest(X, centers, labels=None, mind=None, mind2=None):
    """Nearest centre of every row of X: (labels int32, exact squared distance float64, evaluations).

    centers: a ``Prepared`` in X's dtype. ``labels``/``mind`` are reused as output buffers when given;
    ``mind2`` (float64 (n,)), when given, receives a lower bound of each row's squared distance to every
    centre but its nearest.
    """
    n = X.shape[0]
    labels = np.empty(n, np.int32) if labels is None else labels
    mind = np.empty(n) if mind is None else mind
    evals = assign(
        X,
        centers.Cd,
        centers.cnorm,
        centers.C,
        centers.tol,
        centers.block,
        labels,
        mind,
        _NONE if mind2 is None else mind2,
    )
    return labels, mind, evals


_NONE = np.empty(0)
