"""Faults survived: a parameter server that crashes resumes from its checkpoint, workers reconnect."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TEST_SCENARIOS, read_jsonl, run_scenario
from emulator.runtime import checkpoint


def test_the_version_mark_survives_its_writer(tmp_path):
    checkpoint.VersionMark(tmp_path).set(12345)
    assert checkpoint.VersionMark(tmp_path).read() == 12345


def test_checkpoint_round_trip_is_atomic(tmp_path):
    params = np.arange(10, dtype=np.float32)
    checkpoint.save(tmp_path, 7, params, {"touches": np.arange(10, dtype=np.uint32)})
    version, loaded, state = checkpoint.load(tmp_path)
    assert version == 7 and np.array_equal(loaded, params) and np.array_equal(state["touches"], np.arange(10))
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint.FILE]  # no temporary left behind
    assert checkpoint.load(tmp_path / "nothing-here") is None


@pytest.mark.slow
def test_a_crashed_server_resumes_from_its_checkpoint_and_training_goes_on(tmp_path):
    summary, run = run_scenario(TEST_SCENARIOS / "server-crash.yaml", tmp_path, backend="local")
    assert summary["status"] == "completed"
    assert summary["faults"] == {"crash": 1, "restart": 1}
    events = read_jsonl(run / "events.jsonl")
    restored = [e for e in events if e.get("kind") == "restored"]
    assert len(restored) == 1 and restored[0]["version"] > 0
    crash = next(e for e in events if e.get("kind") == "fault" and e["action"] == "crash")
    assert {e["worker"] for e in events if e.get("kind") == "reconnected"} == {0, 1, 2}
    updates = read_jsonl(run / "updates.jsonl")
    traced = max(u["t"] for u in updates if u["ts"] < crash["ts"])
    # The server's version mark survives SIGKILL: the updates since the last checkpoint are
    # counted exactly, including those whose trace records died in the server's last batch.
    at_crash = restored[0]["version_at_crash"]
    assert at_crash >= traced and at_crash >= restored[0]["version"]
    assert summary["updates_lost_to_server_crashes"] == at_crash - restored[0]["version"] == restored[0]["lost"]
    after = [u for u in updates if u["ts"] > restored[0]["ts"]]
    assert len(after) > 100 and summary["updates_applied"] > restored[0]["version"] + 100
    accuracy = read_jsonl(run / "accuracy.jsonl")
    before_crash = [a["accuracy"] for a in accuracy if a["model_ts"] < crash["ts"]]
    assert summary["final_accuracy"] >= max(before_crash) - 0.03  # training goes on where it was
