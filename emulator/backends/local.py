"""The local backend: every device is a plain process on this machine, talking over loopback.

For machines without Docker and for fast tests. CPU quotas are enforced through cgroups
when running as root (else recorded as not enforced); link rate and delay are realised by
each device's in-process shaper; packet loss has no mechanism here and is recorded so.

Devices are forked from a zygote that has imported TensorFlow once (:mod:`emulator.runtime.zygote`),
so they boot in a fraction of a second and share its pages; ``EDGE_EMULATOR_ZYGOTE=0`` starts
each device as a fresh interpreter instead.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from emulator.host import cgroups, procstats
from emulator.host.owner import Owner
from emulator.planning.plan import DevicePlan, LinkPlan
from emulator.backends.base import Backend, Endpoints, RunContext

MODULES = {"server": "paramserver", "worker": "worker", "evaluator": "evaluator"}
PROJECT_ROOT = Path(__file__).resolve().parents[2]


ZYGOTE_ENV = "EDGE_EMULATOR_ZYGOTE"


def zygote_address(run_id: str, pid: int) -> str:
    """The zygote's abstract socket (no file), unique per run and controller process."""
    from emulator.runtime.zygote import abstract_address

    return f"{abstract_address('edge-emulator-zygote', run_id)}-{pid}"


class DeviceProcess:
    """A running device program, whoever forked it: signalled by process group, watched by pidfd."""

    def __init__(self, pid: int, popen: subprocess.Popen | None = None):
        self.pid = pid
        self.popen = popen
        try:
            self._fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._fd = None

    def running(self) -> bool:
        if self.popen is not None and self.popen.poll() is not None:
            return False
        if self._fd is not None:
            return not select.select([self._fd], [], [], 0)[0]
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def signal(self, sig: int) -> None:
        if self.running():
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout_s: float) -> bool:
        """True once the process has exited (reaped by whoever forked it)."""
        deadline = time.monotonic() + timeout_s
        while self.running():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalBackend(Backend):
    name = "local"
    clean_rank = 2

    @classmethod
    def diagnose(cls):
        return [("local links", "info", "rate and delay by the in-process transport shaper; loss: none")]

    def __init__(self, say=None, use_zygote: bool | None = None):
        super().__init__(say)
        self.procs: dict[str, DeviceProcess] = {}
        self.groups: dict[str, cgroups.CpuGroup] = {}
        self.ctx: RunContext | None = None
        self.cgroups_ok, self.cgroups_why = cgroups.available()
        self.use_zygote = os.environ.get(ZYGOTE_ENV, "1") != "0" if use_zygote is None else use_zygote
        self.zygote = None
        self._logs: dict[str, object] = {}

    def prepare(self, ctx, devices):
        self.ctx = ctx
        self.owner = Owner.current()  # names the run's cgroups, so that clean tells a killed run's from a live one's
        servers = [d.name for d in devices if d.role == "server"]
        ports = {name: free_port() for name in servers}
        port = ports[servers[0]]
        checkpoints = Path(ctx.run_dir) / "checkpoint"
        checkpoints.mkdir(exist_ok=True)
        if self.use_zygote:
            from emulator.runtime.zygote import ZygoteClient

            started = time.monotonic()
            address = zygote_address(ctx.run_id, os.getpid())
            self.zygote = ZygoteClient(address, str(Path(ctx.run_dir) / "logs" / "zygote.log"), self._env(), ctx.run_dir,
                                       user_files=[f"{ctx.workload_dir}/{name}" for name in ctx.preload])
            self.say(f"local: TensorFlow loaded once in a zygote ({time.monotonic() - started:.1f}s); devices are forked from it")
        shards = {} if len(servers) == 1 else {name: (("127.0.0.1", p), ("127.0.0.1", p)) for name, p in ports.items()}
        return Endpoints("127.0.0.1", "127.0.0.1", ("127.0.0.1", port), ("127.0.0.1", port), ctx.data_dir, str(checkpoints),
                         ctx.workload_dir, shards)

    def _env(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(PROJECT_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        return env

    def mechanisms(self, device):
        link = device.link
        return {
            "cpus": "cgroup-cfs" if self.cgroups_ok else f"none ({self.cgroups_why})",
            "uplink": "transport-token-bucket" if link.uplink_bps else "unshaped",
            "downlink": "transport-token-bucket" if link.downlink_bps else "unshaped",
            "delay": "transport-delay" if link.delay_s else "unshaped",
            "jitter": "transport-delay" if link.jitter_s else "unshaped",
            "loss": "none (no packet path to drop from on loopback)" if link.loss else "unshaped",
        }

    def transport_link(self, device, link):
        # Every configured property goes to the device's own shaper (run-time changes too).
        return {"uplink_bps": link.uplink_bps, "downlink_bps": link.downlink_bps, "delay_s": link.delay_s, "jitter_s": link.jitter_s}

    def _group(self, device: DevicePlan) -> cgroups.CpuGroup | None:
        if not self.cgroups_ok:
            return None
        group = self.groups.get(device.name)
        if group is None:
            group = cgroups.CpuGroup(self.ctx.run_id, device.name, self.owner)
            group.create()
            self.groups[device.name] = group
        return group

    def start(self, device, config):
        old = self.procs.get(device.name)
        if old is not None and old.running():
            raise RuntimeError(f"{device.name} is already running")
        group = self._group(device)
        if group is not None:
            group.set_cpus(None)  # boot unthrottled; the controller applies the quota once ready
        log_path = Path(self.ctx.run_dir) / "logs" / f"{device.name}.log"
        if self.zygote is not None:
            pid = self.zygote.spawn(device.role, config.to_json(), str(log_path), str(group.path / "cgroup.procs") if group else None)
            self.procs[device.name] = DeviceProcess(pid)
            return
        env = self._env()
        env["EMU_CONFIG"] = json.dumps(config.to_json())
        log = self._logs.get(device.name) or open(log_path, "ab")
        self._logs[device.name] = log

        def enter_group():
            os.setsid()
            if group is not None:
                group.add(os.getpid())

        popen = subprocess.Popen(
            [sys.executable, "-m", f"emulator.runtime.{MODULES[device.role]}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=enter_group, cwd=self.ctx.run_dir,
        )
        self.procs[device.name] = DeviceProcess(popen.pid, popen)

    def _signal(self, device: DevicePlan, sig: int) -> None:
        proc = self.procs.get(device.name)
        if proc is not None:
            proc.signal(sig)

    def kill(self, device):
        self._signal(device, signal.SIGCONT)  # a stopped process dies the same
        self._signal(device, signal.SIGKILL)
        proc = self.procs.get(device.name)
        if proc is not None:
            proc.wait(10)

    def pause(self, device):
        self._signal(device, signal.SIGSTOP)

    def resume(self, device):
        self._signal(device, signal.SIGCONT)

    def set_cpus(self, device, cpus):
        group = self._group(device)
        if group is not None:
            group.set_cpus(cpus)

    def cpu_quota(self, device):
        group = self.groups.get(device.name)
        return None if group is None else group.cpus()

    def set_link(self, device, link: LinkPlan):
        pass  # everything is in the transport

    def partition(self, device, cut):
        return False

    def alive(self, device):
        proc = self.procs.get(device.name)
        return proc is not None and proc.running()

    def sample(self):
        out = []
        for name, proc in self.procs.items():
            if not proc.running():
                continue
            record = {"device": name, "cpu_s": procstats.cpu_seconds(proc.pid)}
            record.update(procstats.memory(proc.pid) or {})
            out.append(record)
        return out

    def teardown(self):
        for proc in self.procs.values():
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            if not proc.wait(max(0.1, deadline - time.monotonic())):
                proc.signal(signal.SIGKILL)
                proc.wait(5)
            if proc.popen is not None:
                proc.popen.wait(timeout=5)
            proc.close()
        if self.zygote is not None:
            self.zygote.close()
            self.zygote = None
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        if self.ctx is not None and self.groups:
            cgroups.remove_group(cgroups.run_path(self.ctx.run_id, self.owner))
            self.groups.clear()
