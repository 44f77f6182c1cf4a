"""The report of a run or of many runs: PNG figures, ``report.md`` and ``report.html`` in ``<dir>/report/``.

:func:`build_report` takes a run directory, a sweep directory (``sweep.json``) or a folder of
run directories. A report is a list of blocks (heading, paragraph, table, figure, list)
rendered twice, as Markdown and as HTML that shows the same tables and embeds the same PNGs by
relative path, so the folder can be moved or served as it is. Figures whose data is absent
(interface counters on the local backend) are left out and the report says why.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from emulator.planning.units import format_bytes

from analysis import figures
from analysis.runs import (
    Collection, Run, accuracy_with_ingress, ingress_per_second, is_run_dir, is_sweep_dir, load_collection, load_run, summary_row,
    traffic_both_ways, worker_shares,
)
from analysis.sweep import aggregate_rows, markdown_table, plotted_keys, value_label, write_tables

REPORT_DIR = "report"
SUMMARY_HEADERS = ["run", "status", "method", "workers", "final accuracy", "updates", "ingress payload",
                   "ingress on wire", "egress payload", "egress on wire", "two-way / update", "duration", "faults"]


# -- blocks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    kind: str  # h1 | h2 | p | table | figure | list
    text: str = ""
    headers: tuple = ()
    rows: tuple = ()
    src: str = ""  # figure: file name relative to the report directory


def render_markdown(blocks: list[Block]) -> str:
    out = []
    for b in blocks:
        if b.kind == "h1":
            out.append(f"# {b.text}\n")
        elif b.kind == "h2":
            out.append(f"## {b.text}\n")
        elif b.kind == "p":
            out.append(f"{b.text}\n")
        elif b.kind == "table":
            out.append(markdown_table(b.headers, b.rows))
        elif b.kind == "figure":
            out.append(f"![{b.text.split(':')[0]}]({b.src})\n\n*{b.text}*\n")
        elif b.kind == "list":
            out.append("".join(f"- {item}\n" for item in b.rows))
    return "\n".join(out)


_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; }
th { background: #f3f3f3; }
td { font-variant-numeric: tabular-nums; white-space: nowrap; }
.table { overflow-x: auto; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
"""


def _inline_html(text: str) -> str:
    """Escape, then turn Markdown's `code` and [text](link) into HTML."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", lambda m: f'<a href="{html.escape(m.group(2))}">{m.group(1)}</a>', out)


def render_html(blocks: list[Block], title: str) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
           f"<style>{_STYLE}</style></head><body>"]
    for b in blocks:
        if b.kind in ("h1", "h2"):
            out.append(f"<{b.kind}>{html.escape(b.text)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{_inline_html(b.text)}</p>")
        elif b.kind == "table":
            head = "".join(f"<th>{html.escape(str(h))}</th>" for h in b.headers)
            body = "".join("<tr>" + "".join(f"<td>{_inline_html(str(c))}</td>" for c in row) + "</tr>" for row in b.rows)
            out.append(f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')
        elif b.kind == "figure":
            out.append(f'<figure><img src="{html.escape(b.src)}" alt="{html.escape(b.text)}">'
                       f"<figcaption>{html.escape(b.text)}</figcaption></figure>")
        elif b.kind == "list":
            out.append("<ul>" + "".join(f"<li>{_inline_html(str(item))}</li>" for item in b.rows) + "</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _write(out: Path, blocks: list[Block], title: str) -> None:
    (out / "report.md").write_text(render_markdown(blocks))
    (out / "report.html").write_text(render_html(blocks, title))


def _figure_block(out: Path, name: str, fig, caption: str, skipped: list[str], why_absent: str) -> list[Block]:
    """Save ``fig`` as ``name`` and return its block; when it is None, note why in ``skipped``."""
    if fig is None:
        skipped.append(f"{caption.split(':')[0]}: {why_absent}")
        return []
    figures.save(fig, out / name)
    return [Block("figure", caption, src=name)]


# -- cells -------------------------------------------------------------------------------


def _fmt(value, kind: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == "bytes":
        return f"{format_bytes(value)} ({int(value):,} B)"
    if kind == "accuracy":
        return f"{value:.4f}"
    if kind == "seconds":
        return f"{value:.1f} s"
    if kind == "count":
        return f"{int(value):,}"
    return str(value)


def _faults(counts: dict) -> str:
    return ", ".join(f"{action} {count}" for action, count in counts.items()) or "none"


def summary_cells(row: dict, link: str | None = None) -> list[str]:
    """One line of the summary table from :func:`analysis.runs.summary_row`."""
    run = f"[{row['run_id']}]({link})" if link else f"`{row['run_id']}`"
    return [run, row["status"], row["method"], _fmt(row["workers"], "count"), _fmt(row["final_accuracy"], "accuracy"),
            _fmt(row["updates"], "count"), _fmt(row["ingress_payload_bytes"], "bytes"), _fmt(row["ingress_wire_bytes"], "bytes"),
            _fmt(row.get("egress_payload_bytes"), "bytes"), _fmt(row.get("egress_wire_bytes"), "bytes"),
            _fmt(row.get("two_way_bytes_per_update"), "bytes"), _fmt(row["duration_s"], "seconds"), _faults(row["faults"])]


# -- one run -----------------------------------------------------------------------------


def _details(run: Run) -> list[list[str]]:
    s, plan = run.summary, run.plan
    method = plan.get("method", {})
    items = [
        ("scenario", s.get("name") or plan.get("name")),
        ("backend", s.get("backend")),
        ("model", plan.get("model")),
        ("dataset", s.get("dataset") or plan.get("dataset", {}).get("name")),
        ("method", f"{method.get('name')}: compressor {method.get('compressor')}"
         + "".join(f", {k}={v}" for k, v in (method.get("params") or {}).items()) + f", rule {method.get('rule')}"
         + (", error feedback" if method.get("error_feedback") else "") if method else None),
        ("seed", s.get("seed", plan.get("seed"))),
        ("parameters", _fmt(s.get("parameters"), "count") if s.get("parameters") else None),
        ("boot before training", _fmt(s.get("boot_s"), "seconds") if s.get("boot_s") is not None else None),
        ("updates per second", s.get("updates_per_s")),
        ("ingress on wire / payload", s.get("wire_overhead_ratio")),
        ("updates lost with a crash", s.get("lost_updates")),
        ("frames refused / late", f"{s.get('rejected_frames')} / {s.get('late_updates')}" if "rejected_frames" in s else None),
        ("why training ended", s.get("done_reason")),
        ("error", s.get("error")),
    ]
    return [[k, str(v)] for k, v in items if v not in (None, "", "None")]


def _device_maps(plan: dict) -> tuple[dict, dict, dict]:
    devices = [d for d in (plan.get("server"), plan.get("evaluator"), *plan.get("workers", [])) if d]
    quotas = {d["name"]: d["cpus"] for d in devices}
    groups = {w["index"]: w["group"] for w in plan.get("workers", [])}
    cpus = {w["index"]: w["cpus"] for w in plan.get("workers", [])}
    return quotas, groups, cpus


def run_figures(run: Run, out: Path, skipped: list[str]) -> list[Block]:
    """Draw every figure of one run into ``out``; returns their blocks, notes what was skipped."""
    label = run.method
    acc = accuracy_with_ingress(run.accuracy, run.updates)
    quotas, groups, cpus = _device_maps(run.plan)
    no_acc = "no evaluation recorded (accuracy.jsonl empty or absent)"
    blocks: list[Block] = []
    blocks += _figure_block(out, "accuracy_ingress.png", figures.accuracy_vs_ingress({label: acc}),
                            "Accuracy against ingress: test accuracy against the cumulative payload the server received "
                            "(updates applied up to each evaluated version; log scale).", skipped, no_acc)
    blocks += _figure_block(out, "accuracy_time.png", figures.accuracy_vs_time({label: acc}),
                            "Accuracy over time: test accuracy of each evaluated snapshot against training time.", skipped, no_acc)
    blocks += _figure_block(out, "accuracy_updates.png", figures.accuracy_vs_updates({label: acc}),
                            "Accuracy over updates: test accuracy against the number of updates applied.", skipped, no_acc)
    blocks += _figure_block(out, "ingress_rate.png", figures.ingress_rate(ingress_per_second(run.traffic, run.worker_names), run.faults),
                            "Ingress rate: bytes per second each worker pushed to the server (stacked), faults as dashed lines.",
                            skipped, "no traffic recorded (traffic.jsonl empty or absent)")
    blocks += _figure_block(out, "traffic_both_ways.png", figures.traffic_both_ways({label: traffic_both_ways(run.traffic)}),
                            "Both directions: bytes per second the workers pushed to the server and the server sent them "
                            "(replies and pulls), 5-second moving average.", skipped, "no traffic recorded (traffic.jsonl empty or absent)")
    blocks += _figure_block(out, "staleness.png", figures.staleness_histogram({label: run.updates}),
                            "Staleness: how many updates the server applied between a worker's pull and its push.",
                            skipped, "no update applied (updates.jsonl empty or absent)")
    blocks += _figure_block(out, "worker_share.png", figures.worker_share(worker_shares(run.updates, run.worker_names), groups, cpus),
                            "Worker share: each worker's share of the applied updates.", skipped, "no update applied")
    blocks += _figure_block(out, "cpu.png", figures.cpu_utilisation(run.stats, quotas, run.faults),
                            "CPU: CPU-seconds per second used by each device (dotted: planned quota).",
                            skipped, "no CPU samples (stats.jsonl empty or absent)")
    blocks += _figure_block(out, "link.png", figures.link_utilisation(run.net, run.faults),
                            "Links: bytes per second on each device's network interface.",
                            skipped, "no interface counters (net.jsonl is written by the docker backend only)")
    if figures.traced_link_steps(run.plan):  # runs with link traces (docs/TRACES.md)
        blocks += _figure_block(out, "traced_links.png", figures.traced_links(run.plan, run.net),
                                "Traced links: each traced worker's configured rate (dashed: the trace's steps in the plan) and the "
                                "rate measured on its interface (solid); a worker sends only when it has something to push, so "
                                "the measured rate reaches the configured one while a push fills the link.",
                                skipped, "no interface counters (net.jsonl is written by the docker backend only)")
    return blocks


def run_report(run: Run, out: Path) -> list[Block]:
    row = summary_row(run)
    blocks = [Block("h1", f"Run {run.run_id}")]
    if not run.summary:
        blocks.append(Block("p", "No `summary.json`: the run did not finish (killed or still running). "
                                 "The numbers below are rebuilt from the traces written so far."))
    blocks += [Block("h2", "Summary"), Block("table", headers=tuple(SUMMARY_HEADERS), rows=(tuple(summary_cells(row)),)),
               Block("table", headers=("detail", "value"), rows=tuple(tuple(r) for r in _details(run)))]
    skipped: list[str] = []
    figure_blocks = run_figures(run, out, skipped)
    blocks += [Block("h2", "Figures"), *figure_blocks]
    if skipped:
        blocks += [Block("h2", "Not drawn"), Block("list", rows=tuple(skipped))]
    blocks.append(Block("p", "Times are seconds since training started (`ts - training_started_ts`); "
                             "ingress payload counts every frame the workers pushed, headers included."))
    return blocks


# -- many runs ---------------------------------------------------------------------------


def _short_key(key: str) -> str:
    return re.sub(r"\[\d+\]", "", key).rsplit(".", 1)[-1]


def _point_label(values: dict, keys: list[str]) -> str:
    return ", ".join(f"{_short_key(k)}={value_label(values.get(k))}" for k in keys)


def collection_figures(c: Collection, agg: pd.DataFrame | None, out: Path, skipped: list[str]) -> list[Block]:
    keys = list(c.grid)
    varying = [k for k in keys if len(c.grid[k]) > 1]
    blocks: list[Block] = []
    if agg is not None and len(agg):
        for x in plotted_keys(c.grid):
            series = [k for k in varying if k != x]
            for metric, what in (("final_accuracy", "final test accuracy"), ("ingress_payload_bytes", "ingress payload at the server")):
                name = f"sweep_{_slug(x)}_{metric}.png"
                blocks += _figure_block(out, name, figures.sweep_metric(agg, x, metric, series),
                                        f"Sweep: {what} against {x}, mean and 95% confidence interval over repetitions"
                                        + (f", one line per {', '.join(series)}" if series else "") + ".",
                                        skipped, f"no completed run has {metric}")
    # Overlays: one colour per grid point (repetitions share it), or per run for a plain folder.
    accuracy, updates, by_method = {}, {}, {}
    for run in c.runs:
        values = c.values.get(run.path.name)
        label = _point_label(values, varying) if values and varying else f"{run.run_id} ({run.method})"
        accuracy.setdefault(label, []).append(accuracy_with_ingress(run.accuracy, run.updates))
        updates.setdefault(label, []).append(run.updates)
        by_method.setdefault(run.method, []).append(run.updates)
    no_acc = "no run recorded an evaluation"
    blocks += _figure_block(out, "accuracy_ingress.png", figures.accuracy_vs_ingress(accuracy),
                            "Accuracy against ingress, every run (log scale); repetitions of a grid point share a colour "
                            "(solid, dashed, dotted: repetition 0, 1, 2).",
                            skipped, no_acc)
    blocks += _figure_block(out, "accuracy_time.png", figures.accuracy_vs_time(accuracy),
                            "Accuracy over time, every run.", skipped, no_acc)
    blocks += _figure_block(out, "accuracy_updates.png", figures.accuracy_vs_updates(accuracy),
                            "Accuracy over updates, every run.", skipped, no_acc)
    staleness = by_method if len(by_method) > 1 else updates
    blocks += _figure_block(out, "staleness.png", figures.staleness_histogram(staleness),
                            "Staleness distribution " + ("per method" if len(by_method) > 1 else "per grid point")
                            + " (fraction of each one's updates).", skipped, "no run applied an update")
    return blocks


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "-", text).strip("-")


def collection_report(c: Collection, out: Path, per_run: bool) -> list[Block]:
    keys = list(c.grid)
    table = c.table()
    blocks: list[Block] = []
    agg = None
    if c.is_sweep:
        s = c.sweep
        blocks += [Block("h1", f"Sweep {s.get('name', c.path.name)}"),
                   Block("p", f"Scenario `{s.get('scenario')}`, {len(s.get('points', []))} grid points x {s.get('repeat')} "
                              f"repetition(s), backend {s.get('backend')}. Seeds: {s.get('seed_rule', '')}"),
                   Block("table", headers=("grid key", "values"),
                         rows=tuple((k, ", ".join(str(value_label(v)) for v in vs)) for k, vs in c.grid.items()))]
        if s.get("overrides"):
            blocks.append(Block("p", "Overrides for every run: " + ", ".join(f"`{o}`" for o in s["overrides"])))
        agg = write_tables(c)
        headers, rows = aggregate_rows(agg, keys)
        blocks += [Block("h2", "Per grid point"),
                   Block("p", "Mean ± half-width of the 95% confidence interval (Student t) across repetitions; "
                              "only completed runs are averaged (also in `sweep.csv` and `sweep.md`)."),
                   Block("table", headers=tuple(headers), rows=tuple(tuple(r) for r in rows))]
    else:
        blocks.append(Block("h1", f"Runs in {c.path.name}"))
    skipped: list[str] = []
    figure_blocks = collection_figures(c, agg, out, skipped)
    run_rows = []
    for run, row in zip(c.runs, table.to_dict("records")):
        link = None
        if per_run:
            build_report(run.path)
            link = f"../{run.path.name}/{REPORT_DIR}/report.html"
        run_rows.append(tuple([str(value_label(row[k])) for k in keys] + summary_cells(summary_row(run), link)))
    blocks += [Block("h2", "Runs"), Block("table", headers=tuple([*keys, *SUMMARY_HEADERS]), rows=tuple(run_rows))]
    if c.missing:
        blocks.append(Block("list", rows=tuple(f"`{m['run_id']}` (grid point {m['point']}): {m.get('status', 'not run')}, no run directory"
                                               for m in c.missing)))
    blocks += [Block("h2", "Figures"), *figure_blocks]
    if skipped:
        blocks += [Block("h2", "Not drawn"), Block("list", rows=tuple(skipped))]
    if not per_run:
        blocks.append(Block("p", "Each run's own figures: `emulate report <sweep>/<run>` (or `emulate report --runs` here)."))
    return blocks


# -- entry point -------------------------------------------------------------------------


def build_report(path: str | Path, *, per_run: bool = False) -> Path:
    """Write the report of a run, sweep or folder of runs into ``<path>/report/``; returns that folder.

    ``per_run``: for many runs, also build each run's own report and link it from the runs table.
    """
    path = Path(path)
    out = path / REPORT_DIR
    single = is_run_dir(path) and not is_sweep_dir(path)
    runs = None if single else load_collection(path)  # FileNotFoundError before anything is written
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.png"):
        old.unlink()  # a figure that is not drawn this time must not linger from the last report
    if runs is None:
        run = load_run(path)
        _write(out, run_report(run, out), f"Run {run.run_id}")
    else:
        title = f"Sweep {runs.sweep.get('name', path.name)}" if runs.is_sweep else f"Runs in {path.name}"
        _write(out, collection_report(runs, out, per_run), title)
    return out


__all__ = ["Block", "build_report", "render_html", "render_markdown", "run_report", "collection_report", "summary_cells"]
