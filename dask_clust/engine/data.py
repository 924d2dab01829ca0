"""Input normalisation and validation, row chunks.

Everything the caller passes is read, never modified: conversions (integers to float64, float16 to
float32, non-contiguous blocks to contiguous ones) make new arrays.
"""

import os
import re
import warnings

import dask.array as da
import numpy as np

from ..errors import InputError
from ..kernels.assign import is_csr, stacked
from ..outputs import mapped_npy
from . import config

# ---------------------------------------------------------------- sources

# a stored block of a table (a parquet file) is decoded through an arrow table and a pandas frame into numpy:
# three copies of it at once at the peak (``bench_streaming.py --format parquet``: counted as one, 30 MiB
# files on 700 MiB workers peaked 70 MiB over the estimate, at 96 % of the limit)
FRAME_COPIES = 3


class Source:
    """Row-chunked input: what partitions load, and reload after a lost worker (rule 1). Each kind gives
    ``block(i)``: chunk i as (x, w) numpy arrays, computed in this process."""

    def __init__(self, n_samples, n_features, dtype, starts, in_memory):
        self.n_samples = int(n_samples)
        self.n_features = int(n_features)
        self.dtype = np.dtype(dtype)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.in_memory = in_memory

    @property
    def n_chunks(self):
        return len(self.starts) - 1

    @property
    def sparse(self):
        """Whether each chunk holds its rows as a CSR matrix."""
        return False

    @property
    def nbytes(self):
        return self.n_samples * self.n_features * self.dtype.itemsize


class ArraySource(Source):
    """Input already in the driver's memory (numpy, pandas, a memory-mapped .npy).

    path: the .npy file X maps, when it was given as a path: workers that see the same file read their
    chunks from it (``file_block``) instead of receiving them from the driver."""

    def __init__(self, X, weights, starts, ids=None, path=None, unit=False):
        """X: a numpy array, or a scipy CSR matrix (each chunk then a CSR matrix of its rows); unit: each chunk's
        rows divided by their norms as they are loaded (``unit_rows``: metric="cosine")."""
        super().__init__(X.shape[0], X.shape[1], _float_dtype(X.dtype), starts, True)
        self.X = X
        self.weights = weights
        self.ids = ids  # the rows' ids in the input, when X is a reordering of it
        self.path = path
        self.stamp = None if path is None else file_stamp(path)
        self.unit = unit

    @property
    def sparse(self):
        """Whether the rows are a CSR matrix."""
        return is_csr(self.X)

    @property
    def nbytes(self):
        return csr_bytes(self.X) if self.sparse else super().nbytes

    def block(self, i):
        a, b = self.starts[i], self.starts[i + 1]
        x, w = _rows(self.X, a, b, self.dtype, self._weights(i), a if self.unit else None)
        return (x, w) if self.ids is None else (x, w, self.ids[a:b])

    def _weights(self, i):
        a, b = self.starts[i], self.starts[i + 1]
        return None if self.weights is None else np.ascontiguousarray(self.weights[a:b], dtype=np.float64)

    def file_block(self, i):
        """Chunk i as a call that reads it from ``path`` where it runs: (function, args)."""
        return file_rows, (
            self.path,
            self.stamp,
            int(self.starts[i]),
            int(self.starts[i + 1]),
            self.dtype,
            self._weights(i),
            int(self.starts[i]) if self.unit else None,
        )


def file_stamp(path):
    """What tells one file from another at the same path on another machine: (size, modification time)."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def file_rows(path, stamp, a, b, dtype, w, unit_from=None):
    """Rows a:b of the .npy file at path, read where this runs; refuses a file that is not the driver's."""
    if file_stamp(path) != stamp:
        raise InputError(f"{path} on this worker is not the file the fit was started on (size or time differs)")
    return _rows(mapped_npy(path), a, b, dtype, w, unit_from)


def _rows(X, a, b, dtype, w, unit_from=None):
    """Rows a:b in ``dtype`` (a CSR matrix's as a CSR matrix of their own); with ``unit_from`` (their first
    global row, for an error) on the unit sphere."""
    x = X[a:b].astype(dtype) if is_csr(X) else np.ascontiguousarray(X[a:b], dtype=dtype)
    return (x if unit_from is None else unit_rows(x, unit_from)), w


class DaskSource(Source):
    """A dask array (from dask, zarr or parquet): chunks are computed where they are loaded.

    stored: the input's own row blocks (a zarr chunk, a parquet partition; columns joined), in the fit's
    dtype, which X's chunks are cut from: a streamed chunk reads them (``loader``), so that each stored block
    is decoded once per pass however the chunks cut it (the chunking follows the data's size, rule 5)."""

    def __init__(self, X, weights, input_chunk_bytes=0, stored=None, decode_copies=1, row_bytes=None):
        """row_bytes: an average row's (CSR chunks: ``csr_row_bytes``), by default a dense row's."""
        starts = np.concatenate([[0], np.cumsum(X.chunks[0])])
        super().__init__(X.shape[0], X.shape[1], X.dtype, starts, False)
        self.X = X
        self.weights = weights
        # the largest block of the input as given, before any rechunk: computing one of our chunks decodes
        # whole input blocks (a zarr chunk), which a streaming worker holds too
        self.input_chunk_bytes = int(input_chunk_bytes)
        self.stored = X if stored is None else stored
        self.decode_copies = int(decode_copies)  # copies of a stored block its decoding holds at once
        self.stored_starts = np.concatenate([[0], np.cumsum(self.stored.chunks[0])]).astype(np.int64)
        self._graphs = {}  # stored block -> its pickled graph, made once
        self.row_bytes = int(row_bytes or self.n_features * self.dtype.itemsize)

    @property
    def sparse(self):
        return is_csr(self.X._meta)

    @property
    def nbytes(self):
        return self.n_samples * self.row_bytes

    def loader(self, i):
        """Chunk i as a ``ChunkLoader``: its rows' slices of the stored blocks, and its weights' graph."""
        import cloudpickle
        import dask

        def graph(block):  # culled to the one block, as a Delayed: an array's pickle carries far more
            (block,) = dask.optimize(block)
            return cloudpickle.dumps(block.to_delayed().ravel()[0])

        a, b = int(self.starts[i]), int(self.starts[i + 1])
        t = self.stored_starts
        parts = []
        for j in range(int(np.searchsorted(t, a, "right")) - 1, int(np.searchsorted(t, b, "left"))):
            if j not in self._graphs:
                self._graphs[j] = graph(self.stored.blocks[j])
            parts.append((j, self._graphs[j], max(a, t[j]) - t[j], min(b, t[j + 1]) - t[j], t[j + 1] - t[j]))
        weights = None
        if self.weights is not None:
            weights = graph(self.weights.blocks[i])
        return ChunkLoader(tuple(parts), weights, self.row_bytes)

    def delayed_block(self, i):
        """Chunk i as a Delayed (x, w), its graph culled to that chunk (it travels to workers)."""
        import dask

        x = self.X.blocks[i]
        if self.weights is None:
            (x,) = dask.optimize(x)
            return dask.delayed(_pair)(x, None)
        x, w = dask.optimize(x, self.weights.blocks[i])
        return dask.delayed(_pair)(x, w)

    def block(self, i):
        return self.delayed_block(i).compute(scheduler="threads")


class ChunkLoader:
    """What a streamed chunk reads on every pass: ``parts``, its rows as slices of the input's stored blocks,
    each (block key, the block's pickled dask graph, first row, end row, the block's rows); ``weights``, the
    pickled graph of its sample weights, or None; ``row_bytes``, the bytes of one of its rows."""

    __slots__ = ("parts", "w_graph", "row_bytes")

    def __init__(self, parts, weights, row_bytes):
        self.parts = tuple((int(k), g, int(lo), int(hi), int(n)) for k, g, lo, hi, n in parts)
        self.w_graph = weights
        self.row_bytes = int(row_bytes)

    @property
    def keys(self):
        return [p[0] for p in self.parts]

    @property
    def nbytes(self):
        return sum(hi - lo for _, _, lo, hi, _ in self.parts) * self.row_bytes

    def rows(self, cache, prefetch=True, keep=False):
        """The chunk's rows, each stored block taken from ``cache`` (decoded there once per call); then the
        next chunk's blocks read ahead (``prefetch``). ``keep``: a copy that does not hold on to a block the
        chunk uses only part of."""
        pieces = []
        for key, graph, lo, hi, n in self.parts:
            block = cache.block(key, graph)
            pieces.append(block[lo:hi] if not keep or (lo, hi) == (0, n) else block[lo:hi].copy())
        if prefetch:
            cache.read_ahead()
        return pieces[0] if len(pieces) == 1 else stacked(pieces)

    def weights(self, n):
        if self.w_graph is None:
            return np.ones(n)
        return np.ascontiguousarray(run_graph(self.w_graph), dtype=np.float64)


def run_graph(graph):
    """A pickled dask object computed here, in this thread (a streamed chunk's stored block or weights)."""
    import pickle

    return pickle.loads(graph).compute(scheduler="sync")


class FutureSource(Source):
    """Rows already on the cluster, one future of (x, w) or (x, w, input ids) per chunk: a working set drawn
    there, or a reordering."""

    def __init__(self, futures, starts, n_features, dtype, remake=None, like=None):
        """``remake(ids)``: the chunks' futures made again from the rows they came from (after a lost
        worker took them and what they were computed from: scattered rows Dask cannot recompute); ``like``:
        the source the rows came from, whose layout (CSR or dense) and bytes a row they keep."""
        super().__init__(starts[-1], n_features, dtype, starts, False)
        self.futures = futures
        self.remake = remake
        self._sparse = bool(like is not None and like.sparse)
        self._row_bytes = stored_row_bytes(like) if like is not None else None

    @property
    def sparse(self):
        return self._sparse

    @property
    def nbytes(self):
        return super().nbytes if self._row_bytes is None else self.n_samples * self._row_bytes

    def block(self, i):
        return self.futures[i].result()

    def release(self):
        """Let the cluster forget these rows now (the engine over them has closed), not when the driver's
        garbage collector gets to the futures."""
        for f in self.futures:
            f.release()


def _pair(x, w):
    x = x if is_csr(x) else np.ascontiguousarray(x)
    return x, (None if w is None else np.ascontiguousarray(w, dtype=np.float64))


# ---------------------------------------------------------------- normalisation


def _float_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.dtype(np.float32) if dtype.itemsize <= 4 else np.dtype(np.float64)
    return np.dtype(np.float64)


def _check_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        raise InputError(f"Complex data not supported. Input must be numeric (float or integer); got dtype {dtype}")
    if dtype.kind not in "biuf":
        raise InputError(f"Input must be numeric (float or integer); got dtype {dtype}")


def _check_shape(shape):
    if len(shape) != 2:
        raise InputError(
            f"Expected a 2-D array of shape (n_samples, n_features); got an array of shape {tuple(shape)}. "
            "Reshape your data with array.reshape(-1, 1) if it has a single feature or "
            "array.reshape(1, -1) if it is a single sample"
        )
    for n, what in ((shape[0], "sample"), (shape[1], "feature")):
        if n < 1:
            raise InputError(
                f"Found array with 0 {what}(s) (shape={tuple(shape)}) while a minimum of 1 is required: "
                "at least 1 sample and 1 feature are required"
            )


def _dense(X):
    """A numpy array from an in-memory input (object arrays of numbers cast), or a scipy sparse matrix as CSR
    (``_csr``)."""
    if is_sparse_input(X):
        return _csr(X)
    X = np.asarray(X)
    if X.dtype.kind == "O":
        try:
            X = X.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"Input of dtype object must hold only numbers: {exc}") from None
    return X


def _csr(X):
    """A scipy sparse matrix as CSR in canonical form (a row's columns distinct: the kernels read each value
    once): another format converted, with a warning (a copy); a CSR matrix with duplicate entries summed in a
    copy. Nothing passed in is changed."""
    if X.format != "csr":
        warnings.warn(
            f"X is a scipy.sparse {X.format!r} matrix: converted to CSR (a copy), the row layout chunks take",
            UserWarning,
            stacklevel=4,
        )
        X = X.tocsr()
    if not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    return X


def is_sparse_input(X):
    """Whether X is a scipy sparse matrix or array (without importing scipy)."""
    return hasattr(X, "tocsr") or type(X).__module__.startswith("scipy.sparse")


def csr_rows(X, n_features, unit=False):
    """A scipy sparse X read by a fitted model (``predict``, ``transform``, ``score``): canonical CSR
    (``_csr``), ``n_features`` wide, its values finite (else the first bad one named by row and column),
    with ``unit`` on the unit sphere (``unit_rows``)."""
    X = _csr(X)
    if X.shape[1] != n_features:
        raise InputError(f"X has {X.shape[1]} features, but the model was fitted with {n_features} features")
    if unit:
        return unit_rows(X)
    check_finite_csr(X)
    return X


def check_finite_csr(x, start=0):
    """``check_finite_block`` of CSR rows (their stored values; ``start``: the first row's global number)."""
    bad = np.flatnonzero(~np.isfinite(x.data))
    if len(bad):
        row = int(np.searchsorted(x.indptr, bad[0], "right")) - 1
        raise InputError(
            f"Input contains NaN or infinity at row {start + row}, column {int(x.indices[bad[0]])} (from 0)"
        )


def csr_bytes(X):
    """What a CSR matrix holds: its values, their columns and the row pointers."""
    return int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)


def stored_row_bytes(source):
    """The bytes of one row as a source's chunks hold it: D·itemsize, or its CSR rows' average stored bytes
    (what a sample or a copy of its rows costs, not the dense width)."""
    if source.sparse:
        return int(-(-source.nbytes // max(1, source.n_samples)))
    return int(source.n_features * np.dtype(source.dtype).itemsize)


def csr_row_bytes(nnz, n, itemsize):
    """The bytes of an average row of CSR rows: a value and an int32 column per non-zero, an int32 pointer per
    row. What their chunking is sized by: counted from nnz alone (not the index dtypes one storage chose), so
    a CSR matrix and a dask array of the same CSR rows chunk alike."""
    return max(1, -(-(int(nnz) * (int(itemsize) + 4) + 4 * int(n)) // max(1, int(n))))


def auto_chunk_rows(n_samples, n_features, itemsize):
    """Rows per chunk from the data's size alone (not the cluster's), so that the chunking, and with
    it the model (rule 5), is the same on any number of workers: about ``chunk-bytes`` per chunk, but
    at least ``min-chunks`` chunks of at least ``min-chunk-bytes`` each."""
    row_bytes = max(1, n_features * itemsize)
    total = n_samples * row_bytes
    target = config.get_bytes("chunk-bytes")
    floor = config.get_bytes("min-chunk-bytes")
    per_chunk = min(target, max(floor, total // int(config.get("min-chunks"))))
    return int(max(1, min(n_samples, per_chunk // row_bytes)))


def row_starts(n, rows):
    return np.append(np.arange(0, n, rows, dtype=np.int64), np.int64(n))


def open_path(path):
    """A path as the array or DataFrame it holds (a .npy file memory-mapped, zarr and parquet lazily)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"Input path does not exist: {path}")
    if path.endswith(".npy"):
        if not os.path.isfile(path):
            raise InputError(f"Cannot read {path}: not a .npy file (a directory or a special file)")
        with open(path, "rb") as f:
            if f.read(6) != b"\x93NUMPY":  # numpy would read any other file as a pickle and say so
                raise InputError(f"Cannot read {path}: not a .npy file (no NumPy header)")
        try:
            return mapped_npy(path)
        except ValueError as exc:  # an object array (pickled Python objects) cannot be mapped, nor trusted
            raise InputError(f"Cannot read {path}: {exc} (a .npy input must hold a numeric array)") from None
    if _is_parquet(path):
        import dask.dataframe as dd
        import pyarrow

        try:
            return dd.read_parquet(path)
        except (pyarrow.ArrowException, OSError) as exc:  # an empty or truncated file: its footer is missing
            # (the last of the messages dask and arrow wrap around each other names the file and the fault)
            raise InputError(f"Cannot read {path} as a parquet dataset: {str(exc).split(': ')[-1].strip()}") from None
    import zarr

    try:
        node = zarr.open(path, mode="r")
    except Exception as exc:
        raise InputError(
            f"Cannot read {path}: expected a .npy file, a zarr array or group, or a parquet dataset ({exc})"
        ) from exc
    if hasattr(node, "shape"):
        return da.from_zarr(path)
    arrays = [name for name, _ in node.arrays()]
    if len(arrays) != 1:
        raise InputError(f"zarr group {path} must hold exactly one array to fit on; it holds {sorted(arrays)}")
    return da.from_zarr(path, component=arrays[0])


# the file names dask reads as a parquet dataset's (``dd.read_parquet``'s parquet_file_extension)
PARQUET_EXTENSIONS = (".parq", ".parquet", ".pq")


def parquet_files(X, columns=None):
    """A parquet dataset on the path X (a file, or a directory of files) as a dask array of its feature
    columns ``columns`` (every column of ``dd.read_parquet`` when None), one block per row group, with the
    row counts read from the files' footers: dask's own count is a pass over the data before the fit. The
    rows in ``dd.read_parquet``'s order (the files in natural sort order), each block checked and converted
    as ``frame_rows`` converts a partition (an NA the footers count is named here, before any work; one in
    a row group written without statistics, where that block is read). None where X is no such path, or
    where its layout is not a plain list of files (hive-partitioned directories, a ``_metadata`` file): dask
    reads those."""
    if not isinstance(X, (str, os.PathLike)) or not os.path.exists(X) or not _is_parquet(os.fspath(X)):
        return None
    import pyarrow.parquet as pq
    from dask import delayed
    from dask.utils import natural_sort_key

    path = os.fspath(X)
    if os.path.isdir(path):
        names = os.listdir(path)
        if any(os.path.isdir(os.path.join(path, n)) or n in ("_metadata", "_common_metadata") for n in names):
            return None
        files = [os.path.join(path, n) for n in names if n.endswith(PARQUET_EXTENSIONS) and n[0] not in "._"]
        files.sort(key=natural_sort_key)
    else:
        files = [path]
    table = select_columns(open_path(path), list(columns) if columns is not None else None)
    names, dtype = [str(c) for c in table.columns], frame_dtype(table)
    nullable = [str(c) for c, t in table.dtypes.items() if _nullable(t)]
    blocks = []
    for f in files:
        meta = pq.ParquetFile(f).metadata
        where = {meta.schema.column(i).name: i for i in range(meta.num_columns)}
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            if not group.num_rows:
                continue
            stats = [group.column(where[c]).statistics if c in where else None for c in nullable]
            if any(st is not None and st.has_null_count and st.null_count for st in stats):
                _row_group(f, g, names, dtype, len(blocks))  # raises here, naming the NA's column and row
            read = delayed(_row_group, pure=True)(f, g, names, dtype, len(blocks))
            blocks.append(da.from_delayed(read, (group.num_rows, len(names)), dtype=dtype))
    return da.concatenate(blocks) if blocks else None


def _row_group(path, group, columns, dtype, number):
    """Row group ``group`` of a parquet file as rows of ``columns`` (``parquet_files``' stored block)."""
    import pyarrow.parquet as pq

    frame = pq.ParquetFile(path).read_row_group(group, columns=columns).to_pandas()
    return _refuse_missing(frame, {"number": number}).to_numpy(dtype=dtype)


def _is_parquet(path):
    return path.endswith(".parquet") or (os.path.isdir(path) and any(f.endswith(".parquet") for f in os.listdir(path)))


def as_table(X):
    """A table input as its DataFrame (a path to a parquet dataset opened, lazily), anything else as it is."""
    if isinstance(X, (str, os.PathLike)) and os.path.exists(X) and _is_parquet(os.fspath(X)):
        return open_path(X)
    return X


def feature_names(X):
    """The column names of a table input (a DataFrame, or a path to a parquet dataset), None for arrays."""
    X = as_table(X)
    return [str(c) for c in X.columns] if is_frame(X) and getattr(X, "ndim", 2) == 2 else None


# a column name that says "identifier": customer_id, row_key, index, customerId
KEY_NAME = re.compile(r"(^|[_\s.-])(id|key|index|idx)$|[a-z](Id|Key)$", re.IGNORECASE)


def key_columns(X):
    """The integer columns of a table input (a DataFrame, a parquet path) whose names say they are keys: fitted
    as features, an identifier's arbitrary numbers outweigh every real feature's distances."""
    X = as_table(X)
    if not is_frame(X) or getattr(X, "ndim", 2) != 2:
        return []
    return [str(c) for c, t in X.dtypes.items() if getattr(t, "kind", "O") in "iu" and KEY_NAME.search(str(c))]


def frame_rows(frame, partition_info=None):
    """A DataFrame partition's rows as a float array (float32 when every column is), after the numeric and
    missing-value checks ``as_array`` makes."""
    return _refuse_missing(frame, partition_info).to_numpy(dtype=frame_dtype(frame))


def frame_dtype(frame):
    """The float dtype a DataFrame's columns become (float32 only when every column is float32), after
    refusing non-numeric columns by name. Bool and nullable (NA-capable) numeric columns are numbers."""
    bad = [str(c) for c, t in frame.dtypes.items() if getattr(t, "kind", "O") not in "biuf"]
    if bad:
        raise InputError(
            f"Input must be numeric; non-numeric columns: {bad} (choose the feature columns "
            "with columns=[...], or --columns on the command line)"
        )
    if all(np.dtype(getattr(t, "numpy_dtype", t)) == np.float32 for t in frame.dtypes):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _refuse_missing(frame, partition_info=None):
    """Nullable columns' NA (pandas' missing value) named by column and row, instead of a NaN found later;
    for a dask DataFrame, per partition (``map_partitions`` passes ``partition_info``)."""
    where = f" of partition {partition_info['number']}" if partition_info else ""
    for c, t in frame.dtypes.items():
        if _nullable(t):
            missing = frame[c].isna().to_numpy()
            if missing.any():
                raise InputError(
                    f"Column {str(c)!r} has a missing value (NA) at row {int(np.argmax(missing))}{where}: "
                    "fill or drop missing values first"
                )
    return frame


def _nullable(dtype):
    """Whether a column of this dtype may hold pandas' missing value (NA): a nullable extension dtype."""
    return getattr(dtype, "na_value", None) is not None and not isinstance(dtype, np.dtype)


def is_pandas(X):
    """Whether X is a pandas DataFrame (or Series): in memory, unlike a dask one."""
    return type(X).__module__.startswith("pandas")


def is_frame(X):
    """Whether X is a pandas or dask DataFrame (or Series)."""
    return is_pandas(X) or type(X).__module__.startswith(("dask.dataframe", "dask_expr"))


def select_columns(X, columns):
    """The feature columns ``columns`` of a table: a pandas or dask DataFrame, or a path to a parquet
    dataset (read with only those columns). Keys and labels beside the features stay out of the fit;
    ``columns=None`` keeps X as it is."""
    if columns is None:
        return X
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns) or not len(columns):
        raise InputError(f"columns must be a non-empty list of column names; got {columns!r}")
    if len(set(columns)) != len(columns):
        raise InputError(
            f"columns names a column twice: {sorted(c for c in set(columns) if list(columns).count(c) > 1)}"
        )
    table = open_path(X) if isinstance(X, (str, os.PathLike)) else X
    if not is_frame(table) or getattr(table, "ndim", 2) != 2:
        raise InputError(
            f"columns= selects the features of a table (a DataFrame or a parquet dataset); got {type(table).__name__}"
        )
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise InputError(f"columns {missing} are not in the input; its columns are {[str(c) for c in table.columns]}")
    return table[list(columns)]


def as_array(X):
    """Any supported input as a 2-D numpy or dask array (not yet chunked or cast). A dask DataFrame's
    row counts per partition are left unknown: ``as_source`` finds them with one pass, since dask's own
    ``lengths=True`` miscounts the partitions of a column-projected parquet read (it merges small files
    after the projection)."""
    if isinstance(X, (str, os.PathLike)):
        X = open_path(X)
    if is_pandas(X):
        if X.ndim != 2:
            raise InputError(
                f"Expected a 2-D array of shape (n_samples, n_features); got a pandas object with {X.ndim} dimension(s)"
            )
        dtype = frame_dtype(X)
        return _refuse_missing(X).to_numpy(dtype=dtype)
    if is_frame(X):
        if getattr(X, "ndim", 2) != 2:
            raise InputError("Expected a 2-D input; got a dask Series")
        dtype = frame_dtype(X)
        checked = X.map_partitions(_refuse_missing, meta=X._meta)
        return checked.astype(dtype).to_dask_array()
    if isinstance(X, da.Array):
        return X
    return _dense(X)


def as_source(X, sample_weight=None, *, chunk_rows=None, columns=None, unit=False):
    """Normalise and validate the input (its feature columns ``columns``: ``select_columns``); return its
    row-chunked ``Source``. ``unit``: its rows put on the unit sphere as chunks load them (``unit_rows``;
    nothing the caller passed is changed).

    Raises ``InputError`` (a ValueError) whose message names the problem precisely.
    NaN/inf are found later, in the engine's first pass, and reported with chunk and row.
    """
    path = os.fspath(X) if isinstance(X, (str, os.PathLike)) and os.fspath(X).endswith(".npy") else None
    files = parquet_files(X, columns)
    X = select_columns(X, columns) if files is None else files
    table = files is not None or is_frame(X) or (isinstance(X, (str, os.PathLike)) and _is_parquet(os.fspath(X)))
    X = as_array(X)
    _check_shape(X.shape)
    _check_dtype(X.dtype)
    dtype = _float_dtype(X.dtype)
    n, d = X.shape
    if isinstance(X, da.Array) and np.isnan(n):
        X = X.compute_chunk_sizes()
        n = X.shape[0]
    row_bytes = d * dtype.itemsize
    blocks_sparse = isinstance(X, da.Array) and is_sparse_input(X._meta)
    if is_csr(X):
        row_bytes = csr_row_bytes(X.nnz, n, dtype.itemsize)
    elif blocks_sparse:
        X = X.map_blocks(_csr_block, dtype=X.dtype, meta=_csr_meta(X.dtype))
        row_bytes = csr_row_bytes(_nnz(X), n, dtype.itemsize)
    elif isinstance(X, da.Array):
        X = X.map_blocks(_dense_block, dtype=X.dtype, meta=X._meta)
    rows = chunk_rows or auto_chunk_rows(n, row_bytes, 1)
    weights = _check_weights(sample_weight, n)
    if isinstance(X, da.Array):
        # (a block of CSR rows: their average stored bytes, not the dense block's)
        given = max(X.chunks[0]) * (row_bytes if blocks_sparse else max(X.chunks[1]) * X.dtype.itemsize)
        X = X.astype(dtype) if X.dtype != dtype else X
        stored = X.rechunk({1: -1}) if len(X.chunks[1]) > 1 else X
        if unit:
            stored = stored.map_blocks(_unit_block, dtype=dtype, meta=stored._meta)
        if chunk_rows is not None or config.get("chunking") != "input" or not _chunks_ok(X, row_bytes):
            X = stored.rechunk({0: rows})
        else:
            X = stored
        if weights is not None:
            weights = (
                da.from_array(weights, chunks=(X.chunks[0],))
                if isinstance(weights, np.ndarray)
                else weights.rechunk((X.chunks[0],))
            )
        return DaskSource(X, weights, given, stored, FRAME_COPIES if table else 1, row_bytes)
    if isinstance(weights, da.Array):
        weights = weights.compute()
    return ArraySource(X, weights, row_starts(n, rows), path=path, unit=unit)


def _csr_block(x):
    """A block of a dask array of scipy sparse chunks as canonical CSR (``_csr``, without its warning: the
    input's own format, converted block by block)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _csr(x)


def _dense_block(x):
    """A block of a dask array whose meta says dense rows: refused when it is a scipy sparse matrix after all
    (dask keeps no meta for COO blocks, so a dask array of them looks dense until a block is computed)."""
    if is_sparse_input(x):
        raise InputError(
            f"X is a dask array of scipy.sparse {getattr(x, 'format', type(x).__name__)!r} blocks whose meta says "
            "dense: give CSR blocks and their meta, e.g. X.map_blocks(lambda b: b.tocsr(), "
            "meta=scipy.sparse.csr_matrix((0, 0), dtype=X.dtype))"
        )
    return x


def _csr_meta(dtype):
    from scipy.sparse import csr_matrix

    return csr_matrix((0, 0), dtype=dtype)


def _nnz(X):
    """The non-zeros of a dask array of CSR chunks: one pass over its blocks (their count only travels)."""
    counts = X.map_blocks(
        lambda b: np.array([[b.nnz]], np.int64),
        chunks=((1,) * len(X.chunks[0]), (1,) * len(X.chunks[1])),
        dtype=np.int64,
        meta=np.empty((0, 0), np.int64),
    )
    return int(counts.sum().compute())


def _chunks_ok(X, row_bytes):
    """Under ``chunking="input"``: keep a dask input's row chunks when each is within the size bounds."""
    sizes = np.asarray(X.chunks[0]) * row_bytes
    lo, hi = config.get_bytes("min-chunk-bytes"), config.get_bytes("max-chunk-bytes")
    inner = sizes[:-1] if len(sizes) > 1 else sizes
    return bool(np.all(inner >= lo) and np.all(sizes <= hi))


def _check_weights(sample_weight, n):
    if sample_weight is None:
        return None
    w = sample_weight if isinstance(sample_weight, da.Array) else np.asarray(sample_weight)
    if w.ndim != 1 or w.shape[0] != n:
        raise InputError(f"sample_weight must have shape ({n},) to match the input; got {tuple(w.shape)}")
    if np.dtype(w.dtype).kind not in "biuf":
        raise InputError(f"sample_weight must be numeric; got dtype {w.dtype}")
    if isinstance(w, np.ndarray):
        if not np.all(np.isfinite(w)):
            raise InputError(f"sample_weight contains NaN or infinity at index {int(np.argmin(np.isfinite(w)))}")
        if np.any(w < 0):
            raise InputError(
                f"sample_weight must be non-negative; index {int(np.argmax(w < 0))} is {w[np.argmax(w < 0)]}"
            )
        if not w.sum() > 0:
            raise InputError("sample_weight must have a positive sum; got weights that are all zero")
    return w


# ---------------------------------------------------------------- one-shot lazy passes


def l2_rows(x):
    """Rows in float64 scaled to unit length; an all-zero row stays zero (scikit-learn's ``normalize``)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1)
    norms[norms == 0] = 1.0
    return x / norms[:, None]


def unit_rows(x, start=0):
    """Rows divided by their norms (computed in float64) in their own dtype: spherical k-means' data
    (``metric="cosine"``). A row of NaN or infinity is named as in the first pass, and a row of zero norm,
    which has no direction, is refused with its global row (``start``: the block's first)."""
    if is_csr(x):
        lengths = np.diff(x.indptr)
        check_finite_csr(x, start)
        norms = np.sqrt(
            np.bincount(np.repeat(np.arange(x.shape[0]), lengths), x.data.astype(np.float64) ** 2, x.shape[0])
        )
    else:
        check_finite_block(x, where="", start=start)
        norms = np.sqrt(np.einsum("ij,ij->i", x, x, dtype=np.float64))
    zero = np.flatnonzero(norms == 0)
    if len(zero):
        raise InputError(
            f"row {start + int(zero[0])} has zero norm: metric='cosine' compares directions, and a zero row has "
            "none (drop it, or use metric='euclidean')"
        )
    if is_csr(x):
        x = x.copy()
        x.data = (x.data / np.repeat(norms, lengths)).astype(x.dtype, copy=False)
        return x
    return (x / norms[:, None]).astype(x.dtype, copy=False)


def _unit_block(x, block_info=None):
    return unit_rows(x, block_info[0]["array-location"][0][0] if block_info else 0)


def as_dask_rows(X, n_features=None):
    """Any supported input as a row-chunked dask array in its float dtype, for lazy one-shot passes
    (predict, transform, score). ``n_features`` checks the feature count against a fitted model."""
    X = as_array(X)
    _check_shape(X.shape)
    _check_dtype(X.dtype)
    if n_features is not None and X.shape[1] != n_features:
        raise InputError(f"X has {X.shape[1]} features, but the model was fitted with {n_features} features")
    dtype = _float_dtype(X.dtype)
    rows = auto_chunk_rows(X.shape[0], X.shape[1], dtype.itemsize)
    if isinstance(X, da.Array):
        if is_sparse_input(X._meta):  # blocks of scipy sparse rows: each canonical CSR
            X = X.map_blocks(_csr_block, dtype=X.dtype, meta=_csr_meta(X.dtype))
        else:
            X = X.map_blocks(_dense_block, dtype=X.dtype, meta=X._meta)
        X = X.rechunk({1: -1}) if len(X.chunks[1]) > 1 else X
        X = X.compute_chunk_sizes() if np.isnan(X.shape[0]) else X  # a dask DataFrame's (``as_array``)
        return X.astype(dtype) if X.dtype != dtype else X
    return da.from_array(X, chunks=(rows, -1)).astype(dtype)


def map_rows(X, block_fn, dtype, n_cols, *args):
    """Lazy blockwise ``block_fn(block, *args)`` over the rows of X (a dask array from ``as_dask_rows``):
    one output row per input row, ``n_cols`` columns (None: a 1-D output)."""
    if n_cols is None:
        return X.map_blocks(block_fn, *args, dtype=dtype, drop_axis=1, meta=np.empty((0,), dtype))
    return X.map_blocks(block_fn, *args, dtype=dtype, chunks=(X.chunks[0], (n_cols,)), meta=np.empty((0, 0), dtype))


def check_finite_block(x, block_info=None, where="", start=0):
    """Raise with the global row and the column when a block of a one-shot pass holds NaN or infinity
    (``block_info`` as dask's ``map_blocks`` passes it, else ``start``, the block's first row; ``where``: the
    block's name, if it has one). CSR rows: ``check_finite_csr``."""
    if is_csr(x):
        return check_finite_csr(x, block_info[0]["array-location"][0][0] if block_info else start)
    ok = np.isfinite(x).all(axis=1)
    if not ok.all():
        start = block_info[0]["array-location"][0][0] if block_info else start
        row = int(np.argmin(ok))
        column = int(np.argmin(np.isfinite(x[row])))
        raise InputError(f"Input contains NaN or infinity at row {start + row}{where}, column {column} (from 0)")
