"""The Swarm backend: the Docker backend's devices spread over the nodes of a Docker swarm.

The controller talks to a swarm manager (the local daemon, or ``DOCKER_HOST``; the controller
must run on a node of the swarm, as root). A run gets:

* one **overlay network**, internal and attachable, its subnet in 198.18.0.0/15, sized for the
  run (optionally encrypted: ``EMULATE_SWARM_ENCRYPT=1``);
* one **service per device** (replicas 1, restart policy none, ``endpoint_mode: dnsrr``): each
  device has its own CPU quota, memory limit, configuration and DNS name, and is killed and
  restarted on its own, which a replicated service (one spec for all its tasks) cannot do.
  The service reserves no CPU by default and sets no CPU limit: the quota is a container's cfs
  quota, set live by the node's agent (a NanoCPUs limit could only change through
  ``service update``, which replaces the task). Restarting a crashed device is a forced
  ``service update`` with its new configuration (a new task);
* one **agent per node** (a global service, :mod:`.agent`, reached through :mod:`.hub`) that
  shapes links with :mod:`emulator.host.links`, sets and reads back CPU quotas, kills, pauses and
  resumes containers, samples counters, and keeps the run's data shards on its node;
* one **anchor**: a plain, idle container attached to the overlay on the controller's node. The
  controller opens sockets inside the anchor's network namespace: the agents' control port,
  and a relay (:mod:`.relay`) that carries the devices' trace connections to the collector,
  which listens on the controller's loopback. Devices reach the controller over the overlay,
  from any node, and the overlay stays internal.

Images reach the nodes as :mod:`.images` says. Everything carries the ``edge-emulator`` labels
with the run id, and :func:`.cleanup.remove_swarm_labelled` removes it (``emulate clean``),
files on every node included.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from emulator.host import images, links
from emulator.planning.plan import DevicePlan, LinkPlan
from emulator.backends.base import Backend, BackendUnavailable, Endpoints, RunContext
from emulator.runtime.config import DeviceConfig
from emulator.backends.docker import (WORKLOAD_MOUNT, CHECKPOINT_MOUNT, CPU_PERIOD_US, DATA_MOUNT, DEVICE_LABEL, DEVICE_UID, LABEL, MODULES, RUN_LABEL,
                      SERVER_PORT, START_THREADS, answering_client, client)
from emulator.backends.subnets import create_network
from emulator.host.owner import Owner
from emulator.backends.swarm import agent as agent_wire
from emulator.backends.swarm.cleanup import remove_swarm_labelled
from emulator.backends.swarm.hub import AgentError, AgentHub
from emulator.backends.swarm.images import distribute_images, ensure_agent_image, push_images
from emulator.backends.swarm.manager import ALIVE_STATES, FAILED_STATES, ROLE_LABEL, is_manager
from emulator.backends.swarm.options import SwarmOptions, placement_of
from emulator.backends.swarm.relay import Relay, listen_in_netns

AGENT_PORT = 7101
STOP_GRACE_NS = 3_000_000_000
TASK_TIMEOUT_S = 180.0
AGENT_TIMEOUT_S = 120.0


@dataclass
class TaskRef:
    """Where a device's current task runs."""

    task: str
    node: str
    container: str
    state: str


def _combine(features: list[links.KernelFeatures]) -> links.KernelFeatures:
    """What every node offers: the mechanism a device gets must not depend on where it lands."""
    return links.KernelFeatures(all(f.htb for f in features), all(f.tbf for f in features), all(f.netem for f in features),
                                all(f.iptables_statistic for f in features), "; ".join(sorted({f.detail for f in features if f.detail})))


def _env_json(config: dict) -> str:
    """The config for EMU_CONFIG. Swarm expands Go templates in environment values; "{{" can
    only occur inside JSON strings, where an escaped brace means the same."""
    return json.dumps(config, separators=(",", ":")).replace("{{", "{\\u007b")


def _service_name(run_id: str, device: str) -> str:
    name = f"emu-{run_id}-{device}"
    if len(name) <= 63:
        return name
    return f"emu-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}-{device}"[:63]


class SwarmBackend(Backend):
    name = "swarm"
    clean_rank = 0  # first: its services' containers and networks are labelled too, and Swarm owns them
    cpu_limited_by_host = False  # devices spread over the swarm's nodes

    @classmethod
    def remove_leftovers(cls, run_id, removes, say):
        removed = remove_swarm_labelled(
            run_id, say=say, keep=lambda kind, name, labels: not removes(f"{kind} {name}", labels.get(RUN_LABEL, ""), Owner.from_labels(labels)))
        return removed, {}

    def __init__(self, say=None, image: str | None = None, options: SwarmOptions | None = None):
        super().__init__(say)
        self.docker = client()
        self.image = image
        self.options = options or SwarmOptions.from_env()
        self.agent_image: str | None = None
        self.ctx: RunContext | None = None
        self.devices: dict[str, DevicePlan] = {}
        self.network_id = ""
        self.network_name = ""
        self.anchor = None
        self.anchor_ip = ""
        self.anchor_pid = 0
        self.agent_token = b""
        self.agent_service: str | None = None
        self.hub: AgentHub | None = None
        self.relays: dict[int, Relay] = {}
        self.features: links.KernelFeatures | None = None
        self.nodes: list[dict] = []
        self.services: dict[str, str] = {}  # device -> service id
        self.tasks: dict[str, TaskRef] = {}
        self.image_transfer: dict[str, str] = {}
        self._force: dict[str, int] = {}
        self._lock = threading.Lock()
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None

    @classmethod
    def available(cls) -> tuple[bool, str]:
        docker_client, why = answering_client()
        if docker_client is None:
            return False, why
        ok, why = is_manager(docker_client)
        if not ok:
            return False, why
        try:
            SwarmOptions.from_env()
        except BackendUnavailable as exc:
            return False, str(exc)
        if os.geteuid() != 0:
            return False, "the controller opens sockets in the run network's namespace on this node, which needs root"
        return True, ""

    # -- run set-up ----------------------------------------------------------------------

    def _ready_nodes(self) -> list[dict]:
        return [n for n in self.docker.api.nodes() if n["Status"]["State"] == "ready" and n["Spec"].get("Availability") == "active"]

    def _labels(self, role: str, device: str | None = None) -> dict:
        labels = {LABEL: "1", RUN_LABEL: self.ctx.run_id, ROLE_LABEL: role, **self.owner.labels()}
        if device is not None:
            labels[DEVICE_LABEL] = device
        return labels

    def prepare(self, ctx, devices):
        self.ctx = ctx
        self.owner = Owner.current()  # on every service, network and anchor: clean tells a killed run's from a live one's
        self.devices = {d.name: d for d in devices}
        ok, why = is_manager(self.docker)
        if not ok:
            raise BackendUnavailable(why)
        self.nodes = self._ready_nodes()
        if self.image is None:
            self.image = images.ensure_runtime_image(self.docker, progress=self.say)
        self.agent_image = ensure_agent_image(self.docker, self.image, self.say)
        if self.options.registry:
            self.image, self.agent_image = push_images(self.docker, self.options.registry, self.say)
        self.image_transfer = distribute_images(self.docker, [self.image, self.agent_image], self.nodes, self.options, self.say)
        (Path(ctx.run_dir) / "logs").mkdir(exist_ok=True)
        self._create_network(len(devices))
        self._start_anchor()
        self.agent_token = secrets.token_bytes(16)
        listener = listen_in_netns(f"/proc/{self.anchor_pid}/ns/net", ("0.0.0.0", AGENT_PORT))
        self.hub = AgentHub(self.agent_token, listener, on_hello=self._welcome_agent).start()
        self._create_agents()
        try:
            self.hub.wait_for([n["ID"] for n in self.nodes], AGENT_TIMEOUT_S)
        except AgentError as exc:
            raise BackendUnavailable(f"{exc}{self._agent_failures()}") from None
        self.features = _combine([links.KernelFeatures(**self.hub.hellos[n["ID"]]["features"]) for n in self.nodes])
        self._watcher = threading.Thread(target=self._watch, name="swarm-tasks", daemon=True)
        self._watcher.start()
        servers = [d.name for d in devices if d.role == "server"]  # each reached by its name on the overlay
        shards = {} if len(servers) == 1 else {name: (("0.0.0.0", SERVER_PORT), (name, SERVER_PORT)) for name in servers}
        return Endpoints("127.0.0.1", self.anchor_ip, ("0.0.0.0", SERVER_PORT), (servers[0], SERVER_PORT), DATA_MOUNT,
                         CHECKPOINT_MOUNT, WORKLOAD_MOUNT, shards)

    def _create_network(self, devices: int) -> None:
        import docker.types

        self.network_name = f"emu-{self.ctx.run_id}"

        def make(subnet):
            ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet), gateway=str(subnet.network_address + 1))])
            return self.docker.networks.create(
                self.network_name, driver="overlay", scope="swarm", internal=True, attachable=True, ipam=ipam,
                options={"encrypted": ""} if self.options.encrypted else None, labels=self._labels("network"),
            )

        network, _ = create_network(self.docker, devices + 2 * len(self.nodes) + 8, make)
        self.network_id = network.id

    def _start_anchor(self) -> None:
        """An idle container on this node, on the overlay: the controller's address there."""
        self.anchor = self.docker.containers.run(
            self.image, ["sleep", "infinity"], name=f"emu-{self.ctx.run_id}-anchor", detach=True, init=True,
            network=self.network_name, user=f"{DEVICE_UID}:{DEVICE_UID}", read_only=True, cap_drop=["ALL"],
            security_opt=["no-new-privileges"], mem_limit="32m", pids_limit=16, labels=self._labels("anchor"),
        )
        self.anchor.reload()
        self.anchor_pid = self.anchor.attrs["State"]["Pid"]
        self.anchor_ip = self.anchor.attrs["NetworkSettings"]["Networks"][self.network_name]["IPAddress"]
        try:
            own = self.anchor.id in Path(f"/proc/{self.anchor_pid}/cgroup").read_text()
        except OSError:
            own = False
        if not own:
            raise BackendUnavailable("the controller must run on a node of the swarm, with DOCKER_HOST its own daemon: "
                                     "it relays the devices' traces from the run network's namespace on this machine")

    def _create_agents(self) -> None:
        import docker.types as T

        env = {"EMU_AGENT_CONTROLLER": f"{self.anchor_ip}:{AGENT_PORT}", "EMU_AGENT_TOKEN": self.agent_token.hex(),
               "EMU_AGENT_NODE": "{{.Node.ID}}", "EMU_AGENT_HOSTNAME": "{{.Node.Hostname}}", "EMU_AGENT_RUN": self.ctx.run_id,
               "EMU_AGENT_ROOT": self.options.node_root, "PYTHONUNBUFFERED": "1"}
        spec = T.ContainerSpec(
            self.agent_image, command=["python", "-m", agent_wire.MODULE], env=env, user="0:0", init=True,
            labels=self._labels("agent"), read_only=True, cap_add=["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"],
            mounts=[T.Mount("/var/run/docker.sock", "/var/run/docker.sock", type="bind"),
                    T.Mount(agent_wire.HOST_PROC, "/proc", type="bind", read_only=True),
                    T.Mount("/tmp", None, type="tmpfs", tmpfs_size=16 << 20)],
            stop_grace_period=STOP_GRACE_NS,
        )
        template = T.TaskTemplate(spec, restart_policy=T.RestartPolicy("on-failure", delay=1_000_000_000, max_attempts=3),
                                  resources=T.Resources(mem_limit=256 << 20),
                                  networks=[T.NetworkAttachmentConfig(self.network_id, aliases=["agent"])])
        self.agent_service = self.docker.api.create_service(
            template, name=_service_name(self.ctx.run_id, "agent"), labels=self._labels("agent"), mode=T.ServiceMode("global"),
            endpoint_spec=T.EndpointSpec(mode="dnsrr"))["ID"]

    def _agent_failures(self) -> str:
        try:
            tasks = self.docker.api.tasks(filters={"service": self.agent_service})
        except Exception:  # noqa: BLE001
            return ""
        errors = sorted({f"{t['Status']['State']}: {t['Status'].get('Err')}" for t in tasks if t["Status"].get("Err")})
        return f" (agent tasks: {'; '.join(errors)})" if errors else ""

    def _welcome_agent(self, node: str, hello: dict) -> None:
        """A (re)connected agent: the run's directory on its node, the data shards and the workload in it."""
        self.hub.call(node, "prepare")
        for folder, source in (("data", self.ctx.data_dir), ("workload", self.ctx.workload_dir)):
            for path in sorted(Path(source).iterdir()) if source else ():
                if path.is_file():
                    self._put(node, path, folder)

    def _put(self, node: str, path: Path, folder: str) -> None:
        """One file into ``folder`` of the run's directory on ``node``, in chunks."""
        size = path.stat().st_size
        with open(path, "rb") as fh:
            offset = 0
            while True:
                chunk = fh.read(agent_wire.CHUNK_BYTES)
                last = offset + len(chunk) >= size
                self.hub.call(node, "put", chunk, name=path.name, offset=offset, last=last, folder=folder, timeout=300)
                offset += len(chunk)
                if last:
                    break

    def mechanisms(self, device):
        features = self.features or links.detect()
        return {"cpus": "docker-cpu-quota by the node's agent (cgroup cfs)", **links.plan_mechanisms(features, device.link)}

    # -- devices -------------------------------------------------------------------------

    def _ensure_relay(self, config: DeviceConfig) -> None:
        port = config.collector[1]
        with self._lock:
            if port in self.relays:
                return
            listener = listen_in_netns(f"/proc/{self.anchor_pid}/ns/net", ("0.0.0.0", port))
            self.relays[port] = Relay(listener, ("127.0.0.1", port)).start()

    def _template(self, device: DevicePlan, config: DeviceConfig, pin_node: str | None = None):
        import docker.types as T

        node_dir = f"{self.options.node_root}/{self.ctx.run_id}/{{{{.Node.ID}}}}"
        mounts = [T.Mount(DATA_MOUNT, f"{node_dir}/data", type="bind", read_only=True),
                  T.Mount(WORKLOAD_MOUNT, f"{node_dir}/workload", type="bind", read_only=True),
                  T.Mount("/tmp", None, type="tmpfs", tmpfs_size=256 << 20)]
        if device.role == "server":
            mounts.append(T.Mount(CHECKPOINT_MOUNT, f"{node_dir}/checkpoint", type="bind"))
        env = {"EMU_CONFIG": _env_json(config.to_json()), "OMP_NUM_THREADS": str(max(1, int(device.cpus + 0.999)))}
        spec = T.ContainerSpec(
            self.image, command=["python", "-m", f"emulator.runtime.{MODULES[device.role]}"], env=env,
            user=f"{DEVICE_UID}:{DEVICE_UID}", labels=self._labels("device", device.name), mounts=mounts, read_only=True,
            cap_drop=["ALL"], init=True, stop_grace_period=STOP_GRACE_NS,
        )
        resources = T.Resources(mem_limit=device.memory_bytes,
                                cpu_reservation=int(device.cpus * 1e9) if self.options.reserve_cpus else None)
        resources.setdefault("Limits", {})["Pids"] = 512
        constraints, spread = placement_of(device, self.options)
        if pin_node:
            constraints = [*constraints, f"node.id=={pin_node}"]
        placement = T.Placement(constraints=constraints or None, preferences=spread or None)
        return T.TaskTemplate(spec, resources=resources, restart_policy=T.RestartPolicy("none"), placement=placement,
                              networks=[T.NetworkAttachmentConfig(self.network_id, aliases=[device.name])],
                              force_update=self._force.get(device.name, 0))

    def _submit(self, device: DevicePlan, config: DeviceConfig) -> None:
        """Create the device's service, or replace its task (a restart) with the new config."""
        import docker.types as T

        with self._lock:
            service = self.services.get(device.name)
            previous = self.tasks.get(device.name)
        if service is None:
            created = self.docker.api.create_service(
                self._template(device, config), name=_service_name(self.ctx.run_id, device.name),
                labels=self._labels("device", device.name), endpoint_spec=T.EndpointSpec(mode="dnsrr"),
                mode=T.ServiceMode("replicated", replicas=1))
            with self._lock:
                self.services[device.name] = created["ID"]
            return
        self._force[device.name] = self._force.get(device.name, 0) + 1
        # The server keeps its node: its checkpoint is in that node's directory.
        pin = previous.node if device.role == "server" and previous else None
        current = self.docker.api.inspect_service(service)
        spec = current["Spec"]
        self.docker.api.update_service(
            service, current["Version"]["Index"], task_template=self._template(device, config, pin), name=spec["Name"],
            labels=spec.get("Labels"), mode=spec.get("Mode"), endpoint_spec=spec.get("EndpointSpec"))
        with self._lock:
            self.tasks.pop(device.name, None)

    def _current_tasks(self) -> dict[str, dict]:
        """Device -> the task its service wants running (else its newest task)."""
        by_service = {sid: name for name, sid in self.services.items()}
        best: dict[str, dict] = {}
        for task in self.docker.api.tasks(filters={"label": f"{RUN_LABEL}={self.ctx.run_id}"}):
            name = by_service.get(task.get("ServiceID"))
            if name is None:
                continue
            key = (task.get("DesiredState") == "running", task.get("Version", {}).get("Index", 0))
            old = best.get(name)
            if old is None or key > (old.get("DesiredState") == "running", old.get("Version", {}).get("Index", 0)):
                best[name] = task
        return best

    def _record(self, tasks: dict[str, dict]) -> None:
        with self._lock:
            for name, task in tasks.items():
                status = task["Status"]
                container = (status.get("ContainerStatus") or {}).get("ContainerID", "")
                state = status["State"] if task.get("DesiredState") == "running" else f"{status['State']} (shut down)"
                old = self.tasks.get(name)
                self.tasks[name] = TaskRef(task["ID"], task.get("NodeID", ""), container or (old.container if old and old.task == task["ID"] else ""), state)

    def _await_running(self, names: list[str], timeout: float = TASK_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        waiting = set(names)
        while waiting:
            tasks = self._current_tasks()
            self._record(tasks)
            for name in list(waiting):
                task = tasks.get(name)
                if task is None or task.get("DesiredState") != "running":
                    continue
                state = task["Status"]["State"]
                if state == "running" and (task["Status"].get("ContainerStatus") or {}).get("ContainerID"):
                    waiting.discard(name)
                elif state in FAILED_STATES:
                    raise RuntimeError(f"{name}: its task {state} on node {task.get('NodeID')}: {task['Status'].get('Err') or task['Status'].get('Message')}")
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not running after {timeout:g}s: {', '.join(sorted(waiting))}")
            time.sleep(0.25)

    def start(self, device, config):
        self._ensure_relay(config)
        self._submit(device, config)
        self._await_running([device.name])
        self._write_placement()

    def start_many(self, items: list[tuple[DevicePlan, DeviceConfig]]) -> None:
        """Create every service (in parallel: each is a round trip to the manager), then wait
        until every task runs."""
        for _, config in items[:1]:
            self._ensure_relay(config)
        first = [item for item in items if item[0].role == "server"]
        for item in first:
            self._submit(*item)
        with ThreadPoolExecutor(START_THREADS) as pool:
            list(pool.map(lambda item: self._submit(*item), [i for i in items if i not in first]))
        self._await_running([device.name for device, _ in items])
        self._write_placement()

    def _write_placement(self) -> None:
        """placement.json in the run directory: device -> the node its current task runs on."""
        path = Path(self.ctx.run_dir) / "placement.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.placement(), indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)

    def _watch(self) -> None:
        """Keep the task table fresh (alive() is asked many times a second)."""
        while not self._watch_stop.wait(0.5):
            try:
                self._record(self._current_tasks())
            except Exception:  # noqa: BLE001 - the manager is busy; next round
                pass

    def _task(self, device: DevicePlan) -> TaskRef:
        with self._lock:
            ref = self.tasks.get(device.name)
        if ref is None or not ref.container:
            raise RuntimeError(f"{device.name} has no running task")
        return ref

    def _agent(self, device: DevicePlan, op: str, **args):
        ref = self._task(device)
        return self.hub.call(ref.node, op, container=ref.container, **args)

    def kill(self, device):
        with self._lock:
            ref = self.tasks.get(device.name)
        if ref is None or not ref.container:
            return
        self.hub.call(ref.node, "kill", container=ref.container)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the manager knows, so alive() agrees
            tasks = self._current_tasks()
            self._record(tasks)
            task = tasks.get(device.name)
            if task is None or task.get("DesiredState") != "running" or task["Status"]["State"] not in ("running",):
                break
            time.sleep(0.1)

    def pause(self, device):
        self._agent(device, "pause")

    def resume(self, device):
        self._agent(device, "resume")

    def set_cpus(self, device, cpus):
        self._agent(device, "cpus", period_us=CPU_PERIOD_US, quota_us=max(1000, int(cpus * CPU_PERIOD_US)))

    def cpu_quota(self, device):
        info = self._agent(device, "quota")
        quota, period = info.get("quota_us") or 0, info.get("period_us") or CPU_PERIOD_US
        return quota / period if quota > 0 else None

    def set_link(self, device, link: LinkPlan):
        self._agent(device, "shape", network=self.network_id, link=link.to_json(), features=self.features.to_json())

    def partition(self, device, cut):
        self._agent(device, "partition", cut=cut)
        return True

    def alive(self, device):
        with self._lock:
            ref = self.tasks.get(device.name)
        return ref is not None and ref.state in ALIVE_STATES

    def placement(self) -> dict[str, str]:
        """Device -> the hostname of the node its current task runs on."""
        names = {n["ID"]: n["Description"]["Hostname"] for n in self.docker.api.nodes()}
        with self._lock:
            return {name: names.get(ref.node, ref.node) for name, ref in self.tasks.items()}

    # -- measurement ---------------------------------------------------------------------

    def sample(self):
        """Every node's agent samples its devices (interface bytes as the device sees them,
        CPU seconds, memory) at once."""
        if self.hub is None:
            return []
        by_node: dict[str, dict[str, str]] = {}
        with self._lock:
            for name, ref in self.tasks.items():
                if ref.container and ref.state == "running":
                    by_node.setdefault(ref.node, {})[name] = ref.container
        futures = [self.hub.request(node, "sample", containers=containers) for node, containers in by_node.items()]
        out = []
        for future in futures:
            try:
                out += future.result(10)
            except Exception:  # noqa: BLE001 - a slow or lost agent skips one sample
                continue
        return out

    def collect_logs(self) -> None:
        def fetch(item):
            name, service = item
            try:
                data = b"".join(self.docker.api.service_logs(service, stdout=True, stderr=True, follow=False))
            except Exception:  # noqa: BLE001 - already gone
                return
            with open(Path(self.ctx.run_dir) / "logs" / f"{name}.log", "ab") as fh:
                fh.write(data)

        items = list(self.services.items())
        if self.agent_service:
            items.append(("agents", self.agent_service))
        with ThreadPoolExecutor(START_THREADS) as pool:
            list(pool.map(fetch, items))

    def teardown(self):
        if self.ctx is None:
            return
        self._watch_stop.set()
        try:
            if self.services or self.agent_service:
                self.collect_logs()
        finally:
            try:
                self._remove_devices()
                if self.hub is not None:
                    futures = [self.hub.request(node, "cleanup") for node in list(self.hub.hellos)]
                    for future in futures:
                        try:
                            future.result(30)
                        except Exception:  # noqa: BLE001 - the janitor of `emulate clean` catches what is left
                            pass
            finally:
                try:
                    remove_swarm_labelled(self.ctx.run_id, self.docker, janitor=False)
                finally:
                    for relay in self.relays.values():
                        relay.close()
                    self.relays.clear()
                    if self.hub is not None:
                        self.hub.close()
                    self.services.clear()
                    self.tasks.clear()
                    self.hub = None
                    self.agent_service = None

    def _remove_devices(self) -> None:
        for service in list(self.services.values()):
            try:
                self.docker.api.remove_service(service)
            except Exception:  # noqa: BLE001 - already gone
                pass
