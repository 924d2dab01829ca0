"""dask_clust settings, kept in ``dask.config`` under ``dask_clust.*`` so users set them the Dask way:
``dask.config.set({"dask_clust.split-every": 4})`` or a YAML file / environment variable
(``DASK_DASK_CLUST__CHUNK_BYTES=64MiB``)."""

import dask
from dask.utils import parse_bytes

DEFAULTS = {
    # row chunks: "auto" chunks every input by its size alone (``auto_chunk_rows``), so a .npy file, a
    # parquet dataset, a zarr store and a dask array of the same rows give the same chunks, hence the
    # same model; "input" keeps a dask input's own row chunks when they are within the size bounds
    "chunking": "auto",
    # target size of a chunk, and the bounds within which "input" keeps a dask input's chunks
    "chunk-bytes": "128MiB",
    "min-chunk-bytes": "4MiB",
    "max-chunk-bytes": "256MiB",
    # a default chunking gives at least this many chunks (of at least min-chunk-bytes), so small data
    # still gives every thread work: 2 chunks per thread up to 8 threads. The chunking does not follow
    # the cluster (rule 5: the same model on any number of workers); raise this for larger clusters
    "min-chunks": 16,
    # rows per chunk of a working set (a coreset), at most: chunks are the unit of threading, so a smaller
    # set goes in 4 chunks of at least 8,192 rows (``ops.working_set_rows``); sizes that follow the set
    # alone keep the model independent of the machine (rule 5)
    "working-set-chunk-rows": 32768,
    # threads of an in-process fit or working set (None: every core of this machine)
    "in-process-threads": None,
    # fan-in of the tree that combines per-partition partials
    "split-every": 8,
    # in-memory input up to this size is fitted in-process when no client is running (rule 6)
    "in-process-bytes": "1GiB",
    # rule 4: "auto" streams a dask input from its source on every pass when it exceeds this fraction
    # of the memory that would hold it (the cluster's workers, or this machine in-process)
    "stream": "auto",
    "stream-fraction": 0.5,
    # a streamed fit whose per-row state would take more than stream-fraction of the memory keeps it in local
    # files between calls where its algorithm allows ("auto"); True: always when streamed; False: never
    "state-files": "auto",
    # rule 1: the driver owns a model up to this size; a larger one lives sharded on the workers
    # (``Engine.sharded``) and is gathered only at the end
    "model-bytes": "512MiB",
    # the exact kNN graph (``knn.py``) searches all N rows for every row: it is refused beyond this many
    # multiply-adds N²·D (mnist5k: 2e10; 1e12 is minutes on a few cores) and every partition holds all rows
    "knn-exact-budget": 1e12,
    # how long to wait for the scheduler to confirm a lost worker after a communication error
    "lost-worker-timeout": "10s",
    # a worker of the fit that does not answer the driver within this, asked once a call has run this long
    # (and 10 times the slowest call so far), is restarted (frozen, or cut off) and its partitions rebuilt
    "unresponsive-worker-timeout": "20s",
    # a backed-up per-row state (vc-GMM's K^(n)) lost with every copy of it (all the workers holding them
    # left at once) is made again by replaying its build and every step since: the driver keeps those steps'
    # parameters (model-sized, one set per iteration) up to this size, and past it ends such a fit in one line
    "replay-bytes": "256MiB",
    # where the LocalCluster a fit starts serves its dashboard pages (logs, workers, metrics): this host
    # only by default; e.g. ":8787" serves them on every interface
    "dashboard-address": "127.0.0.1:0",
    # how long to wait for a scheduler given by address (``client="tcp://..."``, ``--scheduler``)
    "connect-timeout": "10s",
    # how long a fit waits for the first worker of a cluster that has none yet (HPC jobs still queued, pods
    # pulling their image), before it ends in one line (``NoWorkers``)
    "first-worker-timeout": "10 minutes",
}


def get(key):
    value = dask.config.get(f"dask_clust.{key}", DEFAULTS[key])
    return value


def get_bytes(key):
    return parse_bytes(get(key))
