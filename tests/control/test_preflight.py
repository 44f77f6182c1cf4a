"""What a run says before it trains: quotas this machine cannot give, properties its backend
cannot emulate, and a boot that makes no progress."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from emulator.backends import Backend
from emulator.control import controller
from emulator.control.controller import Emulation, unemulated
from emulator.control.run import check_host
from emulator.planning.loader import load_scenario
from emulator.planning.plan import make_plan
from emulator.planning.problems import ScenarioError

QUICKSTART = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"


class Here(Backend):  # devices on this machine's cores, as local and docker
    name = "here"


class Spread(Here):  # devices over other machines, as a swarm
    name = "spread"
    cpu_limited_by_host = False


def loaded(*sets: str):
    scenario = load_scenario(QUICKSTART, list(sets))[0]
    return scenario, make_plan(scenario)


def test_a_quota_above_the_machines_cores_is_refused_naming_the_field():
    scenario, plan = loaded("workers[1].cpus=64")
    with pytest.raises(ScenarioError) as info:
        check_host(scenario, plan, Here, say=lambda m: None, cores=2)
    assert [str(p) for p in info.value.problems] == [
        "workers[1].cpus: 64 cores for worker-2, but this machine has 2 and the here backend runs every device on it"]


def test_a_fault_that_sets_more_cores_than_the_machine_has_is_refused():
    scenario, plan = loaded("faults={at: [{time: 1s, cpus: 8}]}", "training.duration=10s")
    with pytest.raises(ScenarioError) as info:
        check_host(scenario, plan, Here, say=lambda m: None, cores=4)
    assert [str(p) for p in info.value.problems] == ["faults.at[0].cpus: 8 cores, but this machine has 4"]


def test_quotas_that_add_up_to_more_than_the_cores_are_said():
    scenario, plan = loaded()
    said = []
    check_host(scenario, plan, Here, say=said.append, cores=2)
    total = sum(d.cpus for d in plan.devices)
    assert said == [f"note: the devices' CPU quotas add up to {total:g} cores on this 2-core machine: they cannot all "
                    "get their quota at once, only while some wait (on the network, or for the server)"]
    said.clear()
    check_host(scenario, plan, Here, say=said.append, cores=16)
    assert said == []


def test_a_backend_over_many_machines_is_not_held_to_this_ones_cores():
    scenario, plan = loaded("workers[1].cpus=64")
    said = []
    check_host(scenario, plan, Spread, say=said.append, cores=2)
    assert said == []


def test_a_configured_property_no_mechanism_realises_is_warned_about():
    mechanisms = {"worker-0": {"cpus": "cgroup-cfs", "loss": "none (no packet path to drop from on loopback)", "delay": "unshaped"},
                  "worker-1": {"cpus": "cgroup-cfs", "loss": "none (no packet path to drop from on loopback)"},
                  "server": {"cpus": "cgroup-cfs", "loss": "unshaped"}}
    assert unemulated(mechanisms, "local") == [
        "warning: the local backend cannot emulate loss here (no packet path to drop from on loopback): "
        "worker-0, worker-1 run without it (mechanisms.json)"]
    assert unemulated({"server": {"cpus": "cgroup-cfs", "loss": "unshaped"}}, "local") == []


def test_a_boot_without_progress_names_the_devices_it_waits_for_and_their_logs(tmp_path, monkeypatch):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker-1.log").write_text("importing\nloading data\nconnecting to 198.18.0.1:7000\n")
    monkeypatch.setattr(controller, "BOOT_STALL_S", 0.3)
    monkeypatch.setattr(controller, "TICK_S", 0.01)

    class Stop(Exception):
        pass

    said = []

    def say(message):
        said.append(message)
        if "no device became ready" in message:
            raise Stop

    emulation = Emulation.__new__(Emulation)
    devices = [SimpleNamespace(name=n) for n in ("server", "worker-0", "worker-1")]
    emulation.plan = SimpleNamespace(devices=devices, device=lambda name: name)
    emulation.state = SimpleNamespace(lock=threading.Lock(), ready={"server"}, newly_ready=[])
    emulation.backend = SimpleNamespace(alive=lambda device: True)
    emulation.rundir = SimpleNamespace(path=tmp_path)
    emulation.progress_every_s = 0  # --quiet: the stall is said all the same
    emulation.say, emulation.start_time, emulation._throttle_ready = say, time.time() - 85, lambda: None
    with pytest.raises(Stop):
        emulation._boot()
    lines = said[-1].splitlines()
    assert "no device became ready for 0s; still waiting for 2: worker-0, worker-1" in lines[0]
    assert lines[1:] == ["  logs/worker-0.log: (empty so far)",
                         "  logs/worker-1.log: importing | loading data | connecting to 198.18.0.1:7000"]
