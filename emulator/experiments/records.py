"""Compact run records: what a reviewer needs of a run, small enough to commit, and nothing else.

A run directory holds about 40 MB of traces at 64 devices and 20,000 updates; the published
numbers need a few kilobytes of it. :func:`make_record` reduces one run directory to a record:

- ``row``: the comparison's row of the run (:func:`emulator.experiments.compare.summarize_run`,
  without its curve): status, outcome, final accuracy, updates, bytes per update, ...;
- ``summary``: the run's ``summary.json`` as written (counters, wire bytes, faults, timings);
- ``evaluations``: per evaluation the model version, training time of its snapshot and of the
  evaluation's end, accuracy, loss, and the cumulative bytes of the updates applied by then;
- ``traffic``: per whole second of training the bytes the server received from workers and sent
  them (:func:`analysis.runs.traffic_both_ways`);
- ``staleness``: the delay d of applied updates as a histogram (d -> updates), its median, 95th
  percentile and maximum, and for AdaComp sigma / d as a histogram in steps of
  :data:`SIGMA_STEP` with its median and the share of updates whose sigma is 0;
- ``server_cpu_s``: CPU seconds each server process used during training (where sampled);
- ``step_phases``: a worker step's gradient, compression and exchange, mean milliseconds (wall and CPU);
- ``worker_updates``: updates applied per worker; ``plan``: the seed, method, training section,
  and each worker's CPU quota and links; ``provenance``: where it came from (experiment, label,
  repetition, grid values, the command, the commit that wrote the record).

:func:`write_record` stores it as gzip-compressed JSON with sorted keys and no timestamp in the
gzip header, so the same run gives the same bytes on every machine; :func:`read_records` loads a
folder of them in a stable order. Records are the raw data of docs/reproduction: everything
published there is regenerated from them (:mod:`emulator.experiments.paper.regenerate`).
"""

from __future__ import annotations

import gzip
import io
import json
import math
from pathlib import Path

import numpy as np

from emulator.control.summary import traffic_per_push

FORMAT = 1
SUFFIX = ".json.gz"
SIGMA_STEP = 0.005  # sigma / d histogram bin width


def clean(value):
    """JSON-safe and stable: NaN and infinities become None, numpy scalars plain numbers, floats
    rounded to 9 significant digits (what float32 traces carry, and no platform noise)."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return None if not math.isfinite(value) else float(f"{value:.9g}")
    return value


def _histogram(values: np.ndarray) -> dict[str, int]:
    keys, counts = np.unique(values, return_counts=True)
    return {f"{k:g}": int(c) for k, c in zip(keys, counts)}


def staleness_record(updates) -> dict:
    """d and sigma / d of the applied updates, as histograms and their summary figures."""
    from analysis.staleness import staleness_figures

    import pandas as pd

    got = staleness_figures(updates)
    d = pd.to_numeric(updates.get("staleness", pd.Series(dtype=float)), errors="coerce").dropna().astype(int).to_numpy()
    out = {**got, "d_histogram": _histogram(d) if len(d) else {}}
    if "sigma" in updates and len(d):
        both = updates[["staleness", "sigma"]].apply(pd.to_numeric, errors="coerce").dropna()
        both = both[both["staleness"] > 0]
        share = np.round((both["sigma"] / both["staleness"]).to_numpy() / SIGMA_STEP).astype(int) * SIGMA_STEP
        out["sigma_over_d_histogram"] = _histogram(np.round(share, 6))
    return out


def fidelity_record(run_dir: Path) -> dict:
    """What the run's fidelity check found (``fidelity.json``): a reader of the record can tell a run
    whose devices did not get their CPU share or link (a machine shared with other work) from a clean one."""
    path = Path(run_dir) / "fidelity.json"
    if not path.exists():
        return {"checked": False}
    report = json.loads(path.read_text())
    failures = report.get("failures", [])
    return {"checked": True, "ok": bool(report.get("ok")), "failures": len(failures), "first_failures": failures[:5],
            "tolerance": report.get("tolerance")}


def make_record(run_dir: Path, *, experiment: str, label: str, repeat: int = 0, kind: str = "compare",
                grid: dict | None = None, command: str | None = None, commit: str | None = None,
                extra: dict | None = None) -> dict:
    """The compact record of one run directory (see the module's docstring); ``extra`` adds
    measured facts the run directory does not hold (the authors'-format bytes of its push)."""
    from analysis.runs import load_run, servers_cpu_s, step_phases, traffic_both_ways, worker_shares
    from emulator.experiments.compare import summarize_run

    run_dir = Path(run_dir)
    row = summarize_run(run_dir, label)
    curve = row.pop("curve")
    run = load_run(run_dir)
    accuracy = run.accuracy
    evaluations = {"version": [], "model_time_s": [], "time_s": [], "accuracy": [], "loss": [], "bytes": []}
    by_version = {}
    for point in curve:
        by_version.setdefault(point["version"], []).append(point)
    for _, record in accuracy.iterrows():
        if record.get("accuracy") is None or (isinstance(record.get("accuracy"), float) and math.isnan(record["accuracy"])):
            continue
        version = int(record["version"])
        matched = by_version.get(version, [{}]).pop(0) if by_version.get(version) else {}
        evaluations["version"].append(version)
        evaluations["model_time_s"].append(round(float(record["model_time_s"]), 3) if "model_time_s" in record else None)
        evaluations["time_s"].append(matched.get("time_s"))
        evaluations["accuracy"].append(float(record["accuracy"]))
        evaluations["loss"].append(float(record["loss"]) if "loss" in record and record["loss"] is not None else None)
        evaluations["bytes"].append(matched.get("bytes"))
    traffic = traffic_both_ways(run.traffic)
    counts = worker_shares(run.updates, run.worker_names) * len(run.updates) if len(run.updates) else None
    plan = run.plan or {}
    workers = plan.get("workers", [])
    record = {
        "format": FORMAT, "kind": kind, "experiment": experiment, "label": label, "repeat": repeat,
        "run_id": run_dir.name, "seed": plan.get("seed", run.summary.get("seed")),
        "plan_digest": run.summary.get("plan_digest"),
        "provenance": {"command": command, "commit": commit, "scenario": run.summary.get("name"), "grid": grid or {}},
        "row": row, "summary": run.summary, "evaluations": evaluations,
        "traffic": {"second": [int(s) for s in traffic.index], "up": traffic["up"].astype(int).tolist(),
                    "down": traffic["down"].astype(int).tolist()},
        "staleness": staleness_record(run.updates) if len(run.updates) else {},
        "fidelity": fidelity_record(run_dir),
        "server_cpu_s": servers_cpu_s(run.stats, [s["name"] for s in run.summary.get("servers") or [{"name": "server"}]]),
        "step_phases": step_phases(run.steps),
        "worker_updates": {} if counts is None else {str(int(k)): int(round(v)) for k, v in counts.items()},
        "plan": {"seed": plan.get("seed"), "method": plan.get("method"), "training": plan.get("training"),
                 "dataset": plan.get("dataset"),
                 "workers": [{k: w.get(k) for k in ("index", "cpus", "link") if k in w} for w in workers],
                 "server": {k: v for k, v in (plan.get("server") or {}).items() if k in ("cpus", "link")}},
        **(extra or {}),
    }
    return clean(record)


def record_bytes(record: dict) -> bytes:
    """The record as stored: gzip (level 9, no name, mtime 0) of its JSON with sorted keys."""
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=buffer, mtime=0) as out:
        out.write(text)
    return buffer.getvalue()


def write_record(path: Path, record: dict) -> Path:
    """Write ``record`` to ``path`` (a ``.json.gz`` file), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(record_bytes(record))
    partial.replace(path)
    return path


def read_record(path: Path) -> dict:
    return json.loads(gzip.decompress(Path(path).read_bytes()))


def read_records(folder: Path) -> list[dict]:
    """Every record under ``folder`` (any depth), ordered by experiment, then file name."""
    paths = sorted(Path(folder).rglob(f"*{SUFFIX}"), key=lambda p: (p.parent.as_posix(), p.name))
    return sorted((read_record(p) for p in paths), key=lambda r: (r["experiment"], r.get("order", 0), r["run_id"]))


def experiment_records(folder: Path, experiment: str) -> list[dict]:
    """The records of one experiment under ``folder`` (``<folder>/<experiment>/``); none if it has none."""
    where = Path(folder) / experiment
    return read_records(where) if where.is_dir() else []


def accuracy_table(record: dict):
    """A record's evaluations as :mod:`analysis.figures` draws them (a DataFrame), its outcome in ``attrs``."""
    import pandas as pd

    e = record["evaluations"]
    table = pd.DataFrame({"version": e["version"], "model_time_s": e["model_time_s"], "accuracy": e["accuracy"],
                          "ingress_bytes": e["bytes"]})
    table.attrs["outcome"] = record["row"].get("outcome")
    table.attrs["run"] = record["run_id"]
    return table


def staleness_rows(record: dict):
    """A record's staleness histogram as the applied updates' ``staleness`` column (a DataFrame, as
    :func:`analysis.figures.staleness_histogram` reads a run's updates)."""
    import pandas as pd

    histogram = record.get("staleness", {}).get("d_histogram", {})
    values = np.repeat(np.array([float(k) for k in histogram], float), [int(c) for c in histogram.values()])
    return pd.DataFrame({"staleness": values})


def curve_of(record: dict) -> list[dict]:
    """The comparison's curve (version, cumulative bytes, accuracy, training time) of a record."""
    e = record["evaluations"]
    return [{"version": v, "bytes": b or 0, "accuracy": a, "time_s": t}
            for v, b, a, t in zip(e["version"], e["bytes"], e["accuracy"], e["time_s"])]


def compare_rows(records: list[dict]) -> list[dict]:
    """The comparison's rows (as ``emulate compare`` makes them from run directories) from records;
    bytes both ways per push from the run's summary, as ``compare.summarize_run`` counts them (a
    record's row may be from before federated steps were divided into pushes)."""
    return [{**r["row"], **traffic_per_push(r["summary"], r["row"].get("bytes_per_update")),
             "curve": curve_of(r), "repeat": r["repeat"], "seed": r["seed"]} for r in records]


def run_seconds(summary: dict) -> float:
    """A run's run time: its boot and its training, from its summary (the time a rerun that reuses it saves)."""
    return (summary.get("boot_s") or 0) + (summary.get("duration_s") or 0)


def record_path(folder: Path, experiment: str, run_id: str) -> Path:
    return Path(folder) / experiment / f"{run_id}{SUFFIX}"


__all__ = ["FORMAT", "SUFFIX", "accuracy_table", "clean", "compare_rows", "curve_of", "experiment_records", "make_record", "read_record", "read_records", "record_bytes", "record_path", "staleness_rows",
           "run_seconds", "staleness_record", "write_record"]
