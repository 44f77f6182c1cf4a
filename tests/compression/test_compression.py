"""Compression: Elias-Fano, per-tensor top-k, the wire codec, error feedback, the registry.

Fast and TensorFlow-free: the paper CNN's layout is pure numpy.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import compression
from compression import elias_fano
from compression.codec import CodecError, decode, encode
from compression.layout import Layout, TensorSpec
from compression.memory import ErrorFeedback
from compression.parts import (
    FLAG_F16_VALUES, FLAG_RAW32_INDICES, DensePart, PartError, SparsePart, WireFormat,
)
from compression.topk import TopK, keep_count, top_magnitude
from emulator.runtime.models import get as get_model

CNN_SIZES = (288, 32, 18432, 64, 401408, 128, 1280, 10)


@pytest.fixture(scope="module")
def cnn_layout() -> Layout:
    return get_model("mnist_cnn").layout((28, 28, 1), 10)


def small_layout() -> Layout:
    return Layout((TensorSpec("a/kernel", (3, 4)), TensorSpec("a/bias", (5,)), TensorSpec("b/kernel", (40,))))


def random_grads(layout: Layout, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=n).astype(np.float32) for n in layout.sizes]


# ---------------------------------------------------------------------------------------
# Elias-Fano


@st.composite
def index_sets(draw):
    n = draw(st.integers(1, 5000))
    k = draw(st.sampled_from([0, 1, n, min(n, 2), min(n, 3)]) | st.integers(0, n))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return n, np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index_sets())
def test_elias_fano_round_trip(case):
    n, x = case
    block = elias_fano.encode(x, n)
    assert len(block) == elias_fano.encoded_size(n, x.size)
    out = elias_fano.decode(block, n, x.size)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, x)


@pytest.mark.parametrize(
    "n,x",
    [
        (1, []), (1, [0]), (2, [1]), (2, [0, 1]), (7, list(range(7))), (8, [7]), (1 << 20, [0, (1 << 20) - 1]),
        (1000, [999]), (1000, [0]), (401408, list(range(0, 401408, 100))),
    ],
)
def test_elias_fano_edges(n, x):
    x = np.array(x, np.int64)
    block = elias_fano.encode(x, n)
    assert len(block) == elias_fano.encoded_size(n, x.size)
    np.testing.assert_array_equal(elias_fano.decode(block, n, x.size), x)


@pytest.mark.parametrize("n", [1, 64, 401408])
def test_elias_fano_empty_set_is_an_empty_block(n):
    # Its upper vector would be n + 1 zero bits: 50,177 bytes for the paper's 3136x128 kernel.
    assert elias_fano.encoded_size(n, 0) == 0
    assert elias_fano.encode(np.zeros(0, np.int64), n) == b""
    assert elias_fano.decode(b"", n, 0).size == 0
    with pytest.raises(elias_fano.EliasFanoError):
        elias_fano.decode(b"\0", n, 0)


def test_an_empty_or_tiny_part_costs_a_few_bytes(cnn_layout):
    """A message that selects nothing from the big kernel (what an all-NaN kernel once gave: 202
    entries in 51,329 bytes) is a few bytes more than the other tensors' entries."""
    grads = random_grads(cnn_layout, 3)
    parts = compression.build("topk", {"c": 0.01}, cnn_layout).compress(grads)
    kernel = cnn_layout.sizes.index(401408)
    empty = SparsePart(np.zeros(0, np.int64), np.zeros(0, np.float32))
    without = encode([empty if i == kernel else p for i, p in enumerate(parts)], cnn_layout)
    others = sum(len(p.write(n, 0)) for i, (p, n) in enumerate(zip(parts, cnn_layout.sizes)) if i != kernel)
    assert sum(p.entries for i, p in enumerate(parts) if i != kernel) == 202
    assert len(without) == 3 + 6 * len(cnn_layout) + others + 4  # the empty part: its count only
    assert len(without) < 2000
    assert decode(without, cnn_layout)[kernel].entries == 0
    one = SparsePart(np.array([401407], np.int64), np.array([1.5], np.float32))
    assert len(one.write(401408, 0)) <= 12  # count, value and about 22 bits of index
    assert len(one.write(401408, FLAG_RAW32_INDICES)) == 12


def test_elias_fano_accepts_memoryview():
    x = np.array([3, 17, 90], np.int64)
    block = elias_fano.encode(x, 100)
    np.testing.assert_array_equal(elias_fano.decode(memoryview(block), 100, 3), x)


def test_elias_fano_rejects_wrong_length():
    block = elias_fano.encode(np.array([1, 5, 9]), 64)
    with pytest.raises(elias_fano.EliasFanoError):
        elias_fano.decode(block[:-1], 64, 3)
    with pytest.raises(elias_fano.EliasFanoError):
        elias_fano.decode(block + b"\0", 64, 3)


def test_elias_fano_rejects_wrong_popcount():
    n, x = 64, np.array([1, 5, 9])
    block = elias_fano.encode(x, n)
    # Decoding the right bytes with another k: length may agree, the set bits cannot.
    for k in (2, 4):
        if elias_fano.encoded_size(n, k) == len(block):
            with pytest.raises(elias_fano.EliasFanoError, match="upper bits"):
                elias_fano.decode(block, n, k)
    # Flip one more bit on in the upper vector.
    width, low_bytes, _ = elias_fano._sizes(n, 3)
    upper = np.unpackbits(np.frombuffer(block[low_bytes:], np.uint8))
    upper[np.flatnonzero(upper == 0)[0]] = 1
    bad = block[:low_bytes] + np.packbits(upper).tobytes()
    with pytest.raises(elias_fano.EliasFanoError, match="upper bits"):
        elias_fano.decode(bad, n, 3)
    # And with every bit off.
    with pytest.raises(elias_fano.EliasFanoError, match="upper bits"):
        elias_fano.decode(bytes(len(block)), n, 3)


def _craft(n: int, values: list[int]) -> bytes:
    """A block laid out as the format says, for any (even invalid) non-decreasing-high values."""
    k = len(values)
    width, low_bytes, upper_bytes = elias_fano._sizes(n, k)
    low_bits = []
    for v in values:
        low_bits += [(v >> s) & 1 for s in range(width - 1, -1, -1)]
    low = np.packbits(np.array(low_bits, np.uint8)).tobytes() if width else b""
    low = low.ljust(low_bytes, b"\0")
    upper = np.zeros(upper_bytes * 8, np.uint8)
    for i, v in enumerate(values):
        upper[(v >> width) + i] = 1
    return low + np.packbits(upper).tobytes()


def test_crafted_block_matches_encoder():
    n, values = 1000, [3, 70, 71, 500, 999]
    assert _craft(n, values) == elias_fano.encode(np.array(values), n)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index_sets())
def test_every_encoder_route_writes_the_documented_layout(case):
    # Small sets are built in Python integers, large ones in 64-bit groups of low parts or, for
    # widths whose group exceeds 64 bits, bit by bit: all must give the block the format defines.
    n, x = case
    assert elias_fano.encode(x, n) == _craft(n, x.tolist())


@pytest.mark.parametrize("width", range(0, 19))
def test_each_low_width_on_the_vectorised_route(width):
    k = elias_fano.SMALL + 13
    n = k << width
    assert elias_fano.low_bits(n, k) == width
    x = np.sort(np.random.default_rng(width).choice(n, size=k, replace=False))
    assert elias_fano.encode(x, n) == _craft(n, x.tolist())


@pytest.mark.parametrize("n,values", [(1000, [3, 70, 70, 500]), (1000, [3, 71, 70, 500]), (16, [5, 5]), (3, [1, 1])])
def test_elias_fano_rejects_repeats_and_disorder(n, values):
    with pytest.raises(elias_fano.EliasFanoError, match="strictly increasing"):
        elias_fano.decode(_craft(n, values), n, len(values))


def test_elias_fano_rejects_values_out_of_range():
    n, k = 1000, 4
    width, low_bytes, upper_bytes = elias_fano._sizes(n, k)
    # The highest bit position the upper vector can hold (padding included) decodes >= n.
    upper = np.zeros(upper_bytes * 8, np.uint8)
    upper[[0, 1, 2, upper.size - 1]] = 1
    block = bytes(low_bytes) + np.packbits(upper).tobytes()
    with pytest.raises(elias_fano.EliasFanoError, match="strictly increasing"):
        elias_fano.decode(block, n, k)
    # Through the low bits: high part of n-1 with all low bits set, n not a power of two.
    top = (n - 1) >> width
    bad_value = (top << width) | ((1 << width) - 1)
    assert bad_value >= n
    with pytest.raises(elias_fano.EliasFanoError):
        elias_fano.decode(_craft(n, [0, 1, 2, bad_value]), n, k)


def test_elias_fano_bits_per_index_near_information_floor():
    n, k = 401408, keep_count(401408, 0.01)
    assert k == 4014
    rng = np.random.default_rng(1)
    x = np.sort(rng.choice(n, k, replace=False))
    block = elias_fano.encode(x, n)
    bits_per_index = 8 * len(block) / k
    floor = (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)) / math.log(2) / k
    ratio = bits_per_index / floor
    print(f"Elias-Fano n={n} k={k}: {bits_per_index:.3f} bits/index, floor {floor:.3f}, ratio {ratio:.4f}")
    assert ratio < 1.3
    assert ratio > 1.0


# ---------------------------------------------------------------------------------------
# top-k


def test_keep_counts_on_the_paper_cnn(cnn_layout):
    assert cnn_layout.sizes == CNN_SIZES
    assert cnn_layout.total == 421642
    compressor = compression.build("topk", {"c": 0.01}, cnn_layout)
    assert compressor.keep == [2, 1, 184, 1, 4014, 1, 12, 1]
    assert [keep_count(n, 0.01) for n in CNN_SIZES] == [2, 1, 184, 1, 4014, 1, 12, 1]


@settings(deadline=None)
@given(st.integers(1, 10**6), st.floats(1e-6, 1.0))
def test_keep_count_rule(n, c):
    k = keep_count(n, c)
    assert k == max(1, min(n, math.floor(c * n)))
    assert 1 <= k <= n


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3000), st.floats(1e-4, 1.0), st.integers(0, 2**32 - 1))
def test_top_magnitude_selects_largest(n, c, seed):
    rng = np.random.default_rng(seed)
    g = rng.normal(size=n).astype(np.float32)  # continuous: no ties
    k = keep_count(n, c)
    idx = top_magnitude(g, k)
    assert idx.dtype == np.int64
    assert idx.size == k
    assert np.all(np.diff(idx) > 0)
    expected = np.sort(np.argsort(-np.abs(g), kind="stable")[:k])
    np.testing.assert_array_equal(idx, expected)


def test_top_magnitude_with_ties_keeps_the_first_of_equal_magnitudes():
    g = np.array([1, -3, 3, 0, -3, 2], np.float32)
    assert top_magnitude(g, 2).tolist() == [1, 2]
    assert top_magnitude(g, 4).tolist() == [1, 2, 4, 5]


@pytest.mark.parametrize("size", [20_000, 401_408])
def test_top_magnitude_with_many_ties_on_the_sampled_path(size):
    # Dead ReLU units give exact zeros in a real gradient (29 % of the CNN's dense kernel), and
    # quantised gradients repeat values: the k-th magnitude is shared by many entries.
    rng = np.random.default_rng(size)
    values = rng.choice(np.array([0, 0, 0, 0.5, -0.5, 1, -1, 2], np.float32), size)
    for k in (1, size // 100, size // 3):
        expected = np.sort(np.argsort(-np.abs(values), kind="stable")[:k])
        assert np.array_equal(top_magnitude(values, k), expected), k


def test_topk_compress_parts(cnn_layout):
    grads = random_grads(cnn_layout, 3)
    compressor = compression.build("topk", {"c": 0.01}, cnn_layout)
    parts = compressor.compress(grads)
    assert len(parts) == len(cnn_layout)
    for part, g, k, size, spec in zip(parts, grads, compressor.keep, cnn_layout.sizes, cnn_layout.tensors):
        assert isinstance(part, SparsePart)
        assert part.entries == k
        assert np.all(np.diff(part.indices) > 0)
        np.testing.assert_array_equal(part.values, g[part.indices])
        # The threshold: no dropped entry is larger than a kept one.
        dropped = np.delete(np.abs(g), part.indices)
        if dropped.size:
            assert np.abs(part.values).min() >= dropped.max()
        dense = part.dense(size)
        assert dense.shape == (size,) and dense.dtype == np.float32
        assert dense.reshape(spec.shape).shape == spec.shape
        np.testing.assert_array_equal(dense[part.indices], part.values)
        assert np.count_nonzero(dense) == k


def test_topk_c_one_keeps_everything():
    layout = small_layout()
    grads = random_grads(layout)
    parts = compression.build("topk", {"c": 1.0}, layout).compress(grads)
    for part, g, size in zip(parts, grads, layout.sizes):
        np.testing.assert_array_equal(part.dense(size), g)


# ---------------------------------------------------------------------------------------
# codec


def _assert_parts_equal(got, want, layout):
    assert len(got) == len(want)
    for a, b, size in zip(got, want, layout.sizes):
        assert type(a) is type(b)
        np.testing.assert_array_equal(a.dense(size), b.dense(size))
        if isinstance(a, SparsePart):
            np.testing.assert_array_equal(a.indices, b.indices)


def mixed_parts(layout: Layout, seed: int = 0):
    grads = random_grads(layout, seed)
    sparse = compression.build("topk", {"c": 0.3}, layout).compress(grads)
    return [DensePart(grads[0]), sparse[1], sparse[2]], grads


@pytest.mark.parametrize("indices", ["elias_fano", "raw32"])
def test_codec_round_trip_f32(indices):
    layout = small_layout()
    parts, _ = mixed_parts(layout)
    wire = WireFormat("f32", indices)
    message = encode(parts, layout, wire)
    out = decode(message, layout)
    _assert_parts_equal(out, parts, layout)
    assert decode(memoryview(message), layout) is not None
    # Exact bytes: header 3, per part 6 + body.
    bodies = [p.write(n, wire.flags) for p, n in zip(parts, layout.sizes)]
    assert len(message) == 3 + sum(6 + len(b) for b in bodies)


def test_codec_raw32_layout():
    layout = small_layout()
    parts, _ = mixed_parts(layout)
    body = parts[2].write(layout.sizes[2], FLAG_RAW32_INDICES)
    k = parts[2].entries
    assert len(body) == 4 + 4 * k + 4 * k
    assert int.from_bytes(body[:4], "little") == k
    np.testing.assert_array_equal(np.frombuffer(body[4 : 4 + 4 * k], "<u4"), parts[2].indices)


def test_codec_f16_values_round_like_numpy():
    layout = small_layout()
    rng = np.random.default_rng(5)
    grads = [(rng.normal(size=n) * 10.0 ** rng.integers(-8, 4, size=n)).astype(np.float32) for n in layout.sizes]
    grads[2][:3] = [1e6, -1e6, 65504.0]  # beyond float16's range: clipped to +-65504
    parts = [DensePart(grads[0]), DensePart(grads[1]), SparsePart(np.arange(40), grads[2])]
    out = decode(encode(parts, layout, WireFormat("f16")), layout)
    for got, g, size in zip(out, grads, layout.sizes):
        expected = np.clip(g, -65504, 65504).astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(got.dense(size), expected)
    # ErrorFeedback relies on rounded() predicting exactly what decode returns.
    for got, part, size in zip(out, parts, layout.sizes):
        np.testing.assert_array_equal(got.dense(size), part.rounded(FLAG_F16_VALUES).dense(size))


def test_codec_compresses_the_cnn(cnn_layout):
    grads = random_grads(cnn_layout, 7)
    dense = encode(compression.build("dense", {}, cnn_layout).compress(grads), cnn_layout)
    sparse = encode(compression.build("topk", {"c": 0.01}, cnn_layout).compress(grads), cnn_layout)
    assert len(dense) == 3 + 6 * 8 + 4 * 421642
    ratio = len(dense) / len(sparse)
    print(f"CNN message: dense {len(dense)} B, top-1% {len(sparse)} B, ratio {ratio:.1f}x")
    assert ratio > 70  # f32 values + Elias-Fano indices: about 12.5 bits per entry -> ~79x
    f16 = encode(compression.build("topk", {"c": 0.01}, cnn_layout).compress(grads), cnn_layout, WireFormat("f16"))
    assert len(dense) / len(f16) > 120  # 16-bit values: ~129x
    _assert_parts_equal(decode(sparse, cnn_layout), compression.build("topk", {"c": 0.01}, cnn_layout).compress(grads), cnn_layout)


def small_message(wire=WireFormat()) -> tuple[bytes, Layout]:
    layout = small_layout()
    parts, _ = mixed_parts(layout, 11)
    return encode(parts, layout, wire), layout


@pytest.mark.parametrize("wire", [WireFormat(), WireFormat("f16", "raw32")])
def test_codec_rejects_every_truncation(wire):
    message, layout = small_message(wire)
    decode(message, layout)
    for cut in range(len(message)):
        with pytest.raises(CodecError) as info:
            decode(message[:cut], layout)
        assert info.value.reason == "truncated", (cut, str(info.value))


def test_codec_rejects_trailing_bytes():
    message, layout = small_message()
    for extra in (b"\0", b"\x01\x02\x03", bytes(100)):
        with pytest.raises(CodecError) as info:
            decode(message + extra, layout)
        assert info.value.reason == "trailing"


def test_codec_rejects_wrong_part_count():
    message, layout = small_message()
    for count in (0, 2, 4, 65535):
        bad = message[:1] + struct.pack("<H", count) + message[3:]
        with pytest.raises(CodecError) as info:
            decode(bad, layout)
        assert info.value.reason == "bad_layout"
    with pytest.raises(ValueError):
        encode([DensePart(np.zeros(12, np.float32))], layout)


def test_codec_rejects_bad_format_version():
    message, layout = small_message()
    for version in (0, 2, 255):
        with pytest.raises(CodecError) as info:
            decode(bytes([version]) + message[1:], layout)
        assert info.value.reason == "bad_format"


def _part_offsets(message: bytes, layout: Layout) -> list[int]:
    pos, out = 3, []
    for _ in layout.sizes:
        out.append(pos)
        pos += 6 + struct.unpack_from("<I", message, pos + 2)[0]
    return out


def test_codec_rejects_unknown_kind():
    message, layout = small_message()
    for offset in _part_offsets(message, layout):
        for kind in (0, 3, 200):
            bad = bytearray(message)
            bad[offset] = kind
            with pytest.raises(CodecError) as info:
                decode(bytes(bad), layout)
            assert info.value.reason == "bad_kind"


def test_codec_rejects_unknown_flags():
    message, layout = small_message()
    offset = _part_offsets(message, layout)[0]
    bad = bytearray(message)
    bad[offset + 1] |= 0x80
    with pytest.raises(CodecError) as info:
        decode(bytes(bad), layout)
    assert info.value.reason == "bad_flags"


def test_codec_rejects_kind_body_mismatch():
    """A dense body under the sparse kind (and vice versa) is never applied."""
    message, layout = small_message()
    offsets = _part_offsets(message, layout)
    for offset, kind in ((offsets[0], 2), (offsets[1], 1)):
        bad = bytearray(message)
        bad[offset] = kind
        with pytest.raises(CodecError) as info:
            decode(bytes(bad), layout)
        assert info.value.reason == "bad_part"


@pytest.mark.parametrize("flags", [0, FLAG_RAW32_INDICES])
def test_codec_rejects_k_above_n(flags):
    layout = Layout((TensorSpec("t", (10,)),))
    body = (11).to_bytes(4, "little") + bytes(200)
    message = struct.pack("<BH", 1, 1) + struct.pack("<BBI", 2, flags, len(body)) + body
    with pytest.raises(CodecError) as info:
        decode(message, layout)
    assert info.value.reason == "bad_part"
    assert "11 entries" in str(info.value)


def test_codec_rejects_raw32_bad_indices():
    layout = Layout((TensorSpec("t", (10,)),))
    for indices in ([3, 3], [4, 2], [1, 10]):
        part = SparsePart(np.array(indices), np.ones(2, np.float32))
        message = encode([part], layout, WireFormat(indices="raw32"))
        with pytest.raises(CodecError) as info:
            decode(message, layout)
        assert info.value.reason == "bad_part"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("wire", [WireFormat(), WireFormat("f16")])
def test_codec_rejects_non_finite(bad, wire):
    layout = small_layout()
    parts, _ = mixed_parts(layout)
    for which in range(3):
        corrupted = list(parts)
        p = parts[which]
        values = p.values.copy()
        values[0] = bad
        corrupted[which] = DensePart(values) if isinstance(p, DensePart) else SparsePart(p.indices, values)
        message = encode(corrupted, layout, wire)
        if wire.values == "f16" and np.isinf(bad):
            decode(message, layout)  # clipped to the float16 range on the way out: finite
            continue
        with pytest.raises(CodecError) as info:
            decode(message, layout)
        assert info.value.reason == "non_finite"
        assert "non-finite" in str(info.value)


def test_codec_rejects_dense_size_mismatch():
    layout = small_layout()
    parts, _ = mixed_parts(layout)
    with pytest.raises(PartError):
        encode([DensePart(np.zeros(11, np.float32))] + parts[1:], layout)
    # On the wire: a dense body one value short, framed consistently.
    body = np.zeros(11, "<f4").tobytes()
    message = bytearray(encode(parts, layout))
    first = _part_offsets(bytes(message), layout)[0]
    old_len = struct.unpack_from("<I", message, first + 2)[0]
    message[first : first + 6 + old_len] = struct.pack("<BBI", 1, 0, len(body)) + body
    with pytest.raises(CodecError) as info:
        decode(bytes(message), layout)
    assert info.value.reason == "bad_part"


def test_codec_message_length_is_what_decode_consumes():
    """A message is self-delimiting: its parts' lengths add up to exactly the message."""
    layout = small_layout()
    for seed in range(5):
        parts, _ = mixed_parts(layout, seed)
        for wire in (WireFormat(), WireFormat("f16"), WireFormat("f32", "raw32")):
            message = encode(parts, layout, wire)
            offsets = _part_offsets(message, layout)
            last = offsets[-1]
            assert last + 6 + struct.unpack_from("<I", message, last + 2)[0] == len(message)
            decode(message, layout)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_codec_random_bytes_never_crash(blob):
    layout = small_layout()
    try:
        decode(blob, layout)
    except CodecError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 400))
def test_codec_bit_flips_never_crash(seed, position):
    message, layout = small_message()
    rng = np.random.default_rng(seed)
    bad = bytearray(message)
    pos = position % len(bad)
    bad[pos] ^= 1 << int(rng.integers(8))
    try:
        parts = decode(bytes(bad), layout)
    except CodecError:
        return
    for part, size in zip(parts, layout.sizes):  # if it decodes, it is applicable
        indices, values = part.coordinates(size)
        assert np.isfinite(values).all()
        if indices is not None:
            assert indices.size == values.size
            assert indices.size == 0 or (indices[0] >= 0 and indices[-1] < size and np.all(np.diff(indices) > 0))


# ---------------------------------------------------------------------------------------
# error feedback


@pytest.mark.parametrize("wire", [WireFormat(), WireFormat("f16"), WireFormat("f16", "raw32")])
def test_error_feedback_conserves_the_gradient(wire):
    layout = small_layout()
    ef = ErrorFeedback(compression.build("topk", {"c": 0.1}, layout), wire)
    assert ef.layout is layout
    rng = np.random.default_rng(2)
    total = [np.zeros(n, np.float64) for n in layout.sizes]
    sent = [np.zeros(n, np.float64) for n in layout.sizes]
    for step in range(20):
        grads = [(rng.normal(size=n) * 3).astype(np.float32) for n in layout.sizes]
        parts = ef.compress(grads)
        received = decode(encode(parts, layout, wire), layout)  # what the server applies
        for i, (g, part, size) in enumerate(zip(grads, received, layout.sizes)):
            total[i] += g
            sent[i] += part.dense(size)
            np.testing.assert_allclose(sent[i] + ef.residual[i], total[i], rtol=0, atol=1e-4)
    # The residual is not trivially zero: top-10% leaves most coordinates behind.
    assert any(np.abs(r).sum() > 0 for r in ef.residual)


def test_error_feedback_with_dense_has_no_residual():
    layout = small_layout()
    ef = ErrorFeedback(compression.build("dense", {}, layout))
    grads = random_grads(layout)
    parts = ef.compress(grads)
    for r in ef.residual:
        assert not r.any()
    for part, g in zip(parts, grads):
        np.testing.assert_array_equal(part.values, g)


# ---------------------------------------------------------------------------------------
# registry


def test_registry_builds_by_name():
    layout = small_layout()
    assert {"dense", "topk"} <= set(compression.COMPRESSORS)
    topk = compression.build("topk", {"c": 0.5}, layout, seed=3)
    assert isinstance(topk, TopK) and topk.params.c == 0.5
    assert topk.keep == [6, 2, 20]
    assert compression.build("topk", {}, layout).params.c == 0.01
    assert compression.build("dense", {}, layout).name == "dense"


def test_registry_unknown_name_lists_known():
    with pytest.raises(ValueError) as info:
        compression.build("nope", {}, small_layout())
    message = str(info.value)
    assert "nope" in message and "dense" in message and "topk" in message


@pytest.mark.parametrize("params", [{"c": 0}, {"c": -0.1}, {"c": 1.5}, {"c": "lots"}, {"k": 3}, {"c": 0.1, "extra": 1}])
def test_registry_rejects_bad_params(params):
    with pytest.raises(ValidationError):
        compression.build("topk", params, small_layout())


def test_dense_rejects_any_param():
    with pytest.raises(ValidationError):
        compression.build("dense", {"c": 0.1}, small_layout())


def test_params_are_frozen():
    params = compression.build("topk", {"c": 0.2}, small_layout()).params
    with pytest.raises(ValidationError):
        params.c = 0.3


def test_register_twice_refused():
    with pytest.raises(ValueError):
        compression.register(TopK)


def test_layout_json_round_trip(cnn_layout):
    assert Layout.from_json(cnn_layout.to_json()) == cnn_layout
    assert cnn_layout.offsets[:3] == (0, 288, 320)


def test_wire_format_refuses_unknown_names():
    assert WireFormat().flags == 0
    assert WireFormat("f16", "raw32").flags == FLAG_F16_VALUES | FLAG_RAW32_INDICES
    for bad in ({"values": "fp16"}, {"indices": "gamma"}):
        with pytest.raises(ValueError):
            WireFormat(**bad)


def test_top_magnitude_is_exact_when_the_sampled_threshold_misleads():
    # Every sampled position holds a huge value, so the sample's threshold keeps too few
    # candidates; the selection must fall back and still return the exact top-k.
    from compression.topk import SAMPLE, top_magnitude

    size = 64 * SAMPLE
    rng = np.random.default_rng(3)
    values = rng.random(size).astype(np.float32)
    values[:: size // SAMPLE] = 1e6
    k = 2 * SAMPLE + 17
    expected = np.sort(np.argsort(-np.abs(values), kind="stable")[:k])
    got = top_magnitude(values, k)
    assert got.dtype == np.int64 and np.array_equal(got, expected)


@pytest.mark.parametrize("seed", range(5))
def test_top_magnitude_sampled_path_matches_a_full_sort(seed):
    from compression.topk import top_magnitude

    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(401_408) * rng.exponential(1.0, 401_408)).astype(np.float32)
    for k in (1, 40, 4014, 40_000):
        expected = np.sort(np.argpartition(np.abs(values), values.size - k)[values.size - k :])
        assert np.array_equal(top_magnitude(values, k), expected)
