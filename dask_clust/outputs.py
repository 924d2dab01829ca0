"""Where results are written: every output path checked before any work, the labels' format taken from
the suffix, and every output written beside its place under a temporary name and moved into place only
once complete, so a failure leaves the old output (or nothing) and never a partial one that looks valid;
and the arrays of a model or checkpoint read back as untrusted input (``stored_arrays``)."""

import contextlib
import errno
import hashlib
import math
import os
import shutil
import stat
import tempfile
import threading
import uuid
import zipfile

import numpy as np

from .errors import InputError

LABEL_FORMATS = (".npy", ".parquet", ".zarr")


def _kind_of_dir(path):
    """ "model", "zarr", "parquet", "empty" or None (a directory of something else)."""
    names = os.listdir(path)
    if not names:
        return "empty"
    if "model.json" in names:
        return "model"
    if {"zarr.json", ".zarray", ".zgroup"} & set(names):
        return "zarr"
    if all(n.endswith(".parquet") or n in ("_metadata", "_common_metadata") for n in names):
        return "parquet"
    return None


def _check_writable(path, what):
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputError(f"{what} {path}: the directory {parent} does not exist")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".dask-clust-probe-"))
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot write in {parent} ({exc.strerror or exc})") from None


def check_labels_path(path, what="labels output"):
    """Refuse, before any work, a labels path whose format is unknown or that cannot be written, and
    an existing path that is not a labels output of the same kind (it would be replaced)."""
    path = os.fspath(path)
    suffix = os.path.splitext(path.rstrip("/"))[1].lower()
    if suffix not in LABEL_FORMATS:
        raise InputError(f"{what} {path}: the format follows the suffix; use one of {', '.join(LABEL_FORMATS)}")
    if os.path.isdir(path) and (suffix == ".npy" or _kind_of_dir(path) not in (suffix[1:], "empty")):
        raise InputError(f"{what} {path}: exists and is not a {suffix[1:]} output; refusing to replace it")
    if os.path.isfile(path) and suffix != ".npy":
        raise InputError(f"{what} {path}: exists and is a file, not a {suffix[1:]} directory")
    _check_writable(path, what)
    return suffix


def check_model_dir(path, what="model output"):
    """Refuse, before any work, a model directory that cannot be written or that holds something else."""
    path = os.fspath(path)
    if os.path.exists(path) and not (os.path.isdir(path) and _kind_of_dir(path) in ("model", "empty")):
        raise InputError(f"{what} {path}: exists and is not a dask_clust model directory; refusing to replace it")
    _check_writable(path, what)


@contextlib.contextmanager
def replacing(path):
    """A temporary path beside ``path`` to write into; moved onto ``path`` when the block succeeds (an
    existing output there is replaced), removed when it fails. A symbolic link is followed: its target is
    replaced and the link kept (renaming a directory onto the link failed and left the temporary behind). A
    full disk is one line naming the place (``InputError``), nothing left behind."""
    path = os.fspath(path).rstrip("/") or os.fspath(path)
    if os.path.islink(path):
        path = os.path.realpath(path)
    parent, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(parent, f".{name}.partial-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        if os.path.isdir(path):
            old = tmp + "-old"
            os.rename(path, old)
            os.rename(tmp, path)
            _remove(old)
        else:
            os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        if exc.errno in FULL:
            raise InputError(
                f"{path}: no space left on its device ({os.strerror(exc.errno)}); nothing was written there"
            ) from None
        raise
    except BaseException:
        _remove(tmp)
        raise


# the errors of a full disk or an exhausted quota
FULL = (errno.ENOSPC, errno.EDQUOT)


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def write_rows(rows, path, run=None):
    """Compute the lazy ``rows`` into ``path`` (.npy, .parquet or .zarr), all or nothing. ``rows``: a dask
    array (labels; an (n, k) matrix of posteriors for .npy and .zarr), or a dask Series or DataFrame
    (``predict`` of a table, with the columns kept beside it, or posteriors' columns: those need a .parquet
    path, checked by the caller). ``run`` computes a dask collection and returns its value (dask's
    ``compute`` by default; the command line's counts the tasks on its progress display)."""
    run = run or (lambda collection: collection.compute())
    suffix = check_labels_path(path)
    table = not hasattr(rows, "chunks")
    if table and rows.ndim == 1:
        rows = rows.to_frame()
    with replacing(path) as tmp:
        if suffix == ".npy":
            with open(tmp, "wb") as f:
                np.save(f, run(rows["label"]).to_numpy() if table else run(rows))
        elif suffix == ".parquet":
            import dask.dataframe as dd

            frame = rows if table else dd.from_dask_array(rows, columns=["label"])
            # an unnamed index is dask's row numbering, which other readers would see as a column of its own
            run(frame.to_parquet(tmp, write_index=frame.index.name is not None, compute=False))
        else:
            run((rows["label"].to_dask_array(lengths=True) if table else rows).to_zarr(tmp, compute=False))
    return path


def regular_size(path):
    """The size of ``path``, a regular file (followed through links), or ValueError."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{os.path.basename(path)} is not a regular file")
    return st.st_size


def file_sha256(path):
    """sha256 (hex) of the bytes of the regular file ``path``, read in blocks."""
    regular_size(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# what reading a saved file can raise when it is missing, damaged or crafted (``stored_arrays`` and its callers)
UNREADABLE = (OSError, ValueError, EOFError, zipfile.BadZipFile)


# numpy parses a .npy header with ast.literal_eval, which is not thread-safe on CPython 3.11.0-3.11.7
# (gh-106905, fixed in 3.11.8: "SystemError: AST constructor recursion depth mismatch"); a partition's threads
# read its chunks' files at once (a resumed checkpoint's rows, state kept in files), so every header this
# package parses is parsed under this lock: microseconds each, the data read outside it
NPY_HEADER = threading.Lock()


def mapped_npy(path, mode="r"):
    """The .npy file at ``path`` mapped (``np.load(mmap_mode=mode)``), its header parsed under NPY_HEADER."""
    with NPY_HEADER:
        return np.load(path, mmap_mode=mode)


def stored_arrays(npz):
    """The arrays of ``npz`` as np.savez writes them: each member stored uncompressed and its .npy header's
    shape and dtype accounting for exactly the bytes stored, then read as those bytes. A compressed member
    or a header claiming more would let a file of a megabyte allocate gigabytes (a zip bomb); no pickled
    object is ever read."""
    regular_size(npz)
    out = {}
    with zipfile.ZipFile(npz) as z:
        for info in z.infolist():
            name = info.filename
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"arrays.npz member {name!r} is compressed (np.savez stores arrays as they are)")
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version not in ((1, 0), (2, 0)):
                    raise ValueError(f"arrays.npz member {name!r} has .npy format version {version}")
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                with NPY_HEADER:
                    shape, fortran, dtype = read(f)
                claimed = math.prod(shape) * dtype.itemsize
                if dtype.hasobject or f.tell() + claimed != info.file_size:
                    raise ValueError(
                        f"arrays.npz member {name!r} claims {claimed:,} bytes of {dtype} "
                        f"{shape} but stores {info.file_size - f.tell():,}"
                    )
                data = np.empty(shape, dtype, order="F" if fortran else "C")
                if claimed and f.readinto(memoryview(data.T if fortran else data).cast("B")) != claimed:
                    raise ValueError(f"arrays.npz member {name!r} ends before its {claimed:,} bytes")
                out[name.removesuffix(".npy")] = data
    return out
