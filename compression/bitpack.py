"""Fixed-width bit packing of small unsigned codes, vectorised with numpy.

Quantised parts carry one code of ``width`` bits per entry (a sign bit, a ternary level, a
QSGD level). ``count`` codes take ``ceil(count * width / 8)`` bytes: the codes one after the
other, most significant bit first, the last byte padded with zero bits. :func:`unpack`
refuses a block of the wrong length or with a padding bit set, so a block has exactly one
reading.
"""

from __future__ import annotations

import numpy as np

MAX_WIDTH = 32


class BitPackError(ValueError):
    """The block is not ``count`` codes of ``width`` bits."""


def packed_size(count: int, width: int) -> int:
    """Bytes of ``count`` codes of ``width`` bits."""
    return (count * width + 7) // 8


def _container(width: int) -> tuple[np.dtype, int]:
    """The big-endian unsigned type that holds one code, and its width in bits."""
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"code width {width} outside 1..{MAX_WIDTH}")
    for dtype in (">u1", ">u2", ">u4"):
        bits = 8 * np.dtype(dtype).itemsize
        if width <= bits:
            return np.dtype(dtype), bits
    raise AssertionError("unreachable")


def pack(codes: np.ndarray, width: int) -> bytes:
    """``codes`` (each below ``2**width``) packed ``width`` bits apiece, MSB first."""
    dtype, bits = _container(width)
    codes = np.asarray(codes)
    if codes.size and (codes.min() < 0 or int(codes.max()) >> width):
        raise ValueError(f"a code does not fit in {width} bits")
    if 8 % width == 0:
        return _pack_whole_bytes(codes, width)
    as_bytes = codes.astype(dtype).reshape(-1, 1).view(np.uint8)  # (count, bytes per code)
    bit_matrix = np.unpackbits(as_bytes, axis=1)[:, bits - width :]
    return np.packbits(bit_matrix.ravel()).tobytes()


def _shifts(width: int) -> np.ndarray:
    """Left shifts of the codes that share one byte, first code in the high bits."""
    return np.arange(8 - width, -1, -width, dtype=np.uint8)


def _pack_whole_bytes(codes: np.ndarray, width: int) -> bytes:
    """Fast path for widths 1, 2, 4 and 8: whole codes per byte, no bit matrix."""
    per_byte = 8 // width
    padded = np.zeros(-(-codes.size // per_byte) * per_byte, np.uint8)
    padded[: codes.size] = codes
    grouped = padded.reshape(-1, per_byte) << _shifts(width)
    return np.bitwise_or.reduce(grouped, axis=1).astype(np.uint8).tobytes()


def _unpack_whole_bytes(raw: np.ndarray, count: int, width: int) -> np.ndarray:
    mask = np.uint8((1 << width) - 1)
    codes = ((raw[:, None] >> _shifts(width)) & mask).ravel()
    if codes[count:].any():
        raise BitPackError("padding bits are not zero")
    return codes[:count].astype(np.int64)


def unpack(block: bytes | memoryview, count: int, width: int) -> np.ndarray:
    """The ``count`` codes of a block made by :func:`pack`, as int64."""
    dtype, bits = _container(width)
    need = packed_size(count, width)
    if len(block) != need:
        raise BitPackError(f"{len(block)} bytes for {count} codes of {width} bits, expected {need}")
    raw = np.frombuffer(block, dtype=np.uint8)
    if 8 % width == 0:
        return _unpack_whole_bytes(raw, count, width)
    flat = np.unpackbits(raw)
    if flat[count * width :].any():
        raise BitPackError("padding bits are not zero")
    bit_matrix = np.zeros((count, bits), np.uint8)
    bit_matrix[:, bits - width :] = flat[: count * width].reshape(count, width)
    return np.packbits(bit_matrix, axis=1).view(dtype).ravel().astype(np.int64)
