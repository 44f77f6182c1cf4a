"""The Swarm node agent: what the Docker backend does from the host, done on each node of a swarm.

On one host the controller shapes links, changes CPU quotas and injects faults itself, in the
device containers' namespaces and through the local Docker daemon. On a swarm the devices run
on other machines, so every node runs one agent (a global service of the run, started from the
same image as the devices plus two packages, see :mod:`.images`). The agent dials the
controller over the run's overlay network (:mod:`.hub` is the controller's end), says which
node it is and what its kernel offers, and then serves requests: shape a device's link (the
functions of :mod:`emulator.host.links`, unchanged), cut it, set a CPU quota and read it back, kill,
pause and resume a device's container, sample interface bytes, CPU and memory, receive the
data shards, and remove the run's files.

What the agent needs from its node, and how a Swarm service (API 1.41) gives it:

* the node's Docker API: the socket, bind-mounted;
* the node's processes: the host's ``/proc``, bind-mounted at ``/host/proc`` (services have no
  host PID mode). A container's network namespace is ``/host/proc/<pid>/ns/net``; paths of the
  node (the overlay network's namespace, cgroups, the run's data directory) are reached through
  the root of the container runtime's process (``/host/proc/<shim>/root``), i.e. as the Docker
  daemon itself sees them;
* capabilities: NET_ADMIN (qdiscs, iptables), SYS_ADMIN (setns), SYS_PTRACE (other users'
  namespaces under ``/proc``);
* ``iptables`` and ``nsenter``: the node's own. An ``iptables`` shim first on ``PATH`` enters the
  runtime's mount namespace (keeping the device's network namespace), so every node uses the
  iptables that its Docker daemon uses too.

Requests and replies are frames of :mod:`emulator.runtime.protocol` (type CONTROL, checked
against the run's agent token) whose body is one JSON object, a newline, and optional bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from emulator.host import links, procstats
from emulator.runtime import protocol
from emulator.runtime.config import LinkConfig

MODULE = "emulator.backends.swarm.agent"  # what the agent's and the janitor's tasks run: python -m MODULE
HOST_PROC = "/host/proc"
MAX_MESSAGE = 64 << 20
CHUNK_BYTES = 4 << 20
PUT_FOLDERS = ("data", "workload")  # where the controller may put files on a node: shards; the user's workload
DEVICE_UID = 10001
SHIM_DIR = "/opt/edge-emulator-agent/bin"  # in the agent image
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IPTABLES_SHIM = f"""#!/bin/sh
# The node's own iptables, run in the current network namespace (emulator/backends/swarm/agent.py).
exec nsenter --mount={HOST_PROC}/${{EMU_RUNTIME_PID:?}}/ns/mnt -- env PATH={HOST_PATH} iptables "$@"
"""
OVERLAY_SANDBOX_PREFIX = "1-"  # Docker names an overlay network's namespace 1-<first 10 characters of its id>
REQUEST_THREADS = 8


class AgentError(RuntimeError):
    """A request the agent could not carry out; the message says why."""


# -- the wire: one JSON object and optional bytes per CONTROL frame ------------------------


def send_message(sock: socket.socket, token: bytes, message: dict, payload: bytes = b"") -> None:
    body = json.dumps(message, separators=(",", ":")).encode() + b"\n" + payload
    protocol.send_frame(sock, protocol.MsgType.CONTROL, token, body)


def recv_message(sock: socket.socket, token: bytes) -> tuple[dict, bytes]:
    header, body = protocol.recv_frame(sock, token, MAX_MESSAGE)
    if header.type != protocol.MsgType.CONTROL:
        raise protocol.ProtocolError("unexpected", header.type.name)
    raw = bytes(body)
    head, _, payload = raw.partition(b"\n")
    return protocol.parse_json(memoryview(head), "agent message"), payload


# -- the node as its container runtime sees it ---------------------------------------------


def runtime_pid(proc: str = HOST_PROC) -> int:
    """The nearest ancestor of this process outside its container's mount namespace: the
    container runtime's shim, whose root and mount namespace are the Docker daemon's."""
    own = os.readlink("/proc/self/ns/mnt")
    pid = int(os.readlink(f"{proc}/self"))
    for _ in range(64):
        with open(f"{proc}/{pid}/stat") as fh:
            pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        if pid <= 0:
            break
        if os.readlink(f"{proc}/{pid}/ns/mnt") != own:
            return pid
    raise AgentError("no ancestor outside the container's mount namespace: is the host's /proc mounted?")


def resolve(root: str, path: str) -> str:
    """``path`` as seen from the root directory ``root`` (``/host/proc/<pid>/root``), following
    symbolic links inside that root (the kernel would follow an absolute one into ours)."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = os.path.join(root, *done, part)
        if os.path.islink(candidate):
            hops += 1
            if hops > 40:
                raise AgentError(f"too many symbolic links resolving {path}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        done.append(part)
    return os.path.join(root, *done)


def use_node_iptables(runtime: int, directory: str = SHIM_DIR) -> None:
    """Put the agent image's ``iptables`` shim (:data:`IPTABLES_SHIM`) first on PATH, aimed at
    the runtime's mount namespace: links.py's ``nsenter --net=<device> iptables ...`` then runs
    the node's own iptables in the device's network namespace."""
    if not os.access(os.path.join(directory, "iptables"), os.X_OK):
        raise AgentError(f"{directory}/iptables is missing: the agent runs from the agent image")
    os.environ["EMU_RUNTIME_PID"] = str(runtime)
    os.environ["PATH"] = f"{directory}:{os.environ.get('PATH', HOST_PATH)}"


def _children(proc: str, pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"{proc}/{pid}/task"):
            with open(f"{proc}/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        pass
    return out


def process_tree(proc: str, pid: int) -> list[int]:
    """``pid`` and its descendants (a container's processes, seen from the host)."""
    seen, todo = [], [pid]
    while todo and len(seen) < 4096:
        current = todo.pop()
        seen.append(current)
        todo += _children(proc, current)
    return seen


def interface_bytes(proc: str, pid: int, ifname: str = "eth0") -> tuple[int, int] | None:
    """(rx_bytes, tx_bytes) of ``ifname`` in the network namespace of process ``pid``."""
    try:
        with open(f"{proc}/{pid}/net/dev") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name.strip() == ifname:
                    fields = rest.split()
                    return int(fields[0]), int(fields[8])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_paths(proc: str, pid: int) -> dict[str, str]:
    """Controller -> cgroup path of a process (``""`` for the unified v2 hierarchy)."""
    out = {}
    with open(f"{proc}/{pid}/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                out[controller] = path
    return out


def cgroup_usage(root: str, proc: str, pid: int) -> dict | None:
    """CPU seconds and memory of the cgroup of process ``pid`` (v1 or v2), and its processes'
    PSS and RSS (the same figures as the Docker backend's stats stream)."""
    try:
        paths = _cgroup_paths(proc, pid)
        cgroupfs = resolve(root, "/sys/fs/cgroup")
        if "cpuacct" in paths and "memory" in paths:
            cpu_s = int(Path(f"{cgroupfs}/cpuacct{paths['cpuacct']}/cpuacct.usage").read_text()) / 1e9
            memory = int(Path(f"{cgroupfs}/memory{paths['memory']}/memory.usage_in_bytes").read_text())
        else:
            base = f"{cgroupfs}{paths['']}"
            stat = dict(line.split() for line in Path(f"{base}/cpu.stat").read_text().splitlines())
            cpu_s = int(stat["usage_usec"]) / 1e6
            memory = int(Path(f"{base}/memory.current").read_text())
    except (OSError, KeyError, ValueError):
        return None
    pss = rss = 0
    for member in process_tree(proc, pid):
        usage = procstats.memory(member, proc)
        pss += (usage or {}).get("pss_bytes", 0)
        rss += (usage or {}).get("rss_bytes", 0)
    return {"cpu_s": cpu_s, "memory_bytes": memory, "pss_bytes": pss, "rss_bytes": rss}


# -- the agent ------------------------------------------------------------------------------


class Agent:
    """Serves one controller connection at a time; reconnects while the service runs."""

    def __init__(self, *, controller: tuple[str, int], token: bytes, node: str, hostname: str, run_id: str, root: str,
                 proc: str = HOST_PROC, docker_client=None):
        self.controller = controller
        self.token = token
        self.node = node
        self.hostname = hostname
        self.run_id = run_id
        self.root = root  # the node's directory for the run's files, as the node sees it
        self.proc = proc
        self.runtime = runtime_pid(proc)
        self.host_root = f"{proc}/{self.runtime}/root"
        use_node_iptables(self.runtime)
        self.features = links.detect()
        if docker_client is None:
            import docker

            docker_client = docker.from_env(timeout=60)
        self.docker = docker_client
        self._send_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(REQUEST_THREADS, thread_name_prefix="agent-request")
        self._sandboxes: dict[str, str] = {}

    # The run's directory on this node: <root>/<run>/<node>/{data,checkpoint}, reached through
    # the runtime's root (the Docker daemon bind-mounts it into the devices from that same path).
    def node_dir(self) -> str:
        return resolve(self.host_root, f"{self.root}/{self.run_id}/{self.node}")

    def hello(self) -> dict:
        return {"node": self.node, "hostname": self.hostname, "features": self.features.to_json(), "runtime_pid": self.runtime}

    def serve_forever(self) -> None:
        delay = 0.2
        while True:
            try:
                sock = socket.create_connection(self.controller, timeout=10)
            except OSError:
                time.sleep(delay)
                delay = min(5.0, delay * 2)
                continue
            delay = 0.2
            sock.settimeout(None)
            try:
                self.serve(sock)
            except (OSError, protocol.ProtocolError) as exc:
                print(f"agent: connection to the controller ended: {exc}", file=sys.stderr, flush=True)
            finally:
                sock.close()

    def serve(self, sock: socket.socket) -> None:
        send_message(sock, self.token, {"hello": self.hello()})
        while True:
            request, payload = recv_message(sock, self.token)
            if request.get("op") in ("prepare", "put"):  # in order, on this thread: files arrive in pieces
                self._answer(sock, request, payload)
            else:
                self._pool.submit(self._answer, sock, request, payload)

    def _answer(self, sock: socket.socket, request: dict, payload: bytes) -> None:
        reply: dict = {"id": request.get("id")}
        try:
            handler = getattr(self, f"op_{request.get('op')}", None)
            if handler is None:
                raise AgentError(f"unknown request {request.get('op')!r}")
            reply["result"] = handler(payload=payload, **request.get("args", {}))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the controller
            reply["error"] = f"{type(exc).__name__}: {exc}"
        try:
            with self._send_lock:
                send_message(sock, self.token, reply)
        except OSError:
            pass

    # -- containers ----------------------------------------------------------------------

    def _inspect(self, container: str) -> dict:
        return self.docker.api.inspect_container(container)

    def _pid(self, container: str) -> int:
        pid = self._inspect(container)["State"]["Pid"]
        if not pid:
            raise links.LinkError(f"container {container[:12]} is not running")
        return pid

    def _netns(self, container: str) -> str:
        return f"{self.proc}/{self._pid(container)}/ns/net"

    def _peer_netns(self, container: str, network_id: str) -> str:
        """The overlay network's namespace on this node, where the veth peer of the device's
        interface is: the name Docker gives it first, else whichever namespace holds the peer."""
        if network_id in self._sandboxes:
            return self._sandboxes[network_id]
        info = self._inspect(container)
        directory = resolve(self.host_root, os.path.dirname(info["NetworkSettings"]["SandboxKey"]))
        netns = f"{self.proc}/{info['State']['Pid']}/ns/net"
        inner, outer = links.peer_index(netns)
        expected = os.path.join(directory, OVERLAY_SANDBOX_PREFIX + network_id[:10])
        candidates = [expected] + sorted(os.path.join(directory, n) for n in os.listdir(directory))
        for path in candidates:
            try:
                with links.rtnl(path) as ns:
                    found = ns.get_links(outer)
            except Exception:  # noqa: BLE001 - not a namespace, or no such index there
                continue
            if found and found[0].get_attr("IFLA_LINK") == inner:
                self._sandboxes[network_id] = path
                return path
        raise links.LinkError(f"no namespace under {directory} holds the peer of {container[:12]}'s eth0")

    def op_shape(self, *, container: str, network: str, link: dict, features: dict, payload=b"") -> dict:
        netns = self._netns(container)
        links.shape_device(netns, LinkConfig.from_json(link), links.KernelFeatures(**features), peer_netns=self._peer_netns(container, network))
        return {}

    def op_partition(self, *, container: str, cut: bool, payload=b"") -> dict:
        links.set_partition(self._netns(container), cut)
        return {}

    def op_kill(self, *, container: str, payload=b"") -> dict:
        from docker.errors import APIError, NotFound

        try:
            state = self._inspect(container)["State"]
        except NotFound:
            return {"was": "gone"}
        if state.get("Paused"):
            self.docker.api.unpause(container)
        if state.get("Running"):
            try:
                self.docker.api.kill(container)
            except APIError as exc:
                if "is not running" not in str(exc):
                    raise
        self.docker.api.wait(container, timeout=30)
        return {"was": "running" if state.get("Running") else state.get("Status")}

    def op_pause(self, *, container: str, payload=b"") -> dict:
        self.docker.api.pause(container)
        return {}

    def op_resume(self, *, container: str, payload=b"") -> dict:
        self.docker.api.unpause(container)
        return {}

    def op_cpus(self, *, container: str, period_us: int, quota_us: int, payload=b"") -> dict:
        self.docker.api.update_container(container, cpu_period=period_us, cpu_quota=quota_us)
        return {}

    def op_quota(self, *, container: str, payload=b"") -> dict:
        host = self._inspect(container)["HostConfig"]
        return {"quota_us": host.get("CpuQuota") or 0, "period_us": host.get("CpuPeriod") or 0, "nano_cpus": host.get("NanoCpus") or 0}

    def op_sample(self, *, containers: dict, payload=b"") -> list[dict]:
        """Per device: interface bytes as the device sees them, CPU seconds and memory."""
        out = []
        for device, container in containers.items():
            try:
                state = self._inspect(container)["State"]
            except Exception:  # noqa: BLE001 - removed meanwhile
                continue
            pid = state.get("Pid")
            if not state.get("Running") or not pid:
                continue
            counters = interface_bytes(self.proc, pid)
            if counters is not None:
                out.append({"device": device, "rx_bytes": counters[0], "tx_bytes": counters[1]})
            usage = cgroup_usage(self.host_root, self.proc, pid)
            if usage:
                out.append({"device": device, **usage})
        return out

    # -- the run's files -----------------------------------------------------------------

    def op_prepare(self, *, payload=b"") -> dict:
        """data/ (the shards) and workload/ (the user's files, the initial model), read-only for devices, and
        checkpoint/ (the server's alone)."""
        base = self.node_dir()
        for folder in PUT_FOLDERS:
            os.makedirs(os.path.join(base, folder), mode=0o755, exist_ok=True)
        checkpoint = os.path.join(base, "checkpoint")
        os.makedirs(checkpoint, mode=0o700, exist_ok=True)
        os.chown(checkpoint, DEVICE_UID, DEVICE_UID)
        os.chmod(checkpoint, 0o700)
        return {"path": f"{self.root}/{self.run_id}/{self.node}"}

    def op_put(self, *, name: str, offset: int, last: bool, folder: str = "data", payload=b"") -> dict:
        if "/" in name or name in ("", ".", ".."):
            raise AgentError(f"refusing file name {name!r}")
        if folder not in PUT_FOLDERS:
            raise AgentError(f"refusing folder {folder!r}")
        data = os.path.join(self.node_dir(), folder)
        partial = os.path.join(data, f".{name}.partial")
        with open(partial, "r+b" if offset else "wb") as fh:
            fh.seek(offset)
            fh.write(payload)
        if last:
            os.chmod(partial, 0o644)
            os.replace(partial, os.path.join(data, name))
        return {"bytes": len(payload)}

    def op_cleanup(self, *, payload=b"") -> dict:
        run_dir = resolve(self.host_root, f"{self.root}/{self.run_id}")
        shutil.rmtree(run_dir, ignore_errors=True)
        return {"removed": f"{self.root}/{self.run_id}"}

    def op_ping(self, *, payload=b"") -> dict:
        return {"node": self.node}


def clean(root: str, runs: list[str], proc: str = HOST_PROC) -> list[str]:
    """Delete runs' directories on this node (``*``: every run's), as ``emulate clean``'s
    global job does on every node."""
    base = resolve(f"{proc}/{runtime_pid(proc)}/root", root)
    names = sorted(os.listdir(base)) if runs == ["*"] and os.path.isdir(base) else runs
    removed = []
    for name in names:
        if "/" in name or name in ("", ".", ".."):
            continue
        path = os.path.join(base, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"{root}/{name}")
    return removed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--clean"]:
        for path in clean(argv[1], argv[2:]):
            print(f"removed {path}", flush=True)
        return 0
    env = os.environ
    host, _, port = env["EMU_AGENT_CONTROLLER"].rpartition(":")
    agent = Agent(controller=(host, int(port)), token=bytes.fromhex(env["EMU_AGENT_TOKEN"]), node=env["EMU_AGENT_NODE"],
                  hostname=env.get("EMU_AGENT_HOSTNAME", ""), run_id=env["EMU_AGENT_RUN"], root=env["EMU_AGENT_ROOT"])
    print(f"agent for run {agent.run_id} on node {agent.node} ({agent.hostname}); runtime pid {agent.runtime}; "
          f"kernel {agent.features.to_json()}", file=sys.stderr, flush=True)
    agent.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
