"""One of two servers crashes and restarts from its checkpoint; ``server.when_down`` says whether the
workers wait for it (nothing is applied anywhere meanwhile) or go on with the other server (its
updates go on, the down server's parts are dropped and counted)."""

from __future__ import annotations

import pytest

from conftest import TEST_SCENARIOS, read_jsonl, run_scenario


def _outage(run):
    """(crash ts, restored ts) of server-1, and server-0's update rows strictly inside that window."""
    events = read_jsonl(run / "events.jsonl")
    crash = next(e["ts"] for e in events if e.get("kind") == "fault" and e["action"] == "crash")
    back = next(e["ts"] for e in events if e.get("kind") == "restored" and e["source"] == "server-1")
    # from a second after the crash (pushes in flight land) to its restore
    inside = [u for u in read_jsonl(run / "updates.jsonl") if u["source"] == "server-0" and crash + 1.0 < u["ts"] < back]
    return events, crash, back, inside


@pytest.mark.slow
def test_with_skip_the_other_server_goes_on_and_the_dropped_parts_are_counted(tmp_path):
    summary, run = run_scenario(TEST_SCENARIOS / "shard-down.yaml", tmp_path, overrides=["server.when_down=skip"])
    assert summary["status"] == "completed" and summary["faults"] == {"crash": 1, "restart": 1}
    events, crash, back, inside = _outage(run)
    assert back - crash > 4.0 and len(inside) > 20  # server-0 kept applying while server-1 was down
    lost = [e for e in events if e.get("kind") == "server_lost" and e["source"].startswith("worker-")]  # the evaluator waits
    assert lost and all(e["shard"] == 1 and e["going_on"] for e in lost)
    rejoined = [e for e in events if e.get("kind") == "reconnected"]
    assert {e["worker"] for e in rejoined} == {0, 1, 2} and all(e["shard"] == 1 for e in rejoined)
    assert summary["update_parts_skipped"] == sum(e["skipped"] for e in rejoined) > 0
    servers = {s["name"]: s for s in summary["servers"]}
    assert servers["server-0"]["updates"] > servers["server-1"]["updates"]  # server-1 missed the skipped parts
    assert summary["final_accuracy"] > 0.5


@pytest.mark.slow
def test_with_wait_nothing_is_applied_while_a_server_is_down(tmp_path):
    summary, run = run_scenario(TEST_SCENARIOS / "shard-down.yaml", tmp_path)
    assert summary["status"] == "completed" and "update_parts_skipped" not in summary
    events, crash, back, inside = _outage(run)
    assert back - crash > 4.0 and inside == []
    assert {e["worker"] for e in events if e.get("kind") == "reconnected"} == {0, 1, 2}
