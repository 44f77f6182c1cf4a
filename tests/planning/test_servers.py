"""The servers in the plan: one ``server`` by default, ``server-0 .. server-(N-1)`` with shards,
each a device with the server's resources; faults on ``server`` reach every shard."""

from __future__ import annotations

import pytest

from emulator.planning.plan import make_plan, server_names
from emulator.planning.problems import ScenarioError
from emulator.planning.scenario import validate

BASE = {"name": "s", "seed": 1, "dataset": {"name": "digits"}, "training": {"max_updates": 10},
        "workers": [{"count": 2}], "backend": "local",
        "server": {"cpus": 0.5, "uplink": "10mbit", "downlink": "20mbit"}}


def plan(**server):
    return make_plan(validate({**BASE, "server": {**BASE["server"], **server}}))


def test_one_shard_is_the_plan_of_old():
    p = plan()
    assert [s.name for s in p.servers] == ["server"] and p.servers[0] is p.server and p.partition is None
    assert p.server.index == -1 and not {"servers", "partition"} & set(p.to_json())
    assert p.digest() == plan(shards=1).digest()


def test_each_shard_is_a_device_with_the_server_s_resources():
    p = plan(shards=4, split="tensors")
    assert [s.name for s in p.servers] == list(server_names(4)) == [f"server-{i}" for i in range(4)]
    assert [d.name for d in p.devices[:5]] == [*server_names(4), "evaluator"]
    assert {(s.cpus, s.link.uplink_bps, s.link.downlink_bps) for s in p.servers} == {(0.5, 10e6, 20e6)}
    assert [s.index for s in p.servers] == [0, 1, 2, 3]
    assert p.partition == {"split": "tensors", "shards": 4, "when_down": "wait"}
    assert p.to_json()["partition"] == p.partition and len(p.to_json()["servers"]) == 4
    assert all(p.is_server(name) for name in server_names(4)) and not p.is_server("evaluator")


def test_a_crash_of_the_server_crashes_every_shard():
    s = validate({**BASE, "server": {"shards": 2, "checkpoint": {"every_updates": 5}},
                  "faults": {"at": [{"time": "5s", "crash": "server", "restart_after": "3s"}]}})
    events = [(e.time_s, e.action, e.target) for e in make_plan(s).events]
    assert events == [(5.0, "crash", "server-0"), (5.0, "crash", "server-1"),
                      (8.0, "restart", "server-0"), (8.0, "restart", "server-1")]


@pytest.mark.parametrize("server, field", [({"shards": 0}, "server.shards"), ({"shards": 65}, "server.shards"),
                                           ({"split": "hash"}, "server.split"),
                                           ({"when_down": "skip"}, "server.when_down"),
                                           ({"shards": 2, "when_down": "drop"}, "server.when_down")])
def test_bad_shards_are_refused_naming_the_field(server, field):
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        plan(**server)


def test_the_split_must_fit_the_model_before_any_run_starts():
    from emulator.control import workload

    too_many = make_plan(validate({**BASE, "model": "mlp", "server": {"shards": 5, "split": "tensors"}}))
    with pytest.raises(ScenarioError, match=r"server\.shards: 5 is more than the model's 4 tensors"):
        workload.check(too_many, [], (8, 8, 1), 10)
    for method in ("asgd", "staleness_asgd", "adacomp"):  # the built-in rules act per coordinate
        fits = make_plan(validate({**BASE, "model": "mlp", "method": {"name": method}, "server": {"shards": 4}}))
        assert workload.check(fits, [], (8, 8, 1), 10).total == 4810


def test_a_fault_can_target_one_shard_and_only_one_that_exists():
    s = validate({**BASE, "server": {"shards": 2}, "faults": {"at": [{"time": "5s", "crash": "server-1", "restart_after": "2s"}]}})
    assert [(e.action, e.target) for e in make_plan(s).events] == [("crash", "server-1"), ("restart", "server-1")]
    with pytest.raises(ScenarioError, match=r"faults\.at\[0\]\.crash: no server named 'server-2'"):
        make_plan(validate({**BASE, "server": {"shards": 2}, "faults": {"at": [{"time": "5s", "crash": "server-2"}]}}))
    with pytest.raises(ScenarioError, match="no server named 'server-0'"):  # one server is 'server'
        make_plan(validate({**BASE, "faults": {"at": [{"time": "5s", "crash": "server-0"}]}}))


def test_workers_learn_what_to_do_while_a_server_is_down_from_the_plan():
    assert plan(shards=2, when_down="skip").partition["when_down"] == "skip"
    assert plan(shards=2).partition["when_down"] == "wait"
