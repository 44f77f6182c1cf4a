"""Docker devices forked from one zygote container, instead of each importing TensorFlow (``boot: zygote``).

Each container's ``import tensorflow`` costs ~8 s of CPU and ~235 MB: 64 devices took 255 s to
boot on 2 cores. Here one container of the same runtime image (root, host pid namespace, the
host's cgroup tree, CAP_SYS_ADMIN and CAP_SYS_PTRACE, Docker's default seccomp profile) imports
it once; each device container runs only :mod:`emulator.runtime.hold`, and the zygote forks
the device into it (:mod:`emulator.runtime.enter`: its namespaces, every cgroup, its stdio,
uid 10001). Same image, so every lazy import resolves to the same file inside each container.

Before a run relies on it, :meth:`ZygoteBoot.start` checks the whole path end to end on a probe
container; anything that fails there is the reason the run boots with ``exec`` instead.
"""

from __future__ import annotations

import time

from emulator.runtime.zygote import PROBE, ZygoteConnection, abstract_address

HOLD = ["python", "-I", "-S", "/opt/edge-emulator/emulator/runtime/hold.py"]
CGROUP_ROOT = "/host/cgroup"  # where the zygote container sees the host's cgroup tree
READY_TIMEOUT_S = 300.0  # TensorFlow's import under a loaded machine
PROBE_TIMEOUT_S = 30.0
CAPABILITIES = ["SYS_ADMIN", "SYS_PTRACE"]  # setns into another mount namespace; other users' /proc entries


class ZygoteBoot:
    """The run's zygote container and the connection to it."""

    def __init__(self, docker, image: str, run_id: str, labels: dict, say=lambda msg: None, binds: dict | None = None,
                 user_files: list[str] = ()):
        self.binds = dict(binds or {})  # the run's workload folder, so the zygote imports the user's files
        self.user_files = list(user_files)
        self.docker = docker
        self.image = image
        self.run_id = run_id
        self.labels = labels
        self.say = say
        self.address = abstract_address("edge-emulator-docker-zygote", run_id)
        self.container = None
        self.conn: ZygoteConnection | None = None

    def start(self) -> float:
        """Start the zygote, wait until it listens, and check on a probe container that a device
        forked from it really lands in a container; returns the seconds it took."""
        started = time.monotonic()
        host_config = self.docker.api.create_host_config(
            pid_mode="host",  # to see the device containers' processes and namespaces
            network_mode="host",  # its abstract socket is then reachable from the controller
            cap_add=CAPABILITIES, read_only=True, tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"},
            binds={"/sys/fs/cgroup": {"bind": CGROUP_ROOT, "mode": "rw"}, **self.binds},
        )
        created = self.docker.api.create_container(
            self.image, command=["python", "-m", "emulator.runtime.zygote", self.address, *self.user_files], user="0:0",
            name=f"emu-{self.run_id}-zygote", host_config=host_config, labels=self.labels, detach=True,
        )
        self.container = self.docker.containers.get(created["Id"])
        self.container.start()
        self.conn = ZygoteConnection.wait(self.address, READY_TIMEOUT_S, alive=self._alive)
        self._probe()
        return time.monotonic() - started

    def _alive(self) -> bool:
        self.container.reload()
        return self.container.status == "running"

    def _probe(self) -> None:
        created = self.docker.api.create_container(
            self.image, command=HOLD, name=f"emu-{self.run_id}-zygote-probe", user="10001:10001",
            host_config=self.docker.api.create_host_config(network_mode="none", read_only=True, cap_drop=["ALL"],
                                                           security_opt=["no-new-privileges"], cpu_quota=50_000),
            labels=self.labels, stdin_open=True, detach=True,
        )
        probe = self.docker.containers.get(created["Id"])
        try:
            probe.start()
            probe.reload()
            self.enter(probe.attrs["State"]["Pid"], PROBE, [], 10001, 10001)
            code = probe.wait(timeout=PROBE_TIMEOUT_S).get("StatusCode")
            logs = probe.logs().decode(errors="replace")
            if code != 0 or "probe: a device forked from the zygote runs in this container" not in logs:
                raise RuntimeError(f"the probe container ended with code {code}: {logs.strip()[-300:]}")
        finally:
            probe.remove(force=True)

    def enter(self, init_pid: int, module: str, argv: list[str], uid: int, gid: int) -> int:
        """Fork ``module`` into the container whose init has host pid ``init_pid``; the device's pid."""
        if not init_pid:
            raise RuntimeError("the container is not running (no init pid)")
        reply = self.conn.request({"module": module, "container": {
            "pid": int(init_pid), "cgroup_root": CGROUP_ROOT, "uid": uid, "gid": gid, "argv": argv}})
        return int(reply["pid"])

    def logs(self) -> bytes:
        try:
            return self.container.logs(stdout=True, stderr=True) if self.container is not None else b""
        except Exception:  # noqa: BLE001 - already removed
            return b""

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:  # noqa: BLE001 - the run's labelled clean-up removes it too
                pass
            self.container = None
