"""The quickstart with each way of pulling, end to end on the local backend (real TensorFlow, 60 updates).

What a run must show of its downlink: summary.json's egress and per-update fields, consistent
with the traces, and delta pulls sending far fewer bytes than dense ones for the same updates.
"""

from __future__ import annotations

import pytest

from conftest import SCENARIOS, read_jsonl, run_scenario

pytestmark = pytest.mark.slow
UPDATES = 60
PULLS = {
    "dense": "{mode: dense}",
    "delta": "{mode: delta}",
    "delta-f16": "{mode: delta, values: f16}",
    "delta-q8": "{mode: delta, values: q8}",
    "delta-every-4": "{mode: delta, every: 4}",
}
RESULTS: dict[str, tuple[dict, object]] = {}
FIELDS = ("egress_payload_bytes", "downlink_payload_bytes", "up_bytes_per_update", "down_bytes_per_update",
          "two_way_bytes_per_update")


@pytest.mark.parametrize("pull", PULLS)
def test_a_run_measures_its_downlink(pull, tmp_path_factory):
    summary, run = run_scenario(SCENARIOS / "quickstart.yaml", tmp_path_factory.mktemp(f"pull-{pull}"), check_fidelity=False,
                                overrides=[f"method.pull={PULLS[pull]}", f"training.max_updates={UPDATES}"])
    RESULTS[pull] = summary, run
    assert summary["status"] == "completed" and summary["updates_applied"] == UPDATES
    assert all(summary[key] > 0 for key in FIELDS)
    traffic = read_jsonl(run / "traffic.jsonl")
    workers = [r for r in traffic if r["worker"] != 2**32 - 1]
    assert summary["downlink_payload_bytes"] <= sum(r["egress_bytes"] for r in workers)  # late replies are outside the window
    assert summary["egress_payload_bytes"] > summary["downlink_payload_bytes"]  # the evaluator's models too
    assert summary["down_bytes_per_update"] == round(summary["downlink_payload_bytes"] / UPDATES, 1)
    updates = read_jsonl(run / "updates.jsonl")
    replies = {u["reply"] for u in updates}
    if pull == "dense":
        assert replies == {"model"} and sum(r["delta_pulls"] for r in traffic) == 0
    elif pull == "delta-every-4":
        acks = sum(u["reply"] == "ack" for u in updates)
        assert replies <= {"ack", "delta", "model"} and acks >= UPDATES // 2  # 3 of every 4 pushes, but for rejections
    else:
        assert "delta" in replies and sum(r["delta_pulls"] for r in traffic) > 0
    steps = read_jsonl(run / "steps.jsonl")  # a 1.5 s run's last worker records may not beat the teardown
    if any(s["steps"] for s in steps):
        assert sum(s["pulls"] for s in steps) > 0 and sum(s["pull_bytes"] for s in steps) > 0


def test_delta_pulls_send_far_fewer_bytes_than_dense_ones():
    missing = [p for p in PULLS if p not in RESULTS]
    if missing:
        pytest.skip(f"needs the runs of {missing}")
    dense = RESULTS["dense"][0]["downlink_payload_bytes"]
    for pull in PULLS:
        summary = RESULTS[pull][0]
        print(f"\n{pull}: down {summary['down_bytes_per_update']:,.0f} B per update, two-way "
              f"{summary['two_way_bytes_per_update']:,.0f}, accuracy {summary['final_accuracy']:.3f}")
        if pull != "dense":
            # 60 updates: the four whole models every worker starts from are a large share, and still
            assert summary["downlink_payload_bytes"] < dense / 4, pull
