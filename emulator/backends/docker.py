"""The Docker backend: one container per device on one internal network, shaped from the host.

Every device runs the project's runtime image as a hardened container (non-root, read-only
root filesystem, no capabilities, no new privileges, memory and pids limits) with a CPU
quota set through ``cpu_period``/``cpu_quota`` so it can change live. The run gets its own
``--internal`` bridge network in 198.18.0.0/15; the controller's collector listens on that
network's gateway. Links are shaped from the host in each container's namespace
(:mod:`emulator.host.links`), so containers need no NET_ADMIN. Everything is labelled with the
run id, an instance key (names carry it too: two runs of the same id never share a name), the
run directory and the controller that owns it (:mod:`emulator.host.owner`); the run's teardown
removes its own instance's, and ``emulate clean`` what a killed controller left.

How a device's program starts is the backend's ``boot`` option (``EDGE_EMULATOR_DOCKER_BOOT``):
``zygote`` (the default) forks every device from one container that imported TensorFlow once
(:mod:`emulator.backends.docker_zygote`); ``exec`` runs ``python`` in each container, which then
imports TensorFlow itself. When the zygote cannot work here the run boots with ``exec``, says why,
and records it (``boot`` in ``mechanisms.json``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import threading
import time
from typing import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from emulator.host import links, procstats
from emulator.host.owner import Owner
from emulator.planning.plan import DevicePlan, LinkPlan
from emulator.runtime.config import DeviceConfig
from emulator.backends.base import Backend, Endpoints, RunContext
from emulator.backends.subnets import create_network

LABEL = "edge-emulator"
RUN_LABEL = "edge-emulator.run"
DEVICE_LABEL = "edge-emulator.device"
INSTANCE_LABEL = "edge-emulator.instance"  # one run's key: run ids repeat (a sweep's, in two sweep directories)
RUNDIR_LABEL = "edge-emulator.rundir"  # where its records go: clean removes a killed run's working files there
SERVER_PORT = 7000
DATA_MOUNT = "/data"
CONFIG_MOUNT = "/etc/emulator"
CHECKPOINT_MOUNT = "/checkpoint"
WORKLOAD_MOUNT = "/workload"  # the run's workload/ folder: the user's files and the initial model, read-only
DEVICE_UID = 10001
MODULES = {"server": "paramserver", "worker": "worker", "evaluator": "evaluator"}
CPU_PERIOD_US = 100_000
START_THREADS = 8
TEARDOWN_ROUNDS = 5  # passes of label-based removal at the end of a run, a second apart
PAUSE_ATTEMPTS = 3
BOOT_ENV = "EDGE_EMULATOR_DOCKER_BOOT"
BOOT_MODES = ("zygote", "exec")


def client(timeout: int = 120):
    import docker

    return docker.from_env(timeout=timeout)


def answering_client(timeout: int = 5):
    """(a client whose daemon answered a ping, "") or (None, why not): the first checks of the
    Docker and Swarm backends' ``available``."""
    if importlib.util.find_spec("docker") is None:
        return None, "the docker Python package is not installed"
    try:
        docker_client = client(timeout=timeout)
        docker_client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "not here"
        return None, f"no Docker daemon answers ({type(exc).__name__})"
    return docker_client, ""


class DockerBackend(Backend):
    name = "docker"
    clean_rank = 1

    def __init__(self, say=None, image: str | None = None, boot: str | None = None):
        super().__init__(say)
        boot = boot or os.environ.get(BOOT_ENV) or "zygote"
        if boot not in BOOT_MODES:
            raise ValueError(f"docker backend: boot {boot!r} (from {'$' + BOOT_ENV if os.environ.get(BOOT_ENV) == boot else 'the boot option'}) "
                             f"is not one of {', '.join(BOOT_MODES)}")
        self.boot = boot
        self.boot_why = "asked for" if boot == "exec" else ""
        self.zygote = None
        self.docker = client()
        self.image = image
        self.ctx: RunContext | None = None
        self.instance = secrets.token_hex(3)  # one backend object is one run: its names and labels carry this
        self.owner = Owner.current()
        self.network = None
        self.server_ips: dict[str, str] = {}  # every server's fixed address, by name
        self.containers: dict[str, object] = {}
        self.features = links.detect()
        self._host_index: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def available(cls) -> tuple[bool, str]:
        docker_client, why = answering_client()
        if docker_client is None:
            return False, why
        if os.geteuid() != 0:
            return False, "shaping links in containers' namespaces needs root"
        return True, ""

    @classmethod
    def diagnose(cls):
        rows = []
        ok = False
        try:
            ok, why = cls.available()
            if ok:
                rows.append(("docker", "ok", f"daemon {client(timeout=5).version().get('Version')} answers"))
            else:
                rows.append(("docker", "warn", f"{why}; runs fall back to the local backend"))
        except Exception as exc:  # noqa: BLE001
            rows.append(("docker", "warn", f"unusable: {exc}"))
        if os.geteuid() == 0:
            from emulator.planning.plan import LinkPlan

            features = links.detect()
            qdiscs = ", ".join(k for k in ("htb", "tbf", "netem") if getattr(features, k)) or "none"
            rows.append(("kernel qdiscs", "ok" if features.htb or features.tbf else "warn", qdiscs + (f" ({features.detail})" if features.detail else "")))
            rows.append(("iptables statistic", "ok" if features.iptables_statistic else "warn",
                         "random drops available" if features.iptables_statistic else "unavailable"))
            every = LinkPlan(uplink_bps=1e6, downlink_bps=1e6, delay_s=0.01, jitter_s=0.001, loss=0.001)
            rows.append(("docker links", "info", ", ".join(f"{k} by {v}" for k, v in links.plan_mechanisms(features, every).items())))
        if ok:
            try:
                from emulator.host import images

                status = images.image_status()
                state = "up to date" if status.get("up_to_date") else "missing or stale (built on first run, or: emulate images build)"
                rows.append(("runtime image", "ok" if status.get("up_to_date") else "warn", f"{status.get('runtime') or '-'}: {state}"))
            except Exception as exc:  # noqa: BLE001
                rows.append(("runtime image", "warn", str(exc)))
        return rows

    @classmethod
    def remove_leftovers(cls, run_id, removes, say):
        """The chosen labelled containers and networks, looked for again until none is left (a
        killed controller's create requests may still be completed by the daemon)."""
        docker_client = client(timeout=30)
        label = f"{RUN_LABEL}={run_id}" if run_id else LABEL
        removed: list[str] = []
        run_dirs: dict[str, str] = {}
        chosen: list[dict] = []
        for attempt in range(TEARDOWN_ROUNDS):
            chosen = [o for o in labelled(docker_client, label)
                      if removes(f"{o['kind']} {o['name']}", o["labels"].get(RUN_LABEL, ""), Owner.from_labels(o["labels"]))]
            if not chosen:
                break
            for obj in chosen:
                if obj["labels"].get(RUNDIR_LABEL):
                    run_dirs[obj["labels"][RUNDIR_LABEL]] = obj["labels"].get(RUN_LABEL, "")
            removed += remove_objects(docker_client, chosen)
            if attempt + 1 < TEARDOWN_ROUNDS:
                time.sleep(1.0)
        else:
            left = [o["name"] for o in labelled(docker_client, label) if any(o["id"] == c["id"] for c in chosen)]
            if left:
                say(f"docker: {len(left)} labelled object(s) still there after {TEARDOWN_ROUNDS} round(s): {', '.join(left)}")
        return removed, run_dirs

    # -- run set-up ----------------------------------------------------------------------

    def prepare(self, ctx, devices):
        from emulator.host import images

        self.ctx = ctx
        self.owner = Owner.current()  # the process that runs the emulation (a sweep forks one per run)
        if self.image is None:
            self.image = images.ensure_runtime_image(self.docker, progress=self.say)
        import docker.types

        def make(subnet):
            gateway = str(subnet.network_address + 1)
            ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet), gateway=gateway)])
            return self.docker.networks.create(f"emu-{ctx.run_id}-{self.instance}", driver="bridge", internal=True, ipam=ipam,
                                               labels=self.labels())

        self.network, subnet = create_network(self.docker, len(devices), make)
        gateway = str(subnet.network_address + 1)
        servers = [d.name for d in devices if d.role == "server"]
        self.server_ips = {name: str(subnet.network_address + 2 + i) for i, name in enumerate(servers)}
        server_ip = self.server_ips[servers[0]] if servers else str(subnet.network_address + 2)  # no server planned: its address
        (Path(ctx.run_dir) / "devices").mkdir(exist_ok=True)
        checkpoints = Path(ctx.run_dir) / "checkpoint"
        checkpoints.mkdir(exist_ok=True)
        os.chown(checkpoints, DEVICE_UID, DEVICE_UID)  # the only writable mount, the server's alone
        os.chmod(checkpoints, 0o700)
        if self.boot == "zygote":
            self._start_zygote()
        shards = {} if len(servers) == 1 else {
            name: (("0.0.0.0", SERVER_PORT), (ip, SERVER_PORT)) for name, ip in self.server_ips.items()}
        return Endpoints(gateway, gateway, ("0.0.0.0", SERVER_PORT), (server_ip, SERVER_PORT), DATA_MOUNT, CHECKPOINT_MOUNT,
                         WORKLOAD_MOUNT, shards)

    def labels(self, device: str | None = None) -> dict[str, str]:
        """What every object of this run carries: the run, its instance, its directory, its owner."""
        labels = {LABEL: "1", RUN_LABEL: self.ctx.run_id, INSTANCE_LABEL: self.instance,
                  RUNDIR_LABEL: str(Path(self.ctx.run_dir).resolve()), **self.owner.labels()}
        return {**labels, DEVICE_LABEL: device} if device is not None else labels

    def _start_zygote(self) -> None:
        from emulator.backends.docker_zygote import ZygoteBoot

        self.zygote = ZygoteBoot(self.docker, self.image, f"{self.ctx.run_id}-{self.instance}", self.labels(), self.say,
                                 binds=self._workload_bind(), user_files=[f"{WORKLOAD_MOUNT}/{name}" for name in self.ctx.preload])
        try:
            seconds = self.zygote.start()
        except Exception as exc:  # noqa: BLE001 - any failure: boot the old way, and say why
            self.boot_why = f"the zygote failed: {type(exc).__name__}: {exc}"[:500]
            self._save_zygote_log()
            self.zygote.close()
            self.zygote, self.boot = None, "exec"
            self.say(f"docker: boot exec (each container imports TensorFlow): {self.boot_why}")
            return
        self.boot_why = f"zygote ready and probed in {seconds:.1f}s"
        self.say(f"docker: boot zygote (TensorFlow loaded once, {seconds:.1f}s; devices are forked into their containers)")

    def _save_zygote_log(self) -> None:
        if self.zygote is not None and self.ctx is not None:
            with open(Path(self.ctx.run_dir) / "logs" / "zygote.log", "ab") as fh:
                fh.write(self.zygote.logs())

    def boot_mechanism(self) -> str:
        """How device programs start in this run, and why (recorded in mechanisms.json)."""
        if self.boot == "zygote":
            return f"zygote (forked from emu-{self.ctx.run_id}-{self.instance}-zygote into the device's container; {self.boot_why})"
        return f"exec (python in each container imports TensorFlow; {self.boot_why or 'asked for'})"

    def mechanisms(self, device):
        out = {"cpus": "docker-cpu-quota (cgroup cfs)", **links.plan_mechanisms(self.features, device.link)}
        if self.ctx is not None:
            out["boot"] = self.boot_mechanism()
        return out

    # -- devices -------------------------------------------------------------------------

    def _config_dir(self, device: DevicePlan) -> Path:
        path = Path(self.ctx.run_dir) / "devices" / device.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _write_config(self, device: DevicePlan, config: DeviceConfig) -> None:
        """Atomically replace the config file; the directory is bind-mounted read-only."""
        path = self._config_dir(device)
        tmp = path / ".config.json.tmp"
        tmp.write_text(json.dumps(config.to_json()))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path / "config.json")

    def _create(self, device: DevicePlan):
        networking = self.docker.api.create_networking_config({
            self.network.name: self.docker.api.create_endpoint_config(
                ipv4_address=self.server_ips.get(device.name) if device.role == "server" else None, aliases=[device.name]),
        })
        host_config = self.docker.api.create_host_config(
            cpu_period=CPU_PERIOD_US, cpu_quota=-1,
            mem_limit=device.memory_bytes, memswap_limit=device.memory_bytes, pids_limit=512,
            read_only=True, tmpfs={"/tmp": "rw,nosuid,nodev,size=256m"},
            cap_drop=["ALL"], security_opt=["no-new-privileges"],
            binds=self._binds(device),
            network_mode=self.network.name, init=self.zygote is None,  # hold is the init when the zygote boots it
        )
        if self.zygote is not None:
            from emulator.backends.docker_zygote import HOLD

            command = HOLD
        else:
            command = ["python", "-m", f"emulator.runtime.{MODULES[device.role]}", f"{CONFIG_MOUNT}/config.json"]
        created = self.docker.api.create_container(
            self.image, command=command,
            name=f"emu-{self.ctx.run_id}-{self.instance}-{device.name}", user="10001:10001", host_config=host_config,
            networking_config=networking, labels=self.labels(device.name),
            environment={"OMP_NUM_THREADS": str(max(1, int(device.cpus + 0.999)))}, detach=True,
            stdin_open=self.zygote is not None,  # hold reads the device's exit code there
        )
        return self.docker.containers.get(created["Id"])

    def _workload_bind(self) -> dict:
        if not self.ctx.workload_dir:
            return {}
        return {str(Path(self.ctx.workload_dir).resolve()): {"bind": WORKLOAD_MOUNT, "mode": "ro"}}

    def _binds(self, device: DevicePlan) -> dict:
        binds = {
            str(Path(self.ctx.data_dir).resolve()): {"bind": DATA_MOUNT, "mode": "ro"},
            str(self._config_dir(device).resolve()): {"bind": CONFIG_MOUNT, "mode": "ro"},
            **self._workload_bind(),
        }
        if device.role == "server":
            binds[str((Path(self.ctx.run_dir) / "checkpoint").resolve())] = {"bind": CHECKPOINT_MOUNT, "mode": "rw"}
        return binds

    def start(self, device, config):
        self._write_config(device, config)
        with self._lock:
            container = self.containers.get(device.name)
        if container is None:
            container = self._create(device)
            with self._lock:
                self.containers[device.name] = container
        else:
            self.docker.api.update_container(container.id, cpu_quota=-1)
        container.start()
        container.reload()
        links.drop_default_route(self._netns(device.name))  # internal means no way out (Docker < 25 adds one)
        if self.zygote is not None:
            try:
                self.zygote.enter(container.attrs["State"]["Pid"], device.role, [f"{CONFIG_MOUNT}/config.json"],
                                  DEVICE_UID, DEVICE_UID)
            except Exception as exc:
                raise RuntimeError(f"{device.name}: the zygote could not start it in its container: {exc}") from exc
        with self._lock:
            self._host_index.pop(device.name, None)

    def start_many(self, items: list[tuple[DevicePlan, DeviceConfig]]) -> None:
        """Start devices in parallel (container creation is mostly waiting on the daemon).

        The server goes first: it has a fixed address that dynamic allocation must not take."""
        first = [item for item in items if item[0].role == "server"]
        for item in first:
            self.start(*item)
        with ThreadPoolExecutor(START_THREADS) as pool:
            list(pool.map(lambda item: self.start(*item), [i for i in items if i not in first]))

    def _netns(self, name: str) -> str:
        container = self.containers[name]
        container.reload()
        pid = container.attrs["State"]["Pid"]
        if not pid:
            raise links.LinkError(f"{name} is not running")
        return f"/proc/{pid}/ns/net"

    def kill(self, device):
        container = self.containers.get(device.name)
        if container is None:
            return
        container.reload()
        if container.status == "paused":
            container.unpause()
        if container.status in ("running", "paused"):
            container.kill()
        container.wait(timeout=30)
        with self._lock:
            self._host_index.pop(device.name, None)

    def pause(self, device):
        """``docker pause`` (the cgroup freezer); runc gives up when a task does not freeze within a
        few hundred milliseconds, which a loaded machine sometimes causes: try again, a moment apart."""
        container = self.containers[device.name]
        for attempt in range(PAUSE_ATTEMPTS):
            try:
                container.pause()
                return
            except Exception as exc:  # noqa: BLE001 - docker.errors.APIError: "unable to freeze"
                if attempt + 1 == PAUSE_ATTEMPTS or "freeze" not in str(exc):
                    raise
                self.say(f"docker: pausing {device.name} failed ({exc}); trying again")
                time.sleep(0.2)

    def resume(self, device):
        self.containers[device.name].unpause()

    def set_cpus(self, device, cpus):
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        self.docker.api.update_container(self.containers[device.name].id, cpu_period=CPU_PERIOD_US, cpu_quota=quota)

    def cpu_quota(self, device):
        info = self.docker.api.inspect_container(self.containers[device.name].id)["HostConfig"]
        quota, period = info.get("CpuQuota") or 0, info.get("CpuPeriod") or CPU_PERIOD_US
        return quota / period if quota > 0 else None

    def set_link(self, device, link: LinkPlan):
        links.shape_device(self._netns(device.name), link, self.features)

    def partition(self, device, cut):
        links.set_partition(self._netns(device.name), cut)
        return True

    def alive(self, device):
        container = self.containers.get(device.name)
        if container is None:
            return False
        try:
            container.reload()
        except Exception:  # noqa: BLE001 - gone
            return False
        return container.status in ("running", "paused")

    # -- measurement ---------------------------------------------------------------------

    def _host_veth(self, name: str) -> int | None:
        with self._lock:
            index = self._host_index.get(name)
        if index is None:
            try:
                _, index = links.peer_index(self._netns(name))
            except Exception:  # noqa: BLE001 - not running right now
                return None
            with self._lock:
                self._host_index[name] = index
        return index

    def sample(self):
        """Interface bytes from the device's point of view (host veth rx = device tx), CPU, memory."""
        out = []
        for name, container in list(self.containers.items()):
            index = self._host_veth(name) if self._running(container) else None
            if index is not None:
                counters = links.interface_counters(index)
                if counters is not None:
                    out.append({"device": name, "rx_bytes": counters[1], "tx_bytes": counters[0]})
            usage = _cgroup_usage(container.id)
            if usage:
                out.append({"device": name, **usage})
        return out

    def _running(self, container) -> bool:
        return container.attrs.get("State", {}).get("Running", False)

    def collect_logs(self) -> None:
        for name, container in self.containers.items():
            try:
                data = container.logs(stdout=True, stderr=True)
            except Exception:  # noqa: BLE001 - already removed
                continue
            with open(Path(self.ctx.run_dir) / "logs" / f"{name}.log", "ab") as fh:
                fh.write(data)

    def teardown(self):
        if self.ctx is None:
            return
        try:
            self.collect_logs()
            self._save_zygote_log()
        finally:
            if self.zygote is not None:
                self.zygote.close()
                self.zygote = None
            remove_labelled(self.ctx.run_id, self.docker, rounds=TEARDOWN_ROUNDS, say=self.say, instance=self.instance)
            self.containers.clear()
            self.network = None


def _cgroup_usage(container_id: str) -> dict | None:
    """CPU seconds, cgroup memory and the processes' PSS (v1 cgroupfs layout; else None).

    PSS divides each shared page among the processes mapping it, so summing it over devices
    gives the machine's real memory use (TensorFlow's libraries are shared between containers
    of the same image)."""
    cpu = Path(f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage")
    mem = Path(f"/sys/fs/cgroup/memory/docker/{container_id}/memory.usage_in_bytes")
    procs = Path(f"/sys/fs/cgroup/memory/docker/{container_id}/cgroup.procs")
    try:
        out = {"cpu_s": int(cpu.read_text()) / 1e9, "memory_bytes": int(mem.read_text())}
        pss = rss = 0
        for pid in procs.read_text().split():
            usage = procstats.memory(int(pid)) or {}
            pss += usage.get("pss_bytes", 0)
            rss += usage.get("rss_bytes", 0)
        out.update(pss_bytes=pss, rss_bytes=rss)
        return out
    except (OSError, ValueError):
        return None


def remove_labelled(run_id: str | None = None, docker_client=None, *, rounds: int = 1,
                    say: Callable[[str], None] | None = None, instance: str | None = None) -> list[str]:
    """Remove containers and networks carrying our label (one run's, one instance of it, or every
    run's), whoever owns them: a run's own teardown, and ``emulate clean --run``/``--all``.

    With ``rounds`` > 1 it looks again, a second apart, until nothing labelled is left: a daemon
    under load can fail a forced removal, and a controller killed while creating containers leaves
    requests the daemon still completes. What is still there at the end is said, not swallowed."""
    docker_client = docker_client or client(timeout=30)
    label = [f"{RUN_LABEL}={run_id}" if run_id else LABEL] + ([f"{INSTANCE_LABEL}={instance}"] if instance else [])
    removed: list[str] = []
    for attempt in range(rounds):
        removed += _remove_once(label, docker_client)
        left = (docker_client.api.containers(all=True, filters={"label": label})
                + docker_client.api.networks(filters={"label": label}))
        if not left:
            return removed
        if attempt + 1 < rounds:
            time.sleep(1.0)
    if say is not None:
        names = [(o.get("Names") or [o.get("Name", o.get("Id", "?")[:12])])[0] for o in left]
        say(f"docker: {len(left)} labelled object(s) still there after {rounds} round(s): {', '.join(names)}")
    return removed


def _remove_once(label, docker_client) -> list[str]:
    return remove_objects(docker_client, labelled(docker_client, label))


def labelled(docker_client, label=LABEL) -> list[dict]:
    """Containers, then networks, carrying ``label`` (a filter or a list of them, all to match):
    ``{"kind", "id", "name", "labels"}`` each, as the daemon lists them (no inspect: they come and
    go meanwhile)."""
    found = [{"kind": "container", "id": c["Id"], "name": (c.get("Names") or ["/" + c["Id"][:12]])[0].lstrip("/"),
              "labels": c.get("Labels") or {}} for c in docker_client.api.containers(all=True, filters={"label": label})]
    return found + [{"kind": "network", "id": n["Id"], "name": n["Name"], "labels": n.get("Labels") or {}}
                    for n in docker_client.api.networks(filters={"label": label})]


def remove_objects(docker_client, objects: list[dict]) -> list[str]:
    """Remove the containers, then the networks, of ``objects`` (as :func:`labelled` lists them);
    returns a line for each, saying so when it could not be removed."""
    import docker.errors

    removed = []
    for obj in (o for o in objects if o["kind"] == "container"):
        try:
            docker_client.api.remove_container(obj["id"], force=True)
            removed.append(f"container {obj['name']}")
        except docker.errors.NotFound:
            pass  # gone meanwhile (its run's own teardown)
        except Exception as exc:  # noqa: BLE001 - report, keep cleaning
            removed.append(f"container {obj['name']} NOT removed: {exc}")
    for obj in (o for o in objects if o["kind"] == "network"):
        for attempt in range(5):
            try:
                docker_client.api.remove_network(obj["id"])
                removed.append(f"network {obj['name']}")
                break
            except docker.errors.NotFound:
                break
            except Exception as exc:  # noqa: BLE001 - endpoints still detaching
                if attempt == 4:
                    removed.append(f"network {obj['name']} NOT removed: {stuck_network(str(exc), _live_endpoints(docker_client, obj['id']))}")
                else:
                    time.sleep(0.5)
    return removed


def _live_endpoints(docker_client, network_id: str) -> list[str] | None:
    """The names of the existing containers attached to a network (None: it could not be inspected)."""
    import docker.errors

    try:
        attached = docker_client.api.inspect_network(network_id).get("Containers") or {}
    except Exception:  # noqa: BLE001 - gone meanwhile, or the daemon busy: say the error as it is
        return None
    live = []
    for container_id, endpoint in attached.items():
        try:
            docker_client.api.inspect_container(container_id)
            live.append(endpoint.get("Name") or container_id[:12])
        except docker.errors.NotFound:
            pass
    return live


def stuck_network(error: str, live: list[str] | None) -> str:
    """Why a network outlived its removal, and what to do: a daemon that reports "active endpoints"
    while no existing container is attached keeps a dead endpoint in its own store, which neither
    ``docker network disconnect -f`` nor a retry clears; only restarting the daemon does (its log
    then says "Fixing inconsistent endpoint_cnt"; moby/moby#42119)."""
    if "active endpoints" not in error or live is None:
        return error
    if live:
        return f"containers still attached: {', '.join(live)}"
    return ("the Docker daemon still holds an endpoint of a container that no longer exists (a daemon fault that "
            "`docker network disconnect -f` does not clear): restart the Docker daemon, then run `emulate clean --all`")
