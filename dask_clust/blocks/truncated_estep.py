"""The truncated E-step of a Gaussian mixture, per chunk (F. Hirschberger, D. Forster, J. Lücke, "A
Variational EM Acceleration for Efficient Clustering at Very Large Scales", IEEE TPAMI 44(12), 2022, Alg. 2,
Suppl. D-F): each row keeps K^(n), its C' likeliest clusters; step 4 searches S_n = ∪_{c ∈ K^(n)} G_c (+ random
others) for the new K^(n) and adds the rows' posterior statistics (Σ w s x, U, Q, F) over it; step 5's pair
statistics, summed exactly up the tree, give each cluster's neighbourhood G_c where they meet. The loop that
drives these steps, and the M-step, are ``truncated_em.py``'s.
"""

import math
from typing import NamedTuple

import numpy as np

from ..engine.combine import KeyedSum, Scatter, Sum
from ..kernels.assign import Prepared, is_csr, kernel_rows, nearest
from ..kernels.truncated import (
    draw_distinct,
    keep_truncated,
    pair_statistics,
    posterior_stats,
    search_spaces,
    select_neighbours,
    truncated_search,
)
from .gaussian import component_costs, component_scatter

# rows per search block: bounds a chunk's search-space and pair buffers to about 40 MB
BLOCK_ROWS = 1 << 16
# the search's metric when its cost is the squared distance
NO_METRIC = (np.empty((0, 0)), np.empty(0))
# the means' squared norms, which only CSR rows' costs read
NO_NORMS = np.empty(0)

# ---------------------------------------------------------------- per-chunk steps


class TruncatedInit(NamedTuple):
    """``init_truncated_sets``' parameters: C', C, the stream key of the random clusters, the means a row's
    first cluster is the nearest of (or None), and the working set's cells (or None)."""

    n_truncated: int
    n_clusters: int
    key: int
    means: np.ndarray | None
    cells: tuple | None


def init_truncated_sets(chunk, params: TruncatedInit):
    """State: K^(n) = C' distinct random clusters per row (the paper's init), or its first entry fixed: each
    row's seed from the working set's order (``cells``: rows sorted by nearest seed, so a row's cell follows
    from its position), or, for var-GMM-S's rows, the nearest of ``means`` (one assignment pass)."""
    n_truncated, n_clusters, key, means, cells = (
        params.n_truncated,
        params.n_clusters,
        params.key,
        params.means,
        params.cells,
    )
    n = chunk.n
    first = np.full(n, -1, np.int32)
    if cells is not None:
        starts, seeds = cells
        first = seeds[np.searchsorted(starts, np.arange(chunk.start, chunk.stop), side="right") - 1]
    elif means is not None:
        first = nearest(chunk.x, Prepared(means, chunk.x.dtype))[0]
    K = np.empty((n, n_truncated), np.int32)
    draw_distinct(first, chunk.start, n_clusters, key, K)
    chunk.state["vcgmm"] = {"K": K, "Kd2": np.empty((n, n_truncated)), "winner": np.full(n, -1, np.int32)}


def _buffers(scratch, rows, width):
    """Search-space and pair buffers for ``rows`` rows of ``width`` candidates, kept in the thread's
    ``scratch`` (``Chunk.scratch``) across searches (faulting them in each time costs): a thread searches
    one chunk at a time, so a worker holds threads × ~40 MB of them, not chunks × 40 MB (a copy per chunk
    ran a large input's workers out of memory), and only while the fit's partition lives."""
    m = rows * width
    have = getattr(scratch, "buffers", None)
    if have is None or len(have[0][0]) < rows + 1 or len(have[0][1]) < m:
        r, c = max(rows + 1, len(have[0][0]) if have else 0), max(m, len(have[0][1]) if have else 0)
        have = (
            (np.empty(r, np.int64), np.empty(c, np.int32), np.empty(c)),
            (np.empty(c, np.int64), np.empty(c, np.int32), np.empty(c, np.int64)),
        )
        scratch.buffers = have
    space, pairs = have
    return (space[0][: rows + 1], space[1][:m], space[2][:m]), tuple(p[:m] for p in pairs)


def buffer_bytes(rows, width):
    """What ``_buffers(scratch, rows, width)`` holds: an int64 offset per row, and per candidate an int32 and
    a float64 (the search space), an int64, an int32 and an int64 (the pairs)."""
    return 8 * (rows + 1) + (4 + 8 + 8 + 4 + 8) * rows * width


def _posteriors(x, w, K, Kd2, inv, mu, stats, offset=NO_METRIC[1]):
    """Adds a block's posterior statistics to stats = [Σ w s x, U, Q, F's data part]; ``inv``: 1/2σ² when the
    costs are squared distances, 1 when they are −ℓ (``offset``: their offsets, empty for squared distances);
    ``mu``: the means Q is taken about, or empty (Q: Σ w s cost, unread). Q of shape (C, D) is per dimension;
    (C, D, D) the scatter Σ w s (x − μ_c)(x − μ_c)ᵀ, and then stats[4] = Σ w s r⁴ with r² the row's squared
    Mahalanobis distance to μ_c (``Full.misfit``: the kurtosis)."""
    # K^(n) is sorted, so column 0 is the max-shift; numpy's SIMD exp is 8x numba's scalar one
    e = Kd2[:, :1] - Kd2
    e *= inv
    np.exp(e, out=e)
    if stats[2].ndim < 3:
        stats[3] += posterior_stats(x, w, K, Kd2, e, inv, mu, *stats[:3])
        return
    stats[3] += posterior_stats(x, w, K, Kd2, e, inv, NO_METRIC[0], stats[0], stats[1], np.zeros((len(mu), 1)))
    with np.errstate(invalid="ignore"):  # a row of weight 0 may have every cost +∞: it adds nothing
        ws = np.where(w[:, None] > 0, w[:, None] * (e / e.sum(axis=1, keepdims=True)), 0.0)
    rows = np.repeat(np.arange(len(K)), K.shape[1])
    component_scatter(x, rows, K.ravel(), ws.ravel(), mu, stats[2])
    r2 = 2 * inv * (Kd2 - offset[K]) if len(offset) else 2 * inv * Kd2
    with np.errstate(invalid="ignore"):
        r4 = np.where(ws > 0, ws * r2 * r2, 0.0)
    stats[4] += np.bincount(K.ravel(), r4.ravel(), minlength=len(mu))


def _row_blocks(n):
    """Slices of at most BLOCK_ROWS rows covering 0..n."""
    rows = max(1, min(n, BLOCK_ROWS))
    return [slice(b0, min(n, b0 + rows)) for b0 in range(0, n, rows)]


def _new_stats(n_clusters, n_features, moments):
    q = np.zeros(((n_clusters, 1), (n_clusters, n_features), (n_clusters, n_features, n_features))[moments])
    fourth = [np.zeros(n_clusters)] if moments == 2 else []
    return [np.zeros((n_clusters, n_features)), np.zeros(n_clusters), q, 0.0, *fourth]


def stats_combine(moments):
    """How the posterior statistics of ``_new_stats`` combine: exact sums, each per-cluster one
    reduce-scattered to where its clusters live (Σ w s x, U, Q; Σ w s r⁴ for the per-component matrices,
    ``moments`` 2), the data term of F whole."""
    return (Scatter(), Scatter(), Scatter(), Sum()) + ((Scatter(),) if moments == 2 else ())


def estep_combine(n_clusters):
    """How the search's fields combine: its evaluations, Σ w min cost and changed winners summed whole; the
    pair statistics (each (c_o, c~) once per partition up the tree) reduce-scattered by winner c_o, to be
    turned into G_c where those clusters live (exact sums: any tree of partitions gives the same bits)."""
    return (Sum(), Sum(), Sum(), Scatter(KeyedSum(rows=n_clusters)))


def _block(x, b):
    """Rows b of a chunk as the kernels read them (``kernel_rows``: CSR rows with their squared norms)."""
    return kernel_rows(x[b])


def _search(x, w, row0, mu, h, offset, K, Kd2, winner, Gc, key, extra_random, mark, space, mnorm=NO_NORMS):
    """Step 4's search of a block (``truncated_search``) under any metric: none (squared distances), diagonal
    (h (C, D)), or a covariance matrix's Cholesky factors (h = L (C, D, D)): one shared (1, D, D) maps the
    rows and means by L, where −ℓ is a diagonal metric's cost of ½ per dimension; one per component has its
    costs computed apart, grouped by component (``component_costs``)."""
    if h.ndim < 3:
        return truncated_search(x, w, row0, mu, mnorm, h, offset, K, Kd2, winner, Gc, key, extra_random, mark, *space)
    if len(h) == 1:  # about the means' centre, so the mapped rows keep their digits
        centre = mu.mean(axis=0)
        xl, mul = (x - centre) @ h[0].T, (mu - centre) @ h[0].T
        half = np.full(mu.shape, 0.5)
        return truncated_search(
            xl, w, row0, mul, NO_NORMS, half, offset, K, Kd2, winner, Gc, key, extra_random, mark, *space
        )
    pos, ids, costs = space
    m = search_spaces(row0, len(mu), K, Gc, key, extra_random, mark, pos, ids)
    rows = np.repeat(np.arange(len(K)), np.diff(pos[: len(K) + 1]))  # the buffer holds the longest block's
    component_costs(x, rows, ids[:m], mu, h, offset, costs[:m])
    return (m, *keep_truncated(w, K, Kd2, winner, pos, ids, costs))


class SearchParams(NamedTuple):
    """What step 4's search (``truncated_estep``) reads: the means (or a ``ShardRef`` to them), G_c, the fit's key for
    the per-row random streams, how many random clusters fill S_n, the posteriors' scale (``_posteriors``;
    None before σ² is known: no posteriors), the pair statistics' grid (``pair_grid``), the costs' metric
    (h = 1/2σ², or the precisions' Cholesky factors L, ``_search``) and offset (each an array or a ShardRef;
    empty: squared distances), what the M-step's Q holds (``Family.moments``), and what a sharded M-step
    reads (``MStep``)."""

    mu: object
    Gc: np.ndarray
    key: int
    extra_random: int
    inv: float | None
    grid: tuple
    h: object = NO_METRIC[0]
    offset: object = NO_METRIC[1]
    moments: int = 0
    m_step: object = None


def truncated_estep(chunk, params: SearchParams):
    """Step 4's search, step 5's statistics and (when σ² is known) the posteriors' statistics on one chunk,
    in blocks of rows (the search spaces of one block are buffered). Updates K^(n) in place; returns
    (evaluations, Σ w min d², changed winners, the blocks' pair statistics keyed by c_o·C + c~, then the
    posterior statistics when σ² is known), combined by ``estep_combine`` (+ ``stats_combine``)."""
    mu, Gc, key, extra_random, inv = params.mu, params.Gc, params.key, params.extra_random, params.inv
    grid, h, offset, moments = params.grid, params.h, params.offset, params.moments
    st = chunk.state["vcgmm"]
    K, Kd2, winner = st["K"], st["Kd2"], st["winner"]
    n, n_clusters = K.shape[0], mu.shape[0]
    space, pairs = _buffers(chunk.scratch, min(n, BLOCK_ROWS), K.shape[1] * Gc.shape[1] + 1)
    stats = None if inv is None else _new_stats(n_clusters, mu.shape[1], moments)
    mark = np.full(n_clusters, -1, np.int64)
    mnorm = np.einsum("ij,ij->i", mu, mu) if is_csr(chunk.x) else NO_NORMS
    evals, minsum, changed, blocks = 0, 0.0, 0, []
    for b in _row_blocks(n):
        x = _block(chunk.x, b)
        e, s, ch = _search(
            x, chunk.w[b], chunk.start + b.start, mu, h, offset, K[b], Kd2[b], winner[b], Gc, key, extra_random,
            mark, space, mnorm,
        )  # fmt: skip
        k = pair_statistics(winner[b], *space, n_clusters, *grid, *pairs)
        blocks.append(tuple(p[:k].copy() for p in pairs))
        if stats is not None:
            _posteriors(x, chunk.w[b], K[b], Kd2[b], inv, mu if moments else NO_METRIC[0], stats, offset)
        evals, minsum, changed = evals + e, minsum + s, changed + ch
    found = (
        np.int64(evals),
        minsum,
        np.int64(changed),
        blocks[0] if len(blocks) == 1 else tuple(np.concatenate(f) for f in zip(*blocks)),
    )
    return found if stats is None else found + tuple(stats)


class Found(NamedTuple):
    """A search before σ² is known as the driver receives it: evaluations, Σ w least cost, rows whose winner
    changed, the new G_c."""

    evals: int
    least_cost: float
    changed: int
    neighbourhoods: np.ndarray


def posterior_step(chunk, params):
    """The posteriors' statistics of the first search (σ² was not known when it ran: its costs are squared
    distances), block by block; ``mu``: the means it searched, for Q about them, or None."""
    inv, n_clusters, mu, moments = params.inv, params.n_clusters, params.mu, params.moments
    st = chunk.state["vcgmm"]
    stats = _new_stats(n_clusters, chunk.x.shape[1], moments)
    mu = NO_METRIC[0] if mu is None else mu
    for b in _row_blocks(st["K"].shape[0]):
        _posteriors(_block(chunk.x, b), chunk.w[b], st["K"][b], st["Kd2"][b], inv, mu, stats)
    return tuple(stats)


def scatter_step(chunk, mean):
    """Σ w (x − mean)(x − mean)ᵀ (D, D) of a chunk's rows, in blocks of rows: the rows' scatter the tied
    covariance is taken from (``Tied``)."""
    S = np.zeros((len(mean), len(mean)))
    for b in _row_blocks(chunk.n):
        v = chunk.x[b].astype(np.float64) - mean
        S += (v * chunk.w[b, None]).T @ v
    return (S,)


def init_neighbourhoods(n_clusters, G, key):
    """G_c = {c} + G−1 distinct random other clusters (c in slot 0)."""
    Gc = np.empty((n_clusters, G), np.int32)
    draw_distinct(np.arange(n_clusters, dtype=np.int32), 0, n_clusters, key, Gc)
    return Gc


def row_fields(n_clusters, n_truncated, signed=False):
    """The per-row state a checkpoint holds, as ``restored_rows`` checks it: K^(n) (cluster indices), their
    costs (squared distances; −ℓ, of either sign, when ``signed``) and the last winner (-1 before the first
    search)."""
    return {
        "K": ("int32", (n_truncated,), 0, n_clusters),
        "Kd2": ("float64", (n_truncated,), -math.inf if signed else 0.0, math.inf),
        "winner": ("int32", (), -1, n_clusters),
    }


def pair_grid(engine, metric_range=None):
    """(1/unit, low, cap) of the pair statistics (``pair_statistics``): each cost enters as min(cost − low, cap)
    and is summed as an integer count of the unit, a power of two such that a pair's sum over all rows is
    < 2^62. A squared distance is at most D·(2 max|x| + 1)² (the means stay in the rows' bounding box): low 0,
    no cap. The cost −ℓ, with ``metric_range`` = (max h, least and largest finite offset), lies in [least,
    largest + max h·D·(2 max|x| + 1)²]; a cluster of weight 0 (offset +∞) is capped at that bound."""
    s = engine.summary
    spread = (2.0 * float(s.max_abs) + 1.0) ** 2
    if metric_range is None:
        low, cap = 0.0, math.inf
        bound = engine.n_samples * engine.n_features * spread
    else:
        h_max, low, high = (float(v) for v in metric_range)
        cap = (high - low) + h_max * engine.n_features * spread
        bound = engine.n_samples * cap
    return math.ldexp(1.0, 62 - math.ceil(math.log2(max(1.0, bound)))), low, cap


def update_neighbourhoods(keys, count, dsum, Gc, lo=0, n_clusters=None):
    """Step 5 from the summed pair statistics, sorted by key c_o·C + c~ (so grouped by winner), for the
    clusters lo .. lo + len(Gc): all C of them, or one shard (then ``n_clusters`` = C)."""
    C = n_clusters or Gc.shape[0]
    start = np.searchsorted(keys, (lo + np.arange(Gc.shape[0] + 1, dtype=np.int64)) * C)
    select_neighbours(start[None, :], keys, lo, count, dsum, Gc, C)
