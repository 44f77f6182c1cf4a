"""Quantizers: QSGD and TernGrad unbiased on average, signSGD's signs and scale, fp16's precision."""

from __future__ import annotations

import math

import numpy as np
import pytest

import compression
from compression.codec import decode, encode
from compression.layout import Layout, TensorSpec
from compression.parts import HalfPart, QuantizedPart, SignPart

from compression_support import SIGMAS, DRAWS, WIRES, build, mean_of_draws, random_grads, small_layout, unbiasedness_vector


def test_qsgd_is_unbiased():
    g, s = unbiasedness_vector(), 2
    mean = mean_of_draws("qsgd", g, s=s)
    norm = np.linalg.norm(g.astype(np.float64))
    standard_error = norm / s / 2 / math.sqrt(DRAWS)  # each entry: (norm / s) * Bernoulli, variance <= (norm / s)^2 / 4
    assert np.all(np.abs(mean - g) <= SIGMAS * standard_error)
    assert mean[3] == 0 and mean[17] == 0


def test_terngrad_is_unbiased_and_ternary():
    g = unbiasedness_vector()
    mean = mean_of_draws("terngrad", g)
    scale = float(np.max(np.abs(g)))
    assert np.all(np.abs(mean - g) <= SIGMAS * scale / 2 / math.sqrt(DRAWS))
    part = compression.build("terngrad", {}, Layout((TensorSpec("t", g.shape),)), seed=3).compress([g])[0]
    assert isinstance(part, QuantizedPart) and part.levels == 1 and part.scale == scale
    assert set(np.unique(part.dense(g.size))) <= {-scale, 0.0, scale}
    assert part.dense(g.size)[5] == scale  # |g| = max: always sent


def test_signsgd_preserves_signs_with_mean_magnitude():
    layout = small_layout()
    grads = random_grads(layout, 9)
    grads[0][:5] = 0.0
    for part, g, size in zip(build("signsgd", layout).compress(grads), grads, layout.sizes):
        assert isinstance(part, SignPart)
        values = part.dense(size)
        nonzero = g != 0
        np.testing.assert_array_equal(np.sign(values[nonzero]), np.sign(g[nonzero]))
        assert part.scale == pytest.approx(float(np.mean(np.abs(g))), rel=1e-6)
        assert np.all(values[~nonzero] == part.scale)  # zero: +scale (one bit, two states)


def test_fp16_round_trip_within_half_precision():
    rng = np.random.default_rng(1)
    g = (rng.normal(size=500) * 10.0 ** rng.integers(-4, 4, size=500)).astype(np.float32)
    g[:3] = [1e6, -1e6, 0.0]
    layout = Layout((TensorSpec("t", g.shape),))
    (part,) = compression.build("fp16", {}, layout).compress([g])
    for wire in WIRES:
        (got,) = decode(encode([part], layout, wire), layout)
        values = got.dense(g.size)
        assert isinstance(got, HalfPart) and values.dtype == np.float32
        assert values[0] == 65504.0 and values[1] == -65504.0 and values[2] == 0.0
        normal = np.abs(g) >= 2.0 ** -14
        normal[:2] = False
        np.testing.assert_array_less(np.abs(values - g)[normal], np.abs(g)[normal] * 2.0 ** -11 * 1.0001)
        np.testing.assert_array_equal(values, np.clip(g, -65504, 65504).astype(np.float16).astype(np.float32))
