"""Threshold sparsification: send every entry with ``|g| >= tau``, whatever their number.

A fixed magnitude threshold (Strom, Interspeech 2015, without his residual unless the method
adds ``error_feedback: true``). Unlike top-k the message size follows the gradients: large
early in training, small later; a tensor with no entry above ``tau`` sends an empty part.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from compression.base import Compressor, Params, register
from compression.parts import SparsePart


class ThresholdParams(Params):
    tau: float = Field(0.01, gt=0, allow_inf_nan=False, description="entries with |g| >= tau are sent")


@register
class Threshold(Compressor):
    name = "threshold"
    Params = ThresholdParams

    def _compress(self, grads):
        parts = []
        for g in grads:
            idx = np.flatnonzero(np.abs(g) >= self.params.tau)
            parts.append(SparsePart(idx, g[idx]))
        return parts
