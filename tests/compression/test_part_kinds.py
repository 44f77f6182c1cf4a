"""The part kinds beyond dense and sparse on the wire: round trips, and malformed bytes of each refused."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from compression import bitpack
from compression.codec import CodecError, decode
from compression.layout import Layout, TensorSpec
from compression.parts import (
    FLAG_F16_VALUES, FLAG_RAW32_INDICES, HalfPart, LowRankPart, QuantizedPart, SignPart, SparseLevelsPart, SparseSignPart,
)


SMALL = Layout((TensorSpec("m", (6, 5)),))


def _part_message(part, layout: Layout = SMALL, flags: int = 0) -> bytes:
    body = part.write(layout.sizes[0], flags)
    return struct.pack("<BH", 1, 1) + struct.pack("<BBI", part.kind, flags, len(body)) + body


def _framed(kind: int, body: bytes, flags: int = 0) -> bytes:
    return struct.pack("<BH", 1, 1) + struct.pack("<BBI", kind, flags, len(body)) + body


def _sample_parts() -> dict[str, object]:
    rng = np.random.default_rng(4)
    n = SMALL.sizes[0]
    return {
        "half": HalfPart(rng.normal(size=n).astype(np.float16).astype(np.float32)),
        "quantized": QuantizedPart(3, 1.5, rng.integers(0, 7, size=n)),
        "ternary": QuantizedPart(1, 0.25, rng.integers(0, 3, size=n)),
        "sign": SignPart(0.5, rng.random(n) < 0.5),
        "sparse_sign": SparseSignPart(np.array([0, 4, 5, 17, 29]), 0.75, np.array([True, False, True, True, False])),
        "sparse_sign_empty": SparseSignPart(np.zeros(0, np.int64), 0.0, np.zeros(0, bool)),
        "sparse_levels": SparseLevelsPart(np.array([1, 2, 9, 28]), 127, 0.5, np.array([0, 127, 200, 254])),
        "sparse_levels_empty": SparseLevelsPart(np.zeros(0, np.int64), 127, 0.0, np.zeros(0, np.int64)),
        "low_rank": LowRankPart(rng.normal(size=(6, 2)).astype(np.float32), rng.normal(size=(5, 2)).astype(np.float32)),
    }


PART_NAMES = list(_sample_parts())


@pytest.mark.parametrize("flags", [0, FLAG_F16_VALUES | FLAG_RAW32_INDICES])
@pytest.mark.parametrize("which", PART_NAMES)
def test_new_kinds_round_trip(which, flags):
    part = _sample_parts()[which]
    (got,) = decode(_part_message(part, flags=flags), SMALL)
    assert type(got) is type(part)
    np.testing.assert_array_equal(got.dense(30), part.rounded(flags).dense(30))


@pytest.mark.parametrize("which", PART_NAMES)
def test_new_kinds_reject_every_truncation(which):
    part = _sample_parts()[which]
    for flags in (0, FLAG_F16_VALUES | FLAG_RAW32_INDICES):
        message = _part_message(part, flags=flags)
        body = message[9:]
        for cut in range(len(message)):
            with pytest.raises(CodecError) as info:
                decode(message[:cut], SMALL)
            assert info.value.reason == "truncated"
        for cut in range(len(body)):  # the body cut, framed consistently: the part itself must refuse it
            with pytest.raises(CodecError) as info:
                decode(_framed(part.kind, body[:cut], flags), SMALL)
            assert info.value.reason == "bad_part", (cut, str(info.value))
        with pytest.raises(CodecError) as info:
            decode(_framed(part.kind, body + b"\0", flags), SMALL)
        assert info.value.reason == "bad_part"


@pytest.mark.parametrize("which", PART_NAMES)
def test_new_kinds_reject_unknown_flags(which):
    message = bytearray(_part_message(_sample_parts()[which]))
    message[4] |= 0x40
    with pytest.raises(CodecError) as info:
        decode(bytes(message), SMALL)
    assert info.value.reason == "bad_flags"


def _reject(kind: int, body: bytes, reason: str = "bad_part", match: str | None = None, flags: int = 0):
    with pytest.raises(CodecError, match=match) as info:
        decode(_framed(kind, body, flags), SMALL)
    assert info.value.reason == reason, str(info.value)


def test_quantized_part_rejects_bad_levels_codes_and_scales():
    n = SMALL.sizes[0]
    codes = bitpack.pack(np.zeros(n, np.int64), 2)
    _reject(5, struct.pack("<Hf", 0, 1.0) + codes, match="levels")
    _reject(5, struct.pack("<Hf", 40000, 1.0) + bitpack.pack(np.zeros(n, np.int64), 17), match="levels")
    _reject(5, struct.pack("<Hf", 1, 1.0) + bitpack.pack(np.full(n, 3), 2), match="code 3 above 2")
    for bad in (float("nan"), float("inf"), -float("inf")):
        _reject(5, struct.pack("<Hf", 1, bad) + codes, reason="non_finite")
    _reject(5, struct.pack("<Hf", 1, -1.0) + codes, match="negative scale")
    # 30 codes of 2 bits: 60 bits, so the last byte has 4 padding bits that must be zero.
    padded = bytearray(codes)
    padded[-1] |= 0x01
    _reject(5, struct.pack("<Hf", 1, 1.0) + bytes(padded), match="padding")


def test_sign_part_rejects_bad_scale_and_padding():
    signs = bitpack.pack(np.zeros(30, bool), 1)
    _reject(6, struct.pack("<f", float("nan")) + signs, reason="non_finite")
    _reject(6, struct.pack("<f", -0.5) + signs, match="negative")
    _reject(6, struct.pack("<f", 0.5) + signs[:-1] + bytes([signs[-1] | 0x01]), match="padding")


def test_sparse_sign_part_rejects_counts_above_size_and_bad_indices():
    _reject(7, struct.pack("<If", 31, 1.0) + bytes(64), match="31 entries")
    _reject(7, struct.pack("<If", 2**32 - 1, 1.0) + bytes(64), match="entries")
    _reject(7, struct.pack("<If", 2, float("inf")) + bytes(16), reason="non_finite")
    raw = struct.pack("<If", 2, 1.0) + np.array([4, 4], "<u4").tobytes() + b"\0"
    _reject(7, raw, match="strictly increasing", flags=FLAG_RAW32_INDICES)
    raw = struct.pack("<If", 2, 1.0) + np.array([4, 30], "<u4").tobytes() + b"\0"
    _reject(7, raw, match="strictly increasing", flags=FLAG_RAW32_INDICES)


def test_low_rank_part_rejects_bad_shapes_and_values():
    def body(rows, cols, rank, values=None):
        count = (rows + cols) * rank
        data = np.ones(count, "<f4") if values is None else np.asarray(values, "<f4")
        return struct.pack("<III", rows, cols, rank) + data.tobytes()

    _reject(8, body(5, 5, 1), match="5 x 5")
    _reject(8, body(30, 2, 1)[:12], match="30 x 2")
    _reject(8, body(6, 5, 0), match="rank 0")
    _reject(8, body(6, 5, 6), match="rank 6")
    _reject(8, struct.pack("<III", 6, 5, 2**31) + bytes(8), match="rank")
    _reject(8, struct.pack("<III", 2**16, 2**16, 1) + bytes(8), match="65536 x 65536")
    nan = np.ones(22, np.float32)
    nan[13] = np.nan
    _reject(8, body(6, 5, 2, nan), reason="non_finite")
    huge = np.full(22, 1e20, np.float32)  # every factor finite, the product is not
    _reject(8, body(6, 5, 2, huge), reason="non_finite", match="overflow")


def test_half_part_rejects_non_finite():
    values = np.ones(30, "<f2")
    values[7] = np.inf
    _reject(4, values.tobytes(), reason="non_finite")
    _reject(4, np.ones(29, "<f2").tobytes(), match="60")


@pytest.mark.parametrize("which", PART_NAMES)
def test_new_kinds_single_bit_flips_never_crash(which):
    message = _part_message(_sample_parts()[which])
    for bit in range(8 * len(message)):
        bad = bytearray(message)
        bad[bit // 8] ^= 1 << (bit % 8)
        try:
            (part,) = decode(bytes(bad), SMALL)
        except CodecError:
            continue
        indices, values = part.coordinates(30)
        assert np.isfinite(values).all()
        assert (values.shape == (30,)) if indices is None else (indices.size == values.size and (indices.size == 0 or indices[-1] < 30))
