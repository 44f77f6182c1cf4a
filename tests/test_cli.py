"""``emulate``: help texts, and the human form of ``emulate plan``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator.cli import main
from emulator.plan import make_plan
from emulator.scenario import load_scenario

HERE = Path(__file__).parent
FULL = HERE / "scenarios" / "full.yaml"
QUICKSTART = HERE.parent / "scenarios" / "quickstart.yaml"
SUBCOMMANDS = ["run", "plan", "schema", "clean", "doctor"]


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def full_output() -> str:
    result = invoke("plan", str(FULL))
    assert result.exit_code == 0, result.output
    return result.output


def test_plan_header(full_output):
    plan = make_plan(load_scenario(FULL)[0])
    lines = full_output.splitlines()
    assert lines[0] == f"scenario full-feature.v1 (seed 42, plan {plan.digest()})"
    assert "method comp_c = compressor topk {'c': 0.02} + rule staleness + error feedback" in lines[1]
    assert "dataset mnist-5k (non_iid)" in lines[1]
    assert lines[2] == "training: batch 16, alpha 0.05, until 5000 updates or 600s"


def test_plan_lists_every_device(full_output):
    rows = {line.split()[0]: line for line in full_output.splitlines() if re.match(r"^(server|evaluator|worker-\d+) ", line)}
    assert list(rows) == ["server", "evaluator"] + [f"worker-{i}" for i in range(10)]
    assert "up 100mbit, down 1gbit, delay 5ms" in rows["server"]
    assert "up unshaped, down unshaped" in rows["evaluator"]
    assert rows["worker-0"].split()[1:4] == ["fixed", "0.25", "256.00"]
    assert "up 2mbit, down 1mbit, delay 30ms, jitter 5ms, loss 0.1%" in rows["worker-0"]
    assert "up 1mbit, down unshaped, delay 10ms" in rows["worker-2"]
    assert all(rows[f"worker-{i}"].split()[1] == "drawn" for i in range(5, 10))


def test_plan_lists_the_timeline(full_output):
    plan = make_plan(load_scenario(FULL)[0])
    assert f"timeline ({len(plan.events)} events, random faults drawn to 600s):" in full_output
    timeline = [line for line in full_output.splitlines() if re.match(r"^\s+\d+\.\d{3}s ", line)]
    assert len(timeline) == len(plan.events)
    for line, event in zip(timeline, plan.events):
        assert line.split()[:3] == [f"{event.time_s:.3f}s", event.action, event.target]
        assert line.endswith(f"[{event.source}]")
    assert any("cpus=0.05" in line for line in timeline)
    assert any("uplink_bps=500000, delay_s=0.2, loss=0.01" in line for line in timeline)
    triggers = [line.strip() for line in full_output.splitlines() if "trigger:" in line]
    assert triggers == [
        "trigger: crash worker-5 after its 50th applied update",
        "trigger: pause worker-6 after its 20th applied update",
        "trigger: crash worker-7 after its 30th applied update",
        "trigger: partition worker-8 after its 40th applied update",
    ]


def test_plan_of_the_quickstart():
    result = invoke("plan", str(QUICKSTART))
    assert result.exit_code == 0, result.output
    assert "timeline (0 events" in result.output
    for name in ("server", "evaluator", "worker-0", "worker-1", "worker-2", "worker-3"):
        assert re.search(rf"^{name} ", result.output, re.M)


def test_plan_with_overrides_and_random_faults():
    result = invoke("plan", str(QUICKSTART), "--set", "faults.crash.rate_per_hour=30", "--set", "faults.crash.restart_after=1min",
                    "--set", "workers[0].count=3")
    assert result.exit_code == 0, result.output
    assert re.search(r"^worker-4 ", result.output, re.M) and not re.search(r"^worker-5 ", result.output, re.M)
    assert "[random]" in result.output and " crash " in result.output and " restart " in result.output


def test_plan_json_is_the_plan():
    result = invoke("plan", str(FULL), "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert data["name"] == "full-feature.v1" and len(data["workers"]) == 10
    assert result.output == make_plan(load_scenario(FULL)[0]).dumps()


def test_plan_refusal_goes_to_stderr_with_status_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: t\ntraining: {max_updates: 1}\nworkers: [{count: 0}]\n")
    result = invoke("plan", str(path))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"invalid scenario in {path}:\n  workers[0].count: must be >= 1, got 0\n"


def test_plan_needs_a_file():
    result = invoke("plan")
    assert result.exit_code == 2
    assert "Missing argument 'SCENARIO_FILE'" in result.output


def test_plan_refuses_a_directory(tmp_path):
    result = invoke("plan", str(tmp_path))
    assert result.exit_code == 2
    assert "is a directory" in result.output


def test_help():
    result = invoke("--help")
    assert result.exit_code == 0
    assert "Usage:" in result.output
    for command in SUBCOMMANDS:
        assert re.search(rf"^\s+{command}\s", result.output, re.M), command
    assert invoke("-h").output == result.output


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_subcommand_help(command):
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: ")
    assert f" {command} " in result.output.splitlines()[0]


def test_plan_help_mentions_its_options():
    output = invoke("plan", "--help").output
    assert "--set KEY=VALUE" in output and "--json" in output


def test_run_help_mentions_its_options():
    output = invoke("run", "--help").output
    for option in ("--backend", "--set", "--out", "--run-id", "--strict", "--quiet"):
        assert option in output


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert re.search(r"version \d+\.\d+", result.output)


def test_unknown_command():
    result = invoke("frobnicate")
    assert result.exit_code == 2
    assert "No such command" in result.output


def test_planning_imports_no_heavy_dependencies():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from emulator.cli import main\n"
        f"assert CliRunner().invoke(main, ['plan', {str(FULL)!r}]).exit_code == 0\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'docker', 'pyroute2', 'pandas', 'matplotlib'})\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
