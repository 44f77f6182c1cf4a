"""The fault injector and the live progress line, against a backend that only records what it is asked.

Every action of the scenario has its function in the injector's table; each reaches the backend
through its setters (or the device's own shaper where the backend cannot), changes the run's
device state, and is a ``fault`` event with its planned time, origin and what it took.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from emulator.planning import scenario as scenario_schema
from emulator.control.faults import ACTIONS, Devices, FaultInjector
from emulator.planning.plan import EventPlan, make_plan
from emulator.control.runstate import LiveState, Progress
from emulator.planning.scenario import validate


class RecordingBackend:
    """Says yes to everything and remembers each call; ``partitions``: whether it can cut a network."""

    name = "recording"

    def __init__(self, partitions: bool = True):
        self.calls: list[tuple] = []
        self.partitions = partitions

    def __getattr__(self, method):
        def call(device, *args):
            self.calls.append((method, device.name, *args))
        return call

    def partition(self, device, cut):
        self.calls.append(("partition", device.name, cut))
        return self.partitions

    def transport_link(self, device, link):
        return {"delay_s": link.delay_s}


def make(faults=None, partitions=True):
    data = {"name": "t", "seed": 1, "training": {"max_updates": 10}, "workers": [{"count": 3, "uplink": "2mbit", "delay": "10ms"}],
            **({"faults": faults} if faults else {})}
    plan = make_plan(validate(data))
    backend = RecordingBackend(partitions)
    events, sent = [], []
    injector = FaultInjector(plan, backend, Devices.of(plan), config=lambda d: {"name": d.name},
                             send=lambda device, command: sent.append((device, command)),
                             record=lambda kind, **fields: events.append({"kind": kind, **fields}))
    return injector, backend, events, sent


def test_every_action_of_the_scenario_has_its_function():
    assert set(ACTIONS) == set(scenario_schema.ACTIONS)


def test_the_timeline_is_applied_as_training_time_passes():
    injector, backend, events, _ = make({"at": [{"time": "5s", "pause": 1, "for": "10s"}, {"time": "2s", "crash": 0}]})
    injector.advance(1.9, lambda worker: 0)
    assert events == [] and backend.calls == []
    injector.advance(5.0, lambda worker: 0)
    assert [(e["action"], e["target"], e["planned_s"], e["origin"]) for e in events] == [
        ("crash", "worker-0", 2.0, "schedule"), ("pause", "worker-1", 5.0, "schedule")]
    assert backend.calls == [("kill", "worker-0"), ("pause", "worker-1")]
    injector.advance(15.0, lambda worker: 0)
    assert events[-1]["action"] == "resume" and backend.calls[-1] == ("resume", "worker-1")


def test_a_crash_of_a_device_already_down_changes_nothing_and_is_not_recorded():
    injector, backend, events, _ = make()
    crash = EventPlan(1.0, "crash", "worker-2", {}, "random")
    injector.apply(crash)
    injector.apply(replace(crash, time_s=2.0))
    assert injector.devices.down == {"worker-2"}
    assert backend.calls == [("kill", "worker-2")] and len(events) == 1


def test_a_restart_is_the_next_incarnation_with_its_current_link():
    injector, backend, events, _ = make()
    injector.apply(EventPlan(1.0, "crash", "worker-0"))
    injector.apply(EventPlan(2.0, "link", "worker-0", {"delay_s": 0.5}))
    injector.apply(EventPlan(3.0, "restart", "worker-0"))
    link = injector.devices.links["worker-0"]
    assert link.delay_s == 0.5 and link.uplink_bps == 2_000_000  # a link change keeps what it does not name
    assert backend.calls[-2:] == [("start", "worker-0", {"name": "worker-0"}), ("set_link", "worker-0", link)]
    assert injector.devices.incarnation == {"worker-0": 1} and not injector.devices.down
    assert events[-1]["incarnation"] == 1


def test_a_link_change_reaches_the_kernel_and_the_devices_shaper():
    injector, backend, events, sent = make()
    injector.apply(EventPlan(1.0, "link", "worker-1", {"delay_s": 0.2}))
    assert backend.calls == [("set_link", "worker-1", injector.devices.links["worker-1"])]
    assert sent == [("worker-1", {"cmd": "shape", "transport": {"delay_s": 0.2}})]
    assert events == [{"kind": "fault", "action": "link", "target": "worker-1", "planned_s": 1.0, "origin": "schedule", "delay_s": 0.2}]


def test_a_cpu_change_is_the_devices_share_from_then_on():
    injector, backend, _, _ = make()
    injector.apply(EventPlan(1.0, "cpus", "worker-2", {"cpus": 0.125}))
    assert injector.devices.cpus["worker-2"] == 0.125 and backend.calls == [("set_cpus", "worker-2", 0.125)]


@pytest.mark.parametrize("partitions", [True, False])
def test_a_partition_falls_back_to_the_devices_shaper_where_the_backend_cannot_cut(partitions):
    injector, _, events, sent = make(partitions=partitions)
    injector.apply(EventPlan(1.0, "partition", "worker-0"))
    injector.apply(EventPlan(2.0, "heal", "worker-0"))
    if partitions:
        assert sent == [] and all("mechanism" not in e for e in events)
    else:
        assert sent == [("worker-0", {"cmd": "shape", "transport": {"blocked": True}}),
                        ("worker-0", {"cmd": "shape", "transport": {"blocked": False}})]
        assert [e["mechanism"] for e in events] == ["transport", "transport"]


def test_a_trigger_fires_once_after_its_pushes_and_is_undone_after_its_delay():
    injector, backend, events, _ = make({"triggers": [{"worker": 2, "after_pushes": 5, "action": "crash", "restart_after": "3s"}]})
    pushes = {"worker-2": 4}
    injector.advance(10.0, pushes.get)
    assert events == [] and not injector.restart_ahead
    pushes["worker-2"] = 5
    injector.advance(11.0, pushes.get)
    assert [(e["action"], e["origin"]) for e in events] == [("crash", "trigger")] and injector.restart_ahead
    pushes["worker-2"] = 50
    injector.advance(13.9, pushes.get)
    injector.advance(14.0, pushes.get)
    assert [(e["action"], e["planned_s"]) for e in events] == [("crash", 11.0), ("restart", 14.0)]
    assert [c[0] for c in backend.calls] == ["kill", "start", "set_link"]


def test_the_progress_line_gives_rates_since_the_last_line_and_the_sooner_eta():
    state = LiveState()
    progress = Progress(max_updates=1000, duration_s=50.0, workers=4)
    state.observe("updates", [{"t": i, "bytes": 10, "worker": 0} for i in range(1, 101)])
    state.observe("traffic", [{"ingress_bytes": 2048, "egress_bytes": 0, "worker": 0}])
    first = progress.line(10.0, state, workers_up=3)
    assert "updates 100/1000 (10.0/s)" in first and "workers 3/4 up" in first and "ETA 40.0s" in first  # duration: 40 s left; updates: 90 s
    state.observe("updates", [{"t": 400, "bytes": 10, "worker": 0}])
    assert "(300.0/s)" in progress.line(11.0, state, workers_up=4)  # since the previous line
