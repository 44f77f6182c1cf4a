"""Deep gradient compression (Lin et al.): its own residual, momentum correction, warm-up, clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest

import compression
from compression.codec import decode, encode
from compression.dgc import warmup_density
from compression.layout import Layout, TensorSpec

from compression_support import build, random_grads, small_layout


def test_dgc_residual_plus_sent_is_input_without_momentum():
    layout = small_layout()
    compressor = build("dgc", layout, momentum=0.0)
    total = [np.zeros(n, np.float64) for n in layout.sizes]
    sent = [np.zeros(n, np.float64) for n in layout.sizes]
    for step in range(10):
        grads = random_grads(layout, step)
        received = decode(encode(compressor.compress(grads), layout), layout)
        for i, (g, part, size) in enumerate(zip(grads, received, layout.sizes)):
            total[i] += g
            sent[i] += part.dense(size)
            np.testing.assert_allclose(sent[i] + compressor.residual[i], total[i], rtol=0, atol=1e-4)


def test_dgc_momentum_correction_by_hand():
    layout = Layout((TensorSpec("t", (4,)),))
    dgc = compression.build("dgc", {"c": 0.25, "momentum": 0.5}, layout)  # k = 1
    # Step 1: u = g1, v = g1 = [1, -2, 0.5, 0]; the top entry is -2 at 1; u[1] = v[1] = 0.
    (part,) = dgc.compress([np.array([1, -2, 0.5, 0], np.float32)])
    assert part.indices.tolist() == [1] and part.values.tolist() == [-2.0]
    np.testing.assert_array_equal(dgc.accumulated[0], [1, 0, 0.5, 0])
    np.testing.assert_array_equal(dgc.momentum[0], [1, 0, 0.5, 0])
    # Step 2: u = 0.5 * [1, 0, 0.5, 0] + [1, 1, -3, 0.25] = [1.5, 1, -2.75, 0.25];
    # v = [1, 0, 0.5, 0] + u = [2.5, 1, -2.25, 0.25]; the top entry is 2.5 at 0.
    (part,) = dgc.compress([np.array([1, 1, -3, 0.25], np.float32)])
    assert part.indices.tolist() == [0] and part.values.tolist() == [2.5]
    np.testing.assert_array_equal(dgc.accumulated[0], [0, 1, -2.25, 0.25])
    np.testing.assert_array_equal(dgc.momentum[0], [0, 1, -2.75, 0.25])


def test_dgc_warmup_density_falls_exponentially_to_the_target():
    c, steps = 0.001, 100
    assert warmup_density(0, c, steps) == 0.25
    assert warmup_density(steps, c, steps) == c and warmup_density(10 * steps, c, steps) == c
    assert warmup_density(steps // 2, c, steps) == pytest.approx(math.sqrt(0.25 * c))
    densities = [warmup_density(t, c, steps) for t in range(steps + 1)]
    assert all(a > b for a, b in zip(densities, densities[1:]))
    assert warmup_density(0, c, 0) == c and warmup_density(0, 0.5, 10) == 0.5
    layout = Layout((TensorSpec("t", (1000,)),))
    dgc = compression.build("dgc", {"c": 0.01, "warmup_steps": 4}, layout)
    counts = [dgc.compress([np.random.default_rng(t).normal(size=1000).astype(np.float32)])[0].entries for t in range(6)]
    assert counts == [250, 111, 50, 22, 10, 10]  # floor(1000 * 0.25 * (0.01 / 0.25) ** (t / 4)), then c


def test_dgc_clips_the_global_norm():
    layout = small_layout()
    grads = random_grads(layout, 4, scale=10.0)
    norm = math.sqrt(sum(float(np.dot(g, g)) for g in grads))
    dgc = build("dgc", layout, momentum=0.0, clip_norm=1.0, c=1.0)
    received = [p.dense(n) for p, n in zip(dgc.compress(grads), layout.sizes)]
    assert math.sqrt(sum(float(np.dot(r, r)) for r in received)) == pytest.approx(1.0, rel=1e-5)
    for r, g in zip(received, grads):
        np.testing.assert_allclose(r, g / norm, rtol=1e-5, atol=1e-7)
    small = build("dgc", layout, momentum=0.0, clip_norm=norm * 2, c=1.0)
    for part, g, size in zip(small.compress(grads), grads, layout.sizes):
        np.testing.assert_array_equal(part.dense(size), g)
