"""``emulate doctor``: what this machine offers the emulator, and how each property will be realised."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from emulator import backends
from emulator.host import cgroups


def diagnose() -> list[tuple[str, str, str]]:
    """(check, ok|warn|fail|info, detail) rows, most important first; a detail may span lines."""
    rows: list[tuple[str, str, str]] = []
    rows.append(("python", "info", f"{platform.python_version()} on {platform.machine()}, kernel {platform.release()}"))
    rows.append(("root", "ok" if os.geteuid() == 0 else "warn",
                 "yes" if os.geteuid() == 0 else "no: CPU quotas (local) and link shaping (docker) need root"))

    ok, why = cgroups.available()
    version = "v1" if Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() else "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "none"
    rows.append(("cgroups", "ok" if ok else "warn", f"{version}; " + ("CPU quotas enforceable for local devices" if ok else why)))

    for name in backends.BACKENDS:  # each backend says what it needs and how it realises links here
        try:
            rows += backends.backend_class(name).diagnose()
        except Exception as exc:  # noqa: BLE001 - its SDK missing, say so and go on
            rows.append((name, "warn", f"unusable: {exc}"))
    return rows + dataset_rows()


def dataset_rows() -> list[tuple[str, str, str]]:
    """One row per data set: its sizes and source, or the whole "not available" message (every
    place tried, and what to install)."""
    from emulator import datasets

    rows = []
    for name in sorted(datasets.DATASETS):
        try:
            ds = datasets.load(name)
            sizes = f"{len(ds.x_train):,} train / {len(ds.x_test):,} test"
            rows.append((f"dataset {name}", "ok", ds.source if sizes in ds.source else f"{sizes} from {ds.source}"))  # said once
        except Exception as exc:  # noqa: BLE001
            rows.append((f"dataset {name}", "warn", str(exc)))
    return rows
