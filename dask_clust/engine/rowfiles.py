"""Per-row state in files. A checkpoint's, written and read where the rows live (``Engine.dump_rows``/
``load_rows``): one ``.npz`` file per chunk, named by the state's key and the chunk's row range, so that an
engine cut in other chunks reads the rows it holds from the files that cover them; every file checked against
the sha256 its generation recorded and the fields the algorithm declares before any of it reaches a kernel.
And a streaming partition's, between its calls, when the fit's state would not fit its memory
(``state_from_files``/``state_to_files``, rule 4): in a directory of the worker's own on its node, gone with
the partition, or removed by the next partition on the node when its worker was killed (a lost partition's
state is rebuilt from the model, as it would be from memory)."""

import os
import pickle
import shutil
import socket
import tempfile
import uuid

import numpy as np

from ..errors import InputError
from ..kernels.assign import is_csr
from ..outputs import UNREADABLE, file_sha256, mapped_npy, stored_arrays


def rows_file(directory, key, start, stop):
    return os.path.join(directory, f"{key}-{start:012d}-{stop:012d}.npz")


def dump_chunk_rows(chunk, params):
    """Write the chunk's state ``key`` (a dict of per-row arrays, or one array; of a dict only ``fields``
    when given) beside its rows' range; its rows' range and the file's sha256 (``dump_rows``)."""
    directory, key, fields, order = params
    if not os.path.isdir(directory):
        raise InputError(
            f"the checkpoint directory {directory} is not visible on the worker "
            f"{socket.gethostname()}: per-row state is written where the rows live, so a checkpoint "
            "on a cluster needs a directory on a filesystem every worker shares"
        )
    state = chunk.state[key]
    if fields:
        state = {f: _by_row(state[f], state[order]) if order else state[f] for f in fields}
    where = rows_file(directory, key, chunk.start, chunk.stop)
    np.savez(where, **(state if isinstance(state, dict) else {"": state}))
    return np.array([[chunk.start, chunk.stop]], np.int64), np.frombuffer(bytes.fromhex(file_sha256(where)), np.uint8)[
        None
    ]


def restored_rows(chunk, params):
    """A state builder: the chunk's state ``key`` as ``dump_chunk_rows`` wrote it in the checkpoint's ``rows`` =
    (directory, {file name: sha256}), from the files that cover the chunk's rows (they need not be cut as
    this engine's chunks are). ``fields`` declares each field ({name: (dtype, shape of a row, least value,
    bound above)}, the values unchecked where those are None): a checkpoint is a file users move between
    machines, and a crafted one must not reach a kernel (cluster indices of 2**30 crashed the process), so
    every file is checked before any of it is used: its bytes against the checksum its generation recorded
    (a value edited within its range would resume to another model), its rows against its name, every
    declared field present with its dtype, shape and range."""
    (directory, digests), key, fields = params
    exact = os.path.basename(rows_file(directory, key, chunk.start, chunk.stop))
    # the same chunks as the checkpoint's (the usual case): the chunk's own file, without sorting every chunk's
    names = [exact] if exact in digests else sorted(digests)
    pieces = []
    for name in names:  # zero-padded starts: sorted names are in row order
        parts = name[: -len(".npz")].rsplit("-", 2)
        if len(parts) != 3 or parts[0] != key:
            continue
        lo, hi = int(parts[1]), int(parts[2])
        if hi > chunk.start and lo < chunk.stop:
            pieces.append((lo, hi, name))
    covered = chunk.start
    found = {}
    for lo, hi, name in pieces:
        if lo > covered:
            break
        where = os.path.join(directory, name)
        try:
            if file_sha256(where) != digests[name]:
                raise ValueError("its bytes do not match the checksum its generation recorded (edited or damaged)")
            values = stored_arrays(where)
        except UNREADABLE as exc:
            raise InputError(f"the checkpoint's rows file {where} cannot be read: {exc}") from None
        _check_rows(values, fields, hi - lo, where)
        a, b = covered - lo, min(hi, chunk.stop) - lo
        for f, v in values.items():
            found.setdefault(f, []).append(v[a:b])
        covered = min(hi, chunk.stop)
    if covered < chunk.stop:
        raise InputError(
            f"the checkpoint's per-row state {key!r} in {directory} lacks rows {covered}..{chunk.stop - 1}"
        )
    state = {f: np.concatenate(v) for f, v in found.items()}
    chunk.state[key] = state[""] if "" in state else state


def _check_rows(values, fields, n_rows, where):
    """One rows file against its declared fields (``restored_rows``); InputError naming the first problem."""
    if set(values) != set(fields):
        raise InputError(f"the checkpoint's rows file {where} holds fields {sorted(values)}, not {sorted(fields)}")
    for f, (dtype, width, least, bound) in fields.items():
        v = values[f]
        if v.dtype != np.dtype(dtype) or v.shape != (n_rows,) + tuple(width):
            raise InputError(
                f"the checkpoint's rows file {where}: {f!r} is {v.dtype} {v.shape}, not {np.dtype(dtype)} "
                f"{(n_rows,) + tuple(width)} (the rows its name covers)"
            )
        if least is not None and v.size and not (v.min() >= least and v.max() < bound):
            raise InputError(f"the checkpoint's rows file {where}: {f!r} holds values outside [{least}, {bound})")


def load_chunk_rows(chunk, params):
    """The chunk's state ``key`` from the files; fields of a dict already there are replaced (put in its
    ``order`` when it keeps one), the rest kept."""
    rows, key, fields, order = params
    had = chunk.state.get(key)
    restored_rows(chunk, (rows, key, fields))
    if isinstance(had, dict):
        loaded = chunk.state[key]
        if order:
            loaded = {f: v[had[order]] for f, v in loaded.items()}
        chunk.state[key] = {**had, **loaded}
    return (np.int64(1),)


def _by_row(values, order):
    """Per-row values a state keeps in another order (``values[i]`` belongs to row ``order[i]``), by row."""
    out = np.empty_like(values)
    out[order] = values
    return out


# ---------------------------------------------------------------- a streaming partition's state between calls


STATE_PREFIX = "dask_clust-state-"


def state_directory(scratch=None):
    """A new directory for a partition's state files in ``scratch`` (the system's temporary directory when
    None), named after this process, once the directories of processes no longer alive are removed: a
    killed worker cannot remove its own (nmbatch's at 10x the memory: 9 GB each, which filled the disk)."""
    remove_dead_states(scratch)
    return tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{os.getpid()}-", dir=scratch)


def remove_dead_states(scratch=None):
    """Remove the state directories in ``scratch`` whose process has ended (a directory is its process's
    alone, so no other process removes a live one)."""
    scratch = scratch or tempfile.gettempdir()
    for name in os.listdir(scratch) if os.path.isdir(scratch) else ():
        pid = name[len(STATE_PREFIX) :].split("-")[0]
        if name.startswith(STATE_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(scratch, name), ignore_errors=True)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def state_from_files(directory):
    """A chunk's state as ``state_to_files`` left it in ``directory``: its arrays mapped from their files (a
    step reads only the pages it touches and writes in place through them; nmbatch's batch is a prefix of its
    rows), a CSR matrix rebuilt over its three mapped arrays, the rest unpickled; and {path: (file names,
    value)} of the mapped ones. Empty when nothing was written yet."""
    manifest = os.path.join(directory, "state.pkl")
    if not os.path.exists(manifest):
        return {}, {}
    with open(manifest, "rb") as f:
        leaves = pickle.load(f)
    state, mapped = {}, {}
    for path, (kind, value) in leaves.items():
        if kind == "npy":
            array = _mapped(directory, value)
            mapped[path], value = (value, array), array
        elif kind == "csr":
            from scipy.sparse import csr_matrix

            names, shape = value
            data, indices, indptr = (_mapped(directory, name) for name in names)
            matrix = csr_matrix((data, indices, indptr), shape=shape, copy=False)
            mapped[path], value = (names, matrix), matrix
        _put(state, path, value)
    return state, mapped


def _mapped(directory, name):
    return np.asarray(mapped_npy(os.path.join(directory, name), "r+"))


def state_to_files(state, directory, mapped):
    """Write a chunk's state into ``directory``: each array (of the state, or of a dict in it) to a new
    ``.npy`` file unless it is the array ``state_from_files`` mapped there (changed in place, if at all), a CSR
    matrix (nmbatch's rows in nesting order) as its three arrays alike, everything else into one pickle; files
    no longer part of the state are removed. A file is never written over: the state may still map it (Lloyd
    keeps last call's labels as its spare), and a mapped file cut short would fault; one unlinked stays
    readable until unmapped."""
    os.makedirs(directory, exist_ok=True)
    leaves, names = {}, set()
    for path, value in _leaves(state):
        was_names, was = mapped.get(path, (None, None))
        if isinstance(value, np.ndarray) and value.dtype != object:
            name = was_names if was is value else _saved(directory, value)
            leaves[path], names = ("npy", name), names | {name}
        elif is_csr(value):
            arrays = value.data, value.indices, value.indptr
            parts = was_names if was is value else tuple(_saved(directory, a) for a in arrays)
            leaves[path], names = ("csr", (parts, value.shape)), names | set(parts)
        else:
            leaves[path] = ("obj", value)
    with open(os.path.join(directory, "state.pkl"), "wb") as f:
        pickle.dump(leaves, f, protocol=pickle.HIGHEST_PROTOCOL)
    for name in set(os.listdir(directory)) - names - {"state.pkl"}:
        os.remove(os.path.join(directory, name))


def _saved(directory, array):
    name = f"{uuid.uuid4().hex}.npy"
    np.save(os.path.join(directory, name), array)
    return name


def _leaves(state, prefix=()):
    for key, value in state.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,), value


def _put(state, path, value):
    for key in path[:-1]:
        state = state.setdefault(key, {})
    state[path[-1]] = value
