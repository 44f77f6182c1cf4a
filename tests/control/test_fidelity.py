"""Which workers the controller probes at once: never more than the server's shaped link takes,
or every probe measures its share of the server's link and is flagged as a slow link."""

from __future__ import annotations

from pathlib import Path

from emulator.control.fidelity import link_probe_batches
from emulator.planning.loader import load_scenario
from emulator.planning.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]


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
