"""One run on the virtual clock: real gradients, compressors, bytes and server; modelled time.

Each worker computes its real gradient on its real shard with the real compressor the moment
its model arrives (a gradient depends only on the model it was given and the batch), and the
clock says when that step ends (:class:`~.timing.CpuQuota`, from the calibration's CPU seconds)
and when its bytes arrive (:class:`~.timing.SharedLink` and the device's own link). The server
is the real :class:`~emulator.runtime.paramserver.ParameterServer`: its ``push``, ``send_model``,
``send_ack`` and ``send_reject`` run unchanged on a channel that hands the frame to the clock;
it serves one request at a time, first come first served, each for the calibrated CPU time
under its own quota. The evaluator evaluates the server's model on the real test set at the
virtual times (or versions) its schedule says. Faults reach workers through the backend's
methods (crash, restart, pause, resume, cpus, link, partition), which the real fault injector
calls at their virtual times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from emulator.backends.virtual.clock import Clock, Handle
from emulator.backends.virtual.telemetry import VirtualTelemetry
from emulator.backends.virtual.timing import WIRE_OVERHEAD, CpuQuota, SharedLink, TokenBucket, tcp_rate_bps
from emulator.host.links import burst_bytes
from emulator.runtime import paramserver, protocol
from emulator.runtime.data import BatchSampler
from emulator.runtime.downlink import ModelCopy, parse_hello
from emulator.runtime.local import local_delta, steps_per_push
from emulator.runtime.protocol import Flag, MsgType
from emulator.runtime.worker import StepStats, build_compressor, push_body

STEPS_EVERY_S = 1.0  # a worker's step statistics, as often as a real worker sends them
TRAFFIC_EVERY_S = 1.0  # the server's traffic counters, as often as the real server flushes them


class FrameChannel:
    """What the real server's ``send_*`` methods write to: the frame, kept for the clock to carry."""

    worker = protocol.NO_WORKER

    def __init__(self):
        self.frames: list[tuple[MsgType, object, int, int]] = []

    def send(self, kind: MsgType, body=b"", t0: int = 0, flags: int = 0) -> int:
        self.frames.append((kind, body, t0, flags))
        return protocol.HEADER.size + len(body)

    def take(self) -> tuple[MsgType, object, int, int]:
        frame = self.frames.pop()
        self.frames.clear()
        return frame


@dataclass(frozen=True)
class Costs:
    """CPU seconds per unit of work, from the calibration."""

    step_s: float
    compress_s: float
    serve_s: float  # decode + apply + reply
    pull_s: float  # a plain pull's reply
    receive_s_per_byte: float = 0.0  # a worker's CPU to read a reply and apply it to its copy, per byte of the frame
    step_spread: float = 0.0  # sigma of log(step CPU): each step draws its CPU around the median (0: every step the median)
    compress_spread: float = 0.0
    loop_s: float = 0.0  # a worker's CPU per step beyond those parts, measured in containers (0: no such calibration)

    def draw(self, rng: np.random.Generator) -> tuple[float, float]:
        """One step's gradient and compression CPU seconds: lognormal around the calibrated medians,
        with the calibrated spread, so identical devices do not fall into lockstep."""
        if not (self.step_spread or self.compress_spread):
            return self.step_s, self.compress_s
        a, b = rng.standard_normal(2)
        return self.step_s * float(np.exp(self.step_spread * a)), self.compress_s * float(np.exp(self.compress_spread * b))


def spread(p10_s: float, p90_s: float) -> float:
    """Sigma of a lognormal whose 10th and 90th percentiles are these."""
    return float(np.log(p90_s / p10_s) / (2 * 1.2815515655446004)) if p10_s > 0 and p90_s > p10_s else 0.0


@dataclass
class Floor:
    """Wall seconds this host spent on the real work (gradient, compression, server), to compare the clock's cost with."""

    gradient_s: float = 0.0
    compress_s: float = 0.0
    server_s: float = 0.0
    evaluate_s: float = 0.0

    @property
    def work_s(self) -> float:
        return self.gradient_s + self.compress_s + self.server_s


@dataclass
class Worker:
    index: int
    name: str
    seed: int
    cpu: CpuQuota
    link: object  # LinkConfig now in force
    x: np.ndarray
    y: np.ndarray
    jitter: np.random.Generator  # this device's draws: link jitter, step CPU
    incarnation: int = 0
    alive: bool = False
    paused: bool = False
    blocked: bool = False
    finished: bool = False
    gen: int = 0  # bumped by a crash: what was in flight for the old incarnation is dropped
    sampler: BatchSampler | None = None
    compressor: object = None
    wire: object = None
    copy: ModelCopy | None = None
    holding: object = None  # the server's view of what this worker holds (delta pulls)
    params: np.ndarray | None = None
    version: int = 0
    since_pull: int = 0
    local_steps: int = 0  # H, with method.local; 0: one gradient per push
    phase: str = "idle"  # idle | receive | compute | push | wait
    handle: Handle | None = None  # the next step's event: _received in phase receive, _push in phase compute (a pause cancels it)
    resume_left: float | None = None
    flows: list = field(default_factory=list)
    buckets: dict = field(default_factory=lambda: {True: TokenBucket(), False: TokenBucket()})  # its shaper's, up and down
    deferred: list = field(default_factory=list)  # what arrived while paused
    blocked_sends: list = field(default_factory=list)  # what waited for a partition to heal
    stats: StepStats = field(default_factory=StepStats)
    last_report: float = 0.0
    pushed_at: float = 0.0
    step_wall: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)  # compute, compress wall; their CPU
    pending: tuple | None = None  # the computed push: message, flags, the version it was computed on


class Simulator:
    """The devices of one plan on one virtual clock; ``sink(stream, record)`` receives every trace record.

    ``shards``: a worker index -> (x, y) loader; ``test_set``: (x, y); ``model``: a TFModel shared by
    every device (its gradient takes the parameters as an argument); ``server_config``: the real
    server's configuration. ``on_update`` runs after every applied update (the fault injector's
    triggers); ``on_end`` once training has ended and the final model is evaluated.
    """

    def __init__(self, plan, layout, model, shards: Callable[[int], tuple], test_set: tuple, costs: Costs,
                 server_config, sink: Callable[[str, dict], None]):
        self.plan = plan
        self.layout = layout
        self.model = model
        self.costs = costs
        self.sink = sink
        self.clock = Clock()
        self.floor = Floor()
        self.method = None
        self.on_update: Callable[[], None] | None = None
        self.on_end: Callable[[str], None] | None = None
        self.server_tel = VirtualTelemetry(self.now, sink, plan.server.name)
        self.eval_tel = VirtualTelemetry(self.now, sink, plan.evaluator.name)
        self.server = paramserver.ParameterServer(server_config, self.server_tel)
        self.server.clock = self.now  # federated rounds and deadlines in virtual seconds
        self.unadmitted: list[tuple] = []  # replies a federated round does not let out yet (the real server's waiting pulls)
        self.server_cpu = CpuQuota(plan.server.cpus)
        self.server_link = plan.server.link
        self.server_delay_s = plan.server.link.delay_s or 0.0  # one way, on every transfer (server faults are not simulated)
        self.ingress = SharedLink(self.clock, plan.server.link.downlink_bps)  # into the server
        self.egress = SharedLink(self.clock, plan.server.link.uplink_bps)  # out of the server
        self.server_free = 0.0
        self.test_x, self.test_y = test_set
        self._shards = shards
        self.splits = np.array(layout.offsets[1:])
        every = plan.training["eval_every"]
        self.eval_every_s, self.eval_every_updates = every.get("seconds"), every.get("updates")
        self.eval_target = 0
        self.ended = False
        self.end_time: float | None = None
        self.workers: dict[int, Worker] = {}
        for device in plan.workers:
            self.workers[device.index] = Worker(device.index, device.name, device.seed, CpuQuota(device.cpus), device.link,
                                                None, None, np.random.default_rng([device.seed, 17]))

    def now(self) -> float:
        return self.clock.now

    # -- the run -----------------------------------------------------------------------------

    def start(self, method) -> None:
        """Training starts at virtual time zero: the server listens and starts, every worker joins."""
        self.method = method
        self.server_tel.event("listening", host="virtual", port=0, parameters=int(self.layout.total),
                              rule=self.server.rule.name, kernels=self.server.kernels)
        self.eval_tel.event("evaluator_ready", test_size=len(self.test_x))
        self.server.control({"cmd": "start"})
        for w in self.workers.values():
            self.boot(w)
        self.evaluate()  # the evaluator's first pull answers at once with the initial model
        if self.eval_every_s:
            self.clock.at(self.eval_every_s, self._tick_evaluator)
        self.clock.at(TRAFFIC_EVERY_S, self._tick_traffic)
        if self.server.has_clock:
            self.clock.at(paramserver.TICK_S, self._tick_rounds)

    def run(self, until_s: float | None = None) -> None:
        self.clock.run(until_s)

    def stop(self, why: str) -> None:
        """The controller's stop (duration reached, every worker down)."""
        self.server.finish(why)
        self._check_end()

    def _check_end(self) -> None:
        if self.server.done and not self.ended:
            self.ended = True
            self.end_time = self.clock.now
            self.evaluate(final=True)
            self.server.flush_traffic()
            if self.on_end is not None:
                self.on_end(self.server.done)
            self.clock.stop()

    def _tick_traffic(self) -> None:
        if not self.ended:
            self.server.flush_traffic()
            self.clock.after(TRAFFIC_EVERY_S, self._tick_traffic)

    def _tick_rounds(self) -> None:
        """The aggregator's clock, as often as the real server looks at it: a round past its deadline closes."""
        if not self.ended:
            version = self.server.version
            self.server.tick_once()
            self._admitted()
            if self.server.version != version:
                self._after_update()
            self._check_end()
            self.clock.after(paramserver.TICK_S, self._tick_rounds)

    def availability(self, index: int, available: bool) -> None:
        """A worker went offline or came back (an availability trace): whom a federated round may sample."""
        with self.server.cond:
            self.server.aggregator.available(index, available)
        self._admitted()

    def _tick_evaluator(self) -> None:
        if not self.ended:
            self.evaluate()
            self.clock.after(self.eval_every_s, self._tick_evaluator)

    def evaluate(self, final: bool = False) -> None:
        started = time.perf_counter()
        with self.server.cond:
            params, version = self.server.params.copy(), self.server.version
        accuracy, loss = self.model.evaluate(params, self.test_x, self.test_y)
        self.floor.evaluate_s += time.perf_counter() - started
        self.eval_tel.record("accuracy", version=version, model_ts=round(self.clock.now, 6), accuracy=accuracy, loss=loss,
                             final=final, test_size=len(self.test_x))
        if self.eval_every_updates:
            self.eval_target = (version // self.eval_every_updates + 1) * self.eval_every_updates

    # -- workers: what the backend's methods do -------------------------------------------

    def boot(self, w: Worker) -> None:
        """A (re)started worker: a fresh process's sampler and compressor, a new connection, a pull."""
        if w.x is None:
            w.x, w.y = self._shards(w.index)
        seed = (w.seed + 7919 * w.incarnation) & 0x7FFFFFFF
        w.sampler = BatchSampler(w.x, w.y, self.plan.training["batch_size"], seed)
        w.compressor, w.wire = build_compressor(self.method, self.layout, seed)
        pull = self.method.pull
        w.copy = ModelCopy(self.layout) if pull.mode == "delta" else None
        w.holding = parse_hello(pull.hello())
        w.alive, w.paused, w.finished, w.phase, w.since_pull = True, False, False, "wait", 0
        w.stats, w.last_report = StepStats(), self.clock.now
        with self.server.cond:  # the worker's HELLO, as the real server takes it
            self.server._examples[w.index] = len(w.x)
            self.server.aggregator.join(w.index)
        w.local_steps = steps_per_push(self.method.local, len(w.x), self.plan.training["batch_size"]) if self.method.local else 0
        self.server_tel.event("connected", role="worker", worker=w.index, incarnation=w.incarnation, peer="virtual")
        self.sink("events", {"ts": round(self.clock.now, 6), "source": w.name, "kind": "worker_ready", "worker": w.index,
                             "incarnation": w.incarnation, "shard_size": len(w.x)})
        self._send_up(w, protocol.HEADER.size, self._at_server, w, w.gen, MsgType.PULL, b"", 0, 0)

    def kill(self, index: int) -> None:
        w = self.workers[index]
        if not w.alive:
            return
        pending = w.phase in ("compute", "push") and not self.server.done
        w.alive, w.gen = False, w.gen + 1
        if w.handle is not None:
            w.handle.cancel()
            w.handle = None
        for link, flow in w.flows:
            link.drop(flow)
        w.flows.clear()
        w.deferred.clear()
        w.blocked_sends.clear()
        # The server learns of it one delay later, behind whatever frame had already left (TCP keeps order).
        self.clock.after(self._delay(w), self._at_server, w, w.gen, "close", b"", 0, int(pending))
        if all(not v.alive for v in self.workers.values()) and self.on_all_down is not None:
            self.on_all_down()

    on_all_down: Callable[[], None] | None = None

    def restart(self, index: int, incarnation: int) -> None:
        w = self.workers[index]
        w.incarnation = incarnation
        if not self.ended:
            self.boot(w)

    def pause(self, index: int) -> None:
        w = self.workers[index]
        if not w.alive or w.paused:
            return
        w.paused = True
        if w.handle is not None and w.handle.live:
            w.resume_left = w.handle.time_s - self.clock.now
            w.handle.cancel()
            w.handle = None

    def resume(self, index: int) -> None:
        w = self.workers[index]
        if not w.paused:
            return
        w.paused = False
        if w.resume_left is not None:
            left, w.resume_left = w.resume_left, None
            w.handle = self.clock.after(left, self._received if w.phase == "receive" else self._push, w, w.gen)
        deferred, w.deferred = w.deferred, []
        for args in deferred:
            self._receive(*args)

    def set_cpus(self, index: int, cpus: float) -> None:
        self.workers[index].cpu.set(cpus)

    def set_link(self, index: int, link) -> None:
        self.workers[index].link = link

    def partition(self, index: int, cut: bool) -> None:
        w = self.workers[index]
        w.blocked = cut
        if not cut:
            sends, w.blocked_sends = w.blocked_sends, []
            for args in sends:
                self._send(*args)

    # -- the network -----------------------------------------------------------------------

    def _delay(self, w: Worker) -> float:
        """One way between the worker and the server: its own delay (with jitter) and the server link's."""
        link = w.link
        if link.jitter_s:
            return max(0.0, link.delay_s + float(w.jitter.normal(0.0, link.jitter_s))) + self.server_delay_s
        return link.delay_s + self.server_delay_s

    def _send_up(self, w: Worker, nbytes: int, then: Callable, *args) -> None:
        link = w.link
        self._send(w, True, nbytes, tcp_rate_bps(link.uplink_bps, link.delay_s + self.server_delay_s, link.loss), then, args)

    def _send_down(self, w: Worker, nbytes: int, then: Callable, *args) -> None:
        link = w.link
        self._send(w, False, nbytes, tcp_rate_bps(link.downlink_bps, link.delay_s + self.server_delay_s, link.loss), then, args)

    def _send(self, w: Worker, up: bool, nbytes: int, cap_bps: float, then: Callable, args: tuple) -> None:
        if w.blocked:
            w.blocked_sends.append((w, up, nbytes, cap_bps, then, args))
            return
        shared = self.ingress if up else self.egress
        gen = w.gen
        box = []
        rate = w.link.uplink_bps if up else w.link.downlink_bps
        bucket = w.buckets[up]
        at_once = bucket.take(self.clock.now, rate, burst_bytes(rate), nbytes * WIRE_OVERHEAD) / WIRE_OVERHEAD if rate else 0.0
        rest = max(0.0, nbytes - at_once)

        def sent():
            if box and (shared, box[0]) in w.flows:
                w.flows.remove((shared, box[0]))
            if rate and rest > 0:
                bucket.empty_at(self.clock.now)
            if gen == w.gen:  # what a crashed incarnation was sending is lost
                self.clock.after(self._delay(w), then, *args)

        flow = shared.send(rest * 8.0, cap_bps, sent)
        box.append(flow)
        if flow in shared.flows:
            w.flows.append((shared, flow))

    # -- the server ----------------------------------------------------------------------------

    def _at_server(self, w: Worker, gen: int, kind: MsgType, body, t0: int, flags: int) -> None:
        """A request has arrived: it waits for the server (first come, first served), then is served."""
        cpu = self.costs.serve_s if kind == MsgType.PUSH else 0.0 if kind == "close" else self.costs.pull_s
        start = max(self.clock.now, self.server_free)
        self.server_free = self.server_cpu.finish(start, cpu)
        self.clock.at(start, self._serve, w, gen, kind, body, t0, flags, self.server_free - start)

    def _serve(self, w: Worker, gen: int, kind: MsgType, body, t0: int, flags: int, service_s: float) -> None:
        server, channel = self.server, FrameChannel()
        if kind == "close":  # the connection's end, as serve_connection's finally sees it
            if not (w.alive and gen == w.gen):  # unless a new incarnation has connected since
                with server.cond:
                    server.rule.forget(w.index)
                    server.aggregator.forget(w.index)
                self._admitted()
            self.server_tel.event("disconnected", worker=w.index, pending=bool(flags))
            return
        started = time.perf_counter()
        row = None
        if kind == MsgType.PUSH:
            frame_bytes = protocol.HEADER.size + len(body)
            reason, row = server.push(w.index, t0, memoryview(body), frame_bytes, flags)
            if row is not None:  # the server's clock readings, as virtual time: the same every run
                row["decode_us"], row["apply_us"] = 0, int(round(service_s * 1e6))
            if reason:
                server.send_reject(channel, w.index, reason)
            elif flags & Flag.NO_MODEL:
                server.send_ack(channel, w.index, row)
        if not channel.frames and not self._admit(w):
            # a federated round without this worker: its reply waits, as a pull waits in the real server
            self.unadmitted.append((w, gen, row, service_s))
        else:
            if not channel.frames:
                server.send_model(channel, w.index, w.holding, row)
            self._reply(w, gen, channel.take(), service_s)
        self.floor.server_s += time.perf_counter() - started
        if kind == MsgType.PUSH:
            self._admitted()  # a round this push closed may let waiting replies out
            self._after_update()
        self._check_end()

    def _admit(self, w: Worker) -> bool:
        with self.server.cond:
            return self.server.done or self.server.aggregator.admit(w.index, self.clock.now)

    def _reply(self, w: Worker, gen: int, frame, service_s: float) -> None:
        if gen == w.gen and w.alive:
            self.clock.after(service_s, self._send_down, w, protocol.HEADER.size + len(frame[1]), self._receive, w, gen, frame)

    def _admitted(self) -> None:
        """The waiting replies a round now lets out (or the end: every one gets the final model)."""
        waiting, self.unadmitted = self.unadmitted, []
        for w, gen, row, service_s in waiting:
            if gen != w.gen or not w.alive:
                continue
            if not self._admit(w):
                self.unadmitted.append((w, gen, row, service_s))
                continue
            channel = FrameChannel()
            self.server.send_model(channel, w.index, w.holding, row)
            self._reply(w, gen, channel.take(), 0.0)

    def _after_update(self) -> None:
        if self.on_update is not None:
            self.on_update()
        if self.eval_every_updates and self.server.version >= self.eval_target and not self.server.done:
            self.evaluate()

    # -- a worker's step ------------------------------------------------------------------------

    def _receive(self, w: Worker, gen: int, frame) -> None:
        if gen != w.gen or not w.alive or w.finished:
            return
        if w.paused:
            w.deferred.append((w, gen, frame))
            return
        kind, body, t0, flags = frame
        if w.phase == "push":  # the reply to a push: that step is done
            self._step_done(w)
        if kind == MsgType.REJECT:
            w.stats.rejected += 1
            self.sink("events", {"ts": round(self.clock.now, 6), "source": w.name, "kind": "push_rejected", "worker": w.index,
                                 "reason": protocol.parse_json(body, "reject").get("reason")})
            w.phase = "wait"
            self._send_up(w, protocol.HEADER.size, self._at_server, w, w.gen, MsgType.PULL, b"", 0, 0)
            return
        if kind == MsgType.MODEL:
            if w.copy is not None:
                w.params = w.copy.receive(t0, flags, body)
            else:
                w.params = np.frombuffer(body, dtype="<f4")
            w.version = t0
            w.stats.pulls += 1
            w.stats.pull_bytes += protocol.HEADER.size + len(body)
            w.since_pull = 0
        if flags & Flag.DONE:
            self._finish(w)
            return
        if kind == MsgType.MODEL and self.costs.receive_s_per_byte:
            # reading the reply and applying it takes the worker's CPU (under its quota) before the step can start
            read = w.cpu.finish(self.clock.now, self.costs.receive_s_per_byte * (protocol.HEADER.size + len(body)))
            w.phase = "receive"
            w.handle = self.clock.at(read, self._received, w, w.gen)
            return
        self._compute(w)

    def _received(self, w: Worker, gen: int) -> None:
        if gen != w.gen or not w.alive:
            return
        w.handle = None
        self._compute(w)

    def _compute(self, w: Worker) -> None:
        """The real step on the model this worker holds; the clock says when it is done."""
        c0 = time.perf_counter()
        if w.local_steps:  # H local steps on the worker's own copy: the push is the model delta
            grad, loss = local_delta(w.params, self.model.gradient, w.sampler.next, w.local_steps, self.method.local.learning_rate)
        else:
            xb, yb = w.sampler.next()
            loss, grad = self.model.gradient(w.params, xb, yb)
        if self.method.pull.every == 1 and w.copy is None:
            w.params = None  # every push is answered with a model: this one is not needed again (memory at scale)
        c1 = time.perf_counter()
        message, flags = push_body(w.compressor, np.split(grad, self.splits), self.layout, w.wire)
        c2 = time.perf_counter()
        self.floor.gradient_s += c1 - c0
        self.floor.compress_s += c2 - c1
        w.since_pull += 1
        if w.since_pull < self.method.pull.every:
            flags |= Flag.NO_MODEL
        now = self.clock.now
        step_s, compress_s = self.costs.draw(w.jitter)
        for _ in range(1, w.local_steps):  # each local step a gradient of its own (the SGD update beside it is small)
            step_s += self.costs.draw(w.jitter)[0]
        computed = w.cpu.finish(now, step_s)
        compressed = w.cpu.finish(computed, compress_s)
        w.step_wall = (computed - now, compressed - computed, step_s, compress_s)
        if self.costs.loop_s > 0:  # the loop's own CPU (framing, sockets, telemetry) before the push leaves
            compressed = w.cpu.finish(compressed, self.costs.loop_s)
        w.stats.loss += loss
        w.stats.non_finite += bool(flags & Flag.NON_FINITE)
        w.phase = "compute"
        w.pending = (message, flags, w.version)
        w.handle = self.clock.at(compressed, self._push, w, w.gen)

    def _push(self, w: Worker, gen: int) -> None:
        if gen != w.gen or not w.alive:
            return
        w.handle = None
        message, flags, version = w.pending
        w.pending = None
        w.phase, w.pushed_at = "push", self.clock.now
        w.stats.bytes += protocol.HEADER.size + len(message)
        self._send_up(w, protocol.HEADER.size + len(message), self._at_server, w, w.gen, MsgType.PUSH, message, version, flags)

    def _step_done(self, w: Worker) -> None:
        s, now = w.stats, self.clock.now
        compute, compress, compute_cpu, compress_cpu = w.step_wall
        s.steps += 1
        s.compute_s += compute
        s.compress_s += compress
        s.compute_cpu_s += compute_cpu
        s.compress_cpu_s += compress_cpu
        s.network_s += now - w.pushed_at
        w.phase = "wait"
        if now - w.last_report >= STEPS_EVERY_S:
            self.sink("steps", {"ts": round(now, 6), "source": w.name, "worker": w.index, **s.as_record()})
            s.reset()
            w.last_report = now

    def _finish(self, w: Worker) -> None:
        w.finished, w.phase = True, "idle"
        if w.stats.steps:
            self.sink("steps", {"ts": round(self.clock.now, 6), "source": w.name, "worker": w.index, **w.stats.as_record()})
        self.sink("events", {"ts": round(self.clock.now, 6), "source": w.name, "kind": "worker_finished", "worker": w.index})


__all__ = ["Costs", "Floor", "FrameChannel", "Simulator", "spread"]
