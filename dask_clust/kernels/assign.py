"""Nearest-centre assignment fused with the Lloyd partial sums; one kernel for fit, predict and score.

The functions a step calls (``nearest``, ``nearest_after_move``, ``accumulate``, ``update_mind``,
``candidate_potentials``) take a chunk's rows dense, or as a scipy CSR matrix (``is_csr``), which they hand
to ``sparse.py``'s kernels: a step reads ``chunk.x`` alike either way."""

import numpy as np
from numba import njit

from .distance import cross_products, gemm_tolerance, nearest_rows, rows_per_block, sqdist, sqdist_to_labels
from .sparse import csr_accumulate, csr_assign, csr_assign_moved, csr_potentials, csr_row_sqnorms, csr_sqdist_to


def is_csr(X):
    """Whether rows are a CSR matrix (scipy's ``indptr``, ``indices``, ``data``) rather than a dense array."""
    return hasattr(X, "indptr")


def densified(X):
    """Rows as a dense array: CSR rows (a few of them: a batch's, the seeds') made dense."""
    return X.toarray() if is_csr(X) else X


def squared_distances(X, C, out=None):
    """(n, k) float64 squared distances of rows X to float64 centres C: the direct form for dense rows
    (``all_sqdist``), ||x||² − 2 x·c + ||c||² by scipy's sparse product for CSR rows (O(nnz·k)), clamped at 0."""
    out = np.empty((X.shape[0], C.shape[0])) if out is None else out
    if is_csr(X):
        xx = kernel_rows(X)[3]
        np.maximum(xx[:, None] - 2.0 * (X.astype(np.float64) @ C.T) + np.einsum("ij,ij->i", C, C), 0.0, out=out)
    else:
        all_sqdist(np.ascontiguousarray(X), C, out)
    return out


def squared_distances_to(X, C, ids):
    """(n, m) float64 squared distances of each row of X to its centres ``ids`` (n, m) int32: directly for
    dense rows, by the expansion from a CSR row's non-zeros."""
    out = np.empty(ids.shape)
    if is_csr(X):
        csr_sqdist_to(X.indptr, X.indices, X.data, C, np.einsum("ij,ij->i", C, C), ids, out)
        return out
    x = np.asarray(X, np.float64)
    for j in range(ids.shape[1]):
        out[:, j] = ((x - C[ids[:, j]]) ** 2).sum(axis=1)
    return out


def kernel_rows(X, xx=None):
    """Rows as the kernels that take either layout read them: a dense array as it is, CSR rows as (indptr,
    indices, data, xx) with xx their squared norms in float64 (computed when not given)."""
    if not is_csr(X):
        return X
    if xx is None:
        xx = np.empty(X.shape[0])
        csr_row_sqnorms(X.indptr, X.data, xx)
    return X.indptr, X.indices, X.data, xx


def stacked(blocks):
    """Row blocks end to end: CSR blocks (a chunk's pieces, candidates drawn from CSR rows) as one CSR matrix."""
    if any(is_csr(b) for b in blocks):
        from scipy.sparse import vstack

        return vstack([b for b in blocks if b.shape[0]] or blocks[:1], format="csr")
    return np.concatenate(blocks)


@njit(nogil=True, cache=True)
def assign(X, Cd, cnorm, C, tol, block, labels, mind, mind2, known):
    """Label every row of X with its nearest centre; returns distance evaluations.

    X      : IN  float32/float64 (n, d)
    Cd     : IN  X's dtype (k, d) contiguous;  cnorm : IN float64 (k,);  C : IN float64 (k, d)
    tol    : IN  float  (``gemm_tolerance``);   block : IN int (``rows_per_block``)
    labels : OUT int32 (n,);  mind : OUT float64 (n,) exact squared distance to the label's centre
    mind2  : OUT float64 (n,) lower bound of the squared distance to every other centre, or (0,): skipped
    known  : IN  int32 (n,) the centre each row's ``mind`` is already exact for, or (0,): none
             (``distance.nearest_rows``; such a row counts one evaluation all the same)
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
            X, b0, min(n, b0 + block), Cd, cnorm, C, tol, G, best, second, jb, top, band, labels, mind, mind2, known
        )
    return evals


def accumulate(X, w, labels, mind, sums, weights, qe=0.0):
    """Lloyd's partial sufficient statistics for labelled rows (dense or CSR); returns ``qe`` + Σ w·mind. Dense
    rows add to ``qe`` row by row, so that rows taken in slabs, each slab's sum starting from the last, give
    the bits of the rows taken at once; CSR rows add their own sum to it (a chunk of them is one slab)."""
    if is_csr(X):
        return qe + csr_accumulate(X.indptr, X.indices, X.data, w, labels, mind, sums, weights)
    return _accumulate(X, w, labels, mind, sums, weights, qe)


@njit(nogil=True, cache=True)
def _accumulate(X, w, labels, mind, sums, weights, qe):
    """Lloyd's partial sufficient statistics for labelled rows; returns qe + Σ w·mind, row by row.

    X       : IN    float32/float64 (n, d)
    w       : IN    float64 (n,) sample weights (ones when unweighted)
    labels  : IN    int32 (n,);   mind : IN float64 (n,);  qe : IN float the sum so far
    sums    : INOUT float64 (k, d)   Σ w x per centre
    weights : INOUT float64 (k,)     Σ w per centre
    """
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


def candidate_potentials(X, w, mind, centers, pot):
    """Greedy k-means++ scoring (``_candidate_potentials``) against candidates ``centers`` (a ``Prepared``),
    of dense or CSR rows; returns evaluations."""
    if is_csr(X):
        return csr_potentials(X.indptr, X.indices, X.data, w, mind, centers.CT, centers.cnorm, pot)
    return _candidate_potentials(X, w, mind, centers.Cd, centers.cnorm, centers.block, pot)


@njit(nogil=True, cache=True)
def _candidate_potentials(X, w, mind, Cd, cnorm, block, pot):
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


def update_mind(X, C, mind):
    """mind_i ← min(mind_i, min_j ||x_i − c_j||²) over float64 centres C (m, d), dense or CSR rows (their
    distances by the expansion, ``sparse.csr_assign``); returns evaluations."""
    if is_csr(X):
        _, d2, evals = nearest(X, Prepared(C, X.dtype))
        np.minimum(mind, d2, out=mind)
        return evals
    return _update_mind(X, C, mind)


@njit(nogil=True, cache=True)
def _update_mind(X, C, mind):
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

    __slots__ = ("C", "dtype", "cnorm", "tol", "block", "_Cd", "_CT")

    def __init__(self, C, dtype):
        self.C = np.ascontiguousarray(densified(C), dtype=np.float64)  # (candidates drawn from CSR rows)
        self.dtype = np.dtype(dtype)
        self.cnorm = np.einsum("ij,ij->i", self.C, self.C)
        self.tol = gemm_tolerance(dtype, self.C.shape[1])
        self.block = rows_per_block(self.C.shape[0])
        self._Cd = self._CT = None

    @property
    def Cd(self):
        """The centres in the rows' dtype, contiguous: what the GEMM of dense rows reads (made on first use: a
        copy of k × d that CSR rows never read)."""
        if self._Cd is None:
            self._Cd = np.ascontiguousarray(self.C, dtype=self.dtype)
        return self._Cd

    @property
    def CT(self):
        """The centres' columns, (d, k) float64 contiguous: what a CSR row's inner products gather (made on
        first use: only CSR rows read it)."""
        if self._CT is None:
            self._CT = np.ascontiguousarray(self.C.T)
        return self._CT

    def __reduce__(self):
        # ship only C: the receiving side rebuilds the rest in the block's dtype
        return (Prepared, (self.C, self.dtype))


def nearest(X, centers, labels=None, mind=None, mind2=None):
    """Nearest centre of every row of X: (labels int32, exact squared distance float64, evaluations).

    centers: a ``Prepared`` in X's dtype. ``labels``/``mind`` are reused as output buffers when given;
    ``mind2`` (float64 (n,)), when given, receives a lower bound of each row's squared distance to every
    centre but its nearest.
    """
    n = X.shape[0]
    labels = np.empty(n, np.int32) if labels is None else labels
    mind = np.empty(n) if mind is None else mind
    if is_csr(X):  # float64 inner products, no GEMM rounding to search again
        evals = csr_assign(
            X.indptr, X.indices, X.data, centers.CT, centers.cnorm, labels, mind, _NONE if mind2 is None else mind2
        )
        return labels, mind, evals
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
        _NO_LABELS,
    )
    return labels, mind, evals


_NO_LABELS = np.empty(0, np.int32)  # ``assign``'s ``known``: no row's distance measured before
_NONE = np.empty(0)


# relative slack on the triangle-inequality test: far above the rounding of a float64 distance
TRIANGLE_SLACK = 1e-9
# rows gathered for the GEMM when too many candidates pass the triangle test
GATHER_ROWS = 4096
# the share of rows failing Hamerly's test above which ``assign_moved`` searches every row in place (200k
# rows x 32, k = 8: gathering 74 % of them cost 9.8 ms, all 11.5, searching all in place 7.7)
FULL_SEARCH_SHARE = 0.5
# every how many rows ``_most_fail`` probes
PROBE_STRIDE = 16
# a row measures at most this many candidates directly; more go to the GEMM
MOST_DIRECT = 32


def direct_limit(m):
    """How many of m new candidates a row measures directly before the GEMM is cheaper (a quarter)."""
    return max(1, min(m // 4, MOST_DIRECT))


@njit(nogil=True, cache=True)
def candidate_gaps(K, C, width):
    """Each known candidate's nearest ``width`` new ones, for ``lower_near``: (order, gaps), row a of order
    those new candidates by ascending distance from K[a], row a of gaps their distances shrunk by the slack
    (a lower bound however they round).

    K : IN float64 (a, d) known candidates;  C : IN float64 (m, d) new candidates;  width : IN <= m
    """
    order = np.empty((K.shape[0], width), np.int64)
    gaps = np.empty((K.shape[0], width))
    for a in range(K.shape[0]):
        filled = 0
        for j in range(C.shape[0]):
            g = np.sqrt(sqdist(K, a, C, j)) * (1.0 - TRIANGLE_SLACK)
            if filled == width and g >= gaps[a, width - 1]:
                continue
            t = min(filled, width - 1)  # insertion: ties keep the lower index first
            while t > 0 and gaps[a, t - 1] > g:
                gaps[a, t] = gaps[a, t - 1]
                order[a, t] = order[a, t - 1]
                t -= 1
            gaps[a, t] = g
            order[a, t] = j
            filled = min(filled + 1, width)
    return order, gaps


@njit(nogil=True, cache=True)
def lower_near(X, Cd, cnorm, C, tol, block, order, gaps, most, offset, mind, near):
    """mind_i ← min(mind_i, min_j ||x_i − c_j||²) over new candidates C, and near_i ← offset + j where it
    falls (the lowest j on ties; a tie with mind_i keeps near_i); returns distance evaluations.

    By the triangle inequality a candidate at least 2·sqrt(mind_i) from the row's nearest known candidate
    near_i cannot be strictly closer: a row measures directly only the candidates nearer than that (a walk
    along ``order[near_i]``). Where more than ``most`` of them pass (the first rounds, when the known
    candidates are few), the row goes to the GEMM kernel with others like it instead. Either way the
    result is the exact nearest new candidate, so the bits are those of a full search.

    X : IN float32/float64 (n, d);  Cd, cnorm, C, tol, block : IN the new candidates as ``assign`` takes them
    order, gaps : IN (known, min(m, most + 1)) from ``candidate_gaps``;  most : IN ``direct_limit(m)``
    offset : IN the first new candidate's number;  mind : INOUT float64 (n,) exact squared distance to near
    near : INOUT int32 (n,), every entry < offset
    """
    n = X.shape[0]
    width = gaps.shape[1]
    rows, Xg, labels, d2, _, _ = gather_buffers(X)
    skip = np.empty(0)  # no second-nearest bound wanted
    evals = 0
    g = 0
    for i in range(n):
        a = near[i]
        reach = 2.0 * np.sqrt(mind[i]) * (1.0 + TRIANGLE_SLACK)
        t = 0
        while t < width and gaps[a, t] < reach:
            t += 1
        if t > most:
            rows[g] = i
            for t in range(X.shape[1]):  # not Xg[g] = X[i]: a row view costs two atomic reference counts
                Xg[g, t] = X[i, t]
            g += 1
        else:
            best, bj = mind[i], -1
            for s in range(t):
                j = order[a, s]
                d = sqdist(X, i, C, j)
                if d < best or (bj >= 0 and d == best and j < bj):
                    best, bj = d, j
            evals += t
            if bj >= 0:
                mind[i] = best
                near[i] = offset + bj
        if g == GATHER_ROWS or (g > 0 and i == n - 1):
            evals += assign(Xg[:g], Cd, cnorm, C, tol, block, labels, d2, skip, labels[:0])
            for r in range(g):
                if d2[r] < mind[rows[r]]:
                    mind[rows[r]] = d2[r]
                    near[rows[r]] = offset + labels[r]
            g = 0
    return evals


@njit(nogil=True, cache=True)
def gather_buffers(X):
    """Room for GATHER_ROWS rows sent to the GEMM: (their indices, the rows, their labels, min d² and
    second-nearest bound as ``assign`` writes them, and the labels their d² was measured to before)."""
    rows = np.empty(GATHER_ROWS, np.int64)
    Xg = np.empty((GATHER_ROWS, X.shape[1]), X.dtype)
    labels = np.empty(GATHER_ROWS, np.int32)
    return rows, Xg, labels, np.empty(GATHER_ROWS), np.empty(GATHER_ROWS), np.empty(GATHER_ROWS, np.int32)


@njit(nogil=True, cache=True)
def _most_fail(shift, far, second, arg, prev, mind, mind2):
    """Whether more than ``FULL_SEARCH_SHARE`` of the rows would fail Hamerly's test, estimated before any
    distance from every ``PROBE_STRIDE``-th row: a row is counted as passing only when its own centre's
    distance before the move plus that centre's move is below its bound (the test's distance can only be
    nearer). Decided from the rows' state alone, so a chunk decides alike on any worker and after a resume."""
    probed = unsure = 0
    for i in range(0, prev.shape[0], PROBE_STRIDE):
        a = prev[i]
        lower = np.sqrt(mind2[i]) * (1.0 - TRIANGLE_SLACK) - (second if a == arg else far)
        unsure += not (lower > 0.0 and np.sqrt(mind[i]) + shift[a] < lower)
        probed += 1
    return unsure > FULL_SEARCH_SHARE * probed


@njit(nogil=True, cache=True)
def assign_moved(X, Cd, cnorm, C, tol, block, shift, prev, labels, mind, mind2):
    """``assign`` after the centres moved, for rows whose ``prev`` labels, ``mind`` and ``mind2`` were
    exact for the centres before the move; returns distance evaluations.

    Hamerly's test (G. Hamerly, "Making k-means even faster", SDM 2010, §3): every other centre is at
    least sqrt(mind2) − (the largest shift of another centre) from the row; when the row's own centre,
    measured directly, is strictly nearer than that, the label stands and only that distance is new. Other
    rows go to the GEMM kernel in gathers. When more than ``FULL_SEARCH_SHARE`` of the rows fail (small k
    while the centres still travel), every row is searched in place instead: a gathered row costs a copy and
    a second distance, a kept one its distance and test (``_most_fail`` foresees it; failures found
    anyway over that share take the same route). Either way the labels and distances are those of a full search
    (the kept rows' bounds are the scan's, not the test's).

    X : IN float32/float64 (n, d);  Cd, cnorm, C, tol, block : IN the centres as ``assign`` takes them
    shift : IN float64 (k,) an upper bound of each centre's move;  prev : IN int32 (n,) the labels before
    labels : OUT int32 (n,);  mind : INOUT float64 (n,) exact squared distance to the label's centre
    mind2 : INOUT float64 (n,) a lower bound of the squared distance to every other centre
    """
    far, second, arg = 0.0, 0.0, -1  # the largest move, its centre, and the largest of the others
    for j in range(shift.shape[0]):
        if shift[j] > far:
            far, second, arg = shift[j], far, j
        elif shift[j] > second:
            second = shift[j]
    n = X.shape[0]
    if _most_fail(shift, far, second, arg, prev, mind, mind2):
        return assign(X, Cd, cnorm, C, tol, block, labels, mind, mind2, prev[:0])
    sqdist_to_labels(X, 0, n, C, prev, mind, prev[:0])  # in a loop of its own (see ``nearest_rows``)
    kept = np.empty(n, np.bool_)
    n_kept = 0
    for i in range(n):  # branch-free: which rows pass is a coin toss while the centres travel
        lower = np.sqrt(mind2[i]) * (1.0 - TRIANGLE_SLACK) - (second if prev[i] == arg else far)
        keep = (lower > 0.0) & (mind[i] < lower * lower)
        kept[i] = keep
        labels[i] = prev[i]  # a row that fails is searched again below
        mind2[i] = lower * lower if keep else mind2[i]
        n_kept += keep
    if n - n_kept > FULL_SEARCH_SHARE * n:  # (``mind`` is exact for ``prev``: kept labels are not measured again)
        return n + assign(X, Cd, cnorm, C, tol, block, labels, mind, mind2, prev)
    rows, Xg, glabels, gmind, gmind2, gknown = gather_buffers(X)
    evals = n
    g = 0
    for i in range(n):
        if not kept[i]:
            rows[g] = i
            for t in range(X.shape[1]):  # not Xg[g] = X[i]: a row view costs two atomic reference counts
                Xg[g, t] = X[i, t]
            gknown[g], gmind[g] = prev[i], mind[i]
            g += 1
        if g == GATHER_ROWS or (g > 0 and i == n - 1):
            evals += assign(Xg[:g], Cd, cnorm, C, tol, block, glabels, gmind, gmind2, gknown[:g])
            for r in range(g):
                labels[rows[r]], mind[rows[r]], mind2[rows[r]] = glabels[r], gmind[r], gmind2[r]
            g = 0
    return evals


def nearest_after_move(X, centers, shift, prev, labels, mind, mind2):
    """``nearest`` for rows whose ``prev`` labels and ``mind``/``mind2`` belong to centres each at most
    ``shift`` from ``centers`` (a ``Prepared``): the same labels and distances, most rows measured against
    their own centre alone (``assign_moved``). ``labels`` (None: new) receives the labels; ``mind`` and
    ``mind2`` are updated in place. Returns (labels, mind, evaluations). CSR rows: ``sparse.csr_assign_moved``."""
    labels = np.empty(X.shape[0], np.int32) if labels is None else labels
    if is_csr(X):
        evals = csr_assign_moved(
            X.indptr, X.indices, X.data, centers.CT, centers.cnorm, shift, prev, labels, mind, mind2
        )
        return labels, mind, evals
    evals = assign_moved(
        X, centers.Cd, centers.cnorm, centers.C, centers.tol, centers.block, shift, prev, labels, mind, mind2
    )
    return labels, mind, evals
