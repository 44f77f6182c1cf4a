"""Deep Gradient Compression: top-k of a locally accumulated, momentum-corrected gradient.

Lin, Han, Mao, Wang and Dally, "Deep Gradient Compression: Reducing the communication bandwidth
for distributed training", ICLR 2018. Per worker and per tensor, each step:

1. local gradient clipping (optional, ``clip_norm``): when the gradient's global 2-norm (all
   tensors together, like ``clip_grad_norm``) exceeds ``clip_norm``, scale it down to it. The
   paper scales the threshold by ``N ** -0.5`` for ``N`` workers; here it is given directly;
2. momentum correction: ``u = momentum * u + g``, then accumulation ``v = v + u``;
3. send the ``k = max(1, floor(density * n))`` entries of largest ``|v|`` (exact top-k, where
   the paper samples to estimate the threshold), at full precision;
4. momentum factor masking: the sent entries of both ``v`` and ``u`` are set to zero.

Warm-up: the density starts at 25% (75% sparsity) and falls exponentially to ``c`` over the
first ``warmup_steps`` steps, ``density(t) = 0.25 * (c / 0.25) ** (t / warmup_steps)``: the
paper's schedule (75%, 93.75%, 98.4375%, 99.6%, 99.9%, one stage per epoch) made continuous.

The server applies what it receives with plain SGD (no server momentum): the momentum lives on
the worker. DGC keeps its own residual (``v``), so ``error_feedback: true`` is refused. With
``wire: {values: f16}`` the rounding error of the sent values is not kept (the paper zeroes the
sent entries).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from compression.base import Compressor, Params, register
from compression.parts import SparsePart
from compression.topk import keep_count, top_magnitude

WARMUP_DENSITY = 0.25


class DGCParams(Params):
    c: float = Field(0.001, gt=0, le=1, description="target fraction of each tensor's entries sent")
    momentum: float = Field(0.9, ge=0, lt=1, description="local momentum of the momentum correction")
    clip_norm: float | None = Field(None, gt=0, allow_inf_nan=False, description="clip the local gradient's 2-norm at this value")
    warmup_steps: int = Field(0, ge=0, description="steps over which the density falls from 25% to c")


def warmup_density(step: int, target: float, warmup_steps: int) -> float:
    """Fraction of entries sent at ``step`` (0-based): exponential from 25% to ``target``."""
    if step >= warmup_steps or target >= WARMUP_DENSITY:
        return target
    return WARMUP_DENSITY * (target / WARMUP_DENSITY) ** (step / warmup_steps)


def clip_global_norm(grads: list[np.ndarray], clip_norm: float | None) -> list[np.ndarray]:
    if clip_norm is None:
        return grads
    norm = float(np.sqrt(sum(np.dot(g.astype(np.float64), g.astype(np.float64)) for g in grads)))
    if not norm > clip_norm:  # also leaves NaN alone: the server refuses non-finite values
        return grads
    factor = np.float32(clip_norm / norm)
    return [g * factor for g in grads]


@register
class DGC(Compressor):
    name = "dgc"
    Params = DGCParams
    has_own_memory = True

    def __init__(self, params, layout, seed=0):
        super().__init__(params, layout, seed)
        self.momentum = [np.zeros(size, np.float32) for size in layout.sizes]  # u
        self.accumulated = [np.zeros(size, np.float32) for size in layout.sizes]  # v
        self.step = 0

    @property
    def residual(self) -> list[np.ndarray]:
        """What has been accumulated and not sent yet (``v``)."""
        return self.accumulated

    def density(self) -> float:
        return warmup_density(self.step, self.params.c, self.params.warmup_steps)

    def _compress(self, grads):
        density = self.density()
        self.step += 1
        mu = np.float32(self.params.momentum)
        parts = []
        for i, g in enumerate(clip_global_norm(grads, self.params.clip_norm)):
            u = self.momentum[i] = mu * self.momentum[i] + g
            v = self.accumulated[i] = self.accumulated[i] + u
            idx = top_magnitude(v, keep_count(v.size, density))
            parts.append(SparsePart(idx, v[idx]))  # fancy indexing copies
            v[idx] = 0
            u[idx] = 0
        return parts
