"""PowerSGD: a rank-``r`` approximation of each matrix by one warm-started power-iteration step.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical low-rank gradient compression for
distributed optimization", NeurIPS 2019. Each tensor is viewed as a matrix ``M`` (rows x cols);
the worker keeps ``Q`` (cols x r) from its previous step (first drawn from the seeded
generator, standard normal) and computes

    P = orthonormalise(M @ Q)      (reduced QR)
    Q = M.T @ P                    (kept for the next step: the warm start)

and sends ``P`` and ``Q``; the server applies ``P @ Q.T`` (the projection of ``M`` on the span
of ``P``). With one worker per message there is no all-reduce between the two products.

Choices:
- the matrix view is ``(product of all dimensions but the last) x (last dimension)``: the
  output units are the last axis of TensorFlow's kernels (dense ``in x out``, convolution
  ``kh x kw x in x out``), so this is the same matrix as PyTorch's ``out x (in * kh * kw)``
  view the paper uses, transposed. It is a view of the flat row-major tensor, so no data moves.
- tensors of rank < 2, and matrices where ``r * (rows + cols) >= rows * cols`` (the factors
  would not be smaller) or ``r >= min(rows, cols)``, are sent dense (float32).
- when a column of the new ``Q`` is all zeros (a zero gradient), it is drawn afresh, or the
  warm start would stay at zero for good.
- the paper relies on error feedback: use ``error_feedback: true`` with this compressor.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from compression.base import Compressor, Params, register
from compression.layout import TensorSpec
from compression.parts import DensePart, LowRankPart


class PowerSGDParams(Params):
    rank: int = Field(2, ge=1, le=1024, description="rank r of the approximation")


def matrix_shape(spec: TensorSpec) -> tuple[int, int] | None:
    """``(rows, cols)`` of the matrix view, or None when the tensor is not a matrix (rank < 2)."""
    if len(spec.shape) < 2:
        return None
    return math.prod(spec.shape[:-1]), spec.shape[-1]


def worth_factoring(shape: tuple[int, int] | None, rank: int) -> bool:
    if shape is None:
        return False
    rows, cols = shape
    return rank < min(rows, cols) and rank * (rows + cols) < rows * cols


def orthonormalise(p: np.ndarray) -> np.ndarray:
    return np.linalg.qr(p, mode="reduced")[0].astype(np.float32)


@register
class PowerSGD(Compressor):
    name = "powersgd"
    Params = PowerSGDParams

    def __init__(self, params, layout, seed=0):
        super().__init__(params, layout, seed)
        r = params.rank
        self.shapes = [matrix_shape(t) if worth_factoring(matrix_shape(t), r) else None for t in layout.tensors]
        self.q = [None if s is None else self.rng.standard_normal((s[1], r)).astype(np.float32) for s in self.shapes]

    def _compress(self, grads):
        return [self.factor(i, g) for i, g in enumerate(grads)]

    def factor(self, i: int, g: np.ndarray):
        shape = self.shapes[i]
        if shape is None:
            return DensePart(g)
        m = g.reshape(shape)
        p = orthonormalise(m @ self.q[i])
        q = (m.T @ p).astype(np.float32)
        self.q[i] = self.refreshed(q)
        return LowRankPart(p, q)

    def refreshed(self, q: np.ndarray) -> np.ndarray:
        """``q`` with every all-zero column redrawn (a copy when one is)."""
        dead = ~q.any(axis=0)
        if not dead.any():
            return q
        q = q.copy()
        q[:, dead] = self.rng.standard_normal((q.shape[0], int(dead.sum()))).astype(np.float32)
        return q
