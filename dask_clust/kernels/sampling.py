"""Sampling inside one block: draws proportional to a non-negative weight vector."""
import numpy as np
from numba import njit


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
