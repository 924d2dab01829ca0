"""Split-and-merge moves for a mixture after its EM (SMEM: N. Ueda, R. Nakano, Z. Ghahramani, G. E. Hinton,
"SMEM Algorithm for Mixture Models", Neural Computation 12(9), 2000, Sec. 3).

EM settles where one component spans two clusters while two others share one: no EM step leaves such an
optimum, since each way out lowers the likelihood first. SMEM's move takes two steps at once: merge the two
components that overlap most (their weights added, the Gaussian of their moments), split a third in two,
run EM from there, and keep the result when the likelihood rose; the candidates are tried in order, the
first improvement taken, and then ranked anew (Sec. 3.2). Here, on the coreset once its EM has converged
(``vcgmm.fit``):

  1. merge_candidates   pairs ranked by the Bhattacharyya distance of their Gaussians (the diagonals of
                        their Σ). Ueda ranks by the posteriors' inner product Σ_n P(i|x_n) P(j|x_n); the
                        truncated posteriors (C' components a row) leave it 0 for most pairs, and the
                        distance ranks the same overlap from the parameters alone, without a pass
  2. split_candidate    for a pair, the component of highest split rank outside it (``split_rank`` of the
                        covariance type). Ueda's local KL divergence needs a density estimate per component;
                        a diagonal one ranks by log det Σ (the component spanning two clusters is the widest,
                        its Σ holding the gap between them), a full one by how far Mardia's kurtosis of its
                        rows is from a Gaussian's (one that swallowed a small cluster has the heavy tail of
                        its distances, one spanning two alike is bimodal), a tied one by how far its rows
                        spread beyond the shared Σ (their mean squared Mahalanobis distance)
  3. moved              merged: π_i + π_j, the moments of the two; split: two halves of N(μ_k, Σ_k) cut at μ_k
                        along its axis of largest variance, π_k / 2 each (together the moments of the one);
                        a shared Σ stays as it is, and the move relocates a mean, which no EM step does
  4. judged             TRIAL_ITERATIONS EM iterations on the coreset from the moved mixture, kept when the
                        coreset's free energy passed the current one's (it ranked eight starts of a 300k x 64,
                        C = 64 mixture in the order of their held-out likelihood, every one)

until ``budget`` moves are tried or PATIENCE in a row are not kept. The types that rank their components
(``CovarianceType.splits``: "diag", "full", "tied").

The driver holds the mixture, O(C·D) (O(C·D²) full), and ranks the pairs in O(C²·D) (blocks of
BLOCK_ENTRIES), as the refine on every row that follows already holds it; each move costs the EM's
passes over the coreset, none over the data.
"""

import logging

import numpy as np

from .. import progress

logger = logging.getLogger("dask_clust")

# moves in a row not kept after which the mixture is taken as it is (Ueda's C_max candidates, Sec. 3.2)
PATIENCE = 3
# entries (components x components x features) of the distance blocks on the driver
BLOCK_ENTRIES = 2**22


def merge_candidates(diag, mu, n):
    """Up to ``n`` pairs (i, j), i < j, each some component and its nearest (least Bhattacharyya distance
    between N(μ_i, diag_i) and N(μ_j, diag_j)), closest first."""
    C, D = mu.shape
    diag = np.broadcast_to(diag, mu.shape)  # a shared Σ's one row
    log_det = np.log(diag).sum(axis=1)
    nearest, dist = np.empty(C, np.int64), np.empty(C)
    step = max(1, BLOCK_ENTRIES // (C * D))
    for a in range(0, C, step):
        b = np.arange(a, min(C, a + step))
        both = 0.5 * (diag[b, None, :] + diag[None, :, :])
        db = 0.125 * ((mu[b, None, :] - mu[None, :, :]) ** 2 / both).sum(axis=2) + 0.5 * (
            np.log(both).sum(axis=2) - 0.5 * (log_det[b, None] + log_det[None, :])
        )
        db[np.arange(len(b)), b] = np.inf
        nearest[b] = np.argmin(db, axis=1)
        dist[b] = db[np.arange(len(b)), nearest[b]]
    pairs = []
    for i in np.argsort(dist, kind="stable"):
        pair = (int(min(i, nearest[i])), int(max(i, nearest[i])))
        if pair not in pairs:
            pairs.append(pair)
        if len(pairs) == n:
            break
    return pairs


def split_candidate(rank, pair):
    """The component of highest split ``rank`` outside ``pair`` (the lowest index on ties)."""
    rank = np.array(rank, np.float64)
    rank[list(pair)] = -np.inf
    return int(np.argmax(rank))


def moved(cov, mu, var, weights, i, j, k):
    """The mixture with components i and j merged into i, and k split into j and k (step 3)."""
    mu, weights = mu.copy(), weights.copy()
    total = weights[i] + weights[j]
    share = weights[i] / total if total > 0 else 0.5
    centre = share * mu[i] + (1 - share) * mu[j]
    new_var, offset = cov.moved(var, i, j, k, mu[i] - centre, mu[j] - centre, share)
    mu[i], weights[i] = centre, total
    mu[j], mu[k] = mu[k] + offset, mu[k] - offset
    weights[j] = weights[k] = weights[k] / 2
    return mu, new_var, weights


def split_merge(em, cov, mixture, f, budget, rank):
    """Steps 1-4 from ``mixture`` = (μ, Σ as the EM keeps it, π) of free energy ``f`` and split ``rank``
    (``CovarianceType.split_rank``); ``em(μ, Σ, π)`` runs the judging EM and returns (its mixture, its free
    energy, its extras, its split rank). Returns (the mixture, its free energy, the extras of the EM that made
    it or None)."""
    tried = kept = 0
    extras = None
    if budget < 1 or len(mixture[0]) < 3:
        return mixture, f, extras
    with progress.phase("split and merge", budget, "move") as shown:
        while tried < budget:
            mu, var, weights = mixture
            for i, j in merge_candidates(cov.diagonal(var), mu, min(PATIENCE, budget - tried)):
                k = split_candidate(rank, (i, j))
                new, new_f, new_extras, new_rank = em(*moved(cov, mu, var, weights, i, j, k))
                tried += 1
                shown.update(1, **{"free energy": f"{max(f, new_f):.6g}"})
                logger.debug(
                    "split and merge: merge %d, %d; split %d (rank %.6g): F %.6g -> %.6g", i, j, k, rank[k], f, new_f
                )
                if new_f > f:
                    mixture, f, extras, rank, kept = new, new_f, new_extras, new_rank, kept + 1
                    break
            else:
                break
    logger.info("split and merge: %d of %d moves kept, F = %.6g", kept, tried, f)
    return mixture, f, extras
