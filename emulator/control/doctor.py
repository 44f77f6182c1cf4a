"""``emulate doctor``: what this machine offers the emulator, and how each property will be realised."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from emulator.host import cgroups


def diagnose() -> list[tuple[str, str, str]]:
    """(check, ok|warn|fail|info, detail) rows, most important first; a detail may span lines."""
    rows: list[tuple[str, str, str]] = []
    rows.append(("python", "info", f"{platform.python_version()} on {platform.machine()}, kernel {platform.release()}"))
    rows.append(("root", "ok" if os.geteuid() == 0 else "warn",
                 "yes" if os.geteuid() == 0 else "no: CPU quotas (local) and link shaping (docker) need root"))

    docker_ok = False
    try:
        from emulator.backends.docker import DockerBackend, client

        docker_ok, why = DockerBackend.available()
        if docker_ok:
            version = client(timeout=5).version()
            rows.append(("docker", "ok", f"daemon {version.get('Version')} answers"))
        else:
            rows.append(("docker", "warn", f"{why}; runs fall back to the local backend"))
    except Exception as exc:  # noqa: BLE001
        rows.append(("docker", "warn", f"unusable: {exc}"))

    ok, why = cgroups.available()
    version = "v1" if Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() else "v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "none"
    rows.append(("cgroups", "ok" if ok else "warn", f"{version}; " + ("CPU quotas enforceable for local devices" if ok else why)))

    if os.geteuid() == 0:
        from emulator.host import links
        from emulator.planning.plan import LinkPlan

        features = links.detect()
        qdiscs = ", ".join(k for k in ("htb", "tbf", "netem") if getattr(features, k)) or "none"
        rows.append(("kernel qdiscs", "ok" if features.htb or features.tbf else "warn", qdiscs + (f" ({features.detail})" if features.detail else "")))
        rows.append(("iptables statistic", "ok" if features.iptables_statistic else "warn",
                     "random drops available" if features.iptables_statistic else "unavailable"))
        every = LinkPlan(uplink_bps=1e6, downlink_bps=1e6, delay_s=0.01, jitter_s=0.001, loss=0.001)
        mech = links.plan_mechanisms(features, every)
        rows.append(("docker links", "info", ", ".join(f"{k} by {v}" for k, v in mech.items())))
    rows.append(("local links", "info", "rate and delay by the in-process transport shaper; loss: none"))

    if docker_ok:
        try:
            from emulator.host import images

            status = images.image_status()
            state = "up to date" if status.get("up_to_date") else "missing or stale (built on first run, or: emulate images build)"
            rows.append(("runtime image", "ok" if status.get("up_to_date") else "warn", f"{status.get('runtime') or '-'}: {state}"))
        except Exception as exc:  # noqa: BLE001
            rows.append(("runtime image", "warn", str(exc)))

    return rows + dataset_rows()


def dataset_rows() -> list[tuple[str, str, str]]:
    """One row per data set: its sizes and source, or the whole "not available" message (every
    place tried, and what to install)."""
    from emulator import datasets

    rows = []
    for name in sorted(datasets.DATASETS):
        try:
            ds = datasets.load(name)
            rows.append((f"dataset {name}", "ok", f"{len(ds.x_train):,} train / {len(ds.x_test):,} test from {ds.source}"))
        except Exception as exc:  # noqa: BLE001
            rows.append((f"dataset {name}", "warn", str(exc)))
    return rows
