"""Running the experiments' runs through the library's own commands (``emulate compare``,
``emulate sweep``), each with the command line that reproduces it, and the guards that read back
which runs failed and why: a failed run is a row with its cause, never a silent gap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from emulator.experiments.paper.profiles import PAPER, ROOT
from emulator.experiments.records import (clean, compare_rows, experiment_records, make_record, read_record, record_path, run_seconds,
                                          write_record)


def command_line(parts: list[str]) -> str:
    """``parts`` as one shell line, quoting the parts that need it."""
    return " ".join(p if p.replace("-", "").replace("_", "").replace("/", "").replace(".", "").replace("=", "").isalnum()
                    else f"'{p}'" for p in parts)


def _options(backend: str, overrides: list[str], repeat: int) -> list[str]:
    """The options compare and sweep share, as they were given."""
    return ["--backend", backend, *sum((["--set", o] for o in overrides), []), *(["--repeat", str(repeat)] if repeat > 1 else [])]


def run_comparison(name: str, methods: list[str], overrides: list[str], repeat: int, out: Path, backend: str, say,
                   from_records: bool = False, record_extra: Callable[[Path], dict] | None = None) -> dict:
    """``emulate compare`` of the paper's methods scenario into ``<out>/runs/<name>``: a rerun reuses
    every run that finished there (an interrupted `make figures` resumes). Each run's compact
    record goes to ``<out>/records/<name>/`` (:func:`write_comparison_records`).

    ``from_records``: a run that has a record of the same plan there (committed by an earlier
    session, on any machine: the driver copies ``--records`` in) is read from it, not run again,
    and each run made here is recorded as soon as it ends; a comparison longer than a sitting so
    goes on in the next one. Only for experiments whose sections read the comparison's table and
    records, not its run directories. ``record_extra(run_dir)``: facts each run's record adds to
    what its directory holds (the authors'-format bytes of its push)."""
    from emulator.experiments.compare import compare

    directory = out / "runs" / name
    before = _finished(directory)
    command = command_line(["emulate", "compare", "scenarios/paper/methods.yaml", *sum((["-m", m] for m in methods), []),
                            *_options(backend, overrides, repeat), "--dir", str(directory)])
    known, after = None, None
    if from_records:
        records = experiment_records(out / "records", name)
        known = {r["plan_digest"]: {**row, "recorded_seconds": run_seconds(r["summary"])}
                 for r, row in zip(records, compare_rows(records)) if r.get("plan_digest")}

        def after(run, run_dir: Path) -> None:
            write_run_record(out, name, run_dir, run.spec.label, run.repeat, run.repeat * 1000, command, commit(),
                             record_extra(run_dir) if record_extra else None)

    compare(PAPER / "methods.yaml", methods, out / "runs", backend=backend, overrides=overrides, say=say,
            repeat=repeat, directory=directory, known=known, after_run=after)
    result = {"name": name, "directory": str(directory), "command": command, "repeat": repeat,
              "table": json.loads((directory / "compare.json").read_text())}
    result["runs"] = run_counts(directory, result["table"]["methods"], before)
    write_comparison_records(result, out, record_extra)
    return result


def _finished(directory: Path) -> set[str]:
    """The runs under ``directory`` that had finished (a summary.json) before this invocation ran anything."""
    return {p.parent.name for p in Path(directory).glob("*/summary.json")}


def run_counts(directory: Path, rows: list[dict], before: set[str]) -> dict:
    """How many runs an experiment holds, how many were reused from an earlier invocation (or read
    from their records: a row with ``recorded_seconds``), and the run time of them all (boot and
    training, summed from their summaries): what "wall time" of a resumed invocation does not say."""
    seconds, reused = 0.0, 0
    for row in rows:
        path = Path(directory) / row["run_id"] / "summary.json"
        if path.exists():
            seconds += run_seconds(json.loads(path.read_text()))
            reused += row["run_id"] in before
        elif row.get("recorded_seconds") is not None:
            seconds += row["recorded_seconds"]
            reused += 1
    return {"runs": len(rows), "reused": reused, "run_seconds": seconds}


def commit() -> str | None:
    """The repository's commit (with ``-dirty`` when the work tree has changes), or None without git."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def keep_commit(path: Path, fresh: str | None, run_dir: Path | None = None) -> str | None:
    """A record's commit is the one that first wrote it: a rerun that reuses the run keeps it. A
    record of another run under the same name (a committed record, the run made again here) does not."""
    if path.exists():
        try:
            stored = read_record(path)
            if run_dir is not None and stored.get("summary") != clean(json.loads((Path(run_dir) / "summary.json").read_text())):
                return fresh
            return stored["provenance"].get("commit")
        except (OSError, ValueError, KeyError):
            return fresh
    return fresh


def write_comparison_records(result: dict, out: Path, extra: Callable[[Path], dict] | None = None) -> list[Path]:
    """One record per run of a :func:`run_comparison` under ``<out>/records/<name>/`` (``extra(run_dir)``:
    facts to add, such as the authors'-format bytes of its push). Runs without a summary (never
    finished, or read from their records) get none new."""
    directory, fresh = Path(result["directory"]), commit()  # one git call for the comparison, not two a record
    labels = list(dict.fromkeys(row["method"] for row in result["table"]["methods"]))
    return [write_run_record(out, result["name"], directory / row["run_id"], row["method"], row.get("repeat", 0),
                             row.get("repeat", 0) * 1000 + labels.index(row["method"]), result["command"], fresh,
                             extra(directory / row["run_id"]) if extra else None)
            for row in result["table"]["methods"] if (directory / row["run_id"] / "summary.json").exists()]


def write_run_record(out: Path, name: str, run_dir: Path, label: str, repeat: int, order: int, command: str,
                     fresh: str | None, extra: dict | None = None) -> Path:
    """The record of one run of comparison ``name``: its first commit kept (:func:`keep_commit`), else ``fresh``."""
    path = record_path(out / "records", name, run_dir.name)
    record = make_record(run_dir, experiment=name, label=label, repeat=repeat, command=command,
                         commit=keep_commit(path, fresh, run_dir), extra={"order": order, **(extra or {})})
    return write_record(path, record)


def run_sweep_into(name: str, scenario: Path, grid: list[str], overrides: list[str], out: Path, backend: str, say,
                   repeat: int = 1) -> dict:
    """``emulate sweep`` of a paper scenario into ``<out>/runs/<name>`` (resumable, as a comparison)."""
    from emulator.experiments.sweep import Sweep, run_sweep

    sweep = Sweep.from_options(scenario, grid, overrides=tuple(overrides), backend=backend, repeat=repeat)
    directory = out / "runs" / name
    before = _finished(directory)
    run_sweep(sweep, directory, jobs=1, say=say)
    command = ["emulate", "sweep", str(scenario.relative_to(ROOT)), *sum((["--grid", g] for g in grid), []),
               *_options(backend, overrides, repeat), "--out", str(directory)]
    result = {"name": name, "directory": str(directory), "command": command_line(command)}
    sweep_json = json.loads((directory / "sweep.json").read_text()) if (directory / "sweep.json").exists() else {}
    ids = [entry["run_id"] for point in sweep_json.get("points", []) for entry in point.get("runs", [])]
    result["runs"] = run_counts(directory, [{"run_id": run_id} for run_id in ids], before)
    write_sweep_records(result, out)
    return result


def write_sweep_records(result: dict, out: Path) -> list[Path]:
    """One record per finished run of a sweep under ``<out>/records/<name>/``, with its grid values."""
    from analysis.runs import load_collection

    collection, fresh = load_collection(result["directory"]), commit()
    written = []
    for run in collection.runs:
        if not (run.path / "summary.json").exists():
            continue
        values = collection.values.get(run.path.name, {})
        path = record_path(out / "records", result["name"], run.path.name)
        record = make_record(run.path, experiment=result["name"], label=run.method, repeat=values.get("repetition", 0),
                             kind="sweep", grid={k: values.get(k) for k in collection.grid}, command=result["command"],
                             commit=keep_commit(path, fresh, run.path),
                             extra={"order": values.get("point", 0) * 1000 + values.get("repetition", 0)})
        written.append(write_record(path, record))
    return written


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


def comparison_failures(result: dict, label: str) -> list[str]:
    """``label: method (run id): why`` for each run of a :func:`run_comparison` that did not complete
    (from its row where the run was read from its record)."""
    return [f"{label}: {row['method']} ({row['run_id']}): {why}" for row in result["table"]["methods"]
            if (why := row_failure(Path(result["directory"]), row))]


def row_failure(directory: Path, row: dict) -> str | None:
    """Why a comparison's run did not complete: from its directory, else from its row (a run read
    from its record); None when it did."""
    if (directory / row["run_id"]).exists() or "status" not in row:
        return run_failure(directory / row["run_id"])
    return None if row["status"] == "completed" else f"{row['status']}: as its record says"


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
