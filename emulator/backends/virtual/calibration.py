"""How long the real work takes on this machine: the virtual backend's time per unit of work.

A calibration is measured, never assumed: the CPU seconds of one gradient for a model and batch
size (the real compiled TensorFlow step, one thread, as a device with a quota below one core
runs it), of one compression and encoding per compressor, and of the server's decode, apply
and reply per rule and pull mode (the real :class:`~emulator.runtime.paramserver.ParameterServer`).
Each entry keeps its samples' median and spread and where it came from (host, CPU model, library
versions, date, the command). The quota's period (CFS) and the TCP model are parameters of
:mod:`.timing`, recorded here so a run says every number its clock used.

Entries are stored by key in one JSON file (``emulate calibrate`` writes it; a virtual run
that finds no entry for its scenario measures one and adds it); a run copies the entries it
used into its directory as ``calibration.json``, with their digest in ``summary.json``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emulator.backends.virtual import timing

VERSION = 1
SERVER_FIELDS = ("cpu_s", "pull_cpu_s", "receive_cpu_s_per_byte")  # a server entry without one is measured again


@dataclass(frozen=True)
class Keys:
    """The calibration entries one scenario needs."""

    step: str  # model, input shape, classes, batch size
    compress: str  # compressor, its parameters, error feedback, wire format, model
    server: str  # rule, pull mode, compressor key (what the server decodes)

    @property
    def loop(self) -> str:
        """The worker loop's CPU beyond its measured parts: measured in containers (:func:`loop_from_run`), optional."""
        return f"loop|{self.server}|batch={self.step.rsplit('batch=', 1)[-1]}"

    def all(self) -> tuple[str, str, str]:
        """The entries every virtual run needs (measured in process at first use)."""
        return (self.step, self.compress, self.server)


def keys_of(plan, input_shape, classes: int) -> Keys:
    m = plan.method
    model = f"{plan.model['name']}{json.dumps(plan.model.get('args') or {}, sort_keys=True)}|in={list(input_shape)}|classes={classes}"
    step = f"step|{model}|batch={plan.training['batch_size']}"
    compress = (f"compress|{m.compressor}{json.dumps(dict(m.params), sort_keys=True)}|ef={m.error_feedback}"
                f"|wire={json.dumps(dict(m.wire), sort_keys=True)}|{model}")
    server = f"server|{m.rule}|pull={json.dumps(dict(m.pull), sort_keys=True)}|{compress}"
    return Keys(step, compress, server)


def provenance(command: str) -> dict:
    """Where and with what a measurement was made."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    import tensorflow as tf

    return {"host": platform.node(), "cpu_model": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "tensorflow": tf.__version__, "numpy": np.__version__, "commit": commit, "command": command,
            "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def _stats(samples: list[float]) -> dict:
    ordered = sorted(samples)
    q = lambda f: ordered[min(len(ordered) - 1, int(f * len(ordered)))]  # noqa: E731
    return {"cpu_s": statistics.median(ordered), "p10_s": q(0.1), "p90_s": q(0.9), "samples": len(ordered)}


def model_constants() -> dict:
    """The clock's parameters that are not measured per scenario, recorded with every run."""
    return {"cfs_period_s": timing.CFS_PERIOD_S, "cfs_period_source": "Linux default cpu.cfs_period_us = 100000 (Docker --cpus)",
            "tcp_mss_bytes": timing.MSS, "wire_overhead": round(timing.WIRE_OVERHEAD, 6),
            "loss_model": "Mathis: MSS/RTT*sqrt(3/2)/sqrt(p)", "threads_per_device": 1}


def server_config(plan, layout, rule: str | None = None):
    """The in-process server's configuration: the run's rule, rate and seed; no socket, no checkpoint."""
    from emulator.runtime.config import LinkConfig, ServerConfig

    return ServerConfig(name="server", token="00" * 16, start_time=0.0, collector=None, seed=plan.seed,
                        bind=("127.0.0.1", 0), layout=layout.to_json(), rule=rule or plan.method.rule,
                        learning_rate=plan.training["learning_rate"], max_updates=plan.training["max_updates"],
                        transport=LinkConfig(), checkpoint=None, initial=None)


def measure(plan, layout, model, x, y, keys: Keys, repeat: int = 30, command: str = "") -> dict:
    """Measure the entries of ``keys`` with the real code: ``model`` a TFModel, ``x, y`` a worker's shard."""
    from compression.layout import Layout  # noqa: F401 - the layout object is the caller's

    from emulator.backends.virtual.telemetry import VirtualTelemetry
    from emulator.runtime import paramserver, protocol
    from emulator.runtime.data import BatchSampler
    from emulator.runtime.downlink import parse_hello
    from emulator.runtime.models import initial_parameters
    from emulator.runtime.worker import build_compressor, push_body

    origin = provenance(command)
    params = initial_parameters(layout, plan.seed)
    sampler = BatchSampler(x, y, plan.training["batch_size"], plan.seed)
    model.warm_up(params, *sampler.next())
    steps, grads = [], []
    for _ in range(repeat + 3):
        xb, yb = sampler.next()
        c0 = time.process_time()
        _, grad = model.gradient(params, xb, yb)
        steps.append(time.process_time() - c0)
        grads.append(grad)
    steps = steps[3:]  # the first calls still allocate
    method = plan.method.worker_config(learning_rate=plan.training["learning_rate"])
    compressor, wire = build_compressor(method, layout, plan.seed)
    splits = np.array(layout.offsets[1:])
    compress, messages = [], []
    for grad in grads:
        c0 = time.process_time()
        message, flags = push_body(compressor, np.split(grad, splits), layout, wire)
        compress.append(time.process_time() - c0)
        messages.append((message, flags))
    compress = compress[3:]
    server = paramserver.ParameterServer(server_config(plan, layout), VirtualTelemetry(lambda: 0.0, lambda s, r: None, "server"))
    server.max_updates = None
    server.training.set()
    holding = parse_hello(method.pull.hello())
    serve = []
    for message, flags in messages:
        c0 = time.process_time()
        server.push(0, server.version, memoryview(message), protocol.HEADER.size + len(message), flags)
        server.pull(0, holding)
        serve.append(time.process_time() - c0)
    serve = serve[3:]
    pulls = []
    for _ in range(repeat):
        c0 = time.process_time()
        server.pull(1, parse_hello(method.pull.hello()))
        pulls.append(time.process_time() - c0)
    receive = measure_receive(server, layout, method, messages[3:])
    return {
        keys.step: {**_stats(steps), "what": "one gradient (TFModel.gradient), CPU seconds, one thread", "provenance": origin},
        keys.compress: {**_stats(compress), "what": "compress + encode one gradient (worker.push_body), CPU seconds",
                        "mean_bytes": int(np.mean([len(m) for m, _ in messages])), "provenance": origin},
        keys.server: {**_stats(serve), "what": "decode + apply one update and build its reply (ParameterServer.push + pull), CPU seconds",
                      "pull_cpu_s": statistics.median(pulls), **receive, "provenance": origin},
    }


def measure_receive(server, layout, method, messages) -> dict:
    """A worker's CPU to take the server's reply: read the frame from a socket (the real
    :class:`~emulator.runtime.transport.Channel`, its checks included) and apply it to its copy of the
    model (:class:`~emulator.runtime.downlink.ModelCopy`), as a worker does before its next step.
    Under a CPU quota this spends the period's budget like the step does: without it, the virtual
    worker's compression ran 0.6 ms where Docker's took 4.1 ms of wall time (docs/VIRTUAL_TIME.md).
    Kept per byte of reply (the replies of a delta pull vary in size), with the whole-reply median."""
    import socket
    import threading

    from emulator.backends.virtual.sim import FrameChannel
    from emulator.runtime import protocol
    from emulator.runtime.downlink import ModelCopy, parse_hello
    from emulator.runtime.transport import Channel

    token = bytes(16)
    frames = []
    holding = parse_hello(method.pull.hello())
    for message, flags in messages:  # replies as the worker of the measurement gets them, pushing as it goes
        server.push(2, server.version, memoryview(message), protocol.HEADER.size + len(message), flags)
        out = FrameChannel()
        server.send_model(out, 2, holding)
        frames.append(out.take())
    a, b = socket.socketpair()
    sender, receiver = Channel(a, token, max_body=layout.total * 4 + 4096), Channel(b, token, max_body=layout.total * 4 + 4096)

    def send_all():
        for kind, body, t0, flags in frames:
            sender.send(kind, body, t0=t0, flags=flags)

    thread = threading.Thread(target=send_all, daemon=True)
    copy, costs, sizes = ModelCopy(layout), [], []
    thread.start()
    try:
        for _ in frames:
            c0 = time.thread_time()  # this thread only: the sender's CPU is not the worker's
            header, body = receiver.recv(keep_buffer=True)
            copy.receive(header.t0, header.flags, body)
            costs.append(time.thread_time() - c0)
            sizes.append(protocol.HEADER.size + header.length)
    finally:
        thread.join(timeout=30)
        sender.close()
        receiver.close()
    per_byte = [c / n for c, n in zip(costs, sizes)]
    return {"receive_cpu_s": statistics.median(costs), "receive_cpu_s_per_byte": statistics.median(per_byte),
            "receive_mean_bytes": int(np.mean(sizes))}


def loop_from_run(container: tuple[dict, dict], entries: dict, keys: Keys) -> dict:
    """A worker's CPU per step as the containers of a run of the scenario measured it (Docker or
    Swarm). ``container``: ``(run, workers)`` as :func:`analysis.runs.container_usage` reads a run
    directory: per worker its cgroup CPU seconds during training, its steps, the bytes it pulled,
    and its gradient's and compression's CPU from its own step records. The rest of its CPU per step,
    less the reading of its replies (``entries``' per-byte cost), is the loop's own: framing, socket
    calls, telemetry. A virtual run that finds this entry charges the containers' gradient and
    compression and this rest (medians over the run's workers), not the in-process measurements,
    which move by 30 % or more between sittings on a shared machine (a gradient measured 5.0, then
    7.8 ms within minutes) and leave the loop out; each worker's figures are kept."""
    run, usage = container
    if run.get("backend") not in ("docker", "swarm"):
        raise ValueError(f"{run.get('run')}: a {run.get('backend')} run has no containers' CPU counters (run the scenario on docker)")
    per_byte = entries[keys.server]["receive_cpu_s_per_byte"]
    workers = {}
    for name, u in usage.items():
        if u["steps"] < 20:
            continue
        per_step, pulled = u["cpu_s"] / u["steps"], u["pull_bytes"] / u["steps"]
        gradient, compress = u["compute_cpu_ms"] / 1000, u["compress_cpu_ms"] / 1000
        workers[name] = {"cpu_per_step_s": round(per_step, 6), "steps": u["steps"], "pull_bytes_per_step": round(pulled, 1),
                         "gradient_s": round(gradient, 6), "compress_s": round(compress, 6),
                         "loop_s": round(per_step - gradient - compress - per_byte * pulled, 6)}
    if not workers:
        raise ValueError(f"{run.get('run')}: no worker with 20 steps and two CPU samples during training")
    origin = {**provenance(f"emulate calibrate --from-run {run.get('run')}"), **{f"run_{k}" if k != "run" else k: v for k, v in run.items()},
              "workers": workers, "receive_s_per_byte": per_byte}
    median = lambda key: statistics.median(w[key] for w in workers.values())  # noqa: E731
    return {keys.loop: {**_stats([w["loop_s"] for w in workers.values()]), "step_cpu_s": median("gradient_s"),
                        "compress_cpu_s": median("compress_s"),
                        "what": "in containers: a worker's gradient and compression CPU (its step records) and the rest of "
                                "its CPU per step beyond reading the reply (cgroup CPU over steps), CPU seconds",
                        "provenance": origin}}


class Store:
    """The calibration file: entries by key, read and merged, written atomically."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except ValueError as exc:
                raise ValueError(f"{self.path}: not a calibration file ({exc})") from None
            if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("entries"), dict):
                raise ValueError(f"{self.path}: not a calibration file of version {VERSION}")
            self.entries = data["entries"]

    def missing(self, keys: Keys) -> list[str]:
        """The keys to measure: absent, or measured before a field the clock now uses existed."""
        needs = {keys.server: SERVER_FIELDS}
        return [k for k in keys.all() if k not in self.entries or any(f not in self.entries[k] for f in needs.get(k, ()))]

    def add(self, entries: dict) -> None:
        self.entries.update(entries)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": VERSION, "entries": self.entries}, indent=1, sort_keys=True) + "\n")
        tmp.replace(self.path)

    def used(self, keys: Keys) -> dict:
        """What a run records: its entries, the clock's constants and their digest."""
        used = [*keys.all(), *([keys.loop] if keys.loop in self.entries else [])]
        data = {"version": VERSION, "file": str(self.path), "entries": {k: self.entries[k] for k in used},
                "constants": model_constants()}
        digest = hashlib.sha256(json.dumps({k: data[k] for k in ("entries", "constants")}, sort_keys=True).encode()).hexdigest()[:16]
        return {**data, "digest": digest}


__all__ = ["Keys", "Store", "keys_of", "loop_from_run", "measure", "model_constants", "provenance", "server_config"]
