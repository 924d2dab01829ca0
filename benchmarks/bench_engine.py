"""Engine overhead: one empty iteration (a reduce of an empty step over every partition) on
LocalCluster(n_workers=2, threads_per_worker=1), median of 20, at 16 and 128 chunks (issue #2:
<= 10 ms, and < 20 % growth from 16 to 128 chunks)."""
import numpy as np

from common import emit, local_cluster

from dask_clust.engine import as_source, open_engine


def main():
    X = np.random.default_rng(0).random((128 * 1000, 16), dtype=np.float32)
    results = {}
    with local_cluster(2, 1) as client:
        for chunks in (16, 128):
            src = as_source(X, chunk_rows=X.shape[0] // chunks)
            with open_engine(src, client, 0) as eng:
                assert eng.n_chunks == chunks
                eng.overhead_ms(10)  # warm up
                ms = eng.overhead_ms(20)
            results[chunks] = ms
            emit("engine_overhead", {"backend": "cluster", "workers": 2, "threads_per_worker": 1, "chunks": chunks,
                                     "median_ms_per_empty_iteration": ms})
    with open_engine(as_source(X, chunk_rows=X.shape[0] // 16), "in-process", 0) as eng:
        emit("engine_overhead", {"backend": "in-process", "chunks": 16, "median_ms_per_empty_iteration": eng.overhead_ms(20)})
    growth = results[128] / results[16] - 1
    print(f"\nempty iteration: {results[16]:.2f} ms at 16 chunks, {results[128]:.2f} ms at 128 chunks "
          f"(growth {100 * growth:+.1f} %); target <= 10 ms and < 20 %")


if __name__ == "__main__":
    main()
