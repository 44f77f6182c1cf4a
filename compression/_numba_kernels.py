"""The numba loops behind :mod:`compression.compiled` (imported only by its ``enable()``).

Each mirrors a numpy function named in its docstring and must return the same numbers (the one
exception: ``apply_flat``'s sum of ``1 / divisor``, a traced figure, is summed in float64). None
checks its indices: they come from ``decode_flat`` or the server's change log, both checked.
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
    _ef_encode_into(x, 0, width, low_bytes, out)
    return out


@njit(cache=CACHE, nogil=True)
def _ef_encode_into(x, minus, width, low_bytes, out):
    """The block of ``x - minus`` into ``out`` (zeroed, exactly the block's size)."""
    k = x.size
    if width:
        mask = (1 << width) - 1
        acc = 0
        bits = 0
        pos = 0
        for j in range(k):
            acc = (acc << width) | ((x[j] - minus) & mask)
            bits += width
            while bits >= 8:
                bits -= 8
                out[pos] = (acc >> bits) & 0xFF
                pos += 1
            acc &= (1 << bits) - 1
        if bits:
            out[pos] = (acc << (8 - bits)) & 0xFF
    for i in range(k):
        p = ((x[i] - minus) >> width) + i
        out[low_bytes + (p >> 3)] |= 0x80 >> (p & 7)


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


@njit(cache=CACHE, nogil=True)
def _ef_sizes(n, k):
    """:func:`compression.elias_fano._sizes`: (low width, low bytes, upper bytes)."""
    if k <= 0:
        return 0, 0, 0
    width = 0
    if n > k:
        q = n // k
        while q > 1:
            q >>= 1
            width += 1
    return width, (k * width + 7) // 8, (k + (n >> width) + 1 + 7) // 8


@njit(cache=CACHE, nogil=True)
def _u32(buf, pos):
    return np.int64(buf[pos]) | (np.int64(buf[pos + 1]) << 8) | (np.int64(buf[pos + 2]) << 16) | (np.int64(buf[pos + 3]) << 24)


@njit(cache=CACHE, nogil=True)
def _put_u32(buf, pos, value):
    for b in range(4):
        buf[pos + b] = (value >> (8 * b)) & 0xFF


@njit(cache=CACHE, nogil=True)
def _not_taken():
    return False, np.empty(0, np.int64), np.empty(0, np.float32)


@njit(cache=CACHE, nogil=True)
def decode_flat(msg, offsets, sizes):
    """:func:`compression.codec.decode` of a message whose parts are all dense (kind 1) or sparse
    (kind 2) float32 parts with Elias-Fano indices (flags 0) and that updates at most a quarter
    of the model, as one ascending flat index array and its values: ``(True, indices, values)``.
    ``(False, ...)`` for any other message, valid or not: the caller decodes it with the numpy
    codec, which takes it or says why not (and applies a dense update by slices, not indices)."""
    m = msg.size
    if m < 3 or msg[0] != 1 or (np.int64(msg[1]) | (np.int64(msg[2]) << 8)) != sizes.size:
        return _not_taken()
    pos = 3
    total = 0
    for t in range(sizes.size):  # framing and lengths first: nothing is allocated for a bad message
        if pos + 6 > m:
            return _not_taken()
        kind = msg[pos]
        length = _u32(msg, pos + 2)
        if msg[pos + 1] != 0:
            return _not_taken()
        pos += 6
        if pos + length > m:
            return _not_taken()
        n = sizes[t]
        if kind == 1:
            if length != 4 * n:
                return _not_taken()
            total += n
        elif kind == 2:
            if length < 4:
                return _not_taken()
            k = _u32(msg, pos)
            if k > n:
                return _not_taken()
            width, low_bytes, upper_bytes = _ef_sizes(n, k)
            if length != 4 + low_bytes + upper_bytes + 4 * k:
                return _not_taken()
            total += k
        else:
            return _not_taken()
        pos += length
    if pos != m or 4 * total > offsets[-1] + sizes[-1]:  # past a quarter of the model, slices beat flat indices
        return _not_taken()
    indices = np.empty(total, np.int64)
    values = np.empty(total, np.float32)
    value_bytes = values.view(np.uint8)
    pos = 3
    j = 0
    for t in range(sizes.size):
        kind = msg[pos]
        length = _u32(msg, pos + 2)
        pos += 6
        n = sizes[t]
        offset = offsets[t]
        if kind == 1:
            for i in range(n):
                indices[j + i] = offset + i
            value_bytes[4 * j : 4 * (j + n)] = msg[pos : pos + 4 * n]
            j += n
        else:
            k = _u32(msg, pos)
            if k:
                width, low_bytes, upper_bytes = _ef_sizes(n, k)
                block_end = pos + 4 + low_bytes + upper_bytes
                out = indices[j : j + k]
                if not ef_decode(msg[pos + 4 : block_end], width, low_bytes, k, n, out):
                    return _not_taken()
                for i in range(k):
                    out[i] += offset
                value_bytes[4 * j : 4 * (j + k)] = msg[block_end : block_end + 4 * k]
                j += k
        pos += length
    for i in range(total):
        if not np.isfinite(values[i]):
            return _not_taken()
    return True, indices, values


@njit(cache=CACHE, nogil=True)
def apply_flat(params, indices, values, rate, adaptive, touches, at_pull):
    """:meth:`emulator.runtime.rules.UpdateRule.apply` at flat ``indices``: ``params[i] -= rate * g_i``,
    divided by ``max(1, sigma_i)`` when ``adaptive`` (AdaComp: ``sigma_i = touches[i] - at_pull[i]``
    modulo 2**32, and ``touches[i] += 1`` once written). All or nothing: returns
    ``(False, 0, 0)`` and writes nothing when a new value would not be finite; else
    ``(True, sum of 1 / divisor, sum of sigma)`` (zeros unless ``adaptive``). ``rate`` is
    float32: numpy multiplies a float32 array by a Python float in float32."""
    k = indices.size
    new = np.empty(k, np.float32)
    inverse_sum = 0.0
    sigma_sum = 0
    for j in range(k):
        i = indices[j]
        step = rate * values[j]
        if adaptive:
            sigma = (np.int64(touches[i]) - np.int64(at_pull[i])) & 0xFFFFFFFF
            divisor = np.float32(max(sigma, 1))
            step = step / divisor
            inverse_sum += np.float32(1.0) / divisor
            sigma_sum += sigma
        value = params[i] - step
        if not np.isfinite(value):
            return False, 0.0, 0
        new[j] = value
    for j in range(k):
        params[indices[j]] = new[j]
        if adaptive:
            touches[indices[j]] += np.uint32(1)
    return True, inverse_sum, sigma_sum


@njit(cache=CACHE, nogil=True)
def copy_at(target, source, indices):
    """``target[indices] = source[indices]``."""
    for j in range(indices.size):
        target[indices[j]] = source[indices[j]]


@njit(cache=CACHE, nogil=True)
def _delta_plan(changed, offsets, sizes):
    """Per tensor, where its coordinates start in ``changed`` and whether its part is sparse (as
    :func:`compression.delta.select` decides for float32 values); and the message's bytes."""
    starts = np.empty(sizes.size + 1, np.int64)
    sparse = np.empty(sizes.size, np.bool_)
    size = 3
    p = 0
    for t in range(sizes.size):
        starts[t] = p
        end = offsets[t] + sizes[t]
        while p < changed.size and changed[p] < end:
            p += 1
        k = p - starts[t]
        width, low_bytes, upper_bytes = _ef_sizes(sizes[t], k)
        sparse_bytes = 4 + low_bytes + upper_bytes + 4 * k
        sparse[t] = sparse_bytes < 4 * sizes[t]
        size += 6 + (sparse_bytes if sparse[t] else 4 * sizes[t])
    starts[sizes.size] = p
    return starts, sparse, size


@njit(cache=CACHE, nogil=True)
def delta_take(changed, params, offsets, sizes):
    """Under the server's lock: the float32 delta's message bytes and the model's values it
    carries, in message order (a sparse tensor's at its changed coordinates, a whole one's all)."""
    starts, sparse, size = _delta_plan(changed, offsets, sizes)
    count = 0
    for t in range(sizes.size):
        count += starts[t + 1] - starts[t] if sparse[t] else sizes[t]
    values = np.empty(count, np.float32)
    j = 0
    for t in range(sizes.size):
        if sparse[t]:
            for p in range(starts[t], starts[t + 1]):
                values[j] = params[changed[p]]
                j += 1
        else:
            values[j : j + sizes[t]] = params[offsets[t] : offsets[t] + sizes[t]]
            j += sizes[t]
    return size, values


@njit(cache=CACHE, nogil=True)
def delta_encode(changed, values, offsets, sizes, base):
    """Outside the lock: the MODEL body of a float32 delta, the u64 ``base`` version then the
    codec message :func:`compression.delta.message` writes for the same selection, byte for byte."""
    starts, sparse, size = _delta_plan(changed, offsets, sizes)
    out = np.zeros(8 + size, np.uint8)
    for b in range(8):
        out[b] = (base >> np.uint64(8 * b)) & np.uint64(0xFF)
    out[8] = 1
    out[9] = sizes.size & 0xFF
    out[10] = sizes.size >> 8
    value_bytes = values.view(np.uint8)
    pos = 11
    j = 0
    for t in range(sizes.size):
        n = sizes[t]
        if sparse[t]:
            k = starts[t + 1] - starts[t]
            width, low_bytes, upper_bytes = _ef_sizes(n, k)
            length = 4 + low_bytes + upper_bytes + 4 * k
            out[pos] = 2
            _put_u32(out, pos + 2, length)
            _put_u32(out, pos + 6, k)
            block = out[pos + 10 : pos + 10 + low_bytes + upper_bytes]
            if k:
                _ef_encode_into(changed[starts[t] : starts[t + 1]], offsets[t], width, low_bytes, block)
            end = pos + 10 + low_bytes + upper_bytes
            out[end : end + 4 * k] = value_bytes[4 * j : 4 * (j + k)]
            j += k
        else:
            length = 4 * n
            out[pos] = 1
            _put_u32(out, pos + 2, length)
            out[pos + 6 : pos + 6 + length] = value_bytes[4 * j : 4 * (j + n)]
            j += n
        pos += 6 + length
    return out


def warm_up() -> None:
    """Compile every kernel (or load it from the cache) now, not on the first update."""
    x = np.array([1, 5, 9, 40], np.int64)
    block = ef_encode(x, 3, 2, 2)
    ef_decode(block, 3, 2, 4, 64, np.empty(4, np.int64))
    ef_decode(np.frombuffer(block.tobytes(), np.uint8), 3, 2, 4, 64, np.empty(4, np.int64))
    sorted_union(np.array([3, 1], np.int32), np.zeros(1, np.uint64), np.empty(2, np.int64))
    offsets, sizes = np.array([0, 64], np.int64), np.array([64, 8], np.int64)
    params = np.zeros(72, np.float32)
    changed = np.array([1, 5, 9, 40, 64, 65], np.int64)
    _, values = delta_take(changed, params, offsets, sizes)
    body = delta_encode(changed, values, offsets, sizes, np.uint64(7))
    ok, indices, values = decode_flat(body[8:], offsets, sizes)
    decode_flat(np.frombuffer(body[8:].tobytes(), np.uint8), offsets, sizes)
    touches = np.zeros(72, np.uint32)
    apply_flat(params, indices, values, np.float32(0.1), True, touches, touches.copy())
    copy_at(touches, touches.copy(), indices)
