"""Model fingerprints: every registered algorithm (plus each seeder for Lloyd) on one data set, fitted
in-process and on LocalClusters of 1, 2 and 4 single-thread workers; prints the QE and a hash of the
centres' bits per fit. Run it before and after an engine change: equal lines mean equal models.
``--streamed``: the same data also from a zarr store (its chunks not aligned with the fit's), read from it on
every pass with every fit's state in the workers' files where its algorithm allows: lines equal to the
in-memory ones mean that streaming changes no model.

    python benchmarks/bench_model_bits.py [--workers 1,2,4] [--streamed] > before.txt
"""

import argparse
import hashlib
import os
import tempfile

import dask
import numpy as np

import dask_clust
from harness.common import blobs, emit, local_cluster

FITS = (
    [(algo, {}) for algo in sorted(dask_clust.REGISTRY)]
    + [("kmeans", {"init": init}) for init in ("k-means++", "afkmc2", "random")]
    + [("kmeans", {"coreset_size": 4000}), ("vcgmm", {"init": "k-means++"})]
    + [("vcgmm", {"covariance_type": "diag", "weights": "learned"})]
    + [("vcgmm", {"covariance_type": kind, "weights": "learned", "refine": True}) for kind in ("full", "tied")]
)


def fingerprint(model):
    return hashlib.sha256(np.ascontiguousarray(model.cluster_centers_).tobytes()).hexdigest()[:16]


def run(X, client, where):
    for algo, params in FITS:
        m = dask_clust.fit(X, algo=algo, n_clusters=12, random_state=3, client=client, **params)
        emit(
            "model_bits",
            {
                "where": where,
                "algo": algo,
                "params": params,
                "objective": repr(m.objective_),
                "n_iter": m.n_iter_,
                "centers_sha": fingerprint(m),
            },
        )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--streamed", action="store_true", help="also every fit streamed from a zarr store")
    args = p.parse_args()
    X = blobs(40_000, 8, 12, seed=7)[0]
    inputs = [(X, "", {})]
    if args.streamed:
        import dask.array as da

        path = os.path.join(tempfile.mkdtemp(prefix="model-bits-"), "x.zarr")
        da.from_array(X, chunks=(3001, 8)).to_zarr(path)
        inputs.append((path, " streamed", {"dask_clust.stream": True, "dask_clust.state-files": True}))
    # the test suite's chunking: many small chunks, so every multi-chunk path runs
    for data, how, settings in inputs:
        with dask.config.set({"dask_clust.min-chunk-bytes": "1KiB", **settings}):
            run(data, "in-process", "in-process" + how)
            for w in (int(s) for s in args.workers.split(",") if s):
                with local_cluster(w, 1) as client:
                    run(data, client, f"{w} workers{how}")


if __name__ == "__main__":
    main()
