"""Compare training methods apples to apples: one scenario, one seed, one data partition, one run each.

:func:`compare` runs the same scenario once per method spec, one after the other, through the
same library calls as ``emulate run`` (the plan, and so the devices, the data shards and the
fault times, depend on the seed only, never on the method). It writes, under
``<out_root>/compare-<scenario name>-<timestamp>/``:

- one run directory per method (``01-adacomp``, ``02-qsgd_s-4``, ...), complete as ``emulate run`` leaves it;
- ``compare.json``: one record per method, with its accuracy-versus-bytes curve;
- ``compare.md``: one table (see :data:`COLUMNS`);
- ``accuracy_vs_ingress.png``: test accuracy against the cumulative bytes of the updates the
  server applied, one line per method, log x axis.

Method specs, a mini-syntax for the command line::

    NAME[:KEY=VALUE]...        adacomp   dgc   qsgd:s=4   topk:c=0.001:error_feedback=true
                               topk:c=0.01:rule=staleness:wire.values=f16

``NAME`` is a preset or a compressor, as ``method.name`` in a scenario; each ``KEY=VALUE`` is
``--set method.KEY=VALUE`` (the value read as YAML, dotted keys reach into ``wire``; ``:`` only
separates). A spec replaces the scenario's whole ``method`` section, so whatever it does not
give takes its default. Every spec is validated with the scenario, before anything runs, and
errors name the field (``method.s: ...``).

Measures, per method (from the run's own traces, never from a formula):

- bytes per update: mean ``bytes`` of the updates the server applied (``updates.jsonl``);
  the ratio to dense divides the dense run's by it (the first run whose compressor is
  ``dense``, e.g. ``asgd``), so runs that applied different numbers of updates still compare;
- time to target: training seconds (from the server's ``training_started`` event) until the
  first evaluation at or above the target accuracy (default: 90% of the best final accuracy
  across methods), and the model version it evaluated;
- compress / compute: mean compression time over mean gradient time on the workers
  (``steps.jsonl``, weighted by steps): the worker's compute overhead.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .rundir import read_jsonl, write_json_atomic
from .scenario import Problem, ScenarioError, load_scenario
from .summary import flag

DEFAULT_TARGET_FRACTION = 0.9
FIGURE = "accuracy_vs_ingress.png"
COLUMNS = ("method", "final accuracy", "updates", "ingress payload (B)", "bytes / update", "vs dense",
           "time to target (s)", "compress / compute")
RUN_SECTIONS = ("training", "dataset", "server", "evaluator", "workers", "faults")  # scenario keys a method spec may set
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class MethodSpec:
    """One method of a comparison: the spec as written and the overrides it stands for."""

    label: str
    overrides: tuple[str, ...]

    @property
    def slug(self) -> str:
        """The label as a run-directory name: ``qsgd:s=4`` -> ``qsgd_s-4``."""
        return re.sub(r"[^A-Za-z0-9_.-]", "-", self.label.replace(":", "_"))


def parse_method_spec(text: str) -> MethodSpec:
    """``NAME[:KEY=VALUE]...`` -> the ``--set`` overrides that make the scenario's method that one.

    A key is a method parameter (``qsgd:s=4``, ``topk:wire.values=f16``), unless it starts with
    another section of the scenario: then it is set for this method's run only
    (``asgd:training.learning_rate=0.05``: each method at its own step size)."""
    name, *pairs = text.strip().split(":")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ScenarioError([Problem("method", f"{text!r}: expected NAME[:KEY=VALUE]..., e.g. qsgd:s=4")])
    overrides = [f"method={json.dumps({'name': name})}"]
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _KEY.match(key.strip()):
            raise ScenarioError([Problem("method", f"{text!r}: {pair!r} is not KEY=VALUE")])
        if key.strip() == "name":
            raise ScenarioError([Problem("method", f"{text!r}: the name goes first, not as name=")])
        key = key.strip()
        section = re.split(r"[.\[]", key, maxsplit=1)[0]
        overrides.append(f"{key}={value}" if section in RUN_SECTIONS and key != section else f"method.{key}={value}")
    return MethodSpec(text.strip(), tuple(overrides))


def compare(scenario_path, methods: list[str], out_root, *, backend: str = "local", overrides=(),
            say: Callable[[str], None] = print, target_accuracy: float | None = None,
            check_fidelity: bool = True) -> Path:
    """Run ``scenario_path`` once per method spec; returns the comparison's directory.

    ``overrides`` (``--set``) apply to every run and may not touch ``method``. A run that fails
    is a row with its status; Ctrl-C stops after the current run's teardown, writes the report
    for the runs done, and raises ``KeyboardInterrupt``.
    """
    from .backends import choose
    from .controller import Emulation
    from .plan import make_plan
    from .rundir import RunDirectory

    specs = _parse_all(methods, overrides)
    scenarios = [load_scenario(scenario_path, [*overrides, *spec.overrides]) for spec in specs]  # all checked first
    name = scenarios[0][0].name
    backend_cls = choose(backend, say=say)
    out = _new_directory(Path(out_root), f"compare-{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    text = Path(scenario_path).read_text()
    say(f"comparing {len(specs)} methods on {name} (seed {scenarios[0][0].seed}, backend {backend_cls.name}): {out}")
    run_dirs, interrupted = [], False
    for i, (spec, (scenario, _)) in enumerate(zip(specs, scenarios), start=1):
        plan = make_plan(scenario)
        rundir = RunDirectory.create(out, plan.name, run_id=f"{i:02d}-{spec.slug}")
        say(f"[{i}/{len(specs)}] {spec.label}")
        emulation = Emulation(
            plan, backend_cls(say=say), rundir, scenario_text=text,
            resolved={"scenario": scenario.model_dump(mode="json", by_alias=True), "overrides": [*overrides, *spec.overrides]},
            say=say, progress_every_s=0, check_fidelity=check_fidelity,
        )
        run_dirs.append((spec, rundir.path))
        try:
            summary = emulation.run()
        except Exception as exc:  # noqa: BLE001 - a failed run is a row of the table (summary.json says why)
            say(f"{spec.label}: run failed: {type(exc).__name__}: {exc}")
            continue
        if summary["status"] == "interrupted":
            interrupted = True
            break
    rows = [summarize_run(path, spec.label) for spec, path in run_dirs]
    write_report(out, rows, target_accuracy, meta={"scenario": str(scenario_path), "name": name,
                                                   "seed": scenarios[0][0].seed, "backend": backend_cls.name,
                                                   "overrides": list(overrides)})
    say(f"comparison written: {out / 'compare.md'}")
    if interrupted:
        raise KeyboardInterrupt
    return out


def _parse_all(methods: list[str], overrides) -> list[MethodSpec]:
    if not methods:
        raise ScenarioError([Problem("method", "give at least one method spec")])
    touching = [o for o in overrides if re.match(r"\s*method\b", o)]
    if touching:
        raise ScenarioError([Problem("--set", f"{touching[0]!r}: set method parameters in the method specs (qsgd:s=4)")])
    specs = [parse_method_spec(m) for m in methods]
    labels = [s.label for s in specs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ScenarioError([Problem("method", f"{repeated[0]!r} given twice")])
    return specs


def _new_directory(root: Path, name: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            path = root / f"{name}-{secrets.token_hex(2)}"


# ---------------------------------------------------------------------------------------
# Measures from one run directory


def summarize_run(run_dir: Path, label: str) -> dict:
    """One row of the comparison, from the run's ``summary.json`` and its traces."""
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"status": "missing"}
    updates = read_jsonl(run_dir / "updates.jsonl")
    sizes = [u["bytes"] for u in updates]
    return {
        "method": label, "run_id": run_dir.name, "status": summary.get("status"), "diverged": bool(summary.get("diverged")),
        "outcome": summary.get("outcome"),
        "compressor": summary.get("compressor"), "rule": summary.get("rule"),
        "final_accuracy": summary.get("final_accuracy"), "updates": summary.get("updates_applied", len(updates)),
        "ingress_payload_bytes": summary.get("ingress_payload_bytes"),
        "bytes_per_update": float(np.mean(sizes)) if sizes else None,
        "compress_overhead": compress_overhead(read_jsonl(run_dir / "steps.jsonl")),
        "curve": accuracy_curve(updates, read_jsonl(run_dir / "accuracy.jsonl"), training_start(run_dir, summary)),
    }


def training_start(run_dir: Path, summary: dict) -> float | None:
    """Trace-clock time at which training started: the server's ``training_started`` event (it
    opens training), else the controller's ``training_started_ts`` (which it notes on its next
    poll, late by up to a poll interval)."""
    for event in read_jsonl(Path(run_dir) / "events.jsonl"):
        if event.get("kind") == "training_started" and event.get("source") == "server":
            return event["ts"]
    return summary.get("training_started_ts")


def accuracy_curve(updates: list[dict], accuracy: list[dict], training_started_ts: float | None) -> list[dict]:
    """Per evaluation: model version, cumulative applied-update bytes at that version, accuracy, training time."""
    order = sorted(updates, key=lambda u: u["t"])
    versions = np.array([u["t"] for u in order], np.int64)
    cumulative = np.concatenate([[0], np.cumsum([u["bytes"] for u in order], dtype=np.int64)])
    curve = []
    for record in sorted(accuracy, key=lambda r: (r["version"], r.get("ts", 0))):
        if record.get("accuracy") is None:
            continue
        seen = int(np.searchsorted(versions, record["version"], side="right"))
        time_s = None if training_started_ts is None or "ts" not in record else round(record["ts"] - training_started_ts, 3)
        curve.append({"version": record["version"], "bytes": int(cumulative[seen]), "accuracy": record["accuracy"], "time_s": time_s})
    return curve


def compress_overhead(steps: list[dict]) -> float | None:
    """Mean compression time over mean gradient time, both weighted by the steps of each record.

    CPU times where the worker reports them: under a CPU quota, wall times also hold the waits
    for the next scheduling period, charged to whichever phase ran out of quota."""
    weights = np.array([r.get("steps", 0) for r in steps], np.float64)
    if not weights.sum():
        return None
    cpu = all("compute_cpu_ms" in r for r in steps)
    compute = float(np.dot(weights, [r.get("compute_cpu_ms" if cpu else "compute_ms", 0.0) for r in steps]))
    compress = float(np.dot(weights, [r.get("compress_cpu_ms" if cpu else "compress_ms", 0.0) for r in steps]))
    return compress / compute if compute > 0 else None


def time_to(curve: list[dict], target: float) -> dict | None:
    """The first evaluation at or above ``target``: its training time and version."""
    for point in curve:
        if point["accuracy"] >= target:
            return {"time_s": point["time_s"], "version": point["version"]}
    return None


# ---------------------------------------------------------------------------------------
# Report


def write_report(out: Path, rows: list[dict], target_accuracy: float | None = None, meta: dict | None = None) -> dict:
    """``compare.json``, ``compare.md`` and the figure, from the rows of :func:`summarize_run`."""
    finals = [r["final_accuracy"] for r in rows if r["final_accuracy"] is not None]
    target = target_accuracy if target_accuracy is not None else (DEFAULT_TARGET_FRACTION * max(finals) if finals else None)
    dense_rows = [r for r in rows if r["compressor"] == "dense" and r["bytes_per_update"]]
    dense = next((r for r in dense_rows if not flag(r)), dense_rows[0] if dense_rows else None)
    for row in rows:
        row["ratio_to_dense"] = (dense["bytes_per_update"] / row["bytes_per_update"]
                                 if dense and row["bytes_per_update"] else None)
        row["time_to_target"] = time_to(row["curve"], target) if target is not None else None
    report = {**(meta or {}), "target_accuracy": target, "dense_reference": dense["method"] if dense else None,
              "figure": FIGURE, "methods": rows}
    write_json_atomic(out / "compare.json", report)
    (out / "compare.md").write_text(render_markdown(report))
    plot_accuracy_vs_ingress(rows, target, out / FIGURE)
    return report


def render_markdown(report: dict) -> str:
    target = report["target_accuracy"]
    lines = [
        f"# Comparison: {report.get('name', '')}", "",
        f"Scenario `{report.get('scenario', '')}`, seed {report.get('seed')}, backend {report.get('backend')}; "
        f"target accuracy {_num(target, '.4f')}; ratios against `{report['dense_reference'] or 'no dense run'}`.", "",
        "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS),
    ]
    for row in report["methods"]:
        reached = row["time_to_target"]
        cells = [
            f"`{row['method']}`" + ("" if row["status"] == "completed" else f" ({row['status']})")
            + flag(row),
            _num(row["final_accuracy"], ".4f"), f"{row['updates']:,}" if row["updates"] is not None else "-",
            f"{row['ingress_payload_bytes']:,}" if row["ingress_payload_bytes"] is not None else "-",
            _num(row["bytes_per_update"], ",.0f"), _num(row["ratio_to_dense"], ".1f", "x"),
            "not reached" if reached is None else f"{_num(reached['time_s'], '.1f')} (update {reached['version']})",
            _num(row["compress_overhead"], ".3f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"![accuracy versus cumulative ingress bytes]({report['figure']})", ""]
    return "\n".join(lines)


def _num(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:{spec}}{suffix}"


def plot_accuracy_vs_ingress(rows: list[dict], target: float | None, path: Path) -> None:
    """Accuracy against cumulative applied-update bytes, one line per method (evaluations before
    the first update have no place on a log axis and are left out)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for row in rows:
        points = [(p["bytes"], p["accuracy"]) for p in row["curve"] if p["bytes"] > 0]
        if points:
            x, y = zip(*points)
            ax.plot(x, y, marker="o", markersize=3, label=row["method"])
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8, label=f"target {target:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative ingress at the server (bytes of applied updates)")
    ax.set_ylabel("test accuracy")
    ax.grid(True, which="both", linewidth=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


__all__ = ["compare", "parse_method_spec", "MethodSpec", "summarize_run", "write_report", "accuracy_curve",
           "compress_overhead", "time_to", "training_start"]
