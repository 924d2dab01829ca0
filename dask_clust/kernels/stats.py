"""Partial statistics: the one-pass data summary and exact, order-independent sums.

Why fixed point: float64 addition is not associative, so summing the same per-chunk partials in a
different tree (1 worker vs 8) changes the last bits of the centres, and ARCHITECTURE.md's rule 5 asks for the same
model on any number of workers. Each per-chunk float64 partial is therefore converted to a 3-word
fixed-point number (62 bits per word, the top word signed) on a grid fixed for the whole fit; integer
addition is exactly associative, so every tree shape gives bit-identical totals. The grid's top is set
from the data's scale (``fixed_top_exponent``), which leaves about 120 bits below any sum's magnitude.
"""

import math

import numpy as np
from numba import njit

WORD_BITS = 62
N_WORDS = 3


GRID_BITS = WORD_BITS * N_WORDS
_WORD_MASK = (1 << WORD_BITS) - 1


@njit(nogil=True, cache=True)
def to_fixed(values, top, out):
    """Convert float64 values to fixed point on the grid 2^(top - 186).

    values : IN  float64 (n,)  finite, |v| < 2^top
    top    : IN  int           exponent of the grid's top word (as ``fixed_top_exponent``)
    out    : OUT int64 (n, 3)  words, most significant first; word 0 signed, words 1-2 in [0, 2^62)
    Returns the number of values that did not fit (|v| >= 2^top or not finite, left 0); 0 when all did.
    """
    out[:] = 0
    return fixed_accumulate(out, values, top)


@njit(nogil=True, cache=True)
def fixed_accumulate(acc, values, top):
    """acc += values on the grid 2^(top - 186), exactly, without forming the values' words: lifting one
    chunk's partial into a running sum reads it once and skips its zeros (a large partial is mostly zeros:
    clusters the chunk's rows never reached).

    acc    : INOUT int64 (n, 3)
    values : IN    float64 (n,), C-contiguous
    top    : IN    int
    Returns the number of values that did not fit (|v| >= 2^top or not finite, not added).
    """
    bits = values.view(np.int64)
    limit = math.ldexp(1.0, top)
    bad = 0
    for i in range(values.shape[0]):
        bad += _add_exact(acc, i, values[i], bits[i], limit, top)
    return bad


@njit(nogil=True, cache=True)
def fixed_accumulate_entries(acc, keys, values, top, lo):
    """acc[keys[e] - lo] += values[e] for the entries whose key falls in [lo, lo + len(acc)), exactly (repeated
    keys add up): a partial given by its non-zeros (Lloyd's sums of CSR rows) lifted without its dense form.

    acc    : INOUT int64 (n, 3)
    keys   : IN    int64 (m,)     flat positions
    values : IN    float64 (m,), C-contiguous
    top    : IN    int
    lo     : IN    int            the position acc's first row stands for (a stripe of a shared sum)
    Returns the number of values that did not fit (not added).
    """
    bits = values.view(np.int64)
    limit = math.ldexp(1.0, top)
    n = acc.shape[0]
    bad = 0
    for e in range(keys.shape[0]):
        i = keys[e] - lo
        if 0 <= i < n:
            bad += _add_exact(acc, i, values[e], bits[e], limit, top)
    return bad


@njit(nogil=True, cache=True)
def fixed_add_weighted(acc, values, w, at, top):
    """acc[at[r] + t] += fl(w[r] · values[r, t]) for every r and t, exactly: rows' weighted shares of exact
    sums (``at``: the word row each row's first value goes to, e.g. its cluster's). A row taken back with
    its weight negated adds the same products negated, so the words return to theirs before.

    acc    : INOUT int64 (m, 3)
    values : IN    float32/float64 (n, c)
    w      : IN    float64 (n,)
    at     : IN    int64 (n,)
    top    : IN    int
    Returns the number of products that did not fit (not added).
    """
    limit = math.ldexp(1.0, top)
    box = np.empty(1)  # a product's bits, read through memory (numba has no scalar bit cast)
    bits = box.view(np.int64)
    bad = 0
    for r in range(values.shape[0]):
        for t in range(values.shape[1]):
            box[0] = w[r] * np.float64(values[r, t])
            bad += _add_exact(acc, at[r] + t, box[0], bits[0], limit, top)
    return bad


@njit(nogil=True, cache=True, inline="always")
def _add_exact(acc, i, v, b, limit, top):
    """acc[i] += v (its bit pattern b) on the grid 2^(top - 186); 1 when it did not fit (not added), else 0."""
    if v == 0.0:
        return 0
    if not abs(v) < limit:  # also NaN
        return 1
    # v = ±m·2^e exactly; on the grid it is m·2^s, s = e - (top - 186), split into 62-bit words
    ex = (b >> 52) & 0x7FF
    m = b & ((np.int64(1) << 52) - 1)
    if ex == 0:
        e = -1074
    else:
        m |= np.int64(1) << 52
        e = ex - 1075
    s = e - top + GRID_BITS
    w0, w1, w2 = _split_words(m, s)
    if b < 0:
        w0, w1, w2 = -w0, -w1, -w2
    acc[i, 0] += w0
    acc[i, 1] += w1
    acc[i, 2] += w2
    _carry(acc, i)
    return 0


@njit(nogil=True, cache=True, inline="always")
def _split_words(m, s):
    """The grid integer m·2^s (m < 2^53, the product < 2^186) as words (high, middle, low); below the grid
    (s < 0) rounded to nearest, ties to even."""
    if s < 0:
        r = -s
        if r > 53:
            return np.int64(0), np.int64(0), np.int64(0)
        q = m >> r
        rem = m & ((np.int64(1) << r) - 1)
        half = np.int64(1) << (r - 1)
        if rem > half or (rem == half and (q & 1) == 1):
            q += 1
        return np.int64(0), np.int64(0), q
    return _word(m, s - 2 * WORD_BITS), _word(m, s - WORD_BITS), _word(m, s)


@njit(nogil=True, cache=True, inline="always")
def _word(m, shift):
    """The 62 bits of m·2^shift that fall in [0, 2^62) (shift may be negative)."""
    if shift >= WORD_BITS or shift <= -53:
        return np.int64(0)
    if shift >= 0:
        return (m << shift) & _WORD_MASK
    return m >> -shift


@njit(nogil=True, cache=True)
def _carry(words, i):
    for j in range(N_WORDS - 1, 0, -1):
        c = words[i, j] >> WORD_BITS
        words[i, j] -= c << WORD_BITS
        words[i, j - 1] += c


@njit(nogil=True, cache=True)
def fixed_add(acc, other):
    """acc += other, exactly.

    acc   : INOUT int64 (n, 3)
    other : IN    int64 (n, 3)
    """
    for i in range(acc.shape[0]):
        for j in range(N_WORDS):
            acc[i, j] += other[i, j]
        _carry(acc, i)


@njit(nogil=True, cache=True)
def fixed_add_at(acc, index, other):
    """acc[index[i]] += other[i] for every i, exactly (repeated indices add up).

    acc   : INOUT int64 (m, 3)
    index : IN    int64 (n,)   rows of acc
    other : IN    int64 (n, 3)
    """
    for i in range(index.shape[0]):
        r = index[i]
        for j in range(N_WORDS):
            acc[r, j] += other[i, j]
        _carry(acc, r)


@njit(nogil=True, cache=True, inline="always")
def _copy_rest(ks, ts, i, keys, out, k):
    """merge_keyed's tail: entries i.. of one side, after the other side ran out; returns the new k."""
    for r in range(i, ks.shape[0]):
        keys[k] = ks[r]
        for c in range(ts.shape[1]):
            out[k, c] = ts[r, c]
        k += 1
    return k


@njit(nogil=True, cache=True)
def merge_keyed(ka, ta, kb, tb, fixed):
    """Two sparse exact sums added in one linear pass: the union of their strictly increasing keys, rows of
    equal keys added (np.union1d and scattered adds took ten times as long on vc-GMM's pair statistics).

    ka, kb : IN int64 (n,), (m,) strictly increasing keys
    ta, tb : IN int64 (n, W), (m, W) the entries' values: integers, and fixed-point numbers in 3 columns each
    fixed  : IN int64 (F,) the first column of each fixed-point number (its carries are propagated)
    Returns keys int64 (k,) and their values int64 (k, W).
    """
    keys = np.empty(ka.shape[0] + kb.shape[0], np.int64)
    W = ta.shape[1]
    out = np.empty((keys.shape[0], W), np.int64)
    # explicit column loops: a row-slice copy per entry cost twice the whole merge
    i = j = k = 0
    while i < ka.shape[0] and j < kb.shape[0]:
        if ka[i] < kb[j]:
            keys[k] = ka[i]
            for c in range(W):
                out[k, c] = ta[i, c]
            i += 1
        elif kb[j] < ka[i]:
            keys[k] = kb[j]
            for c in range(W):
                out[k, c] = tb[j, c]
            j += 1
        else:
            keys[k] = ka[i]
            for c in range(W):
                out[k, c] = ta[i, c] + tb[j, c]
            for f in range(fixed.shape[0]):
                for c in range(fixed[f] + N_WORDS - 1, fixed[f], -1):
                    carry = out[k, c] >> WORD_BITS
                    out[k, c] -= carry << WORD_BITS
                    out[k, c - 1] += carry
            i += 1
            j += 1
        k += 1
    k = _copy_rest(ka, ta, i, keys, out, k)
    k = _copy_rest(kb, tb, j, keys, out, k)
    return keys[:k], out[:k]


@njit(nogil=True, cache=True)
def from_fixed(words, top, out):
    """Fixed point back to float64 (deterministic: the same words give the same floats).

    words : IN  int64 (n, 3)
    top   : IN  int
    out   : OUT float64 (n,)
    """
    half = np.int64(1) << (WORD_BITS - 1)
    digits = np.empty(N_WORDS, np.int64)
    # a digit (|d| < 2^62) times an exact power of two is ldexp's result while the product stays a normal
    # float: a multiplication instead of a libm call per digit (4x faster on vc-GMM's pair statistics)
    scale = np.empty(N_WORDS)
    normal = True
    for j in range(N_WORDS):
        e = top - WORD_BITS * (j + 1)
        scale[j] = math.ldexp(1.0, e)
        normal = normal and -1022 <= e and e + WORD_BITS <= 1023
    for i in range(words.shape[0]):
        # balanced digits in [-2^61, 2^61): the leading non-zero digit carries the magnitude, so
        # rounding each digit to float64 costs at most an ulp of the total (no cancelling terms)
        for j in range(N_WORDS):
            digits[j] = words[i, j]
        for j in range(N_WORDS - 1, 0, -1):
            if digits[j] >= half:
                digits[j] -= np.int64(1) << WORD_BITS
                digits[j - 1] += 1
        v = 0.0
        for j in range(N_WORDS - 1, -1, -1):
            if normal:
                v += float(digits[j]) * scale[j]
            else:
                v += math.ldexp(float(digits[j]), top - WORD_BITS * (j + 1))
        out[i] = v


def fixed_top_exponent(total_weight, n_features, max_abs):
    """Top exponent of the fixed-point grid for one fit.

    Every sum an algorithm forms (Σ w x, Σ w, Σ w ||x - c||², counts) is bounded by
    W · max(1, D · (2 max|x| + 1)²); 16 bits of headroom cover weights and intermediate centres.
    """
    bound = max(float(total_weight), 1.0) * max(1.0, n_features * (2.0 * float(max_abs) + 1.0) ** 2)
    return int(math.ceil(math.log2(bound))) + 16


@njit(nogil=True, cache=True)
def chunk_summary(X, sums, sumsq):
    """One pass over a block: per-feature Σx and Σx² (float64), max |x| and its first row, and the first
    non-finite row.

    X     : IN  float32/float64 (n, d)
    sums  : OUT float64 (d,)
    sumsq : OUT float64 (d,)
    Returns (max_abs, its row, first_bad_row) with first_bad_row = -1 when every value is finite.
    """
    sums[:] = 0.0
    sumsq[:] = 0.0
    max_abs = 0.0
    at = 0
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            v = np.float64(X[i, j])
            if not math.isfinite(v):
                return max_abs, at, i
            sums[j] += v
            sumsq[j] += v * v
            a = abs(v)
            if a > max_abs:
                max_abs = a
                at = i
    return max_abs, at, -1


@njit(nogil=True, cache=True)
def weighted_moments(X, w, wx):
    """A block's Σ w x per feature and Σ w ||x||², float64: with Σ w, the chunk's share of the lightweight
    coreset's proposal about any centre, without a pass of its own (``blocks/coreset.py: coreset_draw``).

    X  : IN  float32/float64 (n, d), finite
    w  : IN  float64 (n,)
    wx : OUT float64 (d,)
    Returns Σ w ||x||².
    """
    wx[:] = 0.0
    total = 0.0
    for i in range(X.shape[0]):
        s = 0.0
        for j in range(X.shape[1]):
            v = np.float64(X[i, j])
            wx[j] += w[i] * v
            s += v * v
        total += w[i] * s
    return total
