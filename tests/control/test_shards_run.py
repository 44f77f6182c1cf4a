"""A run whose model is split over two server processes, on the local backend: every push
reaches both, each counts its own traffic, the totals are their sums, and the evaluator's
assembled model trains."""

from __future__ import annotations

import pytest

from conftest import TEST_SCENARIOS, read_jsonl, run_scenario


@pytest.mark.slow
def test_two_shards_train_and_count_their_traffic_apart(tmp_path):
    summary, run = run_scenario(TEST_SCENARIOS / "sharded.yaml", tmp_path, backend="local")
    assert summary["status"] == "completed" and summary["updates_applied"] == 600
    servers = summary["servers"]
    assert [s["name"] for s in servers] == ["server-0", "server-1"]
    assert all(s["updates"] == 600 for s in servers)  # every push reached every shard
    assert sum(s["ingress_payload_bytes"] for s in servers) == summary["ingress_payload_bytes"]
    assert sum(s["egress_payload_bytes"] for s in servers) == summary["egress_payload_bytes"]
    listening = [e for e in read_jsonl(run / "events.jsonl") if e.get("kind") == "listening"]
    assert sorted((e["source"], e["shard"]) for e in listening) == [("server-0", 0), ("server-1", 1)]
    assert sum(e["parameters"] for e in listening) == summary["parameters"]
    assert (run / "checkpoint" / "server-0").is_dir() and (run / "checkpoint" / "server-1").is_dir()
    assert summary["final_accuracy"] > 0.5
