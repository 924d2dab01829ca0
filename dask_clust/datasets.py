"""Synthetic data generated lazily per chunk (any size, no driver memory) and loaders for bundled data."""
import dask
import dask.array as da
import numpy as np

DEFAULT_CHUNK_ROWS = 1 << 20


def _blobs_block(seed, n, d, c, background, spread, index):
    """One chunk of blobs. With ``index=None`` this is exactly ``shared/bench/make_blobs.py``'s stream."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-spread, spread, size=(c, d))
    if index is not None:
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
    lab = rng.integers(0, c, size=n)
    x = centers[lab] + rng.standard_normal((n, d))
    bg = rng.random(n) < background
    x[bg] = rng.uniform(-spread - 3, spread + 3, size=(int(bg.sum()), d))
    lab[bg] = -1
    return x.astype(np.float32), lab


def make_blobs(n_samples, n_features, centers, *, background=0.1, chunks=None, random_state=0, spread=10.0):
    """Gaussian blobs (unit std, centres uniform in [-spread, spread]^d) plus a uniform background.

    Returns lazy dask arrays (X float32 (n, d), y int64 with -1 for background rows), generated per
    chunk of ``chunks`` rows (default 2^20) with one random stream per chunk, so any size costs no driver
    memory. When n_samples fits one chunk the stream is exactly that of ``shared/bench/make_blobs.py``
    for the same parameters (blobs1m_d16 and blobs200k_d32 included); the centres are always the same.
    """
    if int(n_samples) < 1 or int(n_features) < 1 or int(centers) < 1:
        raise ValueError(f"n_samples, n_features and centers must be >= 1; got {n_samples}, {n_features}, {centers}")
    if not 0 <= background <= 1:
        raise ValueError(f"background must be in [0, 1]; got {background}")
    seed = int(random_state)
    rows = int(chunks or DEFAULT_CHUNK_ROWS)
    starts = list(range(0, n_samples, rows))
    single = len(starts) == 1
    xs, ys = [], []
    for i, s in enumerate(starts):
        m = min(rows, n_samples - s)
        block = dask.delayed(_blobs_block, pure=True)(seed, m, n_features, centers, background, spread,
                                                        None if single else i)
        xs.append(da.from_delayed(block[0], (m, n_features), dtype=np.float32))
        ys.append(da.from_delayed(block[1], (m,), dtype=np.int64))
    return da.concatenate(xs), da.concatenate(ys)


def make_digitlike(n_samples=60_000, n_centers=8, sigma=0.2, random_state=2017):
    """784-d "digit-like" data, SBE's Gaussian-MNIST-centroids test: ``n_centers`` smooth random 28x28 ink
    images (about 15 % ink) plus N(0, sigma²) per pixel, n_samples // n_centers rows per centre. Exactly
    ``shared/bench/make_digitlike784.py``'s stream; with sigma = 0.2 f = QE/(2N) at the centres is about
    15.68. Returns (X float64, labels, centres); needs scipy.
    """
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(random_state)
    shared = gaussian_filter(rng.standard_normal((28, 28)), 2.0)
    cents = []
    for _ in range(n_centers):
        own = gaussian_filter(rng.standard_normal((28, 28)), 2.0)
        field = np.sqrt(0.4) * shared / shared.std() + np.sqrt(0.6) * own / own.std()
        thr = np.quantile(field, 0.85)
        cents.append(np.clip((field - thr) / (0.5 * field.std()), 0, 1).ravel())
    centers = np.array(cents)
    labels = np.repeat(np.arange(n_centers), n_samples // n_centers)
    X = centers[labels] + sigma * rng.standard_normal((labels.size, 784))
    return X, labels, centers


def load_digits():
    """scikit-learn's 8x8 digits (1797 x 64, float64) and labels; needs scikit-learn (extra ``test``)."""
    try:
        from sklearn.datasets import load_digits as _load
    except ImportError as exc:
        raise ImportError("load_digits needs scikit-learn: pip install 'dask_clust[test]'") from exc
    d = _load()
    return d.data.astype(np.float64), d.target.astype(np.int64)
