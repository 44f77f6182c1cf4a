"""Random-k (unbiased when scaled, the values as they are otherwise) and the fixed threshold."""

from __future__ import annotations

import math

import numpy as np

import compression
from compression.codec import decode, encode
from compression.layout import Layout, TensorSpec

from compression_support import SIGMAS, DRAWS, build, mean_of_draws, random_grads, small_layout, unbiasedness_vector


def test_randomk_scaled_is_unbiased():
    g = unbiasedness_vector()
    c = 0.25
    n, k = g.size, 10
    mean = mean_of_draws("randomk", g, c=c, scale=True)
    standard_error = np.abs(g) * math.sqrt(n / k - 1) / math.sqrt(DRAWS)  # g * (n/k) * Bernoulli(k/n)
    assert np.all(np.abs(mean - g) <= SIGMAS * standard_error + 1e-6)


def test_randomk_unscaled_sends_values_as_they_are():
    layout = small_layout()
    grads = random_grads(layout)
    for part, g, size in zip(build("randomk", layout, c=0.2).compress(grads), grads, layout.sizes):
        assert part.entries == max(1, math.floor(0.2 * size))
        np.testing.assert_array_equal(part.values, g[part.indices])


def test_threshold_sends_exactly_the_entries_at_or_above_tau():
    tau = 0.5
    g = np.array([0.5, -0.5, 0.49999997, -0.7, 0.0, 2.0, -0.25, 0.5000001], np.float32)
    layout = Layout((TensorSpec("t", g.shape),))
    (part,) = compression.build("threshold", {"tau": tau}, layout).compress([g])
    assert part.indices.tolist() == [0, 1, 3, 5, 7]
    np.testing.assert_array_equal(part.values, g[[0, 1, 3, 5, 7]])
    (empty,) = compression.build("threshold", {"tau": 5.0}, layout).compress([g])
    assert empty.entries == 0
    assert decode(encode([empty], layout), layout)[0].entries == 0
