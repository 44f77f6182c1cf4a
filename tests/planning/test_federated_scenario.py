"""The scenario's federated keys: resolved into the plan, bad input refused naming the field (exit 2)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from emulator.cli import main
from emulator.planning.plan import make_plan
from emulator.planning.problems import ScenarioError
from emulator.planning.scenario import validate


def scenario(method: dict, workers: int = 8) -> dict:
    return {"name": "fed", "training": {"max_updates": 10, "learning_rate": 0.05}, "workers": [{"count": workers}],
            "method": method}


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        validate(data)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(("method", "field"), [
    ({"name": "asgd", "aggregation": {"name": "fedavg", "sample": 9}}, "method.aggregation.sample: 9 clients per round is above the population (8 workers)"),
    ({"name": "asgd", "aggregation": {"name": "fedavg", "sample": 4, "deadline": "0s"}}, "method.aggregation.deadline"),
    ({"name": "asgd", "aggregation": {"name": "fedbuff", "buffer": 9}}, "method.aggregation.buffer: 9 is larger than the number of clients (8)"),
    ({"name": "adacomp", "local": {"steps": 5}}, "method.local: local steps push a model delta, which the rule 'adacomp' cannot take"),
    ({"name": "adacomp", "aggregation": "fedbuff"}, "method.rule"),
    ({"name": "asgd", "aggregation": {"name": "fedasync", "staleness": "cubic"}}, "method.aggregation.staleness"),
    ({"name": "asgd", "aggregation": {"name": "fedbuff", "sample": 3}}, "method.aggregation.sample: unknown parameter for fedbuff"),
    ({"name": "asgd", "aggregation": "fedsgd"}, "method.aggregation.name: unknown aggregation 'fedsgd'"),
    ({"name": "asgd", "local": {"steps": 5, "epochs": 1}}, "method.local"),
    ({"name": "asgd", "local": {"steps": 5}, "pull": {"every": 4}}, "method.pull.every"),
])
def test_bad_federated_input_names_its_field(method, field):
    assert any(p.startswith(field) for p in problems_of(scenario(method))), problems_of(scenario(method))


def test_a_federated_aggregation_runs_on_one_server():
    data = {**scenario({"name": "asgd", "aggregation": "fedbuff", "local": 5}), "server": {"shards": 2}}
    assert any(p.startswith("method.aggregation.name: fedbuff runs on one server") for p in problems_of(data))
    local_only = {**scenario({"name": "asgd", "local": 5}), "server": {"shards": 2}}
    assert make_plan(validate(local_only)).method.local == {"steps": 5, "epochs": None}


def test_bad_input_exits_2_naming_the_field(tmp_path):
    path = tmp_path / "fed.yaml"
    path.write_text(yaml.safe_dump(scenario({"name": "asgd", "aggregation": {"name": "fedavg", "sample": 20}})))
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2, result.output
    assert "method.aggregation.sample" in result.output


def test_the_plan_carries_local_steps_and_the_aggregation_to_the_devices():
    plan = make_plan(validate(scenario({"name": "topk", "c": 0.1, "error_feedback": True, "pull": "delta",
                                        "local": {"steps": 20, "server_learning_rate": 0.5},
                                        "aggregation": {"name": "fedavg", "sample": 4, "deadline": "30s"}})))
    method = plan.method
    assert method.local == {"steps": 20, "epochs": None}
    assert method.aggregation == {"name": "fedavg", "params": {"sample": 4, "deadline_s": 30.0}}  # as given
    assert method.to_json()["aggregation"]["name"] == "fedavg"
    worker = method.worker_config(learning_rate=plan.training["learning_rate"])
    assert worker.local.steps == 20 and worker.local.learning_rate == 0.05  # the clients' step size is the training's
    assert method.server_step_size(plan.training["learning_rate"]) == 0.5


def test_defaults_that_depend_on_the_clients_are_filled_in_and_recorded():
    small = make_plan(validate(scenario({"name": "asgd", "aggregation": "fedavg"}, workers=4))).method
    assert small.aggregation == {"name": "fedavg", "params": {"sample": 4}}  # not 10 of 4: every client
    large = make_plan(validate(scenario({"name": "asgd", "aggregation": "fedbuff"}, workers=64))).method
    assert large.aggregation == {"name": "fedbuff", "params": {"buffer": 10}}


def test_a_federated_aggregation_without_local_trains_one_epoch_and_plain_plans_keep_their_form():
    fed = make_plan(validate(scenario({"name": "asgd", "aggregation": {"name": "fedbuff", "buffer": 4}}))).method
    assert fed.local == {"steps": None, "epochs": 1} and fed.server_learning_rate == 1.0
    assert fed.aggregation["params"] == {"buffer": 4}
    plain = make_plan(validate(scenario({"name": "adacomp"}))).method
    assert not plain.federated and "aggregation" not in plain.to_json() and plain.local is None
    assert plain.worker_config().local is None


def test_a_users_aggregator_is_listed_bundled_and_checked(tmp_path):
    from compression.layout import Layout, TensorSpec
    from emulator.control import workload
    from emulator.planning.workload import user_files

    (tmp_path / "agg.py").write_text(
        "from emulator.runtime.aggregation import Aggregator, AggregatorError\n"
        "class Mine(Aggregator):\n"
        "    name = 'mine'\n    takes_model_delta = True\n    PARAMS = {'k': int}\n"
        "    def __init__(self, layout, rule, seed=0, k=1, **unknown):\n"
        "        super().__init__(layout, rule, seed, **unknown)\n"
        "        if k < 1:\n            raise AggregatorError('k', 'must be >= 1')\n"
        "    def receive(self, params, coordinates, worker, staleness, examples, now):\n"
        "        return self.rule.apply_coordinates(params, coordinates, worker, staleness)\n")
    layout = Layout((TensorSpec("w", (3,)),))

    def check(method):
        data = scenario(method)
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(data))
        from emulator.planning.loader import load_scenario
        plan = make_plan(load_scenario(path)[0])
        (file,) = [f for f in user_files(plan) if f.role == "aggregator"]
        assert file.field == "method.aggregation.name" and file.path == str(tmp_path / "agg.py")
        return [str(p) for p in workload._check_aggregator(file, plan, layout)]

    assert check({"name": "asgd", "local": 3, "aggregation": {"name": "agg.py:Mine", "k": 2}}) == []
    assert check({"name": "asgd", "local": 3, "aggregation": {"name": "agg.py:Mine", "k": 0}})[0].startswith("method.aggregation.name")
    assert check({"name": "adacomp", "aggregation": {"name": "agg.py:Mine"}})[0].startswith("method.rule")


def test_emulate_check_runs_the_aggregator_contract_on_a_users_class(tmp_path):
    (tmp_path / "mine.py").write_text(
        "import numpy as np\nfrom emulator.runtime.aggregation import Aggregator\n"
        "class Leaky(Aggregator):\n    name = 'leaky'\n    takes_model_delta = True\n"
        "    def receive(self, params, coordinates, worker, staleness, examples, now):\n"
        "        for target, values in coordinates:\n            params[target] -= values\n"
        "        return None\n")
    result = CliRunner().invoke(main, ["check", f"{tmp_path / 'mine.py'}:Leaky"])
    assert result.exit_code == 1, result.output
    assert "aggregator" in result.output and "FAIL holds_or_applies" in result.output.replace("  ", " ")
