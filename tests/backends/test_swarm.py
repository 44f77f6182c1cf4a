"""The Swarm backend: its pure parts, and real runs on a single-node swarm.

What every backend owes a run (records, pushes, a crash and restart, mechanisms, teardown after a
run) is checked on this one by tests/backends/test_contract.py, which uses this file's ``swarm``
fixture, ``labelled`` and ``node_files``; here, what is the swarm's own.

The ``swarm`` fixture initialises a swarm on the local Docker engine when none is active
(advertising 127.0.0.1 only, address pool in 198.18.0.0/15) and leaves it afterwards; an
existing swarm is used as it is and left alone.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, SCENARIOS, TEST_SCENARIOS, read_json, read_jsonl, run_scenario
from fault_checks import assert_hardened, assert_scheduled_faults

LABEL = "edge-emulator"
SWARM_POOL = "198.19.0.0/16"  # inside 198.18.0.0/15, apart from the runs' own subnets at its start
QUICK = ["workers[0].uplink=50mbit", "workers[1].uplink=50mbit", "training.max_updates=300", "training.eval_every=150 updates"]
docker_marks = [pytest.mark.docker, pytest.mark.slow]


# -- pure parts -----------------------------------------------------------------------------


def test_options_come_from_the_environment():
    from emulator.backends.base import BackendUnavailable
    from emulator.backends.swarm import SwarmOptions

    options = SwarmOptions.from_env({
        "EMULATE_SWARM_REGISTRY": "registry.lab:5000", "EMULATE_SWARM_ENCRYPT": "1",
        "EMULATE_SWARM_PLACEMENT": '{"phones": ["node.labels.site==edge", "spread=node.labels.rack"], "server": "node.role==manager"}',
        "EMULATE_SWARM_NODE_DOCKER": '{"node-b": "ssh://root@node-b"}',
    })
    assert options.registry == "registry.lab:5000" and options.encrypted and not options.reserve_cpus
    assert options.placement == {"phones": ("node.labels.site==edge", "spread=node.labels.rack"), "server": ("node.role==manager",)}
    assert options.node_docker == {"node-b": "ssh://root@node-b"}
    assert SwarmOptions.from_env({}) == SwarmOptions()
    with pytest.raises(BackendUnavailable, match="EMULATE_SWARM_PLACEMENT is not JSON"):
        SwarmOptions.from_env({"EMULATE_SWARM_PLACEMENT": "phones: x"})


def test_placement_by_device_group_and_role_and_from_the_plan():
    import types

    from emulator.backends.swarm import SwarmOptions, placement_of
    from emulator.planning.plan import DevicePlan, LinkPlan

    worker = DevicePlan("worker-3", "worker", 3, "phones", 0.2, 1 << 30, LinkPlan(), 1)
    options = SwarmOptions(placement={"phones": ("node.labels.site==edge", "spread=node.labels.rack"), "worker-3": ("node.hostname!=ps",),
                                      "worker": ("node.platform.os==linux",)})
    assert placement_of(worker, options) == (["node.hostname!=ps", "node.labels.site==edge", "node.platform.os==linux"],
                                             [("spread", "node.labels.rack")])
    server = DevicePlan("server", "server", -1, "server", 1.0, 1 << 30, LinkPlan(), 1)
    assert placement_of(server, options) == ([], [])
    # A plan that carries placement (the scenario field proposed in docs/SCALING.md) comes first.
    planned = types.SimpleNamespace(name="worker-0", group="boxes", role="worker", placement=("node.labels.zone==a", "spread=node.id"))
    assert placement_of(planned, SwarmOptions(placement={"boxes": ("node.labels.kind==box",)})) == (
        ["node.labels.zone==a", "node.labels.kind==box"], [("spread", "node.id")])


def test_configs_survive_swarm_templating():
    import json

    from emulator.backends.swarm.backend import _env_json

    config = {"name": "worker-0", "odd": "a {{.Node.ID}} b", "nested": {"x": [1, {"y": 2}]}}
    text = _env_json(config)
    assert "{{" not in text and json.loads(text) == config


def test_kernel_features_of_a_swarm_are_what_every_node_offers():
    from emulator.backends.swarm.backend import _combine
    from emulator.host.links import KernelFeatures

    combined = _combine([KernelFeatures(True, True, True, True), KernelFeatures(True, True, False, True, "no netem")])
    assert (combined.htb, combined.tbf, combined.netem, combined.iptables_statistic) == (True, True, False, True)
    assert combined.detail == "no netem"


def test_the_relay_carries_both_directions_and_the_ends_of_streams():
    from emulator.backends.swarm import Relay

    upstream = socket.create_server(("127.0.0.1", 0))
    relay = Relay(socket.create_server(("127.0.0.1", 0)), upstream.getsockname()[:2]).start()
    blob = os.urandom(5 << 20)  # more than the relay buffers: back-pressure both ways
    received = {}

    def echo_server():
        conn, _ = upstream.accept()
        got = bytearray()
        while chunk := conn.recv(1 << 16):
            got += chunk
        received["server"] = bytes(got)
        conn.sendall(got[::-1])
        conn.close()

    thread = threading.Thread(target=echo_server)
    thread.start()
    try:
        device = socket.create_connection(relay.listener.getsockname()[:2])
        sender = threading.Thread(target=lambda: (device.sendall(blob), device.shutdown(socket.SHUT_WR)))
        sender.start()
        back = bytearray()
        while chunk := device.recv(1 << 16):
            back += chunk
        sender.join()
        thread.join(10)
        assert received["server"] == blob and bytes(back) == blob[::-1]
        assert relay.connections == 1
    finally:
        relay.close()
        upstream.close()


def test_agent_messages_round_trip_and_need_the_token():
    from emulator.backends.swarm import agent
    from emulator.runtime import protocol

    a, b = socket.socketpair()
    token = os.urandom(16)
    agent.send_message(a, token, {"id": 3, "op": "put", "args": {"name": "x"}}, b"\n\x00payload")
    assert agent.recv_message(b, token) == ({"id": 3, "op": "put", "args": {"name": "x"}}, b"\n\x00payload")
    agent.send_message(a, os.urandom(16), {"id": 4})
    with pytest.raises(protocol.ProtocolError, match="bad_token"):
        agent.recv_message(b, token)


def test_the_agent_runs_as_its_module_without_the_controller():
    """The agent's tasks run ``python -m MODULE``; the node imports no plan, scenario, numpy or pydantic."""
    import importlib.util

    from emulator.backends.swarm import agent

    assert importlib.util.find_spec(agent.MODULE).origin == agent.__file__
    probe = "import sys, emulator.backends.swarm.agent; print(' '.join(m for m in ('emulator.planning.plan', 'emulator.planning.scenario', 'numpy', 'pydantic') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_agent_resolves_node_paths_inside_the_node_root(tmp_path):
    from emulator.backends.swarm import agent

    root = tmp_path / "root"
    (root / "run" / "docker" / "netns").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("/run")  # absolute: must stay inside the root
    (root / "run" / "docker" / "link").symlink_to("netns")
    assert agent.resolve(str(root), "/var/run/docker/netns") == str(root / "run" / "docker" / "netns")
    assert agent.resolve(str(root), "/var/run/docker/link/../netns") == str(root / "run" / "docker" / "netns")
    assert agent.resolve(str(root), "/../../etc") == str(root / "etc")


def test_agent_reads_a_process_tree_its_interfaces_and_memory():
    from emulator.host import procstats
    from emulator.backends.swarm import agent

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.2)
        assert child.pid in agent.process_tree("/proc", os.getpid())
        assert procstats.memory(os.getpid(), "/proc")["pss_bytes"] > 0
        lo = agent.interface_bytes("/proc", os.getpid(), "lo")
        assert lo is not None and lo[0] >= 0
        assert agent.interface_bytes("/proc", os.getpid(), "no-such-if") is None
    finally:
        child.kill()
        child.wait()


# -- a single-node swarm ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def swarm(docker_client):
    """A swarm manager on the local engine: made here when none is active, left at the end."""
    state = docker_client.info()["Swarm"]
    made = False
    had_gwbridge = bool(docker_client.networks.list(names=["docker_gwbridge"]))
    if state.get("LocalNodeState") == "inactive":
        docker_client.swarm.init(advertise_addr="127.0.0.1", listen_addr="127.0.0.1:2377", default_addr_pool=[SWARM_POOL], subnet_size=24)
        made = True
    elif not state.get("ControlAvailable"):
        pytest.skip(f"this engine is in a swarm ({state.get('LocalNodeState')}) but not a manager")
    try:
        yield docker_client
    finally:
        if made:
            docker_client.swarm.leave(force=True)
            if not had_gwbridge:
                for network in docker_client.networks.list(names=["docker_gwbridge"]):
                    try:
                        network.remove()
                    except Exception:  # noqa: BLE001 - a container of someone else's still uses it
                        pass


def labelled(docker_client, run: Path | str) -> tuple[list, list, list]:
    """A run's services, networks and containers (only this run's: the engine may be shared)."""
    label = f"edge-emulator.run={Path(run).name}"
    return ([s.name for s in docker_client.services.list(filters={"label": label})],
            [n.name for n in docker_client.networks.list(filters={"label": label})],
            [c.name for c in docker_client.containers.list(all=True, filters={"label": label})])


def node_files(run: Path | str) -> bool:
    """Whether the run's files are on this node."""
    return (Path("/var/lib/edge-emulator/swarm") / Path(run).name).exists()


@pytest.mark.docker
@pytest.mark.slow
def test_quickstart_on_swarm_matches_docker(swarm, runtime_image, tmp_path):
    from emulator.planning.plan import make_plan
    from emulator.planning.loader import load_scenario

    runs = {}
    for backend in ("swarm", "docker"):
        started = time.monotonic()
        summary, run = run_scenario(SCENARIOS / "quickstart.yaml", tmp_path / backend, backend=backend, overrides=QUICK)
        runs[backend] = (summary, run)
        print(f"\n{backend}: {time.monotonic() - started:.0f}s, accuracy {summary['final_accuracy']:.3f}, "
              f"payload {summary['ingress_payload_bytes']:,} B, wire {summary['ingress_wire_bytes']:,} B")
    (swarm_summary, swarm_run), (docker_summary, docker_run) = runs["swarm"], runs["docker"]
    scenario, _ = load_scenario(SCENARIOS / "quickstart.yaml", QUICK)
    assert (swarm_run / "plan.json").read_text() == (docker_run / "plan.json").read_text() == make_plan(scenario).dumps()
    for summary in (swarm_summary, docker_summary):
        assert summary["status"] == "completed" and summary["updates_applied"] == 300 and summary["final_version"] == 300
        assert summary["final_accuracy"] > 0.5  # ten classes: chance is 0.1
    assert swarm_summary["backend"] == "swarm"
    # Asynchronous training is not deterministic (arrival order); 300 updates in, both are near their plateau.
    assert abs(swarm_summary["final_accuracy"] - docker_summary["final_accuracy"]) < 0.25
    # The same compressor at the same model size: payload per update within 10% of docker's.
    per_update = {b: s["ingress_payload_bytes"] / s["updates_applied"] for b, (s, _) in runs.items()}
    assert per_update["swarm"] == pytest.approx(per_update["docker"], rel=0.10)
    payload, wire = swarm_summary["ingress_payload_bytes"], swarm_summary["ingress_wire_bytes"]
    assert payload < wire < 1.6 * payload  # the server's interface, read on its node by the agent
    stats = read_jsonl(swarm_run / "stats.jsonl")
    assert {r["device"] for r in stats} >= {"server", "evaluator", "worker-0"} and all(r["pss_bytes"] > 0 for r in stats)
    assert (swarm_run / "logs" / "agents.log").exists()


@pytest.mark.docker
@pytest.mark.slow
def test_a_users_own_workload_is_shipped_to_the_nodes(swarm, runtime_image, tmp_path):
    """examples/own_workload on Swarm: the user's model and compressor reach the node (shipped beside
    the shards, mounted read-only at /workload), no image is rebuilt for them, and it trains."""
    example = ROOT / "examples" / "own_workload"
    summary, run = run_scenario(example / "scenario.yaml", tmp_path, backend="swarm", check_fidelity=False,
                                overrides=("method={name: sign_topk.py:SignTopK, c: 0.05, error_feedback: true}",))
    assert summary["status"] == "completed" and summary["final_accuracy"] > 0.5  # four activities: chance 0.25
    assert summary["method"] == "sign_topk.py:SignTopK"
    copies = {f["role"]: f["copy"] for f in read_json(run / "workload.json")["files"] if "copy" in f}
    assert copies == {"loader": "workload/activity.py", "model": "workload/model.py", "compressor": "workload/sign_topk.py"}
    log = (run / "logs" / "worker-0.log").read_text()
    assert "Traceback" not in log


@pytest.mark.docker
@pytest.mark.slow
def test_fedavg_rounds_with_compressed_deltas_run_on_swarm(swarm, runtime_image, tmp_path):
    """A federated method on Swarm: FedAvg rounds of 3 sampled clients, 10 local steps each, top-k
    deltas with error feedback up and delta pulls down; rounds traced and summed up as on the other
    backends, the server's traffic read on its node."""
    method = ("{name: topk, c: 0.1, error_feedback: true, rule: plain, pull: delta, local: {steps: 10}, "
              "aggregation: {name: fedavg, sample: 3, deadline: 20s}}")
    summary, run = run_scenario(SCENARIOS / "quickstart.yaml", tmp_path, backend="swarm", check_fidelity=False,
                                overrides=[f"method={method}", "training.max_updates=8", "training.learning_rate=0.05", *QUICK[:2]])
    assert summary["status"] == "completed" and summary["backend"] == "swarm" and summary["updates_applied"] == 8
    assert summary["final_accuracy"] > 0.3  # ten classes: well above chance after a few rounds of local steps
    applied = [r for r in read_jsonl(run / "rounds.jsonl") if r["applied"]]
    assert [r["version"] for r in applied][:8] == list(range(1, 9))
    assert all(r["participants"] == 3 for r in applied if r["dropped"] == 0)
    assert summary["rounds"]["up_bytes_per_round"] > 0 and summary["rounds"]["down_bytes_per_round"] > 0
    assert 0 < summary["ingress_payload_bytes"] < summary["ingress_wire_bytes"]


@pytest.mark.docker
@pytest.mark.slow
def test_links_and_cpu_quotas_measure_as_configured_on_swarm(swarm, runtime_image, tmp_path):
    summary, run = run_scenario(TEST_SCENARIOS / "docker-shaping.yaml", tmp_path, backend="swarm")
    assert summary["status"] == "completed"
    devices = read_json(run / "fidelity.json")["devices"]
    for name in ("worker-0", "worker-1"):
        for prop in ("uplink_bps", "downlink_bps"):
            row = devices[name][prop]
            # Uplink on the task's eth0, downlink on its veth peer in the overlay's namespace.
            assert abs(row["measured"] - row["configured"]) <= 0.10 * row["configured"], (name, prop, row)
        assert devices[name]["cpu_quota"]["measured"] == pytest.approx(devices[name]["cpu_quota"]["configured"])
        share = devices[name]["cpu_share"]
        assert 0.4 * share["configured"] <= share["measured"] <= 1.1 * share["configured"], (name, share)
    assert devices["worker-0"]["rtt_s"]["measured"] == pytest.approx(0.040, abs=0.008)
    for name in ("server", "evaluator"):
        assert devices[name]["cpu_quota"]["ok"], devices[name]
    mechanisms = read_json(run / "mechanisms.json")["worker-1"]
    assert mechanisms["loss"] in ("tc-netem", "iptables-statistic")
    assert mechanisms["delay"] in ("tc-netem", "transport-delay")


def _watch_worker(docker_client, found: dict, stop: threading.Event) -> None:
    while not stop.is_set() and not found:
        for container in docker_client.containers.list(filters={"label": [LABEL, "edge-emulator.device=worker-0", "edge-emulator.swarm=device"]}):
            found.update(container.attrs)
            network = docker_client.networks.get(next(iter(container.attrs["NetworkSettings"]["Networks"])))
            found["_network"] = network.attrs
            return
        time.sleep(0.5)


@pytest.mark.docker
@pytest.mark.slow
def test_faults_on_swarm_tasks_are_applied_and_recorded(swarm, runtime_image, tmp_path):
    found: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_worker, args=(swarm, found, stop), daemon=True)
    watcher.start()
    try:
        summary, run = run_scenario(TEST_SCENARIOS / "docker-faults.yaml", tmp_path, backend="swarm")
    finally:
        stop.set()
        watcher.join()
    # A kill goes through the node's agent; a restart is a new task (a forced service update).
    assert_scheduled_faults(summary, run, restart_within_s=3.0)
    assert_hardened(found)
    assert not found["HostConfig"].get("NanoCpus")
    assert found["_network"]["Driver"] == "overlay" and found["_network"]["Attachable"] is True
    assert labelled(swarm, run) == ([], [], []) and not node_files(run)  # after a pause, a partition and CPU changes too


@pytest.mark.docker
@pytest.mark.slow
def test_sigkill_then_clean_leaves_nothing_on_swarm(swarm, runtime_image, tmp_path):
    out = tmp_path / "runs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "emulator.cli", "run", str(TEST_SCENARIOS / "docker-faults.yaml"), "--backend", "swarm",
         "--out", str(out), "--run-id", "swarm-abort", "--no-fidelity", "--set", "training.duration=120s", "--quiet"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    run = out / "swarm-abort"
    deadline = time.monotonic() + 300
    while not any(e.get("kind") == "training_started" for e in read_jsonl(run / "events.jsonl")):
        if proc.poll() is not None:
            pytest.fail(f"controller exited early: {proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("training never started")
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    services, networks, containers = labelled(swarm, run)
    assert services and networks and containers and node_files(run), "a killed controller leaves its run behind"
    # This run only: other runs may share the engine (the run-wide form is the same code without a filter).
    done = subprocess.run([sys.executable, "-m", "emulator.cli", "clean", "--run", "swarm-abort"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "service emu-swarm-abort-worker-0" in done.stdout and "network emu-swarm-abort" in done.stdout
    assert "files of swarm-abort on 1 node(s)" in done.stdout
    assert labelled(swarm, run) == ([], [], []) and not node_files(run)


@pytest.mark.docker
@pytest.mark.slow
def test_images_on_one_node_move_nothing(swarm, runtime_image):
    from emulator.host import images
    from emulator.backends.base import BackendUnavailable
    from emulator.backends.swarm import SwarmOptions, distribute_images, ensure_agent_image

    runtime_image = images.ensure_runtime_image(swarm, progress=lambda line: None)  # the code may have changed since the session began
    agent = ensure_agent_image(swarm, runtime_image)
    assert agent.startswith("edge-emulator/agent:") and ensure_agent_image(swarm, runtime_image) == agent
    nodes = swarm.api.nodes()
    assert distribute_images(swarm, [runtime_image, agent], nodes, SwarmOptions()) == {n["ID"]: "local" for n in nodes}
    # A node that is not this one needs a registry or its Docker API; its API here is this very daemon.
    other = {"ID": "othernode", "Description": {"Hostname": "node-b"}}
    with pytest.raises(BackendUnavailable, match="node-b .* cannot get the images"):
        distribute_images(swarm, [runtime_image], [other], SwarmOptions())
    socket_url = "unix:///var/run/docker.sock"
    assert distribute_images(swarm, [runtime_image, agent], [other], SwarmOptions(node_docker={"node-b": socket_url})) == {"othernode": "present"}
    assert distribute_images(swarm, [runtime_image], [other], SwarmOptions(registry="registry.lab:5000")) == {"othernode": "registry"}


# -- several nodes on one machine ---------------------------------------------------------------
#
# Each extra "node" is a Docker daemon in network, mount and UTS namespaces of its own: its own
# data root and /run (so its socket, exec root and netns files sit where a real node has them),
# one veth pair between the nodes as the underlay (198.19.255.252/30), vxlan over it. The
# controller stays in the host's namespaces and talks to the first node, the manager.

UNDERLAY = ("198.19.255.253", "198.19.255.254")
NODE_POOL = "198.19.128.0/18"  # the extra daemons' local networks (docker_gwbridge)
MULTINODE_SWARM_POOL = "198.19.64.0/18"
NODES_DIR = Path("/var/lib/edge-emulator-test-nodes")


class LocalNodes:
    """Two Docker daemons on this machine joined into one swarm (n1 the manager)."""

    def __init__(self, names=("emu-n1", "emu-n2")):
        self.names = names
        self.procs: dict[str, subprocess.Popen] = {}

    def sock(self, name: str) -> str:
        return f"unix://{NODES_DIR}/{name}.sock"

    def client(self, name: str):
        import docker

        return docker.DockerClient(base_url=self.sock(name), timeout=600)

    def _sh(self, *argv, check=True):
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done

    def start(self) -> None:
        NODES_DIR.mkdir(parents=True, exist_ok=True)
        for name in self.names:
            self._sh("ip", "netns", "add", name)
            self._sh("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        a, b = self.names
        self._sh("ip", "link", "add", "emu-n-veth", "netns", a, "type", "veth", "peer", "name", "emu-n-veth", "netns", b)
        for name, address in zip(self.names, UNDERLAY):
            self._sh("ip", "netns", "exec", name, "ip", "addr", "add", f"{address}/30", "dev", "emu-n-veth")
            self._sh("ip", "netns", "exec", name, "ip", "link", "set", "emu-n-veth", "up")
        for name in self.names:
            root = NODES_DIR / name
            (root / "docker").mkdir(parents=True, exist_ok=True)
            script = (f"hostname {name} && mount -t tmpfs tmpfs /run && mount --bind {root}/docker /var/lib/docker && "
                      f"exec dockerd -H unix:///var/run/docker.sock -H {self.sock(name)} --bridge=none --iptables=true "
                      f"--default-address-pool base={NODE_POOL},size=24")
            log = open(NODES_DIR / f"{name}.log", "ab")
            self.procs[name] = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{name}", "unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", script],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        for name in self.names:
            while True:
                try:
                    self.client(name).ping()
                    break
                except Exception:  # noqa: BLE001 - still starting
                    if self.procs[name].poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"dockerd {name} did not start: {(NODES_DIR / f'{name}.log').read_text()[-2000:]}")
                    time.sleep(0.5)
        manager, worker = (self.client(n) for n in self.names)
        manager.swarm.init(advertise_addr=UNDERLAY[0], listen_addr=f"{UNDERLAY[0]}:2377", default_addr_pool=[MULTINODE_SWARM_POOL], subnet_size=24)
        token = manager.swarm.attrs["JoinTokens"]["Worker"]
        worker.swarm.join(remote_addrs=[f"{UNDERLAY[0]}:2377"], join_token=token, advertise_addr=UNDERLAY[1], listen_addr=f"{UNDERLAY[1]}:2377")

    def load(self, name: str, source, refs: list[str]) -> None:
        """Copy images from ``source`` (a client) into node ``name`` (what a registry would do)."""
        response = source.api._get(source.api._url("/images/get"), params={"names": refs}, stream=True)
        source.api._raise_for_status(response)
        for event in self.client(name).api.load_image(response.iter_content(1 << 20)):
            assert "error" not in event, event

    def stop(self) -> None:
        for name in reversed(self.names):
            try:
                self.client(name).swarm.leave(force=True)
            except Exception:  # noqa: BLE001 - not started, or already out
                pass
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for name in self.names:
            self._sh("ip", "netns", "del", name, check=False)
        subprocess.run(["rm", "-rf", str(NODES_DIR)], check=False)


def _multinode_blocker() -> str | None:
    """Why two daemons cannot run here, or None."""
    import shutil as _shutil

    if os.geteuid() != 0:
        return "needs root"
    for tool in ("dockerd", "ip", "nsenter", "unshare"):
        if not _shutil.which(tool):
            return f"no {tool}"
    free = _shutil.disk_usage("/var/lib").free
    if free < 12 << 30:
        return f"needs 12 GiB free under /var/lib (two more image stores), has {free >> 30} GiB"
    if subprocess.run(["ip", "link", "add", "emu-vx-probe", "type", "vxlan", "id", "42", "dstport", "4789"], capture_output=True).returncode:
        return "the kernel has no vxlan"
    subprocess.run(["ip", "link", "del", "emu-vx-probe"], capture_output=True)
    return None


@pytest.mark.docker
@pytest.mark.slow
def test_two_nodes_workers_on_one_server_on_the_other(docker_client, runtime_image, tmp_path, monkeypatch):
    """Two daemons, one swarm: the server on the manager, the workers on the other node, their
    images copied there by the backend, their links shaped by that node's agent."""
    blocker = _multinode_blocker()
    if blocker:
        pytest.skip(f"two Docker daemons cannot run here: {blocker}")
    from emulator.host import images
    from emulator.backends.swarm import ensure_agent_image

    runtime = images.ensure_runtime_image(docker_client, progress=lambda line: None)
    base = images.ensure_base(docker_client, progress=lambda line: None)
    agent = ensure_agent_image(docker_client, runtime)
    nodes = LocalNodes()
    try:
        nodes.start()
        started = time.monotonic()
        nodes.load("emu-n1", docker_client, [base, runtime, agent])  # the manager has what this machine built
        print(f"\nimages onto the manager: {time.monotonic() - started:.0f}s")
        monkeypatch.setenv("DOCKER_HOST", nodes.sock("emu-n1"))
        monkeypatch.setenv("EMULATE_SWARM_NODE_DOCKER", f'{{"emu-n2": "{nodes.sock("emu-n2")}"}}')
        monkeypatch.setenv("EMULATE_SWARM_PLACEMENT", '{"worker": ["node.hostname==emu-n2"], "server": ["node.hostname==emu-n1"], '
                                                      '"evaluator": ["node.hostname==emu-n1"]}')
        started = time.monotonic()
        summary, run = run_scenario(TEST_SCENARIOS / "docker-shaping.yaml", tmp_path, backend="swarm")
        print(f"run on two nodes (images to emu-n2 included): {time.monotonic() - started:.0f}s")
        assert summary["status"] == "completed" and summary["updates_applied"] == 30
        devices = read_json(run / "fidelity.json")["devices"]
        for name in ("worker-0", "worker-1"):
            for prop in ("uplink_bps", "downlink_bps"):
                row = devices[name][prop]
                assert abs(row["measured"] - row["configured"]) <= 0.10 * row["configured"], (name, prop, row)
            assert devices[name]["cpu_quota"]["ok"]
        assert devices["worker-0"]["rtt_s"]["measured"] == pytest.approx(0.040, abs=0.008)
        placement = read_json(run / "placement.json")
        assert placement == {"server": "emu-n1", "evaluator": "emu-n1", "worker-0": "emu-n2", "worker-1": "emu-n2"}
        assert _has(nodes.client("emu-n2"), runtime) and _has(nodes.client("emu-n2"), agent), "images were copied to the worker node"
        manager = nodes.client("emu-n1")
        assert manager.services.list(filters={"label": LABEL}) == [] and manager.networks.list(filters={"label": LABEL}) == []
    finally:
        nodes.stop()


def _has(client, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except Exception:  # noqa: BLE001
        return False
