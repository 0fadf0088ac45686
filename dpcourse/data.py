"""Fashion-MNIST: download with md5 checks, IDX reading, a synthetic stand-in.

Taught in notebook 02. The real files come from the published locations in
:data:`MIRRORS`; every download is checked against the published md5 before
it is moved, atomically, into the cache folder. When the download is not
possible (no network, as on the course's build machines) and the user did
not demand real data, a generated Fashion-MNIST-shaped set is used instead
and labelled ``synthetic`` everywhere it appears.

Facts (file names, md5 sums, locations, class names) are from Zalando
Research's Fashion-MNIST repository, github.com/zalandoresearch/fashion-mnist
(README, "Get the Data"), also listed in the course's shared data folder.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import struct
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DATA_ENV = "DPCOURSE_DATA"  # "auto" (default), "real" or "synthetic"
DATA_DIR_ENV = "DPCOURSE_DATA_DIR"

MIRRORS = (
    "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/",
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
)
# md5 of the published .gz files (source: module docstring).
MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
TRAIN_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
N_TRAIN = 60_000
IMAGE_SHAPE = (28, 28)
N_FEATURES = 28 * 28
N_CLASSES = 10

# IDX type code -> numpy dtype (big-endian), from the IDX format description
# on Yann LeCun's MNIST page.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DataError(RuntimeError):
    """A data file could not be downloaded, verified or read."""


def cache_dir() -> Path:
    """The cache folder: ``$DPCOURSE_DATA_DIR``, else ``~/.cache/dpcourse/fashion-mnist``."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "dpcourse" / "fashion-mnist"


def md5_of(path: Path) -> str:
    """Hex md5 of a file, read in 1 MiB chunks."""
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(
    name: str,
    directory: Path | None = None,
    mirrors: tuple[str, ...] = MIRRORS,
    md5: dict[str, str] = MD5,
    timeout_s: float = 30.0,
) -> Path:
    """Return the path of a verified copy of ``name``, downloading it if needed.

    A cached file whose md5 matches is used as it is; one that does not match
    is replaced. Each location is tried in order; the bytes go to a temporary
    file in the cache folder, are checked against ``md5[name]``, and only
    then renamed into place (an atomic rename), so an interrupted, truncated
    or corrupted download never leaves a file that looks valid.

    Args:
        name: file name, a key of ``md5``.
        directory: cache folder (default :func:`cache_dir`).
        mirrors: base URLs, each ending in ``/``, tried in order.
        md5: expected hex md5 per file name.
        timeout_s: socket timeout per location, in seconds.

    Raises:
        KeyError: ``name`` has no known md5.
        DataError: no location gave the right bytes; the message names the
            file, every location tried with its failure, and the cache folder.
    """
    expected = md5[name]
    directory = Path(directory) if directory is not None else cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        stale = None
        target = directory / name
        if target.is_file():
            found = md5_of(target)
            if found == expected:
                return target
            stale = found
    except OSError as err:
        raise DataError(
            f"Cannot use the cache folder {directory} for {name}: {err}. "
            f"Set {DATA_DIR_ENV} to a writable folder, or set {DATA_ENV}=synthetic."
        ) from err
    failures = []
    for base in mirrors:
        url = base + name
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=directory)
        except OSError as err:
            raise DataError(
                f"Cannot write to the cache folder {directory} for {name}: {err}. "
                f"Set {DATA_DIR_ENV} to a writable folder, or set {DATA_ENV}=synthetic."
            ) from err
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout_s) as resp:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
            got = md5_of(tmp)
            if got != expected:
                failures.append(f"{url}: md5 {got}, expected {expected}")
                continue
            os.replace(tmp, target)
            return target
        except (urllib.error.URLError, OSError, ValueError) as err:
            failures.append(f"{url}: {err}")
        finally:
            if tmp.exists():
                tmp.unlink()
    tried = "\n  ".join(failures)
    note = ""
    if stale is not None:
        note = (
            f"The cache already holds a {name} with md5 {stale}: it is not the published file "
            "and is not used (a successful download replaces it).\n"
        )
    raise DataError(
        f"Could not download {name} from any of {len(failures)} location(s). Tried:\n  {tried}\n{note}"
        f"Cache folder: {directory}. Copy the file there by hand (md5 {expected}), "
        f"set {DATA_DIR_ENV} to a folder that holds it, or set {DATA_ENV}=synthetic."
    )


def read_idx(path: Path) -> np.ndarray:
    """Read a (gzip-compressed or plain) IDX file into a numpy array.

    Returns:
        Array with the dtype and shape the header declares, e.g. uint8
        ``[60000, 28, 28]`` for the training images, ``[60000]`` for labels.

    Raises:
        DataError: bad magic number, unknown type code, or a size that does
            not match the header (a truncated file).
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({err}). Delete it and download again.") from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number).")
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: IDX header truncated.")
    shape = struct.unpack(">" + "I" * ndim, raw[4:header])
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != count * dtype.itemsize:
        raise DataError(
            f"{path}: header declares shape {shape} ({count * dtype.itemsize} bytes) "
            f"but {len(raw) - header} bytes follow (truncated or corrupted)."
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


@dataclass(frozen=True)
class Dataset:
    """Prepared training data (host memory).

    Attributes:
        images: float32 ``[n, 784]``, scaled to [0, 1], shuffled with seed 0.
        labels: int32 ``[n]`` in 0..9.
        source: ``"real"`` (Fashion-MNIST, md5-checked) or ``"synthetic"``.
        note: why this source was used (shown in the banner).
    """

    images: np.ndarray
    labels: np.ndarray
    source: str
    note: str

    @property
    def n_examples(self) -> int:
        return int(self.labels.shape[0])


def synthetic_images(n: int = N_TRAIN, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A learnable stand-in with Fashion-MNIST's shapes and dtypes.

    Each class has a smooth random 28x28 template; an image is its class's
    template, shifted by up to 2 pixels, plus noise, clipped to uint8. The
    classes overlap enough that accuracy climbs over many steps rather than
    at once.

    Returns:
        images uint8 ``[n, 28, 28]`` and labels uint8 ``[n]`` (balanced classes).
    """
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 1, size=(N_CLASSES, 7, 7))
    templates = np.kron(coarse, np.ones((4, 4)))  # [10, 28, 28], blocky shapes
    labels = np.arange(n) % N_CLASSES
    rng.shuffle(labels)
    shifts = rng.integers(-2, 3, size=(n, 2))
    images = np.empty((n, 28, 28), dtype=np.float32)
    for c in range(N_CLASSES):
        idx = np.nonzero(labels == c)[0]
        for dy in range(-2, 3):
            for dx in range(-2, 3):
                sel = idx[(shifts[idx, 0] == dy) & (shifts[idx, 1] == dx)]
                images[sel] = np.roll(templates[c], (dy, dx), axis=(0, 1))
    images = 0.55 * images + rng.normal(0.0, 0.35, size=images.shape).astype(np.float32)
    images = np.clip(images * 255.0, 0, 255).astype(np.uint8)
    return images, labels.astype(np.uint8)


# Bump when synthetic_images changes what it returns: copies kept under an older number are not read.
SYNTHETIC_VERSION = 1


def synthetic_kept(n: int = N_TRAIN, seed: int = 0, directory: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`synthetic_images` ``(n, seed)``, kept in the cache folder after the first call.

    Every lesson and every process a lesson starts loads the same stand-in;
    generating it takes about a second on a 2-core CPU, reading the kept copy
    (``synthetic-v<version>-n<n>-seed<seed>.npz``, the same arrays) a few
    milliseconds. A copy that cannot be read is made again; a folder that
    cannot be written keeps nothing and loses nothing.
    """
    folder = Path(directory) if directory is not None else cache_dir()
    path = folder / f"synthetic-v{SYNTHETIC_VERSION}-n{n}-seed{seed}.npz"
    try:
        with np.load(path) as kept:
            images, labels = kept["images"], kept["labels"]
        if images.shape == (n, *IMAGE_SHAPE) and labels.shape == (n,) and images.dtype == labels.dtype == np.uint8:
            return images, labels
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # not kept yet, or unreadable: make it again
    images, labels = synthetic_images(n, seed=seed)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, images=images, labels=labels)
        os.replace(tmp, path)  # atomic: a process reading at the same time sees all of it or nothing
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return images, labels


def prepare(
    images: np.ndarray, labels: np.ndarray, seed: int = 0, limit: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle once with ``seed``, scale to [0, 1] float32, flatten to 784 features.

    Args:
        images: uint8 ``[n, 28, 28]``.
        labels: integer ``[n]``.
        limit: keep only the first ``limit`` examples after the shuffle.

    Returns:
        float32 ``[m, 784]`` and int32 ``[m]`` with ``m = min(n, limit)``.

    Raises:
        ValueError: the image and label counts differ.
    """
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels.")
    order = np.random.default_rng(seed).permutation(images.shape[0])
    if limit is not None:
        order = order[:limit]
    x = images[order].reshape(len(order), -1).astype(np.float32) / 255.0
    y = labels[order].astype(np.int32)
    return x, y


def load_fashion_mnist(
    source: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    directory: Path | None = None,
    mirrors: tuple[str, ...] = MIRRORS,
    md5: dict[str, str] = MD5,
) -> Dataset:
    """Load the prepared Fashion-MNIST training set, or its synthetic stand-in.

    Args:
        source: ``"real"`` (download or cache; fail if impossible),
            ``"synthetic"`` (never touch the network) or ``"auto"`` (real if
            possible, else synthetic with a note). ``None`` reads
            ``$DPCOURSE_DATA``, default ``"auto"``.
        limit: keep this many examples after the shuffle (None: all 60,000).
        seed: shuffle seed (0 in the course).
        directory, mirrors, md5: see :func:`download`.

    Returns:
        A :class:`Dataset`; ``images`` float32 ``[n, 784]``, ``labels`` int32 ``[n]``.

    Raises:
        ValueError: unknown ``source``.
        DataError: ``source="real"`` and a file could not be had.
    """
    source = (source or os.environ.get(DATA_ENV) or "auto").strip().lower()
    if source not in ("auto", "real", "synthetic"):
        raise ValueError(f"Unknown data source {source!r}: use auto, real or synthetic ({DATA_ENV}).")
    if source == "synthetic":
        images, labels = synthetic_kept(min(limit or N_TRAIN, N_TRAIN), seed=seed, directory=directory)
        x, y = prepare(images, labels, seed=seed, limit=limit)
        return Dataset(x, y, "synthetic", f"{DATA_ENV}=synthetic was set.")
    try:
        paths = [download(name, directory=directory, mirrors=mirrors, md5=md5) for name in TRAIN_FILES]
        images, labels = read_idx(paths[0]), read_idx(paths[1])
    except DataError as err:
        if source == "real":
            raise
        images, labels = synthetic_kept(min(limit or N_TRAIN, N_TRAIN), seed=seed, directory=directory)
        x, y = prepare(images, labels, seed=seed, limit=limit)
        # First line (which file) and the first location's failure (why).
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = " ".join(lines[:3]).replace(" Tried:", "")
        return Dataset(x, y, "synthetic", f"Real data unavailable: {reason}")
    x, y = prepare(images, labels, seed=seed, limit=limit)
    return Dataset(x, y, "real", "Fashion-MNIST training set, md5-checked.")


def stacked_batches(dataset: Dataset, n_batches: int, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut ``n_batches`` consecutive global batches and stack them.

    When the dataset holds fewer than ``n_batches * global_batch`` examples
    (a large sweep size, or 8 GPUs at full size) it is read again from the
    start, so some examples appear twice.

    Returns:
        images float32 ``[n_batches, global_batch, 784]`` and labels int32
        ``[n_batches, global_batch]`` (host arrays; global, not per device).

    Raises:
        ValueError: ``n_batches`` or ``global_batch`` < 1, or an empty dataset.
    """
    if n_batches < 1 or global_batch < 1:
        raise ValueError(f"n_batches and global_batch must be >= 1, got {n_batches} and {global_batch}.")
    if dataset.n_examples == 0:
        raise ValueError("The dataset is empty.")
    idx = np.arange(n_batches * global_batch) % dataset.n_examples
    x = dataset.images[idx].reshape(n_batches, global_batch, N_FEATURES)
    y = dataset.labels[idx].reshape(n_batches, global_batch)
    return x, y
