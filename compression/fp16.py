"""Half precision: every coordinate as an IEEE float16, 16 bits per entry (2x fewer bytes).

Values beyond float16's range are clipped to +-65504, and the rest rounded to nearest, as
numpy's ``astype(float16)`` does. The whole tensor travels as a :class:`HalfPart`, whatever
the wire's value format (which applies to float32 parts).
"""

from __future__ import annotations

from compression.base import Compressor, register
from compression.parts import HalfPart, to_half


@register
class FP16(Compressor):
    name = "fp16"

    def _compress(self, grads):
        return [HalfPart(to_half(g)) for g in grads]
