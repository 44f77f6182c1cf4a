"""A user's own compressor: per-tensor top-c by magnitude, each kept entry sent as its sign only,
with one scale per tensor (the mean magnitude of what is kept). About 1 bit per kept entry plus
its index, against 32 bits of value for top-k; what is not sent is dropped (add
``error_feedback: true`` to the method to keep it for the next step).

It uses the project's interface exactly as the built-ins do: a ``Compressor`` subclass with a
``name``, a ``Params`` model (validated like any built-in's) and ``_compress``, which returns one
part per tensor; the wire codec encodes the parts, so the bytes counted are the bytes sent.
"""

import numpy as np
from pydantic import Field

from compression import Compressor, Params, SparseSignPart
from compression.topk import keep_count, top_magnitude


class SignTopKParams(Params):
    c: float = Field(0.01, gt=0, le=1, description="fraction of each tensor's entries sent")


class SignTopK(Compressor):
    name = "sign_topk"
    Params = SignTopKParams

    def _compress(self, grads):
        parts = []
        for g in grads:
            keep = top_magnitude(g, keep_count(g.size, self.params.c))
            chosen = g[keep]
            scale = float(np.mean(np.abs(chosen))) if chosen.size else 0.0
            parts.append(SparseSignPart(keep, scale, chosen < 0))
        return parts
