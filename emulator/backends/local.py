"""The local backend: every device is a plain process on this machine, talking over loopback.

For machines without Docker and for fast tests. CPU quotas are enforced through cgroups
when running as root (else recorded as not enforced); link rate and delay are realised by
each device's in-process shaper; packet loss has no mechanism here and is recorded so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .. import cgroups, procstats
from ..plan import DevicePlan, LinkPlan
from .base import Backend, Endpoints, RunContext

MODULES = {"server": "paramserver", "worker": "worker", "evaluator": "evaluator"}
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalBackend(Backend):
    name = "local"

    def __init__(self, say=None):
        super().__init__(say)
        self.procs: dict[str, subprocess.Popen] = {}
        self.groups: dict[str, cgroups.CpuGroup] = {}
        self.ctx: RunContext | None = None
        self.cgroups_ok, self.cgroups_why = cgroups.available()
        self._logs: dict[str, object] = {}

    def prepare(self, ctx, devices):
        self.ctx = ctx
        port = free_port()
        checkpoints = Path(ctx.run_dir) / "checkpoint"
        checkpoints.mkdir(exist_ok=True)
        return Endpoints("127.0.0.1", "127.0.0.1", ("127.0.0.1", port), ("127.0.0.1", port), ctx.data_dir, str(checkpoints))

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
            group = cgroups.CpuGroup(self.ctx.run_id, device.name)
            group.create()
            self.groups[device.name] = group
        return group

    def start(self, device, config):
        old = self.procs.get(device.name)
        if old is not None and old.poll() is None:
            raise RuntimeError(f"{device.name} is already running")
        group = self._group(device)
        if group is not None:
            group.set_cpus(None)  # boot unthrottled; the controller applies the quota once ready
        env = dict(os.environ)
        env["EMU_CONFIG"] = json.dumps(config)
        env["PYTHONPATH"] = str(PROJECT_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        log = open(Path(self.ctx.run_dir) / "logs" / f"{device.name}.log", "ab")
        self._logs[device.name] = log

        def enter_group():
            os.setsid()
            if group is not None:
                group.add(os.getpid())

        self.procs[device.name] = subprocess.Popen(
            [sys.executable, "-m", f"emulator.runtime.{MODULES[device.role]}"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=enter_group, cwd=self.ctx.run_dir,
        )

    def _signal(self, device: DevicePlan, sig: int) -> None:
        proc = self.procs.get(device.name)
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, device):
        self._signal(device, signal.SIGCONT)  # a stopped process dies the same
        self._signal(device, signal.SIGKILL)
        proc = self.procs.get(device.name)
        if proc is not None:
            proc.wait(timeout=10)

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
        return proc is not None and proc.poll() is None

    def exit_code(self, device) -> int | None:
        proc = self.procs.get(device.name)
        return None if proc is None else proc.poll()

    def sample(self):
        out = []
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                continue
            record = {"device": name, "cpu_s": procstats.cpu_seconds(proc.pid)}
            record.update(procstats.memory(proc.pid) or {})
            out.append(record)
        return out

    def teardown(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        if self.ctx is not None and self.groups:
            cgroups.remove_tree(self.ctx.run_id)
            self.groups.clear()
