"""Kernels against brute force (hypothesis)."""

import contextlib
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dask_clust.kernels.assign import (
    GATHER_ROWS,
    Prepared,
    _candidate_potentials,
    accumulate,
    all_sqdist,
    candidate_gaps,
    candidate_potentials,
    direct_limit,
    lower_near,
    nearest,
    nearest_after_move,
    update_mind,
)
from dask_clust.kernels.distance import gemm_tolerance, rows_per_block, sqdist_to_labels
from dask_clust.kernels.lazy import add_shares, lazy_bounds, lazy_qe, lazy_search
from dask_clust.kernels.sampling import greedy_plusplus, sample_proportional
from dask_clust.kernels.stats import N_WORDS, chunk_summary, fixed_add, fixed_top_exponent, from_fixed, to_fixed
from tests.reference.lloyd import sqdist

finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@st.composite
def data_and_centers(draw):
    n = draw(st.integers(1, 60))
    d = draw(st.integers(1, 9))
    k = draw(st.integers(1, 12))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    X = draw(arrays(dtype, (n, d), elements=finite))
    # centres drawn partly from the rows, so exact ties and zero distances occur
    C = draw(arrays(np.float64, (k, d), elements=finite))
    rows = draw(st.lists(st.integers(0, n - 1), max_size=k))
    for j, i in enumerate(rows):
        C[j] = X[i]
    return X, C


def _tie_apart():
    C = np.full((9, 4), 513.0)
    C[0], C[8] = [0, 513, 513, 0], [0, 0, 513, 513]
    return np.array([[0.99999, 0.99999, 2.0, 0.99999]], np.float32), C


@settings(max_examples=150, deadline=None)
@given(data_and_centers())
@example(_tie_apart())
def test_nearest_matches_brute_force(xc):
    X, C = xc
    labels, mind, evals = nearest(X, Prepared(C, X.dtype))
    D = sqdist(X, C)
    best = D.min(1)
    # the kernel's distance is exact, and its label attains the minimum (lowest index among exact ties)
    np.testing.assert_allclose(mind, best, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(D[np.arange(len(X)), labels], best, rtol=1e-12, atol=1e-9)
    # ties as the kernel's float64 direct sum sees them: the reference's numpy sum adds in another order and
    # may round a tie apart (hypothesis found x = [1 - 1e-5, 1 - 1e-5, 2, 1 - 1e-5] against [0, 513, 513, 0]
    # and [0, 0, 513, 513]: equal terms, summed in a different order)
    direct = np.empty(D.shape)
    all_sqdist(X, C, direct)
    np.testing.assert_allclose(direct, D, rtol=1e-12, atol=1e-9)
    exact_ties = direct == direct.min(1)[:, None]
    assert all(labels[i] == np.flatnonzero(exact_ties[i])[0] for i in range(len(X)) if exact_ties[i].sum() > 1)
    assert evals >= X.shape[0] * C.shape[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_distances_to_labels_are_the_direct_sums_bits(dtype):
    """Whichever loop a width takes (``sqdist_to_labels``), each row's distance is the direct form's in
    float64 summed in four chains (t mod 4) in index order, bit for bit: the value a model's objective keeps
    on any machine."""
    rng = np.random.default_rng(7)
    for d in range(1, 41):
        X = (rng.normal(size=(50, d)) * rng.uniform(0.1, 1e3, d)).astype(dtype)
        C = rng.normal(size=(5, d)) * 300
        labels = rng.integers(0, 5, len(X)).astype(np.int32)
        got = np.empty(len(X))
        sqdist_to_labels(X, 0, len(X), C, labels, got, labels[:0])
        want = []
        for x, c in zip(X.astype(np.float64).tolist(), C[labels].tolist()):
            chains = [0.0] * 4
            for t in range(d):
                a = x[t] - c[t]
                chains[t % 4 if t < d - d % 4 else 0] += a * a  # (** 2 is libm's pow: not always a * a)
            want.append((chains[0] + chains[1]) + (chains[2] + chains[3]))
        assert got.tolist() == want, d
        # rows whose label is ``known`` keep the distance already there; the others are measured
        known = np.where(np.arange(len(X)) % 2 == 0, labels, (labels + 1) % 5).astype(np.int32)
        again = np.full(len(X), -1.0)
        sqdist_to_labels(X, 0, len(X), C, labels, again, known)
        assert again.tolist() == [-1.0 if i % 2 == 0 else w for i, w in enumerate(want)], d


@settings(max_examples=150, deadline=None)
@given(data_and_centers())
def test_second_nearest_bound_never_exceeds_brute_force(xc):
    """``mind2`` bounds every non-label centre's squared distance from below (near-duplicate centres and
    re-searched rows included), and is not vacuous on well-separated rows."""
    X, C = xc
    mind2 = np.empty(len(X))
    labels, _, _ = nearest(X, Prepared(C, X.dtype), mind2=mind2)
    D = sqdist(X, C)
    D[np.arange(len(X)), labels] = np.inf
    others = D.min(1)
    assert np.all(mind2 <= others)
    if len(C) > 1:
        scale = (X.astype(np.float64) ** 2).sum(1) + (C**2).sum(1).max()
        assert np.all(others - mind2 <= 1e-3 * scale + 1e-9)


@settings(max_examples=80, deadline=None)
@given(data_and_centers(), st.integers(0, 2**31))
def test_accumulate_matches_numpy(xc, seed):
    X, C = xc
    rng = np.random.default_rng(seed)
    w = rng.random(len(X))
    labels, mind, _ = nearest(X, Prepared(C, X.dtype))
    sums, weights = np.zeros_like(C), np.zeros(len(C))
    qe = accumulate(X, w, labels, mind, sums, weights)
    ref_sums = np.zeros_like(C)
    np.add.at(ref_sums, labels, w[:, None] * X.astype(np.float64))
    np.testing.assert_allclose(sums, ref_sums, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(weights, np.bincount(labels, weights=w, minlength=len(C)), rtol=1e-12)
    np.testing.assert_allclose(qe, (w * sqdist(X, C).min(1)).sum(), rtol=1e-10, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(data_and_centers(), st.integers(0, 2**31))
def test_candidate_potentials_and_update_mind(xc, seed):
    X, C = xc
    rng = np.random.default_rng(seed)
    w = rng.random(len(X))
    mind = rng.random(len(X)) * 1e3
    pot = np.zeros(len(C))
    P = Prepared(C, X.dtype)
    _candidate_potentials(X, w, mind, P.Cd, P.cnorm, 7, pot)  # (blocks of 7 rows)
    ref = (w[:, None] * np.minimum(mind[:, None], sqdist(X, C))).sum(0)
    # GEMM rounding bound: each distance is off by at most ~ d·eps·(||x||² + ||c||²)
    xx = (X.astype(np.float64) ** 2).sum(1)
    eps = np.finfo(X.dtype).eps
    bound = 4 * X.shape[1] * eps * (w[:, None] * (xx[:, None] + P.cnorm[None, :])).sum(0) + 1e-9
    assert np.all(np.abs(pot - ref) <= bound)
    m2 = mind.copy()
    update_mind(X, C, m2)
    np.testing.assert_allclose(m2, np.minimum(mind, sqdist(X, C).min(1)), rtol=1e-12, atol=1e-12)
    out = np.empty((len(X), len(C)))
    all_sqdist(X, C, out)
    np.testing.assert_allclose(out, sqdist(X, C), rtol=1e-12, atol=1e-12)


def _lower_near(X, K, C):
    """k-means||'s round update by the triangle test: (mind, near) after rows nearest K meet C."""
    _, mind, _ = nearest(X, Prepared(K, X.dtype))
    near, _, _ = nearest(X, Prepared(K, X.dtype))
    P, most = Prepared(C, X.dtype), direct_limit(len(C))
    order, gaps = candidate_gaps(K, P.C, min(len(C), most + 1))
    lower_near(X, P.Cd, P.cnorm, P.C, P.tol, P.block, order, gaps, most, len(K), mind, near)
    return mind, near


def _full_search(X, K, C):
    """The same update by direct distances to every candidate, known and new (lowest index on ties)."""
    D = np.empty((len(X), len(K) + len(C)))
    all_sqdist(X, np.concatenate([K, C]), D)
    return D.min(1), D.argmin(1)


@settings(max_examples=150, deadline=None)
@given(data_and_centers(), st.integers(0, 2**31))
def test_triangle_pruned_round_update_matches_a_full_search(xc, seed):
    """Rows measured directly, rows sent to the GEMM and rows no new candidate helps all end as a search
    over every candidate leaves them; new candidates repeat rows and known candidates, so exact ties with
    the known nearest (which keep it) and among the new (the lowest index) occur."""
    X, C = xc
    rng = np.random.default_rng(seed)
    split = int(rng.integers(1, len(C) + 1)) if len(C) > 1 else 1
    K, new = C[:split], C[split:]
    if len(new) == 0:
        new = K[rng.integers(0, len(K), 3)]
    mind, near = _lower_near(X, K, new)
    ref_mind, ref_near = _full_search(X, K, new)
    np.testing.assert_array_equal(mind, ref_mind)
    np.testing.assert_array_equal(near, ref_near)


def test_triangle_pruned_update_gathers_many_rows_for_the_gemm():
    """One known candidate far from the data: every row passes the test for most new candidates and goes to
    the GEMM, in several gathers."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2 * GATHER_ROWS + 5, 3)).astype(np.float32)
    K = np.full((1, 3), 50.0)
    C = rng.normal(size=(8, 3))
    mind, near = _lower_near(X, K, C)
    ref_mind, ref_near = _full_search(X, K, C)
    np.testing.assert_array_equal(mind, ref_mind)
    np.testing.assert_array_equal(near, ref_near)


@settings(max_examples=150, deadline=None)
@given(data_and_centers(), st.integers(0, 2**31), st.sampled_from([0.0, 1e-3, 0.1, 10.0]), st.booleans())
def test_search_after_a_move_matches_a_full_search(xc, seed, scale, csr):
    """Hamerly's test keeps a row's label only where no other centre can have come as near: labels and
    distances equal a fresh search's (ties to the lowest index included), whatever the centres' moves,
    and the second-nearest bound stays a bound; on rows as CSR too (``csr_assign_moved``, half their entries
    zero: its bound less the expansion's slack)."""
    X, C = xc
    rng = np.random.default_rng(seed)
    if csr:
        from scipy import sparse

        X = sparse.csr_matrix(np.where(rng.random(X.shape) < 0.5, 0, X).astype(X.dtype))
    mind2 = np.empty(X.shape[0])
    prev, mind, _ = nearest(X, Prepared(C, X.dtype), mind2=mind2)
    moved = C + rng.normal(scale=scale, size=C.shape) * (rng.random(len(C)) < 0.5)[:, None]
    shift = np.sqrt(((moved - C) ** 2).sum(1)) * (1 + 1e-9)
    labels, mind, evals = nearest_after_move(X, Prepared(moved, X.dtype), shift, prev, None, mind, mind2)
    ref_labels, ref_mind, _ = nearest(X, Prepared(moved, X.dtype))
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_array_equal(mind, ref_mind)
    D = sqdist(X.toarray() if csr else X, moved)
    D[np.arange(X.shape[0]), labels] = np.inf
    assert np.all(mind2 <= (D.min(1) * (1 + 1e-12) + 1e-9 if csr else D.min(1)))
    assert X.shape[0] <= evals <= X.shape[0] * (len(C) + 1) + X.shape[0] * len(C)


@pytest.mark.parametrize("csr", [False, True])
def test_search_after_a_small_move_measures_few_rows_in_full(csr):
    """Well-separated centres that barely move: every row keeps its label by the test (one distance each)."""
    rng = np.random.default_rng(1)
    C = rng.normal(scale=100.0, size=(16, 4))
    X = (C[rng.integers(0, 16, 3000)] + rng.normal(size=(3000, 4))).astype(np.float32)
    if csr:
        from scipy import sparse

        X = sparse.csr_matrix(X)
    mind2 = np.empty(X.shape[0])
    prev, mind, _ = nearest(X, Prepared(C, X.dtype), mind2=mind2)
    moved = C + 1e-3
    shift = np.sqrt(((moved - C) ** 2).sum(1)) * (1 + 1e-9)
    labels, mind, evals = nearest_after_move(X, Prepared(moved, X.dtype), shift, prev, None, mind, mind2)
    assert evals == X.shape[0]
    np.testing.assert_array_equal(labels, nearest(X, Prepared(moved, X.dtype))[0])


def _lazy_start(X, w, C, ref, top):
    """A chunk's lazy state from a full search: (labels, bounds, words), as ``lloyd._lazy_step`` makes it."""
    k, d = C.shape
    labels, mind, mind2 = np.empty(len(X), np.int32), np.empty(len(X)), np.empty(len(X))
    nearest(X, Prepared(C, X.dtype), labels, mind, mind2)
    words = (np.zeros((k * d, N_WORDS), np.int64), np.zeros((k, N_WORDS), np.int64), np.zeros((k, N_WORDS), np.int64))
    assert add_shares(X, w, labels, ref, top, *words) == 0
    ub, lb = np.empty(len(X), np.float32), np.empty(len(X), np.float32)
    lazy_bounds(labels, mind, mind2, np.zeros(k), 0.0, ub, lb)
    return labels, ub, lb, words


@settings(max_examples=100, deadline=None)
@given(data_and_centers(), st.integers(0, 2**31), st.sampled_from([0.0, 1e-3, 0.1, 10.0]))
def test_lazy_steps_match_full_searches_and_exact_sums(xc, seed, scale):
    """Three moves of the centres, each followed by a lazy step (``kernels/lazy.py``): the labels are a full
    search's (ties to the lowest index), the words the exact sums of the rows by their new labels (the bits of
    words made afresh from them: a rebuilt chunk's), Σ w x and Σ w within an ulp of math.fsum's, and the QE
    formed from the words that of the rows' distances."""
    X, C = xc
    rng = np.random.default_rng(seed)
    w = rng.choice([0.0, 0.5, 1.0, 3.0], len(X))
    k, d = C.shape
    ref = X.astype(np.float64).mean(0)
    top = fixed_top_exponent(w.sum(), d, max(1.0, float(np.abs(X).max())))
    labels, ub, lb, words = _lazy_start(X, w, C, ref, top)
    drift, far = np.zeros(k), 0.0
    for _ in range(3):
        moved = C + rng.normal(scale=scale, size=C.shape) * (rng.random(k) < 0.5)[:, None]
        shift = np.sqrt(((moved - C) ** 2).sum(1)) * (1 + 1e-9)
        drift, far, C = drift + shift, far + shift.max(), moved
        before = labels.copy()
        P = Prepared(C, X.dtype)
        evals, changed, bad = lazy_search(
            X, w, P.Cd, P.cnorm, P.C, P.tol, P.block, drift, far, ref, top, labels, ub, lb, *words
        )
        np.testing.assert_array_equal(labels, nearest(X, P)[0])
        assert bad == 0 and changed == np.count_nonzero(labels != before) and 0 <= evals <= len(X) * (2 * k + 1)
        fresh = _lazy_start(X, w, C, ref, top)[3]
        for mine, theirs in zip(words, fresh):
            np.testing.assert_array_equal(mine, theirs)
    S1, W = np.empty(k * d), np.empty(k)
    from_fixed(words[0], top, S1)
    from_fixed(words[1], top, W)
    x64 = X.astype(np.float64)
    for c in range(k):
        rows = labels == c
        want = [math.fsum(w[rows] * x64[rows, t]) for t in range(d)]
        # (a product below the grid's unit, 2^(top - 186), is rounded to it: 1e-39 against rows of 100)
        np.testing.assert_allclose(S1[c * d : (c + 1) * d], want, rtol=4e-16, atol=len(X) * 2.0 ** (top - 186))
        assert W[c] == math.fsum(w[rows])
    qe = float(np.dot(w, sqdist(X, C)[np.arange(len(X)), labels]))
    scale_qe = float(np.dot(w, ((x64 - ref) ** 2).sum(1)))
    bound = 1e-12 * (qe + scale_qe + float(w.sum()) * (C**2).sum(1).max()) + 1e-30  # (the grid's unit: < 1e-40)
    assert abs(lazy_qe(C, ref, *words, top) - qe) <= bound


def test_lazy_step_reads_only_the_rows_that_fail():
    """Well-separated centres that barely move: every row passes the lazy test, so none is searched (no
    evaluation) and the words do not change."""
    rng = np.random.default_rng(1)
    C = rng.normal(scale=100.0, size=(16, 4))
    X = (C[rng.integers(0, 16, 3000)] + rng.normal(size=(3000, 4))).astype(np.float32)
    w, ref = np.ones(len(X)), X.astype(np.float64).mean(0)
    top = fixed_top_exponent(len(X), 4, float(np.abs(X).max()))
    labels, ub, lb, words = _lazy_start(X, w, C, ref, top)
    before = [a.copy() for a in words]
    moved = C + 1e-3
    shift = np.sqrt(((moved - C) ** 2).sum(1)) * (1 + 1e-9)
    P = Prepared(moved, X.dtype)
    evals, changed, _ = lazy_search(
        X, w, P.Cd, P.cnorm, P.C, P.tol, P.block, shift, shift.max(), ref, top, labels, ub, lb, *words
    )
    assert evals == 0 and changed == 0
    np.testing.assert_array_equal(labels, nearest(X, P)[0])
    for a, b in zip(words, before):
        np.testing.assert_array_equal(a, b)


def _greedy_plusplus_reference(X, w, first, u):
    """Greedy weighted k-means++ step by step in plain numpy: draws by the inverse CDF of w·D², the trial
    leaving the lowest potential kept (the first on ties)."""
    chosen = [first]
    mind = sqdist(X, X[[first]])[:, 0]
    for uj in u:
        p = w * mind
        cum = np.cumsum(p)
        if not cum[-1] > 0:
            chosen.append(min(len(X) - 1, int(uj[0] * len(X))))
            continue
        cands = np.minimum(np.searchsorted(cum, uj * cum[-1], side="right"), len(X) - 1)
        d2 = sqdist(X, X[cands])
        pots = (w[:, None] * np.minimum(mind[:, None], d2)).sum(0)
        best = int(np.argmin(pots))
        chosen.append(int(cands[best]))
        mind = np.minimum(mind, d2[:, best])
    return np.array(chosen)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_plusplus_matches_the_step_by_step_reference(seed):
    """The one-call greedy k-means++ picks the rows the plain-numpy loop picks from the same uniforms, on
    weighted rows with duplicates (ties) and on a set with fewer distinct rows than centres."""
    rng = np.random.default_rng(seed)
    n, d, k = int(rng.integers(20, 300)), int(rng.integers(1, 9)), int(rng.integers(2, 15))
    X = rng.standard_normal((n, d)) * rng.uniform(0.1, 100)
    X[rng.integers(0, n, n // 5)] = X[0]
    if seed == 5:  # three distinct rows, more centres than that: the draws run out of mass
        X = X[:3][rng.integers(0, 3, n)]
        k = 6
    w = rng.uniform(0.5, 3.0, n)
    u = rng.random((k - 1, 2 + int(np.log(k))))
    first = int(rng.integers(0, n))
    chosen = np.empty(k, np.int64)
    evals = greedy_plusplus(X, w, first, u, gemm_tolerance(np.float64, d), chosen)
    ref = _greedy_plusplus_reference(X, w, first, u)
    np.testing.assert_array_equal(chosen, ref)
    assert n < evals <= n * (k - 1) * u.shape[1] + n  # rows without mass are left out as they appear


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-1e12, 1e12, allow_nan=False), min_size=1, max_size=40), st.integers(0, 2**31))
def test_fixed_point_sums_are_exact_and_order_free(values, seed):
    v = np.array(values)
    top = fixed_top_exponent(len(v), 1, np.abs(v).max())
    words = np.empty((len(v), N_WORDS), np.int64)
    assert to_fixed(v, top, words) == 0

    def total(order, split):
        acc = np.zeros((1, N_WORDS), np.int64)
        parts = [order[i : i + split] for i in range(0, len(order), split)]
        for part in parts:  # a tree: sum each group, then the groups
            sub = np.zeros((1, N_WORDS), np.int64)
            for i in part:
                fixed_add(sub, words[i : i + 1])
            fixed_add(acc, sub)
        out = np.empty(1)
        from_fixed(acc, top, out)
        return out[0]

    rng = np.random.default_rng(seed)
    a = total(np.arange(len(v)), 1)
    b = total(rng.permutation(len(v)), 3)
    assert a == b  # bit-identical whatever the order and grouping
    assert math.isclose(a, math.fsum(values), rel_tol=1e-15, abs_tol=1e-20)


def test_fixed_point_reports_overflow():
    words = np.empty((2, N_WORDS), np.int64)
    assert to_fixed(np.array([1.0, 2.0**40]), 20, words) == 1
    assert to_fixed(np.array([1.0, np.nan]), 20, words) == 1


def test_sample_proportional_frequencies():
    p = np.array([0.0, 1.0, 3.0, 0.0, 6.0, 0.0])
    rng = np.random.default_rng(0)
    u = np.sort(rng.random(200_000))
    out = np.empty(len(u), np.int64)
    sample_proportional(p, u, out)
    freq = np.bincount(out, minlength=len(p)) / len(u)
    np.testing.assert_allclose(freq, p / p.sum(), atol=0.005)
    assert freq[[0, 3, 5]].sum() == 0  # zero weight is never drawn


@st.composite
def grid_queries(draw):
    """Integer rows (exact distances, so ties are ties), ids shuffled, and some queries among the rows."""
    m, d = draw(st.integers(1, 25)), draw(st.integers(1, 4))
    Y = draw(arrays(np.float64, (m, d), elements=st.integers(-3, 3)))
    y_ids = np.asarray(draw(st.permutations(range(m))), np.int64) * 3
    n = draw(st.integers(1, 12))
    Q = draw(arrays(np.float64, (n, d), elements=st.integers(-3, 3)))
    q_ids = np.asarray(draw(st.lists(st.sampled_from(list(y_ids) + [-1]), min_size=n, max_size=n)), np.int64)
    return Q, q_ids, Y, y_ids, draw(st.integers(1, 5))


@settings(max_examples=150, deadline=None)
@given(grid_queries(), st.floats(0, 2))
def test_nearest_neighbours_match_brute_force(problem, noise):
    """The r nearest rows other than the query's own id, ties to the lower id, -1/inf past the last; an
    approximate distance off by at most ``slack`` (here: noise) must not change the answer."""
    from dask_clust.kernels.distance import nearest_neighbours

    Q, q_ids, Y, y_ids, r = problem
    exact = ((Q[:, None, :] - Y[None]) ** 2).sum(-1)
    approx = exact + noise * np.cos(np.arange(exact.size)).reshape(exact.shape)
    out_j, out_d2 = np.empty((len(Q), r), np.int64), np.empty((len(Q), r))
    nearest_neighbours(Q, q_ids, Y, y_ids, approx, noise, out_j, out_d2)
    for i in range(len(Q)):
        others = [j for j in range(len(Y)) if y_ids[j] != q_ids[i]]
        want = sorted(others, key=lambda j: (exact[i, j], y_ids[j]))[:r]
        want += [-1] * (r - len(want))
        assert out_j[i].tolist() == want
        np.testing.assert_array_equal(out_d2[i], [exact[i, j] if j >= 0 else np.inf for j in want])


@settings(max_examples=150, deadline=None)
@given(grid_queries())
def test_nearest_centres_match_brute_force(problem):
    """A row's m nearest centres by exact distance, nearest first, ties to the lower index."""
    from dask_clust.kernels.distance import nearest_centres

    X, _, C, _, m = problem
    m = min(m, len(C))
    out = np.empty((len(X), m), np.int64)
    nearest_centres(X, C, out)
    d2 = ((X[:, None, :] - C[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(out, np.lexsort((np.broadcast_to(np.arange(len(C)), d2.shape), d2))[:, :m])


@settings(max_examples=200, deadline=None)
@given(
    arrays(np.float64, st.integers(1, 30), elements=st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0])),
    st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=40),
)
def test_sample_proportional_is_the_inverse_cdf(p, u):
    """Each uniform maps to the first index whose cumulative weight exceeds u·Σp (dyadic weights: exact
    sums), and never to a zero weight."""
    if not p.sum() > 0:
        p[0] = 1.0
    u = np.sort(np.asarray(u))
    out = np.empty(len(u), np.int64)
    sample_proportional(p, u, out)
    want = np.searchsorted(np.cumsum(p), u * p.sum(), side="right")
    np.testing.assert_array_equal(out, want)
    assert np.all(p[out] > 0)


def test_chunk_summary_finds_first_bad_row_and_the_largest_value():
    X = np.arange(12, dtype=np.float32).reshape(4, 3)
    X[1, 2] = -11  # ties the largest magnitude first: its row is the one named
    s, s2 = np.empty(3), np.empty(3)
    m, at, bad = chunk_summary(X, s, s2)
    assert bad == -1 and m == 11 and at == 1
    np.testing.assert_array_equal(s, X.sum(0))
    np.testing.assert_array_equal(s2, (X.astype(float) ** 2).sum(0))
    X[2, 1] = np.inf
    X[3, 0] = np.nan
    assert chunk_summary(X, s, s2)[2] == 2


# ---------------------------------------------------------------- kernels of the algorithms, on a grid
# Small integers, step sizes and weights that are powers of two, a few steps: every sum is exact in any
# order, so the kernels must give the plain-numpy loop's bits, ties (lowest index) included.

grid = st.integers(-8, 8).map(float)


@st.composite
def vr_problem(draw):
    n, d, k = draw(st.integers(1, 20)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    X = draw(arrays(draw(st.sampled_from([np.float32, np.float64])), (n, d), elements=grid))
    Ct = draw(arrays(np.float64, (k, d), elements=grid))
    for j, i in enumerate(draw(st.lists(st.integers(0, n - 1), max_size=k))):
        Ct[j] = X[i]  # rows on a centre: zero distances and ties
    A = draw(arrays(np.float64, (k, d), elements=grid))
    idx = draw(arrays(np.int64, draw(st.integers(0, 8)), elements=st.integers(0, n - 1)))
    return X, Ct, A, idx, draw(st.sampled_from([0.5, 0.25]))


@settings(max_examples=150, deadline=None)
@given(vr_problem())
def test_variance_reduced_steps_match_the_plain_loop(problem):
    """VRKM's steps (Zhao et al. 2018, Alg. 3-4, as kernels/variance_reduced.py states them) with the bounds of
    the anchor pass (Hamerly's test, then Elkan's per centre) give the steps of a brute-force nearest search:
    the same centres, bit for bit."""
    from dask_clust.kernels.variance_reduced import variance_reduced_steps

    X, Ct, A, idx, eta = problem
    D = sqdist(X, Ct)
    anchor = D.argmin(1).astype(np.int32)
    others = D.copy()
    others[np.arange(len(X)), anchor] = np.inf
    lower2 = others.min(1)
    C = A.copy()
    moved, evals = variance_reduced_steps(X, idx, anchor, lower2, Ct, A, C, eta)
    want, want_moved = A.copy(), 0
    for i in idx:
        x = X[i].astype(np.float64)
        j, a = int(((x - want) ** 2).sum(1).argmin()), anchor[i]
        if j == a:
            want[j] -= eta * (want[j] - A[j])
        else:
            want_moved += 1
            want[j] -= eta * (want[j] - x)
            want[a] += eta * (A[a] - x)
    np.testing.assert_array_equal(C, want)
    assert moved == want_moved and len(idx) <= evals <= len(idx) * len(Ct)


@st.composite
def sbe_problem(draw):
    d, k = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    b, steps = draw(st.sampled_from([1, 2, 4, 8])), draw(st.integers(1, 3))
    batches = draw(arrays(draw(st.sampled_from([np.float32, np.float64])), (steps, b, d), elements=grid))
    x = draw(arrays(np.float64, (k, d), elements=grid))
    for j, (m, i) in enumerate(draw(st.lists(st.tuples(st.integers(0, steps - 1), st.integers(0, b - 1)), max_size=k))):
        x[j] = batches[m, i]  # centres on rows: ties
    return batches, x, draw(st.sampled_from([0.5, 0.25]))


@settings(max_examples=150, deadline=None)
@given(sbe_problem())
def test_backward_euler_step_matches_the_reference(problem):
    """The mini-batch gradient (ties to the lowest centre, empty centres 0) and one implicit step (y ← x −
    γ g_B(y), z ← α z + (1 − α) y over the batches) equal tests/reference/sbe.py's, bit for bit."""
    from dask_clust.kernels.backward_euler import backward_euler_step, batch_gradient
    from tests.reference.sbe import grad

    batches, x, gamma = problem
    tol, block = gemm_tolerance(batches.dtype, x.shape[1]), rows_per_block(len(x))
    b = batches.shape[1]
    g = np.empty_like(x)
    qe = batch_gradient(batches[0], x, tol, block, np.empty(b, np.int32), np.empty(b), g)
    B0 = batches[0].astype(np.float64)
    np.testing.assert_array_equal(g, grad(B0, x))
    assert qe == pytest.approx(((B0[:, None] - x[None]) ** 2).sum(-1).min(1).sum(), rel=1e-12, abs=1e-12)
    z = np.empty_like(x)
    first = backward_euler_step(batches, x, gamma, 0.75, tol, block, z)
    assert first == qe
    y, want = x.copy(), x.copy()
    for B in batches:
        y = x - gamma * grad(B.astype(np.float64), y)
        want = 0.75 * want + 0.25 * y
    np.testing.assert_array_equal(z, want)


@st.composite
def slk_problem(draw):
    n, k, r, d = draw(st.integers(1, 12)), draw(st.integers(1, 5)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    m = draw(st.integers(1, 15))
    unit = st.integers(0, 4).map(float)
    z = draw(arrays(np.float64, (n, k), elements=unit)) + 1.0  # few distinct values: ties in rows and columns
    z /= z.sum(1, keepdims=True)
    H = draw(arrays(np.float64, (m, k), elements=st.floats(0, 1, allow_nan=False)))
    at = draw(arrays(np.int64, draw(st.integers(1, 10)), elements=st.integers(0, m - 1)))
    nb = draw(arrays(np.int64, (n, r), elements=st.integers(0, len(at) - 1)))
    X = draw(arrays(np.float64, (n, d), elements=st.floats(-1, 1, allow_nan=False)))
    M = draw(arrays(np.float64, (k, d), elements=st.floats(-1, 1, allow_nan=False)))
    ids = np.asarray(draw(st.permutations(range(3 * n)))[:n], np.int64)
    return z, H, at, nb, X, M, ids, draw(st.sampled_from([0.0, 0.5, 1.3])), draw(st.sampled_from([0.3, 1.0]))


@settings(max_examples=150, deadline=None)
@given(slk_problem())
def test_slk_bound_update_matches_numpy(problem):
    """SLK's bound update (Ziko et al. 2018, §3) of every row from the previous z: b = Σ_q z_q (neighbours in the
    given order), z ← softmax(a + λ b); the previous z's energy terms, labels (first on ties) and column
    maxima (lowest input id on ties); recomputing a from the rows gives the bits of a held a."""
    from dask_clust.kernels.slk import affinities, bound_update

    z0, H, at, nb, X, M, ids, lmbda, sigma = problem
    n, k = z0.shape
    a = np.empty((n, k))
    affinities(X, M, sigma, a)
    np.testing.assert_allclose(a, np.exp(-((X[:, None] - M[None]) ** 2).sum(-1) / (2 * sigma**2)), rtol=1e-13)
    outs = []
    for held in (a, np.empty((0, k))):
        z, labels, col_max, col_arg = z0.copy(), np.empty(n, np.int64), np.empty(k), np.empty(k, np.int64)
        terms = bound_update(held, X, M, sigma, z, H, at, nb, lmbda, ids, labels, col_max, col_arg)
        outs.append((z, labels, col_max, col_arg, terms))
    for got, want in zip(outs[0][:4], outs[1][:4]):
        np.testing.assert_array_equal(got, want)
    assert outs[0][4] == outs[1][4]
    z, labels, col_max, col_arg, (zlogz, az, bz) = outs[0]
    b = np.zeros((n, k))
    for j in range(nb.shape[1]):
        b += H[at[nb[:, j]]]
    v = a + lmbda * b
    e = np.exp(v - v.max(1, keepdims=True))
    np.testing.assert_allclose(z, e / e.sum(1, keepdims=True), rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(
        [zlogz, az, bz], [(z0 * np.log(z0)).sum(), (a * z0).sum(), (b * z0).sum()], rtol=1e-12, atol=1e-12
    )
    np.testing.assert_array_equal(labels, z0.argmax(1))
    np.testing.assert_array_equal(col_max, z0.max(0))
    for l in range(k):
        top = np.flatnonzero(z0[:, l] == z0[:, l].max())
        assert col_arg[l] == top[np.argmin(ids[top])]


@given(st.integers(1, 3000), st.integers(0, 2**62), st.lists(st.integers(1, 700), min_size=1, max_size=5))
@settings(max_examples=60, deadline=None)
def test_nested_ranks_are_a_permutation_whatever_the_chunking(n, seed, cuts):
    """The nesting order is a bijection of [0, N) computed row by row: chunk boundaries change nothing."""
    from dask_clust.kernels.nested import nested_ranks

    whole = np.empty(n, np.int64)
    nested_ranks(0, n, seed, whole)
    np.testing.assert_array_equal(np.sort(whole), np.arange(n))
    bounds = sorted({0, n, *[c % n for c in cuts]})
    pieces = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out = np.empty(b - a, np.int64)
        nested_ranks(a, n, seed, out)
        pieces.append(out)
    np.testing.assert_array_equal(np.concatenate(pieces), whole)


@st.composite
def nested_problem(draw):
    n, d, k = draw(st.integers(1, 25)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    X = draw(arrays(draw(st.sampled_from([np.float32, np.float64])), (n, d), elements=grid))
    C0, C1 = (draw(arrays(np.float64, (k, d), elements=grid)) for _ in range(2))
    for j, i in enumerate(draw(st.lists(st.integers(0, n - 1), max_size=k))):
        C1[j] = X[i]
    w = draw(arrays(np.float64, n, elements=st.sampled_from([0.5, 1.0, 2.0])))
    order = np.asarray(draw(st.permutations(range(n))), np.int64)
    n_old = draw(st.integers(0, n))
    return X, w, order, n_old, draw(st.integers(n_old, n)), C0, C1, draw(st.booleans())


@settings(max_examples=150, deadline=None)
@given(nested_problem(), st.booleans())
def test_nested_round_keeps_exact_labels_sums_and_lower_bounds(problem, as_csr):
    """Rows join at centres C0 (the first n_old of a nesting order), the centres move to C1, then a round
    reuses them through their bounds while the next rows of the order join (by the GEMM; CSR rows by their
    inner products): every row in the batch ends at a nearest centre of C1 (joining rows the lowest index;
    Elkan keeps a label that ties, else the lowest index), the moved sums are Σ w x and Σ w by label, sse is
    Σ w d², and the bounds stay below the distances. Integer rows and centres: every squared distance is
    exact (the CSR expansion's too), so ties are ties."""
    from scipy import sparse

    X, w, order, n_old, n_new, C0, C1, elkan = problem
    n, k = len(X), len(C0)
    X = sparse.csr_matrix(X) if as_csr else X
    labels, dist = np.zeros(n, np.int32), np.zeros(n)
    lower = np.zeros((n, k if elkan else 1), np.float32)
    S, v = np.zeros((k, X.shape[1])), np.zeros(k)
    old, new = np.sort(order[:n_old]), np.sort(order[n_old:n_new])
    _join(X, w, old, C0, labels, dist, lower, S, v, np.zeros(k))
    before = labels[old].copy()
    p = np.sqrt(((C1 - C0) ** 2).sum(1))
    sse = np.zeros(k)
    _reuse(X, w, old, C1, p, labels, dist, lower, S, v, sse)
    _join(X, w, new, C1, labels, dist, lower, S, v, sse)
    X = X.toarray() if as_csr else X
    rows = np.concatenate([old, new])
    D = np.sqrt(((X[rows].astype(np.float64)[:, None] - C1[None]) ** 2).sum(-1))
    best = D.min(1)
    np.testing.assert_array_equal(dist[rows], best)
    lowest = (D == best[:, None]).argmax(1)
    np.testing.assert_array_equal(labels[new], lowest[n_old:])  # joining rows: the lowest index
    ties = D[np.arange(n_old), before] == best[:n_old]  # a reused row whose label is still a nearest
    if elkan:
        np.testing.assert_array_equal(labels[old], np.where(ties, before, lowest[:n_old]))
    else:  # Hamerly keeps it while its bound holds, else searches all: the lowest index
        assert np.all((labels[old] == lowest[:n_old]) | (ties & (labels[old] == before)))
    lab = labels[rows]
    np.testing.assert_allclose(v, np.bincount(lab, w[rows], k), rtol=1e-12, atol=1e-12)
    for j in range(k):
        np.testing.assert_allclose(S[j], (w[rows][lab == j, None] * X[rows][lab == j]).sum(0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(sse, np.bincount(lab, w[rows] * best**2, k), rtol=1e-12, atol=1e-12)
    if elkan:
        assert np.all(lower[rows] <= D)
    else:
        second = np.sort(D, axis=1)[:, 1] if k > 1 else np.full(len(rows), np.inf)
        assert np.all(lower[rows, 0] <= second)


def _csr_rows(X):
    """A CSR matrix as the nested kernels read it: (indptr, indices, data, squared norms)."""
    return X.indptr, X.indices, X.data, np.asarray(X.multiply(X).sum(axis=1), np.float64).ravel()


@contextlib.contextmanager
def _terms_into(S, X):
    """The CSR kernels' moves as terms (keys, values, used), added into the dense S when the kernel returns."""
    n = 2 * X.nnz
    terms = np.empty(n, np.int64), np.empty(n), np.array([0, S.shape[1]], np.int64)
    yield terms
    keys, values, (used, _) = terms
    np.add.at(S.reshape(-1), keys[:used], values[:used])


def _join(X, w, rows, C, labels, dist, lower, S, v, sse):
    from scipy import sparse

    from dask_clust.kernels.assign import Prepared
    from dask_clust.kernels.nested import csr_join_rows, join_rows

    P = Prepared(C, X.dtype)
    if sparse.issparse(X):
        with _terms_into(S, X) as terms:
            return csr_join_rows(*_csr_rows(X), w, rows, P.CT, P.cnorm, labels, dist, lower, terms, v, sse)
    return join_rows(X, w, rows, P.Cd, P.cnorm, P.C, P.tol, P.block, labels, dist, lower, S, v, sse)


def _reuse(X, w, rows, C, p, labels, dist, lower, S, v, sse):
    from scipy import sparse

    from dask_clust.kernels.nested import reuse_rows

    cnorm = (C * C).sum(1)
    if sparse.issparse(X):
        CT = np.ascontiguousarray(C.T)
        with _terms_into(S, X) as terms:
            return reuse_rows(_csr_rows(X), w, rows, C, cnorm, CT, p, labels, dist, lower, terms, v, sse)
    return reuse_rows(X, w, rows, C, cnorm, np.empty((0, 0)), p, labels, dist, lower, S, v, sse)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 40), st.integers(1, 9), st.integers(0, 2**62), st.integers(0, 10**6), st.data())
def test_draw_distinct_rows_are_distinct_and_keyed_by_row(n, n_clusters, seed, row0, data):
    """K^(n)'s draws: distinct clusters per row, the fixed first entry kept, and a row's draw depends only
    on its global index (a chunk starting elsewhere draws the same rows alike)."""
    from dask_clust.kernels.truncated import draw_distinct

    m = data.draw(st.integers(1, n_clusters))
    first = np.asarray(data.draw(st.lists(st.integers(-1, n_clusters - 1), min_size=n, max_size=n)), np.int32)
    out = np.empty((n, m), np.int32)
    draw_distinct(first, row0, n_clusters, seed, out)
    assert np.all((out >= 0) & (out < n_clusters))
    assert all(len(set(r)) == m for r in out.tolist())
    np.testing.assert_array_equal(out[first >= 0, 0], first[first >= 0])
    tail = np.empty((n - n // 2, m), np.int32)
    draw_distinct(first[n // 2 :], row0 + n // 2, n_clusters, seed, tail)
    np.testing.assert_array_equal(tail, out[n // 2 :])


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 20), st.integers(1, 3), st.integers(1, 6), st.integers(0, 2**31), st.booleans())
def test_posterior_stats_match_numpy(n, d, k, seed, per_dim):
    """The M-step's statistics from truncated posteriors s = e / Σ e over K^(n): Σ w s x, Σ w s, Σ w s d²
    per cluster (or, given the means, Σ w s (x_d − μ_cd)² per dimension) and Σ w logsumexp(−d²/2σ²), against
    tests/reference/vcgmm.py's posteriors."""
    from dask_clust.kernels.truncated import posterior_stats
    from tests.reference.vcgmm import posteriors

    rng = np.random.default_rng(seed)
    Cp = int(rng.integers(1, k + 1))
    X, w = rng.normal(size=(n, d)), rng.uniform(0.5, 2, n)
    mu = rng.normal(size=(k, d))
    K = np.array([rng.permutation(k)[:Cp] for _ in range(n)], np.int32)
    Kd2 = np.sort(rng.uniform(0, 4, (n, Cp)), 1)
    sigma2 = float(rng.uniform(0.2, 2))
    inv = 1 / (2 * sigma2)
    e = np.exp(-(Kd2 - Kd2[:, :1]) * inv)
    sums, U, Q = np.zeros((k, d)), np.zeros(k), np.zeros((k, d if per_dim else 1))
    total = posterior_stats(X, w, K, Kd2, e, inv, mu if per_dim else np.empty((0, 0)), sums, U, Q)
    s, lse = posteriors(Kd2, sigma2)
    want_sums, want_U, want_Q = np.zeros((k, d)), np.zeros(k), np.zeros(Q.shape)
    np.add.at(want_U, K, w[:, None] * s)
    if per_dim:
        np.add.at(want_Q, K, (w[:, None] * s)[..., None] * (X[:, None, :] - mu[K]) ** 2)
    else:
        np.add.at(want_Q[:, 0], K, w[:, None] * s * Kd2)
    np.add.at(want_sums, K, (w[:, None] * s)[..., None] * X[:, None, :])
    np.testing.assert_allclose(U, want_U, rtol=1e-12)
    np.testing.assert_allclose(Q, want_Q, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sums, want_sums, rtol=1e-12, atol=1e-12)
    assert total == pytest.approx((w * lse).sum(), rel=1e-12)


@given(st.integers(1, 5000), st.integers(0, 2**63 - 1))
@settings(max_examples=40, deadline=None)
def test_permute_is_a_bijection_that_unpermute_inverts(n, key):
    from dask_clust._random import permute, unpermute

    image = np.array([permute(x, n, key) for x in range(n)])
    np.testing.assert_array_equal(np.sort(image), np.arange(n))
    np.testing.assert_array_equal([unpermute(y, n, key) for y in image], np.arange(n))


@given(
    st.integers(1, 3000),
    st.integers(1, 40),
    st.integers(1, 5000),
    st.integers(0, 2**62),
    st.lists(st.integers(0, 3000), max_size=6),
    st.tuples(st.integers(0, 5000), st.integers(0, 5000)),
)
@settings(max_examples=60, deadline=None)
def test_a_chunk_finds_exactly_its_draws_of_a_window(n, stratum, m, seed, cuts, labels):
    """A window's draws read by label (the driver's gathers) and by row range (each chunk's held draws) are
    the same draws, whatever the chunks and the label range."""
    from dask_clust.kernels.sampling import chunk_draws, drawn_rows

    rng = np.random.default_rng(seed)
    strata = -(-n // stratum)
    sizes = np.full(strata, float(stratum))
    sizes[-1] = n - (strata - 1) * stratum
    cum = np.concatenate([[0], np.cumsum(rng.multinomial(m, sizes / n))]).astype(np.int64)
    key, salt = (int(v) for v in rng.integers(2**63, size=2))
    lo, hi = sorted(min(v, m) for v in labels)
    expected = np.empty(hi - lo, np.int64)
    drawn_rows(np.arange(lo, hi, dtype=np.int64), key, salt, cum, stratum, n, expected)
    assert ((expected >= 0) & (expected < n)).all()
    got = np.full(hi - lo, -1)
    for a, b in zip(*(lambda c: (c[:-1], c[1:]))(sorted({0, n, *(c % n for c in cuts)}))):
        g0, g1 = a // stratum, (b - 1) // stratum + 1
        rows, found = (np.empty(cum[g1] - cum[g0], np.int64) for _ in range(2))
        c = chunk_draws(key, salt, cum, stratum, n, a, b, lo, hi, rows, found)
        assert (got[found[:c] - lo] == -1).all()  # each draw found once
        got[found[:c] - lo] = a + rows[:c]
    np.testing.assert_array_equal(got, expected)


def test_a_windows_batches_are_uniform_over_the_rows_and_independent_of_the_step():
    """Each step's b rows are uniform over all rows (not over a stratum: the labels are permuted), and the
    rows of a window are uniform: chi-square over 50 bins of rows, and every step's mean row within 5
    standard errors of the middle."""
    from dask_clust.blocks.batches import STRATUM_ROWS, batch_ids, window_at

    n, b = 5 * STRATUM_ROWS + 1234, 2000
    window = window_at(7, "minibatch", 0, n, b)
    assert window.steps == -(-n // b) and window.cum[-1] == window.steps * b
    ids = batch_ids(window, 0, window.steps)
    assert ((ids >= 0) & (ids < n)).all()
    counts = np.bincount(ids.ravel() * 50 // n, minlength=50)
    expected = ids.size / 50
    assert ((counts - expected) ** 2 / expected).sum() < 100  # chi-square, 49 degrees of freedom: p < 1e-5
    se = n / math.sqrt(12 * b)
    assert (np.abs(ids.mean(axis=1) - (n - 1) / 2) < 5 * se).all()
    later = window_at(7, "minibatch", window.steps + 3, n, b)
    assert later.first == window.steps and not np.array_equal(later.cum, window.cum)
    np.testing.assert_array_equal(batch_ids(window, 5, 9), ids[5:9])


@settings(max_examples=60, deadline=None)
@given(data_and_centers(), st.integers(0, 2**31))
def test_csr_rows_give_the_dense_rows_labels_distances_and_sums(xc, seed):
    """The same rows as a CSR matrix (most entries zeroed, int32 or int64 indices): nearest, its second
    distance, Lloyd's sums, the k-means++ potentials and update_mind equal brute force on the dense rows (the
    expansion's rounding bound), and the first pass's moments equal numpy's."""
    from scipy import sparse

    from dask_clust.kernels.sparse import csr_summary, csr_weighted_moments

    X, C = xc
    rng = np.random.default_rng(seed)
    X = np.where(rng.random(X.shape) < 0.6, 0, X).astype(X.dtype)
    S = sparse.csr_matrix(X)
    if seed % 2:
        S.indptr, S.indices = S.indptr.astype(np.int64), S.indices.astype(np.int64)
    d2 = sqdist(X, C)
    xx = (X.astype(np.float64) ** 2).sum(1)
    bound = 8 * np.finfo(np.float64).eps * (xx[:, None] + (C**2).sum(1)[None, :]).max() * X.shape[1] + 1e-12
    P = Prepared(C, X.dtype)
    mind2 = np.empty(len(X))
    labels, mind, evals = nearest(S, P, mind2=mind2)
    assert evals == len(X) * len(C)
    assert np.all(d2[np.arange(len(X)), labels] <= d2.min(1) + 2 * bound)
    np.testing.assert_allclose(mind, d2.min(1), rtol=0, atol=bound)
    if len(C) > 1:  # a lower bound of the second nearest, by at most the expansion's slack below it
        second = np.sort(d2, axis=1)[:, 1]
        assert np.all(mind2 <= second + bound)
        assert np.all(mind2 >= second - 2e-12 * (xx + (C**2).sum(1).max()) - bound)
    w = rng.random(len(X))
    sums, weights = np.zeros(C.shape), np.zeros(len(C))
    qe = accumulate(S, w, labels, mind, sums, weights)
    want = np.zeros(C.shape)
    np.add.at(want, labels, w[:, None] * X.astype(np.float64))
    np.testing.assert_allclose(sums, want, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(weights, np.bincount(labels, w, len(C)), rtol=1e-12)
    assert qe == pytest.approx((w * mind).sum(), rel=1e-12, abs=1e-9)
    old = rng.random(len(X)) * 1e3
    pot = np.zeros(len(C))
    candidate_potentials(S, w, old, P, pot)
    np.testing.assert_allclose(pot, (w[:, None] * np.minimum(old[:, None], d2)).sum(0), rtol=1e-9, atol=bound * w.sum())
    m2 = old.copy()
    update_mind(S, C, m2)
    np.testing.assert_allclose(m2, np.minimum(old, d2.min(1)), rtol=0, atol=bound)
    sums1, sumsq = np.empty(X.shape[1]), np.empty(X.shape[1])
    top, at, bad, _ = csr_summary(S.indptr, S.indices, S.data, sums1, sumsq)
    np.testing.assert_allclose(sums1, X.astype(np.float64).sum(0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(sumsq, (X.astype(np.float64) ** 2).sum(0), rtol=1e-12, atol=1e-9)
    assert bad == -1 and top == np.abs(X).max() and (not top or np.abs(X[at]).max() == top)
    wx = np.empty(X.shape[1])
    assert csr_weighted_moments(S.indptr, S.indices, S.data, w, wx) == pytest.approx((w * xx).sum(), rel=1e-12)
    np.testing.assert_allclose(wx, w @ X.astype(np.float64), rtol=1e-12, atol=1e-9)
