"""Chen et al.'s AdaComp (IBM, AAAI 2018): bin-local selection of gradient residues, sign-quantised.

Chen, Choi, Brand, Agrawal, Zhang and Gopalakrishnan, "AdaComp: Adaptive residual gradient
compression for data-parallel distributed training", AAAI 2018. Named ``adaptive_residual`` here
so it is not confused with Hardy et al.'s AdaComp (the ``adacomp`` method). Per tensor, each step:

1. residual accumulation ``G = R + g`` (``R`` starts at zero);
2. ``H = G + g``: the newest gradient counted once more, the paper's self-adjusting soft
   threshold (an entry whose fresh gradient is large is sent sooner);
3. the flat tensor is cut into consecutive bins of ``L_T`` entries (the last one may be short);
   in each bin, every entry with ``|H| >= max over the bin of |G|`` is sent, except entries
   with ``G == 0`` (nothing to send);
4. sent values are ``sign(G) * scale`` with one scale per tensor (layer);
5. ``R = G - sent``: what was not sent, and the quantisation error of what was, stays.

Choices where the description leaves room:
- ``scale`` is the mean ``|G|`` over the sent entries: ``G`` is what is being transferred
  (and what the residual accounts for), and the mean absolute value is the scale that
  minimises the squared error of a sign quantisation. ``H`` only selects: used as the value
  it would count the newest gradient twice (on the first step it doubles every sent value).
- ``L_T``: ``bin_size`` when given, else the paper's defaults by tensor rank: 50 for rank-4
  tensors (convolution kernels), 500 for every other tensor (dense kernels, biases).

Wire: a :class:`SparseSignPart`, Elias-Fano indices plus one sign bit per sent entry and one
float32 scale per tensor. The compressor keeps its own residual, so ``error_feedback: true`` is
refused.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from compression.base import Compressor, Params, register
from compression.parts import SparseSignPart, as_scale

CONV_BIN_SIZE = 50
FC_BIN_SIZE = 500


class AdaptiveResidualParams(Params):
    bin_size: int | None = Field(None, ge=1, description="L_T for every tensor (default: 50 for conv kernels, 500 otherwise)")


def default_bin_size(shape: tuple[int, ...]) -> int:
    return CONV_BIN_SIZE if len(shape) == 4 else FC_BIN_SIZE


def bin_maxima(magnitude: np.ndarray, bin_size: int) -> np.ndarray:
    """For every entry, the largest ``magnitude`` in its bin of ``bin_size`` consecutive entries."""
    n = magnitude.size
    bins = -(-n // bin_size)
    padded = np.zeros(bins * bin_size, magnitude.dtype)  # magnitudes are >= 0: padding never wins
    padded[:n] = magnitude
    return np.repeat(padded.reshape(bins, bin_size).max(axis=1), bin_size)[:n]


def select(accumulated: np.ndarray, gradient: np.ndarray, bin_size: int) -> np.ndarray:
    """Sorted indices of the entries to send: ``|G + g| >= bin max |G|`` and ``G != 0``."""
    magnitude = np.abs(accumulated)
    chosen = (np.abs(accumulated + gradient) >= bin_maxima(magnitude, bin_size)) & (magnitude > 0)
    return np.flatnonzero(chosen)


@register
class AdaptiveResidual(Compressor):
    name = "adaptive_residual"
    Params = AdaptiveResidualParams
    has_own_memory = True

    def __init__(self, params, layout, seed=0):
        super().__init__(params, layout, seed)
        self.bin_sizes = [params.bin_size or default_bin_size(t.shape) for t in layout.tensors]
        self.residual = [np.zeros(size, np.float32) for size in layout.sizes]

    def _compress(self, grads):
        parts = []
        for i, (g, bin_size) in enumerate(zip(grads, self.bin_sizes)):
            accumulated = self.residual[i] + g
            idx = select(accumulated, g, bin_size)
            sent = accumulated[idx]
            scale = as_scale(np.mean(np.abs(sent), dtype=np.float64)) if idx.size else 0.0
            negative = sent < 0
            accumulated[idx] -= np.where(negative, np.float32(-scale), np.float32(scale))
            self.residual[i] = accumulated
            parts.append(SparseSignPart(idx, scale, negative))
        return parts
