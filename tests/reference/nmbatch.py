"""Plain-numpy nested mini-batch k-means (Newling & Fleuret 2016, Alg. 5 with Alg. 1's Elkan test) and
Sculley's mini-batch k-means (Alg. 2 + 4), written from the paper's pseudo-code: the oracles of
tests/test_nmbatch.py. Rows are visited in the given nesting order; bounds are exact float64. ``unit``: the
spherical variants (Dhillon & Modha 2001) on rows the caller put on the unit sphere: each centre is its
rows' mean direction, assignment by the largest inner product."""

import numpy as np


def _dist(x, c):
    return float(np.sqrt(((x.astype(np.float64) - c) ** 2).sum()))


def _directions(S):
    return S / np.sqrt((S * S).sum(axis=1))[:, None]


def nmbatch(X, order, centers, b0, rho, max_rounds, mode="paper", unit=False):
    """Returns per round (batch size, energy, changed, distance evaluations) and the final centres. ``unit``:
    the initial centres and c = S/||S|| on the sphere, and the doubling test's spread divided by the mean
    resultant length ||S||/v."""
    N, k = len(X), len(centers)
    c = np.array(centers, dtype=np.float64)
    c = _directions(c) if unit else c
    S, v = np.zeros_like(c), np.zeros(k)
    a = np.zeros(N, int)
    d = np.zeros(N)
    lower = np.zeros((N, k))
    p = np.zeros(k)
    b_old, b = 0, min(b0, N)
    rounds = []
    for _ in range(max_rounds):
        evals = changed = 0
        sse = np.zeros(k)
        for i in order[:b_old]:
            lower[i] -= p
            a0 = a[i]
            d[i] = _dist(X[i], c[a0])
            evals += 1
            for j in range(k):
                if j != a0 and lower[i, j] < d[i]:
                    lower[i, j] = _dist(X[i], c[j])
                    evals += 1
                    if lower[i, j] < d[i]:
                        a[i], d[i] = j, lower[i, j]
            if a[i] != a0:
                S[a0] -= X[i]
                v[a0] -= 1
                S[a[i]] += X[i]
                v[a[i]] += 1
                changed += 1
            sse[a[i]] += d[i] ** 2
        for i in order[b_old:b]:
            lower[i] = [_dist(X[i], c[j]) for j in range(k)]
            evals += k
            a[i] = int(np.argmin(lower[i]))
            d[i] = lower[i, a[i]]
            S[a[i]] += X[i]
            v[a[i]] += 1
            sse[a[i]] += d[i] ** 2
        old = c.copy()
        live = v > 0
        c[live] = _directions(S[live]) if unit else S[live] / v[live, None]
        p = np.sqrt(((c - old) ** 2).sum(axis=1))
        rounds.append((b, sse.sum() / v.sum() / (2 if unit else 1), changed, evals))
        sigma = np.full(k, np.inf)
        for j in range(k):
            if v[j] > 1 and p[j] >= 1e-10:
                spread = sse[j] / (v[j] - 1) if mode == "reference" else sse[j] / (v[j] * (v[j] - 1))
                if unit:
                    spread /= (S[j] @ S[j]) / v[j] ** 2
                sigma[j] = np.sqrt(spread) / p[j]
        joined = b - b_old
        if b == N and joined == 0 and changed == 0:
            break
        b_old = b
        if b < N and sigma.min() > rho:
            b = min(2 * b, N)
    return rounds, c


def minibatch(X, centers, batches, ratio=0.0, picks=None, counts=None, since=0, unit=False):
    """Sculley's update as scikit-learn runs it: each centre's count starts at 0 (its first row replaces its
    seed); each batch is assigned to the centres of its start, then every centre is the mean of all the rows
    it was ever given. With ratio > 0, after a batch that makes 10·k rows since the last check (or follows
    a centre of count 0), centres of count < ratio · the largest move to distinct rows of the batch
    (``picks(step)``'s generator chooses them; at most half the batch, the lightest) and take the smallest
    count of the others. ``unit``: the initial centres on the sphere, each row to the centre of largest inner
    product, and every centre given rows put back on the sphere after the batch. Returns (centres, counts,
    rows since the last check)."""
    c = np.array(centers, dtype=np.float64)
    c = _directions(c) if unit else c
    k = len(c)
    v = np.zeros(k) if counts is None else np.array(counts, dtype=np.float64)
    for step, ids in enumerate(batches):
        x = X[ids].astype(np.float64)
        since += len(x)
        due = ratio > 0 and (since >= 10 * k or (v == 0).any())
        lab = np.argmax(x @ c.T, axis=1) if unit else np.argmin(((x[:, None, :] - c[None]) ** 2).sum(-1), axis=1)
        for i, j in enumerate(lab):  # one row at a time, rate 1/v
            v[j] += 1
            c[j] += (x[i] - c[j]) / v[j]
        if unit:
            got = np.unique(lab)
            c[got] = _directions(c[got])
        if due:
            since = 0
            low = v < ratio * v.max()
            if low.sum() > len(x) // 2:
                low[np.argsort(v, kind="stable")[len(x) // 2 :]] = False
            if low.any():
                c[low] = x[picks(step).choice(len(x), int(low.sum()), replace=False)]
                v[low] = v[~low].min()
    return c, v, since
