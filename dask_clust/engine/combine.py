"""Declared combines: how the per-chunk fields of a step's partial become one result (ARCHITECTURE.md, rule 3).

A step returns a tuple; ``Engine.reduce(step, params, combine)`` names one combine per field. Every
combine is associative and gives the same bits for any tree of partitions, so the partitions combine
with each other on the workers and only the root's finished result reaches the driver:

    Sum()            exact sum: floats as fixed point on the fit's grid (``kernels.stats``), ints as int64;
                     a float field may come as ``Entries`` (its non-zeros: the sums of a chunk's CSR rows)
                     or as ``Words`` (already exact on that grid: sums a chunk keeps from step to step)
    Fold(start)      float64 sum in chunk order, start + p_0 + p_1 + ... (a left fold: the pieces travel
                     to the root, so keep it for small fields or for bits an older sum order fixed)
    Rows()           per-chunk arrays of any length, concatenated along axis 0 in chunk order (CSR pieces
                     stacked as one CSR matrix)
    Min() / Max()    elementwise minimum / maximum
    ArgMin() / ArgMax()   field (values, ids, *payload), elementwise: the smallest / largest value wins,
                     ties to the lowest global row id; the payload rows follow their winner
    Top(r, largest)  field (values, ids, *payload) of any length: the r smallest (largest) by (value, id)
    RowTop(r)        field (values, ids), (n, r) each: per row, the r smallest by (value, id) (a kNN merge)
    KeyedSum(rows)   field (keys, *values) of any length, 1-D each: a sparse sum, entries with equal int64
                     keys added (ints as int64, floats exactly as Sum); the result sorted by key. With
                     ``rows`` = R, key = row·R + column: a Scatter splits it by row (key range)
    Scatter(inner)   a Sum, Min, Max or KeyedSum(rows) field combined by a reduce-scatter: never assembled,
                     each partition gets the rows of the field's leading axis it owns (``shard_bounds``)

Each combine has ``lift(value, chunk_index, top)`` (one chunk's field in combinable form), ``add(a, b)``
and ``finish(a, top)`` (the result); a ``Sum`` also ``accumulate(a, value, chunk_index, top)``, add(a, lift)
in one pass. Nothing here knows Dask.
"""

import contextlib
import functools
import threading
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from ..kernels.assign import is_csr, stacked
from ..kernels.stats import (
    N_WORDS,
    fixed_accumulate,
    fixed_accumulate_entries,
    fixed_add,
    fixed_add_at,
    from_fixed,
    merge_keyed,
    to_fixed,
)


def _fixed(flat, top, out):
    """``out`` (n, N_WORDS) ← the float64 values ``flat`` on the fit's fixed-point grid."""
    _check_grid(top)
    if to_fixed(flat, top, out):
        raise FloatingPointError(f"a partial sum is not finite or exceeds 2^{top}; the data's scale was misjudged")
    return out


def _check_grid(top):
    if top is None:
        raise ValueError("a float Sum needs the fit's fixed-point grid, which the first pass sets")


@runtime_checkable
class Combine(Protocol):
    """What every combine has: a chunk's field in combinable form, two of them added, the result."""

    def lift(self, value, chunk, top): ...

    def add(self, a, b): ...

    def finish(self, a, top): ...


@runtime_checkable
class Accumulates(Combine, Protocol):
    """A combine that adds a chunk's field into a lifted one in one pass (a ``Sum``, or a ``Scatter`` of one)."""

    def accumulate(self, a, value, chunk, top): ...


class Entries(NamedTuple):
    """A float ``Sum`` field of ``shape`` given by its entries: values[e] adds at the flat position keys[e]
    (repeated keys add up). A chunk of sparse rows touches few of a k × D statistic's positions: its entries
    cost O(nnz) to make and lift, where the dense field costs O(k·D) a chunk. Each value is added exactly, so
    the sum is that of the rows' terms, however they are grouped."""

    keys: np.ndarray  # int64 (m,)
    values: np.ndarray  # float64 (m,)
    shape: tuple


class Words(NamedTuple):
    """A float ``Sum`` field of ``shape`` already on the fit's fixed-point grid: ``words`` (prod(shape), 3)
    int64, as ``kernels.stats`` makes them. A chunk that keeps exact sums through a fit (Lloyd's step over
    lazily kept bounds) sends them as they are: rounded to float64 first, they would be that chunk's bits
    alone, not the sum of its rows'."""

    words: np.ndarray  # int64 (n, N_WORDS)
    shape: tuple


class Sum:
    """Exact sum: any tree order gives the same bits."""

    def lift(self, value, chunk, top):
        if isinstance(value, Words):
            _check_grid(top)
            return "f", tuple(value.shape), np.array(value.words, dtype=np.int64, copy=True)
        if isinstance(value, Entries):
            words = np.zeros((int(np.prod(value.shape)), N_WORDS), dtype=np.int64)
            return self.accumulate(("f", tuple(value.shape), words), value, chunk, top)
        a = np.asarray(value)
        if a.dtype.kind != "f":
            return "i", a.shape, a.astype(np.int64, copy=True)
        flat = np.ascontiguousarray(a, dtype=np.float64).ravel()
        return "f", a.shape, _fixed(flat, top, np.empty((flat.size, N_WORDS), dtype=np.int64))

    def add(self, a, b):
        if a[0] == "f":
            fixed_add(a[2], b[2])
        else:
            a[2][...] += b[2]
        return a

    def accumulate(self, a, value, chunk, top, stripes=None, first=0):
        """add(a, lift(value)) in place, in one pass over value, without its lifted copy. ``stripes``: locks
        of equal row ranges of a float field, taken one at a time from stripe ``first`` on, so that threads
        adding into the same ``a`` work on different ranges (see ``Shared``)."""
        if a[0] == "i":
            a[2][...] += np.asarray(value).reshape(a[2].shape)
            return a
        _check_grid(top)
        words, entries = a[2], isinstance(value, Entries)
        if isinstance(value, Words):
            for lo, hi, lock in _ranges(words.shape[0], stripes, first):
                with lock:
                    fixed_add(words[lo:hi], value.words[lo:hi])
            return a
        if entries:
            keys, flat = value.keys, np.ascontiguousarray(value.values, dtype=np.float64)
        else:
            flat = np.ascontiguousarray(value, dtype=np.float64).ravel()
        bad = 0
        for lo, hi, lock in _ranges(words.shape[0], stripes, first):
            with lock:
                if entries:
                    bad += fixed_accumulate_entries(words[lo:hi], keys, flat, top, lo)
                else:
                    bad += fixed_accumulate(words[lo:hi], flat[lo:hi], top)
        if bad:
            raise FloatingPointError(f"a partial sum is not finite or exceeds 2^{top}; the data's scale was misjudged")
        return a

    def finish(self, a, top):
        kind, shape, data = a
        if kind == "f":
            flat = np.empty(data.shape[0])
            from_fixed(data, top, flat)
            return flat.reshape(shape) if shape else flat[0]
        return data.reshape(shape) if shape else data.reshape(()).item()

    def rows(self, a):
        """The length of a lifted field's leading axis (what a ``Scatter`` splits)."""
        return a[1][0]

    def slice(self, a, lo, hi):
        """Rows lo..hi of a lifted field (a copy: ``add`` works in place)."""
        kind, shape, data = a
        if kind == "i":  # ints keep their shape; floats are one row of words per value
            return kind, (hi - lo,) + shape[1:], data[lo:hi].copy()
        per_row = int(np.prod(shape[1:], dtype=np.int64))
        return kind, (hi - lo,) + shape[1:], data[lo * per_row : hi * per_row].copy()


def _ranges(n, stripes, first):
    """(lo, hi, lock) of each row range of a lifted float field of n rows, in the order a thread takes them:
    the whole field under no lock, or equal ranges from stripe ``first`` on."""
    if stripes is None:
        return [(0, n, contextlib.nullcontext())]
    k = len(stripes)
    return [((j % k) * n // k, (j % k + 1) * n // k, stripes[j % k]) for j in range(first, first + k)]


class _Pieces:
    """Per-chunk pieces kept in chunk order until the root."""

    def lift(self, value, chunk, top):
        return [(chunk, value)]

    def add(self, a, b):
        return sorted(a + b, key=lambda piece: piece[0])


class Fold(_Pieces):
    """float64 sum in chunk order from ``start`` (or from the first chunk's value)."""

    def __init__(self, start=None):
        self.start = start

    def lift(self, value, chunk, top):
        return [(chunk, np.asarray(value, dtype=np.float64))]

    def finish(self, a, top):
        acc = None if self.start is None else np.array(self.start, dtype=np.float64)
        for _, v in a:
            if acc is None:
                acc = v.copy()
            else:
                acc += v
        return acc if acc is None or acc.ndim else float(acc)


class Rows(_Pieces):
    """Per-chunk arrays concatenated in chunk order; CSR pieces (rows of a CSR input) stacked as CSR."""

    def lift(self, value, chunk, top):
        return [(chunk, value if is_csr(value) else np.asarray(value))]

    def finish(self, a, top):
        return stacked([v for _, v in a])


class Min:
    def lift(self, value, chunk, top):
        return np.array(value, copy=True)

    def add(self, a, b):
        return np.minimum(a, b)

    def finish(self, a, top):
        return a if a.ndim else a.item()

    def rows(self, a):
        return a.shape[0]

    def slice(self, a, lo, hi):
        return a[lo:hi].copy()


class Max(Min):
    def add(self, a, b):
        return np.maximum(a, b)


class ArgMin:
    """Elementwise (values, ids, *payload): the smaller value wins, equal values go to the lower id."""

    sign = 1.0

    def lift(self, value, chunk, top):
        return tuple(np.array(v, copy=True) for v in value)

    def add(self, a, b):
        va, vb = self.sign * a[0], self.sign * b[0]
        take = (vb < va) | ((vb == va) & (b[1] < a[1]))
        out = []
        for x, y in zip(a, b):
            m = take.reshape(take.shape + (1,) * (x.ndim - take.ndim))
            out.append(np.where(m, y, x))
        return tuple(out)

    def finish(self, a, top):
        return a


class ArgMax(ArgMin):
    sign = -1.0


class Top:
    """The ``r`` best entries of (values, ids, *payload) by (value, id); ``largest`` ranks by −value."""

    def __init__(self, r, largest=False):
        self.r = int(r)
        self.largest = largest

    def _best(self, field):
        values, ids = field[0], field[1]
        order = np.lexsort((ids, -values if self.largest else values))[: self.r]
        return tuple(np.asarray(f)[order] for f in field)

    def lift(self, value, chunk, top):
        return self._best(tuple(np.asarray(v) for v in value))

    def add(self, a, b):
        return self._best(tuple(np.concatenate([x, y]) for x, y in zip(a, b)))

    def finish(self, a, top):
        return a


class RowTop:
    """Per row of (values, ids), (n, r) each, ascending: the r smallest entries by (value, id) among all."""

    def __init__(self, r):
        self.r = int(r)

    def lift(self, value, chunk, top):
        return tuple(np.array(v, copy=True) for v in value)

    def add(self, a, b):
        values, ids = (np.concatenate([x, y], axis=1) for x, y in zip(a, b))
        order = np.lexsort((ids, values), axis=1)[:, : self.r]
        return np.take_along_axis(values, order, 1), np.take_along_axis(ids, order, 1)

    def finish(self, a, top):
        return a


class KeyedSum:
    """A sparse exact sum: (keys, *values), equal keys added. Its size is the number of distinct keys, so a
    partition's many blocks (or a worker's many partitions) send each key once up the tree. ``rows`` = R
    declares keys as row·R + column (row, column < R), so that a ``Scatter`` can split it by row.

    Lifted, it is (sorted distinct keys, the values' kinds, one int64 table): an integer value takes a column,
    a float value the N_WORDS columns of its fixed-point words, so two lifted sums add in one merge pass."""

    def __init__(self, rows=None):
        self.n_rows = rows

    def lift(self, value, chunk, top):
        keys, *values = (np.asarray(v) for v in value)
        keys = keys.astype(np.int64)
        kinds = tuple("f" if v.dtype.kind == "f" else "i" for v in values)
        index = None
        if not np.all(keys[1:] > keys[:-1]):  # a step that grouped its entries gives sorted distinct keys
            keys, index = np.unique(keys, return_inverse=True)
        width = sum(self._widths(kinds))
        # every column is written when the keys came distinct; scattered adds need zeros
        table = (np.empty if index is None else np.zeros)((len(keys), width), np.int64)
        col = 0
        for kind, v in zip(kinds, values):
            if kind == "i":
                if index is None:
                    table[:, col] = v
                else:
                    np.add.at(table[:, col], index, v.astype(np.int64))
                col += 1
                continue
            flat = np.ascontiguousarray(v, dtype=np.float64)
            if index is None:  # straight into the table's columns
                _fixed(flat, top, table[:, col : col + N_WORDS])
            else:
                fixed_add_at(
                    table[:, col : col + N_WORDS],
                    index.astype(np.int64),
                    _fixed(flat, top, np.empty((flat.size, N_WORDS), np.int64)),
                )
            col += N_WORDS
        return keys, kinds, table

    def add(self, a, b):
        keys, table = merge_keyed(a[0], a[2], b[0], b[2], self._fixed_columns(a[1]))
        return keys, a[1], table

    @staticmethod
    def _widths(kinds):
        """Columns of each value in the lifted table: 1 for an integer, N_WORDS for a float."""
        return [N_WORDS if k == "f" else 1 for k in kinds]

    @classmethod
    def _fixed_columns(cls, kinds):
        starts = np.cumsum([0] + cls._widths(kinds))[:-1]
        return np.array([s for s, k in zip(starts, kinds) if k == "f"], np.int64)

    def finish(self, a, top):
        keys, kinds, table = a
        out, col = [keys], 0
        for kind in kinds:
            if kind == "i":
                out.append(table[:, col].copy())
                col += 1
                continue
            flat = np.empty(len(keys))
            from_fixed(np.ascontiguousarray(table[:, col : col + N_WORDS]), top, flat)
            out.append(flat)
            col += N_WORDS
        return tuple(out)

    def rows(self, a):
        return self.n_rows

    def slice(self, a, lo, hi):
        """The entries of rows lo..hi (keys lo·R .. hi·R; sorted, so one contiguous range)."""
        keys, kinds, table = a
        i, j = np.searchsorted(keys, np.array([lo, hi], np.int64) * self.n_rows)
        return keys[i:j].copy(), kinds, table[i:j].copy()


class Scatter:
    """A field reduce-scattered by its leading axis (``Engine.reduce(..., scatter=...)``): combined by
    ``inner`` (a ``Sum``, ``Min`` or ``Max``: elementwise, so every row range combines on its own; or a
    ``KeyedSum(rows)``, whose entries of a row range combine on their own)."""

    def __init__(self, inner=None):
        self.inner = Sum() if inner is None else inner
        keyed = isinstance(self.inner, KeyedSum)
        if not (isinstance(self.inner, (Sum, Min)) or keyed and self.inner.n_rows is not None):
            raise TypeError("Scatter combines an elementwise field, Sum(), Min() or Max(), or a KeyedSum(rows)")

    def lift(self, value, chunk, top):
        if not isinstance(self.inner, KeyedSum) and not isinstance(value, (Entries, Words)) and np.ndim(value) == 0:
            raise ValueError("a Scatter field is split by rows: it must be an array, not a scalar")
        return self.inner.lift(value, chunk, top)

    def add(self, a, b):
        return self.inner.add(a, b)

    def accumulate(self, a, value, chunk, top):
        return accumulate_field(self.inner, a, value, chunk, top)

    def finish(self, a, top):
        return self.inner.finish(a, top)

    def rows(self, a):
        """The number of rows of the lifted field (its leading axis, or a KeyedSum's declared rows)."""
        return self.inner.rows(a)

    def slice(self, a, lo, hi):
        """Rows lo..hi of a lifted field (a copy: ``add`` works in place)."""
        return self.inner.slice(a, lo, hi)


def shard_bounds(n_rows, n_parts):
    """Row ranges of a reduce-scattered field or sharded model: partition p owns [b[p], b[p + 1])."""
    return np.array([p * n_rows // n_parts for p in range(n_parts + 1)], dtype=np.int64)


def combines_for(combine, n_fields):
    """The declared combines, one per field (``None``: every field is a ``Sum``)."""
    if combine is None:
        return (Sum(),) * n_fields
    if len(combine) != n_fields:
        raise ValueError(f"the step returned {n_fields} fields but {len(combine)} combines were declared")
    return tuple(combine)


def lift(combine, partial, chunk, top):
    """One chunk's partial (a tuple of fields) in combinable form."""
    return tuple(c.lift(v, chunk, top) for c, v in zip(combines_for(combine, len(partial)), partial))


@functools.cache
def _accumulates(cls):
    """Whether a combine class ``Accumulates``, once a class (a protocol's isinstance costs 5-10 µs a call,
    made for every field of every chunk)."""
    return issubclass(cls, Accumulates)


def accumulate_field(c, a, value, chunk, top):
    """One field of a chunk added into a lifted field ``a`` (None: nothing yet), in place where ``c`` can."""
    if a is None:
        return c.lift(value, chunk, top)
    if _accumulates(type(c)):
        return c.accumulate(a, value, chunk, top)
    return c.add(a, c.lift(value, chunk, top))


def accumulate(combine, a, partial, chunk, top):
    """A chunk's partial added into the lifted partial ``a`` (None: nothing yet): ``add(a, lift(partial))``,
    without lifting a Sum field first."""
    fields = (None,) * len(partial) if a is None else a
    return tuple(
        accumulate_field(c, x, v, chunk, top) for c, x, v in zip(combines_for(combine, len(partial)), fields, partial)
    )


class Shared:
    """One lifted partial that several threads add chunks' partials into at once (a worker's chunks):
    a float Sum field (at large C, the C x D statistic) in row stripes under a lock each, every thread
    starting at a different stripe; any other field under one lock. The worker holds one partial per
    busy thread and one sum, and the lifting runs in parallel. Exact combines: any order, the same bits."""

    def __init__(self, combine, top, threads):
        self.combine, self.top, self.threads = combine, top, threads
        self.acc = None
        self._lock = threading.Lock()
        self._turn = 0

    def add(self, partial, chunk):
        with self._lock:
            if self.acc is None:
                self.acc = list(lift(self.combine, partial, chunk, self.top))
                self._cs = combines_for(self.combine, len(partial))
                self._locks = [self._stripes(c, a) or threading.Lock() for c, a in zip(self._cs, self.acc)]
                return
            first, self._turn = self._turn, self._turn + 1
        for f, (c, v) in enumerate(zip(self._cs, partial)):
            locks = self._locks[f]
            if isinstance(locks, list):
                sum_of(c).accumulate(self.acc[f], v, chunk, self.top, locks, first * len(locks) // self.threads)
            else:
                with locks:
                    self.acc[f] = accumulate_field(c, self.acc[f], v, chunk, self.top)

    def _stripes(self, c, a):
        """Locks for 4 row stripes per thread of a float Sum field big enough to contend for."""
        if self.threads < 2 or sum_of(c) is None or a[0] != "f" or a[2].shape[0] < 1 << 16:
            return None
        return [threading.Lock() for _ in range(4 * self.threads)]

    def result(self):
        return None if self.acc is None else tuple(self.acc)


def sum_of(c):
    """The Sum behind a combine (itself, or a Scatter's inner), or None."""
    inner = c.inner if isinstance(c, Scatter) else c
    return inner if isinstance(inner, Sum) else None


def add(combine, a, b):
    """Combine two lifted partials (either may be None: nothing yet)."""
    if a is None:
        return b
    if b is None:
        return a
    return tuple(c.add(x, y) for c, x, y in zip(combines_for(combine, len(a)), a, b))


def finish(combine, a, top):
    """The result of a lifted partial: a tuple of fields."""
    return tuple(c.finish(x, top) for c, x in zip(combines_for(combine, len(a)), a))
