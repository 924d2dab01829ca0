# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Every algorithm on the same data
#
# Fits every algorithm in dask_clust's registry (`dask_clust.REGISTRY`, the same table `fit(algo=...)`,
# the estimator classes and the command line are generated from) on one small blobs data set, with the
# same `n_clusters` and `random_state` and each algorithm's default parameters. For each fit it records
# the wall time and the quantization error (QE, the sum of squared distances of the rows to their
# nearest centre) of the final centres, prints a table, and plots QE against time.
#
# On data this small the times are dominated by fixed costs (a few milliseconds per iteration on a
# cluster), and a single seed can land any of these methods in a local optimum: read the plot as a
# demonstration of the API, not as a benchmark. `benchmarks/` has the real comparisons.

# %% tags=["parameters"]
n_rows = 16_000  # rows of synthetic data
n_features = 4
n_clusters = 6  # k for every algorithm, and the number of blobs generated
n_chunks = 8  # row chunks of the data: several per worker
seed = 0  # the data's and every fit's random_state
n_workers = 2
n_repeats = 2  # fits per algorithm; the time reported is the fastest
in_process = False  # True: fit in this process on all cores, without a cluster

# %%
import tempfile
import time

import dask
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from distributed import Client, LocalCluster
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.metrics import quantization_error

workdir = tempfile.TemporaryDirectory(prefix="dask_clust_algorithms_")

# %% [markdown]
# ## Data and cluster
#
# The same lazy blobs for every fit. The toy chunks are far below dask_clust's default minimum chunk size
# (4 MiB), below which it would merge them into one; lowering the floor keeps `n_chunks` chunks so that
# both workers take part, as they would with real data.

# %%
rows_per_chunk = -(-n_rows // n_chunks)
chunk_bytes = rows_per_chunk * n_features * np.dtype(np.float32).itemsize
dask.config.set({"dask_clust.min-chunk-bytes": min(chunk_bytes // 2, 4 << 20)})

X, y_true = make_blobs(n_rows, n_features, n_clusters, chunks=rows_per_chunk, random_state=seed)

if in_process:
    cluster = None
    client = "in-process"
    X = X.compute()  # in-memory input: what dask_clust fits in-process by itself when no client runs
else:
    # worker scratch space goes under our temporary directory, removed at the end
    cluster = LocalCluster(
        n_workers=n_workers, threads_per_worker=1, dashboard_address=":0", local_directory=workdir.name
    )
    client = Client(cluster)
    print("dashboard:", client.dashboard_link)

# %% [markdown]
# A baseline every algorithm must beat: the QE of `n_clusters` rows picked at random as centres.

# %%
rng = np.random.default_rng(seed)
random_rows = np.sort(rng.choice(n_rows, n_clusters, replace=False))
qe_random = quantization_error(X, np.asarray(X[random_rows], dtype=np.float64))
print(f"QE of {n_clusters} random rows as centres: {qe_random:.6g}")

# %% [markdown]
# ## Fit every registered algorithm
#
# The QE is measured in X's space for every algorithm. SLK is the exception to its centres: it clusters the
# L2-normalised rows and returns modes of that space, so its row scores its partition (each of its clusters
# against the mean of its rows of X), the QE a k-means user would compare.
#
# Each algorithm is fitted `n_repeats` times. The first fit of an algorithm also pays one-time costs (its
# numba kernels are loaded into each worker process), so the time reported is the fastest fit; that every
# repeat gives a bit-identical model is dask_clust's reproducibility guarantee (same seed, same chunks),
# checked here too.

# %%
rows = []
for name, spec in dask_clust.REGISTRY.items():
    times, models = [], []
    for _ in range(n_repeats):
        t0 = time.perf_counter()
        model = dask_clust.fit(X, algo=name, n_clusters=n_clusters, random_state=seed, client=client)
        times.append(time.perf_counter() - t0)
        models.append(model)
    for other in models[1:]:
        np.testing.assert_array_equal(other.cluster_centers_, model.cluster_centers_, err_msg=name)
    # one exact QE for every algorithm, whatever objective it optimised (a GMM's is not the QE)
    centres = model.cluster_centers_
    if model.extras_.get("row_normalization_") == "l2":
        # SLK clusters the L2-normalised rows, and its centres are modes there, not points of X's space:
        # its QE here is that of its partition, each cluster scored against the mean of its rows of X
        labels, Xm = model.labels_, np.asarray(X, dtype=np.float64)
        centres = np.stack([Xm[labels == j].mean(axis=0) for j in np.unique(labels)])
    qe = quantization_error(X, centres)
    rows.append(
        {
            "algo": name,
            "estimator": spec.estimator,
            "n_iter": model.n_iter_,
            "wall_s": min(times),
            "qe": qe,
            "qe_per_row": qe / n_rows,
            "distance_evals": model.n_distance_evals_,
        }
    )
    print(f"{name:10s} {min(times):7.3f} s  QE {qe:.6g}")

results = pd.DataFrame(rows).set_index("algo")

# %% [markdown]
# ### Sanity checks
#
# Every fit must give `n_clusters` finite centres and a QE far below the random baseline.

# %%
assert list(results.index) == list(dask_clust.REGISTRY) and len(results) > 0
assert np.all(np.isfinite(results["qe"])), results["qe"]
assert np.all(results["qe"] < qe_random), results["qe"]

# %% [markdown]
# ## Results

# %%
pd.set_option("display.float_format", "{:.4g}".format)
print(results.sort_values("qe").to_string())

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.scatter(results["wall_s"], results["qe"], s=40, zorder=3)
# several algorithms reach the same optimum in similar times: stagger their labels so all stay readable
for i, (name, row) in enumerate(results.sort_values("wall_s").iterrows()):
    ax.annotate(
        name,
        (row["wall_s"], row["qe"]),
        textcoords="offset points",
        xytext=(6, 6 + 14 * (i % 4)),
        arrowprops={"arrowstyle": "-", "color": "grey", "linewidth": 0.5},
    )
ax.axhline(results["qe"].min(), color="grey", linestyle=":", linewidth=1, label="best QE here")
ax.set_xscale("log")
# ticks at 1, 2 and 5 of each decade, without the minor ones' labels (0.6 0.7 0.8 0.9 1 ran into each other)
ax.xaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
ax.xaxis.set_minor_formatter(NullFormatter())
ax.margins(y=0.3)
ax.set_xlabel("wall time of the fit (s, log scale)")
ax.set_ylabel("quantization error")
ax.set_title(
    f"{n_rows} x {n_features} blobs, k = {n_clusters}, {'in-process' if in_process else f'{n_workers} workers'}"
)
ax.legend(loc="upper right")
plt.show()

# %% [markdown]
# ## Clean up

# %%
if cluster is not None:
    client.close()
    cluster.close()
workdir.cleanup()
