"""The run directory: everything a run leaves behind, written as it happens.

Layout of ``runs/<run-id>/``::

    scenario.yaml            the scenario as given (before --set overrides)
    scenario.resolved.json   the validated scenario, every default filled in
    plan.json                the concrete plan (devices, timeline)
    mechanisms.json          which mechanism realised each link property, per device
    <stream>.jsonl           append-only traces: events, updates, accuracy, traffic, steps,
                             server, rejections, net, stats, rounds (aggregations a federated server closed)
    logs/<device>.log        each device's output
    summary.json             written at the end

Streams are JSON Lines, one record per line, flushed after every batch: a run killed
halfway keeps every complete line written before the kill, and readers skip a cut-off
last line (see :func:`read_jsonl`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
import warnings
from pathlib import Path

STREAMS = frozenset({"events", "updates", "accuracy", "traffic", "steps", "server", "rejections", "net", "stats", "fidelity", "rounds"})
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


class RunIdError(ValueError):
    """A run id that is not a plain directory name, or that names a run directory already there."""


def new_run_id(name: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{name[:160]}-{secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    """``run_id`` if it is one plain name: it becomes a directory, a cgroup and a label, so
    ``..``, ``/`` or a leading dot could reach outside the run's own."""
    if not _RUN_ID.fullmatch(run_id):
        raise RunIdError(f"invalid run id {run_id!r}: use up to 200 letters, digits, '.', '_' and '-', "
                         "starting with a letter or digit")
    return run_id


def check_new(root: str | Path, run_id: str) -> Path:
    """The path ``root/run_id`` of a run yet to be made; refuses an invalid id, and a directory
    that exists (a run is never written over)."""
    path = Path(root) / check_run_id(run_id)
    if path.exists() or path.is_symlink():
        raise _taken(path)
    return path


def _taken(path: Path) -> RunIdError:
    return RunIdError(f"run directory {path} already exists; choose another run id (nothing was written)")


def write_json_atomic(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


class RunDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path).absolute()  # devices run with the run directory as their cwd
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "logs").mkdir(exist_ok=True)
        self._files: dict[str, object] = {}
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    @classmethod
    def create(cls, root: str | Path, name: str, run_id: str | None = None) -> "RunDirectory":
        """A new, empty run directory; :class:`RunIdError` if the id is invalid or taken (even by a
        run that started a moment ago: the directory is made exclusively)."""
        path = check_new(root, run_id or new_run_id(name))
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()
        except FileExistsError:
            raise _taken(path) from None
        return cls(path)

    @property
    def run_id(self) -> str:
        return self.path.name

    def write_json(self, name: str, data) -> None:
        write_json_atomic(self.path / name, data)

    def write_text(self, name: str, text: str) -> None:
        (self.path / name).write_text(text)

    def append(self, stream: str, records: list[dict]) -> None:
        """Append records to ``<stream>.jsonl`` and flush; unknown streams are refused."""
        if stream not in STREAMS:
            raise ValueError(f"unknown trace stream {stream!r}")
        lines = "".join(json.dumps(r, separators=(",", ":"), default=str) + "\n" for r in records)
        with self._lock:
            fh = self._files.get(stream)
            if fh is None:
                fh = open(self.path / f"{stream}.jsonl", "a", buffering=1 << 16)
                self._files[stream] = fh
            fh.write(lines)
            fh.flush()
            self.counts[stream] = self.counts.get(stream, 0) + len(records)

    def log_path(self, device: str) -> Path:
        return self.path / "logs" / f"{device}.log"

    def close(self) -> None:
        with self._lock:
            for fh in self._files.values():
                fh.close()
            self._files.clear()


def completed_summary(run_dir: str | Path) -> dict | None:
    """The summary of a run that completed in ``run_dir``, else None: what a rerun of a sweep or a
    comparison may reuse."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if summary.get("status") == "completed" else None


def set_aside(directory: str | Path, run_id: str) -> None:
    """Move an unfinished attempt of ``run_id`` out of the way, into ``directory/.attempts/`` (kept
    for post-mortems), so that the run can start again in a fresh directory."""
    path = Path(directory) / run_id
    if not path.exists():
        return
    attempts = Path(directory) / ".attempts"
    attempts.mkdir(exist_ok=True)
    n = 1
    while (attempts / f"{run_id}.{n}").exists():
        n += 1
    path.rename(attempts / f"{run_id}.{n}")


def read_jsonl(path: str | Path, *, numbered: bool = False) -> list:
    """All complete records of a stream; a cut-off last line, or a line that is not a JSON object,
    is skipped with a warning naming the file and line. ``numbered``: ``(line, record)`` pairs."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    with open(path, encoding="utf-8", errors="replace") as fh:  # a stray byte spoils one line, not the file
        lines = fh.read().split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError, and what json refuses beyond it
            if number >= len(lines) - 1:
                warnings.warn(f"{path}: last line is incomplete (run interrupted?); skipped", stacklevel=2)
            else:
                warnings.warn(f"{path}:{number}: not valid JSON; skipped", stacklevel=2)
            continue
        if not isinstance(record, dict):
            warnings.warn(f"{path}:{number}: not a record (a JSON object), {type(record).__name__}; skipped", stacklevel=2)
            continue
        records.append((number, record) if numbered else record)
    return records
