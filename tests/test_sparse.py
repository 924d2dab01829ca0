"""Rows as a scipy CSR matrix (documents: TF-IDF rows, most entries zero): k-means, mini-batch and nested
mini-batch k-means against the plain-numpy references on the same rows densified, on any worker count; the
model reading CSR rows; what is refused."""

import dask.array as da
import numpy as np
import pytest
from scipy import sparse

import dask_clust
from dask_clust._random import check_random_state, stream
from dask_clust.blocks.batches import batch_ids, window_at
from dask_clust.datasets import make_documents
from dask_clust.errors import InputError
from tests.reference import lloyd as ref
from tests.reference import nmbatch as ref_nmbatch


@pytest.fixture(scope="module")
def documents():
    X, topic = make_documents(4000, n_terms=2000, n_topics=12, mean_length=40, random_state=2)
    return X.astype(np.float64), topic


def _init(X, k, seed=0):
    return X[np.random.default_rng(seed).choice(X.shape[0], k, replace=False)].toarray()


@pytest.mark.parametrize("terms", [False, True])
def test_kmeans_on_csr_rows_equals_lloyds_oracle_on_the_dense_rows(documents, monkeypatch, terms):
    """From a given init: the oracle's centres (1e-10), labels and QE; the model's predict, transform and score
    of the CSR rows equal its dense rows'. ``terms``: each chunk's sums sent as its rows' terms (``Entries``,
    chosen where a chunk has few non-zeros for k × d; forced here)."""
    from dask_clust.blocks import lloyd

    if terms:
        monkeypatch.setattr(lloyd, "ENTRIES_SHARE", 0)
    X = documents[0][:2000]  # (the oracle's brute-force distances over 2,000 terms are its time)
    init = _init(X, 12)
    m = dask_clust.fit(X, "kmeans", 12, init=init, tol=0, client="in-process")
    C, labels, qe, n_iter, _ = ref.lloyd(X.toarray(), init, tol=0)
    assert m.n_iter_ == n_iter > 3
    np.testing.assert_allclose(m.cluster_centers_, C, rtol=0, atol=1e-10)
    assert m.objective_ == pytest.approx(qe, rel=1e-10)
    np.testing.assert_array_equal(m.predict(X).compute(), labels)
    np.testing.assert_allclose(m.transform(X).compute(), m.transform(X.toarray()).compute(), rtol=1e-9, atol=1e-9)
    assert m.score(X) == pytest.approx(m.score(X.toarray()), rel=1e-10)


@pytest.mark.parametrize("init", ["k-means||", "k-means++", "afkmc2", "random"])
def test_every_seeding_runs_on_csr_rows_and_finds_the_topics(documents, init):
    from dask_clust.metrics import nmi

    X, topic = documents
    m = dask_clust.fit(X, "kmeans", 12, init=init, random_state=1, client="in-process")
    assert nmi(topic, m.predict(X).compute()) > 0.8


def test_spherical_kmeans_on_csr_rows_equals_the_oracle(documents):
    X, _ = documents
    X = X.copy()
    X.data *= np.random.default_rng(0).random(X.nnz) + 0.5  # rows no longer of unit norm
    init = _init(X, 12, 1)
    m = dask_clust.fit(X, "kmeans", 12, init=init, metric="cosine", tol=0, client="in-process")
    dense = X.toarray()
    C, labels, objective, _ = ref.spherical_kmeans(dense / np.linalg.norm(dense, axis=1)[:, None], init)
    np.testing.assert_allclose(m.cluster_centers_, C, rtol=0, atol=1e-10)
    assert m.objective_ == pytest.approx(objective, rel=1e-10)
    np.testing.assert_array_equal(m.predict(X).compute(), labels)


def _csr_blocks(X, rows, columns=None):
    """X as a dask array of CSR blocks (uneven ones: the input's own chunking, which the engine's replaces)."""
    return da.from_array(X, chunks=(rows, columns or X.shape[1]), asarray=False)


@pytest.mark.parametrize("algo", ["kmeans", "minibatch", "nmbatch", "vcgmm"])
def test_a_dask_array_of_csr_blocks_gives_the_csr_matrix_model(documents, algo):
    X, _ = documents
    kw = dict(algo=algo, n_clusters=12, random_state=5, client="in-process")
    want = dask_clust.fit(X, **kw)
    for dX in (_csr_blocks(X, 700), _csr_blocks(X, 1500, 800)):
        got = dask_clust.fit(dX, **kw)
        np.testing.assert_array_equal(got.cluster_centers_, want.cluster_centers_)
        assert got.objective_ == want.objective_
    blocks = _csr_blocks(X, 700)
    np.testing.assert_array_equal(want.predict(blocks).compute(), want.predict(X).compute())
    np.testing.assert_array_equal(want.transform(blocks).compute(), want.transform(X).compute())
    assert want.score(blocks) == pytest.approx(want.score(X), rel=1e-12)  # (summed by other blocks)
    cosine = dask_clust.fit(X, **{**kw, "metric": "cosine"})
    np.testing.assert_array_equal(
        dask_clust.fit(_csr_blocks(X, 700), metric="cosine", **kw).cluster_centers_, cosine.cluster_centers_
    )


@pytest.mark.cluster
@pytest.mark.parametrize("algo", ["kmeans", "minibatch", "nmbatch", "vcgmm"])
def test_csr_rows_are_worker_count_invariant(cluster, documents, algo):
    X, _ = documents
    one = dask_clust.fit(X, algo, 12, random_state=5, client="in-process")
    for rows in (X, _csr_blocks(X, 700)):
        two = dask_clust.fit(rows, algo, 12, random_state=5, client=cluster)
        assert two.engine_["workers"] == 2
        np.testing.assert_array_equal(one.cluster_centers_, two.cluster_centers_)
        assert one.objective_ == two.objective_


@pytest.mark.parametrize("terms", [False, True])
def test_sharded_centres_from_csr_rows_give_the_model_of_the_driver(documents, monkeypatch, terms):
    """Lloyd's sums of CSR rows, dense or as their terms (``Entries``), reduce-scattered to sharded centres
    (over model-bytes) give the bits of the centres on the driver."""
    import dask

    from dask_clust.blocks import lloyd

    if terms:
        monkeypatch.setattr(lloyd, "ENTRIES_SHARE", 0)
    X, _ = documents
    kw = dict(algo="kmeans", n_clusters=12, random_state=3, client="in-process", max_iter=8)
    driver = dask_clust.fit(X, **kw)
    from dask_clust.engine.sharded import ShardedModel

    made, init = [], ShardedModel.__init__
    monkeypatch.setattr(ShardedModel, "__init__", lambda self, *a, **k: made.append(init(self, *a, **k)))
    with dask.config.set({"dask_clust.model-bytes": "1"}):
        sharded = dask_clust.fit(X, **kw)
    assert made
    np.testing.assert_array_equal(sharded.cluster_centers_, driver.cluster_centers_)
    assert sharded.objective_ == driver.objective_


def test_other_sparse_formats_are_converted_and_other_algorithms_refuse(documents):
    X, _ = documents
    want = dask_clust.fit(X, "kmeans", 6, random_state=0, client="in-process")
    with pytest.warns(UserWarning, match="'coo' matrix: converted to CSR"):
        got = dask_clust.fit(X.tocoo(), "kmeans", 6, random_state=0, client="in-process")
    np.testing.assert_array_equal(got.cluster_centers_, want.cluster_centers_)
    # a dask array of CSC blocks carries their meta: converted block by block, without a warning for each
    csc = da.from_array(X.tocsc(), chunks=(700, X.shape[1]), asarray=False)
    np.testing.assert_array_equal(
        dask_clust.fit(csc, "kmeans", 6, random_state=0, client="in-process").cluster_centers_, want.cluster_centers_
    )
    # dask keeps no meta for COO blocks: the array looks dense until a block is computed, then is refused
    coo = da.from_array(X.toarray(), chunks=(700, X.shape[1])).map_blocks(sparse.coo_matrix)
    with pytest.raises(InputError, match="dask array of scipy.sparse 'coo' blocks whose meta says dense"):
        dask_clust.fit(coo, "kmeans", 6, client="in-process")
    m = dask_clust.fit(X[:200].toarray(), "kmeans", 3, random_state=0, client="in-process")
    with pytest.raises(InputError, match="'coo' blocks whose meta says dense"):
        m.predict(coo).compute()
    refusal = r"algo='vrkm' does not take sparse input yet .*\['kmeans', 'minibatch', 'nmbatch', 'vargmm', 'vcgmm'\]"
    with pytest.raises(InputError, match=refusal):
        dask_clust.fit(X, "vrkm", 6)
    vc = dask_clust.fit(X[:500].toarray(), "vcgmm", 4, covariance_type="diag", weights="learned", client="in-process")
    with pytest.raises(InputError, match="a 'diag' mixture reads dense rows"):
        vc.predict(X[:10])


def test_bad_csr_values_are_named_by_row_and_column(documents):
    X, _ = documents
    bad = X.copy()
    bad.data[bad.indptr[37] + 1] = np.nan
    column = bad.indices[bad.indptr[37] + 1]
    with pytest.raises(InputError, match=f"NaN or infinity at row 37 .*column {column}"):
        dask_clust.fit(bad, "kmeans", 4, client="in-process")
    m = dask_clust.fit(X, "kmeans", 4, random_state=0, client="in-process")
    with pytest.raises(InputError, match=f"NaN or infinity at row 37, column {column}"):
        m.predict(bad)
    empty = sparse.vstack([X[:10], sparse.csr_matrix((1, X.shape[1])), X[10:20]]).tocsr()
    with pytest.raises(InputError, match="row 10 has zero norm"):
        dask_clust.fit(empty, "kmeans", 4, metric="cosine", client="in-process")


def test_the_estimator_takes_csr_rows(documents):
    X, _ = documents
    est = dask_clust.KMeans(8, random_state=0).fit(X)
    assert est.__sklearn_tags__().input_tags.sparse
    np.testing.assert_array_equal(est.predict(X), est.labels_)
    assert est.transform(X[:5]).shape == (5, 8)
    assert dask_clust.NestedMiniBatchKMeans().__sklearn_tags__().input_tags.sparse
    assert not dask_clust.VRKMeans().__sklearn_tags__().input_tags.sparse


def test_the_mixture_estimators_take_csr_rows(documents):
    """What scikit-learn's sparse checks would ask of VCGMM and VarGMM (they cannot: they read predict_proba's
    shape from a classifier's tags): fit, predict and predict_proba on CSR rows, as on their dense form."""
    X, _ = documents
    X = X[:1500]
    for cls in (dask_clust.VCGMM, dask_clust.VarGMM):
        est = cls(6, random_state=0).fit(X)
        assert est.__sklearn_tags__().input_tags.sparse
        np.testing.assert_array_equal(est.predict(X), est.labels_)
        np.testing.assert_array_equal(est.predict(X), est.predict(X.toarray()))
        proba, dense = (
            np.asarray(p.todense() if sparse.issparse(p) else p)
            for p in (est.predict_proba(X), est.predict_proba(X.toarray()))
        )
        assert proba.shape == (X.shape[0], 6)
        np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
        np.testing.assert_allclose(proba, dense, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("algo", ["kmeans", "vcgmm"])
def test_a_fit_on_csr_rows_resumes_to_the_uninterrupted_bits(documents, tmp_path, algo):
    from tests.test_checkpoint import assert_same_model

    X, _ = documents
    kw = dict(algo=algo, n_clusters=12, random_state=3, tol=0.0, max_iter=20, client="in-process")

    def stop(record):
        if record["iteration"] == 4:
            raise dask_clust.StopFit

    dask_clust.fit(X, checkpoint=tmp_path / "ck", checkpoint_every=2, callback=stop, **kw)
    resumed = dask_clust.fit(X, checkpoint=tmp_path / "ck", **kw)
    whole = dask_clust.fit(X, **kw)
    assert whole.n_iter_ > 5
    assert_same_model(resumed, whole, whole.n_iter_)


@pytest.mark.parametrize(("ratio", "metric"), [(0.0, "euclidean"), (0.3, "euclidean"), (0.3, "cosine")])
def test_minibatch_on_csr_batches_equals_sculleys_reference(documents, ratio, metric):
    """Batches of 128 CSR rows against the plain-numpy reference on the dense rows (1e-10); ratio 0.3 moves
    light centres onto (densified) batch rows."""
    X, _ = documents
    k, b, rs, steps = 12, 128, 4, 15
    init = _init(X, k, 2)
    unit = metric == "cosine"
    m = dask_clust.fit(
        X, "minibatch", k, init=init, batch_size=b, max_iter=steps, max_no_improvement=None,
        reassignment_ratio=ratio, metric=metric, random_state=rs, client="in-process",
    )  # fmt: skip
    entropy = check_random_state(rs)
    batches = list(batch_ids(window_at(entropy, "minibatch", 0, X.shape[0], b), 0, steps))
    dense = X.toarray()
    dense = dense / np.linalg.norm(dense, axis=1)[:, None] if unit else dense
    picks = lambda s: stream(entropy, "minibatch", "reassign", s)  # noqa: E731
    want, counts, _ = ref_nmbatch.minibatch(dense, init, batches, ratio, picks, unit=unit)
    np.testing.assert_allclose(m.cluster_centers_, want, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(m.counts_, counts)
    if ratio:
        assert sum(r["changed"] for r in m.history_) > 0


def test_minibatch_partial_fit_takes_csr_batches(documents):
    X, _ = documents
    init = _init(X, 6, 3)
    est = dask_clust.MiniBatchKMeans(6, init=init, reassignment_ratio=0.0)
    batches = [np.arange(lo, lo + 200) for lo in (0, 200, 400)]
    for ids in batches:
        est.partial_fit(X[ids])
    want, counts, _ = ref_nmbatch.minibatch(X.toarray(), init, batches)
    np.testing.assert_allclose(est.cluster_centers_, want, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(est.counts_, counts)


def test_minibatch_on_csr_rows_finds_the_topics(documents):
    from dask_clust.metrics import nmi

    X, topic = documents
    m = dask_clust.fit(X, "minibatch", 12, batch_size=256, random_state=5, client="in-process")
    assert nmi(topic, m.predict(X).compute()) > 0.8


def test_auto_seeding_is_kmeans_plusplus_on_csr_rows_and_kmeans_parallel_on_dense(documents):
    X, _ = documents
    kw = dict(algo="kmeans", n_clusters=8, random_state=2, max_iter=3, client="in-process")
    auto = dask_clust.fit(X, **kw)
    assert auto.params["init"] == "auto"
    np.testing.assert_array_equal(auto.cluster_centers_, dask_clust.fit(X, init="k-means++", **kw).cluster_centers_)
    dense = X[:1500].toarray()
    np.testing.assert_array_equal(
        dask_clust.fit(dense, **kw).cluster_centers_, dask_clust.fit(dense, init="k-means||", **kw).cluster_centers_
    )


@pytest.mark.parametrize(("bounds", "metric"), [("elkan", "euclidean"), ("hamerly", "euclidean"), ("elkan", "cosine")])
def test_nmbatch_on_csr_rows_equals_the_nested_reference(documents, bounds, metric):
    """Nested batches of CSR rows (distances expanded from their non-zeros, bounds that give up its rounding)
    against the plain-numpy Alg. 5 on the dense rows: the same doublings and label changes round by round,
    energies and centres to 1e-9."""
    from tests.test_nmbatch import _order, _rounds

    X = documents[0][:1200]
    k, b0, rs, rounds = 10, 100, 6, 25
    m = dask_clust.fit(
        X, "nmbatch", k, init="first-k", batch_size=b0, rho=10.0, rho_mode="paper", bounds=bounds, tol=0.0,
        max_iter=rounds, metric=metric, random_state=rs, client="in-process",
    )  # fmt: skip
    unit = metric == "cosine"
    dense = X.toarray()
    dense = dense / np.linalg.norm(dense, axis=1)[:, None] if unit else dense
    order = _order(X.shape[0], rs)
    want, centers = ref_nmbatch.nmbatch(dense, order, dense[order[:k]], b0, 10.0, rounds, "paper", unit=unit)
    ours = _rounds(m)
    assert [r[0] for r in ours] == [r[0] for r in want]
    assert [r[2] for r in ours] == [r[2] for r in want]
    np.testing.assert_allclose([r[1] for r in ours], [r[1] for r in want], rtol=1e-9)
    np.testing.assert_allclose(m.cluster_centers_, centers, rtol=1e-9, atol=1e-12)
    assert len({r[0] for r in ours}) >= 3 and sum(r[2] for r in ours) > 0


def test_nmbatch_on_csr_rows_finds_the_topics_and_resumes_to_the_uninterrupted_bits(documents, tmp_path):
    from dask_clust.metrics import nmi
    from tests.test_checkpoint import assert_same_model

    X, topic = documents
    kw = dict(algo="nmbatch", n_clusters=12, random_state=3, batch_size=300, tol=0.0, max_iter=12)
    whole = dask_clust.fit(X, client="in-process", **kw)
    assert nmi(topic, whole.predict(X).compute()) > 0.8

    def stop(record):
        if record["iteration"] == 5:
            raise dask_clust.StopFit

    dask_clust.fit(X, checkpoint=tmp_path / "ck", checkpoint_every=2, callback=stop, client="in-process", **kw)
    resumed = dask_clust.fit(X, checkpoint=tmp_path / "ck", client="in-process", **kw)
    assert_same_model(resumed, whole, whole.n_iter_)


@pytest.mark.parametrize(("sets", "block_rows"), [("random", None), ("nearest", None), ("nearest", 64)])
def test_vcgmm_on_csr_rows_follows_the_reference_on_its_coreset(documents, monkeypatch, sets, block_rows):
    """The lightweight coreset drawn from CSR rows, then the truncated EM on them (costs expanded from each row's
    non-zeros, Σ w s x scattered by column) against the plain-numpy vc-GMM on the same coreset densified: the
    free energy round by round, the means and σ²; ``block_rows``: search blocks of 64 CSR rows."""
    from dask_clust.blocks import truncated_estep
    from tests.test_vcgmm import _coreset, assert_follows, reference_fit

    if block_rows:
        monkeypatch.setattr(truncated_estep, "BLOCK_ROWS", block_rows)
    X = documents[0]
    C, size, rs = 12, 900, 7
    init = _init(X, C, 4)
    m = dask_clust.fit(
        X, "vcgmm", C, coreset_size=size, init=init, random_state=rs, truncated_init=sets, refit_size=None,
        client="in-process",
    )  # fmt: skip
    Xc, wc = _coreset(X, size, rs)
    assert sparse.issparse(Xc)
    assert_follows(m, reference_fit(Xc.toarray(), wc, init, sets, rs, 5, 5), 1e-9, 1e-12)


def test_vcgmm_on_csr_rows_is_the_dense_rows_model_chunked_alike(documents):
    """With the rows in one chunk (CSR and dense rows chunk by their bytes, so otherwise differently, and each
    chunk draws its share of the coreset), the fit on CSR rows is the fit on the dense rows: every default,
    the refine on every row and the sphere; var-GMM-S too. Sparse rows take the isotropic model only."""
    import dask

    X, topic = documents
    one_chunk = {"dask_clust.min-chunks": 1, "dask_clust.chunk-bytes": "1GiB", "dask_clust.min-chunk-bytes": "1GiB"}
    with dask.config.set(one_chunk):
        for algo, kw in [("vcgmm", {}), ("vcgmm", {"refine": True}), ("vcgmm", {"metric": "cosine"}), ("vargmm", {})]:
            got = dask_clust.fit(X, algo, 12, random_state=1, client="in-process", **kw)
            # the default seeding of CSR rows (k-means++; dense rows: k-means||)
            want = dask_clust.fit(X.toarray(), algo, 12, random_state=1, client="in-process", init="k-means++", **kw)
            assert got.params["init"] == "auto" and got.n_iter_ == want.n_iter_
            np.testing.assert_allclose(got.cluster_centers_, want.cluster_centers_, rtol=0, atol=1e-12)
            assert got.objective_ == pytest.approx(want.objective_, rel=1e-12)
    from dask_clust.metrics import nmi

    assert nmi(topic, got.predict(X).compute()) > 0.8
    dense = X.toarray()  # the model reads CSR rows as it reads their dense form
    for a, b in zip(got.predict_proba(X), got.predict_proba(dense)):
        np.testing.assert_allclose(a.compute(), b.compute(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.score_samples(X).compute(), got.score_samples(dense).compute(), rtol=1e-9)
    assert got.score(X, exact=True) == pytest.approx(got.score(dense, exact=True), rel=1e-9)
    with pytest.raises(InputError, match="sparse rows take the isotropic model only .*covariance_type='diag'"):
        dask_clust.fit(X, "vcgmm", 4, covariance_type="diag", weights="learned", client="in-process")


def test_a_csr_fits_state_is_counted_by_the_rows_stored_bytes(documents):
    """nmbatch keeps a copy of its rows: of CSR rows, their stored bytes (about 500 a document here), not D·8
    (16,000), so a memory share that 64 MB of dense rows would exceed lets the documents' 2.4 MB fit."""
    import dask
    import psutil

    X, _ = documents
    share = 16e6 / psutil.virtual_memory().available
    with dask.config.set({"dask_clust.stream-fraction": share}):
        m = dask_clust.fit(X, "nmbatch", 12, random_state=0, max_iter=3, client="in-process")
        assert m.n_iter_ == 3
        with pytest.raises(InputError, match="algo='nmbatch' keeps 160.. B of state per row"):
            dask_clust.fit(X.toarray(), "nmbatch", 12, random_state=0, max_iter=3, client="in-process")


@pytest.mark.cluster
def test_a_csr_coreset_kept_on_the_workers_gives_the_in_process_model(cluster, documents):
    """A coreset too large for the driver (``in-process-bytes``) is drawn, stacked and sorted by nearest seed on
    the workers as CSR rows: the model is the one whose coreset came to the driver."""
    import dask

    X, _ = documents
    kw = dict(algo="vcgmm", n_clusters=12, coreset_size=1500, random_state=4)
    want = dask_clust.fit(X, client="in-process", **kw)
    with dask.config.set({"dask_clust.in-process-bytes": "1KiB"}):
        got = dask_clust.fit(X, client=cluster, **kw)
    np.testing.assert_array_equal(got.cluster_centers_, want.cluster_centers_)
    assert got.objective_ == want.objective_
