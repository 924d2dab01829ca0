"""Sampling inside one block: draws proportional to a non-negative weight vector, greedy k-means++ over a
weighted set held in memory, and the uniform draws of a window of batches (``blocks/batches.py``), read by
label on the driver or by row range in a chunk."""

import numpy as np
from numba import njit

from .._random import permute, row_state, splitmix, unpermute
from .distance import sqdist, sqnorm


@njit(nogil=True, cache=True)
def sample_proportional(p, u, out):
    """Inverse-CDF draws: out[t] = the index i with cumsum(p)[i-1] <= u[t]·Σp < cumsum(p)[i].

    p   : IN  float64 (n,) non-negative, Σp > 0
    u   : IN  float64 (m,) uniforms in [0, 1), sorted ascending
    out : OUT int64 (m,)
    """
    total = 0.0
    for i in range(p.shape[0]):
        total += p[i]
    acc = 0.0
    i = 0
    last = p.shape[0] - 1
    for t in range(u.shape[0]):
        target = u[t] * total
        while i < last and acc + p[i] <= target:
            acc += p[i]
            i += 1
        j = i
        while j > 0 and p[j] == 0.0:  # rounding can run past the last positive weight
            j -= 1
        out[t] = j


def draw_proportional(p, rng, m):
    """m i.i.d. indices ∝ p (p >= 0, Σp > 0) from the Generator ``rng``, in random order."""
    u = np.sort(rng.random(m))
    idx = np.empty(m, np.int64)
    sample_proportional(p, u, idx)
    return rng.permutation(idx)


@njit(nogil=True, cache=True)
def greedy_plusplus(X, w, first, u, tol, chosen):
    """Greedy k-means++ (Arthur & Vassilvitskii 2007; the greedy trials as scikit-learn) over a weighted set
    held in memory, all k steps in one call: step j draws ``trials`` rows ∝ w·D² (D² = squared distance to
    the nearest chosen row), scores each by the potential Σ w·min(D², d²(·, trial)) it would leave and keeps
    the lowest (the first on ties). k-means|| reclusters its few thousand candidates with it: as engine
    calls, one round trip per centre cost more than the arithmetic.

    X      : IN  float64 (M, D) the rows;   w : IN float64 (M,) their weights, > 0
    first  : IN  int the first centre's row
    u      : IN  float64 (k − 1, trials) uniforms in [0, 1): step j's draws are u[j − 1]
    tol    : IN  float relative rounding bound of the GEMM form (``distance.gemm_tolerance``)
    chosen : OUT int64 (k,) the rows chosen, in order
    Returns the distance evaluations (each step, every row with mass against each trial).
    Distances use the GEMM form ||x||² − 2 x·y + ||y||² in float64, taken as 0 where that is within its
    rounding error (``tol``, relative to ||x||² + ||y||²) of 0, so a chosen row's duplicates carry no mass.
    """
    M, D = X.shape
    trials = u.shape[1]
    xx = np.empty(M)
    mind = np.empty(M)
    for i in range(M):
        xx[i] = sqnorm(X, i)
        mind[i] = sqdist(X, i, X, first)
    chosen[0] = first
    # the rows with mass (D² > 0), compacted: a chosen row and its duplicates never gain any, and by the
    # end of a recluster at large k they are 40 % of the rows; XT is a contiguous operand of the product
    # (1.4x as fast as X.T), and fits the cache sooner as it shrinks
    act = np.arange(M)
    n = M
    XT, wa, xa, ma, G = _compact(X, w, xx, mind, act, n, trials)
    cum = np.empty(M)
    cand = np.empty(trials, np.int64)
    Y = np.empty((trials, D))
    yy = np.empty(trials)
    evals = M
    for j in range(1, chosen.shape[0]):
        total = 0.0
        for a in range(n):
            total += wa[a] * ma[a]
            cum[a] = total
        if not total > 0.0:  # every row coincides with a chosen one: only duplicates are left
            chosen[j] = min(M - 1, int(u[j - 1, 0] * M))
            continue
        for t in range(trials):  # the first row whose cumulative mass passes the target has mass > 0
            cand[t] = min(np.searchsorted(cum[:n], u[j - 1, t] * total, side="right"), n - 1)
            s = 0.0
            for q in range(D):
                Y[t, q] = XT[q, cand[t]]
                s += Y[t, q] * Y[t, q]
            yy[t] = s
        np.dot(Y, XT, G)
        evals += trials * n
        best = _lowest_potential(wa, ma, xa, yy, tol, G)
        chosen[j] = act[cand[best]]
        spent = 0
        for a in range(n):
            ma[a] = min(ma[a], G[best, a])
            spent += ma[a] == 0.0
        if 8 * spent >= n:
            for a in range(n):
                mind[act[a]] = ma[a]
            kept = 0
            for a in range(n):
                if ma[a] > 0.0:
                    act[kept] = act[a]
                    kept += 1
            n = kept
            XT, wa, xa, ma, G = _compact(X, w, xx, mind, act, n, trials)
    return evals


@njit(nogil=True, cache=True)
def _compact(X, w, xx, mind, act, n, trials):
    """greedy_plusplus's working arrays for the rows act[:n]: Xᵀ (D × n, contiguous), their w, ||x||², D²,
    and the trials' product (trials × n)."""
    XT = np.empty((X.shape[1], n))
    wa, xa, ma = np.empty(n), np.empty(n), np.empty(n)
    for a in range(n):
        i = act[a]
        for q in range(X.shape[1]):
            XT[q, a] = X[i, q]
        wa[a], xa[a], ma[a] = w[i], xx[i], mind[i]
    return XT, wa, xa, ma, np.empty((trials, n))


@njit(nogil=True, cache=True, fastmath={"reassoc"})
def _lowest_potential(w, mind, xx, yy, tol, G):
    """Turns G (trials × M) of cross products y_t · x_i into the trials' d², ||x||² − 2 x·y + ||y||² and 0
    where that is within its rounding error (``tol`` relative to ||x||² + ||y||²) of 0, so a chosen row's
    duplicates carry no mass; returns the trial whose potential Σ w·min(mind, d²) is the lowest (the first
    on ties). One pass per trial without a branch, so it runs in SIMD lanes: with the contiguous operand of
    the product, greedy_plusplus over vc-GMM's 9,919 candidates at k = 4096 took 1.0-1.2 s instead of the
    1.8-2.2 s of a d² pass with a direct-form fallback, then a second pass for the sums."""
    best, best_pot = 0, np.inf
    for t in range(G.shape[0]):
        pot = 0.0
        for i in range(w.shape[0]):
            d = xx[i] - 2.0 * G[t, i] + yy[t]
            d = d if d > tol * (xx[i] + yy[t]) else 0.0
            G[t, i] = d
            pot += w[i] * min(mind[i], d)
        if pot < best_pot:
            best, best_pot = t, pot
    return best


@njit(nogil=True, cache=True, inline="always")
def _row_in_stratum(salt, r, g, stratum, n_rows):
    """The row draw r lands on, uniform over its stratum g (53 random bits scaled: a bias below n / 2^53)."""
    size = min(stratum, n_rows - g * stratum)
    _, z = splitmix(row_state(salt, r))
    return g * stratum + min(np.int64((z >> np.uint64(11)) * 2.0**-53 * size), size - 1)


@njit(nogil=True, cache=True)
def drawn_rows(labels, key, salt, cum, stratum, n_rows, out):
    """out[t] = the row drawn under label labels[t] in a window of draws.

    A window's M = cum[-1] draws are laid out by stratum (rows [g·stratum, (g+1)·stratum)): positions
    cum[g]..cum[g+1] fall in stratum g, each uniform within it; a draw's label is its position's image in
    the permutation ``unpermute`` inverts (keyed by ``key``), so label → position is ``permute``.

    labels : IN int64 (m,) in [0, M);  key, salt : IN uint64;  cum : IN int64 (G+1,) cumulative draws
    out    : OUT int64 (m,) global rows
    """
    m_total = cum[cum.shape[0] - 1]
    for t in range(labels.shape[0]):
        r = permute(labels[t], m_total, key)
        g = np.searchsorted(cum, r, side="right") - 1
        out[t] = _row_in_stratum(salt, r, g, stratum, n_rows)


@njit(nogil=True, cache=True)
def chunk_draws(key, salt, cum, stratum, n_rows, start, stop, lo, hi, rows, labels):
    """The draws of a window (``drawn_rows``) that land in rows [start, stop) with a label in [lo, hi): only
    the strata overlapping the rows are walked, so a chunk costs its own share of the draws. Returns their
    count c; rows[:c] (relative to start) and labels[:c] hold them, in position order.

    rows, labels : OUT int64, at least the draws of the strata overlapping [start, stop)
    """
    m_total = cum[cum.shape[0] - 1]
    c = 0
    for g in range(start // stratum, (stop - 1) // stratum + 1):
        for r in range(cum[g], cum[g + 1]):
            row = _row_in_stratum(salt, r, g, stratum, n_rows)
            if start <= row < stop:
                label = unpermute(r, m_total, key)
                if lo <= label < hi:
                    rows[c] = row - start
                    labels[c] = label
                    c += 1
    return c
