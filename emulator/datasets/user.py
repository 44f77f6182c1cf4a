"""A user's own data set, from their files: a ``.npz``, a CSV, a folder of images by class, or a
Python function in their file.

A scenario's ``dataset`` section names one source: a built-in by ``name``, a ``file`` or a
``loader`` (:data:`SOURCE_OPTIONS` says which options each takes). :func:`read` turns a user's
source into four raw arrays and, where the file has them, class names;
:func:`emulator.datasets.sources.load` then checks them (shapes, dtypes, labels, NaN/inf)
like any data set's. What goes wrong is a :class:`DataError` that names the scenario's field,
the file, and the array or the line.

Data files are data: reading them runs no code, so ``emulate plan`` may. A loader is code: it
is imported (:mod:`emulator.plugins`) only when a run asks for it, and what it raises is
reported as the user's own traceback. :func:`user_files` names every file a section reads or
imports, :func:`provenance` adds their sha256, for the run directory.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from emulator import plugins
from emulator.datasets.partition import stratified_split

DEFAULT_DATASET = "mnist-5k"  # the built-in a section without name, file or loader means
SPLIT_SEED = 0  # the fixed seed of every split and shuffle made here: the same files give the same arrays
DEFAULT_TEST_FRACTION = 0.2
DEFAULT_LABEL = "label"
ARRAYS = ("x_train", "y_train", "x_test", "y_test")
CLASS_NAMES = "class_names"  # optional, in a .npz or a loader's mapping
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png")  # what Keras' image_dataset_from_directory reads
SINGLE_CHANNEL_MODES = {"1", "L", "LA", "I", "I;16", "F"}  # Pillow modes read as grayscale
TRAIN_TEST = ("train", "test")

# Which options each kind of source takes (besides partition, the sizes and standardize, which all take).
SOURCE_OPTIONS: dict[str, frozenset[str]] = {
    "name": frozenset({"path"}),
    "npz": frozenset(),
    "csv": frozenset({"label", "test_file", "test_fraction"}),
    "images": frozenset({"test_fraction", "image_size", "color"}),
    "loader": frozenset({"args"}),
}
SOURCE_WORDS = {"name": "a built-in data set (name)", "npz": "a .npz file", "csv": "a .csv file",
                "images": "a folder of images", "loader": "a loader"}


class DataError(ValueError):
    """A user's data that cannot be used; ``field`` is the dataset section's key it concerns
    (``file``, ``test_file``, ``label``, ``loader``...), the message names the file and the array or line."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def spec_dict(spec: Any) -> dict:
    """A dataset section as a plain mapping: the plan's ``dataset`` dict, a mapping, or the scenario's model."""
    if isinstance(spec, Mapping):
        return dict(spec)
    if hasattr(spec, "model_dump"):
        return spec.model_dump()
    raise TypeError(f"expected a dataset section (a mapping), got {type(spec).__name__}")


def source_kind(spec: Any) -> str:
    """``name``, ``npz``, ``csv``, ``images`` or ``loader``: what a section's data come from (by the file's
    suffix: ``.npz``, ``.csv``, anything else a folder)."""
    spec = spec_dict(spec)
    if spec.get("loader"):
        return "loader"
    file = spec.get("file")
    if not file:
        return "name"
    return {".npz": "npz", ".csv": "csv"}.get(Path(file).suffix.lower(), "images")


def display_name(spec: Any) -> str:
    """What a run calls its data set: the built-in's name, the file's name, or the loader's reference."""
    spec = spec_dict(spec)
    kind = source_kind(spec)
    if kind == "name":
        return spec.get("name") or DEFAULT_DATASET
    if kind == "loader":
        path, attr = plugins.split(spec["loader"])
        return f"{Path(path).name}:{attr}"
    return Path(spec["file"]).name


def user_files(spec: Any) -> list[tuple[str, str]]:
    """The files a dataset section reads or imports, as (role, absolute path): ``loader`` for a Python
    file that a run imports, ``data`` for data that are only read. Empty for a built-in without ``path``."""
    spec = spec_dict(spec)
    kind = source_kind(spec)
    if kind == "loader":
        return [("loader", str(plugins.resolve_path(plugins.split(spec["loader"])[0])))]
    if kind == "name":
        return [("data", str(plugins.resolve_path(spec["path"])))] if spec.get("path") else []
    return [("data", str(plugins.resolve_path(spec[key]))) for key in ("file", "test_file") if spec.get(key)]


def provenance(spec: Any) -> list[dict]:
    """:func:`user_files` with each one's sha256 and size in bytes (a folder's: over every file in it)."""
    out = []
    for role, path in user_files(spec):
        p = Path(path)
        files = [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p]
        out.append({"role": role, "path": path, "sha256": plugins.file_digest(p), "bytes": sum(f.stat().st_size for f in files)})
    return out


def fingerprint(spec: Any) -> tuple:
    """What changes when a section's files change (each file's size and modification time), for caches."""
    spec = spec_dict(spec)
    stamps = []
    for _role, path in user_files(spec):
        p = Path(path)
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            try:
                st = f.stat()
            except OSError:
                stamps.append((str(f), None))
                continue
            stamps.append((str(f), st.st_size, st.st_mtime_ns))
    return repr(sorted(spec.items(), key=lambda kv: kv[0])), tuple(stamps)


@dataclass(frozen=True, eq=False)
class Raw:
    """A user's arrays before the checks every data set gets; ``origin`` and ``field`` name them in errors."""

    arrays: dict[str, Any]
    class_names: tuple[str, ...] | None
    source: str  # for people: what was read
    origin: str  # for errors: the file, or the loader that returned them
    field: str  # the dataset section's key to blame


def read(spec: Any) -> Raw:
    """The raw arrays of a user's source (a ``file`` or a ``loader``); DataError naming the field and file."""
    spec = spec_dict(spec)
    kind = source_kind(spec)
    if kind not in READERS:
        raise ValueError(f"dataset section names no file or loader (a built-in: {spec.get('name')!r})")
    return READERS[kind](spec)


# -- .npz ------------------------------------------------------------------------------------------


def _existing(spec: dict, field: str, folder: bool = False) -> Path:
    path = plugins.resolve_path(spec[field])
    if not path.exists():
        raise DataError(field, f"{path}: no such {'folder' if folder else 'file'}")
    if folder and not path.is_dir():
        raise DataError(field, f"{path}: expected a .npz, a .csv, or a folder of images by class; this is a file "
                               f"ending {path.suffix or '(no suffix)'}")
    if not folder and not path.is_file():
        raise DataError(field, f"{path}: a folder; expected a {path.suffix} file")
    return path


def _read_npz(spec: dict) -> Raw:
    path = _existing(spec, "file")
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [key for key in ARRAYS if key not in data.files]
            if missing:
                raise DataError("file", f"{path}: no array {', '.join(missing)} (it has: {', '.join(data.files) or 'none'}); "
                                        f"a data set's .npz holds {', '.join(ARRAYS)}")
            arrays = {key: data[key] for key in ARRAYS}
            names = tuple(str(n) for n in data[CLASS_NAMES]) if CLASS_NAMES in data.files else None
    except DataError:
        raise
    except (OSError, ValueError, EOFError) as error:  # not a zip, a truncated one, pickled objects
        raise DataError("file", f"{path}: cannot be read as a .npz of arrays ({error})") from None
    return Raw(arrays, names, f"{path} ({len(arrays['y_train']):,} train / {len(arrays['y_test']):,} test)", str(path), "file")


# -- CSV -------------------------------------------------------------------------------------------


def _csv_table(path: Path, field: str) -> tuple[list[str], np.ndarray, list[int]]:
    """The header, the cells as a string array (rows x columns), and each row's line number."""
    rows, lines = [], []
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                raise DataError(field, f"{path}: empty file; expected a header line naming the columns, then one line per example")
            header = [name.strip() for name in header]
            for row in reader:
                if not row or all(not cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise DataError(field, f"{path} line {reader.line_num}: {len(row)} values, but the header names {len(header)} columns")
                rows.append(row)
                lines.append(reader.line_num)
    except UnicodeDecodeError as error:
        raise DataError(field, f"{path}: not UTF-8 text ({error})") from None
    except csv.Error as error:
        raise DataError(field, f"{path}: not a CSV file ({error})") from None
    if not rows:
        raise DataError(field, f"{path}: a header and no examples")
    return header, np.array(rows, dtype=str), lines


def _csv_features(path: Path, field: str, header: list[str], cells: np.ndarray, lines: list[int], label: int) -> np.ndarray:
    columns = [i for i in range(len(header)) if i != label]
    if not columns:
        raise DataError(field, f"{path}: no feature columns besides the label column {header[label]!r}")
    try:
        x = np.char.strip(cells[:, columns]).astype(np.float64)
    except ValueError:
        for row, line in enumerate(lines):
            for column in columns:
                try:
                    float(cells[row, column])
                except ValueError:
                    raise DataError(field, f"{path} line {line}: column {header[column]!r} is not a number: "
                                           f"{str(cells[row, column])!r} (features must be numbers; the label column "
                                           f"is {header[label]!r})") from None
        raise
    bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
    if bad.size:
        row = int(bad[0])
        column = columns[int(np.flatnonzero(~np.isfinite(x[row]))[0])]
        raise DataError(field, f"{path} line {lines[row]}: column {header[column]!r} is {str(cells[row, column])!r}, not a finite "
                               f"number ({bad.size:,} such lines in all)")
    return x.astype(np.float32)


def _integer(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _csv_labels(path: Path, field: str, cells: np.ndarray, lines: list[int], column: str,
                names: tuple[str, ...] | None, integers: bool | None) -> tuple[np.ndarray, tuple[str, ...] | None]:
    """Labels as integers given (``names`` None) or mapped onto ``names``; the training file's decide which."""
    raw = [str(cell).strip() for cell in cells]
    for row, text in enumerate(raw):
        if not text:
            raise DataError(field, f"{path} line {lines[row]}: no label in column {column!r}")
    values = [_integer(text) for text in raw]
    if integers is None:
        integers = all(v is not None for v in values)
    if integers:
        for row, v in enumerate(values):
            if v is None or v < 0:
                raise DataError(field, f"{path} line {lines[row]}: label {raw[row]!r} in column {column!r}; the training "
                                       "file's labels are integers 0, 1, ..., so every label must be one")
        return np.array(values, dtype=np.int64), None
    if names is None:
        names = tuple(sorted(set(raw)))
    index = {name: i for i, name in enumerate(names)}
    for row, text in enumerate(raw):
        if text not in index:
            raise DataError(field, f"{path} line {lines[row]}: label {text!r} is not among the training file's labels "
                                   f"({', '.join(names[:10])}{', ...' if len(names) > 10 else ''})")
    return np.array([index[text] for text in raw], dtype=np.int64), names


def _read_csv(spec: dict) -> Raw:
    path = _existing(spec, "file")
    label = spec.get("label") or DEFAULT_LABEL
    header, cells, lines = _csv_table(path, "file")
    if label not in header:
        raise DataError("label", f"{path}: no column {label!r} (its columns: {', '.join(header)}); name the label column "
                                 "with dataset.label")
    column = header.index(label)
    x = _csv_features(path, "file", header, cells, lines, column)
    y, names = _csv_labels(path, "file", cells[:, column], lines, label, None, None)
    if spec.get("test_file"):
        test_path = _existing(spec, "test_file")
        test_header, test_cells, test_lines = _csv_table(test_path, "test_file")
        if test_header != header:
            raise DataError("test_file", f"{test_path}: its columns ({', '.join(test_header)}) differ from {path.name}'s "
                                         f"({', '.join(header)}); both files need the same header")
        x_test = _csv_features(test_path, "test_file", header, test_cells, test_lines, column)
        y_test, _ = _csv_labels(test_path, "test_file", test_cells[:, column], test_lines, label, names, names is None)
        missing = sorted(set(y_test.tolist()) - set(y.tolist()))
        if missing:
            row = int(np.flatnonzero(y_test == missing[0])[0])
            shown = names[missing[0]] if names else missing[0]
            raise DataError("test_file", f"{test_path} line {test_lines[row]}: label {shown!r} is in no line of {path.name}; "
                                         "every test label must be a training label")
        source = f"{path} ({len(y):,} train) and {test_path} ({len(y_test):,} test)"
        return Raw({"x_train": x, "y_train": y, "x_test": x_test, "y_test": y_test}, names, source, str(path), "file")
    fraction = spec.get("test_fraction") or DEFAULT_TEST_FRACTION
    train, test = _split(y, fraction, path, "file")
    source = f"{path} split {1 - fraction:.0%}/{fraction:.0%} ({len(train):,} train / {len(test):,} test)"
    return Raw({"x_train": x[train], "y_train": y[train], "x_test": x[test], "y_test": y[test]}, names, source, str(path), "file")


def _split(labels: np.ndarray, fraction: float, path: Path, field: str) -> tuple[np.ndarray, np.ndarray]:
    train, test = stratified_split(labels, fraction, SPLIT_SEED)
    if len(test) == 0 or len(train) == 0:
        raise DataError("test_fraction", f"{path}: test_fraction {fraction:g} of {len(labels):,} examples leaves "
                                         f"{len(train):,} to train and {len(test):,} to test; both need at least one")
    return train, test


# -- a folder of images by class -------------------------------------------------------------------


def _subfolders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def _classes(folder: Path) -> list[tuple[str, list[Path]]]:
    """(class name, its image files) per class folder, in sorted order (Keras' class indices)."""
    classes = _subfolders(folder)
    if not classes:
        loose = [p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
        hint = f"; its {len(loose):,} images at the top level belong in one folder per class" if loose else ""
        raise DataError("file", f"{folder}: no class folders (one folder of images per class, named after the class){hint}")
    out = []
    for c in classes:
        files = _images_in(c)
        if not files:
            raise DataError("file", f"{c}: a class folder with no images ({', '.join(IMAGE_SUFFIXES)})")
        out.append((c.name, files))
    return out


def _open_all(files: list[Path]) -> list[tuple[Path, str, tuple[int, int]]]:
    """Each image's Pillow mode and (width, height), read from its header (the pixels are decoded later)."""
    from PIL import Image, UnidentifiedImageError

    out = []
    for f in files:
        try:
            with Image.open(f) as img:
                out.append((f, img.mode, img.size))
        except (UnidentifiedImageError, OSError) as error:
            raise DataError("file", f"{f}: not an image Pillow can read ({error})") from None
    return out


def _pixels(headers: list[tuple[Path, str, tuple[int, int]]], size: tuple[int, int], grayscale: bool) -> np.ndarray:
    """uint8 (N, H, W, C): every image converted to one color mode and resized (bilinear) to ``size`` (H, W) where it differs."""
    from PIL import Image

    height, width = size
    out = np.empty((len(headers), height, width, 1 if grayscale else 3), dtype=np.uint8)
    for i, (f, _, (w, h)) in enumerate(headers):
        try:
            with Image.open(f) as img:
                img = img.convert("L" if grayscale else "RGB")
                if (w, h) != (width, height):
                    img = img.resize((width, height), Image.BILINEAR)
                out[i] = np.asarray(img, dtype=np.uint8).reshape(height, width, -1)
        except OSError as error:
            raise DataError("file", f"{f}: cannot be decoded ({error})") from None
    return out


def _labelled(classes: list[tuple[str, list[Path]]], names: tuple[str, ...]) -> tuple[list[Path], np.ndarray]:
    """Every image file of ``classes`` and its class index in ``names``."""
    files = [f for _, members in classes for f in members]
    labels = np.array([names.index(name) for name, members in classes for _ in members], dtype=np.int64)
    return files, labels


def _read_images(spec: dict) -> Raw:
    folder = _existing(spec, "file", folder=True)
    split = sorted(p.name for p in _subfolders(folder)) == sorted(TRAIN_TEST)
    if split and spec.get("test_fraction") is not None:
        raise DataError("test_fraction", f"{folder}: has train/ and test/ folders, so the test set is test/'s; leave test_fraction out")
    if split:
        train_classes, test_classes = _classes(folder / "train"), _classes(folder / "test")
        names = tuple(name for name, _ in train_classes)
        for name, _ in test_classes:
            if name not in names:
                raise DataError("file", f"{folder / 'test' / name}: a test class with no folder in {folder / 'train'} "
                                        f"(its classes: {', '.join(names)})")
        parts = [_labelled(train_classes, names), _labelled(test_classes, names)]
    else:
        classes = _classes(folder)
        names = tuple(name for name, _ in classes)
        parts = [_labelled(classes, names)]
    headers = [_open_all(files) for files, _ in parts]
    every = [h for part in headers for h in part]
    color = spec.get("color") or ("grayscale" if all(mode in SINGLE_CHANNEL_MODES for _, mode, _ in every) else "rgb")
    size = tuple(spec["image_size"]) if spec.get("image_size") else _one_size(every)  # one size over train and test
    images = [_pixels(part, size, color == "grayscale") for part in headers]
    if split:  # the files come class by class: shuffled once with the fixed seed, so contiguous shards mix classes
        rng = np.random.default_rng(SPLIT_SEED)
        order = [rng.permutation(len(labels)) for _, labels in parts]
        x_train, y_train = images[0][order[0]], parts[0][1][order[0]]
        x_test, y_test = images[1][order[1]], parts[1][1][order[1]]
        where = f"{folder} train/ and test/"
    else:
        x, y = images[0], parts[0][1]
        fraction = spec.get("test_fraction") or DEFAULT_TEST_FRACTION
        train, test = _split(y, fraction, folder, "file")
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
        where = f"{folder} split {1 - fraction:.0%}/{fraction:.0%}"
    shape = "x".join(str(d) for d in x_train.shape[1:])
    source = f"{where}: {len(names)} classes, {color} {shape} images ({len(y_train):,} train / {len(y_test):,} test)"
    return Raw({"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}, names, source, str(folder), "file")


def _one_size(headers: list[tuple[Path, str, tuple[int, int]]]) -> tuple[int, int]:
    """The (height, width) all images share; DataError naming the first that differs from the first."""
    first, _, (width, height) = headers[0]
    for f, _, (w, h) in headers:
        if (w, h) != (width, height):
            raise DataError("file", f"{f}: {h}x{w} pixels (height x width), but {first} is {height}x{width}; "
                                    "images of different sizes need image_size: [H, W] to resize them all")
    return height, width


# -- a loader in the user's file -------------------------------------------------------------------


def _described(value: Any) -> str:
    kind = type(value).__name__
    if isinstance(value, Mapping):
        return f"a {kind} with keys {', '.join(map(repr, value))}" if value else f"an empty {kind}"
    if isinstance(value, (tuple, list)):
        return f"a {kind} of {len(value)} items ({', '.join(type(v).__name__ for v in value[:6])})"
    return f"a {kind}" if value is not None else "None"


def _returned(ref: str, value: Any) -> tuple[dict, tuple[str, ...] | None]:
    """The four arrays (and class names) of what a loader returned: a mapping, a 4-tuple, or Keras'
    ``((x_train, y_train), (x_test, y_test))``; DataError saying what it returned otherwise."""
    expected = ("expected (x_train, y_train, x_test, y_test), ((x_train, y_train), (x_test, y_test)) "
                f"or a mapping with keys {', '.join(ARRAYS)} (and optionally {CLASS_NAMES})")
    if isinstance(value, Mapping):
        missing = [k for k in ARRAYS if k not in value]
        extra = [k for k in value if k not in (*ARRAYS, CLASS_NAMES)]
        if missing or extra:
            what = (f"no {', '.join(missing)}" if missing else "") + ("; " if missing and extra else "") + \
                   (f"unknown keys {', '.join(map(repr, extra))}" if extra else "")
            raise DataError("loader", f"{ref} returned {_described(value)}: {what}; {expected}")
        names = value.get(CLASS_NAMES)
        return {k: value[k] for k in ARRAYS}, None if names is None else tuple(str(n) for n in names)
    if isinstance(value, (tuple, list)):
        if len(value) == 2 and all(isinstance(v, (tuple, list)) and len(v) == 2 for v in value):
            value = (*value[0], *value[1])
        if len(value) == 4:
            return dict(zip(ARRAYS, value)), None
    raise DataError("loader", f"{ref} returned {_described(value)}; {expected}")


def _read_loader(spec: dict) -> Raw:
    ref = spec["loader"]
    path, attr = plugins.split(ref)
    shown = f"{path}:{attr}"
    fn = plugins.load(ref)  # PluginError: no such file or function; UserCodeError: the file raised on import
    if not callable(fn):
        raise DataError("loader", f"{shown} is {_described(fn)}, not a function")
    args = spec.get("args") or {}
    value = plugins.call(fn, what=f"the data set loader {shown}", **args)
    arrays, names = _returned(shown, value)
    sizes = "" if not all(hasattr(arrays[k], "__len__") for k in ("y_train", "y_test")) else \
        f" ({len(arrays['y_train']):,} train / {len(arrays['y_test']):,} test)"
    call = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return Raw(arrays, names, f"{shown}({call}){sizes}", f"{shown} returned", "loader")


READERS = {"npz": _read_npz, "csv": _read_csv, "images": _read_images, "loader": _read_loader}


def exists_without_running(spec: Any) -> None:
    """For ``emulate plan``: a loader's file exists (DataError naming it if not), without importing it."""
    spec = spec_dict(spec)
    if source_kind(spec) == "loader":
        path = plugins.resolve_path(plugins.split(spec["loader"])[0])
        if not path.is_file():
            raise DataError("loader", f"{path}: no such file")


__all__ = ["ARRAYS", "CLASS_NAMES", "DEFAULT_DATASET", "DEFAULT_LABEL", "DEFAULT_TEST_FRACTION", "IMAGE_SUFFIXES", "SOURCE_OPTIONS",
           "SOURCE_WORDS", "DataError", "Raw", "display_name", "exists_without_running", "fingerprint", "provenance",
           "read", "source_kind", "spec_dict", "user_files"]
