"""How many steps' batches a stochastic method gathers in one round trip: a batch's arithmetic costs far
less than a round trip, so several steps' rows come in one ``engine.take`` (minibatch, SBE).

The count depends on the parameters only (never the dtype, the chunking or the cluster), so a method whose
batches are keyed by block draws the same rows everywhere.
"""

import numpy as np

# bytes of float32 rows one gather brings at most, and the most steps it serves
GATHER_BYTES = 8 << 20
MOST_STEPS = 64
# the budget of a method whose batches are keyed by step, not by gather (SBE): its model does not depend on
# it, and one step of SBE's defaults is 4.3 MB at 108 features, so GATHER_BYTES brought one step a round
# trip (153 trips of ~11 ms for 150 steps of ~25 ms on the image patches; 13 trips: 7.2 -> 5.2 s a fit)
KEYED_GATHER_BYTES = 64 << 20


def steps_per_gather(rows_per_step, n_features, budget=GATHER_BYTES):
    """Steps whose rows fit ``budget`` bytes as float32, 1 to MOST_STEPS."""
    return int(np.clip(budget // (rows_per_step * n_features * 4), 1, MOST_STEPS))
