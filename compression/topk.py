"""Per-tensor top-c selection, as AdaComp and Comp-c do it (Hardy et al., NCA 2017).

For every tensor ``l`` separately keep the ``k_l = max(1, floor(c * n_l))`` entries of largest
magnitude; the rest is dropped (no residual, unless the method adds error feedback).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from compression.base import Compressor, Params, register
from compression.parts import SparsePart


def keep_count(size: int, c: float) -> int:
    """``k_l = max(1, floor(c * n_l))``, the authors' rule."""
    return max(1, min(size, math.floor(c * size)))


SAMPLE = 4096  # at most this many magnitudes sampled to estimate the selection threshold
MIN_STRIDE = 16  # ... and at most one in 16: a smaller tensor's sample costs less than it saves
OVERSAMPLE = 1.3  # aim for this many candidates per kept entry


def top_magnitude(values: np.ndarray, k: int) -> np.ndarray:
    """Sorted flat indices of the ``k`` largest ``|values|`` (ties: the lowest indices win).

    Exact, and fast on large tensors: a threshold estimated from a strided sample keeps a
    candidate set a little larger than ``k`` in one vectorised pass; the exact k-th magnitude is
    then found among the candidates. If the estimate keeps fewer than ``k`` (it cannot be
    trusted to include them all) every entry is a candidate, so the result never depends on the
    sample. Selecting by the k-th value rather than by argpartition keeps the indices in order:
    no sort afterwards. ``values`` must be finite: no NaN compares above a k-th value, so a
    tensor of NaNs would select nothing (:meth:`~compression.base.Compressor.compress` checks).
    """
    size = values.size
    if k >= size:
        return np.arange(size, dtype=np.int64)
    if k == 1:  # every bias of the paper's CNN: one call instead of a partition
        return np.array([np.argmax(np.abs(values))], dtype=np.int64)
    magnitude = np.abs(values)
    candidates = None
    if size >= MIN_STRIDE * 256 and k * 8 <= size:
        sample = magnitude[:: max(MIN_STRIDE, size // SAMPLE)]
        want = min(sample.size, int(k / size * sample.size * OVERSAMPLE) + 8)
        threshold = np.partition(sample, sample.size - want)[sample.size - want]
        candidates = np.flatnonzero(magnitude >= threshold)
        if candidates.size < k:
            candidates = None
    if candidates is None:
        return _top_in_order(magnitude, k).astype(np.int64, copy=False)
    return candidates[_top_in_order(magnitude[candidates], k)].astype(np.int64, copy=False)


def _top_in_order(magnitude: np.ndarray, k: int) -> np.ndarray:
    """Increasing positions of the ``k`` largest entries; among equal ones at the k-th value, the first."""
    kth = np.partition(magnitude, magnitude.size - k)[magnitude.size - k]
    keep = magnitude > kth
    missing = k - int(np.count_nonzero(keep))
    if missing:
        keep[np.flatnonzero(magnitude == kth)[:missing]] = True
    return np.flatnonzero(keep)


class TopKParams(Params):
    c: float = Field(0.01, gt=0, le=1, description="fraction of each tensor's entries kept")


@register
class TopK(Compressor):
    name = "topk"
    Params = TopKParams

    def __init__(self, params, layout, seed=0):
        super().__init__(params, layout, seed)
        self.keep = [keep_count(size, params.c) for size in layout.sizes]

    def _compress(self, grads):
        parts = []
        for g, k in zip(grads, self.keep):
            idx = top_magnitude(g, k)
            parts.append(SparsePart(idx, g[idx]))
        return parts
