"""What the compression suites share: layouts, gradients, each compressor's test parameters.

Not a conftest: ``tests/conftest.py`` is imported by name (``from conftest import ...``) and a
second module of that name here would shadow it. The suites import from this module instead.
"""

from __future__ import annotations

import numpy as np
import pytest

import compression
from compression.layout import Layout, TensorSpec
from compression.parts import SparsePart, WireFormat
from emulator.runtime.models import get as get_model

CNN_SIZES = (288, 32, 18432, 64, 401408, 128, 1280, 10)
REGISTRY = sorted(compression.COMPRESSORS)  # every registered compressor, the paper's and plug-ins alike
# Parameters that make every compressor send something on small_layout's N(0, 1) gradients; a
# compressor not named here is built with its defaults.
PARAMS = {
    "randomk": {"c": 0.2}, "threshold": {"tau": 1.0}, "dgc": {"c": 0.1}, "qsgd": {"s": 4}, "terngrad": {},
    "signsgd": {}, "fp16": {}, "powersgd": {"rank": 2}, "adaptive_residual": {"bin_size": 8}, "topk": {"c": 0.1},
}
WIRES = (WireFormat(), WireFormat("f16", "raw32"))
WIRE_IDS = ["f32-ef", "f16-raw32"]


@pytest.fixture(scope="module")
def cnn_layout() -> Layout:
    """The paper's CNN on MNIST, as a layout (numpy only, no TensorFlow)."""
    return get_model("mnist_cnn").layout((28, 28, 1), 10)


def flat_layout() -> Layout:
    """Three tensors of 12, 5 and 40 values."""
    return Layout((TensorSpec("a/kernel", (3, 4)), TensorSpec("a/bias", (5,)), TensorSpec("b/kernel", (40,))))


def small_layout() -> Layout:
    """A convolution and a dense layer, kernels and biases (the dense kernel is 24 x 10)."""
    return Layout((
        TensorSpec("conv/kernel", (3, 3, 2, 4)), TensorSpec("conv/bias", (4,)),
        TensorSpec("dense/kernel", (24, 10)), TensorSpec("dense/bias", (10,)),
    ))


def random_grads(layout: Layout, seed: int = 0, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=n) * scale).astype(np.float32) for n in layout.sizes]


def registry_params(name: str) -> dict:
    return PARAMS.get(name, {})


def build(name: str, layout: Layout | None = None, seed: int = 0, **params):
    """``name`` with its test parameters (``params`` override them) on ``layout`` (default small_layout)."""
    return compression.build(name, {**registry_params(name), **params}, layout or small_layout(), seed)


def assert_parts_equal(got, want, layout):
    assert len(got) == len(want)
    for a, b, size in zip(got, want, layout.sizes):
        assert type(a) is type(b)
        np.testing.assert_array_equal(a.dense(size), b.dense(size))
        if isinstance(a, SparsePart):
            np.testing.assert_array_equal(a.indices, b.indices)


# Unbiased on average (qsgd, terngrad, randomk with scale): the mean of many draws.
DRAWS = 4000
SIGMAS = 6.0  # a bound of six standard errors per entry, with deterministic seeds: cannot flake


def mean_of_draws(name: str, g: np.ndarray, **params) -> np.ndarray:
    layout = Layout((TensorSpec("t", g.shape),))
    compressor = compression.build(name, params, layout, seed=1234)
    total = np.zeros(g.size, np.float64)
    for _ in range(DRAWS):
        total += compressor.compress([g])[0].dense(g.size)
    return total / DRAWS


def unbiasedness_vector() -> np.ndarray:
    g = np.random.default_rng(0).normal(size=40).astype(np.float32)
    g[[3, 17]] = 0.0
    g[5] = 4.0  # one dominant entry
    return g
