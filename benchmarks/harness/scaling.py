"""``--suite scaling``: strong scaling from 1 to 2 workers on this machine, and the engine's cost per
round trip against the number of workers (LocalClusters of 1 to 16 single-thread processes, one real
partition each): empty-iteration time, the driver's CPU, and the bytes into and out of the driver per
Lloyd iteration; the inputs of the multi-node plan."""

import logging
import statistics
import time

import dask
import numpy as np

from dask_clust import api
from dask_clust.blocks.lloyd import lloyd_step
from dask_clust.engine import as_source, open_engine
from dask_clust.engine.local import connect
from dask_clust.kernels.assign import Prepared

logger = logging.getLogger("harness")

STRONG = (("blobs1m_d16", "kmeans", 200, {"max_iter": 12, "tol": 0.0}), ("blobs1m_d16", "vcgmm", 1000, {}))
OVERHEAD_WORKERS = (1, 2, 4, 8, 16)


def strong(run):
    """Per-iteration time (Lloyd) and whole-fit time (vc-GMM) on 1 and 2 single-thread workers."""
    for name, algo, k, params in STRONG:
        path, X = run.data(name)
        k = min(k, len(X) // 4)
        for n_workers in (1, 2):
            with connect(n_workers=n_workers, threads_per_worker=1) as client:
                api.fit(X[:20_000], algo, min(k, 50), random_state=0, client=client, max_iter=2)  # warm workers
                walls, per_iter = [], []
                for _ in range(run.repeats):
                    m = api.fit(path, algo, k, random_state=0, client=client, **params)
                    walls.append(m.engine_["wall_s"])
                    per_iter.append(statistics.median(h["wall_s"] for h in m.history_[2:] or m.history_))
            run.emit(
                {
                    "kind": "strong",
                    "data": name,
                    "algo": algo,
                    "k": k,
                    "workers": n_workers,
                    "wall_s": statistics.median(walls),
                    "s_per_iter": statistics.median(per_iter),
                    "n_iter": m.n_iter_,
                }
            )


class DriverBytes:
    """Bytes this process reads from and writes to its sockets while the block runs: every tornado stream
    (the client's comms with the scheduler and the workers), counted where the socket is read and written,
    heartbeats included. ``with DriverBytes() as io: ...; io.read, io.written``."""

    def __enter__(self):
        from tornado.iostream import IOStream

        self.read = self.written = 0
        self._saved = IOStream.read_from_fd, IOStream.write_to_fd
        read_fd, write_fd = self._saved

        def read_from_fd(stream, buf):
            n = read_fd(stream, buf)
            self.read += n or 0
            return n

        def write_to_fd(stream, data):
            n = write_fd(stream, data)
            self.written += n
            return n

        IOStream.read_from_fd, IOStream.write_to_fd = read_from_fd, write_to_fd
        return self

    def __exit__(self, *exc):
        from tornado.iostream import IOStream

        IOStream.read_from_fd, IOStream.write_to_fd = self._saved


def engine_round(n_workers, repeats=50, rows_per_worker=20_000, k=256, d=32):
    """One real partition (two chunks) per single-thread worker: the median empty iteration, the driver's
    CPU per round trip, and the bytes the driver reads and writes per Lloyd iteration (k x d centres)."""
    X = np.random.default_rng(0).standard_normal((n_workers * rows_per_worker, d)).astype(np.float32)
    src = as_source(X, chunk_rows=rows_per_worker // 2)
    prepared = Prepared(np.random.default_rng(1).standard_normal((k, d)), X.dtype)
    with connect(n_workers=n_workers, threads_per_worker=1) as client, open_engine(src, client, 0) as engine:
        assert engine.n_workers == n_workers, engine.describe()
        engine.overhead_ms(5)
        cpu = time.process_time()
        ms = [engine.empty_iteration_ms() for _ in range(repeats)]
        cpu_ms = 1000 * (time.process_time() - cpu) / repeats
        bytes_in, bytes_out = [], []
        for _ in range(10):
            with DriverBytes() as io:
                engine.reduce(lloyd_step, prepared)
            bytes_in.append(io.read)
            bytes_out.append(io.written)
    return {
        "workers": n_workers,
        "chunks": src.n_chunks,
        "overhead_ms": statistics.median(ms),
        "driver_cpu_ms": cpu_ms,
        "lloyd_bytes_in": statistics.median(bytes_in),
        "lloyd_bytes_out": statistics.median(bytes_out),
        "k": k,
        "d": d,
    }


def em_bytes(n_chunks, n_workers=4, rows=400_000, d=64, C=2000, iterations=6):
    """Bytes into the driver per steady-state EM iteration (σ² known) of var-GMM-S, C clusters."""
    X = np.random.default_rng(2).standard_normal((rows, d)).astype(np.float32)
    seen = []
    with (
        connect(n_workers=n_workers, threads_per_worker=1) as client,
        DriverBytes() as io,
        dask.config.set({"dask_clust.min-chunks": n_chunks, "dask_clust.min-chunk-bytes": "1KiB"}),
    ):
        m = api.fit(
            X,
            "vargmm",
            C,
            init="random",
            max_iter=iterations,
            tol=0,
            random_state=0,
            client=client,
            callback=lambda rec: seen.append(io.read),
        )
    return {
        "chunks": m.engine_["chunks"],
        "workers": n_workers,
        "rows": rows,
        "d": d,
        "C": C,
        "bytes_in": statistics.median(b - a for a, b in zip(seen[1:], seen[2:])),
    }


def overhead(run):
    """Empty iteration, driver CPU and Lloyd bytes against the number of workers, one partition each."""
    for n_workers in OVERHEAD_WORKERS[:2] if run.tiny else OVERHEAD_WORKERS:
        logger.info("engine round trips with %d workers", n_workers)
        run.emit(
            {
                "kind": "overhead",
                **engine_round(n_workers, repeats=5 if run.tiny else 50, rows_per_worker=2000 if run.tiny else 20_000),
            }
        )


def run_all(run):
    strong(run)
    overhead(run)


class PeakRSS:
    """This process's peak resident memory above its level at the start of the block, sampled every 5 ms."""

    def __enter__(self):
        import threading

        import psutil

        self._proc = psutil.Process()
        self.base = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.extra = self.peak - self.base


def coreset_driver_memory(rows=1_000_000, d=64, n_workers=4, in_process_bytes="64MiB"):
    """The driver's peak memory while a coreset of ``rows`` x ``d`` float32 is drawn from a dask array of
    4 x ``rows`` rows on ``n_workers`` workers and Lloyd runs on it (``in-process-bytes`` below the
    coreset's size, so it stays on the workers)."""
    from dask_clust.datasets import make_blobs

    X, _ = make_blobs(4 * rows, d, 50, random_state=0)
    with (
        connect(n_workers=n_workers, threads_per_worker=1) as client,
        dask.config.set({"dask_clust.in-process-bytes": in_process_bytes}),
    ):
        api.fit(X[:200_000], "kmeans", 8, coreset_size=100_000, max_iter=1, client=client)  # warm the workers
        with PeakRSS() as rss:
            m = api.fit(
                X, "kmeans", 16, init="random", coreset_size=rows, max_iter=2, tol=0, random_state=0, client=client
            )
    coreset_bytes = rows * d * 4
    return {
        "coreset_rows": rows,
        "d": d,
        "workers": n_workers,
        "coreset_bytes": coreset_bytes,
        "driver_peak_extra": rss.extra,
        "ratio": rss.extra / coreset_bytes,
        "objective": m.objective_,
    }


def sharded_lloyd(n_workers, k=4096, d=64, rows_per_worker=20_000, iterations=4):
    """A Lloyd fit at k x d with the centres on the driver and with them sharded on the workers
    (``model-bytes`` 1 B): bytes into and out of the driver per iteration and wall time per iteration,
    both ways, in one run; the two models must be the same bits."""
    X = np.random.default_rng(3).standard_normal((n_workers * rows_per_worker, d)).astype(np.float32)
    init = np.random.default_rng(4).standard_normal((k, d))
    out = {"workers": n_workers, "k": k, "d": d, "model_bytes": init.nbytes}
    centers = {}
    with (
        connect(n_workers=n_workers, threads_per_worker=1) as client,
        dask.config.set({"dask_clust.min-chunks": 2 * n_workers, "dask_clust.min-chunk-bytes": "1KiB"}),
    ):
        for name, limit in (("driver", "1TiB"), ("sharded", "1")):
            seen, times = [], []
            with dask.config.set({"dask_clust.model-bytes": limit}), DriverBytes() as io:
                m = api.fit(
                    X,
                    "kmeans",
                    k,
                    init=init,
                    max_iter=iterations,
                    tol=0,
                    client=client,
                    callback=lambda rec: (seen.append((io.read, io.written)), times.append(rec["wall_s"])),
                )
            steps = list(zip(seen[1:], seen[2:]))
            out[f"{name}_bytes_in"] = statistics.median(b[0] - a[0] for a, b in steps)
            out[f"{name}_bytes_out"] = statistics.median(b[1] - a[1] for a, b in steps)
            out[f"{name}_s_per_iteration"] = statistics.median(times[1:])
            centers[name] = m.cluster_centers_
    out["same_bits"] = bool(np.array_equal(centers["driver"], centers["sharded"]))
    return out
