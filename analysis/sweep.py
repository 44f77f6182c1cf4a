"""Aggregates of a sweep: mean and Student-t 95 % confidence interval per grid point.

A sweep repeats each grid point with different seeds; this module reduces the repetitions of
each point to ``n``, the mean and the half-width of the confidence interval of every metric
(final accuracy, ingress payload bytes, updates, training time), writes them as
``sweep.csv`` (numbers) and ``sweep.md`` (readable), and says which grid keys to plot.

The statistics (the Student-t interval, rates with exact intervals, the mean of the last
evaluations) are :mod:`analysis.outcomes`'; this module uses them and re-exports the t maths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import yaml

from analysis import outcomes
from analysis.outcomes import CONFIDENCE, mean_ci, t_central, t_quantile  # noqa: F401 - re-exported: sweep tables' maths

METRICS = ("final_accuracy", "ingress_payload_bytes", "egress_payload_bytes", "two_way_bytes_per_update", "updates", "duration_s")
SHARDED = ("busiest_server_ingress_bytes",)  # a column of its own where some run split its model over several servers
FAULTS = ("crashes", "lost_updates")  # columns of their own where a run of the table had a crash
PAIRED_INTRO = ("Each point against its baseline (the first value of the first grid key, the other keys equal), paired by "
                "repetition (the same seed), Holm-adjusted over the sweep's comparisons; 95 % Student-t intervals, pairs in "
                "brackets:")


def metrics_for(table: pd.DataFrame) -> tuple[str, ...]:
    """:data:`METRICS`, the busiest server's ingress where a run of the table had several servers,
    and the workers' crashes and the pushes they lost where a run had a crash."""
    several = "servers" in table and bool((table["servers"].fillna(1) > 1).any())
    crashed = "crashes" in table and bool((table["crashes"].fillna(0) > 0).any())
    return METRICS + (SHARDED if several else ()) + (tuple(m for m in FAULTS if m in table) if crashed else ())


# -- tables ------------------------------------------------------------------------------


def value_label(value) -> object:
    """A grid value as a table cell: numbers and strings as they are, mappings and lists as flow YAML."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1000).strip()


def aggregate(table: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str] | None = None,
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
    metrics = metrics_for(table) if metrics is None else metrics
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
        good = done[[outcomes.trained(r) for r in done.to_dict("records")]] if len(done) else done
        rate = outcomes.rate(len(done) - len(good), len(done), confidence)
        row.update(trained=len(good), not_trained=rate["x"], not_trained_low=rate["low"], not_trained_high=rate["high"])
        _, mean, half = mean_ci(good["final_accuracy_last_k"].tolist() if "final_accuracy_last_k" in good else [], confidence)
        row.update(trained_accuracy_mean=mean, trained_accuracy_ci95=half)
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
        "busiest_server_ingress_bytes": format_bytes,
        "egress_payload_bytes": format_bytes,
        "two_way_bytes_per_update": format_bytes,
        "updates": lambda v: f"{v:,.0f}",
        "duration_s": lambda v: f"{v:.1f} s",
        "crashes": lambda v: f"{v:,.1f}",
        "lost_updates": lambda v: f"{v:,.1f}",
    }.get(metric, lambda v: f"{v:.4g}")
    return fmt(mean) if math.isnan(half) else f"{fmt(mean)} ± {fmt(half)}"


def aggregate_rows(agg: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """Headers and text rows of the aggregate table (``mean ± half-width``), for Markdown and HTML;
    ``metrics``: by default every one :func:`aggregate` computed."""
    metrics = [m for m in METRICS + SHARDED + FAULTS if f"{m}_mean" in agg] if metrics is None else metrics
    headers = [*keys, "runs (completed)", "diverged or dead (95% CI, exact)",
               f"final accuracy, trained runs (mean of last {outcomes.LAST_K} evaluations ± 95% CI)",
               *(f"{m} (mean ± 95% CI)" for m in metrics)]
    rows = []
    for row in agg.to_dict("records"):  # not iterrows: it would turn whole numbers into floats
        marked = f"; {row['flagged']}" if row.get("flagged") else ""
        rate = ({"x": row["not_trained"], "n": row["n"], "share": row["not_trained"] / row["n"] if row["n"] else None,
                 "low": row["not_trained_low"], "high": row["not_trained_high"]} if "not_trained" in row else None)
        rows.append([str(row[k]) for k in keys] + [f"{row['runs']} ({row['n']}{marked})", outcomes.rate_cell(rate),
                     _cell("final_accuracy", row.get("trained_accuracy_mean", math.nan), row.get("trained_accuracy_ci95", math.nan))]
                    + [_cell(m, row[f"{m}_mean"], row[f"{m}_ci95"]) for m in metrics])
    return headers, rows


def paired_to_first(table: pd.DataFrame, keys: Sequence[str], confidence: float = CONFIDENCE) -> tuple[list[str], list[list[str]]]:
    """Each grid point against its baseline, run by run: the point with the first value of the first
    grid key and the same values of the others. Repetition r of every point has the same seed, so
    the differences are paired. Per point: the rates of runs that diverged or died (Fisher's exact
    test), final accuracy (mean of the last evaluations; pairs where both runs trained) and updates
    applied (pairs where both completed), each a paired Student-t interval and p-value,
    Holm-adjusted over the sweep's comparisons (one family per quantity). No rows for a table
    without repetitions or a first key with one value."""
    if table.empty or not keys or "repetition" not in table or "point" not in table:
        return [], []
    labelled = table.assign(**{k: table[k].map(lambda v: str(value_label(v))) for k in keys})
    order = labelled.drop_duplicates("point").sort_values("point")
    if order[keys[0]].nunique() < 2:
        return [], []
    done = labelled[labelled["status"] == "completed"] if "status" in labelled else labelled

    def by_repetition(point) -> dict:
        return {int(r["repetition"]): r for r in done[done["point"] == point].to_dict("records")}

    baselines: dict[tuple, int] = {}
    compared = []
    for row in order.to_dict("records"):
        rest = tuple(row[k] for k in keys[1:])
        if rest not in baselines:
            baselines[rest] = row["point"]
        else:
            compared.append((row, baselines[rest]))
    tests: dict[str, list[dict]] = {"rate": [], "accuracy": [], "updates": []}
    for row, baseline in compared:
        mine, first = by_repetition(row["point"]), by_repetition(baseline)
        not_trained = [sum(not outcomes.trained(r) for r in runs.values()) for runs in (mine, first)]
        tests["rate"].append(outcomes.compare_rates(not_trained[0], len(mine), not_trained[1], len(first)))
        common = sorted(set(mine) & set(first))
        tests["accuracy"].append(outcomes.paired_difference(
            [(mine[i].get("final_accuracy_last_k"), first[i].get("final_accuracy_last_k")) for i in common
             if outcomes.trained(mine[i]) and outcomes.trained(first[i])], confidence))
        tests["updates"].append(outcomes.paired_difference([(mine[i].get("updates"), first[i].get("updates")) for i in common],
                                                           confidence))
    for family in tests.values():
        outcomes.adjust_family(family)
    word = {"A better": "higher", "B better": "lower"}

    def difference(test: dict, form: str) -> str:
        if test.get("mean") is None:
            return "-"
        half = "" if test.get("half_width") is None else f" ± {test['half_width']:{form}}"
        return (f"{test['mean']:+{form}}{half} ({test['n']}); p {outcomes.p_cell(test.get('p'))}, Holm "
                f"{outcomes.p_cell(test.get('p_holm'))}: {word.get(test['verdict'], test['verdict'])}")

    headers = [*keys, f"against {keys[0]} =", "diverged or dead: this point against its baseline (Fisher's exact p, Holm)",
               f"final accuracy minus the baseline's (trained pairs; mean of last {outcomes.LAST_K} evaluations)",
               "updates minus the baseline's"]
    rows = []
    for (row, baseline), rate, accuracy, updates in zip(compared, tests["rate"], tests["accuracy"], tests["updates"]):
        rows.append([*(row[k] for k in keys), order[order["point"] == baseline][keys[0]].iloc[0],
                     f"{rate['a']['x']} of {rate['a']['n']} against {rate['b']['x']} of {rate['b']['n']}; p "
                     f"{outcomes.p_cell(rate['p'])}, Holm {outcomes.p_cell(rate['p_holm'])}",
                     difference(accuracy, ".4f"), difference(updates, ",.0f")])
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
    table = collection.table()  # one pass over the runs' summaries, for both tables
    agg = aggregate(table, keys)
    agg.to_csv(out / "sweep.csv", index=False)
    headers, rows = aggregate_rows(agg, keys)
    repeat = collection.sweep.get("repeat")
    text = [f"# Sweep {collection.sweep.get('name', collection.path.name)}", "",
            f"Mean and {CONFIDENCE:.0%} confidence interval (Student t) across {repeat or 'the'} repetitions of each grid point;",
            "runs that did not complete are counted but not averaged. A run that diverged or died is a yes/no outcome: its "
            "rate has the exact (Clopper-Pearson) interval, and final accuracy is the mean of each trained run's last "
            f"{outcomes.LAST_K} evaluations, over the runs that trained only.", "", markdown_table(headers, rows)]
    headers, rows = paired_to_first(table, keys)
    if rows:
        text += ["", PAIRED_INTRO, "", markdown_table(headers, rows)]
    (out / "sweep.md").write_text("\n".join(text))
    return agg


__all__ = ["FAULTS", "METRICS", "PAIRED_INTRO", "SHARDED", "aggregate", "aggregate_rows", "markdown_table", "mean_ci", "metrics_for", "paired_to_first", "plotted_keys", "t_central",
           "t_quantile", "value_label", "write_tables"]
