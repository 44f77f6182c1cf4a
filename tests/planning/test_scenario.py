"""The scenario file: a full example parses into base units; every malformed file is refused
with one line that names the field (``tests/scenarios/bad``); ``--set`` overrides; the schema."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from emulator.cli import main
from emulator.planning.plan import make_plan
from emulator.planning.distributions import Choice, Fixed, Normal, PerDevice, Uniform
from emulator.planning.loader import load_scenario
from emulator.planning.overrides import apply_override
from emulator.planning.problems import Problem, ScenarioError, format_path
from emulator.planning.safe_yaml import MAX_FILE_BYTES, parse_yaml
from emulator.planning.scenario import Scenario, json_schema, resolve_targets, validate

HERE = Path(__file__).resolve().parents[1]  # tests/
FULL = HERE / "scenarios" / "full.yaml"
QUICKSTART = HERE.parent / "scenarios" / "quickstart.yaml"
BAD = sorted((HERE / "scenarios" / "bad").glob("*.yaml"))
MiB = 1024**2


def minimal(**extra) -> dict:
    """The smallest valid raw scenario, plus ``extra`` top-level keys."""
    return {"name": "t", "training": {"max_updates": 10}, "workers": [{"count": 2}], **extra}


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        validate(data)
    return [str(p) for p in info.value.problems]


def plan_cli(*args: str):
    return CliRunner().invoke(main, ["plan", *args])


# -- a full, valid scenario ------------------------------------------------------------------


@pytest.fixture(scope="module")
def full() -> Scenario:
    scenario, raw = load_scenario(FULL)
    assert raw["name"] == "full-feature.v1"
    return scenario


def test_full_scenario_top_level(full):
    assert full.name == "full-feature.v1"
    assert full.seed == 42
    assert full.model.name == "mlp" and not full.model.is_user
    assert full.backend == "local"
    assert full.worker_count == 10
    d = full.dataset
    assert (d.name, d.partition, d.classes_per_worker, d.train_size, d.test_size) == ("mnist-5k", "non_iid", 2, 2000, 500)


def test_full_scenario_training_in_base_units(full):
    t = full.training
    assert (t.batch_size, t.learning_rate, t.max_updates) == (16, 0.05, 5000)
    assert t.duration == 600.0
    assert t.eval_every.seconds == 30.0 and t.eval_every.updates is None
    assert t.eval_every.to_json() == {"seconds": 30.0}


def test_full_scenario_method(full):
    m = full.method
    assert m.name == "comp_c" and m.rule == "staleness" and m.error_feedback is True
    assert m.params == {"c": 0.02}
    assert (m.wire.values, m.wire.indices) == ("f16", "raw32")


def test_full_scenario_server_and_evaluator_in_base_units(full):
    s = full.server
    assert s.cpus == 2.0
    assert s.memory == 512 * MiB
    assert s.uplink == 100e6 and s.downlink == 1e9
    assert s.delay == pytest.approx(0.005)
    assert s.port == 7100
    assert full.evaluator.cpus == 0.5 and full.evaluator.memory == 1024 * MiB


def test_full_scenario_scalar_group(full):
    g = full.workers[0]
    assert (g.name, g.count, g.memory) == ("fixed", 2, 256 * MiB)
    assert g.cpus == Fixed(0.25)
    assert g.uplink == Fixed(2e6)
    assert g.downlink == Fixed(1e6)  # 125kB/s: bytes per second
    assert g.delay == Fixed(pytest.approx(0.030))
    assert g.jitter == Fixed(pytest.approx(0.005))
    assert g.loss == Fixed(pytest.approx(0.001))


def test_full_scenario_per_device_group(full):
    g = full.workers[1]
    assert g.cpus == PerDevice((0.1, 0.2, 0.3))
    assert g.uplink == PerDevice((1e6, 2e6, 3e6))
    assert g.delay.values == pytest.approx((0.01, 0.02, 0.03))
    assert g.loss.values == pytest.approx((0.0, 0.005, 0.01))
    assert g.downlink is None  # unshaped
    assert g.memory == 1024 * MiB  # the default


def test_full_scenario_distribution_group(full):
    g = full.workers[2]
    assert g.cpus == Uniform(0.05, 0.2)
    assert g.uplink == Normal(2e6, 5e5, 1e6, 3e6)
    assert g.downlink == Choice((5e6, 10e6), (3.0, 1.0))
    assert isinstance(g.delay, Normal)  # the {mean, std} form
    assert (g.delay.mean, g.delay.std, g.delay.low, g.delay.high) == pytest.approx((0.05, 0.01, 0.02, 0.08))
    assert g.jitter == Choice((0.0, 0.002))
    assert g.loss == Uniform(0.0, 0.01)


def test_full_scenario_faults(full):
    f = full.faults
    assert f.horizon == 600.0
    assert (f.crash.rate_per_hour, f.crash.restart_after, f.crash.workers) == (2.0, 60.0, "drawn")
    actions = [e.action for e in f.at]
    assert set(actions) == {"crash", "restart", "pause", "resume", "partition", "heal", "cpus", "link"}
    assert (f.at[0].time, f.at[0].targets, f.at[0].restart_after) == (30.0, (0,), 20.0)
    assert (f.at[3].targets, f.at[3].duration) == ((2, 3), 10.0)
    assert (f.at[6].action, f.at[6].targets, f.at[6].duration) == ("partition", "listed", 15.0)
    assert (f.at[9].cpus, f.at[9].targets, f.at[9].duration) == (0.05, "fixed", 30.0)
    link = f.at[10].link
    assert (link.uplink, link.delay, link.loss, link.downlink) == (5e5, pytest.approx(0.2), 0.01, None)
    assert f.at[10].targets == (2, 4) and f.at[10].duration == 60.0
    assert f.at[11].targets == "all"  # a link change without 'workers'
    assert [(t.worker, t.after_pushes, t.action) for t in f.triggers] == [
        (5, 50, "crash"), (6, 20, "pause"), (7, 30, "crash"), (8, 40, "partition")]
    assert f.triggers[1].duration == 10.0 and f.triggers[2].restart_after == 5.0


def test_group_targets_resolve_to_indices(full):
    assert resolve_targets("fixed", full) == [0, 1]
    assert resolve_targets("listed", full) == [2, 3, 4]
    assert resolve_targets("drawn", full) == [5, 6, 7, 8, 9]
    assert resolve_targets("all", full) == list(range(10))
    assert resolve_targets((4, 2, 4), full) == [2, 4]
    with pytest.raises(ValueError, match="no worker group named 'phones'; groups: fixed, listed, drawn"):
        resolve_targets("phones", full)


def test_the_scenario_round_trips_through_its_json_dump(full):
    # what `emulate run` stores as the resolved scenario must load again, to the same plan
    dumped = json.loads(json.dumps(full.model_dump(mode="json", by_alias=True)))
    assert dumped["workers"][2]["cpus"] == {"uniform": [0.05, 0.2]}
    assert dumped["workers"][1]["uplink"] == [1e6, 2e6, 3e6]
    again = validate(dumped)
    assert again == full
    assert make_plan(again).dumps() == make_plan(full).dumps()


def test_quickstart_is_valid():
    scenario, _ = load_scenario(QUICKSTART)
    assert scenario.worker_count == 4
    assert scenario.training.eval_every.updates == 100


def test_defaults():
    s = validate(minimal())
    assert s.seed == 0 and s.backend == "auto" and s.method.name == "adacomp"
    assert s.workers[0].cpus == Fixed(1.0) and s.workers[0].uplink is None
    assert s.training.eval_every.seconds == 30.0
    assert s.faults.crash is None and s.faults.at == [] and s.faults.triggers == []


@pytest.mark.parametrize(
    "value, expected",
    [("500 updates", {"updates": 500}), ("1 update", {"updates": 1}), ("20u", {"updates": 20}), (250, {"updates": 250}),
     ("30s", {"seconds": 30.0}), ("2min", {"seconds": 120.0}), ({"seconds": 5}, {"seconds": 5.0})],
)
def test_eval_every_forms(value, expected):
    s = validate(minimal(training={"max_updates": 10, "eval_every": value}))
    assert s.training.eval_every.to_json() == expected


def test_models_are_immutable(full):
    with pytest.raises(Exception):
        full.seed = 3  # type: ignore[misc]


# -- the corpus of malformed scenarios -------------------------------------------------------


def test_the_bad_corpus_is_large():
    assert len(BAD) >= 30


def test_reliability_counts_the_corpus_as_it_is():
    """docs/RELIABILITY.md says how many malformed scenarios the corpus holds: the number there is this one."""
    text = (HERE.parent / "docs" / "RELIABILITY.md").read_text()
    said = re.findall(r"holds (\d+) malformed scenarios", text) + re.findall(r"\| malformed scenario files \| (\d+) \|", text)
    assert said and {int(n) for n in said} == {len(BAD)}, (said, len(BAD))


@pytest.mark.parametrize("path", BAD, ids=[p.name for p in BAD])
def test_bad_scenario_is_refused_with_the_expected_line(path):
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# expect: "), f"{path.name}: the first line must be '# expect: <error line>'"
    expected = first[len("# expect: "):]
    started = time.monotonic()
    result = plan_cli(str(path))
    elapsed = time.monotonic() - started
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line.strip() for line in result.output.splitlines()]
    assert lines[0] == f"invalid scenario in {path}:"
    assert expected in lines, f"expected the line {expected!r} in:\n{result.output}"
    assert elapsed < 5, f"took {elapsed:.1f}s"


def test_a_file_over_one_mib_is_refused_before_parsing(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("name: huge\ntraining: {max_updates: 1}\nworkers: [{count: 1}]\n# " + "x" * MAX_FILE_BYTES + "\n")
    result = plan_cli(str(path))
    assert result.exit_code == 2
    assert "file larger than 1024 KiB" in result.output
    assert "Traceback" not in result.output


def test_a_missing_file_is_reported(tmp_path):
    result = plan_cli(str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2
    assert "cannot read the file: No such file or directory" in result.output


def test_an_endless_file_is_read_only_up_to_the_limit():
    with pytest.raises(ScenarioError, match="file larger than 1024 KiB"):
        load_scenario("/dev/zero")


@pytest.mark.parametrize("levels", [9, 12])
def test_billion_laughs_is_refused_quickly(levels):
    text = "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, levels))
    started = time.monotonic()
    with pytest.raises(ScenarioError, match="more than 100,000 values once YAML aliases are expanded"):
        parse_yaml(text)
    assert time.monotonic() - started < 2


def test_deep_nesting_is_refused_quickly():
    text = "a: " + "[" * (MAX_FILE_BYTES - 10)
    started = time.monotonic()
    with pytest.raises(ScenarioError, match="nested more than 50 levels deep"):
        parse_yaml(text)
    assert time.monotonic() - started < 3


def test_nesting_up_to_the_limit_is_fine():
    assert parse_yaml("a: " + "[" * 49 + "]" * 49)["a"]


def test_merge_keys_are_not_duplicates():
    data = parse_yaml("base: &b {count: 2, cpus: 0.5}\nother:\n  <<: *b\n  cpus: 0.25\n")
    assert data["other"] == {"count": 2, "cpus": 0.25}


def test_duplicate_keys_are_refused_at_any_depth():
    with pytest.raises(ScenarioError, match=r"line 1, column 15: key 'count' given twice"):
        parse_yaml("w: {count: 1, count: 2}")


def test_python_tags_are_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ScenarioError, match="could not determine a constructor"):
        parse_yaml(f"name: !!python/object/apply:os.system ['touch {marker}']")
    assert not marker.exists()


def test_several_problems_are_reported_together():
    problems = problems_of({"name": "bad name", "training": {}, "workers": [{"count": 0, "cpus": 0}]})
    assert "name: use letters, digits, '.', '_' and '-' (starting with a letter or digit), got 'bad name'" in problems
    assert "training: give max_updates, duration, or both, so the run ends" in problems
    assert "workers[0].count: must be >= 1, got 0" in problems
    assert "workers[0].cpus: must be > 0, got 0" in problems


@pytest.mark.parametrize(
    "group, line",
    [
        ({"count": True}, "workers[0].count: must be an integer, got True"),
        ({"count": 2, "cpus": True}, "workers[0].cpus: must be a number, got True"),
        ({"count": 2, "uplink": False}, "workers[0].uplink: not a rate: False"),
        ({"count": 2, "cpus": {"choice": [0.1, 0.2], "weights": [True, 1]}},
         "workers[0].cpus: choice: weights must be non-negative numbers with a positive sum"),
        ({"count": 2, "cpus": {"choice": [0.1, 0.2], "weights": [1e308, 1e308]}},
         "workers[0].cpus: choice: weights must be non-negative numbers with a positive sum"),
        ({"count": 2, "cpus": {"normal": {"mean": 1}}}, "workers[0].cpus: must be a number, got None"),
        ({"count": 2, "cpus": {"normal": [1, -0.5]}}, "workers[0].cpus: normal: std must be >= 0"),
        ({"count": 2, "cpus": {"gamma": [1, 2]}},
         "workers[0].cpus: expected a value, a list, or one of uniform/normal/choice, got keys ['gamma']"),
        ({"count": 2, "cpus": {"choice": []}}, "workers[0].cpus: choice: needs a non-empty list of values"),
        ({"count": 2, "memory": "-1g"}, "workers[0].memory: not a size: '-1g'"),
        ({"count": 2, "delay": float("inf")}, "workers[0].delay: not a finite duration: inf"),
    ],
)
def test_more_refusals(group, line):
    assert line in problems_of(minimal(workers=[group]))


def test_problem_paths():
    assert format_path(("workers", 0, "cpus")) == "workers[0].cpus"
    assert format_path(("faults", "at", 3, "for")) == "faults.at[3].for"
    assert format_path(()) == ""
    assert str(Problem("", "the file is empty")) == "the file is empty"
    error = ScenarioError([Problem("a.b", "bad"), Problem("c", "worse")], "x.yaml")
    assert error.render() == "invalid scenario in x.yaml:\n  a.b: bad\n  c: worse"
    assert str(error) == "x.yaml: a.b: bad; c: worse"


# -- --set -----------------------------------------------------------------------------------


def load_with(*overrides: str, path: Path = FULL) -> Scenario:
    return load_scenario(path, list(overrides))[0]


def test_set_nested_keys_and_list_indices():
    s = load_with("training.max_updates=7", "workers[1].count=3", "workers[1].cpus[2]=0.9", "faults.at[4].pause=3",
                  "method.c=0.5")
    assert s.training.max_updates == 7
    assert s.workers[1].cpus == PerDevice((0.1, 0.2, 0.9))
    assert s.faults.at[4].targets == (3,)
    assert s.method.params == {"c": 0.5}


def test_set_values_are_yaml_typed():
    s = load_with("seed=9", "training.learning_rate=0.5", "workers[0].uplink=5mbit", "workers[0].cpus={uniform: [0.1, 0.3]}",
                  "workers[1].delay=[1ms, 2ms, 3ms]", "method.error_feedback=false", "description=")
    assert s.seed == 9 and isinstance(s.seed, int)
    assert s.training.learning_rate == 0.5
    assert s.workers[0].uplink == Fixed(5e6)
    assert s.workers[0].cpus == Uniform(0.1, 0.3)
    assert s.workers[1].delay.values == pytest.approx((0.001, 0.002, 0.003))
    assert s.method.error_feedback is False
    assert s.description == ""


def test_set_a_value_that_is_not_yaml_stays_a_string():
    with pytest.raises(ScenarioError, match=r"name: use letters.*got '\[1'"):
        load_with("name=[1")


def test_set_creates_missing_optional_sections():
    s = load_with("faults.crash.rate_per_hour=6", "faults.crash.restart_after=1min", "server.uplink=10mbit", path=QUICKSTART)
    assert s.faults.crash.rate_per_hour == 6 and s.faults.crash.restart_after == 60
    assert s.server.uplink == 10e6


def test_set_through_an_empty_section(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: t\ntraining: {max_updates: 1}\nworkers: [{count: 1}]\nfaults:\n")
    assert load_with("faults.crash.rate_per_hour=1", path=path).faults.crash.rate_per_hour == 1


@pytest.mark.parametrize(
    "assignment, line",
    [
        ("workers[0].cont=3", "--set workers[0].cont: unknown key 'workers[0].cont' (did you mean 'count'?)"),
        ("trainig.max_updates=3", "--set trainig.max_updates: unknown key 'trainig' (did you mean 'training'?)"),
        ("faults.crsh.rate_per_hour=1", "--set faults.crsh.rate_per_hour: unknown key 'faults.crsh' (did you mean 'crash'?)"),
        ("faults.at[0].fro=1s", "--set faults.at[0].fro: unknown key 'faults.at[0].fro' (did you mean 'for'?)"),
        ("zzz=1", "--set zzz: unknown key 'zzz'; allowed: name, description, seed, model, dataset, training, method, "
                  "server, evaluator, workers, faults, backend"),
        ("workers[5].count=1", "--set workers[5].count: index 5 is out of range: workers has 3 item(s)"),
        ("workers[1].cpus[3]=1", "--set workers[1].cpus[3]: index 3 is out of range: workers[1].cpus has 3 item(s)"),
        ("workers[0].cpus[0]=1", "--set workers[0].cpus[0]: workers[0].cpus is not a list"),
        ("training[0]=1", "--set training[0]: training is not a list"),
        ("name.first=x", "--set name.first: name is not a mapping"),
        ("training.max_updates", "--set: expected key=value, got 'training.max_updates'"),
        ("=3", "--set: cannot parse key path '' at ''"),
        ("training..max_updates=3", "--set: cannot parse key path 'training..max_updates' at ''"),
        ("workers.0.count=3", "--set: cannot parse key path 'workers.0.count' at '0'"),
        ("workers[-1].count=3", "--set: cannot parse key path 'workers[-1].count' at 'workers[-1]'"),
    ],
)
def test_set_errors(assignment, line):
    with pytest.raises(ScenarioError) as info:
        load_with(assignment)
    assert line in [str(p) for p in info.value.problems]
    assert info.value.source == str(FULL)


def test_set_errors_through_the_cli():
    result = plan_cli(str(QUICKSTART), "--set", "workers[0].cont=3")
    assert result.exit_code == 2
    assert "--set workers[0].cont: unknown key 'workers[0].cont' (did you mean 'count'?)" in result.output
    assert "Traceback" not in result.output


def test_set_values_are_validated_like_the_file():
    with pytest.raises(ScenarioError) as info:
        load_with("workers[0].uplink=0mbit")
    assert [str(p) for p in info.value.problems] == ["workers[0].uplink: must be > 0, got '0mbit'"]


def test_set_method_parameters_are_checked_by_the_compressor():
    with pytest.raises(ScenarioError) as info:
        load_with("method.k=3")
    assert "method.k: unknown parameter for comp_c (parameters: c; also name, rule, error_feedback, wire, pull)" in [
        str(p) for p in info.value.problems]


def test_set_on_an_aliased_node_changes_that_place_only(tmp_path):
    path = tmp_path / "alias.yaml"
    path.write_text("name: t\ntraining: {max_updates: 1}\nworkers:\n  - &g {count: 2, cpus: 0.5}\n  - *g\n")
    s = load_with("workers[0].count=5", path=path)
    assert [g.count for g in s.workers] == [5, 2]


def test_apply_override_in_place():
    data = minimal()
    apply_override(data, "workers[0].loss=1%")
    apply_override(data, "dataset.partition=iid")
    assert data["workers"][0]["loss"] == "1%" and data["dataset"] == {"partition": "iid"}


# -- schema ----------------------------------------------------------------------------------


def test_schema_command_prints_json_schema():
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert set(schema["properties"]) == {
        "name", "description", "seed", "model", "dataset", "training", "method", "server", "evaluator", "workers",
        "faults", "backend"}
    assert set(schema["required"]) == {"name", "training", "workers"}
    assert schema == json_schema()


def test_schema_uses_the_file_spelling_of_keys():
    text = json.dumps(json_schema())
    assert '"for"' in text  # the alias, not the Python name 'duration' of TimedEvent
    assert "additionalProperties" in text  # unknown keys are refused


def test_the_full_scenario_is_plain_yaml():
    # the test file itself must not rely on anything but standard YAML
    assert isinstance(yaml.safe_load(FULL.read_text()), dict)
