"""Random-k sparsification: each tensor sends ``k`` coordinates drawn uniformly without replacement.

``k = max(1, floor(c * n))`` per tensor, as top-k counts it, but the choice ignores the values
(Stich, Cordonnier and Jaggi, "Sparsified SGD with memory", NeurIPS 2018; Wangni et al. 2018).
With ``scale: true`` the kept values are multiplied by ``n / k`` so that the decoded update is an
unbiased estimate of the gradient; without it (the default) the values travel as they are,
which is the form meant to be combined with ``error_feedback: true``. Draws come from the
compressor's seeded generator: the same seed gives the same coordinates.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from compression.base import Compressor, Params, register
from compression.parts import SparsePart
from compression.topk import keep_count


class RandomKParams(Params):
    c: float = Field(0.01, gt=0, le=1, description="fraction of each tensor's entries sent")
    scale: bool = Field(False, description="multiply the sent values by n / k (unbiased)")


def random_indices(size: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` distinct flat indices in ``[0, size)``, sorted."""
    return np.sort(rng.choice(size, size=k, replace=False)).astype(np.int64)


@register
class RandomK(Compressor):
    name = "randomk"
    Params = RandomKParams

    def __init__(self, params, layout, seed=0):
        super().__init__(params, layout, seed)
        self.keep = [keep_count(size, params.c) for size in layout.sizes]

    def _compress(self, grads):
        parts = []
        for g, k in zip(grads, self.keep):
            idx = random_indices(g.size, k, self.rng)
            factor = np.float32(g.size / k) if self.params.scale else np.float32(1)
            parts.append(SparsePart(idx, g[idx] * factor))
        return parts
