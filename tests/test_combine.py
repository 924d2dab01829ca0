"""Declared combines (engine/combine.py) against brute force, through real Partition objects: chunks
spread over partitions in contiguous ranges, each partition combining its own chunks first, the
partitions then combined in the tree of fan-in ``split_every`` the cluster backend builds. Every tree
shape must give the same bits, and those bits must be the brute-force answer."""

import math

import numpy as np
import pytest

from dask_clust.engine import combine as c
from dask_clust.engine.calls import Step
from dask_clust.engine.partition import Partition, tree
from dask_clust.kernels.stats import fixed_top_exponent

N_CHUNKS = 23
TOP = fixed_top_exponent(1e6, 3, 1e8)


def _given(chunk, partials):
    """A step that returns the partial made for this chunk."""
    return partials[chunk.index]


def through_partitions(partials, combine, n_parts, split_every, threads=1):
    """Combine per-chunk partials as the engine does: partitions over contiguous chunk ranges (each adding
    its chunks' partials as ``threads`` threads compute them), then a tree."""
    groups = np.array_split(np.arange(len(partials)), n_parts)
    parts = []
    for ids in groups:
        p = Partition(
            {"chunks": [(i, i, i + 1) for i in ids], "entropy": 0, "threads": threads},
            *[(np.zeros((1, 1)), None)] * len(ids),
        )
        parts.append(p.local(Step(0, _given, partials, combine, TOP)))
        p.close()

    def up(i, below):
        acc = parts[i]
        for j, sub in below:
            acc = c.add(combine, acc, up(j, sub))
        return acc

    return c.finish(combine, up(0, tree(parts, split_every)), TOP)


SHAPES = [(1, 2), (2, 1), (5, 2), (7, 3), (23, 1), (23, 16), (8, 8)]


def assert_same(a, b):
    for x, y in zip(a, b):
        if isinstance(x, tuple):
            assert_same(x, y)
        else:
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("n_parts,split_every", SHAPES)
def test_sum_fold_rows_min_max_match_brute_force(n_parts, split_every):
    rng = np.random.default_rng(0)
    partials = [
        (
            rng.standard_normal((4, 3)) * 10.0 ** rng.integers(-8, 8),
            np.int64(rng.integers(100)),
            rng.standard_normal(5),
            rng.standard_normal((rng.integers(0, 4), 2)),
            rng.standard_normal(3),
            rng.standard_normal(3),
        )
        for _ in range(N_CHUNKS)
    ]
    combine = (c.Sum(), c.Sum(), c.Fold(start=np.full(5, 0.1)), c.Rows(), c.Min(), c.Max())
    got = through_partitions(partials, combine, n_parts, split_every)
    exact = np.vectorize(lambda i, j: math.fsum(p[0][i, j] for p in partials))(*np.indices((4, 3)))
    np.testing.assert_allclose(got[0], exact, rtol=1e-15)
    assert got[1] == sum(int(p[1]) for p in partials)
    fold = np.full(5, 0.1)
    for p in partials:  # left to right in chunk order, bit for bit
        fold += p[2]
    np.testing.assert_array_equal(got[2], fold)
    np.testing.assert_array_equal(got[3], np.concatenate([p[3] for p in partials]))
    np.testing.assert_array_equal(got[4], np.min([p[4] for p in partials], axis=0))
    np.testing.assert_array_equal(got[5], np.max([p[5] for p in partials], axis=0))
    assert_same(got, through_partitions(partials, combine, 1, 2))


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_threads_adding_into_one_sum_give_the_bits_of_one_thread(threads):
    """A partition's threads add their chunks' partials into one sum at once (a large float field in row
    stripes, the others under a lock): exact, so the bits of one thread, and the brute-force sums."""
    rng = np.random.default_rng(5)
    big = (300, 256)  # over the size from which a field is striped
    partials = []
    for _ in range(N_CHUNKS):
        x = rng.standard_normal(big) * 10.0 ** rng.integers(-6, 6)
        x[rng.random(big[0]) < 0.7] = 0.0  # rows a chunk never reached
        keys = rng.integers(0, 50, 20)
        partials.append(
            (x, rng.integers(0, 9, big).astype(np.int64), (keys, rng.standard_normal(20)), rng.standard_normal((1, 3)))
        )
    combine = (c.Sum(), c.Scatter(c.Sum()), c.KeyedSum(), c.Rows())
    got = through_partitions(partials, combine, 2, 2, threads=threads)
    assert_same(got, through_partitions(partials, combine, 1, 2, threads=1))
    rows = rng.integers(0, big[0], 40), rng.integers(0, big[1], 40)
    exact = [math.fsum(p[0][i, j] for p in partials) for i, j in zip(*rows)]
    np.testing.assert_allclose(got[0][rows], exact, rtol=1e-15)
    np.testing.assert_array_equal(got[1], np.sum([p[1] for p in partials], axis=0))


@pytest.mark.parametrize("threads", [1, 3])
def test_a_sum_given_by_entries_is_the_exact_sum_of_its_terms(threads):
    """A float Sum field may come as ``Entries`` (a chunk's CSR rows' terms, repeated keys among them): every
    term added exactly, so the brute-force sums of all terms, the same bits for any tree and threads (striped
    past 2^16 positions), plain or scattered; and with distinct keys a chunk's entries are its dense field."""
    rng = np.random.default_rng(8)
    shape = (300, 256)
    entries, dense = [], []
    for chunk in range(N_CHUNKS):
        keys = rng.integers(0, shape[0] * shape[1], 4000)
        values = rng.standard_normal(4000) * 10.0 ** rng.integers(-6, 6, 4000)
        entries.append((c.Entries(keys, values, shape), c.Entries(keys, values, shape)))
        distinct = np.unique(keys)
        x = np.zeros(shape)
        x.flat[distinct] = values[: distinct.size]
        dense.append((c.Entries(distinct, values[: distinct.size], shape), x))
    combine = (c.Sum(), c.Scatter(c.Sum()))
    got = through_partitions(entries, combine, 3, 2, threads=threads)
    for n_parts, split_every in ((1, 2), (5, 2), (23, 16)):
        assert_same(got, through_partitions(entries, combine, n_parts, split_every, threads=1))
    assert got[0].shape == shape
    np.testing.assert_array_equal(got[0], got[1])
    keys = np.concatenate([e[0].keys for e in entries])
    values = np.concatenate([e[0].values for e in entries])
    where = rng.choice(keys, 50)
    exact = [math.fsum(values[keys == k]) for k in where]
    np.testing.assert_allclose(got[0].flat[where], exact, rtol=1e-15)
    assert got[0].flat[np.setdiff1d(np.arange(got[0].size), keys)[:100]].tolist() == [0.0] * 100
    both = through_partitions(dense, combine, 2, 2, threads=threads)
    np.testing.assert_array_equal(both[0], both[1])


@pytest.mark.parametrize("threads", [1, 3])
def test_a_sum_given_as_words_adds_them_as_they_are(threads):
    """A float Sum field may come as ``Words``, already on the grid (a chunk's exact sums kept from step to
    step): the result is that of the same values given as floats, for any tree and threads (striped past 2^16
    positions), plain or scattered, and the chunk's words are not changed."""
    from dask_clust.kernels.stats import N_WORDS, to_fixed

    rng = np.random.default_rng(9)
    shape = (300, 256)
    floats, words = [], []
    for _ in range(N_CHUNKS):
        x = rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, shape)
        w = np.empty((x.size, N_WORDS), np.int64)
        assert to_fixed(x.ravel(), TOP, w) == 0
        floats.append((x, x))
        words.append((c.Words(w, shape), c.Words(w, shape)))
    kept = [p[0].words.copy() for p in words]
    combine = (c.Sum(), c.Scatter(c.Sum()))
    want = through_partitions(floats, combine, 2, 2, threads=1)
    for n_parts, split_every in ((1, 2), (3, 2), (23, 16)):
        assert_same(through_partitions(words, combine, n_parts, split_every, threads=threads), want)
    for p, w in zip(words, kept):
        np.testing.assert_array_equal(p[0].words, w)


@pytest.mark.parametrize("n_parts,split_every", SHAPES)
@pytest.mark.parametrize("kind", [c.ArgMin, c.ArgMax])
def test_argmin_argmax_ties_go_to_the_lowest_id(n_parts, split_every, kind):
    rng = np.random.default_rng(1)
    k = 6
    # few distinct values, so most elements tie across chunks; ids are global row ids
    partials = [
        ((rng.integers(0, 3, k).astype(np.float64), rng.permutation(1000)[:k] + 1000 * i, rng.standard_normal((k, 2))),)
        for i in range(N_CHUNKS)
    ]
    ((values, ids, rows),) = through_partitions(partials, (kind(),), n_parts, split_every)
    allv = np.stack([p[0][0] for p in partials])
    alli = np.stack([p[0][1] for p in partials])
    allr = np.stack([p[0][2] for p in partials])
    for j in range(k):
        key = allv[:, j] if kind is c.ArgMin else -allv[:, j]
        best = np.lexsort((alli[:, j], key))[0]
        assert values[j] == allv[best, j] and ids[j] == alli[best, j]
        np.testing.assert_array_equal(rows[j], allr[best, j])


@pytest.mark.parametrize("n_parts,split_every", SHAPES)
@pytest.mark.parametrize("largest", [False, True])
def test_top_r_by_value_then_id(n_parts, split_every, largest):
    rng = np.random.default_rng(2)
    partials = []
    for i in range(N_CHUNKS):
        m = int(rng.integers(0, 6))
        partials.append(
            ((rng.integers(0, 4, m).astype(np.float64), np.arange(m) + 100 * i, rng.standard_normal((m, 3))),)
        )
    ((values, ids, rows),) = through_partitions(partials, (c.Top(7, largest),), n_parts, split_every)
    allv = np.concatenate([p[0][0] for p in partials])
    alli = np.concatenate([p[0][1] for p in partials])
    allr = np.concatenate([p[0][2] for p in partials])
    order = np.lexsort((alli, -allv if largest else allv))[:7]
    np.testing.assert_array_equal(values, allv[order])
    np.testing.assert_array_equal(ids, alli[order])
    np.testing.assert_array_equal(rows, allr[order])


@pytest.mark.parametrize("n_parts,split_every", SHAPES)
def test_keyed_sum_adds_equal_keys_exactly(n_parts, split_every):
    """Sparse (key, count, value) entries, keys repeated within and across chunks (and some chunks empty):
    one entry per distinct key, sorted, counts and math.fsum of the values, the same bits for every tree."""
    rng = np.random.default_rng(3)
    partials = []
    for _ in range(N_CHUNKS):
        m = int(rng.integers(0, 12))
        partials.append(
            (
                (
                    rng.integers(0, 15, m),
                    rng.integers(1, 5, m).astype(np.int32),
                    rng.standard_normal(m) * 10.0 ** rng.integers(-6, 6, m),
                ),
            )
        )
    got = through_partitions(partials, (c.KeyedSum(),), n_parts, split_every)[0]
    entries = {}
    for ((keys, counts, values),) in partials:
        for k, n, v in zip(keys.tolist(), counts.tolist(), values.tolist()):
            entries.setdefault(k, []).append((n, v))
    keys = sorted(entries)
    np.testing.assert_array_equal(got[0], keys)
    np.testing.assert_array_equal(got[1], [sum(n for n, _ in entries[k]) for k in keys])
    np.testing.assert_allclose(got[2], [math.fsum(v for _, v in entries[k]) for k in keys], rtol=1e-15)
    assert got[1].dtype == np.int64 and got[2].dtype == np.float64
    assert_same(got, through_partitions(partials, (c.KeyedSum(),), 1, 2)[0])


@pytest.mark.parametrize("n_parts", [1, 2, 3, 7])
def test_scattered_keyed_sum_gives_each_shard_its_rows(n_parts):
    """Scatter(KeyedSum(rows=R)), keys row·R + column: every partition's partial split by row range and the
    pieces of each range added where it lives give, shard after shard, the bits of the whole KeyedSum."""
    R = 6
    rng = np.random.default_rng(5)
    partials = []
    for _ in range(N_CHUNKS):
        m = int(rng.integers(0, 12))
        partials.append(((rng.integers(0, R * R, m), rng.integers(1, 5, m).astype(np.int32), rng.standard_normal(m)),))
    whole = through_partitions(partials, (c.KeyedSum(),), 1, 2)[0]
    sc = c.Scatter(c.KeyedSum(rows=R))
    groups = np.array_split(np.arange(N_CHUNKS), n_parts)
    mine = []
    for ids in groups:
        acc = None
        for i in ids:
            acc = c.add((sc,), acc, c.lift((sc,), partials[i], int(i), TOP))
        mine.append(acc[0])
    b = c.shard_bounds(sc.rows(mine[0]), n_parts)
    shards = []
    for q in range(n_parts):
        acc = None
        for part in mine:
            piece = sc.slice(part, b[q], b[q + 1])
            assert np.all((piece[0] >= b[q] * R) & (piece[0] < b[q + 1] * R))
            acc = piece if acc is None else sc.add(acc, piece)
        shards.append(sc.finish(acc, TOP))
    for field in range(3):
        assert_same(np.concatenate([s[field] for s in shards]), whole[field])
    with pytest.raises(TypeError, match="KeyedSum"):
        c.Scatter(c.KeyedSum())


def test_tree_covers_every_partition_once():
    for n in range(1, 20):
        for s in (1, 2, 3, 8, 16):
            seen = []

            def walk(below):
                for j, sub in below:
                    seen.append(j)
                    walk(sub)

            walk(tree(list(range(n)), s))
            assert sorted(seen) == list(range(1, n))


def test_declared_combines_must_match_the_fields():
    with pytest.raises(ValueError, match="returned 2 fields but 1 combines"):
        c.lift((c.Sum(),), (1.0, 2.0), 0, TOP)
    with pytest.raises(ValueError, match="fixed-point grid"):
        c.lift(None, (1.0,), 0, None)
