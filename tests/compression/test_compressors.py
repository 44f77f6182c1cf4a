"""The compressors beyond top-k, each by its defining property; their part kinds on the wire; compare.

Fast and TensorFlow-free (numpy only), except the ``slow`` comparison run at the end.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from pydantic import ValidationError

import compression
from compression import bitpack, elias_fano
from compression.adaptive_residual import bin_maxima, default_bin_size
from compression.codec import CodecError, decode, encode
from compression.dgc import warmup_density
from compression.layout import Layout, TensorSpec
from compression.memory import ErrorFeedback
from compression.parts import (
    FLAG_F16_VALUES, FLAG_RAW32_INDICES, HalfPart, LowRankPart, QuantizedPart, SignPart, SparseLevelsPart, SparseSignPart,
    WireFormat, level_bits,
)
from emulator.runtime.models import get as get_model

NEW = ("randomk", "threshold", "dgc", "qsgd", "terngrad", "signsgd", "fp16", "powersgd", "adaptive_residual")
# Parameters that make every compressor send something on the small layout's N(0, 1) gradients.
PARAMS = {
    "randomk": {"c": 0.2}, "threshold": {"tau": 1.0}, "dgc": {"c": 0.1}, "qsgd": {"s": 4}, "terngrad": {},
    "signsgd": {}, "fp16": {}, "powersgd": {"rank": 2}, "adaptive_residual": {"bin_size": 8},
}
WIRES = (WireFormat(), WireFormat("f16", "raw32"))
OWN_MEMORY = ("dgc", "adaptive_residual")


def small_layout() -> Layout:
    return Layout((
        TensorSpec("conv/kernel", (3, 3, 2, 4)), TensorSpec("conv/bias", (4,)),
        TensorSpec("dense/kernel", (24, 10)), TensorSpec("dense/bias", (10,)),
    ))


def random_grads(layout: Layout, seed: int = 0, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=n) * scale).astype(np.float32) for n in layout.sizes]


def build(name: str, layout: Layout | None = None, seed: int = 0, **params):
    return compression.build(name, {**PARAMS[name], **params}, layout or small_layout(), seed)


@pytest.fixture(scope="module")
def cnn_layout() -> Layout:
    return get_model("mnist_cnn").layout((28, 28, 1), 10)


# ---------------------------------------------------------------------------------------
# Every compressor: registry, codec round trip, determinism, server rules


def test_all_registered():
    assert set(NEW) | {"dense", "topk"} <= set(compression.COMPRESSORS)
    for name in NEW:
        assert compression.COMPRESSORS[name].name == name


@pytest.mark.parametrize("name,params", [
    ("randomk", {"c": 0}), ("randomk", {"c": 1.5}), ("randomk", {"scale": "sometimes"}), ("threshold", {"tau": 0}),
    ("threshold", {"tau": -1}), ("threshold", {"tau": float("inf")}), ("dgc", {"momentum": 1.0}), ("dgc", {"c": 0}),
    ("dgc", {"clip_norm": 0}), ("dgc", {"warmup_steps": -1}), ("qsgd", {"s": 0}), ("qsgd", {"s": 40000}),
    ("qsgd", {"s": 2.5}), ("terngrad", {"clip_sigma": 0}), ("signsgd", {"c": 0.1}), ("fp16", {"bits": 16}),
    ("powersgd", {"rank": 0}), ("adaptive_residual", {"bin_size": 0}), ("adaptive_residual", {"extra": 1}),
])
def test_bad_parameters_refused(name, params):
    with pytest.raises(ValidationError):
        compression.build(name, params, small_layout())


@pytest.mark.parametrize("wire", WIRES, ids=["f32-ef", "f16-raw32"])
@pytest.mark.parametrize("name", NEW)
def test_encoded_message_decodes_to_applicable_coordinates(name, wire):
    layout = small_layout()
    compressor = build(name, layout)
    for step in range(3):
        parts = compressor.compress(random_grads(layout, step))
        received = decode(encode(parts, layout, wire), layout)
        for sent, got, size in zip(parts, received, layout.sizes):
            assert type(got) is type(sent)
            indices, values = got.coordinates(size)
            assert values.dtype == np.float32 and np.isfinite(values).all()
            if indices is None:
                assert values.shape == (size,)
            else:
                assert indices.shape == values.shape and indices.dtype == np.int64
                assert indices.size == 0 or (indices[0] >= 0 and indices[-1] < size and np.all(np.diff(indices) > 0))
            assert got.entries == sent.entries
            # What the sender predicts (error feedback relies on it) is exactly what arrives.
            np.testing.assert_array_equal(got.dense(size), sent.rounded(wire.flags).dense(size))


@pytest.mark.parametrize("name", NEW)
def test_same_seed_same_bytes(name):
    layout = small_layout()
    a, b, c = build(name, layout, seed=5), build(name, layout, seed=5), build(name, layout, seed=6)
    messages = {"a": [], "b": [], "c": []}
    for step in range(3):
        grads = random_grads(layout, step)
        for key, compressor in (("a", a), ("b", b), ("c", c)):
            messages[key].append(encode(compressor.compress(grads), layout))
    assert messages["a"] == messages["b"]
    if name in ("randomk", "qsgd", "terngrad", "powersgd"):  # the random ones
        assert messages["a"] != messages["c"]


@pytest.mark.parametrize("rule", ["plain", "staleness", "adacomp"])
@pytest.mark.parametrize("name", NEW)
def test_every_compressor_with_every_rule(name, rule):
    from emulator.planning.methods import resolve
    from emulator.runtime import rules
    from emulator.planning.scenario import MethodSpec

    resolved = resolve(MethodSpec(name=name, rule=rule, **PARAMS[name]))
    assert (resolved.compressor, resolved.rule) == (name, rule)
    layout = small_layout()
    compressor = compression.build(resolved.compressor, resolved.params, layout)
    update_rule = rules.build(rule, layout, 0.1)
    params = np.zeros(layout.total, np.float32)
    update_rule.on_pull(0)
    for step in range(2):
        parts = decode(encode(compressor.compress(random_grads(layout, step)), layout), layout)
        applied = update_rule.apply(params, parts, worker=0, staleness=step)
        assert applied.entries == sum(p.entries for p in parts)
    assert np.isfinite(params).all() and params.any()


REGISTRY = sorted(compression.COMPRESSORS)  # every registered compressor, the paper's and plug-ins alike


def registry_params(name: str) -> dict:
    return PARAMS.get(name, {"c": 0.1} if name == "topk" else {})


def with_non_finite(grads: list[np.ndarray], where: str, bad: float) -> list[np.ndarray]:
    """``grads`` with one entry of the dense kernel, or the whole of it, made ``bad``."""
    out = [g.copy() for g in grads]
    if where == "one":
        out[2][7] = bad
    else:
        out[2][:] = bad
    return out


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["one", "all"])
@pytest.mark.parametrize("wrapped", [False, True], ids=["bare", "error_feedback"])
@pytest.mark.parametrize("name", REGISTRY)
def test_a_non_finite_gradient_is_refused_never_trimmed(name, wrapped, where, bad):
    """Top-k of an all-NaN tensor was empty: a partial update the server applied as if the
    gradient were fine. Every compressor refuses such a gradient with NonFiniteGradient,
    naming the tensor and its count, and changes no state (residual, momentum, random draws,
    warm start): its next message is the one it would have sent had it never seen it."""
    layout = small_layout()
    if wrapped and compression.COMPRESSORS[name].has_own_memory:
        pytest.skip("keeps its own residual")

    def make():
        inner = compression.build(name, registry_params(name), layout, seed=4)
        return ErrorFeedback(inner) if wrapped else inner

    seen, fresh = make(), make()
    first, after = random_grads(layout, 1), random_grads(layout, 2)
    for compressor in (seen, fresh):
        compressor.compress(first)
    with pytest.raises(compression.NonFiniteGradient) as info:
        seen.compress(with_non_finite(random_grads(layout, 3), where, bad))
    assert info.value.tensors == {"dense/kernel": 1 if where == "one" else 240}
    assert "dense/kernel" in str(info.value)
    assert encode(seen.compress(after), layout) == encode(fresh.compress(after), layout)


# ---------------------------------------------------------------------------------------
# Unbiased on average: qsgd, terngrad, randomk(scale=true)

DRAWS = 4000
SIGMAS = 6.0  # a bound of six standard errors per entry, with deterministic seeds: cannot flake


def _mean_of_draws(name: str, g: np.ndarray, **params) -> np.ndarray:
    layout = Layout((TensorSpec("t", g.shape),))
    compressor = compression.build(name, params, layout, seed=1234)
    total = np.zeros(g.size, np.float64)
    for _ in range(DRAWS):
        total += compressor.compress([g])[0].dense(g.size)
    return total / DRAWS


def _vector() -> np.ndarray:
    g = np.random.default_rng(0).normal(size=40).astype(np.float32)
    g[[3, 17]] = 0.0
    g[5] = 4.0  # one dominant entry
    return g


def test_qsgd_is_unbiased():
    g, s = _vector(), 2
    mean = _mean_of_draws("qsgd", g, s=s)
    norm = np.linalg.norm(g.astype(np.float64))
    standard_error = norm / s / 2 / math.sqrt(DRAWS)  # each entry: (norm / s) * Bernoulli, variance <= (norm / s)^2 / 4
    assert np.all(np.abs(mean - g) <= SIGMAS * standard_error)
    assert mean[3] == 0 and mean[17] == 0


def test_terngrad_is_unbiased_and_ternary():
    g = _vector()
    mean = _mean_of_draws("terngrad", g)
    scale = float(np.max(np.abs(g)))
    assert np.all(np.abs(mean - g) <= SIGMAS * scale / 2 / math.sqrt(DRAWS))
    part = compression.build("terngrad", {}, Layout((TensorSpec("t", g.shape),)), seed=3).compress([g])[0]
    assert isinstance(part, QuantizedPart) and part.levels == 1 and part.scale == scale
    assert set(np.unique(part.dense(g.size))) <= {-scale, 0.0, scale}
    assert part.dense(g.size)[5] == scale  # |g| = max: always sent


def test_randomk_scaled_is_unbiased():
    g = _vector()
    c = 0.25
    n, k = g.size, 10
    mean = _mean_of_draws("randomk", g, c=c, scale=True)
    standard_error = np.abs(g) * math.sqrt(n / k - 1) / math.sqrt(DRAWS)  # g * (n/k) * Bernoulli(k/n)
    assert np.all(np.abs(mean - g) <= SIGMAS * standard_error + 1e-6)


def test_randomk_unscaled_sends_values_as_they_are():
    layout = small_layout()
    grads = random_grads(layout)
    for part, g, size in zip(build("randomk", layout, c=0.2).compress(grads), grads, layout.sizes):
        assert part.entries == max(1, math.floor(0.2 * size))
        np.testing.assert_array_equal(part.values, g[part.indices])


# ---------------------------------------------------------------------------------------
# Residuals: error feedback for any compressor, and the compressors' own


@pytest.mark.parametrize("wire", WIRES, ids=["f32-ef", "f16-raw32"])
@pytest.mark.parametrize("name", [n for n in NEW if n not in OWN_MEMORY] + ["topk", "dense"])
def test_error_feedback_residual_plus_sent_is_input(name, wire):
    layout = small_layout()
    inner = compression.build(name, PARAMS.get(name, {"c": 0.1} if name == "topk" else {}), layout, seed=2)
    ef = ErrorFeedback(inner, wire)
    total = [np.zeros(n, np.float64) for n in layout.sizes]
    sent = [np.zeros(n, np.float64) for n in layout.sizes]
    for step in range(8):
        grads = random_grads(layout, 100 + step)
        received = decode(encode(ef.compress(grads), layout, wire), layout)
        for i, (g, part, size) in enumerate(zip(grads, received, layout.sizes)):
            total[i] += g
            sent[i] += part.dense(size)
            np.testing.assert_allclose(sent[i] + ef.residual[i], total[i], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", OWN_MEMORY)
def test_own_memory_refuses_error_feedback(name):
    with pytest.raises(ValueError, match="keeps its own residual"):
        ErrorFeedback(build(name))


@pytest.mark.parametrize("name", OWN_MEMORY)
def test_check_method_reports_error_feedback_on_own_memory(name):
    from emulator.planning.methods import check_method
    from emulator.planning.scenario import MethodSpec

    problems = check_method(MethodSpec(name=name, error_feedback=True))
    assert [str(p) for p in problems] == [f"method.error_feedback: {name} keeps its own residual"]
    assert check_method(MethodSpec(name=name)) == []
    assert check_method(MethodSpec(name="qsgd", error_feedback=True)) == []


@pytest.mark.parametrize("wire", WIRES, ids=["f32-ef", "f16-raw32"])
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


# ---------------------------------------------------------------------------------------
# DGC: momentum correction, masking, warm-up, clipping


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


# ---------------------------------------------------------------------------------------
# adaptive_residual (Chen et al.)


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


# ---------------------------------------------------------------------------------------
# signsgd, threshold, fp16


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


# ---------------------------------------------------------------------------------------
# PowerSGD


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


# ---------------------------------------------------------------------------------------
# Sizes on the paper's CNN, measured from the bytes; the formulas only as a sanity check


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


@pytest.mark.parametrize("name", NEW)
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


# ---------------------------------------------------------------------------------------
# Malformed bytes of each new part kind

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


# ---------------------------------------------------------------------------------------
# compare: method specs, measures from traces (fast), and a real comparison (slow)

TINY = """\
name: tiny-compare
seed: 3
model: mlp
dataset: {name: digits, partition: shards}
training: {batch_size: 16, learning_rate: 0.1, max_updates: 60, eval_every: 20 updates}
method: {name: adacomp, c: 0.01}
server: {cpus: 1.0}
evaluator: {cpus: 0.5}
workers:
  - {count: 4, cpus: 0.5, uplink: 1mbit, downlink: 10mbit, delay: 20ms}
"""  # slow links: training lasts seconds, not a fraction of one


@pytest.fixture
def tiny_scenario(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def test_method_spec_syntax():
    from emulator.experiments.compare import parse_method_spec

    spec = parse_method_spec("topk:c=0.001:error_feedback=true")
    assert spec.overrides == ('method={"name": "topk"}', "method.c=0.001", "method.error_feedback=true")
    assert spec.slug == "topk_c-0.001_error_feedback-true"
    assert parse_method_spec("adacomp").overrides == ('method={"name": "adacomp"}',)
    assert parse_method_spec("topk:wire.values=f16").overrides[-1] == "method.wire.values=f16"
    # Another section of the scenario is set for that method's run only.
    assert parse_method_spec("asgd:training.learning_rate=0.05").overrides == ('method={"name": "asgd"}', "training.learning_rate=0.05")
    for bad in ("", "qsgd:s", "qsgd:=4", "qsgd:name=dgc", "q sgd", "qsgd:s.=4"):
        with pytest.raises(ValueError):
            parse_method_spec(bad)


@pytest.mark.parametrize("spec,expected", [
    ("qsgd:s=0", "method.s"), ("qsgd:q=1", "unknown parameter for qsgd"), ("nope", "method.name"),
    ("dgc:error_feedback=true", "method.error_feedback: dgc keeps its own residual"),
    ("topk:rule=fast", "method.rule"), ("topk:wire.values=f8", "method.wire.values"),
])
def test_method_specs_are_validated_with_the_scenario(spec, expected, tiny_scenario, tmp_path):
    from emulator.experiments.compare import compare
    from emulator.planning.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=expected.replace(".", r"\.")):
        compare(tiny_scenario, ["asgd", spec], tmp_path / "out", say=lambda _: None)
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_compare_refuses_method_overrides_and_repeats(tiny_scenario, tmp_path):
    from emulator.experiments.compare import compare
    from emulator.planning.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="method specs"):
        compare(tiny_scenario, ["asgd"], tmp_path, overrides=["method.c=0.1"], say=lambda _: None)
    with pytest.raises(ScenarioError, match="twice"):
        compare(tiny_scenario, ["asgd", "asgd"], tmp_path, say=lambda _: None)
    with pytest.raises(ScenarioError, match="at least one"):
        compare(tiny_scenario, [], tmp_path, say=lambda _: None)


def _fake_run(path, compressor, sizes, accuracy, compute_ms=10.0, compress_ms=1.0):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({
        "status": "completed", "compressor": compressor, "rule": "plain", "final_accuracy": accuracy[-1][1],
        "updates_applied": len(sizes), "ingress_payload_bytes": sum(sizes) + 100, "training_started_ts": 5.5,
    }))
    (path / "updates.jsonl").write_text("".join(json.dumps({"t": t, "bytes": b}) + "\n" for t, b in enumerate(sizes, 1)))
    (path / "accuracy.jsonl").write_text("".join(
        json.dumps({"version": v, "accuracy": a, "ts": 5.0 + v}) + "\n" for v, a in accuracy))
    (path / "events.jsonl").write_text(json.dumps({"kind": "training_started", "source": "server", "ts": 5.0}) + "\n")
    (path / "steps.jsonl").write_text(
        json.dumps({"steps": 3, "compute_ms": compute_ms, "compress_ms": compress_ms}) + "\n"
        + json.dumps({"steps": 1, "compute_ms": 2 * compute_ms, "compress_ms": 0.0}) + "\n")


def test_compare_measures_from_traces(tmp_path):
    from emulator.experiments.compare import summarize_run, training_start, write_report

    _fake_run(tmp_path / "a", "dense", [1000] * 4, [(0, 0.1), (2, 0.5), (4, 0.8)])
    _fake_run(tmp_path / "b", "topk", [10, 20, 30, 40], [(0, 0.1), (2, 0.7), (4, 0.9)], compress_ms=5.0)
    rows = [summarize_run(tmp_path / "a", "asgd"), summarize_run(tmp_path / "b", "adacomp")]
    assert training_start(tmp_path / "a", {"training_started_ts": 5.5}) == 5.0  # the server's event first
    assert training_start(tmp_path / "missing", {"training_started_ts": 5.5}) == 5.5
    assert rows[1]["curve"] == [
        {"version": 0, "bytes": 0, "accuracy": 0.1, "time_s": 0.0},
        {"version": 2, "bytes": 30, "accuracy": 0.7, "time_s": 2.0},
        {"version": 4, "bytes": 100, "accuracy": 0.9, "time_s": 4.0},
    ]
    assert rows[1]["bytes_per_update"] == 25.0
    assert rows[1]["compress_overhead"] == pytest.approx(15.0 / 50.0)
    report = write_report(tmp_path, rows)
    assert report["target_accuracy"] == pytest.approx(0.81)
    asgd, adacomp = report["methods"]
    assert asgd["ratio_to_dense"] == 1.0 and adacomp["ratio_to_dense"] == 40.0
    assert asgd["time_to_target"] is None and adacomp["time_to_target"] == {"time_s": 4.0, "version": 4}
    markdown = (tmp_path / "compare.md").read_text()
    assert "| `adacomp` | 0.9000 | 4 | 200 | 25 | 40.0x | - | - | 4.0 (update 4) | 0.300 |" in markdown  # no downlink counted
    assert "not reached" in markdown
    assert (tmp_path / "accuracy_vs_ingress.png").stat().st_size > 1000
    assert json.loads((tmp_path / "compare.json").read_text())["methods"][1]["ratio_to_dense"] == 40.0
    assert write_report(tmp_path, rows, target_accuracy=0.5)["methods"][0]["time_to_target"] == {"time_s": 2.0, "version": 2}


@pytest.mark.slow
def test_compare_three_methods(tiny_scenario, tmp_path):
    from emulator.experiments.compare import compare

    lines = []
    out = compare(tiny_scenario, ["asgd", "adacomp", "qsgd"], tmp_path, backend="local", say=lines.append)
    assert out.parent == tmp_path and out.name.startswith("compare-tiny-compare-")
    report = json.loads((out / "compare.json").read_text())
    rows = {row["method"]: row for row in report["methods"]}
    assert list(rows) == ["asgd", "adacomp", "qsgd"]
    for row in rows.values():
        assert row["status"] == "completed" and row["updates"] == 60
        assert (out / row["run_id"] / "summary.json").exists()
        assert row["curve"] and row["curve"][-1]["bytes"] > 0
    assert rows["adacomp"]["bytes_per_update"] < rows["qsgd"]["bytes_per_update"] < rows["asgd"]["bytes_per_update"]
    assert rows["adacomp"]["ingress_payload_bytes"] < rows["asgd"]["ingress_payload_bytes"]
    assert rows["asgd"]["ratio_to_dense"] == 1.0 and rows["adacomp"]["ratio_to_dense"] > 5
    markdown = (out / "compare.md").read_text()
    assert markdown.count("\n| `") == 3
    assert (out / "accuracy_vs_ingress.png").stat().st_size > 5000
    print("\n" + markdown)


def test_compress_overhead_prefers_cpu_time_to_wall_time():
    from emulator.experiments.compare import compress_overhead

    # Under a CPU quota a phase that runs out of quota waits for the next period: wall 60 ms of
    # compression that cost 1.5 ms of CPU must not read as 4x the gradient.
    throttled = [{"steps": 2, "compute_ms": 15.0, "compress_ms": 60.0, "compute_cpu_ms": 14.0, "compress_cpu_ms": 1.4},
                 {"steps": 1, "compute_ms": 15.0, "compress_ms": 60.0, "compute_cpu_ms": 16.0, "compress_cpu_ms": 1.7}]
    assert compress_overhead(throttled) == pytest.approx((2 * 1.4 + 1.7) / (2 * 14.0 + 16.0))
    older = [{"steps": 1, "compute_ms": 10.0, "compress_ms": 1.0}]  # traces from before CPU times were recorded
    assert compress_overhead(older) == pytest.approx(0.1)
    assert compress_overhead([]) is None
