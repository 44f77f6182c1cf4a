"""The wire codec: message framing, the dense and sparse parts, what a decoder refuses; layout and wire format."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compression
from compression.codec import CodecError, decode, encode
from compression.layout import Layout, TensorSpec
from compression.parts import FLAG_F16_VALUES, FLAG_RAW32_INDICES, DensePart, PartError, SparsePart, WireFormat

from compression_support import assert_parts_equal, cnn_layout, flat_layout, random_grads  # noqa: F401  (cnn_layout: a fixture)


def mixed_parts(layout: Layout, seed: int = 0):
    grads = random_grads(layout, seed)
    sparse = compression.build("topk", {"c": 0.3}, layout).compress(grads)
    return [DensePart(grads[0]), sparse[1], sparse[2]], grads


@pytest.mark.parametrize("indices", ["elias_fano", "raw32"])
def test_codec_round_trip_f32(indices):
    layout = flat_layout()
    parts, _ = mixed_parts(layout)
    wire = WireFormat("f32", indices)
    message = encode(parts, layout, wire)
    out = decode(message, layout)
    assert_parts_equal(out, parts, layout)
    assert decode(memoryview(message), layout) is not None
    # Exact bytes: header 3, per part 6 + body.
    bodies = [p.write(n, wire.flags) for p, n in zip(parts, layout.sizes)]
    assert len(message) == 3 + sum(6 + len(b) for b in bodies)


def test_codec_raw32_layout():
    layout = flat_layout()
    parts, _ = mixed_parts(layout)
    body = parts[2].write(layout.sizes[2], FLAG_RAW32_INDICES)
    k = parts[2].entries
    assert len(body) == 4 + 4 * k + 4 * k
    assert int.from_bytes(body[:4], "little") == k
    np.testing.assert_array_equal(np.frombuffer(body[4 : 4 + 4 * k], "<u4"), parts[2].indices)


def test_codec_f16_values_round_like_numpy():
    layout = flat_layout()
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


def small_message(wire=WireFormat()) -> tuple[bytes, Layout]:
    layout = flat_layout()
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
    layout = flat_layout()
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
    layout = flat_layout()
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
    layout = flat_layout()
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
    layout = flat_layout()
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
# Layout and wire format


def test_layout_json_round_trip(cnn_layout):
    assert Layout.from_json(cnn_layout.to_json()) == cnn_layout
    assert cnn_layout.offsets[:3] == (0, 288, 320)


def test_wire_format_refuses_unknown_names():
    assert WireFormat().flags == 0
    assert WireFormat("f16", "raw32").flags == FLAG_F16_VALUES | FLAG_RAW32_INDICES
    for bad in ({"values": "fp16"}, {"indices": "gamma"}):
        with pytest.raises(ValueError):
            WireFormat(**bad)
