"""Shard files: one ``.npz`` per worker and the test set, written once into a content-addressed cache.

The controller calls :func:`prepare_shards` once per run; sweeps and repeats with the same
dataset, partition, seed and sizes share the files (the cache key covers all of them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.datasets.partition import partition
from emulator.datasets.sources import PathLike, load, resolve_size

# Bump when the shard file layout changes, so old cache entries are not reused.
SHARD_FORMAT_VERSION = 1

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


__all__ = ["SHARD_FORMAT_VERSION", "ShardSet", "prepare_shards"]
