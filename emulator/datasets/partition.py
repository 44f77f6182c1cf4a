"""Partitions: which training examples each worker gets (the paper's contiguous shards, iid, non-iid),
and the stratified train/test split of a data set that comes without a test set."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train/test indices with the same class balance in both, shuffled with a fixed seed (a data
    set that comes without a test set of its own: mnist-5k, a CSV without ``test_file``, an image
    folder without ``train/`` and ``test/``)."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        cut = int(round(len(members) * test_fraction))
        test.append(members[:cut])
        train.append(members[cut:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


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


__all__ = ["PARTITION_SCHEMES", "partition", "stratified_split"]
