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
# # How many clusters? One sweep over k
#
# `dask_clust.sweep` fits one algorithm for every k of a list on one engine (the data loaded and summarised
# once) and scores each fit by criteria that need no labels, each from a pass or two over the rows that sends
# the driver O(k·D), so they run on data of any size:
#
# - **inertia** Σ ||x − c||² (always falls as k grows: look for the elbow);
# - **Calinski–Harabasz** (between- over within-cluster scatter, higher is better);
# - **Davies–Bouldin** (each cluster's spread against its nearest neighbour's distance, lower is better);
# - **the simplified silhouette** (each row's distances to its nearest and second-nearest centre, higher is
#   better), and the exact **silhouette** of a uniform sample of rows;
# - **BIC** and **AIC** for the mixtures (lower is better).
#
# Here on blobs whose number we know, then on scikit-learn's handwritten digits.

# %% tags=["parameters"]
true_k = 6
ks = [2, 3, 4, 5, 6, 7, 8, 10, 12]
seed = 0

# %%
import time

import matplotlib.pyplot as plt
from sklearn.datasets import make_blobs

import dask_clust

X, _ = make_blobs(20_000, n_features=8, centers=true_k, cluster_std=1.5, center_box=(-20, 20), random_state=seed)
X = X.astype("float32")

# %% [markdown]
# ## k-means over k
#
# `client="in-process"` runs in this process; leave it out to use the current Dask client or a LocalCluster.
# Every k's model is the one `dask_clust.fit(X, "kmeans", k, random_state=seed)` gives.

# %%
t = time.perf_counter()
result = dask_clust.sweep(X, "kmeans", ks, random_state=seed, silhouette_size=2_000, client="in-process")
print(f"{len(ks)} fits and their criteria in {time.perf_counter() - t:.1f} s; picked k = {result.best_k_}")
result.table.round(3)

# %%
axes = result.plot()
plt.tight_layout()

# %% [markdown]
# Every criterion but the inertia has its best at the blobs' number; the inertia's elbow sits there too.
# `result.best_` is the picked k's model.

# %% [markdown]
# ## A mixture's BIC
#
# For a probabilistic fit the sweep adds BIC and AIC (the exact log-likelihood over every component) and picks
# by BIC: the likelihood gained by more components against their parameters.

# %%
mixtures = dask_clust.sweep(X, "vcgmm", ks, random_state=seed, silhouette_size=None, client="in-process")
print(f"vc-GMM by BIC: k = {mixtures.best_k_}")
mixtures.table[["bic", "aic", "calinski_harabasz", "simplified_silhouette"]].round(1)

# %% [markdown]
# ## Real data: handwritten digits
#
# Ten digits need not make ten clusters: some are written in two styles, some alike. The criteria disagree
# more here, which is what they say about data without well-separated groups.

# %%
from dask_clust.datasets import load_digits

digits, _ = load_digits()
found = dask_clust.sweep(digits, "kmeans", [4, 6, 8, 10, 12, 16, 24], random_state=seed, client="in-process")
found.plot(["calinski_harabasz", "davies_bouldin", "simplified_silhouette", "silhouette"])
plt.tight_layout()
found.table.round(3)

# %% [markdown]
# The same question by scikit-learn's `GridSearchCV` over the estimator's `n_clusters` refits from scratch
# for every value and fold and scores by the held-out inertia, which only falls with k; the sweep reads the
# data once and scores by criteria that peak.
