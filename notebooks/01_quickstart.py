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
# # dask_clust quick start
#
# One k-means fit on a Dask `LocalCluster`, from start to finish:
#
# 1. start a 2-worker cluster and a client (the dashboard link shows what the workers are doing);
# 2. generate blobs lazily with `dask_clust.datasets.make_blobs`;
# 3. fit `algo="kmeans"`, predict labels (lazily), score the model;
# 4. plot the centres over the data, and the objective per iteration from `model.history_`;
# 5. close the client and the cluster.
#
# The data is tiny so that the notebook runs in seconds; the same code runs unchanged on data many times
# larger than a machine's memory, on a real cluster.

# %% tags=["parameters"]
n_rows = 20_000  # rows of synthetic data
n_features = 4  # columns; the plots show the first two
n_clusters = 5  # k, and the number of blobs generated
seed = 0  # one seed for the data, the baseline and the fit
n_workers = 2

# %%
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from distributed import Client, LocalCluster
from matplotlib.ticker import MaxNLocator

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.metrics import quantization_error

# Workers get a scratch directory (for spilled data) under our own temporary directory, so that the
# notebook leaves nothing behind when it is removed at the end.
workdir = tempfile.TemporaryDirectory(prefix="dask_clust_quickstart_")

# %% [markdown]
# ## Start a cluster
#
# One thread per worker process: the numba kernels release the GIL, so on a real machine you would give
# each worker several threads; two single-threaded workers show the distributed path on any laptop.
# `dashboard_address=":0"` picks a free port, so the notebook does not clash with another running cluster.

# %%
cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=":0", local_directory=workdir.name)
client = Client(cluster)
print("dashboard:", client.dashboard_link)

# %% [markdown]
# ## Data
#
# `make_blobs` returns lazy dask arrays: nothing is generated until a worker needs a chunk. About 10 % of
# the rows are uniform background noise (label `-1` in `y_true`).

# %%
X, y_true = make_blobs(n_rows, n_features, n_clusters, random_state=seed)
X

# %% [markdown]
# ## Fit
#
# `client=client` says where to run; with `client=None` dask_clust would use the current client anyway.
# In Jupyter the fit shows a progress bar per phase while it runs (the iterations' with the objective), and
# the model's view summarises the fit beside its objective against the iteration.
# `random_state` makes the fit reproducible: the same seed and chunking give a bit-identical model on one
# worker or many.

# %%
model = dask_clust.fit(X, algo="kmeans", n_clusters=n_clusters, random_state=seed, client=client)
model

# %%
# where the fit ran: backend, workers, threads, row chunks. dask_clust sizes row chunks from the data
# alone (at least 4 MiB each by default), never from the cluster, which is what makes the model
# independent of the number of workers. Data this small is a single chunk, so only one of the two
# workers holds rows here; notebooks/02_out_of_core.py shows data in many chunks.
model.engine_

# %% [markdown]
# ## Predict and score
#
# `predict` returns a lazy dask array of int32 labels, one per row, computed blockwise on the workers when
# you ask for the values.

# %%
labels_lazy = model.predict(X)
print(type(labels_lazy).__name__, labels_lazy.dtype, labels_lazy.shape)
labels = labels_lazy.compute()

# score is the negative quantization error (scikit-learn's convention: higher is better)
score = model.score(X)
qe = -score
print(f"QE = {qe:.6g}  ({qe / n_rows:.4g} per row)")

# %% [markdown]
# ### Sanity checks
#
# A baseline to beat: the QE of `n_clusters` rows picked at random as centres. Any working k-means must do
# much better than that; these asserts make the notebook fail loudly if the library is broken.

# %%
rng = np.random.default_rng(seed)
random_rows = np.sort(rng.choice(n_rows, n_clusters, replace=False))
random_centres = X[random_rows].compute().astype(np.float64)
qe_random = quantization_error(X, random_centres)
print(f"QE of {n_clusters} random rows as centres: {qe_random:.6g}")

assert labels.shape == (n_rows,)
assert labels.min() >= 0 and labels.max() < n_clusters
assert model.cluster_centers_.shape == (n_clusters, n_features)
assert np.isfinite(qe) and qe < qe_random
# for k-means the model's objective is the QE of its centres, the same figure score() recomputes lazily
assert np.isclose(model.objective_, qe, rtol=1e-9)

# %% [markdown]
# ## Centres over the data
#
# The first two features only; colours are the predicted labels.

# %%
X_local = X.compute()  # small enough to plot; never do this with the real data
fig, ax = plt.subplots(figsize=(6, 5))
ax.scatter(X_local[:, 0], X_local[:, 1], c=labels, s=2, cmap="tab10", alpha=0.4)
ax.scatter(
    model.cluster_centers_[:, 0],
    model.cluster_centers_[:, 1],
    c="black",
    marker="x",
    s=120,
    linewidths=3,
    label="cluster centres",
)
ax.set_xlabel("feature 0")
ax.set_ylabel("feature 1")
ax.set_title(f"k-means, k = {n_clusters}")
ax.legend(loc="upper right")
plt.show()

# %% [markdown]
# ## History
#
# One record per iteration. `objective` is the QE of the centres that iteration started from (so the
# first row is the QE of the seeding); `changed` counts rows whose label changed, `center_shift` is how far
# the centres moved.

# %%
history = pd.DataFrame(model.history_)
history

# %%
objective = history["objective"].to_numpy()
# Lloyd iterations never increase the QE (up to rounding)
assert np.all(np.diff(objective) <= 1e-9 * objective[0])
assert model.n_iter_ == len(history)

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(history["iteration"], objective, marker="o")
ax.axhline(qe, color="grey", linestyle="--", label="final QE")
ax.xaxis.set_major_locator(MaxNLocator(integer=True))
ax.set_xlabel("iteration")
ax.set_ylabel("quantization error")
ax.set_title("k-means objective per iteration")
ax.legend()
plt.show()

# %% [markdown]
# ## Clean up
#
# Close the client before the cluster, then remove the temporary directory.

# %%
client.close()
cluster.close()
workdir.cleanup()
