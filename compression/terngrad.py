"""TernGrad: each entry becomes ``-1``, ``0`` or ``+1`` times the tensor's largest magnitude.

Wen, Xu, Yan, Wu, Wang, Chen and Li, "TernGrad: Ternary gradients to reduce communication in
distributed deep learning", NeurIPS 2017. With ``s_t = max |g|`` per tensor, entry ``i`` is sent
as ``s_t * sign(g_i) * b_i`` with ``b_i ~ Bernoulli(|g_i| / s_t)``: unbiased, 2 bits per entry
(a :class:`QuantizedPart` with one level per sign). The paper's optional gradient clipping
(``|g| <= c * sigma``, ``c = 2.5``) is ``clip_sigma``; it trades a small bias for less variance.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from compression.base import Compressor, Params, register
from compression.parts import QuantizedPart, as_scale
from compression.qsgd import stochastic_codes


class TernGradParams(Params):
    clip_sigma: float | None = Field(None, gt=0, allow_inf_nan=False,
                                     description="clip |g| at this many standard deviations first (the paper: 2.5)")


@register
class TernGrad(Compressor):
    name = "terngrad"
    Params = TernGradParams

    def clip(self, g: np.ndarray) -> np.ndarray:
        if self.params.clip_sigma is None:
            return g
        bound = np.float32(self.params.clip_sigma * np.std(g, dtype=np.float64))
        return np.clip(g, -bound, bound)

    def _compress(self, grads):
        parts = []
        for g in grads:
            g = self.clip(g)
            scale = as_scale(np.max(np.abs(g)))
            parts.append(QuantizedPart(1, scale, stochastic_codes(g, scale, 1, self.rng)))
        return parts
