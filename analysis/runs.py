"""Run directories as pandas tables: one loader per trace stream, times from the start of training.

Every loader takes a run directory and returns a DataFrame with the stream's usual columns
(present even when the stream is missing or empty, so callers never test for columns), plus
``time_s``: seconds since training started (``ts - training_started_ts``; negative during
boot). A run killed halfway is readable: missing streams give empty tables, a cut-off last
line is skipped by :func:`emulator.control.rundir.read_jsonl` with a warning, and a missing
``summary.json`` is rebuilt from the streams by :func:`summary_row`.

A *collection* is many runs: a sweep directory (its ``sweep.json`` lists them with their grid
values) or any folder whose subfolders are run directories. :func:`load_collection` reads it.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from emulator.control.rundir import read_jsonl

#: Columns each stream's table always has (besides ``ts`` and ``time_s``).
COLUMNS: dict[str, tuple[str, ...]] = {
    "updates": ("t", "worker", "t0", "staleness", "bytes", "entries", "scale", "decode_us", "apply_us"),
    "accuracy": ("version", "accuracy", "loss", "final", "model_ts", "model_time_s"),
    "traffic": ("worker", "ingress_bytes", "pushes", "egress_bytes"),
    "steps": ("worker", "steps", "rejected", "push_bytes", "compute_ms", "compress_ms", "network_ms", "loss"),
    "events": ("source", "kind", "action", "target"),
    "net": ("device", "rx_bytes", "tx_bytes"),
    "stats": ("device", "cpu_s"),
}
STREAMS = tuple(COLUMNS)
TEXT_COLUMNS = frozenset({"source", "kind", "action", "target", "device"})
NO_WORKER = 0xFFFFFFFF  # the server's worker id for the evaluator's and probes' connections


# -- single files ------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    """The file's object; ``{}`` when it is absent, and also, with a warning naming the file and
    the place, when it is damaged (a run killed while writing it)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        warnings.warn(f"{path}: line {exc.lineno}, column {exc.colno}: {exc.msg} (cut off?); read as if absent", stacklevel=2)
        return {}
    except (ValueError, RecursionError) as exc:
        warnings.warn(f"{path}: not valid JSON ({exc}); read as if absent", stacklevel=2)
        return {}
    if not isinstance(data, dict):
        warnings.warn(f"{path}: a JSON {type(data).__name__}, not an object; read as if absent", stacklevel=2)
        return {}
    return data


def _is_number(value) -> bool:
    return value is None or isinstance(value, (int, float))  # bool is an int: final


def _records(path: Path, stream: str) -> list[dict]:
    """The stream's records; one whose numeric field holds something else is skipped with a
    warning naming the file, line and field, so that one damaged line costs one record."""
    numeric = [c for c in ("ts", *COLUMNS[stream]) if c not in TEXT_COLUMNS]
    kept = []
    for number, record in read_jsonl(path, numbered=True):
        wrong = next((c for c in numeric if not _is_number(record.get(c))), None)
        if wrong is not None:
            warnings.warn(f"{path}:{number}: field {wrong!r} is {record[wrong]!r}, not a number; record skipped", stacklevel=2)
            continue
        kept.append(record)
    return kept


def load_summary(run: str | Path) -> dict:
    """``summary.json`` as written at the end of the run; ``{}`` when the run never finished."""
    return _read_json(Path(run) / "summary.json")


def load_json(run: str | Path, name: str) -> dict:
    """A JSON file of the run directory (``fidelity.json``, ``mechanisms.json``); ``{}`` when absent
    or damaged (then with a warning naming it)."""
    return _read_json(Path(run) / name)


def load_plan(run: str | Path) -> dict:
    """``plan.json``: every device (cpus, link), the timeline, the method; ``{}`` when absent."""
    return _read_json(Path(run) / "plan.json")


def training_start_ts(run: str | Path, summary: dict | None = None) -> float:
    """The trace-clock time at which training started.

    From ``summary.json``; for a run killed before its summary, from the controller's
    ``training_started`` event (its ``boot_s``); else 0 (times are then from the run's start).
    """
    summary = load_summary(run) if summary is None else summary
    if summary.get("training_started_ts") is not None:
        return float(summary["training_started_ts"])
    for record in read_jsonl(Path(run) / "events.jsonl"):
        if record.get("kind") == "training_started" and record.get("source") == "controller":
            return float(record.get("boot_s", record.get("ts", 0.0)))
    return 0.0


# -- streams -----------------------------------------------------------------------------


def load_stream(run: str | Path, stream: str, start_ts: float | None = None) -> pd.DataFrame:
    """One ``<stream>.jsonl`` as a table with ``ts`` and ``time_s`` (seconds since training started)."""
    if stream not in COLUMNS:
        raise ValueError(f"unknown stream {stream!r}; known: {', '.join(STREAMS)}")
    run = Path(run)
    start = training_start_ts(run) if start_ts is None else start_ts
    frame = pd.DataFrame.from_records(_records(run / f"{stream}.jsonl", stream))
    for column in ("ts", *COLUMNS[stream]):
        if column not in frame.columns:
            frame[column] = pd.Series(dtype="object" if column in TEXT_COLUMNS else "float64")
    frame["ts"] = pd.to_numeric(frame["ts"], errors="coerce")
    frame["time_s"] = frame["ts"] - start
    return frame.sort_values("ts", kind="stable").reset_index(drop=True)


def load_updates(run, start_ts=None) -> pd.DataFrame:
    """Updates applied by the server, in order of ``t``; adds ``cum_bytes`` (payload applied so far)."""
    frame = load_stream(run, "updates", start_ts).sort_values("t", kind="stable").reset_index(drop=True)
    frame["cum_bytes"] = frame["bytes"].fillna(0).cumsum()
    return frame


def load_accuracy(run, start_ts=None) -> pd.DataFrame:
    """Evaluations of model snapshots: ``version`` (updates applied), ``accuracy``, ``loss``, ``final``.

    ``time_s`` is when the evaluation ended; ``model_time_s`` when its snapshot was taken (the
    time the accuracy belongs to), falling back to ``time_s`` for records without ``model_ts``.
    """
    frame = load_stream(run, "accuracy", start_ts)
    start = frame["ts"].iloc[0] - frame["time_s"].iloc[0] if len(frame) else 0.0
    frame["model_time_s"] = (pd.to_numeric(frame["model_ts"], errors="coerce") - start).fillna(frame["time_s"])
    return frame.sort_values(["version", "ts"], kind="stable").reset_index(drop=True)


def load_traffic(run, start_ts=None) -> pd.DataFrame:
    """Per second and worker: bytes the server received (``ingress_bytes``) and sent, pushes."""
    return load_stream(run, "traffic", start_ts)


def load_steps(run, start_ts=None) -> pd.DataFrame:
    """Per second and worker: steps, compute / compression / network time, training loss."""
    return load_stream(run, "steps", start_ts)


def load_events(run, start_ts=None) -> pd.DataFrame:
    """Lifecycle and fault events; ``kind == "fault"`` rows have ``action`` and ``target``."""
    return load_stream(run, "events", start_ts)


def load_net(run, start_ts=None) -> pd.DataFrame:
    """Per second and device: cumulative interface bytes ``rx_bytes``/``tx_bytes`` (docker backend only)."""
    return load_stream(run, "net", start_ts)


def load_stats(run, start_ts=None) -> pd.DataFrame:
    """Per second and device: cumulative CPU seconds ``cpu_s`` and memory."""
    return load_stream(run, "stats", start_ts)


LOADERS = {
    "updates": load_updates, "accuracy": load_accuracy, "traffic": load_traffic, "steps": load_steps,
    "events": load_events, "net": load_net, "stats": load_stats,
}


# -- derived tables (pure functions of the tables above) ----------------------------------


def faults(events: pd.DataFrame) -> pd.DataFrame:
    """The fault rows of the events table: ``time_s``, ``action``, ``target``."""
    rows = events[events["kind"] == "fault"] if len(events) else events
    return rows[["time_s", "action", "target"]].reset_index(drop=True)


def accuracy_with_ingress(accuracy: pd.DataFrame, updates: pd.DataFrame) -> pd.DataFrame:
    """Accuracy rows with ``ingress_bytes``: payload of the updates applied up to the evaluated version.

    Model version ``v`` is the model after ``v`` applied updates, so its ingress is the bytes of
    updates ``t = 1 .. v`` (whole frames, headers included). Frames the server refused are not
    counted: they did not shape the model.
    """
    out = accuracy.copy()
    if updates.empty:
        out["ingress_bytes"] = np.where(out["version"].fillna(0) == 0, 0.0, np.nan)
        return out
    ordered = updates.sort_values("t")
    t = ordered["t"].to_numpy(dtype=float)
    cum = ordered["bytes"].fillna(0).cumsum().to_numpy(dtype=float)
    positions = np.searchsorted(t, out["version"].to_numpy(dtype=float), side="right")
    out["ingress_bytes"] = np.where(positions > 0, cum[np.maximum(positions - 1, 0)], 0.0)
    return out


def _spaced(ts: np.ndarray, min_interval_s: float) -> np.ndarray:
    """Indices of the samples kept so that consecutive kept samples are ``min_interval_s`` apart."""
    kept, last = [], -np.inf
    for i, t in enumerate(ts):
        if t - last >= min_interval_s:
            kept.append(i)
            last = t
    return np.asarray(kept, dtype=int)


def counter_rates(frame: pd.DataFrame, key: str, columns: tuple[str, ...], min_interval_s: float = 0.5) -> pd.DataFrame:
    """Per-second rates of cumulative counters, per ``key`` (device).

    ``rate = diff(value) / diff(ts)`` between consecutive samples of the same device, over
    intervals of at least ``min_interval_s`` (a sample closer than that to the previous one is
    skipped: the controller also samples at the start and the end of training, and a byte count
    over 40 ms is not a rate). A counter that went down (a restarted process starts from zero)
    gives no rate there. Returns ``time_s`` (the interval's end), ``since_s`` (its start),
    ``key`` and one ``<column>_rate`` per column.
    """
    parts = []
    for name, rows in frame.sort_values("ts").groupby(key, sort=True):
        rows = rows.iloc[_spaced(rows["ts"].to_numpy(dtype=float), min_interval_s)]
        dt = rows["ts"].diff()
        part = pd.DataFrame({"time_s": rows["time_s"], "since_s": rows["time_s"].shift(), key: name})
        for column in columns:
            rate = rows[column].astype(float).diff() / dt
            part[f"{column}_rate"] = rate.where((rate >= 0) & (dt > 0))
        parts.append(part.iloc[1:])
    if not parts:
        return pd.DataFrame(columns=["time_s", "since_s", key, *(f"{c}_rate" for c in columns)])
    return pd.concat(parts, ignore_index=True)


def servers_cpu_s(stats: pd.DataFrame, names: Sequence[str] = ("server",)) -> dict[str, float]:
    """CPU seconds each server process used during training (the rise of its cumulative CPU time
    between its first and last sample at or after the start of training); a server without two
    such samples is left out. ``names``: the run's servers (``server``, or ``server-0`` ...)."""
    out = {}
    if stats is None or stats.empty or "device" not in stats:
        return out
    for name in names:
        rows = stats[(stats["device"] == name) & (stats["time_s"] >= 0)].dropna(subset=["cpu_s"]).sort_values("time_s")
        if len(rows) >= 2:
            out[name] = round(float(rows["cpu_s"].iloc[-1] - rows["cpu_s"].iloc[0]), 3)
    return out


STEP_PHASES = ("compute_ms", "compress_ms", "network_ms", "compute_cpu_ms", "compress_cpu_ms")


def step_phases(steps) -> dict[str, float]:
    """A worker step's phases averaged over every step of every worker: gradient, compression and
    the exchange (push sent to reply taken), wall milliseconds, and the gradient's and compression's
    CPU milliseconds. ``steps``: the ``steps`` stream (a table, or its records), each row a
    reporting interval's means over its ``steps``; {} without steps."""
    rows = steps.to_dict("records") if isinstance(steps, pd.DataFrame) else list(steps or [])
    out = {}
    for key in STEP_PHASES:  # each over the intervals that report it (older traces lack the CPU columns)
        known = [(r[key], r.get("steps") or 0) for r in rows if isinstance(r.get(key), (int, float)) and r[key] == r[key]]
        total = sum(n for _, n in known)
        if total:
            out[key] = round(sum(v * n for v, n in known) / total, 3)
    return out


def container_usage(run_dir) -> tuple[dict, dict]:
    """What a container run says of each worker's CPU: ``(run, workers)``, ``run`` its backend, path,
    plan digest and seed; per worker with two CPU samples during training, its cgroup CPU seconds
    then, its steps, the bytes it pulled, and the gradient's and compression's CPU (ms, weighted by
    steps) from its step records. The virtual backend's container calibration reads it."""
    run = load_run(run_dir)
    summary = run.summary
    info = {"run": str(run_dir), "backend": summary.get("backend"), "plan_digest": summary.get("plan_digest"),
            "seed": summary.get("seed")}
    stats, workers = run.stats, {}
    for name, rows in run.steps.groupby("source"):
        done = int(rows["steps"].sum())
        cpu = stats[(stats["device"] == name) & (stats["time_s"] >= 0)].dropna(subset=["cpu_s"]).sort_values("time_s")
        if not done or len(cpu) < 2:
            continue
        mean = lambda column: float((rows[column].fillna(0) * rows["steps"]).sum() / done) if column in rows else 0.0  # noqa: E731
        workers[name] = {"cpu_s": float(cpu["cpu_s"].iloc[-1] - cpu["cpu_s"].iloc[0]), "steps": done,
                         "pull_bytes": float(rows["pull_bytes"].fillna(0).sum()) if "pull_bytes" in rows else 0.0,
                         "compute_cpu_ms": mean("compute_cpu_ms"), "compress_cpu_ms": mean("compress_cpu_ms")}
    return info, workers


def server_cpu_per_update(stats: pd.DataFrame, updates: int | None) -> float | None:
    """Seconds of the (one) server's CPU per applied update over training (:func:`servers_cpu_s`);
    None without samples or updates."""
    used = servers_cpu_s(stats).get("server") if updates else None
    return None if used is None else used / updates


def traffic_both_ways(traffic: pd.DataFrame) -> pd.DataFrame:
    """Per whole second of training: bytes the server received from the workers (``up``) and sent
    them (``down``: replies and pulls), the evaluator's pulls left out."""
    if traffic is None or traffic.empty:
        return pd.DataFrame(columns=["up", "down"], dtype=float)
    rows = traffic[traffic["worker"].notna() & (traffic["worker"] < NO_WORKER)]
    second = np.floor(rows["time_s"]).astype(int)
    table = rows.assign(second=second).groupby("second")[["ingress_bytes", "egress_bytes"]].sum()
    table = table.reindex(range(int(table.index.min()), int(table.index.max()) + 1), fill_value=0) if len(table) else table
    return table.rename(columns={"ingress_bytes": "up", "egress_bytes": "down"}).astype(float)


def ingress_per_second(traffic: pd.DataFrame, workers: list | None = None) -> pd.DataFrame:
    """Ingress bytes per second at the server: one row per whole second of training, one column per worker.

    The server reports every second the bytes each worker pushed during that second, and
    nothing for a silent worker: silent seconds become zeros. ``workers`` fixes the columns
    (a worker that never pushed still gets its column of zeros); the evaluator's pulls are not ingress.
    """
    traffic = traffic[traffic["worker"].notna() & (traffic["worker"] < NO_WORKER)]
    columns = sorted(workers) if workers else sorted(set(traffic["worker"].astype(int)))
    traffic = traffic[traffic["worker"].isin(columns)]
    if traffic.empty:
        return pd.DataFrame(columns=columns, dtype=float)
    second = np.floor(traffic["time_s"]).astype(int)
    table = traffic.assign(second=second, worker=traffic["worker"].astype(int)).pivot_table(
        index="second", columns="worker", values="ingress_bytes", aggfunc="sum", fill_value=0)
    full = range(int(table.index.min()), int(table.index.max()) + 1)
    table = table.reindex(index=full, columns=columns, fill_value=0).astype(float)
    table.index.name = "time_s"
    table.columns.name = "worker"
    return table


def worker_shares(updates: pd.DataFrame, workers: list | None = None) -> pd.Series:
    """Fraction of the applied updates that each worker contributed (workers with none: 0)."""
    counts = updates["worker"].dropna().astype(int).value_counts()
    index = sorted(set(workers or []) | set(counts.index))
    counts = counts.reindex(index, fill_value=0)
    total = counts.sum()
    return (counts / total if total else counts.astype(float)).rename("share")


# -- one run -----------------------------------------------------------------------------


@dataclass
class Run:
    """Everything a run directory holds, loaded once: summary, plan and one table per stream."""

    path: Path
    summary: dict
    plan: dict
    start_ts: float
    tables: dict[str, pd.DataFrame] = field(repr=False)

    updates = property(lambda self: self.tables["updates"])
    accuracy = property(lambda self: self.tables["accuracy"])
    traffic = property(lambda self: self.tables["traffic"])
    steps = property(lambda self: self.tables["steps"])
    events = property(lambda self: self.tables["events"])
    net = property(lambda self: self.tables["net"])
    stats = property(lambda self: self.tables["stats"])

    @property
    def run_id(self) -> str:
        return self.summary.get("run_id") or self.path.name

    @property
    def method(self) -> str:
        return self.summary.get("method") or self.plan.get("method", {}).get("name") or "?"

    @property
    def worker_names(self) -> list[int]:
        """Worker indices of the plan (also those that never pushed)."""
        return [w["index"] for w in self.plan.get("workers", [])]

    @property
    def faults(self) -> pd.DataFrame:
        return faults(self.tables["events"])

    def row(self) -> dict:
        return summary_row(self)


def load_run(path: str | Path) -> Run:
    """Load a run directory (complete or not); raises FileNotFoundError if it is not one."""
    path = Path(path)
    if not is_run_dir(path):
        raise FileNotFoundError(f"{path} is not a run directory (no summary.json, plan.json or trace stream)")
    summary = load_summary(path)
    start = training_start_ts(path, summary)
    tables = {stream: loader(path, start) for stream, loader in LOADERS.items()}
    return Run(path, summary, load_plan(path), start, tables)


def is_run_dir(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and any((path / name).exists() for name in ("summary.json", "plan.json", "events.jsonl", "updates.jsonl"))


def _number(value):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _last_k(accuracy: pd.DataFrame) -> float | None:
    """The mean of the last evaluations of the trained model (:func:`analysis.outcomes.mean_of_last`)."""
    from analysis.outcomes import mean_of_last

    if not len(accuracy) or "accuracy" not in accuracy:
        return None
    trained = accuracy[accuracy["version"] > 0] if "version" in accuracy and (accuracy["version"] > 0).any() else accuracy
    return mean_of_last([_number(float(a)) for a in trained["accuracy"] if a is not None and not pd.isna(a)])


def server_shares(summary: dict) -> dict:
    """How many servers a run had and the ingress payload of the busiest one (its link saturates
    first): with one server, the run's total ingress."""
    servers = summary.get("servers") or []
    if not servers:
        return {"servers": 1, "busiest_server_ingress_bytes": _number(summary.get("ingress_payload_bytes"))}
    return {"servers": len(servers),
            "busiest_server_ingress_bytes": max(int(s.get("ingress_payload_bytes") or 0) for s in servers)}


def summary_row(run: Run) -> dict:
    """The report's one line for a run: from ``summary.json``, else rebuilt from the streams."""
    s, plan = run.summary, run.plan
    updates, accuracy, traffic = run.tables["updates"], run.tables["accuracy"], run.tables["traffic"]
    last = accuracy.iloc[-1] if len(accuracy) else None
    fault_counts = s.get("faults")
    if fault_counts is None:
        fault_counts = run.faults["action"].value_counts().to_dict() if len(run.faults) else {}
    duration = s.get("duration_s")
    if duration is None and len(updates):
        duration = float(updates["time_s"].max())
    return {
        "run_id": run.run_id,
        "status": s.get("status", "incomplete"),
        "outcome": s.get("outcome") or ("diverged" if s.get("diverged") else None),  # emulator.control.summary
        "method": run.method,
        "workers": s.get("workers", len(plan.get("workers", [])) or None),
        "final_accuracy": _number(s.get("final_accuracy", None if last is None else float(last["accuracy"]))),
        "final_accuracy_last_k": _last_k(accuracy),
        "updates": _number(s.get("updates_applied", int(updates["t"].max()) if len(updates) else 0)),
        "ingress_payload_bytes": _number(s.get("ingress_payload_bytes", int(traffic["ingress_bytes"].sum()) if len(traffic) else 0)),
        "ingress_wire_bytes": _number(s.get("ingress_wire_bytes")),
        "egress_payload_bytes": _number(s.get("egress_payload_bytes", int(traffic["egress_bytes"].sum())
                                                if len(traffic) and "egress_bytes" in traffic else None)),
        "egress_wire_bytes": _number(s.get("egress_wire_bytes")),
        "two_way_bytes_per_update": _number(s.get("two_way_bytes_per_update")),
        "duration_s": _number(duration),
        **server_shares(s),
        "faults": {str(k): int(v) for k, v in sorted(fault_counts.items())},
        "backend": s.get("backend"),
    }


# -- many runs ---------------------------------------------------------------------------


@dataclass
class Collection:
    """Many runs: a sweep (``grid`` keys and each run's values) or a plain folder of run directories."""

    path: Path
    runs: list[Run]
    grid: dict[str, list] = field(default_factory=dict)  # key -> values in grid order; {} for a folder
    values: dict[str, dict] = field(default_factory=dict)  # run id -> {key: value, "point": i, "repetition": r}
    sweep: dict = field(default_factory=dict)  # sweep.json as written; {} for a folder
    missing: list[dict] = field(default_factory=list)  # runs listed in sweep.json whose directory is absent

    @property
    def is_sweep(self) -> bool:
        return bool(self.sweep)

    def table(self) -> pd.DataFrame:
        """One row per run: its grid values (one column per grid key), then :func:`summary_row`."""
        rows = []
        for run in self.runs:
            values = self.values.get(run.path.name, {})
            rows.append({**{k: values.get(k) for k in ("point", "repetition") if k in values},
                         **{k: values.get(k) for k in self.grid}, **summary_row(run)})
        return pd.DataFrame(rows)


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / "sweep.json").is_file()


def load_collection(path: str | Path) -> Collection:
    """A sweep directory (``sweep.json``) or a folder of run directories, every readable run loaded."""
    path = Path(path)
    if is_sweep_dir(path):
        sweep = json.loads((path / "sweep.json").read_text())
        grid = {g["key"]: g["values"] for g in sweep.get("grid", [])}
        runs, values, missing = [], {}, []
        for point in sweep.get("points", []):
            for entry in point.get("runs", []):
                run_path = path / entry["run_id"]
                if not is_run_dir(run_path):
                    missing.append({**entry, "point": point["index"]})
                    continue
                runs.append(load_run(run_path))
                values[entry["run_id"]] = {**point.get("values", {}), "point": point["index"], "repetition": entry["repetition"]}
        return Collection(path, runs, grid, values, sweep, missing)
    runs = [load_run(p) for p in sorted(path.iterdir()) if is_run_dir(p)]
    if not runs:
        raise FileNotFoundError(f"{path}: neither a run directory, a sweep directory, nor a folder of runs")
    return Collection(path, runs)


__all__ = [
    "COLUMNS", "STREAMS", "LOADERS", "Collection", "Run", "accuracy_with_ingress", "counter_rates", "faults",
    "ingress_per_second", "is_run_dir", "is_sweep_dir", "load_accuracy", "load_collection", "load_events",
    "container_usage", "load_net", "load_plan", "load_run", "load_stats", "load_steps", "load_stream", "load_summary",
    "load_traffic", "load_updates", "server_cpu_per_update", "server_shares", "servers_cpu_s", "step_phases", "summary_row", "traffic_both_ways", "training_start_ts",
    "worker_shares",
]
