"""Loading a data shard inside a device: uint8 images in, standardised float32 out.

The controller writes each worker's shard and the test set as ``.npz`` files (``x`` uint8
of shape N x H x W x C, ``y`` int labels); devices read only their own file.
"""

from __future__ import annotations

import numpy as np


def standardize(images: np.ndarray) -> np.ndarray:
    """Per-image standardisation, as ``tf.image.per_image_standardization`` (the authors' choice)."""
    x = images.astype(np.float32)
    axes = tuple(range(1, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    count = np.prod(x.shape[1:])
    std = np.maximum(x.std(axis=axes, keepdims=True), 1.0 / np.sqrt(count))
    return ((x - mean) / std).astype(np.float32)


def load_shard(path: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as data:
        x, y = data["x"], data["y"]
    if x.ndim == 3:
        x = x[..., None]
    return standardize(x), y.astype(np.int32)


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
