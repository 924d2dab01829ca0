"""How many steps' batches a stochastic method gathers in one round trip: a batch's arithmetic costs far
less than a round trip, so several steps' rows come in one ``engine.take`` (minibatch, SBE).

The count depends on the parameters only (never the dtype, the chunking or the cluster), so a method whose
batches are keyed by block draws the same rows everywhere.
"""
import numpy as np

# bytes of float32 rows one gather brings at most, and the most steps it serves
GATHER_BYTES = 8 << 20
MOST_STEPS = 64


def steps_per_gather(rows_per_step, n_features):
    """Steps whose rows fit GATHER_BYTES as float32, 1 to MOST_STEPS."""
    return int(np.clip(GATHER_BYTES // (rows_per_step * n_features * 4), 1, MOST_STEPS))
