"""PowerSGD (Vogels et al.): low-rank error by rank, exactness at full rank, the warm start per worker."""

from __future__ import annotations

import numpy as np
import pytest

import compression
from compression.layout import Layout, TensorSpec
from compression.parts import LowRankPart

from compression_support import cnn_layout, random_grads  # noqa: F401  (cnn_layout: a fixture)


def _low_rank_error(m: np.ndarray, rank: int, steps: int) -> float:
    layout = Layout((TensorSpec("m", m.shape),))
    compressor = compression.build("powersgd", {"rank": rank}, layout, seed=7)
    for _ in range(steps):
        (part,) = compressor.compress([m.ravel()])
    return float(np.linalg.norm(part.dense(m.size) - m.ravel()) / np.linalg.norm(m))


def _matrix(rows: int, cols: int, singular_values) -> np.ndarray:
    rng = np.random.default_rng(3)
    u = np.linalg.qr(rng.normal(size=(rows, len(singular_values))))[0]
    v = np.linalg.qr(rng.normal(size=(cols, len(singular_values))))[0]
    return (u * np.asarray(singular_values)) @ v.T


def test_powersgd_error_does_not_increase_with_rank():
    m = _matrix(40, 30, [2.0 ** -i for i in range(12)]).astype(np.float32)
    errors = [_low_rank_error(m, r, steps=30) for r in range(1, 9)]
    assert all(b <= a * (1 + 1e-3) for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < errors[0] / 20
    # The warm-started power iteration reaches the best rank-r error (Eckart-Young).
    s = np.linalg.svd(m.astype(np.float64), compute_uv=False)
    assert errors[1] == pytest.approx(np.sqrt(np.sum(s[2:] ** 2)) / np.linalg.norm(s), rel=1e-2)


@pytest.mark.parametrize("rank", [3, 4, 6])
def test_powersgd_is_exact_when_rank_reaches_the_matrix_rank(rank):
    m = _matrix(40, 30, [3.0, 1.0, 0.5]).astype(np.float32)
    assert _low_rank_error(m, rank, steps=1) < 1e-5


def test_powersgd_keeps_q_per_worker_and_sends_small_tensors_dense(cnn_layout):
    compressor = compression.build("powersgd", {"rank": 2}, cnn_layout, seed=1)
    grads = random_grads(cnn_layout, 2, scale=0.01)
    parts = compressor.compress(grads)
    kinds = [type(p).__name__ for p in parts]
    # (3*3*1) x 32: 2 * (9 + 32) < 288, factored; biases (rank 1) dense.
    assert kinds == ["LowRankPart", "DensePart", "LowRankPart", "DensePart", "LowRankPart", "DensePart", "LowRankPart", "DensePart"]
    assert [p.p.shape for p in parts if isinstance(p, LowRankPart)] == [(9, 2), (288, 2), (3136, 2), (128, 2)]
    for i, part in enumerate(parts):
        if isinstance(part, LowRankPart):
            np.testing.assert_array_equal(compressor.q[i], part.q)  # the warm start for the next step
            np.testing.assert_allclose(part.p.T @ part.p, np.eye(2), atol=1e-5)
    tiny = compression.build("powersgd", {"rank": 2}, Layout((TensorSpec("k", (3, 2)),)))
    assert isinstance(tiny.compress([np.ones(6, np.float32)])[0], compression.DensePart)


def test_powersgd_zero_gradient_does_not_kill_the_warm_start():
    layout = Layout((TensorSpec("m", (20, 10)),))
    compressor = compression.build("powersgd", {"rank": 2}, layout)
    compressor.compress([np.zeros(200, np.float32)])
    assert np.all(np.any(compressor.q[0], axis=0))
    m = _matrix(20, 10, [1.0, 0.5]).astype(np.float32)
    (part,) = compressor.compress([m.ravel()])
    np.testing.assert_allclose(part.dense(200), m.ravel(), atol=1e-5)
