"""Aggregates of a sweep: mean and Student-t 95 % confidence interval per grid point.

A sweep repeats each grid point with different seeds; this module reduces the repetitions of
each point to ``n``, the mean and the half-width of the confidence interval of every metric
(final accuracy, ingress payload bytes, updates, training time), writes them as
``sweep.csv`` (numbers) and ``sweep.md`` (readable), and says which grid keys to plot.

The maths is pure and has no dependency beyond the standard library: :func:`t_quantile` is
the Student t quantile for whole degrees of freedom, from the closed form of the t
distribution (Abramowitz & Stegun 26.7.3-4) inverted by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
import yaml

METRICS = ("final_accuracy", "ingress_payload_bytes", "egress_payload_bytes", "two_way_bytes_per_update", "updates", "duration_s")
CONFIDENCE = 0.95


# -- the maths ---------------------------------------------------------------------------


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


# -- tables ------------------------------------------------------------------------------


def value_label(value) -> object:
    """A grid value as a table cell: numbers and strings as they are, mappings and lists as flow YAML."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000).strip()


def aggregate(table: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str] = METRICS,
              confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per grid point: its key values, ``runs``, ``n`` (completed runs), ``flagged`` (how
    many of those diverged or ended dead, :func:`flagged`), and per metric
    ``<metric>_mean``, ``<metric>_ci95`` (half-width) and ``<metric>_low``/``_high``.

    ``table`` has one row per run (:meth:`analysis.runs.Collection.table`): the grid keys, a
    ``point`` index (else the key values identify a point), ``status`` and the metrics. Runs
    whose status is not ``completed`` are counted in ``runs`` but not in the statistics.
    """
    if table.empty:
        return pd.DataFrame(columns=[*keys, "runs", "n"])
    labelled = table.assign(**{k: table[k].map(value_label) for k in keys})
    by = ["point"] if "point" in labelled else list(keys)
    rows = []
    for _, group in labelled.groupby(by, sort=True, dropna=False) if by else [((), labelled)]:
        done = group[group["status"] == "completed"] if "status" in group else group
        row = {k: group[k].iloc[0] for k in keys}
        if "point" in group:
            row["point"] = int(group["point"].iloc[0])  # so a report can attach per-point notes (failures)
        row["runs"] = len(group)
        row["n"] = len(done)
        row["flagged"] = flagged(done)
        for metric in metrics:
            _, mean, half = mean_ci(done[metric].tolist() if metric in done else [], confidence)
            row.update({f"{metric}_mean": mean, f"{metric}_ci95": half, f"{metric}_low": mean - half, f"{metric}_high": mean + half})
        rows.append(row)
    return pd.DataFrame(rows)


def flagged(runs: pd.DataFrame) -> str:
    """How many of ``runs`` diverged or ended dead (``emulator.control.summary``'s outcome): ``"1 diverged, 2 dead"``."""
    from emulator.control.summary import FLAGGED

    outcomes = runs["outcome"].tolist() if "outcome" in runs else []
    return ", ".join(f"{outcomes.count(o)} {o}" for o in FLAGGED if o in outcomes)


def plotted_keys(grid: dict[str, list]) -> list[str]:
    """The varying grid keys worth an x axis: not the method (``method``, ``method.name``: a
    method is a line, not an axis) nor other keys whose values are all strings, unless nothing
    else varies."""
    varying = [k for k, values in grid.items() if len(values) > 1]
    axes = [k for k in varying if not (k == "method" or k.startswith("method.") or all(isinstance(v, str) for v in grid[k]))]
    return axes or varying


def _cell(metric: str, mean: float, half: float) -> str:
    from emulator.planning.units import format_bytes

    if mean is None or math.isnan(mean):
        return "-"
    fmt = {
        "final_accuracy": lambda v: f"{v:.4f}",
        "ingress_payload_bytes": format_bytes,
        "egress_payload_bytes": format_bytes,
        "two_way_bytes_per_update": format_bytes,
        "updates": lambda v: f"{v:,.0f}",
        "duration_s": lambda v: f"{v:.1f} s",
    }.get(metric, lambda v: f"{v:.4g}")
    return fmt(mean) if math.isnan(half) else f"{fmt(mean)} ± {fmt(half)}"


def aggregate_rows(agg: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str] = METRICS) -> tuple[list[str], list[list[str]]]:
    """Headers and text rows of the aggregate table (``mean ± half-width``), for Markdown and HTML."""
    headers = [*keys, "runs (completed)", *(f"{m} (mean ± 95% CI)" for m in metrics)]
    rows = []
    for row in agg.to_dict("records"):  # not iterrows: it would turn whole numbers into floats
        marked = f"; {row['flagged']}" if row.get("flagged") else ""
        rows.append([str(row[k]) for k in keys] + [f"{row['runs']} ({row['n']}{marked})"]
                    + [_cell(m, row[f"{m}_mean"], row[f"{m}_ci95"]) for m in metrics])
    return headers, rows


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table (pipes in cells escaped)."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(headers), line(["---"] * len(headers)), *(line(r) for r in rows)]) + "\n"


def write_tables(collection, out: str | Path | None = None) -> pd.DataFrame:
    """Write ``sweep.csv`` and ``sweep.md`` for a sweep (:class:`analysis.runs.Collection`) into
    ``out`` (default: the sweep directory); returns the aggregate table."""
    out = Path(out or collection.path)
    keys = list(collection.grid)
    agg = aggregate(collection.table(), keys)
    agg.to_csv(out / "sweep.csv", index=False)
    headers, rows = aggregate_rows(agg, keys)
    repeat = collection.sweep.get("repeat")
    text = [f"# Sweep {collection.sweep.get('name', collection.path.name)}", "",
            f"Mean and {CONFIDENCE:.0%} confidence interval (Student t) across {repeat or 'the'} repetitions of each grid point;",
            "runs that did not complete are counted but not averaged.", "", markdown_table(headers, rows)]
    (out / "sweep.md").write_text("\n".join(text))
    return agg


__all__ = ["METRICS", "aggregate", "aggregate_rows", "markdown_table", "mean_ci", "plotted_keys", "t_central",
           "t_quantile", "value_label", "write_tables"]
