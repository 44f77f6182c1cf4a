"""The parameter server: holds the model, applies pushed updates by the method's rule, serves pulls.

One thread per connection; one lock around the model so an update and a snapshot never
interleave. Every applied update is a trace row (worker, t0, staleness, bytes, entries, and the
reply: its bytes, a whole model, a delta or an ACK); every refused frame is counted by reason and
never touches the model. A push is answered with the model, or with a delta from the version the
worker holds when its HELLO asked for delta pulls (:mod:`.downlink`), or with an ACK when the push
says the worker pulls later. Bytes in and out, pulls and deltas are traced per worker per second. Training ends at
``max_updates`` or on the controller's ``stop``: from then on every reply carries DONE. A worker
whose gradient held NaN or Inf says so (a PUSH flagged ``NON_FINITE``); that report, non-finite
values on the wire and updates that would overflow the model count toward divergence
(``DIVERGED_AFTER`` in a row end training).

What happens to a decoded update is the method's aggregator's (:mod:`.aggregation`): applied at
once by the rule (``per_push``, the default), held in a buffer (``fedbuff``), mixed in
(``fedasync``), or gathered into a round (``fedavg``), whose sample decides which workers' pulls
are answered. A push the aggregator holds is traced with ``held: true`` and leaves the version
as it was; every aggregation it closes is a ``rounds`` row with the bytes both ways since the last.

Run as ``python -m emulator.runtime.paramserver`` with its :class:`~.config.ServerConfig` in ``$EMU_CONFIG``.
"""

from __future__ import annotations

import collections
import os
import socket
import sys
import threading
import time
from typing import NamedTuple

import numpy as np

import compression
from compression import compiled
from compression.layout import Layout

from emulator.runtime import aggregation, checkpoint, downlink, partition, probe, protocol, rules
from emulator.runtime.bootstrap import load_config, start
from emulator.runtime.config import ServerConfig
from emulator.runtime.downlink import Holding
from emulator.runtime.models import initial_parameters, load_initial
from emulator.runtime.protocol import Flag, MsgType, ProtocolError
from emulator.runtime.telemetry import Telemetry
from emulator.runtime.transport import Channel, TransportShaper, tune

MAX_WAIT_MS = 600_000
TICK_S = 0.02  # how often the aggregator's clock is asked about round deadlines
DIVERGED_AFTER = 50  # non-finite (or overflowing) gradients in a row, no update applied between: training has diverged
NON_FINITE_GRADIENT = "non_finite_gradient"  # rejection reason of a worker's report
# Per worker per second: bytes received (pushes), bytes sent (models, deltas, ACKs, rejections),
# and of those the MODEL frames: how many, how many were deltas, their bytes.
TRAFFIC_KEYS = ("ingress_bytes", "pushes", "egress_bytes", "pulls", "delta_pulls", "pull_bytes")


class Pushed(NamedTuple):
    reason: str | None  # why the push was refused; None when applied (or late)
    row: dict | None = None  # the applied update's trace row


class ParameterServer:
    def __init__(self, cfg: ServerConfig, telemetry: Telemetry):
        self.cfg = cfg
        self.tel = telemetry
        self.token = bytes.fromhex(cfg.token)
        self.layout = Layout.from_json(cfg.layout)
        self.params = initial_parameters(self.layout, cfg.seed) if cfg.initial is None else load_initial(cfg.initial, self.layout)
        self.partition = partition.from_json(cfg.partition, self.layout)
        if self.partition.shards > 1:  # this server holds one range of the model: its pieces, their values
            lo, hi = self.partition.range(cfg.shard)
            self.layout, self.params = self.partition.layouts[cfg.shard], self.params[lo:hi].copy()
        self.rule = rules.build(cfg.rule, self.layout, cfg.learning_rate)
        self.aggregator = aggregation.build(cfg.aggregation, self.layout, self.rule, cfg.seed, cfg.aggregation_params)
        self._examples: dict[int, int] = {}  # worker -> its shard's size, from its HELLO (what FedAvg weighs by)
        self.clock = time.monotonic  # what the aggregator's rounds and deadlines are timed by (the virtual backend's clock there)
        self._round_bytes: collections.Counter = collections.Counter()  # both ways, since the last aggregation closed
        self.max_updates = cfg.max_updates
        # The largest valid update: every coordinate as a raw32 index and an f32 value (8 B);
        # a sparse part can be larger than a dense one (topk at c = 1, or c > 0.5 with raw32).
        self.max_body = self.layout.total * 8 + 64 * len(self.layout) + 1024
        self.shaper = TransportShaper.from_config(cfg.transport)
        self.version = 0
        self.training = threading.Event()  # set by the controller's "start" once every device is up
        self.done = False
        self.cond = threading.Condition()
        self._snapshot: tuple[int, bytes] | None = None
        self._traffic: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.rejections: collections.Counter = collections.Counter()
        self._owners: dict[int, Channel] = {}  # worker id -> its latest connection
        self._non_finite_in_a_row = 0
        self._flush_now = threading.Event()
        self.started = time.monotonic()
        self.checkpointer = None
        self.mark = None
        ckpt = cfg.checkpoint
        if ckpt is not None and ckpt.dir:
            os.makedirs(ckpt.dir, exist_ok=True)  # with several servers, each its own folder in the checkpoint mount
            self.checkpointer = checkpoint.Checkpointer(
                ckpt.dir, ckpt.every_updates, ckpt.every_s,
                on_saved=lambda version, seconds: self.tel.event("checkpoint_saved", version=version, seconds=round(seconds, 4)),
            )
            self.mark = checkpoint.VersionMark(ckpt.dir)
            at_crash = self.mark.read()
            restored = checkpoint.load(ckpt.dir)
            if restored is not None:
                self.version, self.params, state = restored
                self.rule.load_state(state)
                # rounds go on numbered from the version (a checkpoint is taken right after a server step, when no
                # delta is held: what the aggregator held after it is lost with the crash, as updates after it are)
                self.aggregator.rounds = self.version
                self.training.set()  # a restarted server resumes training at once
                self.tel.event("restored", version=self.version, version_at_crash=at_crash,
                               lost=max(0, at_crash - self.version))
            elif at_crash:
                self.tel.event("restored", version=0, version_at_crash=at_crash, lost=at_crash)
            self.mark.set(self.version)
        self.changes = downlink.ChangeLog(self.layout.total, self.version)  # for delta pulls; starts at a restored version
        self.kernels = compiled.describe()  # the hot path's loops: "numba x.y" or why numpy runs
        self.tel.on_control(self.control)

    # -- model access (all under self.cond) -----------------------------------------------

    def _model_bytes(self) -> tuple[int, bytes]:
        if self._snapshot is None or self._snapshot[0] != self.version:
            self._snapshot = (self.version, self.params.tobytes())
        return self._snapshot

    def finish(self, why: str) -> None:
        self.training.set()  # release anyone still waiting for the start
        with self.cond:
            if not self.done:
                self.done = True
                self.tel.event("training_done", reason=why, updates=self.version)
                self._flush_now.set()
            self.cond.notify_all()

    def control(self, command: dict) -> None:
        cmd = command.get("cmd")
        if cmd == "start":
            if not self.training.is_set():
                self.training.set()
                self.tel.event("training_started", version=self.version)
        elif cmd == "stop":
            self.finish("stopped by controller")
        elif cmd == "shape":
            self.shaper.update(command.get("transport", {}))
        elif cmd == "availability":  # a worker paused or resumed (an availability trace): whom a round may sample
            worker = command.get("worker")
            if isinstance(worker, int) and not isinstance(worker, bool):
                with self.cond:
                    self.aggregator.available(worker, bool(command.get("available")))
                    self.cond.notify_all()

    def reject(self, reason: str, worker: int, detail: str = "") -> None:
        with self.cond:  # called from many connection threads, some outside the lock
            self.rejections[reason] += 1
        self.tel.record("rejections", reason=reason, worker=worker, detail=detail[:200])

    # -- request handling -----------------------------------------------------------------

    def push(self, worker: int, t0: int, body: memoryview, frame_bytes: int, flags: int = 0) -> Pushed:
        """Decode and apply one update: the rejection reason or None, and the applied update's
        trace row (recorded once its reply is known, :meth:`trace_update`)."""
        if flags & Flag.NON_FINITE:
            return Pushed(self.non_finite_report(worker, body, frame_bytes))
        start = time.perf_counter()
        flat = compression.decode_flat(body, self.layout)  # the compiled shortcut for top-k messages, else None
        if flat is None:
            try:
                parts = compression.decode(body, self.layout)
            except compression.CodecError as exc:
                self.reject(exc.reason, worker, str(exc))
                if exc.reason == "non_finite":
                    self._diverging()
                return Pushed(exc.reason)
        decoded = time.perf_counter()
        with self.cond:
            traffic = self._traffic[worker]
            traffic["ingress_bytes"] += frame_bytes
            traffic["pushes"] += 1
            self._round_bytes["ingress_bytes"] += frame_bytes
            if self.done:
                self.reject("late", worker, "update arrived after training ended")
                return Pushed(None)
            staleness = self.version - t0
            if staleness < 0:
                self.reject("future_version", worker, f"t0={t0} > t={self.version}")
                return Pushed("future_version")
            try:
                examples, now = self._examples.get(worker, 1), self.clock()
                if flat is None:
                    applied = self.aggregator.receive(self.params, self.rule.coordinates(parts), worker, staleness, examples, now)
                else:
                    applied = self.aggregator.receive_flat(self.params, *flat, worker, staleness, examples, now)
            except rules.RuleError as exc:
                self._record_rounds()  # a round that failed to apply is still a round
                self.reject(exc.reason, worker, str(exc))
                if exc.reason == "overflow":
                    self._diverging()
                return Pushed(exc.reason)
            if applied is not None:
                self._commit(applied)
            self._record_rounds()
            version = self.version
        done = time.perf_counter()
        if applied is None:  # held by the aggregator: the model did not change
            return Pushed(None, dict(t=version, worker=worker, t0=t0, staleness=staleness, bytes=frame_bytes, held=True,
                                     decode_us=int((decoded - start) * 1e6), apply_us=int((done - decoded) * 1e6)))
        return Pushed(None, dict(
            t=version, worker=worker, t0=t0, staleness=staleness, bytes=frame_bytes,
            entries=applied.entries, scale=round(applied.mean_scale, 6),
            **({} if applied.mean_sigma is None else {"sigma": round(applied.mean_sigma, 4)}),
            decode_us=int((decoded - start) * 1e6), apply_us=int((done - decoded) * 1e6),
        ))

    def _commit(self, applied: rules.Applied) -> None:
        """The model changed (under the lock): a new version, its changes logged, checkpoint and end checked."""
        self.version += 1
        self.changes.record(applied.targets, self.version)
        if self.mark is not None:
            self.mark.set(self.version)
        self._non_finite_in_a_row = 0
        version = self.version
        if self.max_updates and version >= self.max_updates:
            self.finish("max_updates reached")
        if self.checkpointer is not None and self.checkpointer.due(version):
            state = {k: v.copy() for k, v in self.rule.state().items()}
            self.checkpointer.write_async(version, self.params.copy(), state)
        self.cond.notify_all()

    def _record_rounds(self) -> None:
        """Trace the aggregations the aggregator closed (under the lock), with the bytes both ways since the last."""
        for round_ in self.aggregator.closed():
            self.tel.record("rounds", **round_.as_record(), version=self.version,
                            ingress_bytes=self._round_bytes["ingress_bytes"], egress_bytes=self._round_bytes["egress_bytes"],
                            downlink_bytes=self._round_bytes["downlink_bytes"])
            self._round_bytes.clear()
            self.cond.notify_all()  # a new round may admit waiting workers

    @property
    def has_clock(self) -> bool:
        """Whether the aggregator closes rounds by the clock (FedAvg's deadlines), so must be ticked."""
        return type(self.aggregator).due is not aggregation.Aggregator.due

    def tick(self) -> None:
        """The aggregator's clock (round deadlines), a few times a second while training."""
        while True:
            time.sleep(TICK_S)
            if self.training.is_set() and not self.tick_once():
                return

    def tick_once(self) -> bool:
        """One look at the aggregator's clock: a round whose deadline passed is closed; False once training is over."""
        with self.cond:
            if self.done:
                return False
            try:
                applied = self.aggregator.due(self.params, self.clock())
            except rules.RuleError as exc:
                self.reject(exc.reason, protocol.NO_WORKER, str(exc))
                applied = None
                if exc.reason == "overflow":
                    self._diverging()
            if applied is not None:
                self._commit(applied)
            self._record_rounds()
        return True

    def non_finite_report(self, worker: int, body: memoryview, frame_bytes: int) -> str | None:
        """A worker's gradient held NaN or Inf (``body`` says where): refused, counted toward divergence."""
        with self.cond:
            traffic = self._traffic[worker]
            traffic["ingress_bytes"] += frame_bytes
            traffic["pushes"] += 1
            self._round_bytes["ingress_bytes"] += frame_bytes
            if self.done:
                self.reject("late", worker, "report arrived after training ended")
                return None
            self.reject(NON_FINITE_GRADIENT, worker, bytes(body[:200]).decode("utf-8", "replace"))
            self._diverging()
        return NON_FINITE_GRADIENT

    def _diverging(self) -> None:
        """One more update refused for being (or making the model) non-finite."""
        self._non_finite_in_a_row += 1
        if self._non_finite_in_a_row >= DIVERGED_AFTER:
            self.finish(f"diverged: {DIVERGED_AFTER} non-finite gradients in a row")

    def pull(self, worker: int, holding: Holding | None = None, min_version: int = 0,
             max_wait_s: float = 0.0) -> tuple[downlink.Reply, bool]:
        """The model for ``worker``: whole, or for a delta connection (``holding``) what changed
        since the version it holds; and whether training is over."""
        if not self.training.is_set():  # no lock once training runs
            self.training.wait()
        with self.cond:
            if worker != protocol.NO_WORKER and not self.aggregator.admit(worker, self.clock()):
                # not in this round's sample: wait for one that has this worker (or for the end)
                while not (self.done or self.aggregator.admit(worker, self.clock())):
                    self.cond.wait(TICK_S * 10)
            if min_version > self.version and not self.done and max_wait_s > 0:
                self.cond.wait_for(lambda: self.done or self.version >= min_version, timeout=max_wait_s)
            done = self.done
            if holding is None:
                reply = downlink.Reply(*self._model_bytes())
            else:
                reply = downlink.prepare(holding, self.params, self.version, self.changes, self.layout,
                                         lambda: self._model_bytes()[1])
            if worker != protocol.NO_WORKER:
                self.rule.on_pull(worker, self.version, reply.since)
                self.aggregator.on_pull(worker, self.version, self.params)
        if holding is not None:
            downlink.finish(reply, holding, self.layout)  # encoding outside the lock
        return reply, done

    def send_model(self, channel: Channel, worker: int, holding: Holding | None = None, row: dict | None = None,
                   **pull_args) -> None:
        """Send the model (or a delta) to ``worker``; ``row``, an update's trace row, is recorded with the reply's size."""
        reply, done = self.pull(worker, holding, **pull_args)
        size = protocol.HEADER.size + len(reply.body)
        if row is not None:
            self.trace_update(row, size, reply)
        channel.send(MsgType.MODEL, reply.body, t0=reply.version, flags=reply.flags | (Flag.DONE if done else 0))
        with self.cond:  # counted once the kernel has it (a frame that could not go is not egress)
            traffic = self._traffic[worker]
            traffic["egress_bytes"] += size
            self._round_bytes["egress_bytes"] += size
            self._round_bytes["downlink_bytes"] += size if worker != protocol.NO_WORKER else 0  # to workers (not the evaluator)
            traffic["pull_bytes"] += size
            traffic["pulls"] += 1
            traffic["delta_pulls"] += bool(reply.flags & Flag.DELTA)

    def send_ack(self, channel: Channel, worker: int, row: dict | None) -> None:
        """Answer a push whose worker pulls later: the version its update made, no model."""
        if row is not None:
            self.trace_update(row, protocol.HEADER.size, None)
        with self.cond:
            version, done = self.version, self.done
        channel.send(MsgType.ACK, t0=version, flags=Flag.DONE if done else 0)
        with self.cond:
            self._traffic[worker]["egress_bytes"] += protocol.HEADER.size
            self._round_bytes["egress_bytes"] += protocol.HEADER.size

    def send_reject(self, channel: Channel, worker: int, reason: str) -> None:
        sent = channel.send(MsgType.REJECT, protocol.json_body({"reason": reason}))
        with self.cond:
            self._traffic[worker]["egress_bytes"] += sent
            self._round_bytes["egress_bytes"] += sent

    def trace_update(self, row: dict, reply_bytes: int, reply: downlink.Reply | None) -> None:
        """One applied update's row, with its reply: bytes, and ``model`` (whole), ``delta`` (from
        version ``reply_base``, ``reply_entries`` coordinates) or ``ack``."""
        if reply is None:
            row.update(reply="ack", reply_bytes=reply_bytes)
        elif reply.flags & Flag.DELTA:
            row.update(reply="delta", reply_bytes=reply_bytes, reply_entries=reply.entries,
                       reply_base=None if reply.base == downlink.WHOLE else reply.base)
        else:
            row.update(reply="model", reply_bytes=reply_bytes)
        self.tel.record("updates", **row)

    def answer_probe(self, channel: Channel) -> None:
        """Fidelity probes (before or during training): echo, measure an upload, send a download."""
        header = channel.recv_header()
        if header.type != MsgType.PROBE:
            raise ProtocolError("unexpected", f"{header.type.name} on a probe connection")
        if header.t0 == probe.MODE_UP:
            seconds, rate = probe.timed_read(channel.io, header.length)
            channel.after_receive()
            reply = {"bytes": header.length, "seconds": seconds, "rate_bps": rate}
            channel.send(MsgType.PROBE_REPLY, protocol.json_body(reply))
            return
        body = protocol.recv_exact(channel.io, header.length) if header.length else b""
        channel.after_receive()
        if header.t0 == probe.MODE_DOWN:
            wanted = int.from_bytes(bytes(body[:4]), "little") if len(body) >= 4 else 0
            channel.send(MsgType.PROBE_REPLY, bytes(min(wanted, probe.MAX_PROBE_BYTES)))
        else:
            channel.send(MsgType.PROBE_REPLY)

    def serve_connection(self, sock: socket.socket, peer) -> None:
        channel = Channel(sock, self.token, self.shaper, self.max_body)
        worker = protocol.NO_WORKER
        holding = None  # what a delta-pulling worker holds
        awaiting_push = False  # a worker that dies now loses the step it was computing
        try:
            header, body = channel.recv()
            if header.type != MsgType.HELLO:
                raise ProtocolError("no_hello", f"first frame was {header.type.name}")
            hello = protocol.parse_json(body, "hello")
            role = hello.get("role")
            if role == "worker":
                try:
                    worker = int(hello["worker"])
                except (KeyError, TypeError, ValueError):
                    raise ProtocolError("bad_hello", f"worker id {hello.get('worker')!r}") from None
                if not 0 <= worker < protocol.NO_WORKER:
                    raise ProtocolError("bad_hello", f"worker id {worker} out of range")
                holding = downlink.parse_hello(hello.get("pull"))
                examples = hello.get("examples")
                with self.cond:
                    self._owners[worker] = channel  # a restarted worker supersedes its old connection
                    if isinstance(examples, int) and not isinstance(examples, bool) and examples > 0:
                        self._examples[worker] = examples
                    self.aggregator.join(worker)
            channel.worker = worker
            if role == "probe":
                channel.max_body = max(self.max_body, probe.MAX_PROBE_BYTES)
            self.tel.event("connected", role=role, worker=worker, incarnation=hello.get("incarnation"), peer=f"{peer[0]}:{peer[1]}")
            channel.send(MsgType.WELCOME, protocol.json_body({"version": self.version, "layout": self.layout.to_json()}))
            while True:
                if role == "probe":
                    self.answer_probe(channel)
                    continue
                header, body = channel.recv(keep_buffer=True)
                if header.type == MsgType.PUSH:
                    if worker == protocol.NO_WORKER:
                        raise ProtocolError("push_from_non_worker")
                    awaiting_push = False
                    reason, row = self.push(worker, header.t0, body, protocol.HEADER.size + header.length, header.flags)
                    if reason:
                        self.send_reject(channel, worker, reason)
                        continue
                    if header.flags & Flag.NO_MODEL:
                        self.send_ack(channel, worker, row)
                    else:
                        self.send_model(channel, worker, holding, row)
                    awaiting_push = True
                elif header.type == MsgType.PULL:
                    wait_ms = int.from_bytes(body[:4], "little") if len(body) >= 4 else 0
                    self.send_model(channel, worker, holding, min_version=header.t0,
                                    max_wait_s=min(wait_ms, MAX_WAIT_MS) / 1000)
                    awaiting_push = worker != protocol.NO_WORKER
                else:
                    raise ProtocolError("unexpected", f"{header.type.name} from a device")
        except protocol.PeerClosed as exc:
            if exc.mid_frame:  # the device died while sending: the partial frame is dropped, and counted
                self.reject("partial_frame", worker, str(exc))
        except ProtocolError as exc:
            self.reject(exc.reason, worker, str(exc))
            try:
                channel.send(MsgType.REJECT, protocol.json_body({"reason": exc.reason}))
            except OSError:
                pass
        except OSError as exc:
            self.tel.event("connection_error", worker=worker, error=str(exc))
        finally:
            channel.close()
            if worker != protocol.NO_WORKER:
                with self.cond:
                    if self._owners.get(worker) is channel:  # not if a newer connection took over
                        del self._owners[worker]
                        self.rule.forget(worker)
                        self.aggregator.forget(worker)
                self.tel.event("disconnected", worker=worker, pending=awaiting_push and not self.done)

    # -- main loops -----------------------------------------------------------------------

    def report_traffic(self) -> None:
        """Per-second, per-worker bytes in and out, and the server's own counters; flushed at
        once when training ends, so the totals are complete as soon as the run is."""
        while True:
            self._flush_now.wait(1.0)
            self._flush_now.clear()
            self.flush_traffic()

    def flush_traffic(self) -> None:
        """Trace the counters since the last flush (the virtual backend calls it once a virtual second)."""
        with self.cond:
            traffic, self._traffic = self._traffic, collections.defaultdict(collections.Counter)
            version, done = self.version, self.done
            rejections = dict(self.rejections)
        for worker, counts in sorted(traffic.items()):
            self.tel.record("traffic", worker=worker, **{key: counts[key] for key in TRAFFIC_KEYS})
        self.tel.record("server", version=version, done=done, rejections=rejections)

    def serve(self) -> None:
        host, port = self.cfg.bind
        listener = socket.create_server((host, port), backlog=1024, reuse_port=False)
        self.tel.event("listening", host=host, port=port, parameters=int(self.layout.total), rule=self.rule.name,
                       kernels=self.kernels,
                       **({} if self.partition.shards == 1 else {"shard": self.cfg.shard, "shards": self.partition.shards}))
        threading.Thread(target=self.report_traffic, daemon=True, name="traffic").start()
        if self.has_clock:  # only an aggregator with a clock (FedAvg's deadlines)
            threading.Thread(target=self.tick, daemon=True, name="rounds").start()
        while True:
            sock, peer = listener.accept()
            tune(sock)
            threading.Thread(target=self.serve_connection, args=(sock, peer), daemon=True).start()


def main() -> None:
    cfg = load_config(ServerConfig)
    compiled.enable()  # before telemetry connects: the controller may send "start" at once
    tel = start(cfg)
    try:
        ParameterServer(cfg, tel).serve()
    except SystemExit:
        pass
    finally:
        tel.event("exit", role="server")
        tel.close()


if __name__ == "__main__":
    sys.exit(main())
