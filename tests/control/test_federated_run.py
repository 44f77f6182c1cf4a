"""FedBuff, FedAsync and FedAvg end to end on the local backend: real TensorFlow, local steps, compressed deltas.

Each run composes the federated method with top-k + error feedback on the uplink and a downlink
pull mode, and must complete, learn, and leave a ``rounds`` trace that summary.json sums up.
"""

from __future__ import annotations

import pytest

from conftest import SCENARIOS, read_jsonl, run_scenario

from emulator.control.summary import summary_of_rounds

METHODS = {
    "fedbuff": "{name: topk, c: 0.1, error_feedback: true, rule: plain, local: {steps: 5}, aggregation: {name: fedbuff, buffer: 2}}",
    "fedasync": "{name: topk, c: 0.1, rule: plain, pull: {mode: delta, values: f16}, local: {steps: 5}, "
                "aggregation: {name: fedasync, alpha: 0.6, staleness: hinge}}",
    "fedavg": "{name: topk, c: 0.1, error_feedback: true, rule: plain, pull: delta, local: {steps: 10}, "
              "aggregation: {name: fedavg, sample: 3, deadline: 20s}}",
}
ROUNDS = 8


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_a_federated_run_learns_and_records_its_rounds(method, tmp_path_factory):
    summary, run = run_scenario(SCENARIOS / "quickstart.yaml", tmp_path_factory.mktemp(method), check_fidelity=False,
                                overrides=[f"method={METHODS[method]}", f"training.max_updates={ROUNDS}",
                                           "training.learning_rate=0.05"])
    assert summary["status"] == "completed" and summary["updates_applied"] == ROUNDS
    assert summary["final_accuracy"] > 0.3  # ten classes: well above chance after a few rounds of local steps
    rounds = read_jsonl(run / "rounds.jsonl")
    applied = [r for r in rounds if r["applied"]]
    assert len(applied) >= ROUNDS and [r["version"] for r in applied][:ROUNDS] == list(range(1, ROUNDS + 1))
    assert summary["rounds"]["count"] == len(rounds) and summary["rounds"]["up_bytes_per_round"] > 0
    assert summary["rounds"]["down_bytes_per_round"] > 0
    participants = {"fedbuff": 2, "fedasync": 1, "fedavg": 3}[method]
    assert all(r["participants"] == participants for r in applied if r["dropped"] == 0)
    updates = read_jsonl(run / "updates.jsonl")
    if method == "fedbuff":
        assert sum(bool(u.get("held")) for u in updates) >= ROUNDS  # one of each buffer's two deltas waited


def test_the_summary_of_rounds():
    rows = [{"round": 1, "duration_s": 1.0, "sampled": 3, "participants": 3, "dropped": 0, "applied": True,
             "ingress_bytes": 300, "egress_bytes": 900, "downlink_bytes": 600},
            {"round": 2, "duration_s": 3.0, "sampled": 3, "participants": 2, "dropped": 1, "applied": True,
             "ingress_bytes": 200, "egress_bytes": 700, "downlink_bytes": 400}]
    assert summary_of_rounds(rows) == {
        "count": 2, "applied": 2, "mean_duration_s": 2.0, "max_duration_s": 3.0, "mean_sampled": 3.0,
        "mean_participants": 2.5, "stragglers_dropped": 1, "up_bytes_per_round": 250.0, "down_bytes_per_round": 500.0,
        "egress_bytes_per_round": 800.0}


@pytest.mark.slow
def test_fedavg_samples_only_available_clients_and_drops_one_that_went_away(tmp_path):
    """Worker 0 is paused for 8 s (as an availability trace's offline spell is): the round it was
    in closes without it (dropped, counted), the rounds of those seconds sample the three others,
    its late update is refused, and it is sampled again after."""
    method = ("{name: topk, c: 0.1, error_feedback: true, rule: plain, pull: delta, local: {steps: 10}, "
              "aggregation: {name: fedavg, sample: 4, deadline: 30s}}")
    summary, run = run_scenario(SCENARIOS / "quickstart.yaml", tmp_path, check_fidelity=False,
                                overrides=[f"method={method}", "training.max_updates=20", "training.learning_rate=0.05",
                                           "faults={at: [{time: 3s, pause: [0], for: 5s}]}"])
    assert summary["status"] == "completed" and summary["faults"] == {"pause": 1, "resume": 1}
    rounds = read_jsonl(run / "rounds.jsonl")
    # paused mid-round (it had taken the model): that round closes without it, not at the deadline
    assert all(r["dropped_workers"] == [0] and r["duration_s"] < 30 for r in rounds if r["dropped"])
    assert summary["rounds"]["stragglers_dropped"] == sum(r["dropped"] for r in rounds) <= 1
    sampled = [r["sampled"] for r in rounds]
    assert sampled[0] == 4 and 3 in sampled  # rounds drawn while worker 0 was offline sample the three others
    assert sampled[-1] == 4 and rounds[-1]["participants"] == 4  # back after its pause
