"""Nested mini-batch k-means (``algo="nmbatch"``): mini-batches that grow by doubling and nest (every
batch holds the previous one), so a row's label, distance and lower bounds stay valid from round to
round; each row votes once (a changed label moves it between the sums), and the batch doubles when the
centres' displacement is small against their standard error.

J. Newling, F. Fleuret, "Nested Mini-Batch K-Means", NIPS 2016 (Alg. 5), arXiv:1602.02934; reference
code idiap/eakmeans (turbobatch-rho), whose doubling test (the standard deviation, not the standard error
of the text) is the default: it made the paper's figures.

  1. nesting_order: each row's rank in one pseudo-random permutation of [0, N); the batch of size b is
     the rows of rank < b, every chunk holds its proportional slice of it, as a prefix of a copy of its
     rows sorted by rank
  2. initial_centers: k-means|| (any seeding) on the first init_size rows, the rows of rank 0..k−1
     ("first-k", the paper's protocol) or a given array
  repeat (one call per partition, one exact reduction)
  3. assign_with_bounds: reused rows l −= p, exact d, exact distances where l < d; joining rows all k
     distances (a GEMM); label changes move (w x, w) between the sums S, v
  4. update_centroids: c = S/v (a cluster with v = 0 is frozen), p = ||c_new − c_old||
  5. doubling_test: min_j σ̂(j)/p_j > ρ → b ← min(2b, N)
  until b = N and no label changed, or |ΔE/E| < tol once b = N, or max_iter rounds.

Per round the driver receives the summed (ΔS, Δv, sse) and three counts, O(k·D) whatever N and the
workers, and sends the centres and their moves.

Bounds: k per row (Elkan, N·k·4 bytes) or one on the second closest centre (Hamerly); ``bounds="auto"``
takes Hamerly's when a partition's Elkan bounds would exceed its memory budget.

``metric="cosine"`` (spherical k-means, Dhillon & Modha, Machine Learning 2001): the rows are read on the
unit sphere and step 4 takes each cluster's mean direction c = S/||S||. The bounds hold as they are: they
need only the triangle inequality in R^D and each centre's actual displacement p, which step 4 measures
after the renormalisation. The doubling test is adapted: a mean direction moves 1/R̄ times as far as the
mean it comes from (R̄ = ||S||/v, the cluster's mean resultant length, 1 when its rows agree, near 0 when
they spread over the sphere), so its standard error is σ̂/R̄ and the test reads min_j σ̂(j)/(R̄_j p_j) > ρ.
The objective is Σ w (1 − cos), half the squared distances'.

Sparse rows (a CSR matrix of documents): each chunk keeps its rows in nesting order as CSR, with their
squared norms; a round's distances are ||x||² − 2 x·c + ||c||² from a row's non-zeros (O(nnz) a reused row's
centre, O(nnz·k) from the centres' columns for a joining row or a failed Hamerly bound), each bound giving
up the expansion's rounding so it stays below the true distance; a label change moves the row's non-zeros
between the sums. ``init="auto"`` seeds by k-means++ on them (``blocks.seeding``).
"""

import logging
import numbers
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from .._params import FiniteArray, Interval, NoneOK, Options
from .._random import stream
from ..blocks.lloyd import m_step, to_sphere
from ..blocks.seeding import AUTO, ROW_BYTES, SEEDERS, seed, seed_rows
from ..engine.combine import Entries, Rows
from ..kernels.assign import Prepared, densified, is_csr, kernel_rows
from ..kernels.nested import csr_join_rows, join_rows, nested_ranks, reuse_rows
from .registry import COUNT, MAYBE, METRIC, METRICS, AlgorithmSpec, centres, finish, register, spherical

logger = logging.getLogger("dask_clust")

# displacements below this vote for doubling (the reference code's threshold)
P_FLOOR = 1e-10
NO_COLUMNS = np.empty((0, 0))


@dataclass
class NMBatchConfig:
    n_clusters: int = 8
    init: object = AUTO
    init_size: int | None = None
    batch_size: int = 5000
    rho: float = 30.0
    rho_mode: str = "reference"
    bounds: str = "auto"
    bounds_memory: int | None = None
    max_iter: int = 1000
    tol: float = 1e-4
    metric: str = "euclidean"

    constraints: ClassVar = {
        "n_clusters": [Interval(numbers.Integral, 1, None)],
        "init": [Options((AUTO,) + SEEDERS + ("first-k",)), FiniteArray()],
        "init_size": [Interval(numbers.Integral, 1, None), NoneOK()],
        "batch_size": [Interval(numbers.Integral, 1, None)],
        "rho": [Interval(numbers.Real, 0, None, "neither")],
        "rho_mode": [Options(("paper", "reference"))],
        "bounds": [Options(("auto", "elkan", "hamerly"))],
        "bounds_memory": [Interval(numbers.Integral, 1, None), NoneOK()],
        "max_iter": [Interval(numbers.Integral, 1, None)],
        "tol": [Interval(numbers.Real, 0, None, "left")],
        "metric": [Options(METRICS)],
    }

    docs: ClassVar = {
        "init": "As k-means' init ('auto': 'k-means||', or 'k-means++' on sparse rows), run on the first "
        "init_size rows of the nesting order, plus 'first-k': the first n_clusters rows of that order (the "
        "paper's protocol).",
        "init_size": "Rows of the nesting order the seeding runs on (None: max(4 * batch_size, 100 * n_clusters); "
        "at most all rows).",
        "batch_size": "b0, the first nested batch; batches double from it up to all rows.",
        "rho": "Doubling threshold: the batch doubles when every centre's displacement is below its "
        "spread divided by rho. 100 is the paper's; 30 (the default) ended the image patches and blobs "
        "at k = 50 to 200 within 0.25 % of its QE in a third to a half of its rounds.",
        "rho_mode": "Spread in the doubling test: 'reference' the standard deviation sqrt(sse/(v-1)), as the "
        "authors' eakmeans code that made the paper's figures, or 'paper' the standard error "
        "sqrt(sse/(v(v-1))) of the paper's text (sqrt(v) times stricter: 5x the rounds).",
        "bounds": "Distance bounds kept per row: 'elkan' (k per row, N*k*4 bytes), 'hamerly' (one per row) or "
        "'auto' (Elkan when it fits each partition's budget).",
        "bounds_memory": "Bytes of Elkan bounds a partition may hold under bounds='auto' (None: a quarter of "
        "its worker's memory).",
        "max_iter": "Most rounds (one assignment pass over the current batch each).",
        "tol": "Once the batch is all rows, stop when the objective changes by less than tol (relative).",
        "metric": METRIC,
    }


# ---------------------------------------------------------------- per-chunk steps


class Nesting(NamedTuple):
    """``_nesting``'s parameters: the fit's nesting key, N, the bounds' width (k for Elkan's, 1 for
    Hamerly's), and the centres and batch size of the round that last assigned the rows (None, 0: none)."""

    key: int
    n_total: int
    width: int
    centers: np.ndarray | None
    b: int


def _nesting(chunk, params: Nesting):
    """State, kept in the chunk's nesting order so that every batch is a prefix of it: "order" the row of each
    position, "ranks" theirs (ascending), "x" and "w" the rows and weights in that order (a copy: the
    reference code shuffles its data once for the same reason; a batch of a fortieth of the image patches'
    rows read where they lie took 4x as long a row), each position's label, distance and bounds, "rows" the
    positions in the batch and its size "b". Rebuilt from the model (a lost worker), the rows of rank < b
    are assigned afresh to the centres of the round that last assigned them: the labels and distances the
    lost partition held (its bounds are fresh, tighter)."""
    key, n_total, width, centers, b = params.key, params.n_total, params.width, params.centers, params.b
    n = chunk.n
    ranks = np.empty(n, np.int64)
    nested_ranks(chunk.start, n_total, key, ranks)
    order = np.argsort(ranks)
    x = chunk.x[order]
    st = chunk.state["nmbatch"] = {
        "order": order,
        "ranks": ranks[order],
        "x": x,
        "xx": kernel_rows(x)[3] if is_csr(x) else None,  # CSR rows' squared norms: their distances expand from them
        "w": chunk.w[order],
        "labels": np.zeros(n, np.int32),
        "dist": np.zeros(n),
        "lower": np.empty((n, width), np.float32),
        "rows": np.zeros(0, np.int64),
        "b": 0,
    }
    if b:
        k, d = centers.shape
        _join(st, Prepared(centers, chunk.x.dtype), b, _moves_buffer(st, b, k, d), np.zeros(k), np.zeros(k))


def _moves_buffer(st, b, k, d):
    """Where a round's moves of Σ w x go: a dense k × D delta, or for CSR rows their terms (keys, values,
    used), room for two a non-zero of the rows of rank < b (a row leaves one centre and joins another): a
    dense delta a chunk would cost more than its rows."""
    if not is_csr(st["x"]):
        return np.zeros((k, d))
    indptr = st["x"].indptr
    nnz = 2 * int(indptr[np.searchsorted(st["ranks"], b)] - indptr[0])
    return np.empty(nnz, np.int64), np.empty(nnz), np.array([0, d], np.int64)


def _join(st, centers, b, S, v, sse):
    """The rows of rank in [st["b"], b) join the batch; returns (evaluations, rows that joined)."""
    m, more = np.searchsorted(st["ranks"], [st["b"], b])
    rows, x, out = np.arange(m, more), st["x"], (st["labels"], st["dist"], st["lower"], S, v, sse)
    if is_csr(x):
        evals = csr_join_rows(x.indptr, x.indices, x.data, st["xx"], st["w"], rows, centers.CT, centers.cnorm, *out)
    else:
        evals = join_rows(x, st["w"], rows, centers.Cd, centers.cnorm, centers.C, centers.tol, centers.block, *out)
    st["rows"], st["b"] = np.arange(more), b
    return evals, more - m


class FirstRows(NamedTuple):
    """``_first_rows``' parameters: the rank below which rows are read, and the state's ``Nesting``."""

    m: int
    nesting: Nesting


class Ranked(NamedTuple):
    """Rows with their nesting ranks and weights."""

    ranks: np.ndarray
    rows: object
    w: np.ndarray


class RoundPartial(NamedTuple):
    """A chunk's part of a round: the changes of Σ x and of the counts per centre, the SSE per centre, changed
    labels, evaluations and rows that joined the batch."""

    sums: object
    counts: np.ndarray
    sse: np.ndarray
    changed: np.int64
    evals: np.int64
    joined: np.int64


def _first_rows(chunk, params: FirstRows) -> Ranked:
    """The chunk's rows of rank < m: (ranks, rows, weights); the fit's first call, which builds the state
    (``_nesting`` with ``nesting``) in the same read of the rows."""
    if "nmbatch" not in chunk.state:
        _nesting(chunk, params.nesting)
    st = chunk.state["nmbatch"]
    head = np.searchsorted(st["ranks"], params.m)
    # copies: a view would keep the chunk's whole state in memory until the call ends, and the state just
    # built here is not yet in the files it goes to (at 10x the memory of 700 MiB workers, past their limit)
    return Ranked(st["ranks"][:head].copy(), st["x"][:head].copy(), st["w"][:head].copy())


class Round(NamedTuple):
    """A round's parameters: the centres (a ``Prepared``), each centre's largest move p, and the batch size b."""

    centers: Prepared
    p: np.ndarray
    b: int


def _round_step(chunk, params: Round) -> RoundPartial:
    """Step 3 on the chunk's rows of rank < b: (ΔS, Δv, sse, changed, evaluations, rows that joined); of CSR
    rows ΔS comes as the moved rows' terms (``Entries``, ``_moves_buffer``)."""
    centers, p, b = params.centers, params.p, params.b
    st = chunk.state["nmbatch"]
    k, d = centers.C.shape
    S, v, sse = _moves_buffer(st, b, k, d), np.zeros(k), np.zeros(k)
    # CSR rows read the centres' columns when a bound fails (dense rows: none)
    cols = centers.CT if is_csr(st["x"]) else NO_COLUMNS
    kept = st["labels"], st["dist"], st["lower"]
    x = kernel_rows(st["x"], st["xx"])
    evals, changed = reuse_rows(x, st["w"], st["rows"], centers.C, centers.cnorm, cols, p, *kept, S, v, sse)
    joined = 0
    if b > st["b"]:
        more, joined = _join(st, centers, b, S, v, sse)
        evals += more
    if isinstance(S, tuple):
        keys, values, (used, _) = S
        S = Entries(keys[:used], values[:used], (k, d))
    return RoundPartial(S, v, sse, np.int64(changed), np.int64(evals), np.int64(joined))


# ---------------------------------------------------------------- driver


def bounds_kind(engine, cfg):
    """ "elkan" or "hamerly": auto keeps k bounds per row while every partition's fit in its budget."""
    if cfg.bounds != "auto":
        return cfg.bounds
    need = [(rows * cfg.n_clusters * 4, cfg.bounds_memory or memory // 4) for rows, memory in engine.partitions()]
    if all(bytes_ <= budget for bytes_, budget in need):
        return "elkan"
    logger.info(
        "nmbatch: k lower bounds per row would take %.3g GB in a partition (budget %.3g GB): one bound "
        "per row (Hamerly)",
        max(b for b, _ in need) / 1e9,
        min(b for _, b in need) / 1e9,
    )
    return "hamerly"


def first_rows(engine, m, nesting):
    """The rows of rank < m, in rank order: (rows, weights); the call builds the state (``nesting``: its
    builder's parameters) and carries the engine's first pass, in one read of the rows."""
    first = engine.reduce(_first_rows, FirstRows(m, nesting), (Rows(),) * 3, first_pass="with")
    order = np.argsort(first.ranks)
    return first.rows[order], first.w[order]


def initial_centers(engine, cfg, b0, entropy, nesting):
    """Step 2: a seeding of the first rows of the nesting order (a uniform sample, gathered to this process
    when small; k-means|| on all rows cost 3 s of a 7 s fit of the image patches for no better QE), the first
    k rows themselves ("first-k"), or a given array. Returns (centres float64, distance evaluations)."""
    if isinstance(cfg.init, str) and cfg.init == "first-k":
        return np.asarray(densified(first_rows(engine, cfg.n_clusters, nesting)[0]), dtype=np.float64), 0
    if not isinstance(cfg.init, str):
        return seed(engine, cfg.n_clusters, cfg.init, entropy)
    rows, w = first_rows(engine, seeding_rows(cfg, b0, engine.n_samples), nesting)
    return seed_rows(engine, rows, w, cfg.n_clusters, cfg.init, entropy)


def seeding_rows(cfg, b0, n_samples):
    """How many rows of the nesting order the seeding sees: ``init_size``, else max(4·b0, 100·k)."""
    return min(n_samples, cfg.init_size or max(4 * b0, 100 * cfg.n_clusters))


def update_centroids(S, v, centers, unit=False):
    """Step 4: c = S/v where v > 0 (else frozen; ``unit``: S/||S||, the mean direction, where S ≠ 0);
    returns (centres, displacements)."""
    new = m_step(S, v, centers, unit)
    return new, np.sqrt(((new - centers) ** 2).sum(axis=1))


def doubling_test(sse, v, p, rho, mode="paper", sphere_sums=None):
    """Step 5: min_j σ̂_C(j)/p_j > ρ, with the paper's standard error σ̂_C = sqrt(sse/(v(v−1))) or the
    reference code's sqrt(sse/(v−1)) (``mode="reference"``); ``sphere_sums``: on the sphere, the clusters'
    sums S, whose mean resultant length R̄ = ||S||/v divides σ̂ (their mean directions' error). A centre that
    did not move or has fewer than two rows gives no evidence against doubling."""
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = sse / (v - 1) if mode == "reference" else sse / (v * (v - 1))
        if sphere_sums is not None:
            spread /= (sphere_sums * sphere_sums).sum(axis=1) / (v * v)
        ratio = np.sqrt(spread) / p
    ratio[(p < P_FLOOR) | (v <= 1)] = np.inf
    return bool(ratio.min() > rho)


def row_fields(k, width):
    """The per-row state a checkpoint holds, as ``restored_rows`` checks it: labels (cluster indices; 0 for a row
    not yet in a batch), distances and lower bounds (unset, so unchecked, for such rows)."""
    return {
        "labels": ("int32", (), 0, k),
        "dist": ("float64", (), None, None),
        "lower": ("float32", (width,), None, None),
    }


def fit(engine, cfg, entropy, loop):
    N, k = engine.n_samples, cfg.n_clusters
    unit = spherical(cfg)  # the engine holds the rows on the unit sphere (``api.fit``)
    b0 = min(cfg.batch_size, N)
    # a resumed fit keeps the bounds its checkpoint holds (its evaluations are then the uninterrupted fit's)
    kind = bounds_kind(engine, cfg) if loop.restored is None else loop.restored["bounds"]
    key = int(stream(entropy, "nmbatch", "nesting").integers(2**63))
    width = k if kind == "elkan" else 1
    # a rebuilt partition assigns its rows of rank < b afresh to the centres the last round assigned them
    # to: the labels and distances it lost, so its votes in the sums S, v stay valid
    model = {"centers": None, "b": 0}
    restored = loop.restored
    if restored is not None:  # the state is built with the batch the checkpoint's last round held
        model.update(centers=restored["model_centers"], b=restored["b_old"])
    nesting = lambda: Nesting(key, N, width, model["centers"], model["b"])  # noqa: E731
    # the state is built by the first call (``first_rows``), which carries the engine's first pass: one read
    built_first = restored is None and isinstance(cfg.init, str)
    with engine.state("nmbatch", _nesting, nesting, build=not built_first):
        if restored is None:
            centers, seed_evals = initial_centers(engine, cfg, b0, entropy, nesting())
            centers = to_sphere(centers) if unit else centers
            S, v = np.zeros_like(centers), np.zeros(k)
            p = np.zeros(k)
            b_old, b = 0, b0
            evals_total, prev = seed_evals, None
        else:
            centers, S, v, p = (restored[name] for name in ("centers", "S", "v", "p"))
            b_old, b, seed_evals, evals_total, prev = (
                restored[name] for name in ("b_old", "b", "seed_evals", "evals", "prev")
            )
            # the rows' labels, distances and bounds as the checkpoint left them
            engine.load_rows(loop.restored_rows, "nmbatch", row_fields(k, width), order="order")
        loop.keep(seed_evals=int(seed_evals), bounds=kind)
        for _ in loop:
            part = engine.reduce(_round_step, Round(Prepared(centers, engine.dtype), p, b))
            dS, dv, sse, changed, evals, joined = (
                part.sums,
                part.counts,
                part.sse,
                part.changed,
                part.evals,
                part.joined,
            )
            model.update(centers=centers, b=b)
            S += dS
            v += dv
            energy = float(sse.sum() / v.sum()) * (0.5 if unit else 1.0)
            centers, p = update_centroids(S, v, centers, unit)
            grow = b < N and doubling_test(sse, v, p, cfg.rho, cfg.rho_mode, S if unit else None)
            evals_total += int(evals)
            loop.record(energy, evals, changed, centers=centers, batch_size=b, joined=int(joined))
            if b == N and joined == 0 and (changed == 0 or abs(prev - energy) < cfg.tol * energy):
                loop.converged = True
            prev = energy
            b_old, b = b, (min(2 * b, N) if grow else b)
            loop.save(
                lambda: {
                    "centers": centers,
                    "S": S,
                    "v": v,
                    "p": p,
                    "b_old": b_old,
                    "b": b,
                    "evals": int(evals_total),
                    "prev": prev,
                    "model_centers": model["centers"],
                },
                rows=lambda directory: engine.dump_rows(
                    directory, "nmbatch", ("labels", "dist", "lower"), order="order"
                ),
            )
    return finish(
        engine,
        centers,
        loop,
        evals_total,
        {"bounds_": kind, "batch_size_": b_old, "seeding_distance_evals": int(seed_evals)},
        unit=unit,
    )


def saved(cfg, n_samples, n_features):
    """What an nmbatch checkpoint holds besides its rows' files: the centres, the sums, counts and moves, the
    batch sizes, and which bounds the rows keep."""
    k = cfg.n_clusters
    return {
        "centers": centres(cfg, n_features),
        "S": centres(cfg, n_features),
        "v": ("floats", (k,)),
        "p": ("floats", (k,)),
        "b_old": ("int", 0, n_samples + 1),
        "b": ("int", 1, n_samples + 1),
        "evals": COUNT,
        "prev": MAYBE,
        "model_centers": centres(cfg, n_features),
        "seed_evals": COUNT,
        "bounds": ("choice", ("elkan", "hamerly")),
    }


register(
    AlgorithmSpec(
        name="nmbatch",
        config=NMBatchConfig,
        fit=fit,
        estimator="NestedMiniBatchKMeans",
        summary="nested mini-batch k-means: doubling nested batches, one vote per row, Elkan/Hamerly bounds",
        reference="Newling, Fleuret, NIPS 2016, arXiv:1602.02934",
        objective="mean squared distance over the current nested batch (Σ sse / Σ v; half that, the mean "
        "1 − cos, with metric='cosine')",
        # the rows and weights in nesting order (``keeps_rows``), each one's row, rank and position in the batch
        # (int64), label (int32), distance (float64) and the float32 bounds: k ("elkan") or one ("hamerly"; "auto"
        # takes k only when they fit the partitions' budget, ``bounds_kind``)
        state_bytes=lambda cfg: max(
            ROW_BYTES, 8 + 8 + 8 + 4 + 8 + 4 * (cfg.n_clusters if cfg.bounds == "elkan" else 1)
        ),
        keeps_rows=True,
        sparse=True,
        state_files=True,
        resumable=True,
        saved=saved,
    )
)
