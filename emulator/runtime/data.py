"""Loading a data shard inside a device: features in, standardised float32 out.

The controller writes each worker's shard and the test set as ``.npz`` files (``x``: uint8
images N x H x W x C or float32 features N x ..., ``y`` int labels, and how to standardise
``x``: ``standardize``, one of :data:`STANDARDIZERS`, with the training set's ``mean`` and
``std`` per feature where it needs them); devices read only their own file, and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def standardize(images: np.ndarray) -> np.ndarray:
    """Per-image standardisation, as ``tf.image.per_image_standardization`` (the authors' choice)."""
    x = images.astype(np.float32)
    axes = tuple(range(1, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    count = np.prod(x.shape[1:])
    std = np.maximum(x.std(axis=axes, keepdims=True), 1.0 / np.sqrt(count))
    return ((x - mean) / std).astype(np.float32)


def per_feature(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """z-scores with the training set's mean and (floored) std per feature, computed on the host."""
    return ((x.astype(np.float32) - mean) / std).astype(np.float32)


def as_given(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


# How a shard's ``x`` becomes the model's input: per_example is the paper's per-image standardisation.
STANDARDIZERS: dict[str, Callable[..., np.ndarray]] = {
    "per_example": standardize,
    "per_feature": per_feature,
    "none": as_given,
}


def load_shard(path: str) -> tuple[np.ndarray, np.ndarray]:
    """A shard's examples as the model takes them (float32) and their labels (int32)."""
    with np.load(path) as data:
        x, y = data["x"], data["y"]
        mode = str(data["standardize"]) if "standardize" in data.files else "per_example"
        stats = {key: data[key] for key in ("mean", "std") if key in data.files}
    return STANDARDIZERS[mode](x, **stats), y.astype(np.int32)


class BatchSampler:
    """Mini-batches from a shard, reshuffled each epoch with the device's seed."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int):
        self.x, self.y = x, y
        self.batch = min(batch_size, len(x))
        self.rng = np.random.default_rng(seed)
        self._order = np.empty(0, np.int64)
        self._pos = 0

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        if self._pos + self.batch > self._order.size:
            self._order = self.rng.permutation(len(self.x))
            self._pos = 0
        idx = self._order[self._pos : self._pos + self.batch]
        self._pos += self.batch
        return self.x[idx], self.y[idx]
