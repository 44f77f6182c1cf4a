"""Shard files: one ``.npz`` per worker and the test set, written once into a content-addressed cache.

The controller calls :func:`prepare_shards` once per run; sweeps and repeats with the same
data (the sha256 of the loaded arrays), partition, seed, sizes and standardisation share the
files (the cache key covers all of them). Each file holds ``x`` (uint8 or float32), ``y``
(int32) and how a device standardises ``x`` when it loads it: ``standardize`` (a mode of
:data:`emulator.runtime.data.STANDARDIZERS`) and, for ``per_feature``, the training set's
``mean`` and ``std`` per feature, computed here; a device needs nothing but its file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from emulator.datasets import user
from emulator.datasets.partition import partition
from emulator.datasets.sources import PathLike, load, resolve_size

# Bump when the shard file layout changes, so old cache entries are not reused.
SHARD_FORMAT_VERSION = 2  # 2: any feature array, the standardisation in each file, the data's sha256 in the key

STANDARDIZE_MODES = ("auto", "per_example", "per_feature", "none")
STD_FLOOR = 1e-8  # a feature whose training std is below this is centred, not scaled (its std taken as 1)


@dataclass(frozen=True)
class ShardSet:
    """The files one run's devices read: a shard per worker (by index) and the test set."""

    directory: str
    shards: tuple[str, ...]
    test_set: str
    input_shape: tuple[int, ...]
    classes: int
    shard_sizes: tuple[int, ...]
    source: str
    dataset: str
    class_names: tuple[str, ...] | None = None
    dtype: str = "uint8"  # of x in the files: uint8 or float32
    standardize: str = "per_example"  # what each device does to x (the mode written in the files)
    sha256: str = ""  # of the data set's arrays as loaded, before any subset

    def to_json(self) -> dict:
        return {
            "dataset": self.dataset,
            "source": self.source,
            "directory": self.directory,
            "shards": list(self.shards),
            "test_set": self.test_set,
            "input_shape": list(self.input_shape),
            "classes": self.classes,
            "class_names": None if self.class_names is None else list(self.class_names),
            "shard_sizes": list(self.shard_sizes),
            "dtype": self.dtype,
            "standardize": self.standardize,
            "sha256": self.sha256,
        }


def _shard_name(worker: int) -> str:
    return f"shard-{worker:04d}.npz"


def _cache_key(**fields) -> str:
    """16 hex digits of sha256 over everything that changes the files, so sweeps share shards."""
    text = json.dumps({**fields, "format": SHARD_FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _shard_set(directory: Path, meta: dict) -> ShardSet:
    """A ShardSet whose paths point into ``directory``, wherever the cache now lives; ``meta``: its to_json()."""
    names = meta.get("class_names")
    return ShardSet(
        directory=str(directory),
        shards=tuple(str(directory / _shard_name(w)) for w in range(len(meta["shard_sizes"]))),
        test_set=str(directory / "test.npz"),
        input_shape=tuple(int(d) for d in meta["input_shape"]),
        classes=int(meta["classes"]),
        shard_sizes=tuple(int(s) for s in meta["shard_sizes"]),
        source=meta["source"],
        dataset=meta["dataset"],
        class_names=None if names is None else tuple(names),
        dtype=meta["dtype"],
        standardize=meta["standardize"],
        sha256=meta["sha256"],
    )


def _cached(directory: Path, workers: int) -> ShardSet | None:
    """The complete shard set already in ``directory``, or None if it is absent or partial."""
    meta_file = directory / "meta.json"
    if not meta_file.is_file():
        return None
    shards = _shard_set(directory, json.loads(meta_file.read_text()))
    files = (*shards.shards, shards.test_set)
    if len(shards.shards) != workers or not all(os.path.isfile(f) for f in files):
        return None
    return shards


def _save(file: Path, x: np.ndarray, y: np.ndarray, norm: dict[str, np.ndarray]) -> None:
    np.savez(file, x=x, y=y.astype(np.int32), **norm)


def standardization(mode: str, x_train: np.ndarray) -> dict[str, np.ndarray]:
    """What the shard files carry for a device to standardise ``x``: the mode (``auto`` resolved:
    uint8 images per example, other features per feature) and, per feature, the training set's
    mean and std (computed in float64 over ``x_train``, stored float32; std floored: see STD_FLOOR)."""
    if mode not in STANDARDIZE_MODES:
        raise ValueError(f"standardize: {mode!r} is not one of {', '.join(STANDARDIZE_MODES)}")
    if mode == "auto":
        mode = "per_example" if x_train.dtype == np.uint8 else "per_feature"
    norm = {"standardize": np.array(mode)}
    if mode == "per_feature":
        mean = x_train.mean(axis=0, dtype=np.float64)
        std = x_train.std(axis=0, dtype=np.float64)
        norm["mean"] = mean.astype(np.float32)
        norm["std"] = np.where(std < STD_FLOOR, 1.0, std).astype(np.float32)
    return norm


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
    dataset: str | Mapping[str, Any] | Any,
    workers: int,
    *,
    seed: int,
    cache_dir: PathLike,
    partition_scheme: str | None = None,
    path: PathLike | None = None,
    classes_per_worker: int | None = None,
    dirichlet_alpha: float | None = None,
    train_size: int | float | None = None,
    test_size: int | float | None = None,
    standardize: str | None = None,
) -> ShardSet:
    """Write (or reuse) each worker's shard and the test set under ``cache_dir/<key>/``.

    ``dataset``: a scenario's whole ``dataset`` section (the plan's ``dataset`` mapping, or the
    model), which carries its own partition, sizes and standardisation, and may name a user's file
    or loader (a loader is imported and called here); or a built-in's name, with those as the
    keyword arguments (partition ``shards`` and standardisation ``auto`` unless given).
    ``train_size`` / ``test_size``: see :func:`resolve_size` (a count, a fraction, or None for all)."""
    options = {"partition_scheme": partition_scheme, "path": path, "classes_per_worker": classes_per_worker,
               "dirichlet_alpha": dirichlet_alpha, "train_size": train_size, "test_size": test_size, "standardize": standardize}
    if isinstance(dataset, str):
        spec = {"name": dataset, "path": None if path is None else os.fspath(path), "partition": partition_scheme or "shards",
                **{k: options[k] for k in ("classes_per_worker", "dirichlet_alpha", "train_size", "test_size", "standardize")}}
    else:
        given = [k for k, v in options.items() if v is not None]
        if given:
            raise TypeError(f"prepare_shards: a dataset section carries its own {', '.join(given)}; give them in it")
        spec = user.spec_dict(dataset)
    name = user.display_name(spec)
    data = load(spec)
    x_train, y_train = _truncate(data.x_train, data.y_train, spec.get("train_size"), "dataset.train_size", name)
    x_test, y_test = _truncate(data.x_test, data.y_test, spec.get("test_size"), "dataset.test_size", name)
    norm = standardization(spec.get("standardize") or "auto", x_train)
    mode = str(norm["standardize"])
    scheme = spec.get("partition") or "shards"
    cache = Path(cache_dir).expanduser().absolute()
    target = cache / _cache_key(
        dataset=name,
        source=data.source,
        sha256=data.sha256,
        partition=scheme,
        seed=seed,
        workers=workers,
        classes_per_worker=spec.get("classes_per_worker"),
        dirichlet_alpha=spec.get("dirichlet_alpha"),
        train_size=spec.get("train_size"),
        test_size=spec.get("test_size"),
        standardize=mode,
    )
    existing = _cached(target, workers)
    if existing is not None:
        if target.stat().st_mode & 0o005 != 0o005:
            os.chmod(target, 0o755)  # made by an older version with mkdtemp's 0700
        return existing
    parts = partition(
        y_train,
        workers,
        scheme,
        seed,
        classes_per_worker=spec.get("classes_per_worker"),
        dirichlet_alpha=spec.get("dirichlet_alpha"),
    )
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache))
    os.chmod(staging, 0o755)  # devices read their shard as an unprivileged user (bind-mounted)
    try:
        for worker, indices in enumerate(parts):
            _save(staging / _shard_name(worker), x_train[indices], y_train[indices], norm)
        _save(staging / "test.npz", x_test, y_test, norm)
        shards = _shard_set(target, {
            "dataset": name, "source": data.source, "input_shape": data.input_shape, "classes": data.classes,
            "class_names": data.class_names, "shard_sizes": [len(p) for p in parts], "dtype": data.dtype,
            "standardize": mode, "sha256": data.sha256})
        (staging / "meta.json").write_text(json.dumps(shards.to_json(), indent=2) + "\n")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _publish(staging, shards)


__all__ = ["SHARD_FORMAT_VERSION", "STANDARDIZE_MODES", "STD_FLOOR", "ShardSet", "prepare_shards", "standardization"]
