"""The numba loops behind :mod:`compression.compiled` (imported only by its ``enable()``).

Each mirrors a numpy function named in its docstring and must return the same numbers.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

CACHE = True  # numba's on-disk cache (NUMBA_CACHE_DIR, else __pycache__): compiled once per machine


@njit(cache=CACHE, nogil=True)
def ef_decode(block, width, low_bytes, k, n, out):
    """:func:`compression.elias_fano.decode` into ``out`` (int64, size ``k``); returns False
    where the block is not a valid encoding (the caller asks the numpy decoder for the reason)."""
    found = 0
    for byte_i in range(low_bytes, block.size):
        b = block[byte_i]
        if b == 0:
            continue
        base = (byte_i - low_bytes) * 8
        for bit in range(8):
            if b & (0x80 >> bit):
                if found >= k:
                    return False
                out[found] = (base + bit - found) << width
                found += 1
    if found != k:
        return False
    if width:
        mask = (1 << width) - 1
        acc = 0
        bits = 0
        pos = 0
        for j in range(k):
            while bits < width:
                acc = (acc << 8) | block[pos]
                pos += 1
                bits += 8
            bits -= width
            out[j] |= (acc >> bits) & mask
            acc &= (1 << bits) - 1
    if k:
        if out[k - 1] >= n:
            return False
        for j in range(1, k):
            if out[j] <= out[j - 1]:
                return False
    return True


@njit(cache=CACHE, nogil=True)
def ef_encode(x, width, low_bytes, upper_bytes):
    """:func:`compression.elias_fano.encode` of strictly increasing ``x``: the block's bytes."""
    out = np.zeros(low_bytes + upper_bytes, np.uint8)
    k = x.size
    if width:
        mask = (1 << width) - 1
        acc = 0
        bits = 0
        pos = 0
        for j in range(k):
            acc = (acc << width) | (x[j] & mask)
            bits += width
            while bits >= 8:
                bits -= 8
                out[pos] = (acc >> bits) & 0xFF
                pos += 1
            acc &= (1 << bits) - 1
        if bits:
            out[pos] = (acc << (8 - bits)) & 0xFF
    for i in range(k):
        p = (x[i] >> width) + i
        out[low_bytes + (p >> 3)] |= 0x80 >> (p & 7)
    return out


@njit(cache=CACHE, nogil=True)
def sorted_union(arrays_flat, words, out):
    """The sorted distinct values of ``arrays_flat`` (non-negative, below ``64 * words.size``)
    into ``out``; returns how many. ``words`` is a zeroed scratch bitmap, zeroed again on return.
    Mirrors :func:`emulator.runtime.downlink._union` of the same arrays."""
    for i in range(arrays_flat.size):
        v = arrays_flat[i]
        words[v >> 6] |= np.uint64(1) << np.uint64(v & 63)
    n = 0
    for w in range(words.size):
        x = words[w]
        if x:
            words[w] = 0
            while x:
                out[n] = w * 64 + trailing_zeros(x)
                n += 1
                x &= x - np.uint64(1)
    return n


def warm_up() -> None:
    """Compile every kernel (or load it from the cache) now, not on the first update."""
    x = np.array([1, 5, 9, 40], np.int64)
    block = ef_encode(x, 3, 2, 2)
    ef_decode(block, 3, 2, 4, 64, np.empty(4, np.int64))
    ef_decode(np.frombuffer(block.tobytes(), np.uint8), 3, 2, 4, 64, np.empty(4, np.int64))
    sorted_union(np.array([3, 1], np.int32), np.zeros(1, np.uint64), np.empty(2, np.int64))
