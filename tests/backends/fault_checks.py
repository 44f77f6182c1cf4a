"""The checks both container backends owe tests/scenarios/docker-faults.yaml (a crash at 6 s with a
restart 6 s later, a pause of worker 2 from 8 s to 13 s, a CPU change, a partition of worker 0
from 15 s to 20 s), and the hardening both give a worker's container. What differs between the
backends is passed in: how late a restart may land, and each one's own container fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import read_jsonl

FAULTS = {"crash": 1, "restart": 1, "pause": 1, "resume": 1, "cpus": 2, "partition": 1, "heal": 1}


def assert_scheduled_faults(summary: dict, run: Path, restart_within_s: float) -> None:
    assert summary["status"] == "completed"
    assert summary["faults"] == FAULTS
    events = read_jsonl(run / "events.jsonl")
    started = summary["training_started_ts"]
    crash = next(e for e in events if e.get("kind") == "fault" and e["action"] == "crash")
    restart = next(e for e in events if e.get("kind") == "fault" and e["action"] == "restart")
    assert crash["ts"] - started == pytest.approx(6.0, abs=1.5)
    assert restart["ts"] - started == pytest.approx(12.0, abs=restart_within_s)
    updates = read_jsonl(run / "updates.jsonl")
    assert not [u for u in updates if u["worker"] == 2 and started + 9 < u["ts"] < started + 12.5], "a paused worker pushes nothing"
    assert not [u for u in updates if u["worker"] == 0 and started + 16 < u["ts"] < started + 19.5], "a partitioned worker pushes nothing"


def assert_hardened(container: dict) -> None:
    """A worker's container as the daemon reports it while it runs (``_network``: its network)."""
    assert container, "no worker container was seen running"
    host = container["HostConfig"]
    assert container["Config"]["User"] == "10001:10001" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] or set(host["CapDrop"]) >= {"ALL"}
    assert host["Memory"] > 0 and host["PidsLimit"] == 512
    assert container["_network"]["Internal"] is True
    assert container["_network"]["IPAM"]["Config"][0]["Subnet"].startswith("198.1")
