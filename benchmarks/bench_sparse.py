"""Documents as sparse rows (issue #56), every figure from one run on this machine, every library on the same
threads: ``--rows`` (1M) TF-IDF rows of a topic model over a 50,000-term Zipf vocabulary (``dask_clust.datasets
.make_documents``: a few hundred topics, about 150 words a document, density about 0.2 %), k = ``--k`` (256).

For each of ``--algos``: ``dask_clust.fit(X, algo, k)`` on the CSR matrix at its defaults (in-process, the
threads of ``--threads``), then scikit-learn's ``KMeans(k)`` (against kmeans) or ``MiniBatchKMeans(k)`` (against
minibatch, nmbatch and vcgmm; run once) at theirs on the same CSR matrix in a fresh process, stopped at
``--cap`` seconds: wall time and QE (each model's, over every row, by the same CSR kernel). Target: faster at a
QE within 1 %. Our time prints as soon as our fit ends. KMeans runs verbose, and the inertia it prints before
each iteration's update, timed as it comes, gives its time to within 1 % of our QE (cumulative wall time from the
start of its fit, its k-means++ seeding included) even where ``--cap`` stops it first.

``--workers 1,2,4``: our fit again on LocalClusters of that many one-thread workers, each from the CSR matrix and
from a dask array of its CSR blocks: whether every model is the in-process one, bit for bit, and each worker's
peak resident memory against what it holds of the rows (the CSR bytes of its chunks) and the dense rows it
would otherwise hold: memory O(nnz of its chunks + k·D).

    python benchmarks/bench_sparse.py [--rows 1000000] [--k 256] [--algos kmeans,minibatch,nmbatch,vcgmm]
        [--cap 3600]
        [--workers 1,2,4]
"""

import argparse
import multiprocessing
import os
import queue
import tempfile
import time

from threadpoolctl import threadpool_limits

import dask_clust
from dask_clust.datasets import make_documents
from dask_clust.kernels.assign import Prepared, nearest
from harness.common import emit, local_cluster
from harness.measure import peak_memory

# what a user would pick instead: Lloyd for Lloyd, mini-batches for the methods that read a sample of the rows
THEIRS = {"kmeans": "KMeans", "minibatch": "MiniBatchKMeans", "nmbatch": "MiniBatchKMeans", "vcgmm": "MiniBatchKMeans"}


def qe(C, X):
    """Σ min_c ||x − c||² over the CSR rows X, by the CSR kernel (the same for every model's centres)."""
    centers = Prepared(C, X.dtype)
    return float(sum(nearest(X[a : a + 65536], centers)[1].sum() for a in range(0, X.shape[0], 65536)))


class _Timeline:
    """A stdout that sends each "Iteration i, inertia q." line of a verbose KMeans to the parent as (seconds since
    the fit began, q) the moment it is printed, so a capped fit still tells when it reached a quality."""

    def __init__(self, out, start):
        self.out, self.start = out, start

    def write(self, text):
        for line in text.splitlines():
            if line.startswith("Iteration ") and "inertia" in line:
                self.out.put(("step", time.perf_counter() - self.start, float(line.rsplit(" ", 1)[1].rstrip("."))))
        return len(text)

    def flush(self):
        pass


def _theirs(out, path, algo, k, seed, threads):
    """scikit-learn's estimator at its defaults on the CSR matrix saved at ``path``: ("done", seconds, iterations
    or steps, QE, peak bytes of the process). KMeans runs verbose (its inertia before each iteration's update, one
    O(nnz) pass beside the O(nnz·k) iteration), each line sent as it comes."""
    import contextlib

    import sklearn.cluster
    from scipy import sparse

    X = sparse.load_npz(path)
    verbose = {"verbose": 1} if THEIRS[algo] == "KMeans" else {}
    with threadpool_limits(threads):
        t = time.perf_counter()
        with contextlib.redirect_stdout(_Timeline(out, t)):
            est = getattr(sklearn.cluster, THEIRS[algo])(k, random_state=seed, **verbose).fit(X)
        seconds = time.perf_counter() - t
    steps = int(getattr(est, "n_steps_", est.n_iter_))
    out.put(("done", seconds, steps, qe(est.cluster_centers_, X), peak_memory()))


def theirs(path, algo, k, seed, threads, cap_s):
    """(the final figures or None past the cap, the timeline of (seconds, inertia) KMeans printed on the way)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_theirs, args=(out, path, algo, k, seed, threads), daemon=True)
    proc.start()
    deadline = time.perf_counter() + cap_s
    timeline = []
    try:
        while True:
            try:
                got = out.get(timeout=max(deadline - time.perf_counter(), 0.001))
            except queue.Empty:
                return None, timeline
            if got[0] == "done":
                return got[1:], timeline
            timeline.append(got[1:])
            print(f"  scikit-learn's iteration {len(timeline) - 1}: {got[1]:.1f} s, inertia {got[2]:.6g}", flush=True)
    finally:
        proc.kill()
        proc.join()


def reached(timeline, target):
    """The first (seconds, inertia) of the timeline at or below target, or None."""
    return next((step for step in timeline if step[1] <= target), None)


def _peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def on_workers(X, algo, k, seed, n_workers, want):
    """Our fit on n one-thread workers from the CSR matrix, then from a dask array of its CSR blocks: (whether
    both models are ``want``'s, bit for bit, each worker's peak resident bytes over both)."""
    import dask.array as da

    same = True
    with local_cluster(n_workers, 1) as client:
        for rows in (X, da.from_array(X, chunks=(100_000, X.shape[1]), asarray=False)):
            model = dask_clust.fit(rows, algo, k, random_state=seed, client=client)
            same &= bool((model.cluster_centers_ == want.cluster_centers_).all())
        # the high-water mark of the worker's own memory (ru_maxrss would carry this process's across exec)
        peaks = client.run(_peak)
    return same, sorted(peaks.values())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--topics", type=int, default=300)
    p.add_argument("--algos", default="kmeans,minibatch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cap", type=float, default=3600.0, help="seconds a scikit-learn fit may take (0: none runs)")
    p.add_argument("--workers", default="", help="worker counts, e.g. 1,2,4")
    args = p.parse_args()
    from scipy import sparse

    t = time.perf_counter()
    X, _ = make_documents(args.rows, 50_000, args.topics, random_state=args.seed)
    made_s = time.perf_counter() - t
    density = X.nnz / (X.shape[0] * X.shape[1])
    csr_bytes = int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes)
    print(
        f"{X.shape[0]:,} x {X.shape[1]:,}, {X.nnz:,} non-zeros (density {100 * density:.3f} %, "
        f"{csr_bytes / 2**20:,.0f} MiB as CSR), made in {made_s:.0f} s",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "documents.npz")
        sparse.save_npz(path, X, compressed=False)
        baselines = {}  # scikit-learn's estimator's figures, by its name
        for algo in args.algos.split(","):
            with threadpool_limits(args.threads):
                t = time.perf_counter()
                ours = dask_clust.fit(X, algo, args.k, random_state=args.seed, client="in-process")
                ours_s = time.perf_counter() - t
            steps = ours.n_iter_
            ours_qe = qe(ours.cluster_centers_, X)
            print(f"{algo} ours: {ours_s:.1f} s, {steps} iterations, QE {ours_qe:.6g}", flush=True)
            if THEIRS[algo] not in baselines:
                run = args.cap > 0
                baselines[THEIRS[algo]] = theirs(path, algo, args.k, args.seed, args.threads, args.cap) if run else None
            got, timeline = baselines[THEIRS[algo]] or (None, [])
            within = reached(timeline, 1.01 * ours_qe)
            row = {
                "algo": algo,
                "rows": args.rows,
                "terms": X.shape[1],
                "nnz": int(X.nnz),
                "k": args.k,
                "seed": args.seed,
                "threads": args.threads,
                "ours_s": ours_s,
                "ours_qe": ours_qe,
                "ours_iter": steps,
                "csr_bytes": csr_bytes,
                "dense_bytes": int(X.shape[0]) * int(X.shape[1]) * 4,
            }
            if timeline:
                row.update(sklearn_timeline=timeline)
                print(
                    f"{algo}: scikit-learn's {THEIRS[algo]} "
                    + (
                        f"first within 1 % of our QE after {within[0]:.1f} s (inertia {within[1]:.6g}): "
                        f"{within[0] / ours_s:.2f}x our time to that quality"
                        if within
                        else f"not within 1 % of our QE in {len(timeline)} iterations, "
                        f"{timeline[-1][0]:.1f} s (inertia {timeline[-1][1]:.6g})"
                    ),
                    flush=True,
                )
            if got is None and args.cap > 0:
                row.update(sklearn="cap", cap_s=args.cap)
                print(f"{algo}: scikit-learn's {THEIRS[algo]} did not end within {args.cap:.0f} s")
            elif got is None:
                row.update(sklearn="not run")
            else:
                sk_s, sk_steps, sk_qe, sk_peak = got
                row.update(sklearn_s=sk_s, sklearn_iter=sk_steps, sklearn_qe=sk_qe, sklearn_peak=sk_peak)
                print(
                    f"{algo} on CSR, {args.rows:,} x 50,000, k = {args.k}: ours {ours_s:.1f} s ({steps} "
                    f"iterations); scikit-learn's {THEIRS[algo]} {sk_s:.1f} s ({sk_steps}): {sk_s / ours_s:.2f}x "
                    f"its speed, QE {100 * (ours_qe / sk_qe - 1):+.2f} %",
                    flush=True,
                )
            for n in (int(v) for v in args.workers.split(",") if v):
                same, peaks = on_workers(X, algo, args.k, args.seed, n, ours)
                row[f"workers_{n}"] = {"same_model": same, "peaks": peaks}
                share, dense = csr_bytes / n, row["dense_bytes"] / n
                print(
                    f"{algo} on {n} workers: the in-process model from the CSR matrix and from a dask array of CSR "
                    f"blocks: {same}; peak {max(peaks) / 2**20:,.0f} MiB a worker, each holding about "
                    f"{share / 2**20:,.0f} MiB of CSR rows ({dense / 2**30:,.1f} GiB dense) and float64 centres of "
                    f"{args.k * X.shape[1] * 8 / 2**20:,.0f} MiB",
                    flush=True,
                )
            emit("sparse", row)


if __name__ == "__main__":
    main()
