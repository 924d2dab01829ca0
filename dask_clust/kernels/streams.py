"""Counter-based random bits for the kernels: SplitMix64 (Steele, Lea & Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014) keyed by (seed, global row), so a row's draws do not depend
on how the rows are chunked or which thread runs them (vc-GMM's K^(n) and search spaces, nmbatch's
nesting order)."""
import numpy as np
from numba import njit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(nogil=True, cache=True, inline="always")
def splitmix(state):
    """One step of SplitMix64: (next state, 64 random bits)."""
    state = state + GOLDEN
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@njit(nogil=True, cache=True, inline="always")
def row_state(seed, row):
    """The stream of global row ``row`` under ``seed``."""
    return np.uint64(seed) ^ (np.uint64(row) * GOLDEN)
