"""Chen et al.'s AdaComp compressor: its own residual, bins and scale, default bin sizes."""

from __future__ import annotations

import numpy as np
import pytest

import compression
from compression.adaptive_residual import bin_maxima, default_bin_size
from compression.codec import decode, encode
from compression.layout import Layout, TensorSpec
from compression.parts import SparseSignPart

from compression_support import WIRE_IDS, WIRES, build, cnn_layout, random_grads, small_layout  # noqa: F401  (cnn_layout: a fixture)


@pytest.mark.parametrize("wire", WIRES, ids=WIRE_IDS)
def test_adaptive_residual_residual_plus_sent_is_input(wire):
    layout = small_layout()
    compressor = build("adaptive_residual", layout)
    total = [np.zeros(n, np.float64) for n in layout.sizes]
    sent = [np.zeros(n, np.float64) for n in layout.sizes]
    for step in range(10):
        grads = random_grads(layout, step)
        received = decode(encode(compressor.compress(grads), layout, wire), layout)
        for i, (g, part, size) in enumerate(zip(grads, received, layout.sizes)):
            total[i] += g
            sent[i] += part.dense(size)
            np.testing.assert_allclose(sent[i] + compressor.residual[i], total[i], rtol=0, atol=1e-4)
    assert any(np.abs(r).sum() > 0 for r in compressor.residual)


def test_adaptive_residual_bins_and_scale_by_hand():
    layout = Layout((TensorSpec("t", (6,)),))
    compressor = compression.build("adaptive_residual", {"bin_size": 3}, layout)
    g = np.array([1.0, -0.4, 0.3, 0.2, 0.25, -0.1], np.float32)
    # Step 1: G = g, H = 2g. Bin maxima of |G|: 1 and 0.25. Sent: |H| >= max -> entries 0
    # (2 >= 1), 3 (0.4 >= 0.25) and 4 (0.5 >= 0.25); entry 1 (0.8 < 1) and 5 (0.2) are not.
    (part,) = compressor.compress([g])
    assert isinstance(part, SparseSignPart)
    assert part.indices.tolist() == [0, 3, 4] and part.negative.tolist() == [False, False, False]
    assert part.scale == pytest.approx((1.0 + 0.2 + 0.25) / 3)
    expected_residual = g.copy()
    expected_residual[[0, 3, 4]] -= np.float32(part.scale)
    np.testing.assert_allclose(compressor.residual[0], expected_residual, rtol=0, atol=1e-7)


def test_adaptive_residual_default_bin_sizes_by_rank(cnn_layout):
    compressor = compression.build("adaptive_residual", {}, cnn_layout)
    assert compressor.bin_sizes == [50, 500, 50, 500, 500, 500, 500, 500]
    assert default_bin_size((3, 3, 1, 32)) == 50 and default_bin_size((3136, 128)) == 500
    assert compression.build("adaptive_residual", {"bin_size": 7}, cnn_layout).bin_sizes == [7] * 8


def test_bin_maxima():
    magnitude = np.array([1, 5, 2, 0, 3, 9, 4], np.float32)
    np.testing.assert_array_equal(bin_maxima(magnitude, 3), [5, 5, 5, 9, 9, 9, 4])
    np.testing.assert_array_equal(bin_maxima(magnitude, 10), [9] * 7)
    np.testing.assert_array_equal(bin_maxima(magnitude, 1), magnitude)


def test_adaptive_residual_zero_gradient_sends_nothing():
    layout = small_layout()
    parts = build("adaptive_residual", layout).compress([np.zeros(n, np.float32) for n in layout.sizes])
    assert all(p.entries == 0 for p in parts)
    decode(encode(parts, layout), layout)
