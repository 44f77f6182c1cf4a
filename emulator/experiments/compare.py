"""Compare training methods apples to apples: one scenario, the same seeds, the same data partitions.

:func:`compare` runs the same scenario once per method spec and repetition, one run after the
other, through the same library calls as ``emulate run`` (the plan, and so the devices, the
data shards and the fault times, depend on the seed only, never on the method). Repetition ``r``
runs every method with the seed :func:`emulator.experiments.sweep.repetition_seed` gives it, as a sweep
does (``r = 0``: the scenario's own seed, so one repetition is the plain comparison), so the
methods are compared pair by pair on the same draws. It writes, under
``<out_root>/compare-<scenario name>-<timestamp>/`` (or the directory it is given, where a
rerun reuses the runs that completed):

- one run directory per method and repetition (``01-adacomp``, ``02-qsgd_s-4``, ...; with
  repetitions ``01-adacomp-r0``, ``01-adacomp-r1``, ...), complete as ``emulate run`` leaves it;
- ``compare.json``: ``methods``, one record per run (``repeat``, ``seed``, its accuracy-versus-bytes
  curve, ...); ``aggregate``, per method the mean and Student-t 95% interval of every numeric
  column, the rate of runs that diverged or died with its exact (Clopper-Pearson) interval, and
  final accuracy (the mean of the last :data:`analysis.outcomes.LAST_K` evaluations) and
  accuracy at the time common to all trained runs, over the runs that trained only; ``pairs``,
  per pair of methods Fisher's exact test on diverged-or-dead, the paired difference of final
  accuracy over the repetitions in which both trained and of time to target (paired t tests),
  each with Holm's adjustment over the family of the comparison's pairs and the verdict it
  supports ("A better", "B better", "can't tell"; ``family`` in the report states the family);
  the unadjusted interval verdicts of earlier reports stay under ``final_accuracy``/``verdict``;
- ``compare.md``: one table (see :data:`COLUMNS`; with repetitions :data:`REPEATED_COLUMNS`),
  then the paired tests with their adjusted verdicts;
- ``accuracy_vs_ingress.png``: test accuracy against the cumulative bytes of the updates the
  server applied, log x axis: one line per method, or its mean and shaded interval.

Method specs, a mini-syntax for the command line::

    NAME[:KEY=VALUE]...        adacomp   dgc   qsgd:s=4   topk:c=0.001:error_feedback=true
                               topk:c=0.01:rule=staleness:wire.values=f16
                               my/sign_topk.py:SignTopK:c=0.05   (a user's compressor, its path
                               read from where the command is typed; labelled sign_topk.py:SignTopK)

``NAME`` is a preset or a compressor, as ``method.name`` in a scenario; each ``KEY=VALUE`` is
``--set method.KEY=VALUE`` (the value read as YAML, dotted keys reach into ``wire``; ``:`` only
separates). A spec replaces the scenario's whole ``method`` section, so whatever it does not
give takes its default. Every spec is validated with the scenario, before anything runs, and
errors name the field (``method.s: ...``).

Measures, per method (from the run's own traces, never from a formula):

- bytes per update: mean ``bytes`` of the updates the server applied (``updates.jsonl``);
  the ratio to dense divides the dense method's by it (the method of the first dense run that
  neither diverged nor died, e.g. ``asgd``; its mean over such runs), so runs that applied
  different numbers of updates still compare;
- down and two-way bytes per update: what the server sent workers (models, deltas, ACKs) per
  applied update, and that plus what it received (``summary.json``'s ``down_bytes_per_update``
  and ``two_way_bytes_per_update``; "-" for runs from before they were counted). An update is
  one worker's push in every row: a federated server step applies a round's pushes, so its
  run's bytes per step are divided by the pushes it applied (``summary.traffic_per_push``);
- time to target: training seconds (from the server's ``training_started`` event) until the
  first evaluation at or above the target accuracy (default: 90% of the best method's mean
  final accuracy; one target for every run), and the model version it evaluated;
- compress / compute: mean compression time over mean gradient time on the workers
  (``steps.jsonl``, weighted by steps): the worker's compute overhead.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from analysis import outcomes  # rates with exact intervals, Fisher, Holm, smoothed final accuracy: sweep uses them too
from analysis.runs import server_shares
from analysis.sweep import CONFIDENCE, mean_ci  # the project's one Student-t interval: sweep tables use it too

from emulator import backends  # backends.choose, the seam tests replace
from emulator.planning.plan import Plan, make_plan
from emulator.control.rundir import completed_summary, read_jsonl, set_aside, write_json_atomic
from emulator.control import workload
from emulator.control.run import RunFailed, run_scenario
from emulator.planning.loader import load_scenario
from emulator.planning.problems import Problem, ScenarioError
from emulator.planning.scenario import Scenario
from emulator.control.summary import FLAGGED, flag, traffic_per_push
from emulator.experiments.sweep import SEED_STRIDE, repetition_seed

DEFAULT_TARGET_FRACTION = 0.9
FIGURE = "accuracy_vs_ingress.png"
COLUMNS = ("method", "final accuracy", "updates", "ingress payload (B)", "bytes / update", "vs dense",
           "down B / update", "two-way B / update",
           "time to target (s)", "compress / compute")
AGGREGATED = ("final_accuracy", "updates", "ingress_payload_bytes", "bytes_per_update", "ratio_to_dense",
              "down_bytes_per_update", "two_way_bytes_per_update",
              "time_to_target", "compress_overhead", "busiest_server_ingress_bytes")  # the numeric columns, as row keys
CANT_TELL = "can't tell"
FAMILY_RULE = ("per measure (diverged or dead; final accuracy over pairs that both trained; time to target), the family is "
               "every pair of this comparison's methods that could be tested; Holm's step-down adjustment; a verdict needs "
               "an adjusted p below 0.05")
SEED_RULE = f"seed_r = (seed + r * {SEED_STRIDE}) mod 2**32, r = 0 the scenario's seed"  # emulator.experiments.sweep's rule
RUN_SECTIONS = ("training", "dataset", "server", "evaluator", "workers", "faults")  # scenario keys a method spec may set
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class MethodSpec:
    """One method of a comparison: the spec as written and the overrides it stands for."""

    label: str
    overrides: tuple[str, ...]
    backend: str | None = None  # ``adacomp:backend=virtual``: this method's runs on that backend (default: the comparison's)

    @property
    def slug(self) -> str:
        """The label as a run-directory name: ``qsgd:s=4`` -> ``qsgd_s-4``."""
        return re.sub(r"[^A-Za-z0-9_.-]", "-", self.label.replace(":", "_"))


def parse_method_spec(text: str) -> MethodSpec:
    """``NAME[:KEY=VALUE]...`` -> the ``--set`` overrides that make the scenario's method that one.

    A key is a method parameter (``qsgd:s=4``, ``topk:wire.values=f16``), unless it starts with
    another section of the scenario: then it is set for this method's run only
    (``asgd:training.learning_rate=0.05``: each method at its own step size); ``backend=NAME`` runs
    this method's runs on that backend (``adacomp:backend=virtual`` beside ``adacomp``: virtual time
    against Docker, paired by seed)."""
    name, *pairs = text.strip().split(":")
    label = text.strip()
    if name.endswith(".py") and pairs:  # a user's compressor, file.py:Class: the class is part of the name
        attribute = pairs.pop(0)
        typed = Path(name).expanduser()
        label = ":".join([f"{typed.name}:{attribute}", *pairs])
        name = f"{typed.absolute() if typed.is_file() else name}:{attribute}"  # typed here: relative to where it is typed
    elif not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ScenarioError([Problem("-m", f"{text!r}: expected NAME[:KEY=VALUE]..., e.g. qsgd:s=4, "
                                               "or your own compressor: path/file.py:Class[:KEY=VALUE]...")])
    overrides = [f"method={json.dumps({'name': name})}"]
    backend = None
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not _KEY.match(key.strip()):
            raise ScenarioError([Problem("-m", f"{text!r}: {pair!r} is not KEY=VALUE")])
        if key.strip() == "name":
            raise ScenarioError([Problem("-m", f"{text!r}: the name goes first, not as name=")])
        key = key.strip()
        if key == "backend":  # the same method on another backend: Docker beside virtual time, paired by seed
            backend = value.strip()
            overrides.append(f"backend={backend}")
            continue
        section = re.split(r"[.\[]", key, maxsplit=1)[0]
        overrides.append(f"{key}={value}" if section in RUN_SECTIONS and key != section else f"method.{key}={value}")
    return MethodSpec(label, tuple(overrides), backend)


def compare(scenario_path, methods: list[str], out_root, *, backend: str = "local", overrides=(),
            say: Callable[[str], None] = print, target_accuracy: float | None = None,
            check_fidelity: bool = True, strict: bool = False, tolerance: float = 0.10, repeat: int = 1,
            directory=None, jobs: int | None = 1, known: Mapping[str, dict] | None = None,
            after_run: Callable[["PlannedRun", Path], None] | None = None) -> Path:
    """Run ``scenario_path`` once per method spec and repetition; returns the comparison's directory.

    Repetition ``r`` runs every method with the same seed, :func:`emulator.experiments.sweep.repetition_seed`
    (``r = 0``: the scenario's own seed, so ``repeat=1`` is the single comparison), repetitions
    outside and methods inside, so that an interrupted comparison holds whole pairs.
    ``overrides`` (``--set``) apply to every run and may not touch ``method``. ``directory``: the
    comparison's directory (default: a new one under ``out_root``); a rerun into it reuses each
    run that completed with the same plan and reruns the others (an unfinished attempt is moved
    to ``.attempts/``). A run that fails is a row with its status; Ctrl-C stops after the current
    run's teardown, writes the report for the runs done, and raises ``KeyboardInterrupt``.
    ``known``: rows recorded before elsewhere, by the digest of their run's plan (which names the
    scenario, overrides, method and seed, not the run's place in the list), taken instead of
    running a run of the same plan that is not in the directory;
    ``after_run(run, run_dir)``: called as each run made here ends with a summary (a record of it).
    """
    specs = _parse_all(methods, overrides)
    planned = plan_comparison(scenario_path, methods, overrides, repeat)  # every run checked first
    name, seed = planned[0].scenario.name, planned[0].scenario.seed
    out = Path(directory) if directory is not None else None
    stale = [f"{out / r.run_id} holds a completed run of another plan: the scenario changed; use another directory"
             for r in planned if out is not None and (completed_summary(out / r.run_id) or {}).get("plan_digest") not in (None, r.plan_digest)]
    if stale:
        raise ScenarioError([Problem("--dir", text) for text in stale])
    backend_cls = backends.choose(backend, say=say)
    if out is None:
        out = _new_directory(Path(out_root), f"compare-{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    else:
        out.mkdir(parents=True, exist_ok=True)
    text = Path(scenario_path).read_text()
    seeds = [repetition_seed(seed, r) for r in range(repeat)]
    say(f"comparing {len(specs)} methods on {name} ("
        + (f"seed {seed}" if repeat == 1 else f"{repeat} paired repetitions, seeds {', '.join(map(str, seeds))}")
        + f", backend {backend_cls.name}): {out}")
    options = {"backend": backend_cls.name, "text": text, "check_fidelity": check_fidelity, "strict": strict, "tolerance": tolerance}
    recorded = {run.run_id: {**known[run.plan_digest], "run_id": run.run_id} for run in planned
                if known and known.get(run.plan_digest, {}).get("status") == "completed" and completed_summary(out / run.run_id) is None}
    if recorded:
        say(f"{len(recorded)} run(s) read from their records, not run again")
    jobs = jobs or max(1, math.floor((os.cpu_count() or 1) / max(max(sum(d.cpus for d in r.plan.devices) for r in planned), 1e-9) + 1e-9))
    if jobs > 1:
        done, interrupted = _run_forked(planned, out, min(jobs, len(planned)), options, say, set(recorded), after_run)
    else:
        done, interrupted = [], False
        for i, run in enumerate(planned, start=1):
            where = f"[{i}/{len(planned)}] {run.spec.label}" + (f", repetition {run.repeat} (seed {run.seed})" if repeat > 1 else "")
            done.append(run)
            if completed_summary(out / run.run_id) is not None or run.run_id in recorded:
                say(f"{where}: done before, reused" + (" (from its record)" if run.run_id in recorded else ""))
                continue
            set_aside(out, run.run_id)
            say(where)
            try:
                summary = run_scenario(run.scenario, out, overrides=run.overrides, run_id=run.run_id, say=say,
                                       **{**options, "backend": run.spec.backend or options["backend"]})
            except RunFailed as exc:  # a failed run is a row of the table (summary.json says why)
                say(f"{run.spec.label}: run failed: {exc}")
                _after(after_run, run, out)
                continue
            if summary.status == "interrupted":
                interrupted = True
                break
            _after(after_run, run, out)
    rows = [{**(recorded.get(run.run_id) or summarize_run(out / run.run_id, run.spec.label)), "repeat": run.repeat, "seed": run.seed}
            for run in done]
    write_report(out, rows, target_accuracy, meta={"scenario": str(scenario_path), "name": name, "seed": seed,
                                                   "backend": backend_cls.name, "overrides": list(overrides),
                                                   "repeat": repeat, "seeds": seeds, "seed_rule": SEED_RULE})
    say(f"comparison written: {out / 'compare.md'}")
    if interrupted:
        raise KeyboardInterrupt
    return out


def _after(after_run, run: "PlannedRun", out: Path) -> None:
    """``after_run`` for a run that ended with a summary (completed or failed, not interrupted)."""
    if after_run is not None and (out / run.run_id / "summary.json").exists():
        after_run(run, out / run.run_id)


def _run_forked(planned: list["PlannedRun"], out: Path, jobs: int, options: dict, say, recorded: set[str] = frozenset(),
                after_run=None) -> tuple[list, bool]:
    """``jobs`` runs at once, each in a child forked as a sweep's are (its output in
    ``logs/<run id>.log``); returns the runs (all of them: each is a row) and whether Ctrl-C stopped them."""
    from concurrent.futures import ThreadPoolExecutor, wait

    from emulator.experiments.sweep import ForkRunner

    runner = ForkRunner()
    todo = [run for run in planned if completed_summary(out / run.run_id) is None and run.run_id not in recorded]
    say(f"{len(planned) - len(todo)} run(s) done before, reused; {len(todo)} to run, {jobs} at once (logs in {out / 'logs'})")

    def one(run):
        set_aside(out, run.run_id)
        try:
            runner.launch(out / "logs" / f"{run.run_id}.log", run.scenario, out, overrides=run.overrides, run_id=run.run_id,
                          **{**options, "backend": run.spec.backend or options["backend"]})
            summary = completed_summary(out / run.run_id) or {}
            outcome = summary.get("outcome")  # the word a reader takes first: diverged or dead before completed
            say(f"{run.run_id}: {outcome if outcome in FLAGGED else summary.get('status', 'done')}")
        except RuntimeError as exc:  # a failed run is a row of the table (summary.json says why)
            say(f"{run.run_id}: run failed: {exc}")
        _after(after_run, run, out)

    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(one, run) for run in todo]
        try:
            while wait(futures, timeout=0.5).not_done:
                pass
        except KeyboardInterrupt:
            say("comparison interrupted: stopping the running runs (each tears down and writes its summary)")
            for future in futures:
                future.cancel()
            runner.interrupt()
            wait(futures)
            return [run for run in planned if (out / run.run_id).exists()], True
    return planned, False


@dataclass(frozen=True)
class PlannedRun:
    """One method x repetition of a comparison, validated and planned."""

    spec: MethodSpec
    run_id: str  # 01-adacomp; with repetitions 01-adacomp-r0, 01-adacomp-r1, ...
    repeat: int
    seed: int
    overrides: tuple[str, ...]  # every --set of the run: the comparison's, the method's, then the seed
    scenario: Scenario
    plan: Plan

    @property
    def plan_digest(self) -> str:
        return self.plan.digest()


def plan_comparison(scenario_path, methods: list[str], overrides=(), repeat: int = 1) -> list[PlannedRun]:
    """Every run of a comparison, checked and planned, nothing made: :class:`ScenarioError` with
    the method spec (``-m``) or the option to blame."""
    if repeat < 1:
        raise ScenarioError([Problem("--repeat", f"must be >= 1, got {repeat}")])
    return _plan_runs(scenario_path, _parse_all(methods, overrides), overrides, repeat)


def _plan_runs(scenario_path, specs: list[MethodSpec], overrides, repeat: int) -> list[PlannedRun]:
    """Every run of the comparison, repetitions outside and methods inside; ScenarioError on the first bad one."""
    load_scenario(scenario_path, list(overrides))  # the scenario's own problems first, blamed on its file
    planned = []
    for r in range(repeat):
        for i, spec in enumerate(specs, start=1):
            sets = [*overrides, *spec.overrides]
            try:
                scenario = load_scenario(scenario_path, sets)[0]
            except ScenarioError as exc:  # the scenario loads without the spec: the spec is to blame
                raise ScenarioError([Problem(f"-m {spec.label}", str(p)) for p in exc.problems]) from None
            if r:  # a method spec cannot set the seed: every method draws the same one
                sets.append(f"seed={repetition_seed(scenario.seed, r)}")
                scenario = load_scenario(scenario_path, sets)[0]
            run_id = f"{i:02d}-{spec.slug}" + (f"-r{r}" if repeat > 1 else "")
            plan = make_plan(scenario)
            if r == 0:  # each method's data set and user files, imported and checked before any run starts
                try:
                    workload.check_scenario(scenario, plan)
                except ScenarioError as exc:
                    raise ScenarioError([Problem(f"-m {spec.label}: {p.path}", p.message) for p in exc.problems]) from None
            planned.append(PlannedRun(spec, run_id, r, scenario.seed, tuple(sets), scenario, plan))
    return planned


def _parse_all(methods: list[str], overrides) -> list[MethodSpec]:
    if not methods:
        raise ScenarioError([Problem("-m", "give at least one method spec")])
    touching = [o for o in overrides if re.match(r"\s*method\b", o)]
    if touching:
        raise ScenarioError([Problem("--set", f"{touching[0]!r}: set method parameters in the method specs (qsgd:s=4)")])
    specs = [parse_method_spec(m) for m in methods]
    labels = [s.label for s in specs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ScenarioError([Problem("-m", f"{repeated[0]!r} given twice")])
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
    return {
        "method": label, "run_id": run_dir.name, "status": summary.get("status"), "diverged": bool(summary.get("diverged")),
        "outcome": summary.get("outcome"),
        "compressor": summary.get("compressor"), "rule": summary.get("rule"),
        "final_accuracy": summary.get("final_accuracy"), "updates": summary.get("updates_applied", len(updates)),
        "ingress_payload_bytes": summary.get("ingress_payload_bytes"),
        "bytes_per_update": (pushed := push_bytes(updates)),
        **traffic_per_push(summary, pushed),
        **server_shares(summary),
        # a federated run's aggregations (summary.summary_of_rounds); absent otherwise, so other rows and records keep their form
        **({"rounds": summary["rounds"]} if summary.get("rounds") else {}),
        "compress_overhead": compress_overhead(read_jsonl(run_dir / "steps.jsonl")),
        "curve": (curve := accuracy_curve(updates, read_jsonl(run_dir / "accuracy.jsonl"), training_start(run_dir, summary))),
        "final_accuracy_last_k": last_k_accuracy(curve),
    }


def push_bytes(updates: list[dict]) -> float | None:
    """Mean bytes of one worker's update as the servers received it: with the model split over
    several servers each receives its part, traced as a row of its own (``source``), so the parts'
    means add up (one server: the mean of its rows)."""
    parts: dict[str, list[int]] = {}
    for u in updates:
        parts.setdefault(u.get("source", "server"), []).append(u["bytes"])
    return float(sum(np.mean(sizes) for sizes in parts.values())) if parts else None


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


def last_k_accuracy(curve: list[dict], k: int = outcomes.LAST_K) -> float | None:
    """Final accuracy as the mean of the last ``k`` evaluations of a trained model (version > 0: the
    initial model's evaluation is not training); the last evaluations of one run vary by as much
    as the differences a comparison judges."""
    trained_points = [p["accuracy"] for p in curve if p.get("version", 1) > 0]
    return outcomes.mean_of_last(trained_points or [p["accuracy"] for p in curve], k)


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
    """``compare.json``, ``compare.md`` and the figure, from the rows of :func:`summarize_run`
    (with ``repeat``: rows of the same repetition ran with the same seed): :func:`report_of`,
    written."""
    report = report_of(rows, target_accuracy, meta)
    write_json_atomic(out / "compare.json", report)
    (out / "compare.md").write_text(render_markdown(report))
    plot_accuracy_vs_ingress(rows, report["target_accuracy"], out / FIGURE)
    return report


def report_of(rows: list[dict], target_accuracy: float | None = None, meta: dict | None = None, figure: str = FIGURE) -> dict:
    """The comparison's report from its rows, pure: the same from run directories and from
    committed records (:mod:`emulator.experiments.records`).

    The target accuracy is one for every run: ``target_accuracy``, else 90% of the best method's
    mean final accuracy over its completed runs. The report holds the rows (``methods``),
    :func:`aggregate` and :func:`pairs`."""
    means = {label: mean_ci(r["final_accuracy"] for r in rows if r["method"] == label and _completed(r))[1]
             for label in _labels(rows)}
    means = {label: mean for label, mean in means.items() if not math.isnan(mean)}
    best = max(means, key=means.get) if means else None
    target = target_accuracy if target_accuracy is not None else (DEFAULT_TARGET_FRACTION * means[best] if best else None)
    dense_rows = [r for r in rows if r["compressor"] == "dense" and r["bytes_per_update"]]
    dense = next((r for r in dense_rows if not flag(r)), dense_rows[0] if dense_rows else None)
    # Its method's mean bytes per update (over the runs that did not diverge or die, if it has some).
    dense_bytes = float(np.mean([r["bytes_per_update"] for r in dense_rows if r["method"] == dense["method"]
                                 and (flag(dense) or not flag(r))])) if dense else None
    at_time = outcomes.common_time(r["curve"] for r in rows if _completed(r) and outcomes.trained(r))
    for row in rows:
        row["ratio_to_dense"] = dense_bytes / row["bytes_per_update"] if dense and row["bytes_per_update"] else None
        row["time_to_target"] = time_to(row["curve"], target) if target is not None else None
        row.setdefault("final_accuracy_last_k", last_k_accuracy(row.get("curve") or []))
        row["accuracy_at_time"] = None if at_time is None else outcomes.accuracy_at(row.get("curve") or [], at_time)
    report = {**(meta or {}), "target_accuracy": target, "dense_reference": dense["method"] if dense else None,
              "figure": figure, "methods": rows}
    report.setdefault("repeat", len({r.get("repeat", 0) for r in rows}) or 1)
    report.update(target_rule=("given" if target_accuracy is not None else
                               f"{DEFAULT_TARGET_FRACTION:.0%} of the best mean final accuracy, {best}'s" if best else None),
                  confidence=CONFIDENCE, aggregate=aggregate(rows), pairs=pairs(rows),
                  last_k=outcomes.LAST_K, at_time_s=at_time, alpha=outcomes.ALPHA, family=FAMILY_RULE)
    return report


def _labels(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in rows))


def _completed(row: dict) -> bool:
    """Whether a run counts in the statistics: it completed (diverged or dead runs did: they are marked)."""
    return row.get("status") == "completed"


def _value(row: dict, column: str) -> float | None:
    if column == "time_to_target":
        return (row.get("time_to_target") or {}).get("time_s")
    return row.get(column)


def _interval(values, confidence: float = CONFIDENCE) -> dict:
    """``n``, ``mean`` and the Student-t interval (``half_width``, ``low``, ``high``); None where undefined (n < 2)."""
    n, mean, half = mean_ci(values, confidence)
    finite = lambda v: None if math.isnan(v) else v  # noqa: E731 - JSON has no NaN
    return {"n": n, "mean": finite(mean), "half_width": finite(half), "low": finite(mean - half), "high": finite(mean + half)}


def aggregate(rows: list[dict], confidence: float = CONFIDENCE) -> list[dict]:
    """Per method, in the comparison's order: ``runs``, ``completed``, ``flagged`` (how many of those
    diverged or ended dead), ``reached_target``, and per numeric column (:data:`AGGREGATED`)
    :func:`_interval` over its completed runs (``time_to_target``: over those that reached it)."""
    out = []
    for label in _labels(rows):
        mine = [r for r in rows if r["method"] == label]
        done = [r for r in mine if _completed(r)]
        marks = [flag(r).strip(" ()") for r in done]
        entry = {"method": label, "runs": len(mine), "completed": len(done),
                 "flagged": ", ".join(f"{marks.count(o)} {o}" for o in FLAGGED if o in marks),
                 "reached_target": sum(1 for r in done if r.get("time_to_target"))}
        good = [r for r in done if outcomes.trained(r)]
        entry |= {"not_trained": outcomes.rate(len(done) - len(good), len(done), confidence), "trained": len(good),
                  "trained_accuracy": _interval([r.get("final_accuracy_last_k") for r in good], confidence),
                  "trained_accuracy_at_time": _interval([r.get("accuracy_at_time") for r in good], confidence)}
        out.append(entry | {column: _interval([_value(r, column) for r in done], confidence) for column in AGGREGATED})
    return out


def pairs(rows: list[dict], confidence: float = CONFIDENCE) -> list[dict]:
    """For each pair of methods (A before B in the comparison's order), the mean paired difference
    A - B of final accuracy and of time to target, with its Student-t interval and a verdict.

    Runs pair by repetition (the same seed). A repetition in which either method did not complete
    is left out of the pair (``left_out`` says which and why, ``n`` counts what remains); time
    differences need both runs to reach the target (``only_a_reached``, ``only_b_reached`` and
    ``neither_reached`` count the others)."""
    by_repeat = {(r["method"], r.get("repeat", 0)): r for r in rows}
    repeats = sorted({r.get("repeat", 0) for r in rows})
    out = []
    for a, b in itertools.combinations(_labels(rows), 2):
        both, left_out = [], []
        for rep in repeats:
            ra, rb = by_repeat.get((a, rep)), by_repeat.get((b, rep))
            why = [f"{label} {'not run' if r is None else r.get('status') or 'missing'}"
                   for label, r in ((a, ra), (b, rb)) if r is None or not _completed(r)]
            if why:
                left_out.append({"repeat": rep, "why": ", ".join(why)})
            else:
                both.append((ra, rb))
        times = [(_value(x, "time_to_target"), _value(y, "time_to_target")) for x, y in both]
        time = _difference([(x, y) for x, y in times if x is not None and y is not None], False, confidence)
        time.update(only_a_reached=sum(1 for x, y in times if x is not None and y is None),
                    only_b_reached=sum(1 for x, y in times if x is None and y is not None),
                    neither_reached=sum(1 for x, y in times if x is None and y is None),
                    ratio=[_time_ratio(x, y) for x, y in both])
        accuracy = _difference([(x["final_accuracy"], y["final_accuracy"]) for x, y in both], True, confidence)
        done_a = [r for r in rows if r["method"] == a and _completed(r)]
        done_b = [r for r in rows if r["method"] == b and _completed(r)]
        fails = lambda runs: sum(1 for r in runs if not outcomes.trained(r))  # noqa: E731
        divergence = outcomes.compare_rates(fails(done_a), len(done_a), fails(done_b), len(done_b))
        trained_both = [(x, y) for x, y in both if outcomes.trained(x) and outcomes.trained(y)]
        trained_accuracy = outcomes.paired_difference(
            [(x.get("final_accuracy_last_k"), y.get("final_accuracy_last_k")) for x, y in trained_both], confidence)
        time["p"] = outcomes.t_p_value(time["mean"], time["half_width"], time["n"], confidence) if time["mean"] is not None else None
        out.append({"a": a, "b": b, "repeats": len(repeats), "completed_pairs": len(both), "left_out": left_out,
                    "final_accuracy": accuracy, "time_to_target": time, "not_trained": divergence,
                    "trained_pairs": len(trained_both), "trained_accuracy": trained_accuracy})
    # One family per measure: the comparison's pairs (Holm over the tests that could be made).
    outcomes.adjust_family([p["not_trained"] for p in out], higher_is_better=False)
    outcomes.adjust_family([p["trained_accuracy"] for p in out], higher_is_better=True)
    times = [{"mean": p["time_to_target"]["mean"], "p": p["time_to_target"]["p"]} for p in out]
    for pair, adjusted in zip(out, outcomes.adjust_family(times, higher_is_better=False)):
        pair["time_to_target"].update(p_holm=adjusted["p_holm"], family=adjusted["family"], verdict_holm=adjusted["verdict"])
    return out


def _time_ratio(a: dict, b: dict) -> dict | None:
    """A's time to target over B's in one repetition: exact when both reached it; when only one
    did, the other's time is at least its run's length (its last evaluation), so the ratio is
    bounded (``bound``: "at most" or "at least"); None when neither reached it."""
    ta, tb = _value(a, "time_to_target"), _value(b, "time_to_target")
    if ta is None and tb is None:
        return None
    if ta is not None and tb is not None:
        return {"value": ta / tb if tb else None, "bound": "exact"}
    end = (b if tb is None else a).get("curve") or [{}]
    last = end[-1].get("time_s")
    if not last:
        return None
    return {"value": ta / last, "bound": "at most"} if tb is None else {"value": last / tb, "bound": "at least"}


def time_ratio_note(a: str, b: str, ratios: list, always: bool = False) -> str | None:
    """One line on the paired time ratios (by default only where censoring makes some bounds), and
    what every pair supports."""
    kinds = {r["bound"] for r in ratios if r}
    censored = bool(kinds - {"exact"})
    if not ratios or not (always or censored):
        return None
    signs = {"exact": "", "at most": "<= ", "at least": ">= "}
    cells = ", ".join("neither reached" if r is None else "-" if r["value"] is None else f"{signs[r['bound']]}{r['value']:.2f}"
                      for r in ratios)
    line = f"- `{a}` vs `{b}`: time to target A / B per repetition {cells}"
    if censored:
        line += " (a bound where one run did not reach the target by its end)"
    if not all(r is not None and r["value"] is not None for r in ratios):
        return line
    values = [r["value"] for r in ratios]
    if kinds == {"exact"}:
        line += f"; from {min(values):.2f} to {max(values):.2f}"
    elif kinds <= {"exact", "at most"}:
        line += f"; A took at most {max(values):.2f} of B's time in every repetition"
    elif kinds <= {"exact", "at least"}:
        line += f"; A took at least {min(values):.2f} times B's time in every repetition"
    return line


def _difference(values: list[tuple], higher_is_better: bool, confidence: float) -> dict:
    """The interval of the mean of ``a - b`` over ``(a, b)`` pairs, and the verdict it supports."""
    result = _interval([a - b for a, b in values if a is not None and b is not None], confidence)
    low, high = result["low"], result["high"]
    better = "A better" if low is not None and low > 0 else "B better" if high is not None and high < 0 else CANT_TELL
    if better != CANT_TELL and not higher_is_better:
        better = "B better" if better == "A better" else "A better"
    return result | {"verdict": better}


def render_markdown(report: dict) -> str:
    if report.get("repeat", 1) > 1:
        return _render_repeated(report)
    target = report["target_accuracy"]
    lines = [
        f"# Comparison: {report.get('name', '')}", "",
        f"Scenario `{report.get('scenario', '')}`, seed {report.get('seed')}, backend {report.get('backend')}; "
        f"target accuracy {_num(target, '.4f')}; ratios against `{report['dense_reference'] or 'no dense run'}`.", "",
    ]
    sharded = _sharded(report["methods"])
    columns = COLUMNS + SERVER_COLUMNS if sharded else COLUMNS
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in report["methods"]:
        reached = row["time_to_target"]
        cells = [
            f"`{row['method']}`" + ("" if row["status"] == "completed" else f" ({row['status']})")
            + flag(row),
            _num(row["final_accuracy"], ".4f"), f"{row['updates']:,}" if row["updates"] is not None else "-",
            f"{row['ingress_payload_bytes']:,}" if row["ingress_payload_bytes"] is not None else "-",
            _num(row["bytes_per_update"], ",.0f"), _num(row["ratio_to_dense"], ".1f", "x"),
            _num(row.get("down_bytes_per_update"), ",.0f"), _num(row.get("two_way_bytes_per_update"), ",.0f"),
            "not reached" if reached is None else f"{_num(reached['time_s'], '.1f')} (update {reached['version']})",
            _num(row["compress_overhead"], ".3f"),
        ]
        if sharded:
            cells += [str(row.get("servers") or 1), _num(row.get("busiest_server_ingress_bytes"), ",.0f")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *rounds_table(report["methods"]), f"![accuracy versus cumulative ingress bytes]({report['figure']})", ""]
    return "\n".join(lines)


SERVER_COLUMNS = ("servers", "busiest server's ingress payload (B)")  # where some run split its model over several servers


def _sharded(rows: list[dict]) -> bool:
    return any((row.get("servers") or 1) > 1 for row in rows)


def rounds_table(rows: list[dict]) -> list[str]:
    """For the federated runs of a comparison: their rounds (docs/FEDERATED.md), one line per run; none without any."""
    federated = [row for row in rows if row.get("rounds")]
    if not federated:
        return []
    lines = ["Rounds of the federated runs (bytes are the server's payload per round: pushes in, models and deltas out to workers):",
             "", "| method | run | rounds | mean duration (s) | mean participants | stragglers dropped | up B / round | down B / round |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in federated:
        r = row["rounds"]
        lines.append(f"| `{row['method']}` | {row.get('run_id', '-')} | {r['count']:,} | {_num(r.get('mean_duration_s'), '.3f')} | "
                     f"{_num(r.get('mean_participants'), '.2f')} | {r.get('stragglers_dropped', 0):,} | "
                     f"{_num(r.get('up_bytes_per_round'), ',.0f')} | {_num(r.get('down_bytes_per_round'), ',.0f')} |")
    return lines + [""]


REPEATED_COLUMNS = ("method", "diverged or dead", "final accuracy, trained runs", "accuracy at the common time, trained runs",
                    "updates", "ingress payload (B)", "bytes / update", "vs dense", "down B / update", "two-way B / update",
                    "time to target (s)", "compress / compute")


def _render_repeated(report: dict) -> str:
    """The table of rates and means with intervals, then the paired tests with family-adjusted verdicts."""
    confidence = f"{report.get('confidence', CONFIDENCE):.0%}"
    seeds = report.get("seeds") or sorted({r.get("seed") for r in report["methods"]}, key=str)
    k = report.get("last_k", outcomes.LAST_K)
    at = report.get("at_time_s")
    lines = [
        f"# Comparison: {report.get('name', '')}", "",
        f"Scenario `{report.get('scenario', '')}`, backend {report.get('backend')}, {report['repeat']} paired repetitions: "
        f"repetition r runs every method with the same seed ({report.get('seed_rule', 'derived from the scenario seed')}; "
        f"seeds {', '.join(map(str, seeds))}).", "",
        f"Target accuracy {_num(report['target_accuracy'], '.4f')}"
        + (f" ({report['target_rule']})" if report.get("target_rule") else "") + ", the same for every run; "
        f"ratios against `{report['dense_reference'] or 'no dense run'}` (its mean bytes per update).", "",
        "A run either trains or does not: \"diverged or dead\" is a rate over the completed runs with its exact "
        f"{confidence} Clopper-Pearson interval. Final accuracy is the mean of a run's last {k} evaluations, averaged over "
        f"the runs that trained only; accuracy at the common time is each trained run's last evaluation by "
        f"{_num(at, '.1f')} s of training (the shortest trained run's last evaluation). Other cells: mean ± half-width of "
        f"the {confidence} Student-t interval of the mean (number of runs) over the completed runs; time to target over "
        "the runs that reached it. One row per run: `compare.json`.", "",
    ]
    sharded = _sharded(report["methods"])
    columns = REPEATED_COLUMNS + SERVER_COLUMNS if sharded else REPEATED_COLUMNS
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    servers = {}
    for row in report["methods"]:
        servers.setdefault(row["method"], row.get("servers") or 1)
    for entry in report["aggregate"]:
        notes = [f"{entry['completed']} of {entry['runs']} completed"] if entry["completed"] < entry["runs"] else []
        unreached = entry["completed"] - entry["reached_target"]
        time = "not reached" if entry["completed"] and not entry["reached_target"] else (
            _cell(entry["time_to_target"], ".1f") + (f"; not reached in {unreached}" if unreached else ""))
        cells = [f"`{entry['method']}`" + (f" ({'; '.join(notes)})" if notes else ""),
                 outcomes.rate_cell(entry.get("not_trained")),
                 _cell(entry.get("trained_accuracy") or {"n": 0}, ".4f"),
                 _cell(entry.get("trained_accuracy_at_time") or {"n": 0}, ".4f"),
                 _cell(entry["updates"], ",.0f"),
                 _cell(entry["ingress_payload_bytes"], ",.0f"), _cell(entry["bytes_per_update"], ",.0f"),
                 _cell(entry["ratio_to_dense"], ".1f", "x"), _cell(entry["down_bytes_per_update"], ",.0f"),
                 _cell(entry["two_way_bytes_per_update"], ",.0f"), time, _cell(entry["compress_overhead"], ".3f")]
        if sharded:
            cells += [str(servers.get(entry["method"], 1)), _cell(entry.get("busiest_server_ingress_bytes") or {"n": 0}, ",.0f")]
        lines.append("| " + " | ".join(cells) + " |")
    family = report.get("family", FAMILY_RULE)
    lines += ["", "## Paired differences", "",
              f"Family: {family}. Each table gives the raw p-value, Holm's adjusted one and the verdict it supports "
              "(\"can't tell\" where the adjusted p is not below 0.05, or no test could be made).", "",
              "### Diverged or dead", "",
              "Fisher's exact test (two-sided) on the 2x2 table of trained and not trained runs; a lower rate is better.", "",
              "| A | B | A: diverged or dead | B: diverged or dead | p | p (Holm) | verdict |", "|---|---|---|---|---|---|---|"]
    for pair in report["pairs"]:
        test = pair.get("not_trained")
        if test:
            lines.append(f"| `{pair['a']}` | `{pair['b']}` | {outcomes.rate_cell(test['a'])} | {outcomes.rate_cell(test['b'])} | "
                         f"{outcomes.p_cell(test['p'])} | {outcomes.p_cell(test.get('p_holm'))} | "
                         f"{_verdict(test, pair['a'], pair['b'])} |")
    lines += ["", "### Final accuracy over the repetitions in which both trained", "",
              f"A - B of the mean of the last {k} evaluations, paired by seed: mean and {confidence} Student-t interval "
              "(number of pairs), paired t test; higher is better.", "",
              "| A | B | A - B | p | p (Holm) | verdict |", "|---|---|---|---|---|---|"]
    for pair in report["pairs"]:
        test = pair.get("trained_accuracy")
        if test:
            lines.append(f"| `{pair['a']}` | `{pair['b']}` | {_cell(test, '+.4f')} | {outcomes.p_cell(test['p'])} | "
                         f"{outcomes.p_cell(test.get('p_holm'))} | {_verdict(test, pair['a'], pair['b'])} |")
    lines += ["", "### Time to target", "",
              f"A - B in seconds over the repetitions in which both completed and reached the target: mean and {confidence} "
              "Student-t interval (number of pairs), paired t test; shorter is better.", "",
              "| A | B | A - B (s) | p | p (Holm) | verdict |", "|---|---|---|---|---|---|"]
    notes = []
    for pair in report["pairs"]:
        a, b = pair["a"], pair["b"]
        time = pair["time_to_target"]
        one_sided = "; ".join(f"only `{who}` reached it ({time[key]} of {pair['completed_pairs']})"
                              for key, who in (("only_a_reached", a), ("only_b_reached", b)) if time[key])
        held = {"verdict": time.get("verdict_holm", time["verdict"])}
        lines.append(f"| `{a}` | `{b}` | {_cell(time, '+.1f') if time['n'] or not one_sided else one_sided} | "
                     f"{outcomes.p_cell(time.get('p'))} | {outcomes.p_cell(time.get('p_holm'))} | {_verdict(held, a, b)} |")
        notes += [f"- `{a}` vs `{b}`: repetition {x['repeat']} left out ({x['why']})" for x in pair["left_out"]]
        for key, who in (("only_a_reached", a), ("only_b_reached", b)):
            if time[key]:
                notes.append(f"- `{a}` vs `{b}`: only `{who}` reached the target in {time[key]} of the "
                             f"{pair['completed_pairs']} repetitions in which both completed")
        ratio = time_ratio_note(a, b, time.get("ratio") or [])
        if ratio:
            notes.append(ratio)
    lines += ["", *notes, *([""] if notes else []), *rounds_table(report["methods"]),
              f"![accuracy versus cumulative ingress bytes]({report['figure']})", ""]
    return "\n".join(lines)


def _cell(interval: dict, spec: str, suffix: str = "") -> str:
    """``mean ± half-width (n)``; ``mean (1)`` for one value; ``-`` for none."""
    if not interval["n"] or interval["mean"] is None:
        return "-"
    half = "" if interval["half_width"] is None else f" ± {interval['half_width']:{spec.lstrip('+')}}{suffix}"
    return f"{interval['mean']:{spec}}{suffix}{half} ({interval['n']})"


def _verdict(difference: dict, a: str, b: str) -> str:
    return {"A better": f"`{a}` better", "B better": f"`{b}` better"}.get(difference["verdict"], difference["verdict"])


def _num(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:{spec}}{suffix}"


def plot_accuracy_vs_ingress(rows: list[dict], target: float | None, path: Path) -> None:
    """Accuracy against cumulative applied-update bytes (log x; evaluations before the first update
    have no place on it), drawn by :func:`analysis.figures.accuracy_vs_ingress`: one style per
    method, the mean and its 95 % band over the runs that trained, a run that diverged or died
    drawn to its last evaluation with a cross; the target as a grey line."""
    import pandas as pd

    from analysis import figures

    curves = {}
    for label in _labels(rows):
        tables = []
        for r in rows:
            if r["method"] != label or not r.get("curve"):
                continue
            table = pd.DataFrame([{"ingress_bytes": p["bytes"], "accuracy": p["accuracy"]} for p in r["curve"]])
            table.attrs["outcome"] = r.get("outcome") or ("diverged" if r.get("diverged") else None)
            tables.append(table)
        curves[label] = tables
    fig = figures.accuracy_vs_ingress(curves)
    if fig is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=figures.SIZE, dpi=figures.DPI)
        fig.text(0.5, 0.5, "no evaluation after an applied update", ha="center")
    elif target is not None:
        fig.axes[0].axhline(target, color="grey", linestyle="--", linewidth=0.8)
        fig.axes[0].annotate(f"target {target:.3f}", (0.0, target), xycoords=("axes fraction", "data"), xytext=(4, 3),
                             textcoords="offset points", fontsize="x-small", color="grey")
    figures.save(fig, path)


__all__ = ["compare", "parse_method_spec", "MethodSpec", "summarize_run", "write_report", "report_of", "aggregate", "pairs",
           "accuracy_curve", "compress_overhead", "time_to", "training_start"]
