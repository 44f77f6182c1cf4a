"""analysis.outcomes: exact intervals for rates, Fisher's exact test, Holm, smoothed final accuracy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import outcomes
from analysis.outcomes import (
    accuracy_at,
    adjust_family,
    clopper_pearson,
    common_time,
    fisher_exact,
    holm,
    mean_of_last,
    paired_difference,
    trained,
    verdict,
    wilson,
)


def test_fisher_zero_of_three_against_two_of_three_is_0_4():
    # 2 Comp-c divergences against 0 in 3 runs each: the issue's own example.
    assert fisher_exact(0, 3, 2, 1) == pytest.approx(0.4)
    assert fisher_exact(2, 1, 0, 3) == pytest.approx(0.4)


def test_fisher_textbook_values():
    # The lady tasting tea: 3 of 4 right in each row, two-sided p = 34/70.
    assert fisher_exact(3, 1, 1, 3) == pytest.approx(34 / 70)
    assert fisher_exact(0, 10, 10, 0) == pytest.approx(2 / math.comb(20, 10))
    assert fisher_exact(0, 0, 0, 0) == 1.0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 8), st.integers(0, 8), st.integers(0, 8), st.integers(0, 8))
def test_fisher_agrees_with_scipy(a, b, c, d):
    stats = pytest.importorskip("scipy.stats")
    if (a + b) and (c + d) and (a + c) and (b + d):
        assert fisher_exact(a, b, c, d) == pytest.approx(stats.fisher_exact([[a, b], [c, d]]).pvalue, rel=1e-9)


def test_clopper_pearson_zero_of_ten():
    low, high = clopper_pearson(0, 10)
    assert low == 0.0
    assert high == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-9)  # 0.3085
    assert high == pytest.approx(0.3085, abs=1e-4)
    assert clopper_pearson(10, 10) == pytest.approx((0.025 ** (1 / 10), 1.0))
    assert clopper_pearson(0, 0) == (0.0, 1.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_clopper_pearson_agrees_with_the_beta_quantiles(xn):
    stats = pytest.importorskip("scipy.stats")
    x, n = xn
    low, high = clopper_pearson(x, n)
    expected_low = 0.0 if x == 0 else stats.beta.ppf(0.025, x, n - x + 1)
    expected_high = 1.0 if x == n else stats.beta.ppf(0.975, x + 1, n - x)
    assert low == pytest.approx(expected_low, abs=1e-9)
    assert high == pytest.approx(expected_high, abs=1e-9)
    assert low <= x / n <= high


def test_wilson_known_value_and_inside_clopper_pearson():
    low, high = wilson(2, 3)
    assert (low, high) == pytest.approx((0.2077, 0.9385), abs=1e-4)
    cp = clopper_pearson(2, 3)
    assert cp[0] <= low and high <= cp[1]
    assert outcomes.normal_quantile(0.975) == pytest.approx(1.959964, abs=1e-6)


def test_holm_textbook_example():
    # Four p-values 0.01, 0.04, 0.03, 0.005: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, made monotone.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([None, 0.2]) == [None, 0.2]  # a missing test is not in the family
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_holm_never_below_raw_and_keeps_the_order(ps):
    adjusted = holm(ps)
    assert all(a >= p - 1e-15 and a <= 1.0 for a, p in zip(adjusted, ps))
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    assert all(adjusted[i] <= adjusted[j] + 1e-15 for i, j in zip(order, order[1:]))


def test_verdict_needs_an_adjusted_p_below_alpha_and_follows_the_sign():
    assert verdict(+0.1, 0.01) == "A better"
    assert verdict(-0.1, 0.01) == "B better"
    assert verdict(+0.1, 0.05) == "can't tell"  # not below 0.05
    assert verdict(+0.1, None) == "can't tell"
    assert verdict(+3.0, 0.01, higher_is_better=False) == "B better"  # a longer time is worse


def test_adjust_family_can_take_back_a_raw_verdict():
    tests = [{"mean": 0.1, "p": 0.03}, {"mean": 0.2, "p": 0.04}, {"mean": -0.1, "p": 0.001}]
    adjust_family(tests)
    assert [t["verdict"] for t in tests] == ["can't tell", "can't tell", "B better"]
    assert [t["family"] for t in tests] == [3, 3, 3]
    assert tests[0]["p_holm"] == pytest.approx(0.06)


def test_paired_difference_and_its_p_value():
    stats = pytest.importorskip("scipy.stats")
    a, b = [0.81, 0.82, 0.80, 0.85], [0.79, 0.80, 0.81, 0.80]
    got = paired_difference(zip(a, b))
    expected = stats.ttest_rel(a, b)
    assert got["n"] == 4 and got["mean"] == pytest.approx(0.02)
    assert got["p"] == pytest.approx(expected.pvalue, rel=1e-6)
    assert paired_difference([(0.5, 0.4)])["p"] is None  # one pair: no test
    assert paired_difference([(0.5, None)])["n"] == 0


def test_mean_of_last_k_and_accuracy_at_a_time():
    assert mean_of_last([0.1, 0.5, 0.7, 0.8, 0.9]) == pytest.approx(0.8)
    assert mean_of_last([0.6, 0.8], k=3) == pytest.approx(0.7)
    assert mean_of_last([]) is None
    curve = [{"time_s": 10.0, "accuracy": 0.5}, {"time_s": 20.0, "accuracy": 0.7}, {"time_s": 30.0, "accuracy": 0.6}]
    assert accuracy_at(curve, 25.0) == 0.7
    assert accuracy_at(curve, 30.0) == 0.6
    assert accuracy_at(curve, 5.0) is None
    assert common_time([curve, curve[:2]]) == 20.0


def test_trained_reads_the_outcome():
    assert trained({"outcome": "ok"}) and trained({})
    assert not trained({"outcome": "diverged"}) and not trained({"outcome": "dead"})
    assert not trained({"diverged": True})
