"""The k-nearest-neighbour graph of the rows: r out-neighbours per row (the row itself excluded), sorted by
(distance, input row id), so the graph does not depend on the chunking, the workers or the row order.

``method="exact"``: every chunk reads all rows once through a halo (partition to partition, never through
the driver) and searches them by blocked GEMM, the candidates within the GEMM's error bound of the r-th
re-measured directly in float64. N²·D multiply-adds and N·D bytes per partition: the choice while N²·D
stays within ``dask_clust.knn-exact-budget``.

``method="ivf"`` (Jégou, Douze & Schmid, "Product quantization for nearest neighbor search", TPAMI 2011,
its inverted file without the quantisation): a coarse k-means of ``nlist`` cells
(≈ 4√N) trained on a lightweight coreset, the rows reordered by cell (``engine.reorder``: a cell's rows
are contiguous, most neighbours sit in the same partition), and each cell's rows searched exactly among
the rows of the cells its rows probe: every row's ``nprobe`` nearest cells (standard IVF probing) and the
``nprobe`` cells nearest the cell's centroid, as one candidate set per cell (one GEMM per cell; a row
searches a superset of its own probes, so recall is at least standard IVF's). With nprobe = nlist it is
the exact graph. recall@r is measured on 1000 random rows against
brute force. ``"auto"``: exact within the budget, IVF beyond.

Used by SLK (Ziko, Granger & Ben Ayed, NeurIPS 2018), whose kernel width comes from the graph:
``reference_sigma`` is the authors' σ² = Σ (squared r-NN distances) / ((r + 1) N).

What the driver receives: the exact sum of the squared neighbour distances (one number); for IVF the
coreset (32·nlist rows), the per-chunk counts of each cell (≤ chunks × nlist ints, ``reorder``), the
distinct (cell, probed cell) pairs (≤ nlist × a few nprobe) and the 1000 query rows with their neighbours;
the whole graph (N·r) only when asked (``kneighbors_graph``).
It holds nlist centroids and nlist × nprobe probe lists.
"""

import contextlib
import math
from typing import NamedTuple

import numpy as np

from .._random import stream
from ..engine import Halo, as_source, config, open_engine
from ..engine.combine import KeyedSum, Rows, RowTop
from ..engine.data import l2_rows
from ..errors import InputError
from ..kernels.assign import Prepared, nearest
from ..kernels.distance import nearest_centres, nearest_neighbours
from .coreset import lightweight_coreset
from .lloyd import lloyd
from .seeding import seed

# the per-chunk state a graph's engine keeps, which the algorithms on the graph read too (SLK)
ROWS = "knn-x"  # the rows in float64 (unit length when normalised): searched, and what modes are made of
GRAPH = "knn"  # (neighbour ids, their squared distances, their input ids), r per row
INPUT_IDS = "knn-in"  # each row's input id, on an engine whose rows were moved (its cells, SLK's seeds)

METHODS = ("auto", "exact", "ivf")
# query rows per GEMM block: keeps the block's distances near 128 MB whatever N is
BLOCK_VALUES = 1 << 24
# the coarse quantiser: coreset rows per cell and Lloyd iterations (faiss trains on ≥ 39 rows per cell,
# 10–25 iterations; the cells only steer the search, recall is measured)
_TRAIN_ROWS_PER_CELL, _TRAIN_ITER = 32, 10
RECALL_QUERIES = 1000


def rows_float64(chunk, normalize):
    """State ``knn-x``: the chunk's rows in float64, L2-normalised when asked (SLK's input)."""
    chunk.state[ROWS] = l2_rows(chunk.x) if normalize else np.asarray(chunk.x, dtype=np.float64)


def keep_input_ids(chunk, params):
    chunk.state[INPUT_IDS] = chunk.input_ids()


def gemm_sqdist(Q, Y, qq, yy):
    """Squared distances ||q||² − 2 q·y + ||y||² of every pair (GEMM form; rounding up to ``slack``'s
    bound, negative values possible); qq, yy: the rows' squared norms."""
    G = Q @ Y.T
    G *= -2.0  # in place: one (n, m) array, not four temporaries
    G += qq[:, None]
    G += yy[None, :]
    return G


def squared_norms(X):
    return np.einsum("ij,ij->i", X, X)


def nearest_among(Q, q_ids, Y, y_ids, r):
    """The r nearest rows of Y (by id, the query's own id skipped) of every row of Q: (rows of Y, exact
    squared distances), (n, r) each, ties to the lower id."""
    n, m = Q.shape[0], Y.shape[0]
    out_j, d2 = np.empty((n, r), np.int64), np.empty((n, r))
    qq, yy = squared_norms(Q), squared_norms(Y)
    # |GEMM form − exact| <= (2D + 8)·u·(|q| + |y|)² (Higham's dot-product bound, with room for the norms)
    slack = (2 * Q.shape[1] + 8) * 2.0**-53 * (math.sqrt(qq.max(initial=0)) + math.sqrt(yy.max(initial=0))) ** 2
    step = max(1, BLOCK_VALUES // max(1, m))
    for a in range(0, n, step):
        b = min(n, a + step)
        approx = gemm_sqdist(Q[a:b], Y, qq[a:b], yy)
        nearest_neighbours(Q[a:b], q_ids[a:b], Y, y_ids, approx, slack, out_j[a:b], d2[a:b])
    return out_j, d2


def unsearched(chunk):
    """Whether the chunk's rows have no neighbours yet (before the search, or rebuilt after a lost worker)."""
    return chunk.state.get(GRAPH) is None


def _unsearched_state(chunk, params):
    """State ``knn`` of a partition rebuilt after a lost worker: none, until ``NeighbourGraph.complete``."""


class Keyed(NamedTuple):
    """One ``KeyedSum`` field: (keys, their sums)."""

    pairs: tuple


class Picked(NamedTuple):
    """The recall's query rows, their input ids and the neighbours the graph holds for them."""

    rows: np.ndarray
    input_ids: np.ndarray
    found: np.ndarray


class Nearest(NamedTuple):
    """One ``RowTop`` field: per query (d², input ids) of its r nearest."""

    top: tuple


def _sum_d2(chunk, params) -> Keyed:
    """The exact Σ d2 (a KeyedSum on one key: the same bits for any layout)."""
    d2 = chunk.state[GRAPH][1]
    return Keyed((np.zeros(d2.size, np.int64), d2.ravel()))


# ---------------------------------------------------------------- exact


def _all_rows(chunk, n):
    return np.arange(n if unsearched(chunk) else 0, dtype=np.int64)


def search_exact(chunk, r):
    """State ``knn`` = (neighbours as rows, squared distances, neighbours' input ids): every row's r
    nearest among all rows (``halo[ROWS]``; this engine is in input order, so a row's id is its input id)."""
    if unsearched(chunk):
        Y = chunk.halo[ROWS]
        all_ids = np.arange(Y.shape[0], dtype=np.int64)
        ids, d2 = nearest_among(chunk.state[ROWS], all_ids[chunk.start : chunk.stop], Y, all_ids, r)
        chunk.state[GRAPH] = ids, d2, ids
    return ()


# ---------------------------------------------------------------- IVF


def coarse_cells(engine, nlist, entropy, normalize):
    """nlist centroids: Lloyd (random rows as seeds, as faiss) on a lightweight coreset of 32 rows per cell,
    numbered in ``locality_order``."""
    X, w = lightweight_coreset(engine, min(engine.n_samples, _TRAIN_ROWS_PER_CELL * nlist), entropy)
    X = l2_rows(X) if normalize else X
    with engine.working_set(X, w, entropy) as train:
        seeds, _ = seed(train, nlist, "random", entropy)
        centroids = lloyd(train, seeds, max_iter=_TRAIN_ITER, tol=0.0).centers
    return centroids[locality_order(centroids)]


def locality_order(C):
    """The cells in recursive-bisection order (each group split at the median of its principal direction),
    so cells near in number are near in space: sorted by cell, a partition holds a compact region and most
    neighbours of its rows (cell ids in k-means' order put about half of the other-cell edges across
    partitions, and the halo carries them every bound update)."""

    def split(idx):
        if len(idx) <= 2:
            return idx
        X = C[idx] - C[idx].mean(0)
        direction = np.linalg.svd(X, full_matrices=False)[2][0]
        ranked = idx[np.argsort(X @ direction, kind="stable")]
        half = len(ranked) // 2
        return np.concatenate([split(ranked[:half]), split(ranked[half:])])

    return split(np.arange(len(C)))


class Centres(NamedTuple):
    """``nearest_centre``'s parameters: the centres (float64), and whether the rows are L2-normalised first."""

    centres: np.ndarray
    normalize: bool


def nearest_centre(chunk, params: Centres):
    """The nearest of ``centres`` of each of the chunk's rows, L2-normalised when asked (a ``reorder`` key:
    IVF's cells, SLK's nearest-seed clusters)."""
    x = l2_rows(chunk.x) if params.normalize else chunk.x
    return nearest(x, Prepared(params.centres, x.dtype))[0]


class Probes(NamedTuple):
    """``_probe_pairs``' parameters: the non-empty cells' centroids and numbers, the cells' row starts, nprobe."""

    live_centroids: np.ndarray
    live: np.ndarray
    starts: np.ndarray
    nprobe: int


def _probe_pairs(chunk, params: Probes) -> Keyed:
    """(cell, probed cell) pairs of the chunk's rows: each row's nprobe nearest non-empty cells (exact; its
    own cell first), as KeyedSum keys cell · nlist + probed cell."""
    live_centroids, live, starts, nprobe = params.live_centroids, params.live, params.starts, params.nprobe
    nlist = len(starts) - 1
    probes = np.empty((chunk.stop - chunk.start, min(nprobe, len(live))), np.int64)
    nearest_centres(chunk.state[ROWS], live_centroids, probes)
    cell = np.searchsorted(starts, np.arange(chunk.start, chunk.stop), side="right") - 1
    keys = np.unique(cell[:, None] * nlist + live[probes])
    return Keyed((keys, np.ones(len(keys), np.int64)))


def probe_lists(engine, centroids, starts, nprobe, r):
    """Per cell, the cells its rows search: the union of its rows' nprobe nearest non-empty cells (the
    probes of standard IVF, found on the workers) and the nprobe cells nearest its centroid, more of those
    while they hold fewer than r + 1 rows (so every row has r others to find). CSR (ptr (nlist + 1,), cells),
    the same for any layout."""
    nlist = len(centroids)
    sizes = np.diff(starts)
    live = np.flatnonzero(sizes)
    pairs, _ = engine.reduce(_probe_pairs, Probes(centroids[live], live, starts, int(nprobe)), (KeyedSum(),)).pairs
    by_rows = np.split(pairs % nlist, np.searchsorted(pairs // nlist, np.arange(1, nlist)))
    C = centroids[live]
    cc = squared_norms(C)
    lists = [np.empty(0, np.int64)] * nlist
    step = max(1, (1 << 22) // max(1, len(live)))
    for a in range(0, len(live), step):
        d = gemm_sqdist(C[a : a + step], C, cc[a : a + step], cc)
        d[np.arange(d.shape[0]), np.arange(a, a + d.shape[0])] = -np.inf  # a cell probes itself first
        for t, order in enumerate(np.argsort(d, axis=1, kind="stable")):
            c = live[a + t]
            near = live[order]
            held = np.cumsum(sizes[near])
            m = max(min(nprobe, len(live)), int(np.searchsorted(held, r + 1)) + 1)
            lists[c] = np.union1d(near[:m], by_rows[c])
    ptr = np.zeros(nlist + 1, np.int64)
    ptr[1:] = np.cumsum([len(p) for p in lists])
    return ptr, np.concatenate(lists)


def groups_in(chunk, starts):
    """The non-empty groups (cells, clusters) with rows in the chunk, on an engine sorted by group: group g
    holds rows starts[g]..starts[g + 1]."""
    groups = np.arange(
        np.searchsorted(starts, chunk.start, side="right") - 1, np.searchsorted(starts, chunk.stop, side="left")
    )
    return groups[starts[groups + 1] > starts[groups]]


def rows_of(starts, groups):
    """All rows of the groups, group by group."""
    return np.concatenate([np.arange(starts[g], starts[g + 1]) for g in groups])


def _probed(chunk, starts, ptr, cells):
    """The chunk's cells, the cells they probe (ascending) and where each probed cell's rows start among
    the rows the chunk reads."""
    mine = groups_in(chunk, starts)
    need = np.unique(np.concatenate([cells[ptr[c] : ptr[c + 1]] for c in mine]))
    sizes = starts[need + 1] - starts[need]
    return mine, need, np.concatenate([[0], np.cumsum(sizes)])


class Plan(NamedTuple):
    """IVF's plan: each cell's first row (in cell order), and its probe lists as CSR (ptr, cells)."""

    starts: np.ndarray
    ptr: np.ndarray
    cells: np.ndarray


def _probed_rows(chunk, params: Plan):
    """The halo plan: the rows of every cell the chunk's cells probe, cell by cell."""
    if not unsearched(chunk):
        return np.empty(0, np.int64)
    return rows_of(params.starts, _probed(chunk, params.starts, params.ptr, params.cells)[1])


def keep_halo_ids(chunk, key):
    """State ``key``: the input ids of the rows this chunk reads (``halo[INPUT_IDS]``), for a later step that
    reads their rows through the same plan."""
    chunk.state[key] = chunk.halo[INPUT_IDS]
    return ()


class Search(NamedTuple):
    """``search_ivf``'s parameters: the neighbours wanted, and IVF's plan."""

    r: int
    plan: Plan


def search_ivf(chunk, params: Search):
    """State ``knn`` (as ``search_exact``'s, neighbours as rows of the engine in cell order): each of the
    chunk's cells' rows' r nearest among the rows of the cells it probes."""
    H_in = chunk.state.pop("knn-cand-in")
    if not unsearched(chunk):
        return ()
    r, starts, ptr, cells = params.r, params.plan.starts, params.plan.ptr, params.plan.cells
    H, read_at = chunk.halo[ROWS]
    own = chunk.state[ROWS]
    q_in = chunk.input_ids()
    mine, need, offsets = _probed(chunk, starts, ptr, cells)
    rows = rows_of(starts, need)
    n = own.shape[0]
    ids, d2, in_ids = np.empty((n, r), np.int64), np.empty((n, r)), np.empty((n, r), np.int64)
    for c in mine:
        lo, hi = max(starts[c], chunk.start) - chunk.start, min(starts[c + 1], chunk.stop) - chunk.start
        at = np.searchsorted(need, cells[ptr[c] : ptr[c + 1]])
        sel = np.concatenate([np.arange(offsets[t], offsets[t + 1]) for t in at])
        j, d2[lo:hi] = nearest_among(own[lo:hi], q_in[lo:hi], H[read_at[sel]], H_in[sel], r)
        ids[lo:hi], in_ids[lo:hi] = rows[sel][j], H_in[sel][j]
    chunk.state[GRAPH] = ids, d2, in_ids
    return ()


# ---------------------------------------------------------------- recall


def _queries(chunk, picks) -> Picked:
    lo, hi = np.searchsorted(picks, [chunk.start, chunk.stop])
    at = picks[lo:hi] - chunk.start
    return Picked(chunk.state[ROWS][at], chunk.input_ids()[at], chunk.state[GRAPH][2][at])


class Queries(NamedTuple):
    """``_brute``'s parameters: the query rows, their input ids, and the neighbours wanted."""

    rows: np.ndarray
    input_ids: np.ndarray
    r: int


def _brute(chunk, params: Queries) -> Nearest:
    Q, q_in, r = params.rows, params.input_ids, params.r
    j, d2 = nearest_among(Q, q_in, chunk.state[ROWS], chunk.input_ids(), r)
    return Nearest((d2, np.where(j >= 0, chunk.input_ids()[np.maximum(j, 0)], np.iinfo(np.int64).max)))


def measure_recall(engine, r, entropy, n_queries=RECALL_QUERIES):
    """recall@r of the graph on ``n_queries`` random rows: the share of their true r nearest (brute force
    over all rows, on the workers) that the graph holds."""
    n = engine.n_samples
    picks = np.sort(stream(entropy, GRAPH, "recall").choice(n, min(n, n_queries), replace=False))
    picked = engine.reduce(_queries, picks, (Rows(), Rows(), Rows()))
    _, truth = engine.reduce(_brute, Queries(picked.rows, picked.input_ids, r), (RowTop(r),)).top
    hits = sum(len(np.intersect1d(a, b)) for a, b in zip(picked.found, truth))
    return hits / truth.size


# ---------------------------------------------------------------- the block


def resolve_method(method, n_samples, n_features):
    if method != "auto":
        return method
    return "exact" if float(n_samples) ** 2 * n_features <= float(config.get("knn-exact-budget")) else "ivf"


def default_nlist(n_samples):
    return int(min(n_samples, max(1, round(4 * math.sqrt(n_samples)))))


def check_neighbours(n_neighbors, n_samples, n_features, method="exact", nlist=None, nprobe=16):
    if isinstance(n_neighbors, bool) or not isinstance(n_neighbors, (int, np.integer)) or n_neighbors < 1:
        raise InputError(f"n_neighbors must be an int >= 1; got {n_neighbors!r}")
    if n_neighbors >= n_samples:
        raise InputError(f"n_neighbors={n_neighbors} needs more than n_neighbors rows; got n_samples={n_samples}")
    if method not in METHODS:
        raise InputError(f"method must be one of {list(METHODS)}; got {method!r}")
    for name, v in (("nlist", nlist), ("nprobe", nprobe)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise InputError(f"{name} must be None or an int >= 1; got {v!r}")
    if nlist is not None and nlist > n_samples:
        raise InputError(f"nlist={nlist} cells need at least as many rows; got n_samples={n_samples}")
    work, budget = float(n_samples) ** 2 * n_features, float(config.get("knn-exact-budget"))
    if method == "exact" and work > budget:
        raise InputError(
            f"the exact kNN graph of {n_samples:,} rows x {n_features} features is {work:.3g} "
            f"multiply-adds, over dask_clust.knn-exact-budget = {budget:.3g}, and every partition would "
            "hold all rows: use method='ivf' (or 'auto'), or raise the budget"
        )


def _graph_rows(chunk, params):
    _, d2, in_ids = chunk.state[GRAPH]
    return chunk.input_ids(), in_ids, d2


class NeighbourGraph:
    """The graph's state ``knn`` on the workers of ``engine`` (the input engine for the exact method, the
    engine in cell order for IVF; per chunk: neighbours as rows of ``engine``, squared distances and the
    neighbours' input ids) for the ``with`` block of ``neighbour_graph``. ``sum_d2`` is exact; ``recall``
    is recall@r (1.0 for the exact method)."""

    def __init__(self, engine, n_neighbors, method, plan=None, nlist=None):
        self.engine, self.n_neighbors, self.method, self.nlist = engine, n_neighbors, method, nlist
        self._plan = plan  # IVF's Plan
        self.sum_d2, self.recall = None, 1.0

    def complete(self):
        """Search the chunks whose rows have no neighbours: every chunk at first; after a lost worker, the
        rebuilt partitions' (the same steps on the same rows: the same graph). Other chunks read no rows."""
        e, r = self.engine, self.n_neighbors
        if self.method == "exact":
            with e.halo("knn-all", _all_rows, e.n_samples):  # every row in every chunk: gone before the graph is used
                e.reduce(search_exact, r, halo=Halo("knn-all", ROWS))
            return
        with e.halo("knn-probed", _probed_rows, self._plan):  # its rows go before the graph is used
            e.reduce(keep_halo_ids, "knn-cand-in", halo=Halo("knn-probed", INPUT_IDS))
            e.reduce(search_ivf, Search(r, self._plan), halo=Halo("knn-probed", ROWS, indexed=True))

    def _measure(self, entropy):
        """The search, then Σ d2 and recall@r (a phase of ``rerun``: after a lost worker, the rebuilt
        partitions are searched again and both measured again)."""
        self.complete()
        _, total = self.engine.reduce(_sum_d2, None, (KeyedSum(),)).pairs
        self.sum_d2 = float(total.sum())
        if self.method == "ivf":
            self.recall = measure_recall(self.engine, self.n_neighbors, entropy)

    def reference_sigma(self):
        """SLK's σ: σ² = Σ (squared r-NN distances) / ((r + 1) N) (the authors divide by ρ = r + 1)."""
        return math.sqrt(self.sum_d2 / ((self.n_neighbors + 1) * self.engine.n_samples))

    def gather(self):
        """The whole graph on the driver in input order: (neighbours' input ids, squared distances), (N, r)."""
        rows, ids, d2 = self.engine.rerun(
            lambda restarted: self.engine.reduce(_graph_rows, None, (Rows(),) * 3), self.complete
        )
        out_ids, out_d2 = np.empty_like(ids), np.empty_like(d2)
        out_ids[rows], out_d2[rows] = ids, d2
        return out_ids, out_d2


@contextlib.contextmanager
def neighbour_graph(engine, n_neighbors, *, normalize=False, method="exact", nlist=None, nprobe=16, entropy=0):
    """A block holding the kNN graph on the workers (states ``knn-x``: the rows in float64, ``knn``, and for
    IVF ``knn-in``); yields a ``NeighbourGraph``. The exact method needs ``engine`` in input order. A worker
    lost while the block runs costs the search of its partitions' rows again (``NeighbourGraph.complete``,
    from ``Engine.rerun``): a search reads other partitions' rows, which no state builder can."""
    n, r = engine.n_samples, int(n_neighbors)
    check_neighbours(n_neighbors, n, engine.n_features, method, nlist, nprobe)
    method = resolve_method(method, n, engine.n_features)
    if method == "exact":
        with (
            engine.state(ROWS, rows_float64, lambda: normalize),
            engine.state(GRAPH, _unsearched_state, build=False),
        ):
            graph = NeighbourGraph(engine, r, method)
            engine.rerun(lambda restarted: graph._measure(entropy))
            yield graph
        return
    nlist = default_nlist(n) if nlist is None else int(nlist)
    centroids = coarse_cells(engine, nlist, entropy, normalize)
    with engine.reorder(nearest_centre, Centres(centroids, normalize)) as cells:
        keys, totals = cells.key_totals
        sizes = np.zeros(nlist, np.int64)
        sizes[keys] = totals
        starts = np.concatenate([[0], np.cumsum(sizes)])
        with (
            cells.state(ROWS, rows_float64, lambda: normalize),
            cells.state(INPUT_IDS, keep_input_ids),
            cells.state(GRAPH, _unsearched_state, build=False),
        ):
            graph = NeighbourGraph(
                cells, r, method, Plan(starts, *probe_lists(cells, centroids, starts, int(nprobe), r)), nlist
            )
            cells.rerun(lambda restarted: graph._measure(entropy))
            yield graph


def kneighbors_graph(
    X,
    n_neighbors=4,
    *,
    mode="connectivity",
    normalize=False,
    method="auto",
    nlist=None,
    nprobe=16,
    random_state=0,
    client=None,
):
    """The kNN graph of the rows of X as a scipy CSR matrix (N × N): row p holds its ``n_neighbors``
    nearest other rows (ties to the lower row id), with 1 (``mode="connectivity"``) or the Euclidean
    distance (``mode="distance"``), as scikit-learn's ``kneighbors_graph(..., include_self=False)``.
    ``normalize``: on the L2-normalised rows (SLK's graph). ``method``: "exact" (N²·D work), "ivf"
    (``nlist`` cells, default ≈ 4√N, each searched among its ``nprobe`` nearest cells; ``random_state``
    seeds its coarse k-means) or "auto" (exact within ``dask_clust.knn-exact-budget``). ``client`` as
    ``dask_clust.fit``. The matrix comes to this process: N·r entries."""
    from scipy.sparse import csr_matrix

    if mode not in ("connectivity", "distance"):
        raise InputError(f"mode must be 'connectivity' or 'distance'; got {mode!r}")
    source = as_source(X)
    check_neighbours(n_neighbors, source.n_samples, source.n_features, method, nlist, nprobe)
    with (
        open_engine(source, client, int(random_state)) as engine,
        neighbour_graph(
            engine,
            n_neighbors,
            normalize=normalize,
            method=method,
            nlist=nlist,
            nprobe=nprobe,
            entropy=int(random_state),
        ) as g,
    ):
        ids, d2 = g.gather()
    n, r = ids.shape
    data = np.ones(n * r) if mode == "connectivity" else np.sqrt(d2).ravel()
    return csr_matrix((data, ids.ravel(), np.arange(0, n * r + 1, r)), shape=(n, n))
