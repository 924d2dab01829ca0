"""The k-nearest-neighbour graph of the rows: r out-neighbours per row (the row itself excluded), sorted by
(distance, row id), so the graph does not depend on the chunking or the workers.

``method="exact"``: every chunk reads all rows once through a halo (partition to partition, never through
the driver) and searches them by blocked GEMM, the candidates within the GEMM's error bound of the r-th
re-measured directly in float64. It costs N²·D multiply-adds and N·D·(partitions) bytes moved: the
choice while N²·D stays small. (The IVF method for large N, ALGORITHMS.md §5, is not built yet.)

Used by SLK (Ziko, Granger & Ben Ayed, NeurIPS 2018), whose kernel width comes from the graph:
``reference_sigma`` is the authors' σ² = Σ (squared r-NN distances) / ((r + 1) N).

What the driver receives: the graph itself when asked for (N·r ids and distances: ``kneighbors_graph``),
else the exact sum of the squared neighbour distances (one number).
"""
import contextlib
import math

import numpy as np

from .engine import as_source, config, open_engine
from .engine.combine import Rows, Sum
from .engine.data import InputError, l2_rows
from .kernels.distance import nearest_neighbours

METHODS = ("exact",)
# query rows per GEMM block: keeps the block's distances near 128 MB whatever N is
_BLOCK_VALUES = 1 << 24


def rows_float64(chunk, normalize):
    """State ``knn-x``: the chunk's rows in float64, L2-normalised when asked (SLK's input)."""
    chunk.state["knn-x"] = l2_rows(chunk.x) if normalize else np.asarray(chunk.x, dtype=np.float64)


def gemm_sqdist(Q, Y, qq, yy):
    """Squared distances ||q||² − 2 q·y + ||y||² of every pair (GEMM form; rounding up to ``slack``'s
    bound, negative values possible); qq, yy: the rows' squared norms."""
    return qq[:, None] - 2.0 * (Q @ Y.T) + yy[None, :]


def squared_norms(X):
    return np.einsum("ij,ij->i", X, X)


def _all_rows(chunk, n):
    return np.arange(n, dtype=np.int64)


def search(chunk, r):
    """The chunk's rows' r nearest neighbours among all rows (``halo["knn-x"]``), kept as state
    ``knn`` = (ids, squared distances); returns the exact sum of the squared distances."""
    Q, Y = chunk.state["knn-x"], chunk.halo["knn-x"]
    n, m = Q.shape[0], Y.shape[0]
    ids = np.empty((n, r), np.int64)
    d2 = np.empty((n, r))
    qq, yy = squared_norms(Q), squared_norms(Y)
    # |GEMM form − exact| <= (2D + 8)·u·(|q| + |y|)² (Higham's dot-product bound, with room for the norms)
    slack = (2 * Q.shape[1] + 8) * 2.0 ** -53 * (math.sqrt(qq.max(initial=0)) + math.sqrt(yy.max(initial=0))) ** 2
    step = max(1, _BLOCK_VALUES // max(1, m))
    q_ids = np.arange(chunk.start, chunk.stop, dtype=np.int64)
    for a in range(0, n, step):
        b = min(n, a + step)
        approx = gemm_sqdist(Q[a:b], Y, qq[a:b], yy)
        nearest_neighbours(Q[a:b], q_ids[a:b], Y, approx, slack, ids[a:b], d2[a:b])
    chunk.state["knn"] = (ids, d2)
    return (d2.sum(),)


class GraphLost(RuntimeError):
    """A partition holding part of the graph was rebuilt after a lost worker."""


def _graph_lost(chunk, model):
    raise GraphLost(f"the kNN graph of rows {chunk.start}..{chunk.stop - 1} was on a lost worker and is not rebuilt "
                    "yet (a search needs every row again): run the fit again")


def _graph_rows(chunk, params):
    ids, d2 = chunk.state["knn"]
    return ids, d2


def check_neighbours(n_neighbors, n_samples, n_features, method="exact"):
    if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, (int, np.integer)) or n_neighbors < 1:
        raise InputError(f"n_neighbors must be an int >= 1; got {n_neighbors!r}")
    if n_neighbors >= n_samples:
        raise InputError(f"n_neighbors={n_neighbors} needs more than n_neighbors rows; got n_samples={n_samples}")
    if method not in METHODS:
        raise InputError(f"method must be one of {list(METHODS)}; got {method!r}")
    work, budget = float(n_samples) ** 2 * n_features, float(config.get("knn-exact-budget"))
    if work > budget:
        raise InputError(f"the exact kNN graph of {n_samples:,} rows x {n_features} features is {work:.3g} "
                         f"multiply-adds, over dask_clust.knn-exact-budget = {budget:.3g}, and every partition would "
                         "hold all rows; the IVF method for large N is not built yet: fit on a sample of the rows, "
                         "or raise the budget")


class NeighbourGraph:
    """The graph's state ``knn`` on the workers (per chunk: ids and squared distances of its rows'
    neighbours) for the ``with`` block of ``neighbour_graph``; ``sum_d2`` is exact."""

    def __init__(self, engine, n_neighbors, sum_d2):
        self.engine, self.n_neighbors, self.sum_d2 = engine, n_neighbors, sum_d2

    def reference_sigma(self):
        """SLK's σ: σ² = Σ (squared r-NN distances) / ((r + 1) N) (the authors divide by ρ = r + 1)."""
        return math.sqrt(self.sum_d2 / ((self.n_neighbors + 1) * self.engine.n_samples))

    def gather(self):
        """The whole graph on the driver: (ids, squared distances), (N, r) each, in row order."""
        return self.engine.reduce(_graph_rows, None, (Rows(), Rows()))


@contextlib.contextmanager
def neighbour_graph(engine, n_neighbors, *, normalize=False, method="exact"):
    """A block holding the kNN graph on the workers (states ``knn-x``: the rows in float64, and ``knn``);
    yields a ``NeighbourGraph``."""
    check_neighbours(n_neighbors, engine.n_samples, engine.n_features, method)
    with engine.state("knn-x", rows_float64, lambda: normalize), engine.state("knn", _graph_lost, build=False), \
            engine.halo("knn-all", _all_rows, engine.n_samples):
        (total,) = engine.reduce(search, int(n_neighbors), (Sum(),), halo=("knn-all", "knn-x"))
        yield NeighbourGraph(engine, int(n_neighbors), float(total))


def kneighbors_graph(X, n_neighbors=4, *, mode="connectivity", normalize=False, client=None):
    """The kNN graph of the rows of X as a scipy CSR matrix (N × N): row p holds its ``n_neighbors``
    nearest other rows (ties to the lower row id), with 1 (``mode="connectivity"``) or the Euclidean
    distance (``mode="distance"``), as scikit-learn's ``kneighbors_graph(..., include_self=False)``.
    ``normalize``: on the L2-normalised rows (SLK's graph). Exact search: N²·D work. ``client`` as
    ``dask_clust.fit``."""
    from scipy.sparse import csr_matrix

    if mode not in ("connectivity", "distance"):
        raise InputError(f"mode must be 'connectivity' or 'distance'; got {mode!r}")
    source = as_source(X)
    check_neighbours(n_neighbors, source.n_samples, source.n_features)
    with open_engine(source, client, 0) as engine, neighbour_graph(engine, n_neighbors, normalize=normalize) as g:
        ids, d2 = g.gather()
    n, r = ids.shape
    data = np.ones(n * r) if mode == "connectivity" else np.sqrt(d2).ravel()
    return csr_matrix((data, ids.ravel(), np.arange(0, n * r + 1, r)), shape=(n, n))
