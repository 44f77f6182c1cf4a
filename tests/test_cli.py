"""``emulate``: help texts, and the human form of ``emulate plan``."""

from __future__ import annotations

import json
import sys
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


def test_a_network_the_daemon_cannot_free_fails_clean_and_says_what_to_do(monkeypatch):
    """2026-12-07: a federated run's network kept a dead endpoint ("has active endpoints", no
    container attached); teardown and clean left it and clean still exited 0."""
    import emulator.control.cleanup
    from emulator.backends.docker import stuck_network

    error = "403 Client Error: error while removing network: network emu-01 id 4f2a has active endpoints"
    why = stuck_network(error, live=[])
    assert "restart the Docker daemon, then run `emulate clean --all`" in why
    assert stuck_network(error, live=["emu-01-worker-3"]) == "containers still attached: emu-01-worker-3"
    assert stuck_network("500 Server Error: busy", live=[]) == "500 Server Error: busy"
    assert stuck_network(error, live=None) == error  # could not be inspected: the error as the daemon said it
    line = f"network emu-01 NOT removed: {why}"
    done = emulator.control.cleanup.Cleaned(removed=["container emu-01-server", line, line])  # one a round
    assert done.gone == ["container emu-01-server"] and done.failed == [line]
    monkeypatch.setattr(emulator.control.cleanup, "clean_all", lambda *args, **kwargs: done)
    result = invoke("clean")
    assert result.exit_code == 1
    assert "removed 1 resource(s)" in result.output and f"could not remove 1 resource(s):\n  {line}" in result.output


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
    result = invoke("sweep", str(QUICKSTART), "--backend", "local", "--grid", grid, "--dir", str(tmp_path / "sweep"))
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
           for kind, name in (("availability", "phones-availability.csv"), ("population", "population.csv"))),
         *({**MINIMAL, "method": {"name": "asgd", "local": local}} for local in ({"steps": 2}, {"epochs": 1}))]  # local steps


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
    extra = ["-m", "adacomp", "--out", str(blocker / "runs")] if command == "compare" else ["--dir", str(blocker / "sweep")]
    result = invoke(command, str(QUICKSTART), "--backend", "local", *extra)
    assert result.exit_code == 2, result.output
    option = "--out" if command == "compare" else "--dir"
    assert error_line(result).startswith(f"error: {option} {blocker}/") and "cannot make the directory" in error_line(result)


# -- one vocabulary for the commands that run -----------------------------------------------

RUNNING_COMMANDS = ("run", "compare", "sweep")
EVERY_RUNNING_COMMAND = {"--backend", "--set", "--out", "--strict", "--tolerance", "--no-fidelity", "--quiet", "--no-report"}
EXPERIMENTS = {"--dir", "--repeat", "--jobs"}  # many runs: compare and sweep


def _declaration(option: "click.Option") -> tuple:
    return (tuple(option.opts), option.name, repr(option.type), option.default, option.is_flag, option.multiple,
            option.help, option.show_default, option.metavar)


def test_the_commands_that_run_share_one_vocabulary():
    """The same option name means the same thing, with the same default and help, on every command
    that has it; every option that makes sense on a command is there."""
    import click

    declared: dict[str, dict[str, tuple]] = {}
    for command in (*RUNNING_COMMANDS, "plan", "report"):
        for param in main.commands[command].params:
            if isinstance(param, click.Option):
                for opt in param.opts:
                    declared.setdefault(opt, {})[command] = _declaration(param)
    disagreements = {opt: by for opt, by in declared.items() if len(set(by.values())) > 1}
    assert not disagreements, disagreements
    for command in RUNNING_COMMANDS:
        missing = EVERY_RUNNING_COMMAND - set(declared_on(command))
        assert not missing, (command, missing)
    for command in ("compare", "sweep"):
        assert not EXPERIMENTS - set(declared_on(command)), command


def declared_on(command: str) -> list[str]:
    import click

    return [opt for p in main.commands[command].params if isinstance(p, click.Option) for opt in p.opts]


def test_backend_defaults_to_the_scenarios_everywhere():
    for command in RUNNING_COMMANDS:
        option = next(p for p in main.commands[command].params if p.name == "backend")
        assert option.default is None, command  # None: the scenario's backend:


def test_compare_honours_the_scenarios_backend(tmp_path, monkeypatch):
    """A backend: local scenario runs on local under compare too, not on whatever auto finds."""
    import emulator.experiments.compare as compare_module

    chosen = []
    scenario = tmp_path / "local.yaml"
    scenario.write_text(QUICKSTART.read_text() + "backend: local\n")
    monkeypatch.setattr(compare_module, "compare", lambda *a, **k: chosen.append(k["backend"]) or sys.exit(0))
    invoke("compare", str(scenario), "-m", "asgd", "--out", str(tmp_path / "out"))
    assert chosen == ["local"]


def test_a_bad_method_spec_is_blamed_on_m_and_leaves_no_folder(tmp_path):
    out = tmp_path / "out"
    line = error_line(invoke("compare", str(QUICKSTART), "-m", "adacom", "--backend", "local", "--out", str(out)))
    assert line.startswith("error: -m adacom: method.name: unknown method 'adacom'; known: "), line
    assert not out.exists()
    line = error_line(invoke("compare", str(QUICKSTART), "-m", "asgd", "-m", "asgd", "--backend", "local", "--dir", str(out)))
    assert line == "error: -m: 'asgd' given twice"
    assert not out.exists()


@pytest.mark.parametrize("command", [["run"], ["compare", "-m", "asgd"], ["sweep", "--grid", "seed=1,2"]])
def test_a_refused_command_leaves_no_folder(tmp_path, command):
    out = tmp_path / "deep" / "out"
    result = invoke(command[0], str(QUICKSTART), *command[1:], "--backend", "local", "--set", "workers[0].uplink=10mbps",
                    "--out", str(out))
    assert result.exit_code == 2, result.output
    assert "'10mbps' is ambiguous" in result.stderr
    assert not (tmp_path / "deep").exists()


# -- units: what users mean ----------------------------------------------------------------


@pytest.mark.parametrize("value, bits, byte", [("10mbps", "10mbit", "10MB/s"), ("10Mbps", "10mbit", "10MB/s"),
                                               ("10MBPS", "10mbit", "10MB/s"), ("125kbps", "125kbit", "125kB/s"),
                                               ("1gbps", "1gbit", "1GB/s")])
def test_an_ambiguous_rate_in_set_is_refused_with_both_readings_and_blames_set(value, bits, byte):
    result = invoke("plan", str(QUICKSTART), "--set", f"workers[0].uplink={value}")
    assert result.exit_code == 2
    assert f"workers[0].uplink: '{value}' is ambiguous" in result.stderr
    assert f"write {bits} for" in result.stderr and f"or {byte} for" in result.stderr
    assert result.stderr.rstrip().endswith(f"(from --set workers[0].uplink={value})")


def test_an_ambiguous_rate_in_a_grid_is_refused_naming_the_point(tmp_path):
    result = invoke("sweep", str(QUICKSTART), "--backend", "local", "--grid", "workers[0].uplink=2mbit,10mbps",
                    "--dir", str(tmp_path / "sweep"))
    assert result.exit_code == 2, result.output
    assert "grid point 1 (workers[0].uplink=10mbps): workers[0].uplink: '10mbps' is ambiguous" in result.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("option, value, expected", [
    ("--up", "10mbps", "error: --up 10mbps: '10mbps' is ambiguous"),
    ("--down", "1Gbps", "error: --down 1Gbps: '1Gbps' is ambiguous"),
    ("--duration", "10 parsecs", "error: --duration 10 parsecs: unknown duration unit 'parsecs'"),
    ("--window", "0", "error: --window 0: must be above zero"),
])
def test_traces_generate_names_the_option(tmp_path, option, value, expected):
    line = error_line(invoke("traces", "generate", "link", str(tmp_path / "t.csv"), option, value))
    assert line.startswith(expected), line
    assert not (tmp_path / "t.csv").exists()


def test_traces_generate_reads_a_bare_duration_as_seconds(tmp_path):
    """README: a bare number is seconds; 10 s of 2 s windows is 5 rows per device."""
    result = invoke("traces", "generate", "link", str(tmp_path / "t.csv"), "--duration", "10", "--devices", "2")
    assert result.exit_code == 0, result.output
    assert "rows 10" in result.output


@pytest.mark.parametrize("override, expected", [
    ("workers[0].delay=10", "workers[0].delay: must be at most 5.0s, got 10 (10.0s); a bare number is seconds"),
    ("workers[0].delay=10m", "workers[0].delay: must be at most 5.0s, got '10m' (10m00s)"),
    ("workers[0].jitter=6s", "workers[0].jitter: must be at most 5.0s"),
    ("server.delay=30", "server.delay: must be at most 5.0s"),
    ("workers[0].uplink=100", "workers[0].uplink: must be at least 1kbit, got 100 (100bit); a bare number is bits/s"),
    ("workers[0].downlink=1tbit", "workers[0].downlink: must be at most 100gbit"),
    ("workers[0].cpus=5000", "workers[0].cpus: must be at most 1024"),
    ("training.max_updates=2000000000", "training.max_updates: must be at most 1,000,000,000 updates, got 2e+09"),
    ("training.max_updates=1.0e21", "training.max_updates:"),
])
def test_bounds_refuse_what_users_do_not_mean(override, expected):
    result = invoke("plan", str(QUICKSTART), "--set", override)
    assert result.exit_code == 2, result.output
    assert expected in result.stderr, result.stderr


def test_plan_needs_no_data_set(tmp_path):
    """Showing the plan of a scenario whose data set is not here works, and says so."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(QUICKSTART.read_text().replace("mnist-5k", "mnist").replace("dataset: {name: mnist,",
                                                                                       "dataset: {name: mnist, path: /nonexistent/x,"))
    result = invoke("plan", str(scenario))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("scenario quickstart")
    assert "note: running this plan needs data set 'mnist', which is not here:" in result.stderr


# -- the headline ---------------------------------------------------------------------------


@pytest.mark.parametrize("status, outcome, word", [
    ("completed", "ok", "completed"), ("completed", "diverged", "diverged"), ("completed", "dead", "dead"),
    ("failed", "unknown", "failed"), ("interrupted", "ok", "interrupted"), ("failed", "diverged", "diverged"),
])
def test_the_headline_states_the_outcome(status, outcome, word):
    from emulator.cli import headline

    assert headline({"status": status, "outcome": outcome}) == word


def test_a_diverged_run_prints_diverged_first(tmp_path, monkeypatch, capsys):
    from emulator.cli import _print_summary

    summary = {"status": "completed", "outcome": "diverged", "name": "scale64", "method": "adacomp", "workers": 64,
               "backend": "docker", "final_accuracy": 0.1, "final_version": 300, "updates_applied": 300, "duration_s": 60.0,
               "updates_per_s": 5.0, "ingress_payload_bytes": 1000}
    _print_summary(summary, tmp_path)
    assert capsys.readouterr().out.splitlines()[0] == "diverged: scale64 (adacomp, 64 workers, docker)"
