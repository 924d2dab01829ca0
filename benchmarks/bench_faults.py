"""Faults (issue #20), measured on this machine:
--parts checkpoint  the cost of checkpoints: kmeans (Lloyd, 20 iterations) and vargmm (10) on 2M x 32 lazy
                 blobs on a LocalCluster of 2 workers, without checkpoints and with one after every
                 iteration (per-row state written by the workers); reported: wall time and its ratio, the
                 checkpoint's size on disk, and that the models are the same bits.
--parts kill     the kill matrix: each of 7 algorithms x {persisted dask, zarr on disk, numpy scattered by the
                 library} x {workers under nannies, workers without one} x {placement,
                 seeding/coreset, during a call, between calls}: one of 3 single-thread worker processes is
                 SIGKILLed (placement: before the first pass, seeding: before the fit's second call, during a
                 call: a timer half an undisturbed iteration into iteration 3, between calls: in the callback
                 after iteration 2); reported per case: the same model bits as the undisturbed fit or not,
                 partitions rebuilt, and the wall time the kill added. --algos, --forms narrow it.
--parts churn    workers lost in other ways than one SIGKILL (issue #35), on a LocalCluster of 4 single-thread
                 workers under nannies, persisted input, the event at iteration 3: two workers SIGKILLed at
                 once; all four at once (a state lost with every copy is replayed); two killed 5 iterations
                 apart; every worker restarted one after another (client.restart_workers, a rolling restart;
                 the fit slowed by 1 s per iteration while it runs, that time left out of the figures); one
                 killed and then the worker its partition is being rebuilt on, right after the partition was
                 submitted to it; one frozen for good (SIGSTOP, detected after unresponsive-worker-timeout,
                 20 s); and the cluster shrinking gracefully: client.retire_workers of one worker,
                 cluster.scale(2), Adaptive(minimum=2, maximum=4). Each fit under a 300 s timeout; reported
                 per case: the same model bits or not, partitions rebuilt, the wall time added, and for a
                 shrink the time until the scheduler dropped the workers it retired (the hand-over) and the
                 workers left. --algos, --cases narrow it (default: every registered algorithm).
--parts stream   what a streamed fit holds on a worker (kmeans and vargmm; one worker, zarr stores of 1 and
                 2 GiB): the per-row state and the per-pass bytes it measures, against the engine's estimate.
--parts memory   vargmm on a zarr store (32-d float32 blobs in 32 MiB zarr chunks) 4x the memory of a
                 LocalCluster (3 workers x 1 thread, --worker-mib each): refused before any work with one
                 line, or streamed within the limits; reported: the outcome, the time to it, each worker's peak
                 resident size against its limit. --kmeans adds Lloyd from random rows (2 iterations) on the
                 same store with the default 128 MiB chunks (refused when a worker cannot hold a chunk and its
                 input blocks) and with --chunk-mib chunks.
"""

import argparse
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time

import dask
import dask.array as da
import numpy as np
from distributed import Client, LocalCluster

import dask_clust
from dask_clust.datasets import make_blobs
from dask_clust.engine.local import worker_environ
from harness import streaming
from harness.common import dask_process, emit
from harness.measure import Workers


def store(path, rows, d):
    return streaming.store(path, rows, (32 << 20) // (4 * d), d)  # 32 MiB zarr chunks


def fit(X, client, algo, settings, **kw):
    workers = Workers(client)
    workers.reset()
    t = time.perf_counter()
    estimate = None
    try:
        with dask.config.set(settings):
            m = dask_clust.fit(X, algo=algo, n_clusters=20, random_state=0, client=client, **kw)
        outcome = f"fitted ({'streamed' if m.engine_.get('streaming') else 'persisted'}, {m.n_iter_} iterations)"
        estimate = m.engine_.get("stream_estimate_bytes")
    except dask_clust.InputError as exc:
        outcome = f"refused: {exc}"
    return {
        "algo": algo,
        "outcome": outcome,
        "s": time.perf_counter() - t,
        "peak_worker_bytes": workers.peak(),
        "estimate_bytes": estimate,
    }


def memory(args):
    limit = args.worker_mib << 20
    d = 32
    rows = 4 * 3 * limit // (d * 4)
    scratch = tempfile.mkdtemp(prefix="bench-faults-")
    try:
        t = time.perf_counter()
        X = store(os.path.join(scratch, "x.zarr"), rows, d)
        print(f"wrote {X.nbytes / 2**30:.2f} GiB ({rows:,} x {d} float32) in {time.perf_counter() - t:.0f} s")
        with (
            dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ()}),
            LocalCluster(
                n_workers=3, threads_per_worker=1, memory_limit=limit, dashboard_address="127.0.0.1:0"
            ) as cluster,
            Client(cluster) as client,
        ):
            client.wait_for_workers(3)
            runs = [("vargmm", {}, {"max_iter": 3})]
            if args.kmeans:  # random rows: a seeding of one pass, then 2 Lloyd passes and the final QE pass
                lloyd = {"init": "random", "max_iter": 2, "tol": 0}
                runs += [("kmeans", {}, lloyd), ("kmeans", {"dask_clust.chunk-bytes": f"{args.chunk_mib}MiB"}, lloyd)]
            for algo, settings, kw in runs:
                row = {
                    "rows": rows,
                    "data_bytes": int(X.nbytes),
                    "worker_limit": limit,
                    "settings": settings,
                    **fit(X, client, algo, settings, **kw),
                }
                emit("faults_memory", row)
                peak = row["peak_worker_bytes"]
                print(
                    f"{algo} {settings or ''}: {row['outcome']} after {row['s']:.1f} s; worker peak "
                    f"{'?' if peak is None else f'{peak / 2**20:.0f}'} MiB of {args.worker_mib} MiB"
                    + (f" (estimated {row['estimate_bytes'] / 2**20:.0f} MiB)" if row["estimate_bytes"] else "")
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def rss():
    import psutil

    return psutil.Process().memory_info().rss


def calibrate(args):
    """What a streamed fit holds on a worker, measured: one worker of one thread, zarr stores of 1 and 2 GiB
    (32-d float32 in 32 MiB zarr chunks), every pass streamed from the store in 32 MiB chunks; per algorithm,
    the worker's peak above its resident size before the fit, against the rows it holds. The slope is the
    fit's per-row state in bytes, the intercept what a pass holds beyond it (chunks, codec, partials)."""
    d = 32
    scratch = tempfile.mkdtemp(prefix="bench-stream-")
    settings = {"dask_clust.stream": True, "dask_clust.chunk-bytes": "32MiB", "dask_clust.min-chunk-bytes": "1MiB"}
    fits = {"kmeans": dict(init="random", max_iter=3, tol=0), "vargmm": dict(max_iter=2, tol=0)}
    try:
        stores = {gib: store(os.path.join(scratch, f"x{gib}.zarr"), int(gib * 2**30) // (4 * d), d) for gib in (1, 2)}
        with (
            dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ()}),
            LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=0, dashboard_address="127.0.0.1:0") as cluster,
            Client(cluster) as client,
            dask.config.set(settings),
        ):
            for algo, kw in fits.items():
                dask_clust.fit(stores[1][:200_000], algo=algo, n_clusters=20, random_state=0, client=client, **kw)
                points = []
                for gib, X in stores.items():
                    time.sleep(2)  # the last fit's heap is given back once its keys are gone
                    base = max(client.run(rss).values())
                    row = fit(X, client, algo, {}, **kw)
                    above = row["peak_worker_bytes"] - base
                    points.append((X.shape[0], above))
                    emit(
                        "faults_stream",
                        {
                            **row,
                            "rows": X.shape[0],
                            "base_bytes": base,
                            "above_bytes": above,
                            "declared": dask_clust.algorithms.state_of(
                                dask_clust.REGISTRY[algo],
                                dask_clust.REGISTRY[algo].config(n_clusters=20, **kw),
                                4 * d + 8,
                            ),
                        },
                    )
                    print(
                        f"{algo} {X.nbytes / 2**30:.0f} GiB: {row['outcome']}; worker {base / 2**20:.0f} MiB before, "
                        f"peak {row['peak_worker_bytes'] / 2**20:.0f} MiB ({above / 2**20:.0f} above it), "
                        f"estimated {row['estimate_bytes'] / 2**20:.0f} MiB"
                    )
                (n1, a1), (n2, a2) = points
                slope = (a2 - a1) / (n2 - n1)
                print(f"{algo}: {slope:.1f} B per row of state; {(a1 - slope * n1) / 2**20:.0f} MiB per pass beyond it")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


KILL_FITS = {
    "kmeans": dict(tol=0, max_iter=8),
    "nmbatch": dict(batch_size=4000, rho=10.0, max_iter=12),
    "minibatch": dict(batch_size=500, max_iter=12),
    "sbe": dict(omaxit=8, eval_every=2),
    "vrkm": dict(max_epochs=6),
    "vcgmm": dict(coreset_size=20_000, tol=0, max_iter=8),
    "vargmm": dict(tol=0, max_iter=8),
}
WHEN = ("placement", "seeding", "call", "between")


def inputs(scratch):
    """The same 60,000 x 8 blobs as a dask array persisted on the client, a zarr store and numpy (chunks of
    6,000 rows): form -> (client -> input)."""
    X, _ = make_blobs(60_000, 8, 20, chunks=6000, random_state=5)
    da.to_zarr(X.astype("float32"), os.path.join(scratch, "x.zarr"))
    local = X.astype("float32").compute()
    return {
        "persisted": lambda client: client.persist(da.from_array(local, chunks=6000)),
        "zarr": lambda client: da.from_zarr(os.path.join(scratch, "x.zarr")),
        "numpy": lambda client: local,
    }


class Killer:
    """SIGKILLs ``victim`` (a pid) at the moment ``when`` names, during one fit."""

    def __init__(self, when, victim, iteration_s):
        self.when, self.victim, self.iteration_s = when, victim, iteration_s
        self.calls, self.fired, self.timer = 0, False, None

    def fire(self):
        if not self.fired:
            self.fired = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.victim, signal.SIGKILL)

    def before_call(self):
        self.calls += 1
        if (self.when, self.calls) in (("placement", 1), ("seeding", 2)):
            self.fire()

    def callback(self, record):
        if self.when == "between" and record["iteration"] == 2:
            self.fire()
        if self.when == "call" and record["iteration"] == 2:  # lands in iteration 3's calls
            self.timer = threading.Timer(self.iteration_s / 2, self.fire)
            self.timer.start()


@contextlib.contextmanager
def killing(killer):
    from dask_clust.engine.ops import Engine

    reduce = Engine.reduce

    def counted(self, *args, **kwargs):
        killer.before_call()
        return reduce(self, *args, **kwargs)

    Engine.reduce = counted
    try:
        yield
    finally:
        Engine.reduce = reduce
        if killer.timer is not None:
            killer.timer.cancel()


class ProcessCluster:
    """A scheduler and 3 single-thread workers started as separate processes on 127.0.0.1 (as dask-jobqueue
    or a Helm chart starts them), each under a nanny or not. Between cases a worker no nanny brought back is
    started again (the processes of one a nanny did not bring back within 30 s, too)."""

    def __init__(self, scratch, nanny):
        self.nanny = nanny
        self.scheduler_file = os.path.join(scratch, f"scheduler-{'nanny' if nanny else 'bare'}.json")
        self.procs = [dask_process("scheduler", self.scheduler_file)]
        while not os.path.exists(self.scheduler_file):
            time.sleep(0.2)
        self.client = Client(scheduler_file=self.scheduler_file)
        self.workers = []
        self.refill()

    def _start(self):
        env = {**os.environ, **{k: str(v) for k, v in worker_environ().items()}}
        return dask_process("worker", self.scheduler_file, self.nanny, env)

    def refill(self):
        """The worker pids, once 3 workers are there."""
        for _ in range(3):
            self.workers = [p for p in self.workers if p.poll() is None]
            while len(self.workers) < 3:
                self.workers.append(self._start())
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if len(self.client.scheduler_info()["workers"]) == 3:
                        time.sleep(0.5)  # a nanny that has just restarted its worker settles
                        return sorted(self.client.run(os.getpid).values())
                except OSError:  # a worker left while asked
                    pass
                time.sleep(0.2)
            print("3 workers did not come back within 30 s: starting them again", flush=True)
            for p in self.workers:
                p.kill()
            self.workers = []
        raise RuntimeError("could not get 3 workers")

    def close(self):
        self.client.close()
        for p in self.workers + self.procs:
            p.kill()


def kill_case(client, algo, form, X, when, victim, calm, calm_s, iteration_s, setup):
    killer = Killer(when, victim, iteration_s)
    t = time.perf_counter()
    try:
        with killing(killer):
            hit = dask_clust.fit(
                X, callback=killer.callback, algo=algo, n_clusters=20, random_state=0, client=client, **KILL_FITS[algo]
            )
        same = bool(np.array_equal(hit.cluster_centers_, calm.cluster_centers_) and hit.objective_ == calm.objective_)
        outcome, rebuilds = ("same bits" if same else "DIFFERENT MODEL"), hit.engine_["rebuilds"]
    except Exception as exc:  # reported, never hidden: the case failed
        outcome, rebuilds = f"FAILED: {type(exc).__name__}: {str(exc)[:160]}", None
    wall = time.perf_counter() - t
    row = {
        "algo": algo,
        "form": form,
        "setup": setup,
        "when": when,
        "killed": killer.fired,
        "outcome": outcome,
        "rebuilds": rebuilds,
        "calm_s": calm_s,
        "hit_s": wall,
        "extra_s": wall - calm_s,
    }
    emit("faults_kill", row)
    print(
        f"{setup:8} {form:9} {algo:9} {when:9} {outcome:10} killed={killer.fired} rebuilds={rebuilds} "
        f"+{wall - calm_s:.1f} s",
        flush=True,
    )
    return row


def kill(args):
    scratch = tempfile.mkdtemp(prefix="bench-kill-")
    algos = args.algos.split(",") if args.algos else list(KILL_FITS)
    forms = args.forms.split(",") if args.forms else ["persisted", "zarr", "numpy"]
    # every worker holds partitions (about 30 chunks), and vc-GMM's coreset stays on the workers
    settings = {
        "dask_clust.in-process-bytes": "1KiB",
        "dask_clust.working-set-chunk-rows": 4000,
        "dask_clust.min-chunk-bytes": "64KiB",
        "dask_clust.lost-worker-timeout": "30s",
    }
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    summary = []
    try:
        with dask.config.set({"distributed.nanny.pre-spawn-environ": worker_environ(), **settings}):
            data = inputs(scratch)
            for setup, nanny in (("nanny", True), ("no nanny", False)):
                workers = ProcessCluster(scratch, nanny)
                try:
                    for form in forms:
                        for algo in algos:
                            workers.refill()
                            for _ in range(2):  # the second run's time: the first compiles and warms up
                                t = time.perf_counter()
                                calm = dask_clust.fit(
                                    data[form](workers.client),
                                    algo=algo,
                                    n_clusters=20,
                                    random_state=0,
                                    client=workers.client,
                                    **KILL_FITS[algo],
                                )
                                calm_s = time.perf_counter() - t
                            iteration_s = float(np.median([h["wall_s"] for h in calm.history_]))
                            for when in WHEN:
                                pids = workers.refill()
                                summary.append(
                                    kill_case(
                                        workers.client,
                                        algo,
                                        form,
                                        data[form](workers.client),
                                        when,
                                        pids[len(summary) % 3],
                                        calm,
                                        calm_s,
                                        iteration_s,
                                        setup,
                                    )
                                )
                finally:
                    workers.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    same = sum(r["outcome"] == "same bits" for r in summary)
    extra = sorted(r["extra_s"] for r in summary if r["outcome"] == "same bits")
    print(
        f"{same} of {len(summary)} cases ended with the undisturbed model's bits; extra wall time median "
        f"{np.median(extra) if extra else float('nan'):.1f} s, max {max(extra) if extra else float('nan'):.1f} s"
    )


# (rows of the 8-d blobs, clusters, parameters, working-set-chunk-rows): SLK on fewer rows (its kNN graph), 10
# outer iterations; the working sets (vc-GMM's coreset, SLK's normalised rows) in 5 or 10 chunks
CHURN_FITS = {
    "kmeans": (60_000, 20, dict(tol=0, max_iter=14), 4000),
    "nmbatch": (60_000, 20, dict(batch_size=4000, rho=10.0, max_iter=14), 4000),
    "vcgmm": (60_000, 20, dict(coreset_size=20_000, tol=0, max_iter=14), 4000),
    "slk": (6000, 5, dict(tol=0, min_iter=10, max_iter=10), 600),
    "minibatch": (60_000, 20, dict(batch_size=500, max_iter=14), 4000),
    "vrkm": (60_000, 20, dict(max_epochs=14), 4000),
    "sbe": (60_000, 20, dict(omaxit=14, eval_every=2), 4000),
    "vargmm": (60_000, 20, dict(tol=0, max_iter=14), 4000),
}


class Churn:
    """The event ``case`` against the workers of ``client`` (pids by address taken before the fit) and its
    ``cluster``, fired from the fit's callback; ``cleanup`` continues a frozen worker that is still there."""

    def __init__(self, case, client, cluster):
        self.case, self.client, self.cluster = case, client, cluster
        self.pids = client.run(os.getpid)
        self.victims = [self.pids[a] for a in sorted(self.pids)]
        self.done, self.thread, self.frozen = set(), None, []
        # a rolling restart or a shrinking cluster takes longer than these fits: they are slowed while it runs
        self.paced_s = 0.0
        self.handover_s = None  # a shrink's call until the scheduler has dropped the workers it retires

    def _kill(self, pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def callback(self, record):
        it = record["iteration"]
        if self.thread is not None and self.thread.is_alive():
            time.sleep(PACE_S)
            self.paced_s += PACE_S
        if it in self.done:
            return
        self.done.add(it)
        if it == 3 and self.case in ("two at once", "all at once"):
            for pid in self.victims[: 2 if self.case == "two at once" else None]:
                self._kill(pid)
        elif self.case == "two apart" and it in (3, 8):
            self._kill(self.victims[0 if it == 3 else 2])
        elif it == 3 and self.case == "kill during rebuild":
            self._kill(self.victims[1])
        elif it == 3 and self.case == "frozen":
            self.frozen.append(self.victims[1])
            os.kill(self.victims[1], signal.SIGSTOP)
        elif it == 3 and self.case == "rolling restart":

            def roll():
                for addr in sorted(self.pids):
                    with contextlib.suppress(Exception):
                        self.client.restart_workers([addr], timeout=60)

            self.thread = threading.Thread(target=roll, daemon=True)
            self.thread.start()
        elif it == 3 and self.case in SHRINKS:
            self.thread = threading.Thread(target=self._shrink, daemon=True)
            self.thread.start()

    def _shrink(self):
        """Graceful retirement as users' clusters do it: ``retire_workers`` of the first worker, ``scale(2)``
        (Kubernetes, SpecCluster), or ``Adaptive(minimum=2, maximum=4)`` finding the cluster idle (a fit's
        calls are not tasks); waits until the scheduler has dropped them (60 s at most)."""
        t = time.perf_counter()
        want = len(self.pids) - 1 if self.case == "retire" else 2
        if self.case == "retire":
            self.client.retire_workers([sorted(self.pids)[0]])
        elif self.case == "scale down":
            self.cluster.scale(2)
        else:
            self.cluster.adapt(minimum=2, maximum=4, interval="500ms", wait_count=2)
        while len(self.client.scheduler_info()["workers"]) > want and time.perf_counter() - t < 60:
            time.sleep(0.05)
        self.handover_s = time.perf_counter() - t

    def cleanup(self):
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.thread is not None:
            self.thread.join(120)


@contextlib.contextmanager
def killing_the_first_rebuild_target(client):
    """``Placement.spawn`` SIGKILLs the worker of the first partition rebuilt, right after submitting it."""
    from dask_clust.engine.placement import Placement
    from dask_clust.engine.recovery import Recovery

    spawn, recover, state = Placement.spawn, Recovery.recover, {"recovering": False, "killed": False}

    def spawned(self, pid, ids, addr, futs, threads):
        made = spawn(self, pid, ids, addr, futs, threads)
        if state["recovering"] and not state["killed"]:
            state["killed"] = True
            with contextlib.suppress(Exception):
                os.kill(self.client.run(os.getpid, workers=[addr])[addr], signal.SIGKILL)
        return made

    def recovering(self, *a, **k):
        state["recovering"] = True
        return recover(self, *a, **k)

    Placement.spawn, Recovery.recover = spawned, recovering
    try:
        yield
    finally:
        Placement.spawn, Recovery.recover = spawn, recover


PACE_S = 1.0
SHRINKS = ("retire", "scale down", "adapt")
CHURN_CASES = ("two at once", "all at once", "two apart", "rolling restart", "kill during rebuild", "frozen") + SHRINKS


def churn_case(client, cluster, X, algo, case, calm, calm_s):
    event = Churn(case, client, cluster)
    got = {}

    def run():
        try:
            with (
                killing_the_first_rebuild_target(client) if case == "kill during rebuild" else contextlib.nullcontext()
            ):
                rows, k, params, _ = CHURN_FITS[algo]
                got["model"] = dask_clust.fit(
                    X, callback=event.callback, algo=algo, n_clusters=k, random_state=0, client=client, **params
                )
        except Exception as exc:  # reported, never hidden: the case failed
            got["error"] = f"FAILED: {type(exc).__name__}: {str(exc)[:200]}"

    t = time.perf_counter()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(300)
    wall = time.perf_counter() - t - event.paced_s
    event.cleanup()
    if thread.is_alive():
        outcome, rebuilds = "HUNG (no result after 300 s)", None
    elif "error" in got:
        outcome, rebuilds = got["error"], None
    else:
        hit = got["model"]
        same = bool(np.array_equal(hit.cluster_centers_, calm.cluster_centers_) and hit.objective_ == calm.objective_)
        outcome, rebuilds = ("same bits" if same else "DIFFERENT MODEL"), hit.engine_["rebuilds"]
    row = {
        "algo": algo,
        "case": case,
        "outcome": outcome,
        "rebuilds": rebuilds,
        "calm_s": calm_s,
        "hit_s": wall,
        "extra_s": wall - calm_s,
        "handover_s": event.handover_s,
        "workers_after": len(client.scheduler_info()["workers"]),
    }
    emit("faults_churn", row)
    shrink = (
        ""
        if event.handover_s is None
        else f" handed over in {event.handover_s:.2f} s, {row['workers_after']} workers left"
    )
    print(f"{algo:8} {case:20} {outcome:12} rebuilds={rebuilds} +{wall - calm_s:.1f} s{shrink}", flush=True)
    return row


def churn(args):
    algos = args.algos.split(",") if args.algos else list(CHURN_FITS)
    # every worker holds partitions (10 chunks), and vc-GMM's coreset stays on the workers
    settings = {"dask_clust.in-process-bytes": "1KiB", "dask_clust.min-chunk-bytes": "64KiB"}
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    summary = []
    with dask.config.set(settings):
        for algo in algos:
            rows, k, params, working_rows = CHURN_FITS[algo]
            X0, _ = make_blobs(rows, 8, k, chunks=rows // 10, random_state=5)
            for case in args.cases.split(",") if args.cases else CHURN_CASES:
                # a cluster per case: a hung case leaves its fit's thread behind
                with (
                    LocalCluster(n_workers=4, threads_per_worker=1, dashboard_address=":0") as lc,
                    Client(lc) as client,
                    dask.config.set({"dask_clust.working-set-chunk-rows": working_rows}),
                ):
                    X = client.persist(X0)
                    for _ in range(2):  # the second run's time: the first warms the workers up
                        t = time.perf_counter()
                        calm = dask_clust.fit(X, algo=algo, n_clusters=k, random_state=0, client=client, **params)
                        calm_s = time.perf_counter() - t
                    summary.append(churn_case(client, lc, X, algo, case, calm, calm_s))
    same = [r for r in summary if r["outcome"] == "same bits"]
    print(
        f"{len(same)} of {len(summary)} churn cases ended with the undisturbed model's bits; extra wall time: "
        + ", ".join(f"{r['algo']} {r['case']} +{r['extra_s']:.1f} s" for r in summary)
    )


def checkpoint_cost(args):
    X, _ = make_blobs(2_000_000, 32, 100, random_state=0)
    scratch = tempfile.mkdtemp(prefix="bench-ckpt-")
    try:
        with (
            LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address="127.0.0.1:0") as cluster,
            Client(cluster) as client,
        ):
            X = X.persist()
            for algo, kw in (
                ("kmeans", {"init": "random", "max_iter": 20, "tol": 0}),
                ("vargmm", {"max_iter": 10, "tol": 0}),
            ):
                dask_clust.fit(X, algo=algo, n_clusters=100, random_state=0, client=client, max_iter=1)  # warm-up
                times, models = {}, {}
                for every in (None, 1):
                    path = os.path.join(scratch, f"{algo}-{every}")
                    t = time.perf_counter()
                    models[every] = dask_clust.fit(
                        X,
                        algo=algo,
                        n_clusters=100,
                        random_state=0,
                        client=client,
                        checkpoint=path if every else None,
                        checkpoint_every=every or 1,
                        **kw,
                    )
                    times[every] = time.perf_counter() - t
                size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
                same = bool(np.array_equal(models[None].cluster_centers_, models[1].cluster_centers_))
                row = {
                    "algo": algo,
                    "iterations": models[1].n_iter_,
                    "plain_s": times[None],
                    "checkpointed_s": times[1],
                    "ratio": times[1] / times[None],
                    "checkpoint_bytes": size,
                    "same_bits": same,
                }
                emit("faults_checkpoint", row)
                print(
                    f"{algo}: {times[None]:.1f} s plain, {times[1]:.1f} s with a checkpoint every iteration "
                    f"(x{times[1] / times[None]:.2f}); checkpoint {size / 2**20:.1f} MiB; same bits: {same}"
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="memory")
    # a worker process alone (Python, numpy, numba, distributed) is about 200 MiB
    p.add_argument("--worker-mib", type=int, default=1024)
    p.add_argument("--kmeans", action="store_true")
    p.add_argument("--chunk-mib", type=int, default=32, help="chunk-bytes of the second kmeans fit")
    p.add_argument("--algos", help="kill, churn: comma-separated algorithms (default: all 7; churn: all 8)")
    p.add_argument("--cases", help="churn: comma-separated of " + ", ".join(CHURN_CASES))
    p.add_argument("--forms", help="kill: comma-separated of persisted, zarr, numpy (default: all)")
    args = p.parse_args()
    if "memory" in args.parts.split(","):
        memory(args)
    if "kill" in args.parts.split(","):
        kill(args)
    if "checkpoint" in args.parts.split(","):
        checkpoint_cost(args)
    if "stream" in args.parts.split(","):
        calibrate(args)
    if "churn" in args.parts.split(","):
        churn(args)


if __name__ == "__main__":
    main()
