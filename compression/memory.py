"""Error feedback (residual memory) as a wrapper any compressor can take.

What a compressor drops this step is added back to the next gradient: ``g' = g + r``,
``r <- g' - sent(g')`` where ``sent`` is exactly what the server will decode. So the sum of
everything sent plus the residual always equals the sum of every gradient (Stich et al.;
Karimireddy et al., EF-SGD). Compressors that keep their own residual (``has_own_memory``:
DGC, adaptive_residual) refuse the wrapper.
"""

from __future__ import annotations

import numpy as np

from compression.base import Compressor
from compression.codec import round_trip
from compression.parts import Part, WireFormat


class ErrorFeedback:
    def __init__(self, inner: Compressor, wire: WireFormat = WireFormat()):
        if inner.has_own_memory:
            raise ValueError(f"{inner.name} keeps its own residual: error feedback would add it back twice")
        self.inner = inner
        self.wire = wire
        self.residual = [np.zeros(size, np.float32) for size in inner.layout.sizes]

    @property
    def layout(self):
        return self.inner.layout

    def compress(self, grads: list[np.ndarray]) -> list[Part]:
        corrected = [g + r for g, r in zip(grads, self.residual)]
        parts = self.inner.compress(corrected)
        sent = round_trip(parts, self.wire)
        for i, (part, size) in enumerate(zip(sent, self.layout.sizes)):
            self.residual[i] = corrected[i] - part.dense(size)
        return parts
