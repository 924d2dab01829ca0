"""Random streams (ARCHITECTURE.md, rule 5): a fit's draws depend on its ``random_state`` and on what each draw is
for, never on the worker count, the chunk placement or the thread that runs it.

- ``stream(entropy, *tag)``: a numpy Generator for the driver and for each chunk (the callers put the chunk
  index in the tag), spawned from the fit's SeedSequence by the tag;
- ``splitmix`` / ``row_state``: counter-based bits for the numba kernels, SplitMix64 (Steele, Lea & Flood,
  "Fast splittable pseudorandom number generators", OOPSLA 2014) keyed by (seed, global row), so a row's
  draws do not depend on how the rows are chunked (vc-GMM's K^(n) and search spaces, nmbatch's nesting
  order).
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
