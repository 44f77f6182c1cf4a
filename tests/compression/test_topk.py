"""Top-k (Hardy et al.): keep counts per tensor, the exact top-magnitude selection, its parts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compression
from compression.parts import SparsePart
from compression.topk import keep_count, top_magnitude

from compression_support import CNN_SIZES, cnn_layout, flat_layout, random_grads  # noqa: F401  (cnn_layout: a fixture)


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
    layout = flat_layout()
    grads = random_grads(layout)
    parts = compression.build("topk", {"c": 1.0}, layout).compress(grads)
    for part, g, size in zip(parts, grads, layout.sizes):
        np.testing.assert_array_equal(part.dense(size), g)
