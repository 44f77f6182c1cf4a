"""Message sizes on the paper's CNN, measured from the bytes; the formulas only as a sanity check."""

from __future__ import annotations

import math

import numpy as np
import pytest

import compression
from compression import elias_fano
from compression.codec import decode, encode
from compression.layout import TensorSpec
from compression.parts import FLAG_RAW32_INDICES, LowRankPart, SparsePart, WireFormat, level_bits

from compression_support import assert_parts_equal, cnn_layout, random_grads  # noqa: F401  (cnn_layout: a fixture)


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
    assert_parts_equal(decode(sparse, cnn_layout), compression.build("topk", {"c": 0.01}, cnn_layout).compress(grads), cnn_layout)


def _ef(n: int, k: int) -> int:
    return elias_fano.encoded_size(n, k)


def _expected_body(name: str, part, size: int, spec: TensorSpec) -> int:
    k = part.entries
    formulas = {
        "randomk": lambda: 4 + _ef(size, k) + 4 * k,
        "threshold": lambda: 4 + _ef(size, k) + 4 * k,
        "dgc": lambda: 4 + _ef(size, k) + 4 * k,
        "qsgd": lambda: 2 + 4 + math.ceil(size * level_bits(PARAMS_CNN["qsgd"]["s"]) / 8),
        "terngrad": lambda: 2 + 4 + math.ceil(size * 2 / 8),
        "signsgd": lambda: 4 + math.ceil(size / 8),
        "fp16": lambda: 2 * size,
        "powersgd": lambda: (12 + 4 * PARAMS_CNN["powersgd"]["rank"] * (math.prod(spec.shape[:-1]) + spec.shape[-1])
                             if isinstance(part, LowRankPart) else 4 * size),
        "adaptive_residual": lambda: 4 + 4 + _ef(size, k) + math.ceil(k / 8),
    }
    return formulas[name]()


PARAMS_CNN = {
    "randomk": {"c": 0.01}, "threshold": {"tau": 0.025}, "dgc": {"c": 0.001}, "qsgd": {"s": 7}, "terngrad": {},
    "signsgd": {}, "fp16": {}, "powersgd": {"rank": 2}, "adaptive_residual": {},
}


@pytest.mark.parametrize("name", list(PARAMS_CNN))
def test_encoded_size_on_the_paper_cnn(name, cnn_layout):
    grads = random_grads(cnn_layout, 7, scale=0.01)
    dense = len(encode(compression.build("dense", {}, cnn_layout).compress(grads), cnn_layout))
    compressor = compression.build(name, PARAMS_CNN[name], cnn_layout, seed=1)
    parts = compressor.compress(grads)
    message = encode(parts, cnn_layout)
    bound = 3 + sum(6 + _expected_body(name, p, n, spec) for p, n, spec in zip(parts, cnn_layout.sizes, cnn_layout.tensors))
    entries = sum(p.entries for p in parts)
    print(f"\n{name} {PARAMS_CNN[name]}: {len(message):,} B ({8 * len(message) / cnn_layout.total:.3f} bits per parameter, "
          f"{entries:,} entries), dense {dense:,} B, ratio {dense / len(message):.1f}x")
    assert len(message) <= bound
    assert len(message) < dense
    decode(message, cnn_layout)
