"""Faults survived: a parameter server that crashes resumes from its checkpoint, workers reconnect."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TEST_SCENARIOS, read_jsonl, run_scenario
from emulator.runtime import checkpoint


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
    before = max(u["t"] for u in updates if u["ts"] < crash["ts"])
    # At most the updates since the last checkpoint are lost, and they are counted.
    assert summary["updates_lost_to_server_crashes"] == before - restored[0]["version"] >= 0
    after = [u for u in updates if u["ts"] > restored[0]["ts"]]
    assert len(after) > 100 and summary["updates_applied"] > restored[0]["version"] + 100
    accuracy = read_jsonl(run / "accuracy.jsonl")
    before_crash = [a["accuracy"] for a in accuracy if a["model_ts"] < crash["ts"]]
    assert summary["final_accuracy"] >= max(before_crash) - 0.03  # training goes on where it was
