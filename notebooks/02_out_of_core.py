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
# # Out of core: zarr and parquet in, labels out, a table round trip
#
# dask_clust never needs the data in the driver's memory. This notebook
#
# 1. generates a lazy dask array in several chunks per worker (no chunk is built until a worker needs it);
# 2. writes it to a zarr array and to a parquet dataset (through `dask.dataframe`);
# 3. fits k-means from each **path** (dask_clust opens `.npy`, zarr and parquet paths itself), and once
#    more streaming the rows from zarr on every pass instead of holding them in worker memory;
# 4. writes the labels back to zarr and to parquet, reads them back and checks them against
#    `model.predict`;
# 5. checks that the fits agree as far as dask_clust guarantees they should;
# 6. fits the feature columns of a table with a key and writes each label back beside its key.
#
# Everything is written to a temporary directory that is removed at the end.

# %% tags=["parameters"]
n_rows = 32_000  # rows of synthetic data
n_features = 4
n_clusters = 5
n_chunks = 8  # row chunks of the generated array: several per worker
seed = 0
n_workers = 2

# %%
import os
import tempfile

import dask
import dask.array as da
import dask.dataframe as dd
import numpy as np
from distributed import Client, LocalCluster

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.metrics import quantization_error

workdir = tempfile.TemporaryDirectory(prefix="dask_clust_out_of_core_")
zarr_path = os.path.join(workdir.name, "X.zarr")
parquet_path = os.path.join(workdir.name, "X.parquet")

# %% [markdown]
# ## Chunk sizes
#
# dask_clust chunks every input by its size alone, whatever chunks the input comes with: about
# `dask_clust.chunk-bytes` (128 MiB) per chunk, but at least `dask_clust.min-chunks` chunks of at least
# `dask_clust.min-chunk-bytes`. So a zarr store, a parquet dataset, a `.npy` file and a dask array of the
# same rows are cut at the same rows, and give the same model. This toy array is a few hundred KiB, so we
# ask for chunks of its size here; with real data you would leave the defaults alone. Settings live in
# `dask.config`, so they can also come from a YAML file or an environment variable.

# %%
rows_per_chunk = -(-n_rows // n_chunks)  # ceiling division
chunk_bytes = rows_per_chunk * n_features * np.dtype(np.float32).itemsize
dask.config.set(
    {"dask_clust.chunk-bytes": chunk_bytes, "dask_clust.min-chunk-bytes": "1KiB", "dask_clust.min-chunks": 1}
)
print(f"{n_chunks} chunks of {rows_per_chunk} rows, {chunk_bytes / 1024:.0f} KiB each")

# %%
# worker scratch space (spilled data) goes under our temporary directory too
cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=":0", local_directory=workdir.name)
client = Client(cluster)
print("dashboard:", client.dashboard_link)

# %% [markdown]
# ## Lazy data, written to zarr and parquet
#
# Both writes run on the workers, chunk by chunk: the driver only builds the task graph.

# %%
X, y_true = make_blobs(n_rows, n_features, n_clusters, chunks=rows_per_chunk, random_state=seed)
assert X.numblocks[0] == n_chunks > n_workers
X

# %%
X.to_zarr(zarr_path)

# one parquet file per dask partition, i.e. per row chunk of X; the index is just the row number, which
# the row order already says, so it is not written
columns = [f"x{j}" for j in range(n_features)]
dd.from_dask_array(X, columns=columns).to_parquet(parquet_path, write_index=False)

for path in (zarr_path, parquet_path):
    print(os.path.basename(path), sorted(os.listdir(path)))

# %% [markdown]
# ## Fit from the paths
#
# A path is opened on the driver (metadata only); each worker then reads its own chunks.

# %%
model_zarr = dask_clust.fit(zarr_path, algo="kmeans", n_clusters=n_clusters, random_state=seed, client=client)
model_parquet = dask_clust.fit(parquet_path, algo="kmeans", n_clusters=n_clusters, random_state=seed, client=client)
for name, m in [("zarr", model_zarr), ("parquet", model_parquet)]:
    print(f"{name:8s} {m!r}\n         {m.engine_}")
    # every worker held a share of the chunks
    assert m.engine_["workers"] == n_workers and m.engine_["chunks"] == n_chunks

# %% [markdown]
# ### Streaming: out of core on the workers too
#
# By default (`dask_clust.stream = "auto"`) the workers keep their chunks in memory between passes, unless
# the data would take more than half of the cluster's memory; then every pass re-reads the chunks from
# their source. Forcing it here shows that mode on small data: it costs a read per pass and gives the same
# model.

# %%
with dask.config.set({"dask_clust.stream": True}):
    model_streamed = dask_clust.fit(zarr_path, algo="kmeans", n_clusters=n_clusters, random_state=seed, client=client)
print(model_streamed.engine_)
assert model_streamed.engine_["streaming"] and not model_zarr.engine_["streaming"]
np.testing.assert_array_equal(model_streamed.cluster_centers_, model_zarr.cluster_centers_)

# %% [markdown]
# ## Do the two sources give the same model?
#
# dask_clust's guarantee: **the same `random_state` and the same row chunking give a bit-identical model**,
# on any number of workers. Each chunk draws its random numbers (seeding, mini-batches) from its own
# stream, and partial sums are combined exactly, so the chunk boundaries are part of the "input", while
# the number of workers and the order in which partials arrive are not. Since the chunking follows the
# data's size and not its source, zarr and parquet give the same chunks here, even though the parquet
# dataset was read with its own partitioning, hence bit-identical centres.

# %%
parquet_chunks = dd.read_parquet(parquet_path).to_dask_array(lengths=True).chunks[0]
print("parquet's own partitions:", parquet_chunks)

qe_zarr = quantization_error(zarr_path, model_zarr.cluster_centers_)
qe_parquet = quantization_error(parquet_path, model_parquet.cluster_centers_)
print(f"QE from zarr {qe_zarr:.10g}, from parquet {qe_parquet:.10g}")
np.testing.assert_array_equal(model_zarr.cluster_centers_, model_parquet.cluster_centers_)
assert model_zarr.n_iter_ == model_parquet.n_iter_ and qe_zarr == qe_parquet
print("same rows: bit-identical models")

# %% [markdown]
# ### Sanity checks
#
# The QE must be finite and far below that of `n_clusters` random rows used as centres.

# %%
rng = np.random.default_rng(seed)
random_centres = X[np.sort(rng.choice(n_rows, n_clusters, replace=False))].compute().astype(np.float64)
qe_random = quantization_error(X, random_centres)
print(f"QE {qe_zarr:.6g}; with random rows as centres {qe_random:.6g}")
assert np.isfinite(qe_zarr) and qe_zarr < qe_random
# the data on disk is the data we generated
assert np.isclose(quantization_error(X, model_zarr.cluster_centers_), qe_zarr, rtol=1e-12)

# %% [markdown]
# ## Labels back out
#
# `predict` on a path is lazy too: writing its result streams the labels chunk by chunk from the source to
# the output, on the workers.

# %%
labels_zarr_path = os.path.join(workdir.name, "labels.zarr")
labels_parquet_path = os.path.join(workdir.name, "labels.parquet")

labels = model_zarr.predict(zarr_path)  # lazy int32, one label per row
labels.to_zarr(labels_zarr_path)
dd.from_dask_array(labels, columns="label").to_frame().to_parquet(labels_parquet_path, write_index=False)

# %% [markdown]
# Read both back and compare them with the labels computed directly (small enough to hold here).

# %%
expected = labels.compute()
from_zarr = da.from_zarr(labels_zarr_path).compute()
from_parquet = dd.read_parquet(labels_parquet_path)["label"].compute().to_numpy()

assert expected.shape == from_zarr.shape == from_parquet.shape == (n_rows,)
np.testing.assert_array_equal(from_zarr, expected)
np.testing.assert_array_equal(from_parquet, expected)
# the parquet model is the zarr model, so it labels the parquet rows the same way
np.testing.assert_array_equal(model_parquet.predict(parquet_path).compute(), expected)
print("label counts per cluster:", np.bincount(expected, minlength=n_clusters))

# %% [markdown]
# ## An ETL round trip: a table with a key
#
# A real table holds more than features: here an `id` key and a string `source` column beside the same
# rows. `columns=` fits the features alone (the model records them as `feature_names_in_`), and
# `predict` of a dask DataFrame is a dask Series on that frame's partitions and index, so the labels go
# back beside the key with `assign`, on the workers. From a shell: `dask-clust fit table/ --columns
# x0,x1,x2,x3 ...` and `dask-clust predict model/ table/ --keep id --out labels.parquet`.

# %%
table_path = os.path.join(workdir.name, "table.parquet")
table = dd.from_dask_array(X, columns=columns).reset_index().rename(columns={"index": "id"})
table["source"] = "sensor-" + (table["id"] % 3).astype(str)
table.to_parquet(table_path, write_index=False)

events = dd.read_parquet(table_path)
model_table = dask_clust.fit(
    events, algo="kmeans", n_clusters=n_clusters, random_state=seed, client=client, columns=columns
)
print(model_table.feature_names_in_)
events[["id"]].assign(cluster=model_table.predict(events[columns])).to_parquet(
    os.path.join(workdir.name, "clusters.parquet")
)

# %% [markdown]
# The same rows in the same chunks: the parquet model again, and each label beside its row's key.

# %%
np.testing.assert_array_equal(model_table.cluster_centers_, model_parquet.cluster_centers_)
back = dd.read_parquet(os.path.join(workdir.name, "clusters.parquet")).compute().sort_values("id")
np.testing.assert_array_equal(back["id"].to_numpy(), np.arange(n_rows))
np.testing.assert_array_equal(back["cluster"].to_numpy(), expected)
back.head()

# %% [markdown]
# ## Clean up

# %%
client.close()
cluster.close()
workdir.cleanup()
assert not os.path.exists(workdir.name)
