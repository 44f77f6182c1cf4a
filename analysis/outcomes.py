"""Statistics that fit the outcome: yes/no outcomes as rates, accuracy over the runs that trained,
final accuracy smoothed over the last evaluations, and verdicts adjusted over a stated family.

A run of asynchronous SGD either trains or does not (it diverges, or its model dies at chance):
accuracies near 0.1 and near 0.8 are two outcomes, not one quantity with a spread. So:

- **rates** (diverged or dead out of n runs) get exact binomial intervals:
  :func:`clopper_pearson` (the exact interval, the one tables print) and :func:`wilson` (the
  score interval, narrower, for comparison); two methods' rates are compared with
  :func:`fisher_exact` (two-sided, the sum of the hypergeometric probabilities no larger than
  the observed table's);
- **accuracy** is averaged over the runs that trained only (:func:`trained`), and a paired
  difference over the repetitions in which *both* trained (:func:`paired_difference`: mean,
  Student-t interval and the two-sided p-value of the paired t test);
- **final accuracy** is the mean of the last :data:`LAST_K` evaluations (:func:`mean_of_last`),
  because consecutive evaluations of one run vary by as much as the differences judged; and
  accuracy at one wall time common to the runs compared (:func:`accuracy_at`);
- **verdicts** over several tests use Holm's step-down adjustment over the family the caller
  states (:func:`holm`): a difference is called only where its adjusted p-value is below
  :data:`ALPHA`.

Pure maths on numbers, standard library only (exact rational arithmetic where it is cheap), so
the same functions serve ``emulate compare``, ``emulate sweep`` and the committed reproduction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

from emulator.control.summary import FLAGGED  # the outcomes that are not "trained": diverged, dead

CONFIDENCE = 0.95

ALPHA = round(1.0 - CONFIDENCE, 12)  # a verdict needs an adjusted p-value below this (0.05)
LAST_K = 3  # final accuracy: the mean of this many last evaluations


# -- the Student-t interval (Abramowitz & Stegun 26.7.3-4, inverted by bisection) ---------------------------------------------------------------------------


def t_central(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with ``df`` (a positive whole number) degrees of freedom."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a whole number >= 1, got {df!r}")
    if t <= 0:
        return 0.0
    if math.isinf(t):
        return 1.0
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 1:  # 2/pi * (theta + sin(theta) * (cos + 2/3 cos^3 + (2*4)/(3*5) cos^5 + ...))
        series, term = 0.0, math.cos(theta)
        for k in range(1, (df - 1) // 2 + 1):
            series += term
            term *= c2 * (2 * k) / (2 * k + 1)
        return 2.0 / math.pi * (theta + math.sin(theta) * series)
    series, term = 0.0, 1.0  # sin(theta) * (1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 + ...)
    for k in range(1, df // 2 + 1):
        series += term
        term *= c2 * (2 * k - 1) / (2 * k)
    return math.sin(theta) * series


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``t_quantile(0.975, 4) = 2.776``)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    target = 2.0 * p - 1.0
    low, high = 0.0, 1.0
    while t_central(high, df) < target:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if middle in (low, high):
            break
        if t_central(middle, df) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


def mean_ci(values: Iterable[float], confidence: float = CONFIDENCE) -> tuple[int, float, float]:
    """``(n, mean, half-width)`` of the two-sided Student-t interval of the mean of ``values``.

    NaN and missing values are left out. The half-width is ``t(1 - (1 - confidence) / 2, n - 1)
    * s / sqrt(n)`` with ``s`` the sample standard deviation; NaN when ``n < 2`` (one sample says
    nothing about spread); the mean is NaN when ``n == 0``.
    """
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    n = len(xs)
    if n == 0:
        return 0, math.nan, math.nan
    mean = math.fsum(xs) / n
    if n < 2:
        return n, mean, math.nan
    variance = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return n, mean, t_quantile(0.5 + confidence / 2.0, n - 1) * math.sqrt(variance / n)


# -- rates ---------------------------------------------------------------------------------


def _binomial_tail_at_least(x: int, n: int, p: float) -> float:
    """``P(X >= x)`` for ``X ~ Binomial(n, p)``."""
    if x <= 0:
        return 1.0
    if x > n:
        return 0.0
    return math.fsum(math.comb(n, k) * p ** k * (1.0 - p) ** (n - k) for k in range(x, n + 1))


def _bisect(f, low: float, high: float) -> float:
    """The root of increasing ``f`` on [low, high] (f(low) <= 0 <= f(high)), to machine precision."""
    for _ in range(200):
        middle = (low + high) / 2.0
        if middle in (low, high):
            break
        if f(middle) < 0:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


def clopper_pearson(x: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a binomial proportion, ``x`` successes in ``n``.

    The lower end solves ``P(X >= x | p) = (1 - confidence) / 2``, the upper ``P(X <= x | p) =
    (1 - confidence) / 2``; 0 and 1 where ``x`` is 0 or ``n`` (0 of 10 at 95 %: [0, 0.3085]).
    ``n = 0``: (0, 1), nothing is known."""
    _check_count(x, n)
    if n == 0:
        return 0.0, 1.0
    tail = (1.0 - confidence) / 2.0
    low = 0.0 if x == 0 else _bisect(lambda p: _binomial_tail_at_least(x, n, p) - tail, 0.0, 1.0)
    high = 1.0 if x == n else _bisect(lambda p: tail - (1.0 - _binomial_tail_at_least(x + 1, n, p)), 0.0, 1.0)
    return low, high


def normal_quantile(p: float) -> float:
    """The ``p`` quantile of the standard normal distribution (bisection on ``erf``)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    return _bisect(lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))) - p, -40.0, 40.0)


def wilson(x: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (``n = 0``: (0, 1))."""
    _check_count(x, n)
    if n == 0:
        return 0.0, 1.0
    z = normal_quantile(0.5 + confidence / 2.0)
    p = x / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def _check_count(x: int, n: int) -> None:
    if int(x) != x or int(n) != n or not 0 <= x <= n:
        raise ValueError(f"need whole numbers 0 <= x <= n, got x={x!r}, n={n!r}")


def rate(x: int, n: int, confidence: float = CONFIDENCE) -> dict:
    """A rate as tables print it: ``x`` of ``n``, the share, and its exact interval (Clopper-Pearson)."""
    low, high = clopper_pearson(x, n, confidence)
    return {"x": x, "n": n, "share": None if n == 0 else x / n, "low": low, "high": high, "method": "Clopper-Pearson"}


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p-value of Fisher's exact test for the 2x2 table ``[[a, b], [c, d]]``.

    With the margins fixed, ``a`` is hypergeometric; the p-value sums the probabilities of every
    table no more probable than the observed one (compared exactly, as fractions). 0 of 3
    against 2 of 3: ``fisher_exact(0, 3, 2, 1) = 0.4``."""
    for v in (a, b, c, d):
        if int(v) != v or v < 0:
            raise ValueError(f"cells must be whole numbers >= 0, got {(a, b, c, d)!r}")
    row1, col1, n = a + b, a + c, a + b + c + d
    if n == 0:
        return 1.0
    low, high = max(0, col1 - (n - row1)), min(row1, col1)
    total = math.comb(n, col1)
    probability = {k: Fraction(math.comb(row1, k) * math.comb(n - row1, col1 - k), total) for k in range(low, high + 1)}
    observed = probability[a]
    return float(min(Fraction(1), sum(p for p in probability.values() if p <= observed)))


def compare_rates(xa: int, na: int, xb: int, nb: int) -> dict:
    """Two rates side by side: their difference and Fisher's exact two-sided p-value."""
    p = fisher_exact(xa, na - xa, xb, nb - xb)
    difference = None if not na or not nb else xa / na - xb / nb
    return {"a": rate(xa, na), "b": rate(xb, nb), "difference": difference, "p": p, "test": "Fisher's exact, two-sided"}


# -- accuracy --------------------------------------------------------------------------------


def trained(row: Mapping) -> bool:
    """Whether a completed run trained: neither diverged nor ended dead (its ``outcome``; older
    summaries only say ``diverged``)."""
    outcome = row.get("outcome") or ("diverged" if row.get("diverged") else None)
    return outcome not in FLAGGED


def mean_of_last(accuracies: Sequence[float | None], k: int = LAST_K) -> float | None:
    """The mean of the last ``k`` evaluations (fewer when a run has fewer); None for none."""
    values = [float(a) for a in accuracies if a is not None]
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return math.fsum(values[-k:]) / len(values[-k:]) if values else None


def accuracy_at(curve: Iterable[Mapping], time_s: float) -> float | None:
    """The accuracy of the last evaluation at or before ``time_s`` of training (``curve``: points with
    ``time_s`` and ``accuracy``); None when the run has none by then."""
    best = None
    for point in curve:
        t, a = point.get("time_s"), point.get("accuracy")
        if t is not None and a is not None and t <= time_s + 1e-9 and (best is None or t >= best[0]):
            best = (t, a)
    return None if best is None else best[1]


def common_time(curves: Iterable[Sequence[Mapping]]) -> float | None:
    """The latest training time every curve reached with an evaluation: the shortest run's last
    evaluation (None when a curve has no timed evaluation)."""
    ends = []
    for curve in curves:
        times = [p["time_s"] for p in curve if p.get("time_s") is not None and p.get("accuracy") is not None]
        if not times:
            return None
        ends.append(max(times))
    return min(ends) if ends else None


def t_p_value(mean: float, half_width: float, n: int, confidence: float = CONFIDENCE) -> float | None:
    """Two-sided p-value of the one-sample t test of mean 0, from a Student-t interval's half-width."""
    if n < 2 or half_width is None or math.isnan(half_width):
        return None
    se = half_width / t_quantile(0.5 + confidence / 2.0, n - 1)
    if se == 0:
        return 0.0 if mean != 0 else 1.0
    return max(0.0, 1.0 - t_central(abs(mean) / se, n - 1))


def paired_difference(pairs: Iterable[tuple[float | None, float | None]], confidence: float = CONFIDENCE) -> dict:
    """Mean of ``a - b`` over the pairs where both are known, its Student-t interval and the
    paired t test's two-sided p-value (None below 2 pairs)."""
    n, mean, half = mean_ci([a - b for a, b in pairs if a is not None and b is not None], confidence)
    finite = lambda v: None if v is None or math.isnan(v) else v  # noqa: E731 - JSON has no NaN
    mean, half = finite(mean), finite(half)
    return {"n": n, "mean": mean, "half_width": half, "low": None if half is None else mean - half,
            "high": None if half is None else mean + half, "p": None if mean is None else t_p_value(mean, half, n, confidence)}


# -- families of tests -----------------------------------------------------------------------


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values, in the order given (None: no test, not counted in the
    family). With m tests sorted ascending, ``adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``."""
    indexed = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(indexed)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def verdict(mean: float | None, adjusted_p: float | None, higher_is_better: bool = True, alpha: float = ALPHA) -> str:
    """``"A better"``, ``"B better"`` or ``"can't tell"`` for a difference A - B: called only where
    the family-adjusted p-value is below ``alpha``."""
    if mean is None or adjusted_p is None or not adjusted_p < alpha or mean == 0:
        return "can't tell"
    return "A better" if (mean > 0) == higher_is_better else "B better"


def adjust_family(tests: list[dict], higher_is_better: bool = True, alpha: float = ALPHA) -> list[dict]:
    """Holm over ``tests`` (each a dict with ``p`` and a signed ``mean`` or ``difference``): each
    gets ``p_holm``, ``family`` (its size) and ``verdict``. Returns the same dicts."""
    adjusted = holm([t.get("p") for t in tests])
    size = sum(1 for t in tests if t.get("p") is not None)
    for test, p in zip(tests, adjusted):
        signed = test.get("mean", test.get("difference"))
        test.update(p_holm=p, family=size, verdict=verdict(signed, p, higher_is_better, alpha))
    return tests


def rate_cell(entry: Mapping | None) -> str:
    """``x of n (share; 95 % CI low-high)``, as tables print a rate."""
    if not entry or entry.get("n") is None:
        return "-"
    if not entry["n"]:
        return "0 of 0"
    return f"{entry['x']} of {entry['n']} ({entry['share']:.0%}; {entry['low']:.0%}-{entry['high']:.0%})"


def p_cell(p: float | None) -> str:
    """A p-value as tables print it: three significant digits, ``<0.001`` below that."""
    if p is None:
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3g}"


__all__ = ["ALPHA", "CONFIDENCE", "mean_ci", "t_central", "t_quantile", "LAST_K", "accuracy_at", "adjust_family", "clopper_pearson", "common_time", "compare_rates",
           "fisher_exact", "holm", "mean_of_last", "normal_quantile", "p_cell", "paired_difference", "rate", "rate_cell",
           "t_p_value", "trained", "verdict", "wilson"]
