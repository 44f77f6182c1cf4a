"""Gradient compressors behind one small interface, and the wire codec the server decodes.

``build(name, params, layout)`` makes a compressor from config; ``codec.encode``/``decode``
turn its parts into bytes and back. See ``base.py`` for the contract.
"""

from . import dense, topk  # noqa: F401  (register the built-in compressors)
from .base import COMPRESSORS, Compressor, Params, build, register
from .codec import CodecError, decode, encode
from .layout import Layout, TensorSpec
from .memory import ErrorFeedback
from .parts import DensePart, Part, SparsePart, WireFormat

__all__ = [
    "COMPRESSORS", "Compressor", "Params", "build", "register", "CodecError", "decode", "encode",
    "Layout", "TensorSpec", "ErrorFeedback", "DensePart", "Part", "SparsePart", "WireFormat",
]
