"""``emulate``: help texts, and the human form of ``emulate plan``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator.cli import main
from emulator.planning.plan import make_plan
from emulator.planning.loader import load_scenario

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


# -- bad input: exit 2 with one "error:" line, before anything runs -----------------------


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fails the test if a command gets past its input checks to choosing a backend or running."""
    import emulator.backends
    import emulator.control.controller

    def refuse(*args, **kwargs):
        raise AssertionError("the command went past its input checks")

    monkeypatch.setattr(emulator.backends, "choose", refuse)
    monkeypatch.setattr(emulator.control.controller, "Emulation", refuse)


def error_line(result) -> str:
    """The one line a refused command writes: ``error: ...`` on stderr, nothing on stdout."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("run_id", ["../x", "a/b", ".hidden", "..", "-x", "x\n", "", "x" * 201, "sp ace"])
def test_run_refuses_an_invalid_run_id(tmp_path, nothing_runs, run_id):
    out = tmp_path / "runs"
    line = error_line(invoke("run", str(QUICKSTART), "--out", str(out), "--run-id", run_id))
    assert line.startswith(f"error: --run-id: invalid run id {run_id!r}: use up to 200 letters, digits")
    assert list(tmp_path.iterdir()) == []


def test_run_id_is_checked_before_the_scenario(tmp_path, nothing_runs):
    line = error_line(invoke("run", str(tmp_path / "missing.yaml"), "--out", str(tmp_path), "--run-id", "../x"))
    assert line.startswith("error: --run-id: invalid run id '../x'")


@pytest.mark.parametrize("what", ["run", "empty directory", "file"])
def test_run_refuses_a_run_id_that_exists(tmp_path, nothing_runs, what):
    taken = tmp_path / "taken"
    if what == "file":
        taken.write_text("not mine")
    else:
        taken.mkdir()
        if what == "run":
            (taken / "summary.json").write_text('{"status": "completed"}')
    line = error_line(invoke("run", str(QUICKSTART), "--out", str(tmp_path), "--run-id", "taken"))
    assert line == f"error: --run-id: run directory {taken} already exists; choose another run id (nothing was written)"
    if what == "file":
        assert taken.read_text() == "not mine"
    else:
        assert [p.name for p in taken.iterdir()] == (["summary.json"] if what == "run" else [])


def test_run_directory_is_made_exclusively(tmp_path):
    from emulator.control.rundir import RunDirectory, RunIdError

    first = RunDirectory.create(tmp_path, "t", "one")
    assert first.path == (tmp_path / "one").absolute() and (first.path / "logs").is_dir()
    with pytest.raises(RunIdError, match="already exists"):
        RunDirectory.create(tmp_path, "t", "one")
    generated = RunDirectory.create(tmp_path / "deeper", "quickstart")
    assert re.fullmatch(r"\d{8}-\d{6}-quickstart-[0-9a-f]{4}", generated.run_id)


def test_clean_refuses_a_run_id_that_leaves_its_cgroup(monkeypatch):
    import emulator.control.cleanup

    def refuse(*args, **kwargs):
        raise AssertionError("clean_all was called with an invalid run id")

    monkeypatch.setattr(emulator.control.cleanup, "clean_all", refuse)
    for run_id in ("..", "../x", "/", ""):
        assert error_line(invoke("clean", "--run", run_id)).startswith(f"error: --run: invalid run id {run_id!r}")


@pytest.mark.parametrize("command", [
    ["run", str(QUICKSTART), "--backend", "swarm"],
    ["compare", str(QUICKSTART), "-m", "asgd", "-m", "adacomp", "--backend", "swarm"],
    ["sweep", str(QUICKSTART), "--grid", "seed=1,2", "--backend", "swarm"],
])
def test_an_unusable_backend_is_bad_input(tmp_path, monkeypatch, command):
    """Every command that runs refuses a backend this machine lacks, before anything runs (a swarm
    that is not there, stood in for by its availability check: no Docker needed)."""
    import emulator.control.controller
    from emulator.backends.swarm import SwarmBackend

    monkeypatch.setattr(SwarmBackend, "available", classmethod(lambda cls: (False, "this Docker daemon is not in a swarm")))
    monkeypatch.setattr(emulator.control.controller, "Emulation", None)  # anything that would run fails loudly
    out = ["--out", str(tmp_path / "out")]
    line = error_line(invoke(*command, *out))
    assert line == "error: backend 'swarm' is not usable here: this Docker daemon is not in a swarm"
    assert not (tmp_path / "out").exists()


def test_compare_on_an_inactive_swarm_is_bad_input(tmp_path):
    """The real check: the Docker daemon here answers but is in no swarm."""
    from emulator.backends.swarm import SwarmBackend

    ok, why = SwarmBackend.available()
    if ok:
        pytest.skip("a swarm is active here: nothing to refuse")
    result = invoke("compare", str(QUICKSTART), "-m", "asgd", "--backend", "swarm", "--out", str(tmp_path / "out"))
    assert error_line(result) == f"error: backend 'swarm' is not usable here: {why}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("grid, problem", [
    ("seed", "--grid: expected key=value1,value2,..., got 'seed'"),
    ("seed=[1,", "--grid: unbalanced brackets in '[1,'"),
    ("workers[0].cpus=0,1", "grid point 0 (workers[0].cpus=0): workers[0].cpus: must be > 0, got 0"),
])
def test_sweep_refuses_a_bad_grid(tmp_path, grid, problem):
    result = invoke("sweep", str(QUICKSTART), "--backend", "local", "--grid", grid, "--out", str(tmp_path / "sweep"))
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-2:] == ["invalid sweep:", f"  {problem}"]
    assert not (tmp_path / "sweep").exists()


def test_report_of_a_directory_that_holds_no_run(tmp_path):
    line = error_line(invoke("report", str(tmp_path)))
    assert line == f"error: {tmp_path}: neither a run directory, a sweep directory, nor a folder of runs"
    assert list(tmp_path.iterdir()) == []  # no empty report/ left behind


@pytest.mark.parametrize("command", [["images", "status"], ["images", "build"], ["images", "remove"],
                                     ["images", "push", "localhost:5000"]])
def test_images_without_a_docker_daemon(tmp_path, command):
    result = CliRunner().invoke(main, command, env={"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"})
    assert error_line(result).startswith("error: no Docker daemon answers (")


@pytest.mark.parametrize("registry", ["bad registry!", "host:", "Host:5000/UPPER", "under_score:5000"])
def test_images_push_refuses_a_malformed_registry_before_touching_docker(tmp_path, registry):
    result = CliRunner().invoke(main, ["images", "push", registry], env={"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"})
    assert error_line(result) == f"error: REGISTRY {registry!r}: expected HOST[:PORT][/PATH], e.g. registry.lab:5000"


def test_ctrl_c_exits_130(monkeypatch):
    import emulator.cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(emulator.cli, "json_schema", interrupted)
    result = invoke("schema")
    assert result.exit_code == 130
    assert result.stderr == "interrupted\n"


def test_help_documents_the_exit_codes():
    import emulator.cli

    output = invoke("--help").output
    table = output[output.index("Exit status:"):].splitlines()
    assert [line.split()[0] for line in table[1:5]] == ["0", "1", "2", "130"]
    for code in ("0", "1", "2", "130"):
        assert re.search(rf"^\s+{code}\s+\w", emulator.cli.__doc__, re.M), code


# -- doctor --------------------------------------------------------------------------------


def test_doctor_shows_every_line_of_a_detail(monkeypatch):
    import emulator.control.doctor

    rows = [("python", "info", "3.11"),
            ("dataset mnist", "warn", "not available here; tried, in order:\n  - a place: no such file\nTo get it: install it")]
    monkeypatch.setattr(emulator.control.doctor, "diagnose", lambda: rows)
    result = invoke("doctor")
    assert result.exit_code == 0
    assert result.output.splitlines() == [
        "[info] python: 3.11",
        "[warn] dataset mnist: not available here; tried, in order:",
        "         - a place: no such file",
        "       To get it: install it",
    ]


def test_doctor_keeps_the_whole_data_set_message(monkeypatch):
    from emulator import datasets
    from emulator.control import doctor

    message = "dataset 'mnist' is not available here; tried, in order:\n  - somewhere: no such file\nTo get it: this"

    def load(name, path=None):
        raise datasets.DatasetUnavailable(message)

    monkeypatch.setattr(datasets, "load", load)
    rows = {name: (status, detail) for name, status, detail in doctor.dataset_rows()}
    assert set(rows) == {f"dataset {name}" for name in datasets.DATASETS}
    assert rows["dataset mnist"] == ("warn", message)


# -- schema ----------------------------------------------------------------------------------


MINIMAL = {"name": "t", "training": {"max_updates": 100, "eval_every": {"updates": 10}}, "workers": [{}]}
FULL_BASE = {"name": "t", "training": {"duration": 60, "eval_every": {"seconds": 30}}, "workers": [{}],
             "faults": {"crash": {"rate_per_hour": 1}, "at": [{"time": 1, "link": {"uplink": "1mbit"}}],
                        "triggers": [{"worker": 0, "after_pushes": 1}]}}
BASES = [MINIMAL, FULL_BASE,
         {**FULL_BASE, "faults": {"at": [{"time": 1, "link": {"delay": "10ms"}}]}},
         {**FULL_BASE, "faults": {"at": [{"time": 1, "crash": 0}]}},
         *({**MINIMAL, "workers": [{"traces": {kind: str(Path(__file__).resolve().parents[1] / "scenarios" / "traces" / name)}}]}
           for kind, name in (("availability", "phones-availability.csv"), ("population", "population.csv")))]


def schema_defaults(schema: dict, node: dict, path: tuple = (), needs: tuple = ()):
    """(path, default, needs) of every default in the schema; ``needs``: the paths on the way that
    a scenario must hold already for the default to mean anything there (list items, objects with
    required keys, and objects that may be null: having one at all is a choice, e.g. ``faults.crash``)."""
    for key, prop in node.get("properties", {}).items():
        if "default" in prop:
            yield path + (key,), prop["default"], needs
        for option in [prop, *prop.get("anyOf", [])]:
            item, below, chosen = option, path + (key,), option is not prop
            if option.get("type") == "array":
                item, below, chosen = option.get("items", {}), below + (0,), True
            if "$ref" in item:
                item = schema["$defs"][item["$ref"].rsplit("/", 1)[1]]
            if "properties" in item:
                chosen = chosen or bool(item.get("required"))
                yield from schema_defaults(schema, item, below, needs + ((below,) if chosen else ()))


def _at(data, path):
    for key in path:
        data = data[key]
    return data


def _has(data, path) -> bool:
    try:
        _at(data, path)
    except (KeyError, IndexError, TypeError):
        return False
    return True


_ABSENT = object()


def _edited(data: dict, path: tuple, value=_ABSENT) -> dict:
    """A copy of ``data`` with ``value`` at ``path``, or without that key; mappings on the way are made."""
    data = json.loads(json.dumps(data))
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    if value is _ABSENT:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return data


def test_every_schema_default_loads_back():
    """Each default the schema states, written into a scenario, loads and means what leaving it
    out means. A default is tried in each base that holds what it needs and does not set it
    already; every default is tried at least once."""
    from emulator.planning.scenario import validate

    schema = json.loads(invoke("schema").output)
    found = list(schema_defaults(schema, schema))
    assert len(found) > 50
    tried = set()
    for path, default, needs in found:
        for base in BASES:
            if _has(base, path) or not all(_has(base, need) for need in needs):
                continue
            written, left_out = _edited(base, path, default), _edited(base, path)
            assert validate(written, "schema default") == validate(left_out, "no default"), (path, default)
            tried.add(path)
    assert tried == {path for path, _, _ in found}, sorted({path for path, _, _ in found} - tried)


def test_the_schema_accepts_every_scenario_file():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    validator = jsonschema.Draft202012Validator(json.loads(invoke("schema").output))
    files = sorted((HERE.parent / "scenarios").rglob("*.yaml")) + sorted((HERE / "scenarios").glob("*.yaml"))
    assert len(files) > 5
    for path in files:
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert errors == [], path


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_an_output_folder_that_cannot_be_made_is_bad_input(tmp_path, command):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    extra = ["-m", "adacomp", "--out", str(blocker / "runs")] if command == "compare" else ["--out", str(blocker / "sweep")]
    result = invoke(command, str(QUICKSTART), "--backend", "local", *extra)
    assert result.exit_code == 2, result.output
    assert error_line(result).startswith(f"error: --out {blocker}/") and "cannot make the directory" in error_line(result)
