"""One emulated training run, start to finish: plan in, run directory out.

The controller prepares the data shards, asks the backend for the devices, starts the
collector that receives every trace, checks fidelity (link probes, CPU shares), then lets the
fault injector (:mod:`emulator.control.faults`) walk the plan's timeline and its training-aware
triggers while it shows progress (:mod:`emulator.control.runstate`: what the traces said so far). It
stops at ``max_updates`` (the server says so) or ``duration`` (it tells the server), waits for
the evaluator's final accuracy, and always tears everything down, also on Ctrl-C and errors;
``summary.json`` comes from :func:`emulator.control.summary.summarize`.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from emulator import datasets
from emulator.control import fidelity, workload
from emulator.backends import Backend, Endpoints, RunContext
from emulator.control.collector import Collector
from emulator.control.faults import Devices, FaultInjector
from emulator.planning.plan import DevicePlan, Plan
from emulator.control.rundir import RunDirectory, read_jsonl
from emulator.control.runstate import LiveState, Progress
from emulator.planning.workload import user_files
from emulator.runtime.config import CheckpointConfig, DeviceConfig, EvaluatorConfig, LinkConfig, ServerConfig, WorkerConfig
from emulator.control.summary import RunFacts, summarize
from emulator.planning.units import format_duration

FINAL_EVAL_TIMEOUT_S = 300.0
BOOT_TIMEOUT_S = 600.0
BOOT_STALL_S = 60.0  # a boot this long without a device becoming ready names the ones it waits for
TICK_S = 0.1
PROBE_BATCH = 16


class FidelityError(RuntimeError):
    """The emulation measurably differs from the plan and the run was asked to be strict."""


def cache_dir() -> Path:
    return Path(os.environ.get("EDGE_EMULATOR_CACHE", Path.home() / ".cache" / "edge-emulator"))


class Emulation:
    """Run one plan on one backend; :meth:`run` returns the summary written to ``summary.json``."""

    def __init__(self, plan: Plan, backend: Backend, rundir: RunDirectory, *, scenario_text: str = "", resolved: dict | None = None, say: Callable[[str], None] | None = None, progress_every_s: float = 2.0, strict: bool = False, check_fidelity: bool = True, tolerance: float = 0.10):
        self.plan = plan
        self.backend = backend
        self.rundir = rundir
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.progress_every_s = progress_every_s
        self.strict = strict
        self.fidelity = check_fidelity
        self.tolerance = tolerance
        self.state = LiveState(counting=plan.servers[0].name, servers={s.name: Counter() for s in plan.servers} if len(plan.servers) > 1 else {})
        self.token = secrets.token_bytes(16)
        self.devices = Devices.of(plan)  # links, CPU shares, incarnations and who is down, as faults change them
        self.faults = FaultInjector(plan, backend, self.devices, config=self._config, send=self._send, record=self.event)
        self.collector: Collector | None = None
        self.endpoints: Endpoints | None = None
        self.start_time = 0.0  # the trace clock: ts = seconds since this instant
        self.training_start = None  # trace-clock time at which training started
        self.training_end = None  # seconds of training when the server said done
        self.status = "created"
        self._quotas_on = False  # CPU quotas are applied after the link probes, before training
        self.net_last: dict[str, dict] = {}  # latest interface counters per device
        self.net_marks: dict[str, dict[str, dict]] = {}  # counters at training start and end
        self.payload_at_end: int | None = None  # the server's payload count when the end mark was taken
        self.egress_at_end: tuple[int, int] | None = None  # ... and its egress and downlink counts
        rundir.write_text("scenario.yaml", scenario_text)
        if resolved is not None:
            rundir.write_json("scenario.resolved.json", resolved)
        rundir.write_text("plan.json", plan.dumps())

    # -- helpers -------------------------------------------------------------------------

    def now(self) -> float:
        """Seconds on the trace clock (since the controller started the run)."""
        return time.time() - self.start_time

    def training_time(self) -> float:
        """Seconds since training started: the clock of the fault timeline and of duration."""
        return self.now() - self.training_start if self.training_start is not None else 0.0

    def event(self, kind: str, **fields) -> None:
        record = {"ts": round(self.now(), 4), "source": "controller", "kind": kind, **fields}
        if self.collector is not None:
            self.collector.emit("events", [record])
        else:
            self.rundir.append("events", [record])

    def _config(self, device: DevicePlan) -> DeviceConfig:
        """The configuration a device program reads at start (its role's class in :mod:`emulator.runtime.config`)."""
        ep, plan = self.endpoints, self.plan
        common = {"name": device.name, "token": self.token.hex(), "start_time": self.start_time,
                  "collector": (ep.collector_host, self.collector.address[1])}
        transport = LinkConfig(**self.backend.transport_link(device, self.devices.links[device.name]))
        sharded = len(plan.servers) > 1
        if device.role == "server":
            ckpt = plan.checkpoint
            checkpoint = CheckpointConfig(dir=ep.checkpoint_dir + (f"/{device.name}" if sharded else ""),
                                          every_updates=ckpt.get("every_updates"),
                                          every_s=ckpt.get("every")) if ckpt.get("enabled") else None
            shard = {"partition": plan.partition, "shard": device.index} if sharded else {}
            return ServerConfig(**common, seed=plan.seed, bind=ep.bind_of(device.name), layout=self.layout.to_json(),
                                rule=self.bundle.device_reference(plan.method.rule, ep.workload_dir),
                                learning_rate=plan.method.server_step_size(plan.training["learning_rate"]),
                                max_updates=plan.training["max_updates"],
                                aggregation=self.bundle.device_reference(plan.method.aggregation["name"], ep.workload_dir),
                                aggregation_params=dict(plan.method.aggregation["params"]),
                                transport=transport, checkpoint=checkpoint, initial=f"{ep.workload_dir}/{workload.INITIAL}",
                                **shard)
        servers = {"servers": [list(ep.address_of(s.name)) for s in plan.servers], "partition": plan.partition} if sharded else {}
        client = {**common, **servers, "ps": ep.address_of(plan.servers[0].name), "cpus": self.devices.cpus[device.name],
                  "model": self.bundle.device_reference(plan.model["name"], ep.workload_dir),
                  "model_args": dict(plan.model["args"]), "model_output": plan.model["output"], "classes": self.shards.classes}
        if device.role == "worker":
            incarnation = self.devices.incarnation.get(device.name, 0)
            return WorkerConfig(**client, worker=device.index, incarnation=incarnation,
                                seed=(device.seed + 7919 * incarnation) & 0x7FFFFFFF,
                                shard=f"{ep.data_dir}/{Path(self.shards.shards[device.index]).name}",
                                batch_size=plan.training["batch_size"], transport=transport,
                                method=plan.method.worker_config(self.bundle.device_reference(plan.method.compressor, ep.workload_dir),
                                                     plan.training["learning_rate"]))
        every = plan.training["eval_every"]
        return EvaluatorConfig(**client, test_set=f"{ep.data_dir}/{Path(self.shards.test_set).name}",
                               eval_every_s=every.get("seconds"), eval_every_updates=every.get("updates"))

    def _to_servers(self, command: dict) -> None:
        for server in self.plan.servers:
            self.collector.send(server.name, command)

    def _send(self, device: str, command: dict) -> None:
        self.collector.send(device, command)  # through a method: the collector starts with the run

    # -- the run -------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Everything before the devices start: the data shards, the model's layout, the backend's
        network and endpoints, the collector."""
        self.shards = datasets.prepare_shards(self.plan.dataset, len(self.plan.workers), seed=self.plan.seed,
                                              cache_dir=cache_dir() / "data")
        model = workload.model_of(self.plan)  # a user's was built and checked before the run (run.run_scenario)
        self.layout = model.layout(self.shards.input_shape, self.shards.classes)
        # the user's files the data came from, each with its sha256 (data files are recorded, not copied)
        self.rundir.write_json("data.json", {**self.shards.to_json(), "files": datasets.provenance(self.plan.dataset)})
        self.bundle = workload.write(self.rundir.path, user_files(self.plan), model.initial_values(self.layout, self.plan.seed))
        ctx = RunContext(self.rundir.run_id, str(self.rundir.path), self.shards.directory, self.start_time,
                         workload_dir=self.bundle.host_dir, preload=self.bundle.preload)
        self.endpoints = self.backend.prepare(ctx, self.plan.devices)
        self.collector = Collector(self.rundir, self.token, self.endpoints.collector_bind, clock=self.now).start()
        self.collector.observe(self.state.observe)
        mechanisms = {d.name: self.backend.mechanisms(d) for d in self.plan.devices}
        self.rundir.write_json("mechanisms.json", mechanisms)
        for line in unemulated(mechanisms, self.backend.name):
            self.say(line)
        self.event("run_started", run_id=self.rundir.run_id, backend=self.backend.name, dataset=self.shards.source,
                   parameters=self.layout.total, workers=len(self.plan.workers))
        self.say(f"run {self.rundir.run_id}: {len(self.plan.workers)} workers, method {self.plan.method.label}, "
                 f"{self.shards.dataset} ({self.shards.source}), backend {self.backend.name}")

    def _start_devices(self) -> None:
        started = time.monotonic()
        self.backend.start_many([(d, self._config(d)) for d in self.plan.devices])
        for device in self.plan.devices:
            self.backend.set_link(device, device.link)
        self.event("devices_started", count=len(self.plan.devices), start_s=round(time.monotonic() - started, 3))

    def _throttle_ready(self) -> None:
        """Devices boot unthrottled; once the run's quotas are on (after the link probes), a
        device that reports ready (a restart) gets its quota at once."""
        if not self._quotas_on:
            return
        with self.state.lock:
            names, self.state.newly_ready = self.state.newly_ready, []
        for name in names:
            try:
                device = self.plan.device(name)
            except KeyError:
                continue
            if device.name not in self.devices.down:
                self.backend.set_cpus(device, self.devices.cpus[device.name])
                if device.role == "server" and self.training_start is not None:
                    self.collector.send(device.name, {"cmd": "start"})  # a restarted server resumes

    def _probe(self, batches: list[list[DevicePlan]], command, key: str, timeout_s: float) -> None:
        """Send probe commands batch by batch; wait for each batch's ``key`` measurement."""
        for batch in batches:
            for device in batch:
                self.collector.send(device.name, command(device))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                with self.state.lock:
                    answered = [self.state.probes.get(d.name, {}) for d in batch]
                if all(key in a or "probe_error" in a for a in answered):
                    break
                time.sleep(TICK_S)

    def _quotas(self) -> None:
        """Every device gets its CPU quota (links are probed before, so a throttled receiver
        cannot be mistaken for a slow link)."""
        self._quotas_on = True
        with self.state.lock:
            self.state.newly_ready = []
        for device in self.plan.devices:
            if device.name not in self.devices.down:
                self.backend.set_cpus(device, self.devices.cpus[device.name])

    def _probe_links(self) -> None:
        for server, batch in fidelity.link_probe_plan(self.plan, PROBE_BATCH):
            self._probe([batch], lambda d, server=server: fidelity.probe_request(d, server, 0.0), "rtt_s", 120.0)

    def _check_fidelity(self, started: float) -> None:
        """Measure every worker's CPU share under its quota, read back every quota, and compare
        them and the link probes' results with the plan."""
        cpu_batches = fidelity.cpu_probe_batches(list(self.plan.workers), max(0.5, 0.75 * (os.cpu_count() or 1)))
        self._probe(cpu_batches, lambda d: {"cmd": "probe", "cpu_s": 1.0}, "cpu_share", 30.0)
        quotas = {d.name: self.backend.cpu_quota(d) for d in self.plan.devices}
        with self.state.lock:
            measured = {name: dict(values) for name, values in self.state.probes.items()}
        mechanisms = {d.name: self.backend.mechanisms(d) for d in self.plan.devices}
        report = fidelity.compare(self.plan, measured, quotas, self.tolerance, mechanisms)
        report["seconds"] = round(time.monotonic() - started, 3)
        report["mechanisms"] = mechanisms
        self.rundir.write_json("fidelity.json", report)
        problems = fidelity.describe(report)
        self.event("fidelity_checked", ok=report["ok"], failures=len(problems), seconds=report["seconds"])
        if problems:
            self.say(f"fidelity: {len(problems)} propert{'y' if len(problems) == 1 else 'ies'} off by more than {self.tolerance:.0%}:")
            for line in problems[:20]:
                self.say(f"  {line}")
            if self.strict:
                raise FidelityError(f"fidelity check failed (--strict): {'; '.join(problems[:5])}")
        else:
            self.say(f"fidelity: every measured property within {self.tolerance:.0%} ({report['seconds']:.1f}s)")

    def _last_error(self, device: str) -> str:
        time.sleep(0.5)  # its error event may still be on its way
        with self.state.lock:
            errors = [e for e in self.state.errors if e.get("source") == device]
        return f" ({errors[-1].get('reason')}: {errors[-1].get('detail')})" if errors else ""

    def _stalled(self, missing: list[str], seconds: float, shown: int = 4, lines: int = 3) -> str:
        """Which devices a boot waits for and the last lines of their logs."""
        out = [f"[boot {format_duration(self.now()):>6}] no device became ready for {seconds:.0f}s; still waiting for "
               f"{len(missing)}: {', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''} (gives up after {BOOT_TIMEOUT_S:g}s)"]
        for name in missing[:shown]:
            path = self.rundir.path / "logs" / f"{name}.log"
            try:
                tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
            except OSError:
                tail = []
            out.append(f"  logs/{name}.log: " + (" | ".join(line.strip() for line in tail) if tail else "(empty so far)"))
        return "\n".join(out)

    def _boot(self) -> None:
        """Wait until every device is ready, then start training (the timeline's time zero)."""
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        names = {d.name for d in self.plan.devices}
        last_say = 0.0
        progress_at, ready_before = time.monotonic(), -1
        while True:
            self._throttle_ready()
            with self.state.lock:
                missing = sorted(names - self.state.ready)
            if not missing:
                break
            if len(names) - len(missing) != ready_before:
                progress_at, ready_before = time.monotonic(), len(names) - len(missing)
            elif time.monotonic() - progress_at >= BOOT_STALL_S:  # said whatever the progress setting, once a stall
                self.say(self._stalled(missing, time.monotonic() - progress_at))
                progress_at = time.monotonic()
            for name in missing:
                if not self.backend.alive(self.plan.device(name)):
                    raise RuntimeError(f"{name} exited while starting{self._last_error(name)}; see logs/{name}.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready after {BOOT_TIMEOUT_S:g}s: {', '.join(missing)}")
            if self.progress_every_s and time.monotonic() - last_say > 5:
                self.say(f"[boot {format_duration(self.now()):>6}] {len(names) - len(missing)}/{len(names)} devices ready")
                last_say = time.monotonic()
            time.sleep(TICK_S)
        probed = time.monotonic()
        if self.fidelity:
            self._probe_links()
        self._quotas()
        if self.fidelity:
            self._check_fidelity(probed)
        self._sample()
        self.net_marks["start"] = dict(self.net_last)
        self._to_servers({"cmd": "start"})
        if not self.state.training_started.wait(30):
            raise RuntimeError("the parameter server did not acknowledge the start")
        # The server's own reading of the start, not when we heard of it (telemetry is batched).
        self.training_start = self.state.server_started_ts if self.state.server_started_ts is not None else self.now()
        self.event("training_started", boot_s=round(self.training_start, 3))

    def _sample(self) -> None:
        samples = self.backend.sample()
        if samples:
            ts = round(self.now(), 3)
            net = [s for s in samples if "rx_bytes" in s]
            stats = [s for s in samples if "rx_bytes" not in s]
            if stats:
                self.collector.emit("stats", [{"ts": ts, **s} for s in stats])
            if net:
                self.collector.emit("net", [{"ts": ts, **s} for s in net])
                self.net_last.update({s["device"]: s for s in net})

    def _loop(self) -> str:
        duration = self.plan.training["duration"]
        progress = Progress(self.plan.training["max_updates"], duration, len(self.plan.workers))
        next_progress = next_sample = 0.0
        stop_sent = False
        servers = {s.name for s in self.plan.servers}
        down = self.devices.down
        while True:
            self._throttle_ready()
            now = self.training_time()
            self.faults.advance(now, self.state.pushes_of)
            if now >= next_sample:
                self._sample()
                next_sample = now + 1.0
            if self.progress_every_s and now >= next_progress:
                self.say(progress.line(now, self.state, len(self.plan.workers) - len(down - servers)))
                next_progress = now + self.progress_every_s
            if self.state.done.is_set():
                return self.state.done_reason or "done"
            if duration and now >= duration and not stop_sent:
                self._to_servers({"cmd": "stop"})
                stop_sent = True
            for server in self.plan.servers:
                if server.name not in down and not self.backend.alive(server):
                    which = "" if len(servers) == 1 else f" {server.name}"
                    raise RuntimeError(f"the parameter server{which} exited unexpectedly{self._last_error(server.name)}; "
                                       f"see logs/{server.name}.log")
            if not self.backend.alive(self.plan.evaluator) and self.state.final_accuracy is None:
                raise RuntimeError(f"the evaluator exited unexpectedly{self._last_error('evaluator')}; see logs/evaluator.log")
            if len(down - servers) == len(self.plan.workers) and not self.faults.restart_ahead:
                self._to_servers({"cmd": "stop"})
                stop_sent = True
            time.sleep(TICK_S)

    def _await_final(self) -> None:
        deadline = time.monotonic() + FINAL_EVAL_TIMEOUT_S
        while self.state.final_accuracy is None and time.monotonic() < deadline:
            if not self.backend.alive(self.plan.evaluator):
                time.sleep(0.5)  # its last traces may still be in flight
                break
            time.sleep(TICK_S)

    def run(self) -> dict:
        """Run to the end; the summary is written even when the run fails or is interrupted."""
        self.start_time = time.time()
        error = None
        previous_term = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        if previous_term is not None:
            signal.signal(signal.SIGTERM, functools.partial(_raise_interrupt, os.getpid()))
        try:
            self.status = "preparing"
            self._prepare()
            self.status = "booting"
            self._start_devices()
            self._boot()
            self.status = "running"
            reason = self._loop()
            self.training_end = self.training_time()
            self.event("training_done", reason=reason, updates=self.state.updates, training_s=round(self.training_end, 3))
            # One window for both counters: the payload the server counted up to its flush at the
            # end of training, and the interface read right after it. Every counted frame crossed
            # the interface before the flush; pushes still in flight then (late ones, refused)
            # are partly on the wire and not in the payload, so the wire can only be larger.
            self.state.server_done_flushed.wait(5.0)
            self._sample()
            self.net_marks["end"] = dict(self.net_last)
            self.payload_at_end = self.state.ingress_bytes
            self.egress_at_end = (self.state.egress_bytes, self.state.downlink_bytes)
            self._await_final()
            self.status = "completed"
        except KeyboardInterrupt:
            self.status = "interrupted"
            self.say("interrupted: tearing down")
        except Exception as exc:  # noqa: BLE001 - recorded, re-raised after teardown
            self.status = "failed"
            error = exc
        finally:
            try:
                self.backend.teardown()
            finally:
                if self.collector is not None:
                    time.sleep(0.3)
                    self.collector.close()
                summary = self.summary(error)
                self.rundir.write_json("summary.json", summary)
                self.rundir.close()
                if previous_term is not None:
                    signal.signal(signal.SIGTERM, previous_term)
        if error is not None:
            raise error
        return summary

    def summary(self, error: Exception | None = None) -> dict:
        layout, shards = getattr(self, "layout", None), getattr(self, "shards", None)
        facts = RunFacts(
            run_id=self.rundir.run_id, name=self.plan.name, status=self.status, backend=self.backend.name,
            method=self.plan.method.label, rule=self.plan.method.rule, compressor=self.plan.method.compressor,
            workers=len(self.plan.workers), seed=self.plan.seed, plan_digest=self.plan.digest(),
            duration_s=self.training_end if self.training_end is not None else self.training_time(),
            error=None if error is None else f"{type(error).__name__}: {error}",
            classes=getattr(shards, "classes", None), parameters=getattr(layout, "total", None),
            dataset=getattr(shards, "source", None), training_started_ts=self.training_start,
            payload_at_end=self.payload_at_end, egress_at_end=self.egress_at_end, net_marks=self.net_marks,
        )
        return summarize(self.state, read_jsonl(self.rundir.path / "events.jsonl"),
                         read_jsonl(self.rundir.path / "rejections.jsonl"), facts,
                         read_jsonl(self.rundir.path / "rounds.jsonl"))


def unemulated(mechanisms: dict[str, dict[str, str]], backend: str) -> list[str]:
    """A warning per configured property that nothing on this backend realises (its mechanism
    ``none ...``; ``unshaped`` is a property not configured), naming the devices."""
    missing: dict[tuple[str, str], list[str]] = {}
    for device, props in mechanisms.items():
        for prop, mechanism in props.items():
            if isinstance(mechanism, str) and mechanism.startswith("none"):
                missing.setdefault((prop, mechanism), []).append(device)
    lines = []
    for (prop, mechanism), devices in sorted(missing.items()):
        shown = ", ".join(devices[:4]) + (f" and {len(devices) - 4} more" if len(devices) > 4 else "")
        why = mechanism.partition("(")[2].rstrip(")") or "no mechanism here"
        lines.append(f"warning: the {backend} backend cannot emulate {prop} here ({why}): {shown} run without it (mechanisms.json)")
    return lines


def _raise_interrupt(controller_pid: int, signum, frame):
    """SIGTERM as Ctrl-C in the process that runs the emulation (it may itself be a child a sweep
    forked, so its pid is the one it had when the run started, not at import)."""
    if os.getpid() != controller_pid:
        os._exit(128 + signum)  # a forked child (a library's helper) must not run our teardown
    raise KeyboardInterrupt


__all__ = ["Emulation", "FidelityError", "cache_dir"]
