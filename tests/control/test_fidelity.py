"""Which workers the controller probes at once: never more than the server's shaped link takes,
or every probe measures its share of the server's link and is flagged as a slow link."""

from __future__ import annotations

from conftest import ROOT
from emulator.control.fidelity import cpu_probe_batches, link_probe_batches
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
