"""Scalable Laplacian K-modes, SLK-BO and SLK-MS: the steps and loops of ``algo="slk"`` on the engine.

I. M. Ziko, E. Granger, I. Ben Ayed, "Scalable Laplacian K-modes", NeurIPS 2018 (arXiv:1810.13044).

  1. normalise the rows; the kNN graph W (r out-edges, ``knn``) and σ from it
  2. first modes: BO, per cluster of the nearest-seed partition the member of highest in-cluster kernel
     density; MS, mean-shift over those members from each seed
  repeat (outer, at least ``min_iter``, at most ``max_iter``, until the energy changes <= tol relative)
  3. a = k(x, modes); z = softmax(a)
  4. bound updates: z <- softmax(a + λ W z), every row from the previous z (Jacobi: one halo exchange of
     z per update), until the relaxed energy Σ z log z − a·z − λ (W z)·z changes <= inner_tol relative
  5. hard labels; the modes: BO, argmax_p z_pl per cluster (ties to the lowest row id); MS, mean-shift
     over the cluster's members from its mode
  6. the energy −a·z − λ (W z)·z, with BO's new a and MS's previous a (the authors' order)
  A cluster left without rows: the previous outer iteration's state, flagged ``lost``.

The energy of a z is known one update late (it needs W z, which the next update's halo brings), so the
inner loop runs one update past the authors' count and keeps the previous z (its own rows stay readable
in the halo): the counts are theirs. Ties (BO's argmax) and W z's sum order go by input row id, so a
reordered engine (IVF's cell order) or shuffled input gives the same labels.

Per update the driver receives one number (the energy); per outer iteration K cluster sizes and, for BO,
K argmax values, input ids and rows (K·D), for MS K·D mean-shift sums per mean-shift step; BO's first
modes need one reorder of the rows by nearest seed (rows move worker to worker). It holds the K·D modes.
Rows, a and z stay on the workers (per row: z, a unless recomputed, the halo's copy of z: 2–3 K floats);
z of cross-partition neighbours goes partition to partition. the labels come to the driver once (N ints).

A lost worker: its partitions are rebuilt elsewhere (rows and the rows' own state), their graph searched
again, and the current phase restarts (``Engine.rerun``): an outer iteration from its modes, z =
softmax(a(modes)), so the fit ends with the undisturbed model's bits. The labels of a lost cluster's run
(the previous iteration's) come from that iteration's inner loop run again.
"""

import contextlib
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..engine import Halo
from ..engine.combine import ArgMax, Rows, Sum
from ..errors import InputError
from ..kernels.assign import Prepared, nearest
from ..kernels.slk import affinities, bound_update
from .knn import (
    BLOCK_VALUES,
    GRAPH,
    INPUT_IDS,
    ROWS,
    Centres,
    gemm_sqdist,
    groups_in,
    keep_halo_ids,
    keep_input_ids,
    nearest_centre,
    neighbour_graph,
    rows_float64,
    rows_of,
    squared_norms,
    unsearched,
)


@dataclass
class SLKResult:
    labels: np.ndarray  # per row, in the engine's row order
    modes: np.ndarray  # (K, D) on the normalised rows
    mode_ids: np.ndarray  # BO: the modes' row ids; MS: None
    sigma: float
    outer: int
    inner: list = field(default_factory=list)
    lost: bool = False
    recall: float = 1.0  # the graph's recall@r
    method: str = "exact"  # the graph's method


def softmax(v):
    e = np.exp(v - v.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


# a is recomputed in every bound update up to this many features: D multiply-adds and an exp per entry,
# about the update's own work there, for a third less memory (1M x 16 rows, K = 200: 0.75 GiB per worker)
_RECOMPUTE_MAX_FEATURES = 32


# ---------------------------------------------------------------- per-chunk steps


def _neighbour_lists(chunk, params):
    """State ``slk-nb``: the rows the chunk reads (its own and its neighbours, ascending), each row's
    neighbours as indices into them ordered by input id (W z summed in that order under any layout), and
    its own rows' indices (the previous z of its own rows stays readable in the halo). Made where it is
    missing and the graph is not (after a lost worker: once the rebuilt partitions are searched again)."""
    if "slk-nb" in chunk.state or unsearched(chunk):
        return ()
    ids, _, in_ids = chunk.state[GRAPH]
    by_input = np.take_along_axis(ids, np.argsort(in_ids, axis=1, kind="stable"), 1)
    own = np.arange(chunk.start, chunk.stop, dtype=np.int64)
    reads = np.union1d(own, by_input.ravel())
    chunk.state["slk-nb"] = reads, np.searchsorted(reads, by_input), np.searchsorted(reads, own)
    return ()


def _reads(chunk, params):
    """The halo plan; none yet on a partition rebuilt after a lost worker (its plan is made again when its
    lists are)."""
    return chunk.state["slk-nb"][0] if "slk-nb" in chunk.state else np.empty(0, np.int64)


class Sizes(NamedTuple):
    """Rows per cluster."""

    sizes: np.ndarray


class ShiftSums(NamedTuple):
    """A mean-shift step's Σ g x and Σ g per cluster."""

    sums: np.ndarray
    weights: np.ndarray


class Energy(NamedTuple):
    """A chunk's term of an energy (the relaxed energy of a bound update, or −Σ a·z)."""

    energy: float


class Labels(NamedTuple):
    """The rows' labels."""

    labels: np.ndarray


def _first_labels(chunk, seeds) -> Sizes:
    chunk.state["slk-labels"] = nearest(chunk.state[ROWS], Prepared(seeds, np.float64))[0].astype(np.int64)
    return Sizes(np.bincount(chunk.state["slk-labels"], minlength=len(seeds)))


def _members(chunk, starts):
    """The halo plan: all rows of every cluster the chunk's rows belong to (rows sorted by cluster)."""
    return rows_of(starts, groups_in(chunk, starts))


class Clusters(NamedTuple):
    """``_densest_members``' parameters: the kernel's σ and the clusters' first rows (rows sorted by cluster)."""

    sigma: float
    starts: np.ndarray


def _densest_members(chunk, params: Clusters):
    """BO's first modes: each row's in-cluster kernel density Σ_q k(x, x_q) over its cluster's members
    (summed in input-id order), the densest row per cluster (ties to the lowest input id), with its row."""
    sigma, starts = params.sigma, params.starts
    x, everyone, member_in = chunk.state[ROWS], chunk.halo[ROWS], chunk.state.pop("slk-member-in")
    in_ids = chunk.input_ids()
    k = len(starts) - 1
    best, ids, rows = np.full(k, -np.inf), np.zeros(k, np.int64), np.zeros((k, x.shape[1]))
    at = 0
    for l in groups_in(chunk, starts):
        size = starts[l + 1] - starts[l]
        order = at + np.argsort(member_in[at : at + size], kind="stable")
        members, at = everyone[order], at + size
        lo, hi = max(starts[l], chunk.start) - chunk.start, min(starts[l + 1], chunk.stop) - chunk.start
        mm = squared_norms(members)
        step = max(1, BLOCK_VALUES // size)
        blocks = [x[a : min(hi, a + step)] for a in range(lo, hi, step)]
        density = np.concatenate(
            [  # GEMM form: Σ n_l² D work, the direct form took 5 s of mnist5k's 7
                np.exp(-np.maximum(gemm_sqdist(q, members, squared_norms(q), mm), 0.0) / (2 * sigma**2)).sum(1)
                for q in blocks
            ]
        )
        top = density.max()
        j = lo + np.flatnonzero(density == top)[np.argmin(in_ids[lo:hi][density == top])]
        best[l], ids[l], rows[l] = top, in_ids[j], x[j]
    return ((best, ids, rows),)


class Modes(NamedTuple):
    """The modes and the kernel's σ (a mean-shift step's; with ``store``, an inner loop's start)."""

    modes: np.ndarray
    sigma: float
    store: bool = False


def _ms_sums(chunk, params: Modes) -> ShiftSums:
    """One mean-shift step's partial sums per cluster over its hard members: Σ g x and Σ g."""
    modes, sigma = params.modes, params.sigma
    x, labels = chunk.state[ROWS], chunk.state["slk-labels"]
    k = len(modes)
    sums, weights = np.zeros((k, x.shape[1])), np.zeros(k)
    for l in np.unique(labels):
        members = x[labels == l]
        g = np.exp(-((members - modes[l]) ** 2).sum(1) / (2 * sigma**2))
        sums[l] = (g[:, None] * members).sum(0)
        weights[l] = g.sum()
    return ShiftSums(sums, weights)


def _start_inner(chunk, params: Modes) -> Energy:
    """a from the modes and z = softmax(a); returns −Σ a·z of the z the last inner loop kept (still in the
    halo: BO's energy takes it with the new a). a is kept as state ``slk-a`` when ``store``, else each
    update recomputes it (an empty ``slk-a``)."""
    modes, sigma, store = params.modes, params.sigma, params.store
    x = chunk.state[ROWS]
    a = chunk.state.get("slk-a")
    if a is None or a.shape != (x.shape[0], len(modes)):
        a = np.empty((x.shape[0], len(modes)))
    affinities(x, modes, sigma, a)
    chunk.state["slk-a"] = a if store else np.empty((0, len(modes)))
    chunk.state["slk-modes"] = modes, sigma
    last = 0.0
    if "slk-z" in chunk.halo:
        H, at = chunk.halo["slk-z"]
        last = -(a * H[at[chunk.state["slk-nb"][2]]]).sum()
    chunk.state["slk-z"] = softmax(a)
    return Energy(last)


def _update(chunk, lmbda) -> Energy:
    """One bound update from the previous z (halo): z_new = softmax(a + λ W z); returns the relaxed energy
    of the previous z (its W z is this update's) and keeps its labels, column maxima and energy terms."""
    z, a = chunk.state["slk-z"], chunk.state["slk-a"]
    modes, sigma = chunk.state["slk-modes"]
    H, at = chunk.halo["slk-z"]
    n, k = z.shape
    labels, col_max, col_arg = np.empty(n, np.int64), np.empty(k), np.empty(k, np.int64)
    zlogz, az, bz = bound_update(
        a,
        chunk.state[ROWS],
        modes,
        sigma,
        z,
        H,
        at,
        chunk.state["slk-nb"][1],
        lmbda,
        chunk.input_ids(),
        labels,
        col_max,
        col_arg,
    )
    chunk.state["slk-kept"] = labels, col_max, col_arg, az, bz
    return Energy(zlogz - az - lmbda * bz)


def _settle(chunk, lmbda):
    """After the inner loop (the kept z is the previous update's): labels, cluster sizes, BO's argmax rows
    (value, input id, row), and the energy's parts −a·z and −λ (W z)·z."""
    labels, col_max, col_arg, az, bz = chunk.state["slk-kept"]
    chunk.state["slk-labels"] = labels
    top = (col_max, chunk.input_ids()[col_arg], chunk.state[ROWS][col_arg])
    return np.bincount(labels, minlength=len(col_max)), top, -az, -lmbda * bz


def _labels(chunk, key) -> Labels:
    return Labels(chunk.state[key])


# ---------------------------------------------------------------- the driver


def first_modes(engine, seeds, sigma, mode, normalize):
    """BO: the densest member of each nearest-seed cluster (input ids, rows; a seed without members stays
    itself, id −1); MS: mean-shift from the seeds. Leaves the nearest-seed labels (state ``slk-labels``)."""
    sizes = engine.reduce(_first_labels, seeds, (Sum(),)).sizes
    if mode == "ms":
        return None, mean_shift(engine, seeds, sigma, sizes)
    with engine.reorder(nearest_centre, Centres(seeds, normalize)) as by_seed:
        keys, totals = by_seed.key_totals
        counts = np.zeros(len(seeds), np.int64)
        counts[keys] = totals
        starts = np.concatenate([[0], np.cumsum(counts)])
        with (
            by_seed.state(ROWS, rows_float64, lambda: normalize),
            by_seed.state(INPUT_IDS, keep_input_ids),
            by_seed.halo("slk-members", _members, starts),
        ):
            ((best, ids, rows),) = by_seed.rerun(lambda restarted: densest_members(by_seed, sigma, starts))
    empty = best == -np.inf
    ids[empty], rows[empty] = -1, seeds[empty]
    return ids, rows


def densest_members(by_seed, sigma, starts):
    by_seed.reduce(keep_halo_ids, "slk-member-in", halo=Halo("slk-members", INPUT_IDS))
    return by_seed.reduce(_densest_members, Clusters(sigma, starts), (ArgMax(),), halo=Halo("slk-members", ROWS))


def mean_shift(engine, modes, sigma, sizes, tol=1e-5, max_iter=1000):
    """Every cluster's mode moved by mean-shift over its members until it moves < tol (each on its own
    count, as one cluster at a time would)."""
    modes = np.array(modes, dtype=np.float64)
    active = sizes > 0
    for _ in range(max_iter):
        if not active.any():
            break
        shifted = engine.reduce(_ms_sums, Modes(modes, sigma), (Sum(), Sum()))
        new = shifted.sums[active] / shifted.weights[active, None]
        moved = np.linalg.norm(new - modes[active], axis=1)
        modes[active] = new
        active[np.flatnonzero(active)[moved < tol]] = False
    return modes


def inner_loop(engine, lmbda, tol, max_iter):
    """Bound updates until the relaxed energy changes <= tol relative; returns the authors' count (the
    update whose z is kept)."""
    energies = []
    for p in range(1, max_iter + 2):
        e = engine.reduce(_update, lmbda, (Sum(),), halo=Halo("slk-nb", "slk-z", indexed=True)).energy
        energies.append(e)  # energy of z_{p-1}
        if p >= 3 and abs(energies[-1] - energies[-2]) <= tol * abs(energies[-2]):
            return p - 1
    return max_iter


def slk(
    engine,
    seeds,
    loop,
    *,
    mode="bo",
    lmbda=1.3,
    n_neighbors=4,
    sigma="reference",
    tol=1e-5,
    min_iter=3,
    inner_tol=1e-6,
    inner_max_iter=1000,
    normalize=True,
    knn_method="exact",
    nlist=None,
    nprobe=16,
    entropy=0,
):
    """SLK from seeds (K × D, on the normalised rows) on ``engine`` (in input order); ``loop`` (an
    ``engine.Loop``) runs the outer iterations and records each one's energy. Returns an ``SLKResult``
    (labels in input order, BO's mode ids as input ids)."""
    seeds = np.asarray(seeds, dtype=np.float64)
    with (
        neighbour_graph(
            engine, n_neighbors, normalize=normalize, method=knn_method, nlist=nlist, nprobe=nprobe, entropy=entropy
        ) as graph,
        neighbour_lists(graph.engine),
    ):
        return bound_loops(graph, seeds, loop, mode, lmbda, sigma, tol, min_iter, inner_tol, inner_max_iter, normalize)


@contextlib.contextmanager
def neighbour_lists(g):
    """The block of the neighbour lists (state ``slk-nb``) and the halo plan of z they make, on the graph's
    engine ``g``; ``bound_loops`` makes them."""
    with g.state("slk-nb", _neighbour_lists, build=False), g.halo("slk-nb", _reads):
        yield


class BoundLoops:
    """Steps 3–5 on the graph's engine for one σ, λ and stopping rule; every phase restartable (``rerun``)."""

    def __init__(self, graph, sigma, lmbda, store, inner_tol, inner_max_iter):
        self.graph, self.g, self.sigma, self.lmbda, self.store = graph, graph.engine, sigma, lmbda, store
        self.inner_tol, self.inner_max_iter = inner_tol, inner_max_iter

    def repair(self):
        """After a lost worker: the rebuilt partitions' graph and neighbour lists (the halo plan follows)."""
        self.graph.complete()
        self.g.reduce(_neighbour_lists)

    def run(self, phase):
        return self.g.rerun(phase, self.repair)

    def start(self, modes):
        """a from the modes, z = softmax(a); returns −Σ a·z of the z the last inner loop kept."""
        return self.g.reduce(_start_inner, Modes(modes, self.sigma, self.store), (Sum(),)).energy

    def settle(self, modes, fresh):
        """The inner loop from the modes (from z = softmax(a) set by the last ``start`` unless ``fresh``), then
        the labels and ``_settle``'s fields; returns (inner count, fields)."""
        if fresh:
            self.start(modes)
        count = inner_loop(self.g, self.lmbda, self.inner_tol, self.inner_max_iter)
        return count, self.g.reduce(_settle, self.lmbda, (Sum(), ArgMax(), Sum(), Sum()))

    def labels(self, seeds, modes, fresh):
        """The labels of the inner loop from ``modes`` (None: of the nearest seed), in input order; made again
        when ``fresh`` (their state is another iteration's, or a rebuilt partition lost it)."""
        if fresh:
            if modes is None:
                self.g.reduce(_first_labels, seeds, (Sum(),))
            else:
                self.settle(modes, True)
        return self.g.to_input_order(labels_of(self.g, "slk-labels"))


def bound_loops(
    graph, seeds, loop, mode, lmbda, sigma, tol, min_iter, inner_tol, inner_max_iter, normalize, store=None
):
    """Steps 2-6 on the graph's engine, within ``neighbour_lists``; ``store``: hold a (N × K) between updates,
    or recompute it in each (None: recompute when the rows have at most 32 features, where that costs about
    what the update does). A lost worker restarts the phase it hits: the first modes, or the current outer
    iteration from its modes."""
    g = graph.engine
    store = g.n_features > _RECOMPUTE_MAX_FEATURES if store is None else store
    sigma = graph.reference_sigma() if sigma == "reference" else float(sigma)
    if not sigma > 0:
        raise InputError(
            f"sigma from the graph is 0: every row's {graph.n_neighbors} nearest rows are copies of it "
            "(after L2 normalisation); pass sigma= a positive float or raise n_neighbors"
        )
    run = BoundLoops(graph, sigma, lmbda, store, inner_tol, inner_max_iter)

    def begin(restarted):
        g.reduce(_neighbour_lists)
        ids, modes = first_modes(g, seeds, sigma, mode, normalize)
        run.start(modes)
        return ids, modes

    def outer(modes, fresh):
        """One outer iteration from the modes: (inner count, BO's mode ids, the new modes, the energy), or
        the count and None for a lost cluster."""
        count, (sizes, (_, top_ids, top_rows), neg_az_old, lap) = run.settle(modes, fresh)
        if np.any(sizes == 0):
            return count, None, None, np.nan
        if mode == "bo":
            return count, top_ids, top_rows, run.start(top_rows) + lap
        new = mean_shift(g, modes, sigma, sizes)
        run.start(new)
        return count, None, new, neg_az_old + lap

    ids, modes = run.run(begin)
    state = SLKResult(None, modes, ids, sigma, 0, recall=graph.recall, method=graph.method)
    inner, e_old, labelled = [], None, None  # labelled: the modes whose inner loop gave the labels (None: seeds)
    for it in loop:
        count, new_ids, new, e = run.run(lambda restarted: outer(modes, restarted))
        inner.append(count)
        if new is None:  # a lost cluster: the previous state and its labels
            loop.record(np.nan, 0, None, inner_iterations=count, lost_cluster=True)
            state.outer, state.inner, state.lost = it + 1, inner, True
            state.labels = run.run(lambda restarted: run.labels(seeds, labelled, True))
            return state
        labelled, ids, modes = modes, new_ids, new
        state = SLKResult(None, modes, ids, sigma, it + 1, list(inner), recall=graph.recall, method=graph.method)
        loop.record(e, g.n_samples * len(modes), None, centers=modes, inner_iterations=count)
        if it + 1 >= min_iter and e_old is not None and abs(e - e_old) <= tol * abs(e_old):
            loop.converged = True
            break
        e_old = e
    state.labels = run.run(lambda restarted: run.labels(seeds, labelled, restarted))
    return state


def labels_of(engine, key):
    """The rows' labels (state ``key``), to the driver once, at the end."""
    return engine.reduce(_labels, key, (Rows(),)).labels
