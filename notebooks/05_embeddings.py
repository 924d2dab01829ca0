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
# # Embeddings by cosine: spherical k-means and vc-GMM on the sphere
#
# Sentence, image or user embeddings are compared by cosine similarity: what matters is a vector's direction,
# not its length. `metric="cosine"` clusters that way (spherical k-means, Dhillon & Modha, Machine Learning
# 2001): every row is divided by its norm as it is read, a row goes to the centre of largest cosine, and each
# centre is its cluster's mean direction on the unit sphere. The objective is Σ (1 − cos).
#
# Here, on embedding-like vectors made in code (a mixture of von Mises–Fisher components, the sphere's
# Gaussian: `dask_clust.datasets.make_embeddings`):
#
# 1. why normalising the rows first and running Euclidean k-means is not the same thing;
# 2. spherical k-means, nested mini-batch k-means and vc-GMM with `metric="cosine"`, against the true components;
# 3. what the model reads: the direction of a row, whatever its length.

# %% tags=["parameters"]
n_rows = 60_000
n_features = 128
n_clusters = 100
seed = 0

# %%
import matplotlib.pyplot as plt
import numpy as np

import dask_clust
from dask_clust.datasets import make_embeddings
from dask_clust.metrics import nmi

X, truth = make_embeddings(n_rows, n_features, n_clusters, kappa=(60.0, 200.0), random_state=seed)
X, truth = X.compute(), truth.compute()
# embeddings arrive with lengths of their own: the model must not care
lengths = np.random.default_rng(seed).lognormal(0.0, 0.5, n_rows).astype(np.float32)
X = X * lengths[:, None]
sizes = np.bincount(truth, minlength=n_clusters)
print(f"{n_rows:,} rows of {n_features} features; component sizes from {sizes.min()} to {sizes.max()} rows")

# %% [markdown]
# ## Cosine, not Euclidean
#
# Euclidean k-means on these rows groups them by length as much as by direction. Normalising the rows first
# helps, but its centres fall inside the sphere; `metric="cosine"` keeps them on it and assigns by cosine.

# %%
euclid = dask_clust.fit(X, "kmeans", n_clusters, random_state=seed)
spherical = dask_clust.fit(X, "kmeans", n_clusters, metric="cosine", random_state=seed)
for name, model in (("Euclidean k-means", euclid), ("spherical k-means", spherical)):
    labels = np.asarray(model.predict(X))
    print(f"{name:18s} NMI against the components {nmi(truth, labels):.3f}")
print("centre norms (spherical):", np.round(np.linalg.norm(spherical.cluster_centers_, axis=1)[:5], 6))
print(f"objective_ Σ(1 − cos) = {spherical.objective_:.1f}")

# %% [markdown]
# ## Three algorithms on the sphere
#
# Nested mini-batch k-means keeps its distance bounds as they are on the sphere (they need only the triangle
# inequality and each centre's actual move); vc-GMM runs its truncated EM on the unit rows and puts its
# means back on the sphere after every M-step. The plot: each fit's objective against its iterations.

# %%
fits = {
    "kmeans": spherical,
    "nmbatch": dask_clust.fit(X, "nmbatch", n_clusters, metric="cosine", random_state=seed),
    "vcgmm": dask_clust.fit(X, "vcgmm", n_clusters, metric="cosine", random_state=seed),
}
fig, ax = plt.subplots(1, 1, figsize=(7, 3.5))
for name, model in fits.items():
    labels = np.asarray(model.predict(X))
    print(f"{name:8s} Σ(1 − cos) {model.objective_:9.1f}   NMI {nmi(truth, labels):.3f}   {model.n_iter_} iterations")
    if name != "vcgmm":  # vc-GMM's history is its free energy, not Σ(1 − cos)
        ax.plot([h["objective"] for h in model.history_], label=name)
ax.set(xlabel="iteration", ylabel="objective (mean 1 − cos for nmbatch)", yscale="log")
ax.legend()
plt.show()

# %% [markdown]
# ## What the model reads
#
# A saved spherical model normalises what it predicts, as its fit did: a row and the same row ten times as long
# get the same cluster, and vc-GMM's posteriors are the same too. A row of zero norm has no direction and is
# refused by its number.

# %%
model = fits["vcgmm"]
few = X[:5]
print(np.asarray(model.predict(few)), np.asarray(model.predict(10 * few)))
ids, p = model.predict_proba(few)
ids10, p10 = model.predict_proba(10 * few)
print("posteriors equal:", np.allclose(np.asarray(p), np.asarray(p10)))
bad = X[:3].copy()
bad[1] = 0
try:
    np.asarray(model.predict(bad))
except ValueError as err:
    print("refused:", err)
