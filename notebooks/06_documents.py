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
# # Documents as sparse rows: k-means on TF-IDF
#
# Documents arrive as TF-IDF vectors: tens of thousands of columns, a few hundred non-zeros per row. Densified,
# 100,000 documents over a 50,000-term vocabulary would take 20 GB; as a scipy CSR matrix they take a few
# hundred MB. `dask_clust.fit` takes the CSR matrix as it is: each chunk keeps its rows as CSR, and a row's
# distance to a (dense) centre costs O(its non-zeros), not O(D).
#
# Here, on documents made in code from a topic model (`dask_clust.datasets.make_documents`: a Zipf vocabulary,
# each topic favouring a few hundred terms):
#
# 1. the matrix, and what it would cost dense;
# 2. k-means on it (Euclidean on TF-IDF rows of unit norm, and `metric="cosine"`), and mini-batch k-means
#    (batches of CSR rows), against the true topics;
# 3. each cluster's top terms, read from its centre.

# %% tags=["parameters"]
n_documents = 20_000
n_terms = 20_000
n_topics = 40
seed = 0

# %%
import matplotlib.pyplot as plt
import numpy as np

import dask_clust
from dask_clust.datasets import make_documents
from dask_clust.metrics import nmi

X, topic = make_documents(n_documents, n_terms, n_topics, random_state=seed)
csr_mb = (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 1e6
print(f"{X.shape[0]:,} documents x {X.shape[1]:,} terms, {X.nnz:,} non-zeros ({100 * X.nnz / np.prod(X.shape):.2f} %)")
print(f"CSR: {csr_mb:.0f} MB; dense float32: {np.prod(X.shape) * 4 / 1e6:,.0f} MB")

# %% [markdown]
# ## k-means on the CSR matrix
#
# TF-IDF rows have unit norm, so Euclidean k-means and spherical k-means (`metric="cosine"`) assign alike; the
# difference is in the centres, which spherical k-means keeps on the unit sphere. Mini-batch k-means reads
# batches of 1,024 CSR rows. All find the topics. On sparse rows the default seeding (`init="auto"`) is
# k-means++, whose seeds end better on documents than k-means||'s.

# %%
fits = {
    "euclidean": dask_clust.fit(X, "kmeans", n_topics, random_state=seed),
    "cosine": dask_clust.fit(X, "kmeans", n_topics, metric="cosine", random_state=seed),
    "minibatch": dask_clust.fit(X, "minibatch", n_topics, random_state=seed),
}
for name, model in fits.items():
    labels = np.asarray(model.predict(X))
    print(f"{name:9s} NMI against the topics {nmi(topic, labels):.3f}, {model.n_iter_} iterations")

fig, ax = plt.subplots(1, 1, figsize=(7, 3.5))
sizes = np.bincount(np.asarray(fits["cosine"].predict(X)), minlength=n_topics)
ax.bar(np.arange(n_topics), np.sort(sizes)[::-1])
ax.set(xlabel="cluster (by size)", ylabel="documents", title="cluster sizes: the topics' Zipf sizes")
plt.show()

# %% [markdown]
# ## What each cluster is about
#
# A centre's largest weights are the terms its documents share. With a real vocabulary these would be words;
# here they are term numbers, and each cluster's top terms are (mostly) one topic's favoured ones.

# %%
centres = fits["cosine"].cluster_centers_
for j in np.argsort(sizes)[::-1][:5]:
    top = np.argsort(centres[j])[::-1][:8]
    print(f"cluster {j:2d} ({sizes[j]:5d} documents): terms {top.tolist()}")
