"""One run on a backend whose clock is virtual: the plan's devices as events, the run directory as always.

The wall-clock controller (:class:`~emulator.control.controller.Emulation`) boots processes, waits
on them and probes them; here nothing boots and time is the simulator's. Everything else is the
controller's own: the data shards, the workload folder, the fault injector (its timeline fired at
virtual times, its triggers after every update), the live state the summary is built from, and
``summary.json``. Every ``ts`` in the traces is virtual seconds since training started; the
summary says so (``clock: virtual``) and names the calibration that set the clock
(``calibration.json``). What the host spent is kept apart in ``virtual_wall.json`` (wall time,
the real work's floor, memory), since it is not part of what a seed determines.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import numpy as np

from emulator import datasets
from emulator.backends.virtual import calibration
from emulator.backends.virtual.sim import Costs, Simulator, spread
from emulator.control import controller, workload
from emulator.planning.workload import user_files
from emulator.runtime.data import load_shard

FLUSH_EVERY = 5000  # records buffered before they are appended to the run directory


def calibration_path() -> Path:
    """Where calibrations are kept unless a run names one: ``$EDGE_EMULATOR_CALIBRATION`` or the cache."""
    return Path(os.environ.get("EDGE_EMULATOR_CALIBRATION", controller.cache_dir() / "calibration.json"))


def build_model(plan, input_shape, classes: int):
    """The TensorFlow model every simulated device shares, deterministic on one thread."""
    import tensorflow as tf

    from emulator.runtime.models import TFModel, resolve

    try:
        tf.config.experimental.enable_op_determinism()
    except (AttributeError, RuntimeError):
        pass
    return TFModel(resolve(plan.model["name"], plan.model["args"], plan.model["output"], checked=True), input_shape, classes, 1)


class Simulation(controller.Emulation):
    """Run one plan on a virtual-clock backend; :meth:`run` returns the summary written to ``summary.json``."""

    def __init__(self, *args, calibration_file: str | Path | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.sim: Simulator | None = None
        self.calibration_file = Path(calibration_file) if calibration_file else calibration_path()
        self.calibration: dict | None = None
        self._buffer: dict[str, list[dict]] = {}
        self._buffered = 0
        self._scheduled: set[int] = set()  # the injector's pending events given an instant
        self.loop_wall_s = None  # wall seconds of the event loop alone (real work included)

    def now(self) -> float:
        return self.sim.clock.now if self.sim is not None else 0.0

    def training_time(self) -> float:
        return self.now()

    def _send(self, device: str, command: dict) -> None:
        """No device program listens (the backend's methods already changed the simulated device), but the
        server is real: it hears that a worker went offline or came back, as a federated round must."""
        if command.get("cmd") == "availability" and self.sim is not None:
            self.sim.availability(command["worker"], bool(command.get("available")))

    def _config(self, device):
        return None  # a restarted simulated device needs no start document

    def event(self, kind: str, **fields) -> None:
        self._sink("events", {"ts": round(self.now(), 6), "source": "controller", "kind": kind, **fields})

    # -- the record path: as the collector's, without the socket ---------------------------------

    def _sink(self, stream: str, record: dict) -> None:
        self._buffer.setdefault(stream, []).append(record)
        self.state.observe(stream, [record])
        self._buffered += 1
        if self._buffered >= FLUSH_EVERY:
            self._flush()

    def _flush(self) -> None:
        for stream, records in self._buffer.items():
            if records:
                self.rundir.append(stream, records)
        self._buffer, self._buffered = {}, 0

    # -- the run ---------------------------------------------------------------------------------

    def _prepare(self) -> None:
        plan = self.plan
        self.shards = datasets.prepare_shards(plan.dataset, len(plan.workers), seed=plan.seed, cache_dir=controller.cache_dir() / "data")
        model_def = workload.model_of(plan)
        self.layout = model_def.layout(self.shards.input_shape, self.shards.classes)
        self.rundir.write_json("data.json", {**self.shards.to_json(), "files": datasets.provenance(plan.dataset)})
        self.bundle = workload.write(self.rundir.path, user_files(plan), model_def.initial_values(self.layout, plan.seed))
        mechanisms = {d.name: self.backend.mechanisms(d) for d in plan.devices}
        self.rundir.write_json("mechanisms.json", mechanisms)
        for line in controller.unemulated(mechanisms, self.backend.name) + self.backend.warnings(plan):
            self.say(line)
        self.event("run_started", run_id=self.rundir.run_id, backend=self.backend.name, clock="virtual", dataset=self.shards.source,
                   parameters=self.layout.total, workers=len(plan.workers))
        self.say(f"run {self.rundir.run_id}: {len(plan.workers)} workers, method {plan.method.label}, "
                 f"{self.shards.dataset} ({self.shards.source}), backend {self.backend.name} (virtual time)")

    def _calibrate(self, model, x, y) -> Costs:
        store = calibration.Store(self.calibration_file)
        keys = calibration.keys_of(self.plan, self.shards.input_shape, self.shards.classes)
        missing = store.missing(keys)
        if missing:
            self.say(f"calibration: measuring {len(missing)} entr{'y' if len(missing) == 1 else 'ies'} on this machine "
                     f"(none in {store.path} for this scenario)")
            store.add({k: v for k, v in calibration.measure(self.plan, self.layout, model, x, y, keys,
                                                            command="virtual run: measured at first use").items() if k in missing})
        used = store.used(keys)
        self.calibration = used
        self.rundir.write_json("calibration.json", used)
        entries = used["entries"]
        server = entries[keys.server]
        step, compress = entries[keys.step], entries[keys.compress]
        loop = entries.get(keys.loop)
        if loop is None:
            self.say("calibration: no container measurement of the worker loop for this model and method: each step "
                     "charges its gradient, compression and reply only (emulate calibrate SCENARIO --from-run DOCKER_RUN)")
        # measured in containers, where there is such an entry: the gradient, the compression and the loop's rest
        step_s, compress_s = (loop["step_cpu_s"], loop["compress_cpu_s"]) if loop else (step["cpu_s"], compress["cpu_s"])
        return Costs(step_s=step_s, compress_s=compress_s, serve_s=server["cpu_s"],
                     pull_s=server["pull_cpu_s"], receive_s_per_byte=server["receive_cpu_s_per_byte"],
                     step_spread=spread(step["p10_s"], step["p90_s"]), compress_spread=spread(compress["p10_s"], compress["p90_s"]),
                     loop_s=max(0.0, loop["cpu_s"]) if loop else 0.0)

    def _simulate(self) -> str:
        plan = self.plan
        from compression import compiled

        compiled.enable()  # the server's loops as in the runtime image
        model = build_model(plan, self.shards.input_shape, self.shards.classes)
        cache: dict[int, tuple] = {}

        def shard(index: int):
            if index not in cache:
                cache[index] = load_shard(self.shards.shards[index])
            return cache[index]

        x0, y0 = shard(0)
        costs = self._calibrate(model, x0, y0)
        cfg = calibration.server_config(plan, self.layout, self.bundle.device_reference(plan.method.rule, self.bundle.host_dir))
        from dataclasses import replace

        rate = plan.training["learning_rate"]
        cfg = replace(cfg, initial=f"{self.bundle.host_dir}/{workload.INITIAL}",
                      learning_rate=plan.method.server_step_size(rate),
                      aggregation=self.bundle.device_reference(plan.method.aggregation["name"], self.bundle.host_dir),
                      aggregation_params=dict(plan.method.aggregation["params"]))
        method = plan.method.worker_config(self.bundle.device_reference(plan.method.compressor, self.bundle.host_dir), rate)
        test = load_shard(self.shards.test_set)
        sim = Simulator(plan, self.layout, model, shard, test, costs, cfg, self._sink)
        self.sim = sim
        self.backend.attach(sim)
        for device in plan.devices:
            self.backend.start(device, None)
        model.warm_up(sim.server.params, *shard(0))
        model.warm_up(sim.server.params, *test, evaluate_batch=min(len(test[0]), 1000))
        self.training_start = 0.0
        self.event("training_started", boot_s=0.0)
        sim.start(method)
        for event in plan.events:
            sim.clock.at(event.time_s, self._advance)
        if plan.triggers:
            sim.on_update = self._advance
        sim.on_all_down = lambda: None if self.faults.restart_ahead else sim.stop("stopped by controller")
        duration = plan.training["duration"]
        if duration:
            sim.clock.at(duration, sim.stop, "stopped by controller")
        started, evaluated = time.perf_counter(), sim.floor.evaluate_s
        sim.run()
        self.loop_wall_s = time.perf_counter() - started - (sim.floor.evaluate_s - evaluated)  # the evaluator's work is not per update
        if not sim.ended:  # nothing left to happen (every worker down for good)
            sim.stop("stopped by controller")
        return self.state.done_reason or "done"

    def _advance(self) -> None:
        """The fault injector at this virtual instant; what its triggers scheduled gets its own instant."""
        self.faults.advance(self.sim.clock.now, self.state.pushes_of)
        for event in self.faults.pending:
            if id(event) not in self._scheduled:
                self._scheduled.add(id(event))
                self.sim.clock.at(event.time_s, self._advance)

    def _logs(self) -> None:
        """Every device has its log, as on every backend: here what ran it."""
        for device in self.plan.devices:
            self.rundir.log_path(device.name).write_text(
                f"{device.name}: simulated in the controller's process on the virtual clock (backend virtual); no program of its own ran\n")

    def run(self) -> dict:
        wall = time.perf_counter()
        error = None
        try:
            self.status = "preparing"
            self._prepare()
            self._logs()
            self.status = "running"
            reason = self._simulate()
            self.training_end = self.sim.end_time
            self.event("training_done", reason=reason, updates=self.state.updates, training_s=round(self.training_end, 6))
            self.payload_at_end = self.state.ingress_bytes
            self.egress_at_end = (self.state.egress_bytes, self.state.downlink_bytes)
            np.save(self.rundir.path / "final_model.npy", self.sim.server.params)
            self.status = "completed"
        except KeyboardInterrupt:
            self.status = "interrupted"
            self.say("interrupted")
        except Exception as exc:  # noqa: BLE001 - recorded, re-raised after the summary is written
            self.status = "failed"
            error = exc
        finally:
            self._flush()
            self.backend.teardown()
            summary = self.summary(error)
            summary.update(clock="virtual", time_unit="virtual seconds",
                           calibration=None if self.calibration is None else
                           {"file": "calibration.json", "digest": self.calibration["digest"]})
            self.rundir.write_json("summary.json", summary)
            self.rundir.write_json("virtual_wall.json", self._wall(time.perf_counter() - wall))
            self.rundir.close()
        if error is not None:
            raise error
        return summary

    def _wall(self, wall_s: float) -> dict:
        """What this host spent: not determined by the seed, so kept out of the summary."""
        sim, updates = self.sim, self.state.updates
        floor = sim.floor if sim is not None else None
        out = {"wall_s": round(wall_s, 3), "updates": updates,
               "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
        if floor is not None:
            out.update(gradient_s=round(floor.gradient_s, 3), compress_s=round(floor.compress_s, 3), server_s=round(floor.server_s, 3),
                       evaluate_s=round(floor.evaluate_s, 3), floor_s=round(floor.work_s, 3), events=sim.clock.executed,
                       virtual_s=round(sim.clock.now, 6))
            if self.loop_wall_s is not None:
                loop = self.loop_wall_s
                out.update(loop_wall_s=round(self.loop_wall_s, 3),
                           loop_wall_per_update_ms=round(1000 * loop / max(1, updates), 3),
                           floor_per_update_ms=round(1000 * floor.work_s / max(1, updates), 3),
                           wall_over_floor=round(loop / floor.work_s, 3) if floor.work_s else None)
        return out


def calibrate(plan, out: str | Path | None = None, repeat: int = 30, command: str = "emulate calibrate",
              container: tuple[dict, dict] | None = None) -> tuple[Path, dict]:
    """Measure, on this machine, the CPU seconds the virtual clock needs for ``plan`` (its model and
    batch, compressor, rule and pull mode) and store them, replacing older entries of the same keys;
    returns the file and the entries. ``emulate calibrate`` calls this. ``container``: what a container
    run of the scenario measured (``analysis.runs.container_usage``), from which the worker's step is
    taken as well (:func:`calibration.loop_from_run`)."""
    from compression import compiled

    compiled.enable()
    shards = datasets.prepare_shards(plan.dataset, len(plan.workers), seed=plan.seed, cache_dir=controller.cache_dir() / "data")
    model_def = workload.model_of(plan)
    layout = model_def.layout(shards.input_shape, shards.classes)
    model = build_model(plan, shards.input_shape, shards.classes)
    x, y = load_shard(shards.shards[0])
    keys = calibration.keys_of(plan, shards.input_shape, shards.classes)
    store = calibration.Store(out or calibration_path())
    entries = calibration.measure(plan, layout, model, x, y, keys, repeat=repeat, command=command)
    if container is not None:
        entries.update(calibration.loop_from_run(container, entries, keys))
    store.add(entries)
    return store.path, entries


__all__ = ["Simulation", "build_model", "calibrate", "calibration_path"]
