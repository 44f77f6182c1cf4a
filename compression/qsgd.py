"""QSGD: stochastic quantisation of each entry to ``s`` levels of the tensor's 2-norm.

Alistarh, Grubic, Li, Tomioka and Vojnovic, "QSGD: Communication-efficient SGD via gradient
quantization and encoding", NeurIPS 2017. For a tensor ``g`` with ``norm = ||g||_2``, each entry
becomes ``norm * sign(g_i) * l_i / s`` where ``l_i`` is ``|g_i| / norm * s`` rounded down or up
at random, up with probability equal to the fractional part: ``E[l_i] = |g_i| s / norm``, so the
decoded tensor is an unbiased estimate of ``g``. The norm is taken per tensor (no buckets), and
levels travel as fixed-width codes, ``ceil(log2(2s + 1))`` bits per entry (4 bits at the default
``s = 7``), not with the paper's Elias integer coding.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from compression.base import Compressor, Params, register
from compression.parts import MAX_LEVELS, QuantizedPart, as_scale


class QSGDParams(Params):
    s: int = Field(7, ge=1, le=MAX_LEVELS, description="quantisation levels per sign")


def stochastic_codes(g: np.ndarray, scale: float, levels: int, rng: np.random.Generator) -> np.ndarray:
    """Codes ``levels + sign(g) * l`` with ``l`` the stochastic rounding of ``|g| / scale * levels``.

    Needs ``scale >= max |g|``. A zero or non-finite scale gives all-zero levels (with a
    non-finite scale the server refuses the part, as it refuses any non-finite value).
    """
    if not (np.isfinite(scale) and scale > 0):
        return np.full(g.size, levels, np.int64)
    x = np.abs(g.astype(np.float64)) * (levels / scale)
    low = np.floor(x)
    level = np.minimum(low + (rng.random(g.size) < x - low), levels)
    return (levels + np.sign(g) * level).astype(np.int64)


@register
class QSGD(Compressor):
    name = "qsgd"
    Params = QSGDParams

    def _compress(self, grads):
        s = self.params.s
        parts = []
        for g in grads:
            norm = as_scale(np.linalg.norm(g.astype(np.float64)))
            parts.append(QuantizedPart(s, norm, stochastic_codes(g, norm, s, self.rng)))
        return parts
