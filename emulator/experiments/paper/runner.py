"""Running the experiments' runs through the library's own commands (``emulate compare``,
``emulate sweep``), each with the command line that reproduces it, and the guards that read back
which runs failed and why: a failed run is a row with its cause, never a silent gap.
"""

from __future__ import annotations

import json
from pathlib import Path

from emulator.experiments.paper.profiles import PAPER, ROOT


def command_line(parts: list[str]) -> str:
    """``parts`` as one shell line, quoting the parts that need it."""
    return " ".join(p if p.replace("-", "").replace("_", "").replace("/", "").replace(".", "").replace("=", "").isalnum()
                    else f"'{p}'" for p in parts)


def _options(backend: str, overrides: list[str], repeat: int) -> list[str]:
    """The options compare and sweep share, as they were given."""
    return ["--backend", backend, *sum((["--set", o] for o in overrides), []), *(["--repeat", str(repeat)] if repeat > 1 else [])]


def run_comparison(name: str, methods: list[str], overrides: list[str], repeat: int, out: Path, backend: str, say) -> dict:
    """``emulate compare`` of the paper's methods scenario into ``<out>/runs/<name>``: a rerun reuses
    every run that finished there (an interrupted `make figures` resumes)."""
    from emulator.experiments.compare import compare

    directory = compare(PAPER / "methods.yaml", methods, out / "runs", backend=backend, overrides=overrides, say=say,
                        repeat=repeat, directory=out / "runs" / name)
    command = ["emulate", "compare", "scenarios/paper/methods.yaml", *sum((["-m", m] for m in methods), []),
               *_options(backend, overrides, repeat), "--dir", str(directory)]
    return {"directory": str(directory), "command": command_line(command), "repeat": repeat,
            "table": json.loads((directory / "compare.json").read_text())}


def run_sweep_into(name: str, scenario: Path, grid: list[str], overrides: list[str], out: Path, backend: str, say,
                   repeat: int = 1) -> dict:
    """``emulate sweep`` of a paper scenario into ``<out>/runs/<name>`` (resumable, as a comparison)."""
    from emulator.experiments.sweep import Sweep, run_sweep

    sweep = Sweep.from_options(scenario, grid, overrides=tuple(overrides), backend=backend, repeat=repeat)
    directory = out / "runs" / name
    run_sweep(sweep, directory, jobs=1, say=say)
    command = ["emulate", "sweep", str(scenario.relative_to(ROOT)), *sum((["--grid", g] for g in grid), []),
               *_options(backend, overrides, repeat), "--out", str(directory)]
    return {"directory": str(directory), "command": command_line(command)}


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
    """``label: method (run id): why`` for each run of a :func:`run_comparison` that did not complete."""
    directory = Path(result["directory"])
    return [f"{label}: {row['method']} ({row['run_id']}): {why}" for row in result["table"]["methods"]
            if (why := run_failure(directory / row["run_id"]))]


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
