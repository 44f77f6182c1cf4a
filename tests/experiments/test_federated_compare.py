"""Federated methods in a comparison: method specs with nested keys, the rounds table."""

from __future__ import annotations

import pytest

from conftest import SCENARIOS

from emulator.backends.local import zygote_address
from emulator.control.summary import traffic_per_push
from emulator.experiments.compare import parse_method_spec, plan_comparison, rounds_table
from emulator.experiments.records import compare_rows
from emulator.planning.problems import ScenarioError


def test_a_federated_method_as_a_compare_spec():
    spec = parse_method_spec("topk:c=0.1:local=5:aggregation.name=fedbuff:aggregation.buffer=2")
    assert spec.overrides[-2:] == ("method.aggregation.name=fedbuff", "method.aggregation.buffer=2")
    runs = plan_comparison(SCENARIOS / "quickstart.yaml", ["adacomp", spec.label])
    assert len(runs) == 2
    with pytest.raises(ScenarioError, match="method.aggregation.sample: 9 clients per round is above the population"):
        plan_comparison(SCENARIOS / "quickstart.yaml", ["asgd:aggregation.name=fedavg:aggregation.sample=9"])


def test_the_rounds_table_lists_the_federated_runs_only():
    rows = [{"method": "asgd", "run_id": "01-asgd", "rounds": None},
            {"method": "fedavg", "run_id": "02-fedavg", "rounds": {"count": 12, "mean_duration_s": 1.2, "mean_participants": 2.5,
                                                                  "stragglers_dropped": 3, "up_bytes_per_round": 589329.0,
                                                                  "down_bytes_per_round": 1077894.7}}]
    lines = rounds_table(rows)
    assert lines[-2] == "| `fedavg` | 02-fedavg | 12 | 1.200 | 2.50 | 3 | 589,329 | 1,077,895 |"
    assert rounds_table(rows[:1]) == []


# The summary of a FedAvg run of the paper profile (federated-symmetric, 03-...-r0): 24 rounds of 16
# pushes of 1,686,657 B; its per-update counts are per server step.
FEDAVG_SUMMARY = {"updates_applied": 24, "ingress_payload_bytes": 647676288, "downlink_payload_bytes": 721867368,
                  "down_bytes_per_update": 30077807.0, "two_way_bytes_per_update": 57064319.0,
                  "rounds": {"count": 24, "applied": 24, "mean_participants": 16.0}}


def test_a_federated_runs_bytes_both_ways_are_per_push_like_every_other_row():
    assert traffic_per_push(FEDAVG_SUMMARY, 1686657.0) == {"down_bytes_per_update": round(721867368 / 384, 1),
                                                           "two_way_bytes_per_update": round((647676288 + 721867368) / 384, 1)}
    asgd = {"ingress_payload_bytes": 100, "downlink_payload_bytes": 300, "down_bytes_per_update": 3.0,
            "two_way_bytes_per_update": 4.0}
    assert traffic_per_push(asgd, 1.0) == {"down_bytes_per_update": 3.0, "two_way_bytes_per_update": 4.0}
    assert traffic_per_push(FEDAVG_SUMMARY, None) == {"down_bytes_per_update": None, "two_way_bytes_per_update": None}
    # a record written before: its row kept the per-step counts; the rows made from it are per push
    record = {"row": {"bytes_per_update": 1686657.0, "down_bytes_per_update": 30077807.0, "two_way_bytes_per_update": 57064319.0},
              "summary": FEDAVG_SUMMARY, "evaluations": {"version": [], "time_s": [], "accuracy": [], "bytes": []},
              "repeat": 0, "seed": 17}
    row, = compare_rows([record])
    assert row["down_bytes_per_update"] == 1879862.9 and row["two_way_bytes_per_update"] == 3566519.9


# A federated run of the paper profile (2026-12-07): on Docker its zygote failed to bind ("AF_UNIX
# path too long") and every device imported TensorFlow itself, unlike the runs it was compared with.
FEDBUFF_RUN = ("06-topk_c-0.01_error_feedback-true_rule-plain_pull-delta_training.learning_rate-0.02_local-10_"
               "aggregation.name-fedbuff_aggregation.buffer-10-r0")


@pytest.mark.parametrize("run_id", ["03-" + "x" * 200, FEDBUFF_RUN])
def test_a_long_run_id_still_names_a_zygote_socket_on_every_backend(run_id):
    from emulator.backends.docker_zygote import ZygoteBoot

    local, docker = zygote_address(run_id, 12345), ZygoteBoot(None, "image", run_id, {}).address
    for address, other in ((local, zygote_address(run_id[:-1], 12345)), (docker, ZygoteBoot(None, "image", run_id[:-1], {}).address)):
        assert address.startswith("@") and len(address.encode()) <= 107 and address != other


def test_the_federated_experiment_plans_at_the_paper_profiles_scale():
    """Defined, not run here: its comparison plans on the paper's methods scenario at 64 devices (every
    method spec valid), and the budget counts its runs."""
    from emulator.experiments.paper.claims import budget
    from emulator.experiments.paper.profiles import LINKS, PAPER, PROFILES

    profile = PROFILES["paper"]
    for link in profile.federated_links:
        runs = plan_comparison(PAPER / "methods.yaml", list(profile.federated_methods),
                               [*profile.overrides("federated", "mnist-5k"), *LINKS[link][1]], repeat=profile.federated_repeat)
        assert len(runs) == len(profile.federated_methods) * profile.federated_repeat
    rows = {name: runs for name, runs, _ in budget(profile)}
    assert rows["federated"] == 2 * 6 * 3
    assert budget(PROFILES["smoke"])[-1] == ("federated", 0, 0.0)


def test_the_federated_baselines_run_at_the_steps_the_grid_chose_and_the_federated_specs_as_written():
    from emulator.experiments.paper.experiments import federated_specs
    from emulator.experiments.paper.profiles import PROFILES

    methods = PROFILES["paper"].federated_methods
    specs = federated_specs(methods, {"asgd": 0.005, "adacomp:c=0.01": 0.01, "comp_c:c=0.01": 0.01})
    assert specs[:2] == ["asgd:training.learning_rate=0.005", "adacomp:c=0.01:training.learning_rate=0.01"]
    assert specs[2:] == list(methods[2:]) and all("aggregation.name=" in spec for spec in specs[2:])
    assert federated_specs(methods, {}) == list(methods)  # a method the grid has not settled keeps its spec
