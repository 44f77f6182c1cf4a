"""A traced scenario end to end on the local backend: the plan's trace events are applied and recorded."""

from __future__ import annotations

import pytest

from conftest import SCENARIOS, read_json, read_jsonl, run_scenario

pytestmark = pytest.mark.slow
DURATION_S = 20.0


def test_an_availability_trace_pauses_and_resumes_the_workers_it_plans(tmp_path):
    summary, run = run_scenario(SCENARIOS / "traces" / "phones.yaml", tmp_path, backend="local", check_fidelity=False,
                                overrides=[f"training.duration={DURATION_S:g}s", "dataset.test_size=200", "training.eval_every=10s"])
    assert summary["status"] == "completed"
    planned = [(e["action"], e["target"], e["time_s"]) for e in read_json(run / "plan.json")["events"] if e["source"] == "trace"]
    assert planned and {a for a, _, _ in planned} == {"pause", "resume"}
    applied = [(e["action"], e["target"], e["planned_s"]) for e in read_jsonl(run / "events.jsonl")
               if e.get("kind") == "fault" and e.get("origin") == "trace"]
    assert applied == planned[:len(applied)]  # in the plan's order, none invented
    assert len(applied) >= sum(1 for _, _, t in planned if t < DURATION_S - 2)  # all but the last moments' applied
    assert summary["updates_applied"] > 0
