"""Gradient compressors behind one small interface, and the wire codec the server decodes.

``build(name, params, layout)`` makes a compressor from config; ``codec.encode``/``decode``
turn its parts into bytes and back. See ``base.py`` for the contract (a gradient with NaN or
Inf raises :class:`NonFiniteGradient`, never a trimmed selection). Registered compressors:
``dense``, ``topk`` (Hardy et al.), ``randomk``, ``threshold``, ``dgc``, ``qsgd``, ``terngrad``,
``signsgd``, ``fp16``, ``powersgd`` and ``adaptive_residual`` (Chen et al.'s AdaComp), one
module each; ``ErrorFeedback`` wraps any of them that does not keep its own residual.
"""

from compression import (  # noqa: F401  (importing a module registers its compressor)
    adaptive_residual, dense, dgc, fp16, powersgd, qsgd, randomk, signsgd, terngrad, threshold, topk,
)
from compression.base import COMPRESSORS, Compressor, NonFiniteGradient, Params, build, lookup, register
from compression.codec import CodecError, decode, decode_flat, encode
from compression.layout import Layout, TensorSpec
from compression.memory import ErrorFeedback
from compression.parts import (
    DensePart, HalfPart, LowRankPart, Part, QuantizedPart, SignPart, SparsePart, SparseSignPart, WireFormat,
)

__all__ = [
    "COMPRESSORS", "Compressor", "NonFiniteGradient", "Params", "build", "lookup", "register", "CodecError", "decode", "decode_flat", "encode",
    "Layout", "TensorSpec", "ErrorFeedback", "DensePart", "HalfPart", "LowRankPart", "Part", "QuantizedPart",
    "SignPart", "SparsePart", "SparseSignPart", "WireFormat",
]
