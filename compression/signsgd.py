"""Scaled sign compression: one bit per entry plus a per-tensor scale, ``mean |g|``.

signSGD (Bernstein et al., ICML 2018) sends ``sign(g)``; scaling by the tensor's mean absolute
value ``||g||_1 / n`` is the scaled sign of EF-signSGD (Karimireddy et al., ICML 2019), which
makes the update's l1 norm match the gradient's and is meant for ``error_feedback: true``.
One bit cannot carry three states: a zero entry is sent as ``+scale`` (the error feedback
residual, when enabled, takes the difference back).
"""

from __future__ import annotations

import numpy as np

from compression.base import Compressor, register
from compression.parts import SignPart, as_scale


@register
class SignSGD(Compressor):
    name = "signsgd"

    def _compress(self, grads):
        return [SignPart(as_scale(np.mean(np.abs(g), dtype=np.float64)), g < 0) for g in grads]
