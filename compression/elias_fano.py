"""Elias-Fano coding of a strictly increasing set of indices, vectorised with numpy.

Why: a top-k update is mostly indices. Elias-Fano stores ``k`` indices drawn from
``[0, n)`` in ``k * (2 + floor(log2(n / k))) + small`` bits, within a few percent of the
information floor ``log2(n choose k)``, and encodes and decodes without a Python loop.

Layout of one block (``n`` and ``k`` travel elsewhere, ``L`` is derived from them):
the ``k`` low parts of ``L`` bits each, packed MSB first, then the upper bit vector of
``k + (n >> L) + 1`` bits where element ``i`` sets bit ``(x_i >> L) + i``.
"""

from __future__ import annotations

import numpy as np


class EliasFanoError(ValueError):
    """The block is not a valid encoding for the given ``n`` and ``k``."""


def low_bits(n: int, k: int) -> int:
    """Width of the low part: ``floor(log2(n / k))``, at least 0."""
    if k <= 0 or n <= k:
        return 0
    return (n // k).bit_length() - 1


def _sizes(n: int, k: int) -> tuple[int, int, int]:
    width = low_bits(n, k)
    low_bytes = (k * width + 7) // 8
    upper_bits = k + (n >> width) + 1
    return width, low_bytes, (upper_bits + 7) // 8


def encoded_size(n: int, k: int) -> int:
    """Bytes of the block for ``k`` indices out of ``n``."""
    _, low_bytes, upper_bytes = _sizes(n, k)
    return low_bytes + upper_bytes


def encode(indices: np.ndarray, n: int) -> bytes:
    """Encode strictly increasing ``indices`` (each in ``[0, n)``) as one block."""
    x = np.asarray(indices, dtype=np.int64)
    k = x.size
    width, low_bytes, upper_bytes = _sizes(n, k)
    if k == 0:
        return bytes(upper_bytes)
    if width:
        low = x & ((1 << width) - 1)
        shifts = np.arange(width - 1, -1, -1, dtype=np.int64)
        low_packed = np.packbits(((low[:, None] >> shifts) & 1).astype(np.uint8).ravel())
    else:
        low_packed = np.empty(0, np.uint8)
    upper = np.zeros(upper_bytes * 8, dtype=np.uint8)
    upper[(x >> width) + np.arange(k, dtype=np.int64)] = 1
    return low_packed.tobytes() + np.packbits(upper).tobytes()


def decode(block: bytes | memoryview, n: int, k: int) -> np.ndarray:
    """Decode one block back to ``k`` strictly increasing int64 indices below ``n``.

    Raises :class:`EliasFanoError` on any inconsistency (wrong length, wrong number of
    set bits, repeated or out-of-range index), so a malformed frame is never applied.
    """
    width, low_bytes, upper_bytes = _sizes(n, k)
    if len(block) != low_bytes + upper_bytes:
        raise EliasFanoError(f"block of {len(block)} bytes, expected {low_bytes + upper_bytes} for k={k}, n={n}")
    raw = np.frombuffer(block, dtype=np.uint8)
    positions = np.flatnonzero(np.unpackbits(raw[low_bytes:]))
    if positions.size != k:
        raise EliasFanoError(f"upper bits hold {positions.size} entries, expected {k}")
    if k == 0:
        return np.empty(0, np.int64)
    high = positions.astype(np.int64) - np.arange(k, dtype=np.int64)
    values = high << width
    if width:
        bits = np.unpackbits(raw[:low_bytes])[: k * width].reshape(k, width).astype(np.int64)
        values |= bits @ (np.int64(1) << np.arange(width - 1, -1, -1, dtype=np.int64))
    if values[-1] >= n or (k > 1 and np.any(np.diff(values) <= 0)):
        raise EliasFanoError("indices are not strictly increasing within [0, n)")
    return values
