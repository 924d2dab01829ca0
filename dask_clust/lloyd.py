"""Lloyd iterations: the building block of ``algo="kmeans"``, of k-means||'s recluster, and of every
algorithm that refines centres on weighted data (ALGORITHMS.md §6).

S. P. Lloyd, "Least squares quantization in PCM", IEEE Trans. Inf. Theory 28(2), 1982,
doi:10.1109/TIT.1982.1056489.

One iteration (``lloyd_step`` on every chunk, exact sum, ``m_step``):
  1. assign every row to its nearest centre (blocked GEMM, float64 re-search near ties);
  2. accumulate Σ w x, Σ w and Σ w d² per centre (float64);
  3. centres ← Σ w x / Σ w; an empty cluster takes the row farthest from its centre (as scikit-learn);
  4. stop when no label changed, or when Σ ||Δc||² ≤ tol (scikit-learn's rule, tol already scaled by
     the mean feature variance), then one assignment pass so that the returned labels and QE belong to
     the returned centres.
"""
import numpy as np

from .engine import FitResult, Loop
from .engine.combine import Top
from .kernels.assign import Prepared, accumulate, nearest


def lloyd_step(chunk, centers):
    """Assign the chunk's rows and return the partial (Σ w x, Σ w, QE, changed labels, evaluations).

    State: the labels of the previous iteration (to count changes; a rebuilt chunk counts all rows as
    changed, which can only delay convergence) and the distances (for empty-cluster relocation).
    """
    st = chunk.state
    n = chunk.x.shape[0]
    prev = st.get("lloyd_labels")
    labels = st.get("lloyd_spare")
    labels, mind, evals = nearest(chunk.x, centers, labels if labels is not None else None,
                                  st.get("lloyd_mind"))
    k, d = centers.C.shape
    sums = np.zeros((k, d))
    weights = np.zeros(k)
    qe = accumulate(chunk.x, chunk.w, labels, mind, sums, weights)
    changed = n if prev is None else int(np.count_nonzero(prev != labels))
    st["lloyd_labels"], st["lloyd_spare"], st["lloyd_mind"] = labels, prev, mind
    return sums, weights, qe, np.int64(changed), np.int64(evals)


def farthest_rows(chunk, m):
    """The chunk's m rows farthest from their centre: (distance², global id, row, label, weight)."""
    mind = chunk.state["lloyd_mind"]
    idx = np.lexsort((np.arange(mind.shape[0]), -mind))[:m]
    return (mind[idx], idx + chunk.start, chunk.x[idx], chunk.state["lloyd_labels"][idx], chunk.w[idx]),


def relocate_empty(engine, sums, weights):
    """Give every empty cluster the row farthest from its centre, moving that row's mass out of its old
    cluster (scikit-learn's policy). Modifies sums/weights; returns the number of relocations."""
    empty = np.flatnonzero(weights == 0)
    if not len(empty):
        return 0
    ((_, _, rows, labels, w),) = engine.reduce(farthest_rows, len(empty), (Top(len(empty), largest=True),))
    for e, x, old, wi in zip(empty, rows.astype(np.float64), labels, w):
        if weights[old] - wi > 0:
            sums[old] -= wi * x
            weights[old] -= wi
        sums[e] = wi * x
        weights[e] = wi
    return len(rows)


def m_step(sums, weights, old):
    """New centres; a cluster that is still empty keeps its old centre."""
    new = old.copy()
    nz = weights > 0
    new[nz] = sums[nz] / weights[nz, None]
    return new


def _qe_step(chunk, centers):
    _, mind, evals = nearest(chunk.x, centers)
    return float(np.dot(chunk.w, mind)), np.int64(evals)


def quantization_error(engine, centers):
    """Σ w min_c ||x − c||² over the engine's rows (exact nearest centre) and the evaluations spent."""
    qe, evals = engine.reduce(_qe_step, Prepared(centers, engine.dtype))
    return float(qe), int(evals)


def lloyd(engine, centers, *, max_iter, tol, loop=None):
    """Lloyd iterations from ``centers`` (float64, validated); ``tol`` is absolute (already scaled).

    Returns a ``FitResult`` whose objective is the QE of the returned centres on ``engine``'s rows.
    """
    loop = loop or Loop("lloyd", max_iter)
    evals = 0
    objective = None
    strict = False
    for _ in loop:
        sums, weights, qe, changed, e = engine.reduce(lloyd_step, Prepared(centers, engine.dtype))
        evals += e
        relocated = relocate_empty(engine, sums, weights)
        new = m_step(sums, weights, centers)
        shift = float(((new - centers) ** 2).sum())
        loop.record(qe, e, changed, centers=new, center_shift=shift, relocated=relocated)
        strict = changed == 0 and relocated == 0
        centers = new
        objective = qe
        if strict or shift <= tol:
            loop.converged = True
    if not strict:  # the last M-step moved the centres: one assignment pass for the labels and QE
        _, _, objective, _, e = engine.reduce(lloyd_step, Prepared(centers, engine.dtype))
        evals += e
    return FitResult(centers, float(objective), loop.n_iter, loop.converged, int(evals), loop.history)
