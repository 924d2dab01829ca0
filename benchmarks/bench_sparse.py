"""Documents as sparse rows (issue #56), every figure from one run on this machine, every library on the same
threads: ``--rows`` (1M) TF-IDF rows of a topic model over a 50,000-term Zipf vocabulary (``dask_clust.datasets
.make_documents``: a few hundred topics, about 150 words a document, density about 0.3 %), k = ``--k`` (256).
``dask_clust.fit(X, "kmeans", k)`` on the CSR matrix at its defaults against scikit-learn's ``KMeans(k,
n_init=1)`` on the same CSR matrix: wall time and QE (each model's, over every row, by the same CSR kernel).
Target: faster at a QE within 1 %. Also the chunks' memory: what the fit holds of the rows (their CSR bytes)
against the dense rows it would otherwise need.

    python benchmarks/bench_sparse.py [--rows 1000000] [--k 256] [--topics 300] [--threads 2]
"""

import argparse
import time

from threadpoolctl import threadpool_limits

import dask_clust
from dask_clust.datasets import make_documents
from dask_clust.kernels.assign import Prepared, nearest
from harness.common import emit


def qe(C, X):
    """Σ min_c ||x − c||² over the CSR rows X, by the CSR kernel (the same for every model's centres)."""
    centers = Prepared(C, X.dtype)
    return float(sum(nearest(X[a : a + 65536], centers)[1].sum() for a in range(0, X.shape[0], 65536)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--k", type=int, default=256)
    p.add_argument("--topics", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    from sklearn.cluster import KMeans

    t = time.perf_counter()
    X, _ = make_documents(args.rows, 50_000, args.topics, random_state=args.seed)
    made_s = time.perf_counter() - t
    density = X.nnz / (X.shape[0] * X.shape[1])
    print(
        f"{X.shape[0]:,} x {X.shape[1]:,}, {X.nnz:,} non-zeros (density {100 * density:.3f} %), made in {made_s:.0f} s"
    )
    t = time.perf_counter()
    ours = dask_clust.fit(X, "kmeans", args.k, random_state=args.seed, client="in-process")
    ours_s = time.perf_counter() - t
    print(f"ours: {ours_s:.1f} s, {ours.n_iter_} iterations", flush=True)
    with threadpool_limits(args.threads):
        t = time.perf_counter()
        sk = KMeans(args.k, n_init=1, random_state=args.seed).fit(X)
        sk_s = time.perf_counter() - t
    row = {
        "rows": args.rows,
        "terms": X.shape[1],
        "nnz": int(X.nnz),
        "k": args.k,
        "seed": args.seed,
        "ours_s": ours_s,
        "ours_qe": qe(ours.cluster_centers_, X),
        "ours_iter": ours.n_iter_,
        "sklearn_s": sk_s,
        "sklearn_qe": qe(sk.cluster_centers_, X),
        "sklearn_iter": int(sk.n_iter_),
        "csr_bytes": int(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes),
        "dense_bytes": int(X.shape[0]) * int(X.shape[1]) * 4,
    }
    emit("sparse_kmeans", row)
    print(
        f"kmeans on CSR, {args.rows:,} x 50,000, k = {args.k}: ours {ours_s:.1f} s ({ours.n_iter_} iterations, QE "
        f"{row['ours_qe']:.6g}); scikit-learn {sk_s:.1f} s ({row['sklearn_iter']} iterations, QE "
        f"{row['sklearn_qe']:.6g}): {sk_s / ours_s:.2f}x its speed, "
        f"QE {100 * (row['ours_qe'] / row['sklearn_qe'] - 1):+.2f} %"
    )


if __name__ == "__main__":
    main()
