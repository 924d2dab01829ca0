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
# so there one gather brings as many steps as the least of these holds, however many that is: bytes the driver
# holds (O(this) whatever N), and a share of the smallest worker's memory, since the gathered rows meet at the
# root partition's worker on their way (a quarter of a 700 MiB worker's limit took it past its limit, next to
# the chunks it keeps up to ``streaming.KEEP_FRACTION``)
STREAMED_GATHER_BYTES = 256 << 20
STREAMED_GATHER_SHARE = 0.05


def steps_per_gather(engine, rows_per_step, last):
    """Steps one gather serves, at most ``last`` (the steps left): GATHER_BYTES of float32 rows and at most
    MOST_STEPS in memory; on a streamed input, STREAMED_GATHER_BYTES or STREAMED_GATHER_SHARE of the smallest
    worker's memory, whichever is less; at least 1."""
    step_bytes = rows_per_step * engine.n_features * 4
    if engine.streaming:
        memory = min(m for _, m in engine.partitions())
        budget = min(STREAMED_GATHER_BYTES, int(STREAMED_GATHER_SHARE * memory))
        return int(np.clip(budget // step_bytes, 1, max(last, 1)))
    return int(np.clip(GATHER_BYTES // step_bytes, 1, min(MOST_STEPS, max(last, 1))))
