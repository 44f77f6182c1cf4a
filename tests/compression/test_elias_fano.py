"""Elias-Fano index coding: round trips, the block layout byte for byte, what a decoder refuses, size."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compression import elias_fano
from compression.topk import keep_count


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
