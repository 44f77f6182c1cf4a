"""The tables of results.md: the ratios to ASGD (total, and at matched accuracy), the methods table
on both byte bases, a sweep's table; each row of a failed run says why instead of numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

from emulator.control.summary import flag
from emulator.experiments.paper.runner import comparison_failures, row_failure, sweep_failures


def bytes_to_reach(curve: list[dict], accuracy: float) -> float | None:
    """Cumulative applied-update bytes at the first evaluation reaching ``accuracy``."""
    for point in curve:
        if point.get("accuracy") is not None and point["accuracy"] >= accuracy:
            return point.get("bytes")
    return None


def dense_reference(rows: list[dict]) -> dict | None:
    """The ASGD row the ratios are taken against: the first dense, plain-rule run that did not
    diverge (a diverged run's bytes stop early and would flatter nobody), else the first one."""
    dense = [r for r in rows if r.get("compressor") == "dense" and r.get("rule") == "plain"]
    return next((r for r in dense if not flag(r)), dense[0] if dense else None)


def matched_ratios(rows: list[dict]) -> dict[str, dict]:
    """Per method: total bytes over ASGD's, and bytes to reach the lower of the two final accuracies."""
    dense = dense_reference(rows)
    out = {}
    for row in rows:
        entry = {"total_ratio": None, "matched_accuracy": None, "matched_ratio": None}
        if dense and row.get("ingress_payload_bytes") and dense.get("ingress_payload_bytes"):
            entry["total_ratio"] = dense["ingress_payload_bytes"] / row["ingress_payload_bytes"]
            if dense.get("bytes_per_update") and row.get("bytes_per_update"):
                entry["per_update_ratio"] = dense["bytes_per_update"] / row["bytes_per_update"]
        if dense and row.get("final_accuracy") is not None and dense.get("final_accuracy") is not None:
            target = min(row["final_accuracy"], dense["final_accuracy"])
            mine, theirs = bytes_to_reach(row.get("curve", []), target), bytes_to_reach(dense.get("curve", []), target)
            entry["matched_accuracy"] = target
            if mine and theirs:
                entry["matched_ratio"] = theirs / mine
        out[row["method"]] = entry
    return out


def fmt(value, spec=".3f") -> str:
    """A table cell: ``-`` for a missing or NaN value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def fmt_bytes(value) -> str:
    return fmt(value, ",.0f")


def authors_bytes(method: dict, layout, grads) -> int | None:
    """The bytes of one push in the authors' own format (their pickled messages, see
    analysis.byte_bases) for the same update, by a plan's ``method`` section: dense and top-k
    methods without error feedback; None for the others."""
    from analysis.byte_bases import AUTHORS_FRAME, authors_dense_message, authors_sparse_message
    from compression.topk import keep_count, top_magnitude

    names = [t.name for t in layout.tensors]
    if method.get("compressor") == "dense":
        return AUTHORS_FRAME + len(authors_dense_message(names, grads, 50_000))
    if method.get("compressor") == "topk" and not method.get("error_feedback"):
        c = float(method.get("params", {}).get("c", 0.01))
        kept = [top_magnitude(g, keep_count(g.size, c)) for g in grads]
        return AUTHORS_FRAME + len(authors_sparse_message(names, kept, [g[i] for g, i in zip(grads, kept)], 50_000))
    return None


def methods_section(methods: dict, authors: dict[str, int | None] | None = None) -> tuple[list[str], list[str]]:
    """The methods table (a failed run's row says why instead of numbers) and the failures.

    ``authors``: bytes per update in the authors' format per method, for the ratio on their basis."""
    rows = methods["table"]["methods"]
    ratios = matched_ratios(rows)
    reference = dense_reference(rows)
    authors = authors or {}
    reference_authors = authors.get(reference["method"]) if reference else None
    lines = ["| method | final accuracy | updates | ingress payload (B) | ingress on the wire (B) | bytes / update | "
             "ratio to ASGD (total) | ratio to ASGD at matched accuracy | bytes / update, authors' format | "
             "ratio to ASGD, authors' format (total) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    directory = Path(methods["directory"])
    failures = []
    for row in rows:
        failure = row_failure(directory, row)
        if failure:
            failures.append(f"methods: {row['method']} ({row['run_id']}): {failure}")
            lines.append(f"| {row['method']} | **FAILED**: {failure} | | | | | | | | |".replace("\n", " "))
            continue
        summary_path = directory / row["run_id"] / "summary.json"
        wire = json.loads(summary_path.read_text()).get("ingress_wire_bytes") if summary_path.exists() else None
        r = ratios[row["method"]]
        matched = (f"{r['matched_ratio']:.1f}x at {r['matched_accuracy']:.3f}" if r.get("matched_ratio") else
                   (f"not reached ({r['matched_accuracy']:.3f})" if r.get("matched_accuracy") is not None else "-"))
        name = row["method"] + flag(row) + (" (reference)" if row is reference else "")
        lines.append(f"| {name} | {fmt(row.get('final_accuracy'))} | {row.get('updates')} | {fmt_bytes(row.get('ingress_payload_bytes'))} | "
                     f"{fmt_bytes(wire)} | {fmt_bytes(row.get('bytes_per_update'))} | "
                     f"{fmt(r.get('total_ratio'), '.1f')}{'x' if r.get('total_ratio') else ''} | {matched} | "
                     f"{fmt_bytes(authors.get(row['method']))} | {_authors_ratio(row, reference, authors.get(row['method']), reference_authors)} |")
    return lines, failures


def _authors_ratio(row: dict, reference: dict | None, mine: int | None, theirs: int | None) -> str:
    """Total bytes of the reference run over this run's, both counted in the authors' format."""
    if not (reference and mine and theirs and row.get("updates") and reference.get("updates")):
        return "-"
    return f"{theirs * reference['updates'] / (mine * row['updates']):.1f}x"


def compare_tables(directory: Path) -> list[str]:
    """The tables of a repeated comparison's compare.md (means with intervals, paired differences),
    without its title and figure: written once, by emulate compare, and quoted here."""
    text = (Path(directory) / "compare.md").read_text().splitlines()
    start = next((i for i, line in enumerate(text) if line.startswith("Target accuracy")), 0)
    return ["#" + line if line.startswith("##") else line for line in text[start:] if not line.startswith("![")]


def repeated_methods_section(methods: dict, authors: dict[str, int | None]) -> tuple[list[str], list[str]]:
    """Means and 95 % intervals per method, the paired differences with verdicts, and bytes per
    update on both bases; every run that did not complete is listed with its cause."""
    directory = Path(methods["directory"])
    rows = methods["table"]["methods"]
    failures = comparison_failures(methods, "methods")
    reference = dense_reference(rows)
    lines = [*compare_tables(directory), "", "Bytes per update on both bases (a push's size is the same in every repetition):", "",
             "| method | compact wire (B) | ratio to ASGD | authors' format (B) | ratio to ASGD, authors' format |",
             "|---|---:|---:|---:|---:|"]
    theirs = authors.get(reference["method"]) if reference else None
    for method, row in {r["method"]: r for r in rows if r.get("bytes_per_update")}.items():
        mine = authors.get(method)
        compact = (f"{reference['bytes_per_update'] / row['bytes_per_update']:.1f}x"
                   if reference and reference.get("bytes_per_update") else "-")
        lines.append(f"| {method} | {row['bytes_per_update']:,.0f} | {compact} | {fmt_bytes(mine)} | "
                     f"{f'{theirs / mine:.1f}x' if mine and theirs else '-'} |")
    if failures:
        lines += ["", *(f"- **FAILED** {f}" for f in failures)]
    return lines, failures


def sweep_section(collection, keys: list[str], name: str) -> tuple[list[str], list[str]]:
    """The sweep's table, with a column naming the cause of each point's failed runs, and the failures."""
    from analysis.sweep import aggregate, aggregate_rows, markdown_table

    causes = sweep_failures(collection, name)
    agg = aggregate(collection.table(), keys)
    headers, rows = aggregate_rows(agg, keys)
    if causes:
        points = agg["point"].tolist() if "point" in agg else []
        headers = [*headers, "failed runs"]
        rows = [[*row, "**FAILED** " + "; ".join(causes[p]) if p in causes else ""] for row, p in zip(rows, points)]
        rows += [["-"] * (len(headers) - 1) + ["**FAILED** " + "; ".join(cs)] for p, cs in causes.items() if p not in points]
    return [markdown_table(headers, rows)], [c for cs in causes.values() for c in cs]


def negate(cell: str) -> str:
    """A - B as B - A: the table reads 'AdaComp minus Comp-c' whatever order the comparison ran them in."""
    if cell == "-" or cell[0] not in "+-":
        return cell
    return ("-" if cell[0] == "+" else "+") + cell[1:]



def interval_cell(interval: dict | None, spec: str, plain: bool = False) -> str:
    """``mean ± half-width (n)``, or ``mean`` alone for a quantity that does not vary (``plain``)."""
    if not interval or not interval.get("n") or interval.get("mean") is None:
        return "-"
    if plain or interval.get("half_width") is None:
        return format(interval["mean"], spec) + ("" if plain else f" ({interval['n']})")
    return f"{interval['mean']:{spec}} ± {interval['half_width']:{spec}} ({interval['n']})"
