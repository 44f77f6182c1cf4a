"""The server's update rules: plain, staleness-aware and AdaComp, by hand and against the paper's definition."""

from __future__ import annotations

import numpy as np
import pytest

from compression.layout import Layout, TensorSpec
from compression.parts import DensePart, SparsePart
from emulator.runtime import rules
from emulator.runtime.rules import AdaComp, Plain, RuleError, Staleness

LAYOUT = Layout((TensorSpec("w", (2, 2)), TensorSpec("b", (3,))))  # sizes 4 and 3, offsets 0 and 4
ALPHA = 0.5


def sparse(indices, values) -> SparsePart:
    return SparsePart(np.array(indices, np.int64), np.array(values, np.float32))


def dense(values) -> DensePart:
    return DensePart(np.array(values, np.float32))


def empty() -> SparsePart:
    return sparse([], [])


def zeros() -> np.ndarray:
    return np.zeros(LAYOUT.total, np.float32)


# ---------------------------------------------------------------------------------------
# plain and staleness


def test_build_by_name():
    assert set(rules.RULES) == {"plain", "staleness", "adacomp"}
    for name, cls in (("plain", Plain), ("staleness", Staleness), ("adacomp", AdaComp)):
        rule = rules.build(name, LAYOUT, ALPHA)
        assert isinstance(rule, cls) and rule.learning_rate == ALPHA
    with pytest.raises(ValueError, match="adacomp"):
        rules.build("sgd", LAYOUT, ALPHA)


def test_plain_sparse_and_dense():
    rule = Plain(LAYOUT, ALPHA)
    p = zeros()
    applied = rule.apply(p, [sparse([1, 3], [2.0, -4.0]), dense([1.0, 2.0, 4.0])], worker=0, staleness=7)
    np.testing.assert_array_equal(p, [0, -1, 0, 2, -0.5, -1, -2])
    assert applied.entries == 5 and applied.mean_scale == 1.0
    # No pull needed, staleness ignored.
    rule.apply(p, [dense([2, 2, 2, 2]), empty()], worker=9, staleness=0)
    np.testing.assert_array_equal(p, [-1, -2, -1, 1, -0.5, -1, -2])


@pytest.mark.parametrize("d,scale", [(0, 1.0), (1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.25)])
def test_staleness_divides_by_delay(d, scale):
    rule = Staleness(LAYOUT, ALPHA)
    p = zeros()
    applied = rule.apply(p, [sparse([0], [6.0]), dense([3.0, 6.0, 12.0])], worker=0, staleness=d)
    rate = np.float32(ALPHA * scale)
    expected = zeros()
    expected[0] -= rate * np.float32(6.0)
    expected[4:] -= rate * np.array([3.0, 6.0, 12.0], np.float32)
    np.testing.assert_allclose(p, expected, rtol=1e-6)
    assert applied.mean_scale == pytest.approx(scale)
    if d == 3:
        np.testing.assert_allclose(p[4:], [-0.5, -1.0, -2.0], rtol=1e-6)


# ---------------------------------------------------------------------------------------
# AdaComp by hand


def test_adacomp_no_delay_is_a_full_step():
    rule = AdaComp(LAYOUT, ALPHA)
    p = zeros()
    rule.on_pull(0)
    applied = rule.apply(p, [sparse([2], [2.0]), sparse([0, 2], [4.0, 8.0])], worker=0, staleness=0)
    np.testing.assert_array_equal(p, [0, 0, -1, 0, -2, 0, -4])
    assert applied.entries == 3 and applied.mean_scale == 1.0


def test_adacomp_overlapping_workers_by_hand():
    rule = AdaComp(LAYOUT, ALPHA)
    p = zeros()
    A, B, C = 0, 1, 2
    for w in (A, B, C):
        rule.on_pull(w)  # all at t0 = 0
    # B: d = 0, sigma = 0: full step on w[0], w[1], b[2].
    applied = rule.apply(p, [sparse([0, 1], [1.0, 2.0]), sparse([2], [4.0])], B, staleness=0)
    np.testing.assert_array_equal(p, [-0.5, -1, 0, 0, 0, 0, -2])
    assert applied.mean_scale == 1.0
    # C: d = 1, w[1] was touched once since its pull: sigma = 1, still a full step.
    applied = rule.apply(p, [sparse([1], [2.0]), empty()], C, staleness=1)
    np.testing.assert_array_equal(p, [-0.5, -2, 0, 0, 0, 0, -2])
    assert applied.entries == 1 and applied.mean_scale == 1.0
    # A: d = 2; w[1] touched by B and C (sigma 2: half step), w[2] never (sigma 0: full step),
    # b[0] never (full), b[2] by B only (sigma 1: full).
    applied = rule.apply(p, [sparse([1, 2], [4.0, 2.0]), sparse([0, 2], [2.0, 8.0])], A, staleness=2)
    np.testing.assert_array_equal(p, [-0.5, -3, -1, 0, -1, 0, -6])
    assert applied.entries == 4
    assert applied.mean_scale == pytest.approx((0.5 + 1 + 1 + 1) / 4)
    assert applied.mean_sigma == pytest.approx((2 + 0 + 0 + 1) / 4)  # recorded as `sigma`: sigma / d is its staleness share
    # Touch counters: w[0] once, w[1] three times, w[2] once, b[0] once, b[2] twice.
    np.testing.assert_array_equal(rule.touches, [1, 3, 1, 0, 1, 0, 2])


def test_adacomp_pull_resets_the_window():
    rule = AdaComp(LAYOUT, ALPHA)
    p = zeros()
    rule.on_pull(0)
    rule.on_pull(1)
    rule.apply(p, [sparse([0], [1.0]), empty()], 1, staleness=0)
    rule.apply(p, [sparse([0], [1.0]), empty()], 0, staleness=1)  # sigma 1
    rule.on_pull(1)
    rule.on_pull(0)
    before = p.copy()
    rule.apply(p, [sparse([0], [2.0]), empty()], 0, staleness=0)  # window restarts: full step
    assert p[0] == before[0] - 1.0


def test_adacomp_dense_equals_staleness():
    """With dense updates every coordinate is touched by every update: sigma = d."""
    rng = np.random.default_rng(0)
    ada, stale = AdaComp(LAYOUT, ALPHA), Staleness(LAYOUT, ALPHA)
    p_ada, p_stale = zeros(), zeros()
    version, pulled = 0, {}
    for w in range(4):
        ada.on_pull(w)
        pulled[w] = version
    order = [0, 1, 2, 3, 2, 0, 1, 3, 3, 3, 0]
    for w in order:
        d = version - pulled[w]
        grads = [dense(rng.normal(size=4)), dense(rng.normal(size=3))]
        a = ada.apply(p_ada, grads, w, d)
        s = stale.apply(p_stale, grads, w, d)
        assert a.mean_scale == pytest.approx(s.mean_scale)
        np.testing.assert_allclose(p_ada, p_stale, rtol=1e-6, atol=1e-7)
        version += 1
        ada.on_pull(w)
        pulled[w] = version
    assert version == len(order)


def test_adacomp_push_without_pull():
    rule = AdaComp(LAYOUT, ALPHA)
    p = zeros()
    with pytest.raises(RuleError) as info:
        rule.apply(p, [empty(), empty()], worker=4, staleness=0)
    assert info.value.reason == "no_pull"
    rule.on_pull(4)
    rule.apply(p, [sparse([0], [1.0]), empty()], worker=4, staleness=0)
    rule.forget(4)
    with pytest.raises(RuleError) as info:
        rule.apply(p, [sparse([0], [1.0]), empty()], worker=4, staleness=0)
    assert info.value.reason == "no_pull"
    assert p[0] == -0.5  # the refused push changed nothing
    rule.forget(99)  # forgetting an unknown worker is harmless


def test_adacomp_counter_wraparound():
    rule = AdaComp(LAYOUT, ALPHA)
    p = zeros()
    rule.touches[:] = np.uint32(2**32 - 1)
    rule.on_pull(0)
    rule.on_pull(1)
    rule.apply(p, [sparse([3], [1.0]), empty()], 1, staleness=0)
    assert rule.touches[3] == 0  # wrapped
    rule.apply(p, [sparse([3], [2.0]), empty()], 0, staleness=1)
    # sigma = 0 - (2**32 - 1) mod 2**32 = 1: a full step for worker 0.
    assert p[3] == -0.5 - 1.0


def test_adacomp_state_round_trip():
    rule = AdaComp(LAYOUT, ALPHA)
    p = zeros()
    rule.on_pull(0)
    rule.apply(p, [sparse([1], [1.0]), sparse([0, 1, 2], [1.0, 1.0, 1.0])], 0, 0)
    state = rule.state()
    other = AdaComp(LAYOUT, ALPHA)
    other.load_state({k: v.copy() for k, v in state.items()})
    np.testing.assert_array_equal(other.touches, rule.touches)
    assert other.touches.dtype == np.uint32
    rule.load_state(state)
    assert rule.at_pull == {}  # workers must pull again after a restore


def test_adacomp_memory_is_bounded():
    """Per update: O(k) work and no structure that grows with the run or with d."""
    layout = Layout((TensorSpec("w", (1000,)), TensorSpec("b", (10,))))
    rule = AdaComp(layout, 0.1)
    p = np.zeros(layout.total, np.float32)
    rng = np.random.default_rng(0)
    touches = rule.touches
    snapshots = {}
    version, pulled = 0, {}
    for w in range(5):
        rule.on_pull(w)
        pulled[w] = 0
        snapshots[w] = rule.at_pull[w]
    for step in range(10_000):
        w = int(rng.integers(5))
        first = int(rng.integers(100))
        parts = [SparsePart(np.arange(first, 1000, 100), np.ones(10, np.float32)), SparsePart(np.array([first % 10]), np.ones(1, np.float32))]
        rule.apply(p, parts, w, version - pulled[w])
        version += 1
        rule.on_pull(w)
        pulled[w] = version
    assert rule.touches is touches and rule.touches.shape == (layout.total,)
    assert set(rule.at_pull) == set(range(5))
    for w, snap in rule.at_pull.items():
        assert snap is snapshots[w]  # refreshed in place, never reallocated
        assert snap.shape == (layout.total,) and snap.dtype == np.uint32
    # Nothing else hangs on the rule but each worker's pull version: no history list.
    extra = {k: v for k, v in vars(rule).items() if k not in {"layout", "learning_rate", "touches", "at_pull", "pulled_at"}}
    assert extra == {}
    assert set(rule.pulled_at) == set(range(5))
    assert int(rule.touches.sum()) == 10_000 * 11


# ---------------------------------------------------------------------------------------
# AdaComp against the paper's definition, written naively


class NaiveAdaComp:
    """sigma_i = how many of the last d applied updates touched i (0 when d = 0)."""

    def __init__(self, layout: Layout, alpha: float):
        self.layout = layout
        self.alpha = alpha
        self.history: list[set[int]] = []

    def apply(self, params, parts, staleness):
        d = staleness
        window = self.history[-d:] if d > 0 else []
        touched, inverse = set(), []
        for part, offset, size in zip(parts, self.layout.offsets, self.layout.sizes):
            indices, values = part.coordinates(size)
            if indices is None:
                indices = np.arange(size)
            for i, v in zip(indices.tolist(), values):
                j = offset + i
                sigma = sum(1 for s in window if j in s)
                divisor = np.float32(max(1, sigma))
                params[j] -= np.float32(self.alpha) * np.float32(v) / divisor
                touched.add(j)
                inverse.append(1.0 / float(divisor))
        self.history.append(touched)
        return float(np.mean(inverse)) if inverse else 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_adacomp_matches_the_papers_definition(seed):
    layout = Layout((TensorSpec("w", (5, 6)), TensorSpec("b", (6,)), TensorSpec("c", (4,))))
    rng = np.random.default_rng(seed)
    alpha = 0.1
    rule, naive = AdaComp(layout, alpha), NaiveAdaComp(layout, alpha)
    p_rule = rng.normal(size=layout.total).astype(np.float32)
    p_naive = p_rule.copy()
    version, pulled = 0, {}
    updates = 0
    delays = []
    while updates < 300:
        w = int(rng.integers(5))
        if w not in pulled or rng.random() < 0.15:  # (re)pull
            rule.on_pull(w)
            pulled[w] = version
            continue
        parts = []
        for size in layout.sizes:
            if rng.random() < 0.1:
                parts.append(DensePart(rng.normal(size=size).astype(np.float32)))
            else:
                k = int(rng.integers(0, min(size, 5) + 1))
                parts.append(SparsePart(np.sort(rng.choice(size, k, replace=False)).astype(np.int64), rng.normal(size=k).astype(np.float32)))
        d = version - pulled[w]
        delays.append(d)
        applied = rule.apply(p_rule, parts, w, d)
        mean_inverse = naive.apply(p_naive, parts, d)
        np.testing.assert_array_equal(p_rule, p_naive)
        if applied.entries:
            assert applied.mean_scale == pytest.approx(mean_inverse, rel=1e-6)
        version += 1
        updates += 1
        if rng.random() < 0.8:  # the server answers a push with the model: usually a pull
            rule.on_pull(w)
            pulled[w] = version
    assert max(delays) >= 5 and 0 in delays  # the sequence exercised real staleness


def test_adacomp_copies_the_counters_whole_when_the_change_set_starts_after_its_copy():
    """The partial refresh at a pull is sound only for a change set that starts at or before the
    worker's copy (two connections of one worker id can hold different versions): else a whole copy."""
    layout = Layout((TensorSpec("w", (100,)),))
    rule = AdaComp(layout, 0.1)
    rule.on_pull(0, 0)
    rule.touches[[3, 40, 77]] += 1  # changed after version 0
    rule.on_pull(0, 5, since=(2, np.array([40], np.int64)))  # a change set from version 2: not enough
    np.testing.assert_array_equal(rule.at_pull[0], rule.touches)
    rule.touches[[8, 9]] += 1
    rule.on_pull(0, 7, since=(5, np.array([8, 9], np.int64)))  # from the copy's own version: partial
    np.testing.assert_array_equal(rule.at_pull[0], rule.touches)
    rule.touches[50] += 1
    rule.on_pull(0, 8)  # no change set: whole
    np.testing.assert_array_equal(rule.at_pull[0], rule.touches)
