"""dask_clust settings, kept in ``dask.config`` under ``dask_clust.*`` so users set them the Dask way:
``dask.config.set({"dask_clust.split-every": 4})`` or a YAML file / environment variable
(``DASK_DASK_CLUST__CHUNK_BYTES=64MiB``)."""
import dask
from dask.utils import parse_bytes

DEFAULTS = {
    # row chunks: target size, and the bounds within which a dask input's own chunks are kept
    "chunk-bytes": "128MiB",
    "min-chunk-bytes": "4MiB",
    "max-chunk-bytes": "256MiB",
    # a default chunking gives at least this many chunks, so small data still uses every thread
    "min-chunks": 16,
    # rows per chunk of a working set (a coreset) held in-process: chunks are the unit of threading,
    # and this fixed size keeps the model independent of the machine (rule 5)
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
    # rule 1: the driver owns a model up to this size; a larger one lives sharded on the workers
    # (``Engine.sharded``) and is gathered only at the end
    "model-bytes": "512MiB",
    # how long to wait for the scheduler to confirm a lost worker after a communication error
    "lost-worker-timeout": "10s",
}


def get(key):
    value = dask.config.get(f"dask_clust.{key}", DEFAULTS[key])
    return value


def get_bytes(key):
    return parse_bytes(get(key))
