"""Which workers the controller probes at once: never more than the server's shaped link takes,
or every probe measures its share of the server's link and is flagged as a slow link."""

from __future__ import annotations

from conftest import ROOT
from emulator.control.fidelity import compare, cpu_probe_batches, link_probe_batches, link_probe_plan, probe_request
from emulator.planning.loader import load_scenario
from emulator.planning.plan import make_plan


def _plan(*overrides: str):
    return make_plan(load_scenario(ROOT / "scenarios" / "paper" / "ingress.yaml", list(overrides))[0])


def test_probes_at_once_fit_the_servers_ingress():
    # 64 devices of 20 Mbit/s up against a server that takes 200 Mbit/s: ten at a time, not 16.
    plan = _plan("workers[0].count=64")
    batches = link_probe_batches(list(plan.workers), plan.server, most=16)
    assert [len(b) for b in batches] == [10] * 6 + [4]
    assert [d.name for b in batches for d in b] == [w.name for w in plan.workers]
    for batch in batches:
        assert sum(d.link.uplink_bps for d in batch) <= plan.server.link.downlink_bps


def test_the_servers_uplink_bounds_the_downlink_probes_and_unshaped_servers_only_the_count():
    plan = _plan("workers[0].count=20", "server.downlink=null", "server.uplink=120mbit")
    assert [len(b) for b in link_probe_batches(list(plan.workers), plan.server, most=16)] == [2] * 10  # 50 Mbit/s down each
    plan = _plan("workers[0].count=20", "server.downlink=null")
    assert [len(b) for b in link_probe_batches(list(plan.workers), plan.server, most=16)] == [16, 4]


def test_a_device_faster_than_the_server_is_probed_alone_at_the_servers_rate():
    plan = _plan("workers[0].count=3", "workers[0].uplink=1gbit")
    assert [len(b) for b in link_probe_batches(list(plan.workers), plan.server, most=16)] == [1, 1, 1]


def test_cpu_shares_measured_at_once_fit_the_cores_given():
    # 0.3 core each on 1.5 cores: five at a time.
    plan = _plan("workers[0].count=12", "workers[0].cpus=0.3")
    assert [len(b) for b in cpu_probe_batches(list(plan.workers), 1.5)] == [5, 5, 2]
    plan = _plan("workers[0].count=3", "workers[0].cpus=4")  # more than a core each counts as one
    assert [len(b) for b in cpu_probe_batches(list(plan.workers), 1.5)] == [1, 1, 1]


def test_with_several_servers_every_servers_link_is_probed_and_each_worker_judged_against_its_own():
    # 20 workers, 4 shards: worker i probes shard i mod 4, each shard's batches fit that shard's ingress.
    plan = _plan("workers[0].count=20", "server.shards=4")
    batches = link_probe_plan(plan, most=16)
    assert [server.name for server, _ in batches] == ["server-0", "server-1", "server-2", "server-3"]
    for server, batch in batches:
        assert [w.index % 4 for w in batch] == [server.index] * len(batch)
        assert probe_request(batch[0], server, 0.0)["shard"] == server.index
    assert sorted(w.name for _, batch in batches for w in batch) == sorted(w.name for w in plan.workers)
    worker = plan.workers[6]
    rate = worker.link.uplink_bps * 0.95
    measured = {worker.name: {"uplink_bps": rate, "downlink_bps": rate, "rtt_s": 0.01}}
    row = compare(plan, measured, {})["devices"][worker.name]["uplink_bps"]
    assert row["server"] == "server-2"


def test_one_server_probes_carry_no_shard():
    plan = _plan("workers[0].count=3")
    assert [server.name for server, _ in link_probe_plan(plan, most=16)] == ["server"]
    assert "shard" not in probe_request(plan.workers[0], plan.server, 0.0)
