"""CPU quotas for plain processes through Linux cgroups (v1 ``cpu`` controller or v2 ``cpu.max``).

Used by the local backend when it runs as root: each device gets a cgroup under
``edge-emulator/<run-id>@<pid>-<start>/<device>`` whose CFS quota is ``cpus * period``; changing
the quota at run time is one write. The run's directory names its controller (pid and start
time, :mod:`emulator.host.owner`), so that cleaning can tell a killed run's groups from a live
one's, and two runs of the same id never share one. Without permission the quota is recorded
as not enforced.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from emulator.host.owner import Owner

ROOT_NAME = "edge-emulator"
PERIOD_US = 100_000
V1_CPU = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")


def _version() -> int | None:
    if (V1_CPU / "cpu.cfs_quota_us").exists():
        return 1
    if (V2 / "cgroup.controllers").exists():
        return 2
    return None


def _base() -> Path | None:
    version = _version()
    return {1: V1_CPU, 2: V2}.get(version) if version else None


def available() -> tuple[bool, str]:
    base = _base()
    if base is None:
        return False, "no cgroup cpu controller mounted"
    if not os.access(base, os.W_OK):
        return False, f"{base} is not writable (run as root to enforce CPU quotas)"
    if _version() == 2 and "cpu" not in (V2 / "cgroup.subtree_control").read_text().split():
        try:
            (V2 / "cgroup.subtree_control").write_text("+cpu")
        except OSError as exc:
            return False, f"cannot enable the cpu controller: {exc}"
    return True, ""


class CpuGroup:
    """One device's cgroup: created on demand, quota settable at run time, removed at teardown."""

    def __init__(self, run_id: str, device: str, owner: Owner | None = None):
        self.version = _version()
        self.path = run_path(run_id, owner or Owner.current()) / device

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def set_cpus(self, cpus: float | None) -> None:
        """Quota of ``cpus`` cores; None lifts the limit (devices boot unthrottled)."""
        quota = max(1000, int(cpus * PERIOD_US)) if cpus else None
        if self.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota or -1))
        else:
            (self.path / "cpu.max").write_text(f"{quota or 'max'} {PERIOD_US}")

    def cpus(self) -> float | None:
        """The quota in force, read back from the cgroup (None: unlimited)."""
        if self.version == 1:
            quota = int((self.path / "cpu.cfs_quota_us").read_text())
            period = int((self.path / "cpu.cfs_period_us").read_text())
        else:
            text_quota, text_period = (self.path / "cpu.max").read_text().split()
            if text_quota == "max":
                return None
            quota, period = int(text_quota), int(text_period)
        return quota / period if quota > 0 else None

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))


def run_path(run_id: str, owner: Owner) -> Path:
    """The cgroup directory of one run made by ``owner`` (its devices' groups are inside)."""
    return _base() / ROOT_NAME / f"{run_id}@{owner.token}"


def run_groups() -> list[tuple[Path, str, Owner | None]]:
    """Every run's cgroup directory: (path, run id, owner; None for a name without one)."""
    base = _base()
    root = base / ROOT_NAME if base else None
    if root is None or not root.is_dir():
        return []
    found = []
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        run_id, sep, token = path.name.rpartition("@")
        found.append((path, run_id, Owner.from_token(token)) if sep else (path, path.name, None))
    return found


def remove_group(root: Path) -> list[str]:
    """Kill what is left in a run's cgroups and remove them; returns what went."""
    if not root.exists():
        return []
    removed = []
    for procs in sorted(root.rglob("cgroup.procs")):
        for pid in procs.read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for directory in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        _rmdir(directory, removed)
    _rmdir(root, removed)
    return removed


def _rmdir(directory: Path, removed: list[str]) -> None:
    for _ in range(50):  # a killed process leaves its cgroup a moment after the signal
        try:
            directory.rmdir()
            removed.append(str(directory))
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


__all__ = ["CpuGroup", "available", "remove_group", "run_groups", "run_path"]
