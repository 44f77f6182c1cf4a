"""What every backend owes a run, checked by running one tiny scenario on each.

Parametrised over the backends that can run here: ``local`` always; ``docker`` and ``swarm``
(marked ``docker``) when an engine answers, the swarm on a single-node swarm made by
``test_swarm.swarm`` when none is active. Each runs the same scenario (below: two workers, a
hundred and fifty updates, crashes, shaped links with a loss rate) through
:func:`emulator.control.run.run_scenario`, and the same observables are checked: the run
directory's records exist and parse; every worker pushed; the summary says completed with an
outcome that agrees with its last evaluation; the crash and the restart were applied and
recorded (the worker came back as a new incarnation and pushed again, and pushed nothing while
down); each link property's mechanism is recorded, the one this backend uses; teardown leaves
no process, cgroup, container, network or service of the run. What a backend does beyond the
contract (hardening, measured rates, several nodes) stays in its own file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import read_json, run_scenario
from emulator import backends
from emulator.control.rundir import STREAMS
from emulator.control.summary import WARMUP_UPDATES
from test_swarm import labelled as swarm_labelled
from test_swarm import node_files
from test_swarm import swarm  # noqa: F401  (a fixture, found here by pytest: a single-node swarm made when none is active)

SCENARIO = """\
name: backend-contract
seed: 5
model: mlp
dataset: {name: digits, partition: iid}
training: {batch_size: 10, learning_rate: 0.1, max_updates: 150, eval_every: 75 updates}
method: {name: adacomp, c: 0.05}
server: {cpus: 0.5}
evaluator: {cpus: 0.25}
workers:
  - {count: 2, cpus: 0.25, uplink: 8mbit, downlink: 16mbit, delay: 5ms, loss: 0.1%}
faults:
  triggers:
    - {worker: 0, after_pushes: 3}
    - {worker: 1, after_pushes: 3, restart_after: 1s}
"""
# No clock in it: each worker crashes once it has pushed three updates, worker 0 for good and
# worker 1 to restart a second later, so the run can only reach its last update through the
# restarted worker, however long that one takes to boot again (a fork of the zygote on local, a
# fresh container importing TensorFlow on docker and swarm: 4 s on an idle machine, minutes under
# a load of a hundred). The crashes land a trace or two after the third push; 150 updates leave
# room for that.
WORKERS = 2
LINK = ("uplink", "downlink", "delay", "jitter", "loss")  # mechanisms.json names each, per device
CONFIGURED = ("uplink", "downlink", "delay", "loss")  # the link properties the scenario sets; jitter it leaves
# The mechanism each backend realises a worker's link rate and its CPU share with.
UPLINK = {"local": "transport-token-bucket", "docker": "tc-htb", "swarm": "tc-htb",
          "virtual": "virtual: shaped rate less TCP/IP headers after the shaper's burst, server link shared max-min"}
CPUS = {"local": ("cgroup-cfs", "none ("), "docker": ("docker-cpu-quota",), "swarm": ("docker-cpu-quota by the node's agent",),
        "virtual": ("virtual: CFS quota model",)}

BACKENDS = [
    pytest.param("local", marks=pytest.mark.slow, id="local"),
    pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.slow], id="docker"),
    pytest.param("swarm", marks=[pytest.mark.docker, pytest.mark.slow], id="swarm"),
    pytest.param("virtual", id="virtual"),  # in process, on a simulated clock: a few seconds
]


def test_the_parametrisation_is_the_backend_registry():
    assert sorted(p.values[0] for p in BACKENDS) == sorted(backends.BACKENDS) == sorted(UPLINK) == sorted(CPUS) == sorted(LEFTOVERS)


@pytest.fixture(scope="module", params=BACKENDS)
def contract_run(request, tmp_path_factory) -> tuple[str, dict, Path]:
    """(backend, summary, run directory) of the contract scenario on one backend, run once per module."""
    name = request.param
    if name in ("docker", "swarm"):
        request.getfixturevalue("runtime_image")  # skips when no Docker engine answers
    if name == "swarm":
        request.getfixturevalue("swarm")
    ok, why = backends.backend_class(name).available()
    if not ok:
        pytest.skip(f"backend {name} is not usable here: {why}")
    out = tmp_path_factory.mktemp(f"contract-{name}")
    path = out / "contract.yaml"
    path.write_text(SCENARIO)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE_EMULATOR_CALIBRATION", str(out / "calibration.json"))  # the virtual clock's, measured here, not the user's
        summary, run = run_scenario(path, out / "runs", backend=name, check_fidelity=False)
    return name, summary, run


def _events(run: Path) -> list[dict]:
    return _strict_jsonl(run / "events.jsonl")


def _strict_jsonl(path: Path) -> list[dict]:
    """Every line a JSON object: the run ended, so no line may be cut off."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        record = json.loads(line)
        assert isinstance(record, dict), f"{path.name}:{number}"
        records.append(record)
    return records


def test_the_run_directory_records_exist_and_parse(contract_run):
    name, summary, run = contract_run
    for filename in ("scenario.yaml", "scenario.resolved.json", "plan.json", "mechanisms.json", "summary.json"):
        assert (run / filename).is_file(), filename
    for filename in ("scenario.resolved.json", "plan.json", "mechanisms.json", "summary.json"):
        read_json(run / filename)
    assert read_json(run / "summary.json") == summary
    streams = sorted(p.stem for p in run.glob("*.jsonl"))
    assert set(streams) <= STREAMS, streams
    assert {"events", "updates", "accuracy"} <= set(streams), streams
    for stream in streams:
        _strict_jsonl(run / f"{stream}.jsonl")
    plan = read_json(run / "plan.json")
    devices = {plan["server"]["name"], plan["evaluator"]["name"], *(w["name"] for w in plan["workers"])}
    assert devices == {"server", "evaluator", "worker-0", "worker-1"}
    for device in devices:
        assert (run / "logs" / f"{device}.log").is_file(), device


def test_every_worker_pushed(contract_run):
    name, summary, run = contract_run
    updates = _strict_jsonl(run / "updates.jsonl")
    assert {u["worker"] for u in updates} == set(range(WORKERS))
    assert sorted(u["t"] for u in updates) == list(range(1, len(updates) + 1))
    assert summary["updates_applied"] == len(updates) > 0
    assert summary["ingress_payload_bytes"] >= sum(u["bytes"] for u in updates) > 0


def test_the_summary_says_how_the_run_ended(contract_run):
    name, summary, run = contract_run
    assert summary["status"] == "completed" and summary["error"] is None
    assert summary["backend"] == name and summary["workers"] == WORKERS
    assert summary["final_is_end_of_training"] and summary["final_version"] == summary["updates_applied"]
    # Judged once past the warm-up; never diverged or dead on ten digits with AdaComp.
    assert summary["outcome"] == ("ok" if summary["final_version"] >= WARMUP_UPDATES else "unknown"), summary["outcome_detail"]
    assert summary["diverged"] is False and summary["non_finite_updates"] == 0


def test_a_crash_and_its_restart_are_applied_and_recorded(contract_run):
    name, summary, run = contract_run
    assert summary["faults"] == {"crash": 2, "restart": 1}
    events = _events(run)
    faults = [(e["action"], e["target"], e["origin"]) for e in events if e.get("kind") == "fault"]
    assert sorted(faults) == [("crash", "worker-0", "trigger"), ("crash", "worker-1", "trigger"), ("restart", "worker-1", "trigger")]
    crash = next(e for e in events if e.get("kind") == "fault" and e["action"] == "crash" and e["target"] == "worker-1")
    restart = next(e for e in events if e.get("kind") == "fault" and e["action"] == "restart")
    assert crash["ts"] < restart["ts"] and restart["incarnation"] == 1
    incarnations = [e.get("incarnation") for e in events if e.get("kind") == "connected" and e.get("worker") == 1]
    assert incarnations == [0, 1]
    updates = _strict_jsonl(run / "updates.jsonl")
    assert not any(u["worker"] == 1 and crash["ts"] + 0.5 < u["ts"] < restart["ts"] for u in updates), "a crashed worker pushes nothing"
    assert any(u["worker"] == 1 and u["ts"] > restart["ts"] for u in updates), "the restarted worker pushes again"
    down = next(e for e in events if e.get("kind") == "fault" and e["target"] == "worker-0")
    assert not any(u["worker"] == 0 and u["ts"] > down["ts"] + 0.5 for u in updates), "a worker crashed for good pushes no more"


def test_link_shaping_is_recorded_with_the_mechanism_used(contract_run):
    name, summary, run = contract_run
    mechanisms = read_json(run / "mechanisms.json")
    for worker in ("worker-0", "worker-1"):
        recorded = mechanisms[worker]
        # every property, and how the device's program started where a backend has a choice (docker: zygote or exec)
        assert set(recorded) - {"boot"} == {"cpus", *LINK}, recorded
        if "boot" in recorded:
            assert recorded["boot"].split(" ")[0] in ("zygote", "exec") and "(" in recorded["boot"], recorded["boot"]
        for prop in CONFIGURED:  # set by the scenario: realised by something, or recorded as none with why
            assert recorded[prop] and recorded[prop] != "unshaped", (worker, prop, recorded[prop])
            assert not recorded[prop].startswith("none") or "(" in recorded[prop], (worker, prop, recorded[prop])
        assert recorded["uplink"] == recorded["downlink"] == UPLINK[name]
        assert recorded["cpus"].startswith(CPUS[name]), recorded["cpus"]


def test_teardown_leaves_nothing_of_the_run(contract_run):
    name, summary, run = contract_run
    assert LEFTOVERS[name](run.name, run) == []


def _local_leftovers(run_id: str, run: Path) -> list[str]:
    """Processes working in the run directory (the zygote and every device it forked) or naming the
    run (the zygote's socket), and the run's cgroups."""
    from emulator.host import cgroups

    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        if cwd == str(run) or cwd.startswith(f"{run}/") or run_id in cmdline:
            left.append(f"process {proc.name}: {cmdline.strip()} (cwd {cwd})")
    base = cgroups._base()
    if base is not None and (base / cgroups.ROOT_NAME / run_id).exists():
        left.append(f"cgroup {base / cgroups.ROOT_NAME / run_id}")
    return left


def _docker_leftovers(run_id: str, run: Path) -> list[str]:
    from emulator.backends.docker import RUN_LABEL, client

    docker = client()
    label = f"{RUN_LABEL}={run_id}"
    return ([f"container {c.name}" for c in docker.containers.list(all=True, filters={"label": label})]
            + [f"network {n.name}" for n in docker.networks.list(filters={"label": label})])


def _swarm_leftovers(run_id: str, run: Path) -> list[str]:
    from emulator.backends.docker import client

    services, networks, containers = swarm_labelled(client(), run)
    return ([f"service {s}" for s in services] + [f"network {n}" for n in networks] + [f"container {c}" for c in containers]
            + (["the run's files on this node"] if node_files(run) else []))


def _virtual_leftovers(run_id: str, run: Path) -> list[str]:
    """Nothing runs outside the controller's process: what could be left is a process working in the run."""
    return _local_leftovers(run_id, run)


LEFTOVERS = {"local": _local_leftovers, "docker": _docker_leftovers, "swarm": _swarm_leftovers, "virtual": _virtual_leftovers}
