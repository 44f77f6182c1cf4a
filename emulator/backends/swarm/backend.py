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
* one **agent per node** (a global service, :mod:`emulator.agent`) that shapes links with
  :mod:`emulator.links`, sets and reads back CPU quotas, kills, pauses and resumes containers,
  samples counters, and keeps the run's data shards on its node;
* one **anchor**: a plain, idle container attached to the overlay on the controller's node. The
  controller opens sockets inside the anchor's network namespace: the agents' control port,
  and a relay that carries the devices' trace connections to the collector, which listens on
  the controller's loopback. Devices reach the controller over the overlay, from any node,
  and the overlay stays internal.

Images reach the nodes from a registry (``EMULATE_SWARM_REGISTRY``, filled by ``emulate
images push``) or are copied from the controller's daemon to each node's daemon
(``docker save | docker load`` through ``EMULATE_SWARM_NODE_DOCKER``); on one node nothing
moves. Everything carries the ``edge-emulator`` labels with the run id, and
:func:`remove_swarm_labelled` removes it (``emulate clean``), files on every node included.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import secrets
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import agent as agent_wire
from .. import links
from ..peerserver import PeerServer
from ..plan import DevicePlan, LinkPlan
from .base import Backend, BackendUnavailable, Endpoints, RunContext
from .docker import (CHECKPOINT_MOUNT, CPU_PERIOD_US, DATA_MOUNT, DEVICE_LABEL, DEVICE_UID, LABEL, MODULES,
                     RUN_LABEL, SERVER_PORT, START_THREADS, _free_subnet, _subnet_size, client)

ROLE_LABEL = "edge-emulator.swarm"  # device | agent | anchor | janitor
AGENT_REPO = "edge-emulator/agent"
AGENT_PACKAGES = ("pyroute2", "docker")  # pure-Python wheels the agent adds to the runtime image
AGENT_PORT = 7101
NODE_ROOT = "/var/lib/edge-emulator/swarm"  # on every node: <root>/<run>/<node id>/{data,checkpoint}
STOP_GRACE_NS = 3_000_000_000
TASK_TIMEOUT_S = 180.0
AGENT_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 60.0
ALIVE_STATES = {"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting", "running"}
FAILED_STATES = {"failed", "rejected", "orphaned", "complete", "shutdown", "remove"}
RELAY_BUFFER = 1 << 20
AGENT_DOCKERFILE = f"""\
# The swarm agent: the runtime image (same code as the devices) plus pyroute2 and the Docker SDK.
ARG BASE
FROM ${{BASE}}
LABEL edge-emulator="1" edge-emulator.role="agent"
USER root
COPY wheels/ /tmp/agent-wheels/
RUN /opt/venv/bin/python -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check /tmp/agent-wheels/*.whl \\
 && rm -rf /tmp/agent-wheels
COPY bin/ {agent_wire.SHIM_DIR}/
RUN chmod 0755 {agent_wire.SHIM_DIR}/*
"""


# -- options (no scenario field: where a run's devices go is the machine's business) -------------


@dataclass(frozen=True)
class SwarmOptions:
    registry: str | None = None  # EMULATE_SWARM_REGISTRY: host:port the nodes pull from
    encrypted: bool = False  # EMULATE_SWARM_ENCRYPT=1: IPsec on the run's overlay
    placement: dict = field(default_factory=dict)  # EMULATE_SWARM_PLACEMENT: {device, group or role: [constraint | "spread=<label>"]}
    node_docker: dict = field(default_factory=dict)  # EMULATE_SWARM_NODE_DOCKER: {node hostname or id: Docker URL}
    reserve_cpus: bool = False  # EMULATE_SWARM_RESERVE_CPUS=1: schedule by the plan's CPUs (no overcommitted node)
    node_root: str = NODE_ROOT

    @classmethod
    def from_env(cls, env=None) -> "SwarmOptions":
        env = os.environ if env is None else env

        def flag(name):
            return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")

        def mapping(name):
            raw = env.get(name, "").strip()
            if not raw:
                return {}
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise BackendUnavailable(f"{name} is not JSON: {exc}") from None
            if not isinstance(value, dict):
                raise BackendUnavailable(f"{name} must be a JSON object")
            return value

        placement = {str(k): tuple([v] if isinstance(v, str) else v) for k, v in mapping("EMULATE_SWARM_PLACEMENT").items()}
        return cls(registry=env.get("EMULATE_SWARM_REGISTRY") or None, encrypted=flag("EMULATE_SWARM_ENCRYPT"),
                   placement=placement, node_docker=mapping("EMULATE_SWARM_NODE_DOCKER"),
                   reserve_cpus=flag("EMULATE_SWARM_RESERVE_CPUS"), node_root=env.get("EMULATE_SWARM_NODE_ROOT") or NODE_ROOT)


def placement_of(device: DevicePlan, options: SwarmOptions) -> tuple[list[str], list[tuple[str, str]]]:
    """(constraints, spread preferences) for a device: the plan's ``placement`` when the
    scenario has one, then the options' entries for its name, its group and its role."""
    entries = list(getattr(device, "placement", None) or ())
    for key in dict.fromkeys((device.name, device.group, device.role)):
        entries += options.placement.get(key, ())
    constraints = [e for e in entries if not e.startswith("spread=")]
    spread = [("spread", e.split("=", 1)[1]) for e in entries if e.startswith("spread=")]
    return constraints, spread


# -- images ---------------------------------------------------------------------------------


def _agent_wheels(progress) -> Path:
    """The agent's extra wheels, the controller's own versions, downloaded once."""
    from .. import images

    pins = [f"{name}=={importlib.metadata.version(name)}" for name in AGENT_PACKAGES]
    target = images.cache_root() / "agent-wheels" / hashlib.sha256(" ".join(pins).encode()).hexdigest()[:16]
    if (target / "complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix="partial-", dir=target.parent))
    try:
        progress(f"[agent] downloading {', '.join(pins)}")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
                               "--only-binary=:all:", "-d", str(partial), *pins], capture_output=True, text=True)
        if done.returncode != 0:
            raise images.ImageBuildError(f"pip download {' '.join(pins)} failed: {done.stderr.strip()[-2000:]}")
        (partial / "complete").write_text(" ".join(pins) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        return target
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def ensure_agent_image(docker_client, runtime_tag: str, progress=lambda line: None) -> str:
    """The agent image for this runtime image (built in seconds, no network in the build)."""
    from .. import images

    wheels = _agent_wheels(progress)
    runtime_id = docker_client.images.get(runtime_tag).id
    digest = hashlib.sha256(AGENT_DOCKERFILE.encode() + agent_wire.IPTABLES_SHIM.encode() + runtime_id.encode()
                            + " ".join(sorted(p.name for p in wheels.glob("*.whl"))).encode()).hexdigest()
    tag = f"{AGENT_REPO}:{digest[:12]}"
    try:
        docker_client.images.get(tag)
        return tag
    except Exception:  # noqa: BLE001 - not built yet
        pass
    context = Path(tempfile.mkdtemp(prefix="agent-build-", dir=images.cache_root()))
    try:
        (context / "Dockerfile").write_text(AGENT_DOCKERFILE)
        (context / "wheels").mkdir()
        (context / "bin").mkdir()
        (context / "bin" / "iptables").write_text(agent_wire.IPTABLES_SHIM)
        for wheel in wheels.glob("*.whl"):
            shutil.copy2(wheel, context / "wheels" / wheel.name)
        progress(f"[agent] building {tag} on {runtime_tag}")
        images._docker_build(docker_client, context, tag, runtime_tag, progress)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    for image in docker_client.images.list(name=AGENT_REPO):
        for ref in image.tags:
            if ref != tag:
                try:
                    docker_client.images.remove(ref)
                except Exception:  # noqa: BLE001 - in use: keep it
                    pass
    images._remove_older_runtimes(docker_client, keep=runtime_tag, progress=progress)
    return tag


def push_images(docker_client, registry: str, progress=lambda line: None) -> list[str]:
    """Tag the runtime and agent images for ``registry`` and push them; returns the references."""
    from docker.errors import APIError

    from .. import images

    runtime = images.ensure_runtime_image(docker_client, progress=progress)
    refs = []
    for ref in (runtime, ensure_agent_image(docker_client, runtime, progress)):
        repo, tag = ref.rsplit(":", 1)
        target = f"{registry.rstrip('/')}/{repo}"
        docker_client.images.get(ref).tag(target, tag)
        progress(f"[push] {target}:{tag}")
        try:
            for event in docker_client.api.push(target, tag, stream=True, decode=True):
                if "error" in event:
                    raise images.ImageBuildError(f"pushing {target}:{tag}: {event['error']}")
        except APIError as exc:
            raise images.ImageBuildError(f"pushing {target}:{tag}: {exc.explanation or exc}") from None
        refs.append(f"{target}:{tag}")
    return refs


def _has_image(docker_client, ref: str) -> bool:
    try:
        docker_client.images.get(ref)
        return True
    except Exception:  # noqa: BLE001 - not there
        return False


def distribute_images(manager, refs: list[str], nodes: list[dict], options: SwarmOptions, say=lambda line: None) -> dict[str, str]:
    """Make ``refs`` present on every node: nodes pull them from the registry when one is
    configured, else each node's daemon loads them from the controller's (``docker save``
    streamed into ``docker load``, only what it lacks). The controller's own node already has
    them: on one node this moves nothing. Returns node id -> what was done."""
    import docker

    local = manager.info()["Swarm"]["NodeID"]
    done = {}
    for node in nodes:
        node_id, hostname = node["ID"], node["Description"]["Hostname"]
        if node_id == local:
            done[node_id] = "local"
            continue
        if options.registry:
            done[node_id] = "registry"
            continue
        url = options.node_docker.get(hostname) or options.node_docker.get(node_id)
        if not url:
            raise BackendUnavailable(
                f"node {hostname} ({node_id}) cannot get the images: configure a registry (EMULATE_SWARM_REGISTRY, "
                f"then `emulate images push REGISTRY`) or give its Docker API in EMULATE_SWARM_NODE_DOCKER")
        remote = docker.DockerClient(base_url=url, timeout=1800)
        try:
            missing = [ref for ref in refs if not _has_image(remote, ref)]
            if missing:
                say(f"[images] loading {', '.join(missing)} onto {hostname}")
                started = time.monotonic()
                response = manager.api._get(manager.api._url("/images/get"), params={"names": missing}, stream=True)
                manager.api._raise_for_status(response)
                for event in remote.api.load_image(response.iter_content(1 << 20)):  # streams while it loads
                    if "error" in event:
                        raise BackendUnavailable(f"node {hostname}: docker load: {event['error']}")
                missing = [ref for ref in refs if not _has_image(remote, ref)]
                if missing:
                    raise BackendUnavailable(f"node {hostname}: docker load did not produce {', '.join(missing)}")
                done[node_id] = f"loaded in {time.monotonic() - started:.1f}s"
            else:
                done[node_id] = "present"
        finally:
            remote.close()
    return done


# -- sockets in another network namespace; the relay ----------------------------------------


def listen_in_netns(netns_path: str, address: tuple[str, int]) -> socket.socket:
    """A listening TCP socket created inside the network namespace at ``netns_path`` (a short
    thread enters it; the socket stays there, usable from any thread)."""
    try:
        return links.in_netns(netns_path, lambda: socket.create_server(address, backlog=1024))
    except links.LinkError as exc:
        raise BackendUnavailable(str(exc)) from exc


class Relay:
    """Carries every connection accepted on ``listener`` to ``target`` and back, on one thread.

    The devices' trace connections arrive in the anchor's namespace (on the overlay); the
    collector listens on the controller's loopback. Each direction keeps at most
    ``RELAY_BUFFER`` bytes in flight; an end's EOF is passed on once its data is through."""

    def __init__(self, listener: socket.socket, target: tuple[str, int]):
        self.listener = listener
        self.target = target
        self.connections = 0
        self._selector = selectors.DefaultSelector()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"relay-{target[1]}", daemon=True)

    def start(self) -> "Relay":
        self.listener.setblocking(False)
        self._selector.register(self.listener, selectors.EVENT_READ, None)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)
        for key in list(self._selector.get_map().values()):
            try:
                key.fileobj.close()
            except OSError:
                pass
        self._selector.close()

    def _loop(self) -> None:
        while not self._closed.is_set():
            for key, mask in self._selector.select(timeout=0.5):
                if key.data is None:
                    self._accept()
                    continue
                end: _End = key.data
                try:
                    if mask & selectors.EVENT_WRITE:
                        self._write(end)
                    if mask & selectors.EVENT_READ and not end.closed:
                        self._read(end)
                except OSError:
                    self._close(end)

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            conn.close()
            return
        self.connections += 1
        a, b = _End(conn), _End(upstream)
        a.peer, b.peer = b, a
        for end in (a, b):
            end.sock.setblocking(False)
            self._update(end)

    def _read(self, end: "_End") -> None:
        try:
            data = end.sock.recv(65536)
        except BlockingIOError:
            return
        if data:
            end.peer.pending += data
            self._write(end.peer)
        else:
            end.eof = True
            self._write(end.peer)  # passes the EOF on once the peer's backlog is through
        self._update(end)

    def _write(self, end: "_End") -> None:
        if end.pending:
            try:
                del end.pending[:end.sock.send(end.pending)]
            except BlockingIOError:
                pass
        if not end.pending and end.peer.eof and not end.write_shut:
            end.write_shut = True
            end.sock.shutdown(socket.SHUT_WR)
        self._update(end)
        self._update(end.peer)

    def _update(self, end: "_End") -> None:
        """Read while the peer's backlog is small, write while ours is not empty, close when done."""
        if end.closed:
            return
        if end.eof and end.peer.eof and not end.pending and not end.peer.pending:
            self._close(end)
            return
        events = 0
        if not end.eof and len(end.peer.pending) < RELAY_BUFFER:
            events |= selectors.EVENT_READ
        if end.pending:
            events |= selectors.EVENT_WRITE
        if events == end.events:
            return
        if not end.events:
            self._selector.register(end.sock, events, end)
        elif not events:
            self._selector.unregister(end.sock)
        else:
            self._selector.modify(end.sock, events, end)
        end.events = events

    def _close(self, end: "_End") -> None:
        for side in (end, end.peer):
            if side.closed:
                continue
            side.closed = True
            if side.events:
                self._selector.unregister(side.sock)
                side.events = 0
            side.sock.close()


class _End:
    """One socket of a relayed connection; ``pending`` is what waits to be written to it."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.peer: _End | None = None
        self.pending = bytearray()
        self.events = 0
        self.eof = False
        self.write_shut = False
        self.closed = False


# -- the controller's end of the agents ------------------------------------------------------


class AgentError(RuntimeError):
    """An agent did not answer, or could not do what it was asked."""


class AgentHub(PeerServer):
    """Agents dial in (one per node), say hello, then answer requests by id."""

    thread_name = "agent-hub"

    def __init__(self, token: bytes, listener: socket.socket, on_hello=None):
        super().__init__(listener)
        self.token = token
        self.on_hello = on_hello or (lambda node, hello: None)
        self.hellos: dict[str, dict] = {}
        self.ready: dict[str, threading.Event] = {}
        self._pending: dict[int, Future] = {}
        self._ids = iter(range(1, 1 << 62))
        self._pool = ThreadPoolExecutor(16, thread_name_prefix="agent-call")

    def close(self) -> None:
        super().close()
        self._pool.shutdown(wait=False)

    def _serve(self, sock: socket.socket, peer=None) -> None:
        node = None
        try:
            sock.settimeout(30)
            message, _ = agent_wire.recv_message(sock, self.token)
            sock.settimeout(None)
            hello = message.get("hello") or {}
            node = str(hello.get("node", ""))
            if not node or self._closed.is_set():
                return
            with self._lock:
                old = self._peers.get(node)
                self._peers[node] = (sock, threading.Lock())
                self.hellos[node] = hello
                self.ready.setdefault(node, threading.Event()).clear()
            if old is not None:
                old[0].close()
            try:
                self._pool.submit(self._welcome, node, hello)
            except RuntimeError:  # closing
                return
            while True:
                reply, _ = agent_wire.recv_message(sock, self.token)
                with self._lock:
                    future = self._pending.pop(reply.get("id"), None)
                if future is None:
                    continue
                if "error" in reply:
                    future.set_exception(AgentError(f"agent on {self.hostname(node)}: {reply['error']}"))
                else:
                    future.set_result(reply.get("result"))
        except (OSError, agent_wire.protocol.ProtocolError):
            pass
        finally:
            with self._lock:
                if node and self._peers.get(node, (None,))[0] is sock:
                    del self._peers[node]
            sock.close()

    def _welcome(self, node: str, hello: dict) -> None:
        try:
            self.on_hello(node, hello)
            self.ready[node].set()
        except Exception as exc:  # noqa: BLE001 - recorded; wait_for reports it
            hello["welcome_error"] = f"{type(exc).__name__}: {exc}"
            self.ready[node].set()

    def hostname(self, node: str) -> str:
        return (self.hellos.get(node) or {}).get("hostname") or node

    def request(self, node: str, op: str, payload: bytes = b"", **args) -> Future:
        future: Future = Future()
        with self._lock:
            peer = self._peers.get(node)
            request_id = next(self._ids)
            if peer is not None:
                self._pending[request_id] = future
        if peer is None:
            future.set_exception(AgentError(f"no agent connected for node {self.hostname(node)}"))
            return future
        sock, lock = peer
        try:
            with lock:
                agent_wire.send_message(sock, self.token, {"id": request_id, "op": op, "args": args}, payload)
        except OSError as exc:
            with self._lock:
                self._pending.pop(request_id, None)
            future.set_exception(AgentError(f"agent on {self.hostname(node)}: {exc}"))
        return future

    def call(self, node: str, op: str, payload: bytes = b"", timeout: float = CALL_TIMEOUT_S, **args):
        future = self.request(node, op, payload, **args)
        try:
            return future.result(timeout)
        except TimeoutError:
            raise AgentError(f"agent on {self.hostname(node)}: no answer to {op} in {timeout:g}s") from None

    def wait_for(self, nodes: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for node in nodes:
            with self._lock:
                event = self.ready.setdefault(node, threading.Event())
            if not event.wait(max(0.0, deadline - time.monotonic())):
                raise AgentError(f"no agent from node {node} after {timeout:g}s")
            if "welcome_error" in self.hellos.get(node, {}):
                raise AgentError(f"agent on {self.hostname(node)}: {self.hellos[node]['welcome_error']}")


# -- the backend --------------------------------------------------------------------------------


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


def _is_manager(docker_client) -> tuple[bool, str]:
    swarm = docker_client.info().get("Swarm") or {}
    if swarm.get("LocalNodeState") != "active":
        return False, ("this Docker daemon is not in a swarm (`docker swarm init --default-addr-pool 198.19.0.0/16`, "
                       "or point DOCKER_HOST at a manager)")
    if not swarm.get("ControlAvailable"):
        return False, "this Docker daemon is a swarm worker, not a manager"
    return True, ""


class SwarmBackend(Backend):
    name = "swarm"

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
        try:
            import docker  # noqa: F401
        except ImportError:
            return False, "the docker Python package is not installed"
        try:
            docker_client = client(timeout=5)
            docker_client.ping()
        except Exception as exc:  # noqa: BLE001 - any failure means "not here"
            return False, f"no Docker daemon answers ({type(exc).__name__})"
        ok, why = _is_manager(docker_client)
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
        labels = {LABEL: "1", RUN_LABEL: self.ctx.run_id, ROLE_LABEL: role}
        if device is not None:
            labels[DEVICE_LABEL] = device
        return labels

    def prepare(self, ctx, devices):
        from .. import images

        self.ctx = ctx
        self.devices = {d.name: d for d in devices}
        ok, why = _is_manager(self.docker)
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
        server = next(d.name for d in devices if d.role == "server")
        return Endpoints("127.0.0.1", self.anchor_ip, ("0.0.0.0", SERVER_PORT), (server, SERVER_PORT), DATA_MOUNT, CHECKPOINT_MOUNT)

    def _create_network(self, devices: int) -> None:
        import docker.types

        subnet = _free_subnet(self.docker, _subnet_size(devices + 2 * len(self.nodes) + 8))
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet), gateway=str(subnet.network_address + 1))])
        self.network_name = f"emu-{self.ctx.run_id}"
        network = self.docker.networks.create(
            self.network_name, driver="overlay", scope="swarm", internal=True, attachable=True, ipam=ipam,
            options={"encrypted": ""} if self.options.encrypted else None, labels=self._labels("network"),
        )
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
            self.agent_image, command=["python", "-m", "emulator.agent"], env=env, user="0:0", init=True,
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
        """A (re)connected agent: the run's directory on its node, and the data shards in it."""
        self.hub.call(node, "prepare")
        for path in sorted(Path(self.ctx.data_dir).iterdir()):
            if not path.is_file():
                continue
            size = path.stat().st_size
            with open(path, "rb") as fh:
                offset = 0
                while True:
                    chunk = fh.read(agent_wire.CHUNK_BYTES)
                    last = offset + len(chunk) >= size
                    self.hub.call(node, "put", chunk, name=path.name, offset=offset, last=last, timeout=300)
                    offset += len(chunk)
                    if last:
                        break

    def mechanisms(self, device):
        features = self.features or links.detect()
        return {"cpus": "docker-cpu-quota by the node's agent (cgroup cfs)", **links.plan_mechanisms(features, device.link)}

    # -- devices -------------------------------------------------------------------------

    def _ensure_relay(self, config: dict) -> None:
        port = int(config["collector"][1])
        with self._lock:
            if port in self.relays:
                return
            listener = listen_in_netns(f"/proc/{self.anchor_pid}/ns/net", ("0.0.0.0", port))
            self.relays[port] = Relay(listener, ("127.0.0.1", port)).start()

    def _template(self, device: DevicePlan, config: dict, pin_node: str | None = None):
        import docker.types as T

        node_dir = f"{self.options.node_root}/{self.ctx.run_id}/{{{{.Node.ID}}}}"
        mounts = [T.Mount(DATA_MOUNT, f"{node_dir}/data", type="bind", read_only=True),
                  T.Mount("/tmp", None, type="tmpfs", tmpfs_size=256 << 20)]
        if device.role == "server":
            mounts.append(T.Mount(CHECKPOINT_MOUNT, f"{node_dir}/checkpoint", type="bind"))
        env = {"EMU_CONFIG": _env_json(config), "OMP_NUM_THREADS": str(max(1, int(device.cpus + 0.999)))}
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

    def _submit(self, device: DevicePlan, config: dict) -> None:
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

    def start_many(self, items: list[tuple[DevicePlan, dict]]) -> None:
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
        self._agent(device, "shape", network=self.network_id, link=asdict(link), features=self.features.to_json())

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


# -- cleaning up, by label, across the swarm ----------------------------------------------------


def remove_swarm_labelled(run_id: str | None = None, docker_client=None, *, janitor: bool = True, say=lambda line: None) -> list[str]:
    """Remove the services (devices, agents), overlay networks and anchors of one run or of
    every run; with ``janitor``, also the run's files on every node (a global job)."""
    docker_client = docker_client or client(timeout=60)
    try:
        ok, _ = _is_manager(docker_client)
    except Exception:  # noqa: BLE001 - no daemon
        return []
    label = f"{RUN_LABEL}={run_id}" if run_id else LABEL
    removed = []
    if ok:
        services = docker_client.api.services(filters={"label": label})
        agent_images = [s["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"] for s in services
                        if s["Spec"].get("Labels", {}).get(ROLE_LABEL) == "agent"]
        runs = sorted({s["Spec"].get("Labels", {}).get(RUN_LABEL, "") for s in services} - {""})
        for service in services:
            if service["Spec"].get("Labels", {}).get(ROLE_LABEL) == "janitor":
                continue
            try:
                docker_client.api.remove_service(service["ID"])
                removed.append(f"service {service['Spec']['Name']}")
            except Exception as exc:  # noqa: BLE001 - report, keep cleaning
                removed.append(f"service {service['Spec']['Name']} NOT removed: {exc}")
        if janitor and agent_images and runs:
            removed += _run_janitor(docker_client, agent_images[0], runs if run_id else ["*"], say)
    for container in docker_client.api.containers(all=True, filters={"label": [label, f"{ROLE_LABEL}=anchor"]}):
        name = container["Names"][0].lstrip("/")
        try:
            docker_client.api.remove_container(container["Id"], force=True)
            removed.append(f"container {name}")
        except Exception as exc:  # noqa: BLE001
            removed.append(f"container {name} NOT removed: {exc}")
    if ok:
        deadline = time.monotonic() + 60
        for network in docker_client.networks.list(filters={"label": label, "driver": "overlay"}):
            while True:
                try:
                    network.remove()
                    removed.append(f"network {network.name}")
                    break
                except Exception as exc:  # noqa: BLE001 - tasks still detaching
                    if time.monotonic() > deadline:
                        removed.append(f"network {network.name} NOT removed: {exc}")
                        break
                    time.sleep(0.5)
        # Swarm removes a network once the last task has left it, and a task's container once
        # the task is gone: wait for both (on this node), so that nothing labelled is left.
        while time.monotonic() < deadline:
            if not docker_client.api.networks(filters={"label": label, "driver": "overlay"}) and not any(
                    "com.docker.swarm.service.id" in (c.get("Labels") or {}) for c in docker_client.api.containers(all=True, filters={"label": label})):
                break
            time.sleep(0.5)
    return removed


def _run_janitor(docker_client, image: str, runs: list[str], say) -> list[str]:
    """A global job that deletes the runs' directories on every node, then goes."""
    import docker.types as T

    options = SwarmOptions.from_env()
    name = f"emu-janitor-{secrets.token_hex(4)}"
    labels = {LABEL: "1", ROLE_LABEL: "janitor", **({RUN_LABEL: runs[0]} if len(runs) == 1 and runs != ["*"] else {})}
    spec = T.ContainerSpec(image, command=["python", "-m", "emulator.agent", "--clean", options.node_root, *runs], user="0:0",
                           cap_add=["SYS_PTRACE"], read_only=True, labels=labels,
                           mounts=[T.Mount(agent_wire.HOST_PROC, "/proc", type="bind", read_only=True)])
    try:
        service = docker_client.api.create_service(T.TaskTemplate(spec, restart_policy=T.RestartPolicy("none")), name=name,
                                                   labels=labels, mode=T.ServiceMode("global-job"))["ID"]
    except Exception as exc:  # noqa: BLE001 - no job support: the files stay, say so
        say(f"swarm: the runs' files on the nodes were not removed ({exc})")
        return []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            tasks = docker_client.api.tasks(filters={"service": service})
            if tasks and all(t["Status"]["State"] in FAILED_STATES for t in tasks):
                break
            time.sleep(0.5)
        return [f"files of {'every run' if runs == ['*'] else ', '.join(runs)} on {len(tasks)} node(s)"]
    finally:
        try:
            docker_client.api.remove_service(service)
        except Exception:  # noqa: BLE001
            pass
