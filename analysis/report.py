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
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from emulator.planning.units import format_bytes, format_duration, format_rate

from analysis import figures
from analysis.bounds import BUSY, short_label, worker_bounds
from analysis.runs import (
    Collection, Run, accuracy_with_ingress, ingress_per_second, is_run_dir, is_sweep_dir, load_collection, load_json, load_run, summary_row,
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
        ("backend", s.get("backend") + (" (virtual time: every time in this report is simulated seconds; calibration.json)"
                                          if s.get("clock") == "virtual" else "") if s.get("backend") else s.get("backend")),
        ("model", plan.get("model")),
        ("dataset", s.get("dataset") or plan.get("dataset", {}).get("name")),
        ("method", f"{method.get('name')}: compressor {method.get('compressor')}"
         + "".join(f", {k}={v}" for k, v in (method.get("params") or {}).items()) + f", rule {method.get('rule')}"
         + (", error feedback" if method.get("error_feedback") else "") + _federated(method) if method else None),
        ("rounds", _rounds(s.get("rounds"))),
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


def _federated(method: dict) -> str:
    """``, local steps 10, aggregation fedavg (sample=3, deadline_s=20.0)``; empty for a parameter-server method."""
    local, aggregation = method.get("local"), method.get("aggregation") or {}
    words = ""
    if local:
        words += f", local {'steps ' + str(local['steps']) if local.get('steps') else 'epochs ' + str(local.get('epochs'))}"
    if aggregation.get("name") not in (None, "per_push"):
        params = ", ".join(f"{k}={v}" for k, v in (aggregation.get("params") or {}).items())
        words += f", aggregation {aggregation['name']}" + (f" ({params})" if params else "")
    return words


def _rounds(rounds: dict | None) -> str | None:
    """A federated run's rounds in one line (summary.json's ``rounds``)."""
    if not rounds:
        return None
    return (f"{rounds['count']:,}: mean {rounds.get('mean_duration_s')} s, {rounds.get('mean_participants')} participants, "
            f"{rounds.get('stragglers_dropped', 0)} stragglers dropped; {_fmt(rounds.get('up_bytes_per_round'), 'bytes')} up, "
            f"{_fmt(rounds.get('down_bytes_per_round'), 'bytes')} down per round")


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
    bounds = worker_bounds(run)
    labels = {int(r["worker"]): short_label(r) for r in bounds.to_dict("records")} if len(bounds) else None
    blocks += _figure_block(out, "worker_share.png", figures.worker_share(worker_shares(run.updates, run.worker_names), groups, cpus,
                                                                           labels),
                            "Worker share: each worker's share of the applied updates; under each worker, what bounded it "
                            "(the most used of its CPU quota, uplink and downlink, or the server when none was half used).",
                            skipped, "no update applied")
    blocks += _figure_block(out, "cpu.png", figures.cpu_utilisation(run.stats, quotas, run.faults),
                            "CPU: CPU-seconds per second used by each device (dotted: planned quota).",
                            skipped, "no CPU samples (stats.jsonl empty or absent)")
    blocks += _figure_block(out, "link.png", figures.link_utilisation(run.net, run.faults, _configured_links(run.plan)),
                            "Links: bytes per second on each device's network interface; dotted, the configured rate "
                            "(downlink above, uplink below; for many workers, their median).",
                            skipped, "no interface counters (net.jsonl is written by the docker backend only)")
    if figures.traced_link_steps(run.plan):  # runs with link traces (docs/TRACES.md)
        blocks += _figure_block(out, "traced_links.png", figures.traced_links(run.plan, run.net),
                                "Traced links: each traced worker's configured rate (dashed: the trace's steps in the plan) and the "
                                "rate measured on its interface (solid); a worker sends only when it has something to push, so "
                                "the measured rate reaches the configured one while a push fills the link.",
                                skipped, "no interface counters (net.jsonl is written by the docker backend only)")
    return blocks


def _configured_links(plan: dict) -> dict[str, dict]:
    devices = [d for d in (plan.get("server"), plan.get("evaluator"), *plan.get("workers", [])) if d]
    return {d["name"]: d.get("link") or {} for d in devices}


MAX_DEVICE_ROWS = 100  # devices listed in the configuration table; the rest are counted


def _rate(bps) -> str:
    return format_rate(bps) if isinstance(bps, (int, float)) and bps else "unshaped"


def device_rows(plan: dict, mechanisms: dict) -> list[tuple]:
    """The configuration table: every device as planned, and what realised each property here."""
    rows = []
    for d in [d for d in (plan.get("server"), plan.get("evaluator"), *plan.get("workers", [])) if d][:MAX_DEVICE_ROWS]:
        link = d.get("link") or {}
        mech = mechanisms.get(d["name"], {})
        used = "; ".join(f"{k}: {v}" for k, v in mech.items() if isinstance(v, str) and v != "unshaped" and k != "boot")
        rows.append((d["name"], d.get("group", ""), f"{d.get('cpus', 0):.3g}", format_bytes(d.get("memory_bytes") or 0),
                     _rate(link.get("uplink_bps")), _rate(link.get("downlink_bps")),
                     format_duration(link.get("delay_s") or 0) if link.get("delay_s") else "-",
                     format_duration(link.get("jitter_s") or 0) if link.get("jitter_s") else "-",
                     f"{link['loss']:.3%}" if link.get("loss") else "-", used or "-"))
    return rows


def _rate3(bps: float) -> str:
    """A measured rate to three significant digits: ``999kbit``, ``2mbit``."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale * 0.9995:
            return f"{bps / scale:.3g}{unit}"
    return f"{bps:.3g}bit"


_FIDELITY_UNITS = {"uplink_bps": _rate3, "downlink_bps": _rate3, "rtt_s": lambda v: f"{v * 1000:.1f} ms",
                   "cpu_quota": lambda v: f"{v:.3g} cores", "cpu_share": lambda v: f"{v:.3g} cores"}
_FIDELITY_NAMES = {"uplink_bps": "uplink (TCP goodput)", "downlink_bps": "downlink (TCP goodput)", "rtt_s": "round trip",
                   "cpu_quota": "CPU quota (read back)", "cpu_share": "CPU share under load"}


def fidelity_rows(report: dict) -> list[tuple]:
    """The fidelity check's own results: configured against measured, per device and property."""
    rows = []
    for device, checks in (report.get("devices") or {}).items():
        for prop, row in (checks or {}).items():
            if not isinstance(row, dict) or (row.get("configured") is None and row.get("measured") is None):
                continue
            show = _FIDELITY_UNITS.get(prop, lambda v: f"{v:.4g}")
            cell = lambda v: show(v) if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else "-"  # noqa: E731
            rel = row.get("relative_error")
            verdict = {True: "yes", False: "**no**", None: "-"}.get(row.get("ok"), "-")
            rows.append((device, _FIDELITY_NAMES.get(prop, prop), cell(row.get("configured")), cell(row.get("measured")),
                         f"{rel:+.1%}" if isinstance(rel, (int, float)) else "-", verdict))
    return rows


def bound_rows(bounds: pd.DataFrame) -> list[tuple]:
    def share(value, of: str) -> str:
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.0%} of {of}"

    return [(r["device"], r["group"] or "", share(r["cpu_share"], f"{r['cpus']:.3g} cpu"),
             share(r["up_share"], _rate(r["uplink_bps"])) if r["uplink_bps"] else "unshaped",
             share(r["down_share"], _rate(r["downlink_bps"])) if r["downlink_bps"] else "unshaped", r["bound"])
            for r in bounds.to_dict("records")]


def server_rows(servers: list[dict]) -> list[tuple[str, ...]]:
    """One row per server of a sharded run (``summary.json``'s ``servers``)."""
    def size(value):
        return "-" if value is None else format_bytes(value)

    return [(s.get("name", "?"), f"{s.get('updates', 0):,}", size(s.get("ingress_payload_bytes")), size(s.get("egress_payload_bytes")),
             size(s.get("ingress_wire_bytes")), size(s.get("egress_wire_bytes"))) for s in servers]


def run_report(run: Run, out: Path) -> list[Block]:
    row = summary_row(run)
    blocks = [Block("h1", f"Run {run.run_id}")]
    if not run.summary:
        damaged = (run.path / "summary.json").exists()
        blocks.append(Block("p", ("`summary.json` is damaged (see the notes at the end): " if damaged else
                                  "No `summary.json`: the run did not finish (killed or still running). ")
                                 + "The numbers below are rebuilt from the traces written so far."))
    blocks += [Block("h2", "Summary"), Block("table", headers=tuple(SUMMARY_HEADERS), rows=(tuple(summary_cells(row)),)),
               Block("table", headers=("detail", "value"), rows=tuple(tuple(r) for r in _details(run)))]
    servers = run.summary.get("servers") or []
    if servers:
        blocks += [Block("h2", "Servers"),
                   Block("p", f"The model split over {len(servers)} server processes (`server.shards`), each its own CPU quota "
                              "and link: what each applied and carried both ways (payload as the protocol counts it; wire as "
                              "its interface counted it, headers and retransmissions included)."),
                   Block("table", headers=("server", "updates", "ingress payload", "egress payload", "ingress wire", "egress wire"),
                         rows=tuple(server_rows(servers)))]
    mechanisms = load_json(run.path, "mechanisms.json")
    devices = device_rows(run.plan, mechanisms)
    if devices:
        total = 2 + len(run.plan.get("workers", []))
        blocks += [Block("h2", "Devices as configured"),
                   Block("p", "Each device as the plan drew it (`plan.json`), and the mechanism that realised each property "
                              "on this backend (`mechanisms.json`)."
                              + (f" The first {MAX_DEVICE_ROWS} of {total} devices." if total > MAX_DEVICE_ROWS else "")),
                   Block("table", headers=("device", "group", "cpus", "memory", "uplink", "downlink", "delay", "jitter", "loss",
                                           "realised by"), rows=tuple(devices))]
    fidelity = load_json(run.path, "fidelity.json")
    if fidelity:
        rows = fidelity_rows(fidelity)
        failures = fidelity.get("failures") or []
        blocks += [Block("h2", "Fidelity: configured against measured"),
                   Block("p", f"Measured before training (`fidelity.json`), tolerance {fidelity.get('tolerance', 0):.0%}: "
                              + (f"{len(failures)} propert{'y' if len(failures) == 1 else 'ies'} off by more." if failures
                                 else "every measured property within it.")
                              + " Link rates are compared as the TCP goodput of the configured line rate."),
                   Block("table", headers=("device", "property", "configured", "measured", "error", "within"), rows=tuple(rows))]
    else:
        blocks += [Block("h2", "Fidelity: configured against measured"),
                   Block("p", "Not measured (`--no-fidelity`, or the run ended before its check).")]
    bounds = worker_bounds(run)
    if len(bounds):
        counts = bounds["bound"].value_counts().to_dict()
        blocks += [Block("h2", "What bounded each worker"),
                   Block("p", "Share of each worker's CPU quota, uplink and downlink it used over training (CPU seconds; bytes "
                              f"pushed and received, headers included, against the configured rate). The largest, if at least "
                              f"{BUSY:.0%}, is what held the worker's rate down; below that for all three, it waited on the "
                              "server. " + ", ".join(f"{n} worker{'s' if n > 1 else ''}: {b}" for b, n in counts.items()) + "."),
                   Block("table", headers=("worker", "group", "CPU used", "uplink used", "downlink used", "bounded by"),
                         rows=tuple(bound_rows(bounds)))]
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


def build_report(path: str | Path, *, per_run: bool = False, problems: list[str] | None = None) -> Path:
    """Write the report of a run, sweep or folder of runs into ``<path>/report/``; returns that folder.

    ``per_run``: for many runs, also build each run's own report and link it from the runs table.
    A damaged file or record (cut off, not JSON, a field of the wrong type) is skipped, named by
    file and line in the report's notes and appended to ``problems``; the report shows the rest.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _build_report(Path(path), per_run)
    found = list(dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, UserWarning)))
    if found:
        _append_notes(out, found)
    if problems is not None:
        problems += found
    return out


def _append_notes(out: Path, notes: list[str]) -> None:
    """Add the damaged files' notes to the report already written."""
    block = [Block("h2", "Damaged records (skipped)"), Block("list", rows=tuple(f"`{n}`" for n in notes))]
    md = out / "report.md"
    md.write_text(md.read_text() + "\n" + render_markdown(block))
    page = out / "report.html"
    body = render_html(block, "").split("<body>", 1)[1].rsplit("</body>", 1)[0]
    page.write_text(page.read_text().replace("</body></html>", body + "</body></html>"))


def _build_report(path: Path, per_run: bool) -> Path:
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
