"""The report's traced-links figure: configured steps from the plan beside the measured interface rate."""

from __future__ import annotations

import json

from support.runs import write_synthetic_run

from analysis import figures
from analysis.report import build_report
from analysis.runs import load_net


def _with_link_trace(run_dir):
    plan = json.loads((run_dir / "plan.json").read_text())
    plan["workers"][0]["link"] = {"uplink_bps": 2e6, "downlink_bps": 8e6, "delay_s": 0.0, "jitter_s": 0.0, "loss": 0.0}
    plan["events"] = [{"time_s": 2.0, "action": "link", "target": "worker-0", "params": {"uplink_bps": 1e6}, "source": "trace"},
                      {"time_s": 4.0, "action": "link", "target": "worker-0", "params": {"downlink_bps": 4e6}, "source": "trace"},
                      {"time_s": 3.0, "action": "link", "target": "worker-1", "params": {"uplink_bps": 5e5}, "source": "schedule"}]
    (run_dir / "plan.json").write_text(json.dumps(plan))
    return plan


def test_the_configured_steps_are_the_plans_trace_events(tmp_path):
    plan = _with_link_trace(write_synthetic_run(tmp_path / "run"))
    steps = figures.traced_link_steps(plan)
    assert list(steps) == ["worker-0"]  # worker-1's change is a timed fault, not a trace
    assert steps["worker-0"][["time_s", "uplink_bps", "downlink_bps"]].values.tolist() == [
        [0.0, 2e6, 8e6], [2.0, 1e6, 8e6], [4.0, 1e6, 4e6]]


def test_a_docker_run_with_a_link_trace_gets_the_figure_and_a_local_one_says_why_not(tmp_path):
    docker_run = write_synthetic_run(tmp_path / "docker")
    plan = _with_link_trace(docker_run)
    assert figures.traced_links(plan, load_net(docker_run)) is not None
    out = build_report(docker_run)
    assert (out / "traced_links.png").stat().st_size > 0 and "Traced links" in (out / "report.md").read_text()
    local_run = write_synthetic_run(tmp_path / "local", backend="local")
    _with_link_trace(local_run)
    text = (build_report(local_run) / "report.md").read_text()
    assert "Traced links: no interface counters" in text
    plain = write_synthetic_run(tmp_path / "plain")
    assert "Traced links" not in (build_report(plain) / "report.md").read_text()
