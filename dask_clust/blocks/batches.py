"""How many steps' batches a stochastic method gathers in one round trip: a batch's arithmetic costs far
less than a round trip, so several steps' rows come in one ``engine.take`` (minibatch, SBE).

The methods draw each step's batch from a random stream of its own, so the count changes only how the rows
travel, never the model: it may follow the data's dtype, whether the input is streamed and the driver's
budget.
"""

import numpy as np

# bytes of float32 rows one gather brings at most, and the most steps it serves: one step of SBE's defaults is
# 4.3 MB at 108 features, so an 8 MB gather brought one step a round trip (153 trips of ~11 ms for 150 steps
# of ~25 ms on the image patches; 13 trips: 7.2 -> 5.2 s a fit)
GATHER_BYTES = 64 << 20
MOST_STEPS = 64
# a streamed input pays a pass over its store for every gather (a uniform batch touches every stored block),
# so there one gather brings as many steps as this many bytes hold, however many that is; the driver holds
# them, O(this) whatever N
STREAMED_GATHER_BYTES = 256 << 20


def steps_per_gather(engine, rows_per_step, last):
    """Steps one gather serves, at most ``last`` (the steps left): GATHER_BYTES of float32 rows and at most
    MOST_STEPS in memory, STREAMED_GATHER_BYTES on a streamed input; at least 1."""
    step_bytes = rows_per_step * engine.n_features * 4
    if engine.streaming:
        return int(np.clip(STREAMED_GATHER_BYTES // step_bytes, 1, max(last, 1)))
    return int(np.clip(GATHER_BYTES // step_bytes, 1, min(MOST_STEPS, max(last, 1))))
