"""Checkpoints of a fit in progress, and resuming from one (``fit(..., checkpoint=, resume=)``).

A checkpoint directory holds

    checkpoint.lock     the fit writing here (host, pid, its start time), touched every 15 s while it runs:
                        a second fit on the directory is refused; a lock left by a process that is gone
                        from this host, or by a fit of another host untouched for 2 minutes, is taken over
    checkpoint.json     what fit this is (algorithm, parameters, the data's fingerprint) and its newest
                        complete generation: the iteration, the history, the algorithm's scalars and the
                        names of its arrays, the sha256 of each per-row file, and a checksum of all
                        that and of the generation's arrays.npz
    it-<n>/arrays.npz   the algorithm's driver-side arrays at iteration n (the centres, ...)
    it-<n>/rows/        per-row state, written by the partitions that hold the rows, one
                        ``<key>-<first row>-<end row>.npz`` per chunk (``Engine.dump_rows``)

JSON and npz as ``ClusteringModel.save`` writes them, never pickle. A generation is written completely
before ``checkpoint.json`` is replaced (``os.replace``, atomic) to name it, and older generations are
removed only then: a process killed at any moment leaves the previous checkpoint readable.

What the driver holds per checkpoint: the algorithm's driver-side state (the centres, k x D, gathered
once when they are sharded; vc-GMM's G_c, k x G; a few scalars) and the history. Per-row state never
passes through it: each partition writes its own chunks' rows, and the driver receives one count.

The fingerprint is the data's shape, dtype, weighting and chunk boundaries (checked before any work) and a
hash of the first pass's exact summary (n, Σw, per-feature mean and variance, max |x|: a hash of every
value, at no extra cost), checked once that pass has run. A checkpoint of other data or other parameters
is never resumed from, nor overwritten.
"""

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid

import numpy as np
import psutil

from .errors import InputError, InvalidModelError
from .outputs import FULL, UNREADABLE, file_sha256, stored_arrays

logger = logging.getLogger("dask_clust")

FORMAT_VERSION = 3  # 2: each generation carries a checksum; 3: and the checksums of its per-row files
INDEX = "checkpoint.json"
LOCK = "checkpoint.lock"
# a lock file still empty this long after it was made belongs to a process that died while writing it
LOCK_WRITE_S = 10.0
# the fit holding a lock touches it this often (its heartbeat); a lock of another host untouched for
# LOCK_STALE_S, by the clock of the file system holding it, belongs to a fit that stopped (its node lost, its
# job killed): another host may take it over, since it cannot ask the holder's host whether it lives
LOCK_BEAT_S = 15.0
LOCK_STALE_S = 120.0


def _digest(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(np.ascontiguousarray(p).tobytes() if isinstance(p, np.ndarray) else repr(p).encode())
    return h.hexdigest()[:32]


def _generation_digest(generation, meta):
    """sha256 of a generation: its arrays.npz as stored and everything the index says of it (all but the
    checksum itself), so an edited ``"converged": true``, a cut history or a changed array refuses to resume
    instead of resuming to another model. The index holds each per-row file's sha256 (``rows``), which their
    readers check (``restored_rows``) on the workers: the driver never reads per-row state."""
    h = hashlib.sha256()
    h.update(file_sha256(os.path.join(generation, "arrays.npz")).encode())
    h.update(json.dumps({k: v for k, v in meta.items() if k != "checksum"}, sort_keys=True).encode())
    return h.hexdigest()


def _plain(value):
    """A parameter as JSON holds it; an array (an ``init``) as its shape, dtype and a hash of its values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) or (hasattr(value, "__array__") and np.ndim(value) > 0):
        a = np.asarray(value)
        return {"array": list(a.shape), "dtype": str(a.dtype), "sha256": _digest(a)}
    return value


def identity(algo, params, source):
    """What a checkpoint must match to be resumed: the algorithm, its parameters (random_state included)
    and the data's shape, dtype, weighting and chunk boundaries."""
    ident = {
        "algo": algo,
        "params": {k: _plain(v) for k, v in sorted(params.items())},
        "data": {
            "shape": [int(source.n_samples), int(source.n_features)],
            "dtype": str(np.dtype(source.dtype)),
            "weighted": getattr(source, "weights", None) is not None,
            "n_chunks": int(source.n_chunks),
            "chunks": _digest(np.asarray(source.starts, np.int64)),
        },
    }
    return json.loads(json.dumps(ident))  # as a checkpoint holds it: lists, not tuples


def summary_digest(summary):
    """The hash of the first pass's exact summary: equal for equal data on any layout (exact sums)."""
    return _digest(
        np.int64(summary.n_samples),
        np.float64(summary.total_weight),
        np.asarray(summary.mean, np.float64),
        np.asarray(summary.var, np.float64),
        np.float64(summary.max_abs),
    )


def _difference(there, here):
    """The first difference between a checkpoint's identity and this fit's, as a phrase."""
    if there["algo"] != here["algo"]:
        return f"algo={there['algo']!r} there, {here['algo']!r} here"
    for what in ("data", "params"):
        a, b = there[what], here[what]
        for k in list(b) + [k for k in a if k not in b]:  # the data's shape before its chunks
            if a.get(k) == b.get(k):  # by value: tol=0 is tol=0.0
                continue
            if k == "chunks":
                return "the data's chunk boundaries differ"
            return f"{'the data' if what == 'data' else 'parameter'} {k}={a.get(k)!r} there, {b.get(k)!r} here"
    return None


def read(path):
    """The index of the checkpoint at ``path``, or None when there is none (no ``checkpoint.json``)."""
    index = os.path.join(path, INDEX)
    if not os.path.isfile(index):
        return None
    try:
        with open(index) as f:
            meta = json.load(f)
        if not isinstance(meta, dict) or not isinstance(meta.get("identity"), dict):
            raise ValueError("checkpoint.json holds no fit identity")
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {meta.get('format_version')!r} is not {FORMAT_VERSION}")
        for key, kind in (
            ("generation", str),
            ("iteration", int),
            ("history", list),
            ("scalars", dict),
            ("converged", bool),
            ("checksum", str),
            ("rows", dict),
        ):
            if not isinstance(meta.get(key), kind):
                raise ValueError(f"{key} is missing or has the wrong type")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta["rows"].items()):
            raise ValueError("rows holds other than file names and checksums")
    except (OSError, ValueError) as exc:
        raise InvalidModelError(f"{path} is not a valid dask_clust checkpoint: {exc}") from None
    return meta


def stored_entropy(path):
    """The random_state a checkpoint at ``path`` was fitted with, or None (a fit with random_state=None
    resumes with it)."""
    meta = read(path) if path is not None else None
    return None if meta is None else meta["identity"]["params"].get("random_state")


class Checkpoint:
    """Where a fit writes its checkpoints (``path``, or None: nowhere) and what it resumes from.

    ``every``: write after every ``every`` iterations, and whenever ``seconds`` have passed since the
    last one, and when the loop ends; ``declared``: what the algorithm's checkpoint holds (``check_saved``).
    ``restored``: the algorithm's state to continue from (scalars and arrays by name), ``restored_rows``:
    (the directory of its per-row state, {file name: sha256}); both None for a fresh fit."""

    def __init__(self, path, resume, ident, every, seconds, declared):
        self.path = None if path is None else os.fspath(path)
        self.ident = ident
        self.every, self.seconds = every, seconds
        self.restored = self.restored_rows = None
        self.meta = self.digest = None
        self._keep = set()  # generations still read by this fit (the one it resumed from)
        self._last = time.monotonic()
        self._written = 0
        if self.path is not None:
            _check_dir(self.path)
            other = read(self.path) if resume is not None else None
            diff = other and _difference(other["identity"], ident)
            if diff:
                raise InputError(
                    f"checkpoint={self.path} holds a checkpoint of another fit ({diff}); refusing to replace it"
                )
        source = resume if resume is not None else self.path
        if source is not None:
            self._open(os.fspath(source), resume is not None, declared)
        self._lock = None if self.path is None else _take_lock(self.path)
        self._beat = None if self._lock is None else _Heartbeat(self._lock)

    def _open(self, path, required, declared):
        what = "resume" if required else "checkpoint"
        if required and not os.path.isdir(path):
            raise InputError(f"resume={path}: no such directory")
        meta = read(path)
        if meta is None:
            if required:
                raise InputError(f"resume={path}: holds no dask_clust checkpoint (no {INDEX})")
            return
        diff = _difference(meta["identity"], self.ident)
        if diff is not None:
            raise InputError(
                f"{what}={path} holds a checkpoint of another fit ({diff}); refusing to "
                f"{'resume from' if required else 'resume from or replace'} it"
            )
        generation = os.path.join(path, meta["generation"])
        try:  # sizes checked against the bytes stored before any is allocated, as a saved model's
            arrays = stored_arrays(os.path.join(generation, "arrays.npz"))
            if _generation_digest(generation, meta) != meta["checksum"]:
                raise ValueError(
                    f"generation {meta['generation']} does not match its checksum (its arrays or "
                    f"{INDEX} were edited or damaged)"
                )
        except UNREADABLE as exc:
            raise InvalidModelError(f"{path} is not a valid dask_clust checkpoint: {exc}") from None
        # the state against what its algorithm declares it saves (``AlgorithmSpec.saved``), before any work:
        # the checksum is no signature, and a value that would reach a kernel (a neighbour index of 2**30,
        # centres of another shape) or end the fit in a raw error is refused in one line
        try:
            check_saved({**meta["scalars"], **arrays}, declared)
        except ValueError as exc:
            raise InvalidModelError(f"{path} is not a valid dask_clust checkpoint: {exc}") from None
        self.meta = meta
        self.restored = {**meta["scalars"], **arrays}
        rows = os.path.join(generation, "rows")
        self.restored_rows = (rows, meta["rows"]) if meta["rows"] else None
        if os.path.abspath(path) == os.path.abspath(self.path or ""):
            self._keep.add(meta["generation"])
        self._written = meta["iteration"]
        logger.info(
            "resuming %s from the checkpoint at %s after iteration %d", self.ident["algo"], path, meta["iteration"]
        )

    def check_summary(self, summary):
        """After the first pass: the data's values are those the checkpoint was written from."""
        digest = summary_digest(summary)
        if self.meta is not None and self.meta["summary"] != digest:
            raise InputError(
                "the checkpoint was written from other data (same shape, dtype and chunks, but "
                "the exact sums of the values differ); refusing to resume from it"
            )
        self.digest = digest

    def due(self, n_iter, final):
        return self.path is not None and (
            final or n_iter - self._written >= self.every or time.monotonic() - self._last >= self.seconds
        )

    def write(self, n_iter, history, converged, state, rows=None):
        """Write generation ``n_iter``: ``state``'s arrays to npz and its scalars to the index, ``rows(dir)``
        to write the per-row state into ``dir``; then make it the checkpoint, atomically."""
        t = time.perf_counter()
        gen = f"it-{n_iter:06d}-{uuid.uuid4().hex[:6]}"
        gdir = os.path.join(self.path, gen)
        os.makedirs(gdir)
        try:
            arrays = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
            scalars = {k: _plain(v) for k, v in state.items() if k not in arrays}
            files = {}
            if rows is not None:
                os.makedirs(os.path.join(gdir, "rows"))
                files = rows(os.path.join(gdir, "rows"))
            with open(os.path.join(gdir, "arrays.npz"), "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            meta = json.loads(
                json.dumps(
                    {
                        "format_version": FORMAT_VERSION,
                        "identity": self.ident,
                        "summary": self.digest,
                        "generation": gen,
                        "iteration": int(n_iter),
                        "converged": bool(converged),
                        "history": history,
                        "scalars": scalars,
                        "rows": files,
                    },
                    default=_plain,
                )
            )
            meta["checksum"] = _generation_digest(gdir, meta)
            text = json.dumps(meta, indent=1)
            tmp = os.path.join(self.path, f".{INDEX}.{gen}")
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(self.path, INDEX))
        except BaseException as exc:
            shutil.rmtree(gdir, ignore_errors=True)
            if isinstance(exc, OSError) and exc.errno in FULL:
                kept = (
                    f"the checkpoint after iteration {self._written} is intact: free space and resume from it"
                    if self._written
                    else "no checkpoint was written before"
                )
                raise InputError(
                    f"checkpoint={self.path}: no space left on its device writing the checkpoint "
                    f"after iteration {n_iter} (the last one took {_size(self.path) / 2**20:.1f} MiB); "
                    f"{kept}"
                ) from None
            raise
        self._written, self._last = n_iter, time.monotonic()
        self._prune(keep={gen} | self._keep)
        logger.info("checkpoint after iteration %d written to %s (%.2f s)", n_iter, self.path, time.perf_counter() - t)

    def _prune(self, keep):
        """Remove the generations (and index files) a crash or an older checkpoint left, but ``keep``."""
        for name in os.listdir(self.path):
            where = os.path.join(self.path, name)
            if name in keep or not name.startswith(("it-", f".{INDEX}.")):
                continue
            if os.path.isdir(where):
                shutil.rmtree(where, ignore_errors=True)
            else:
                os.remove(where)

    def release(self):
        """The fit is over or failed: another may write here."""
        if self._beat is not None:
            self._beat.stop()
            self._beat = None
        if self._lock is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._lock)
            self._lock = None

    def close(self):
        """The fit is over: the generation it resumed from is no longer read."""
        if self.path is not None and self._keep and self.meta is not None:
            current = read(self.path)
            self._keep = set()
            self._prune(keep={current["generation"]} if current else set())


def _array(v, kind, shape, least=None, bound=None):
    want = "f" if kind == "floats" else "iu"
    if not isinstance(v, np.ndarray) or v.dtype.kind not in want or v.shape != tuple(shape):
        got = f"{v.dtype} {v.shape}" if isinstance(v, np.ndarray) else type(v).__name__
        return f"is {got}, not {kind} {tuple(shape)}"
    if kind == "floats" and not np.isfinite(v).all():
        return "holds values that are not finite"
    if kind == "ints" and v.size and not (v.min() >= least and v.max() < bound):
        return f"holds values outside [{least}, {bound})"
    return None


def _shown(v):
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(v, least, bound):
    ok = isinstance(v, int) and not isinstance(v, bool) and least <= v < bound
    return None if ok else f"is {_shown(v)}, not an integer in [{least}, {bound})"


def _number(v, least, bound, nullable):
    ok = (v is None and nullable) or (isinstance(v, (int, float)) and not isinstance(v, bool) and least <= v <= bound)
    return None if ok else f"is {_shown(v)}, not a number in [{least}, {bound}]" + (" or None" if nullable else "")


_SAVED = {
    "floats": lambda v, *spec: _array(v, "floats", *spec),
    "ints": lambda v, *spec: _array(v, "ints", *spec),
    "int": _integer,
    "float": _number,
    "bool": lambda v: None if isinstance(v, bool) else f"is {_shown(v)}, not true or false",
    "choice": lambda v, options: None if v in options else f"is {_shown(v)}, not one of {list(options)}",
}


def check_saved(state, declared):
    """``state`` (name -> value, as a checkpoint restores it) against ``declared`` (name -> spec); ValueError
    naming the first problem. Specs: ("floats", shape) finite floats; ("ints", shape, least, bound) integers
    in [least, bound); ("int", least, bound); ("float", least, bound, nullable) a number in [least, bound],
    never NaN, or None when nullable; ("bool",); ("choice", options)."""
    if set(state) != set(declared):
        raise ValueError(f"its state holds {sorted(state)}, not {sorted(declared)}")
    for name, (kind, *spec) in declared.items():
        problem = _SAVED[kind](state[name], *spec)
        if problem is not None:
            raise ValueError(f"{name!r} {problem}")


def _size(path):
    """Bytes of the files below ``path``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _check_dir(path):
    """A checkpoint directory: created when missing; refused when it holds anything but checkpoints."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"checkpoint={path}: exists and is not a directory")
    if os.path.isdir(path):
        other = [n for n in os.listdir(path) if n not in (INDEX, LOCK) and not n.startswith(("it-", f".{INDEX}."))]
        if other:
            raise InputError(
                f"checkpoint={path}: holds files that are not a dask_clust checkpoint ({other[0]!r}, "
                "...); give an empty or new directory"
            )
        _check_writable(path)
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputError(f"checkpoint={path}: the directory {parent} does not exist")
    try:
        os.makedirs(path)
    except OSError as exc:
        raise InputError(f"checkpoint={path}: cannot create it ({exc.strerror or exc})") from None


def _check_writable(path):
    """Before any work: a checkpoint directory the fit cannot write in (read-only) was accepted, and the fit
    died at its first write, after the work."""
    probe = os.path.join(path, f".{INDEX}.probe-{uuid.uuid4().hex[:8]}")
    try:
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as exc:
        raise InputError(f"checkpoint={path}: cannot write in it ({exc.strerror or exc})") from None


def _process_started(pid):
    """When process ``pid`` of this host started (seconds since the epoch), or None when there is none."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class _Heartbeat:
    """Touches the lock file every LOCK_BEAT_S while the fit holds it, on a daemon thread."""

    def __init__(self, where):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(where,), daemon=True, name="dask_clust-lock")
        self._thread.start()

    def _run(self, where):
        while not self._stop.wait(LOCK_BEAT_S):
            with contextlib.suppress(OSError):
                os.utime(where)

    def stop(self):
        self._stop.set()
        self._thread.join()


def _file_system_now(directory):
    """The time by the clock of the file system holding ``directory`` (another host's lock is aged by it, not
    by this host's clock, which may differ): the time stamp of a file made and removed there."""
    probe = os.path.join(directory, f".clock-{uuid.uuid4().hex}")
    try:
        with open(probe, "w"):
            pass
        return os.path.getmtime(probe)
    except OSError:
        return time.time()
    finally:
        with contextlib.suppress(OSError):
            os.remove(probe)


def _take_lock(path):
    """``path``'s lock file, made for this fit; refused in one line while another fit holds it (two fits on one
    directory, a requeued job or a job array, killed each other's generations). A lock whose
    process is gone from this host (killed, its node rebooted into the same name) is taken over; one held
    on another host is refused while its holder keeps touching it (``_Heartbeat``), and taken over once it
    has not for LOCK_STALE_S."""
    where = os.path.join(path, LOCK)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": _process_started(os.getpid())}
    for _ in range(3):
        try:
            fd = os.open(where, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(where)
            if holder is None:
                continue  # taken over, or removed by its fit meanwhile
            raise InputError(
                f"checkpoint={path} is in use by another fit (pid {holder.get('pid')} on "
                f"{holder.get('host')}): two fits writing one directory destroy each other's "
                f"checkpoints; give another directory, or remove {where} if that fit is gone"
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return where
    raise InputError(f"checkpoint={path}: could not take its lock {where} (other fits keep taking it)")


def _holder(where):
    """The live fit holding the lock file ``where``, or None after removing a stale one (its process gone
    from this host, or a file left empty by a process that died while writing it)."""
    try:
        with open(where) as f:
            text = f.read()
        touched = os.path.getmtime(where)
        age = time.time() - touched
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(text)
        pid, host = int(holder["pid"]), str(holder["host"])
    except (ValueError, KeyError, TypeError):
        if age < LOCK_WRITE_S:  # being written by its fit right now
            return {"pid": "?", "host": "?"}
        holder, pid, host = None, None, socket.gethostname()
    if host != socket.gethostname():
        silent = _file_system_now(os.path.dirname(where)) - touched
        if silent < LOCK_STALE_S:
            return holder
        logger.warning("taking over the lock %s of a fit on %s silent for %.0f s", where, host, silent)
        with contextlib.suppress(FileNotFoundError):
            os.remove(where)
        return None
    started = None if pid is None else _process_started(pid)
    if started is not None and holder is not None and holder.get("started") in (None, started):
        return holder
    logger.warning("taking over the lock %s of a fit that is gone (%s)", where, text.strip() or "empty")
    with contextlib.suppress(FileNotFoundError):
        os.remove(where)
    return None
