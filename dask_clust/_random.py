"""Random streams (ARCHITECTURE.md, rule 5): a fit's draws depend on its ``random_state`` and on what each draw is
for, never on the worker count, the chunk placement or the thread that runs it.

- ``stream(entropy, *tag)``: a numpy Generator for the driver and for each chunk (the callers put the chunk
  index in the tag), spawned from the fit's SeedSequence by the tag;
- ``splitmix`` / ``row_state``: counter-based bits for the numba kernels, SplitMix64 (Steele, Lea & Flood,
  "Fast splittable pseudorandom number generators", OOPSLA 2014) keyed by (seed, global row), so a row's
  draws do not depend on how the rows are chunked (vc-GMM's K^(n) and search spaces, nmbatch's nesting
  order);
- ``permute`` / ``unpermute``: a keyed pseudo-random permutation of [0, n) and its inverse, computed one
  element at a time (nmbatch's nesting order, the labels of the stochastic methods' held draws).
"""

import zlib

import numpy as np
from numba import njit

from .errors import InputError


def check_random_state(random_state):
    """The root entropy of a fit: an int, a SeedSequence, or None (fresh entropy)."""
    if random_state is None:
        return np.random.SeedSequence().entropy
    if isinstance(random_state, np.random.SeedSequence):
        return random_state.entropy
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        if random_state < 0:
            raise InputError(f"random_state must be a non-negative int, None or a SeedSequence; got {random_state}")
        return int(random_state)
    raise InputError(
        f"random_state must be a non-negative int, None or a numpy SeedSequence; got {type(random_state).__name__}"
    )


def tag_key(tag):
    """Stable integer spawn-key elements for a tag such as ("kmeans++", 3)."""
    return tuple(t if isinstance(t, (int, np.integer)) else zlib.crc32(str(t).encode()) for t in tag)


def stream(entropy, *tag):
    """A Generator that depends only on the fit's entropy and the tag (chunk index included by callers)."""
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=tag_key(tag)))


# ---------------------------------------------------------------- per-row bits for the kernels

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


@njit(nogil=True, cache=True, inline="always")
def _round_key(right, key, r):
    _, z = splitmix(key ^ (right * GOLDEN + np.uint64(r)))
    return z


@njit(nogil=True, cache=True, inline="always")
def _halves(n):
    """Bits per half of the smallest even power of 2 >= n, and the mask of a half."""
    bits = 2
    while (1 << bits) < n:
        bits += 2
    half = np.uint64(bits // 2)
    return half, (np.uint64(1) << half) - np.uint64(1)


@njit(nogil=True, cache=True, inline="always")
def _feistel(x, half, mask, key):
    """Four Feistel rounds on a 2·half-bit integer: a bijection of [0, 2^(2·half))."""
    left = x >> half
    right = x & mask
    for r in range(4):
        left, right = right, left ^ (_round_key(right, key, r) & mask)
    return (left << half) | right


@njit(nogil=True, cache=True, inline="always")
def _feistel_back(y, half, mask, key):
    """The inverse of ``_feistel``: its rounds undone last first."""
    left = y >> half
    right = y & mask
    for r in range(3, -1, -1):
        left, right = right ^ (_round_key(left, key, r) & mask), left
    return (left << half) | right


@njit(nogil=True, cache=True, inline="always")
def permute(x, n, key):
    """The image of x in a pseudo-random permutation of [0, n) keyed by ``key``: a Feistel network on the
    smallest even power of 2 >= n, walked along its cycle until it lands inside [0, n) (Black & Rogaway's
    cycle walking), so one element costs a few hashes and nothing of size n exists."""
    half, mask = _halves(n)
    y = _feistel(np.uint64(x), half, mask, np.uint64(key))
    while y >= np.uint64(n):
        y = _feistel(y, half, mask, np.uint64(key))
    return np.int64(y)


@njit(nogil=True, cache=True, inline="always")
def unpermute(y, n, key):
    """The x with ``permute(x, n, key) == y``: the cycle walked backwards."""
    half, mask = _halves(n)
    x = _feistel_back(np.uint64(y), half, mask, np.uint64(key))
    while x >= np.uint64(n):
        x = _feistel_back(x, half, mask, np.uint64(key))
    return np.int64(x)
