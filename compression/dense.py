"""No compression: the whole gradient, as plain asynchronous SGD sends it."""

from __future__ import annotations

from compression.base import Compressor, register
from compression.parts import DensePart


@register
class Dense(Compressor):
    name = "dense"

    def _compress(self, grads):
        return [DensePart(g) for g in grads]
