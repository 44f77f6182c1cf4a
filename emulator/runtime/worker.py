"""A worker device: pull the model, compute a gradient on its own shard, compress it, push it.

The push is answered with the new model, so a step costs one round trip: the whole model, or
with ``pull: {mode: delta}`` what changed since the version this worker holds (its
:class:`~.downlink.ModelCopy` applies it). With ``pull: {every: m}`` only every m-th push asks
for the model; the others are answered with an ACK and the next gradient is computed on the
model this worker already holds (stale by its own pushes and everyone else's). Per-second step
statistics (compute, compression, waiting on the network) go to the controller as traces.
A gradient with NaN or Inf is not compressed (a selection would silently trim it): the push
is a short report flagged ``NON_FINITE`` instead, which the server refuses and counts toward
divergence.

With local steps (``method.local``, :mod:`.local`) a step is H SGD steps on the worker's own copy
and the push carries the model delta instead of a gradient, through the same compressor.

Run as ``python -m emulator.runtime.worker`` with its :class:`~.config.WorkerConfig` in ``$EMU_CONFIG``.
"""

from __future__ import annotations

import queue
import sys
import threading
import time

import numpy as np

import compression
from compression import codec
from compression.layout import Layout

from emulator.runtime import partition, probe, protocol
from emulator.runtime.bootstrap import limit_threads, run_device
from emulator.runtime.config import MethodConfig, WorkerConfig
from emulator.runtime.data import BatchSampler, load_shard
from emulator.runtime.downlink import ModelCopy
from emulator.runtime.local import local_delta, steps_per_push
from emulator.runtime.protocol import Flag, MsgType
from emulator.runtime.transport import Channel, TransportShaper, open_session


REPORT_BYTES = 200  # at most this much of a non-finite report's text travels


def push_body(compressor, grads: list[np.ndarray], layout: Layout, wire) -> tuple[bytes, int]:
    """The PUSH frame's body and flags for one gradient: its codec message, or for a gradient
    with NaN or Inf the names of the tensors that hold them, flagged ``NON_FINITE``."""
    bodies, flags = push_bodies(compressor, grads, partition.build(layout, 1), wire)
    return bodies[0], flags


def push_bodies(compressor, grads: list[np.ndarray], split: partition.Partition, wire) -> tuple[list[bytes], int]:
    """:func:`push_body` for every server: each shard's message (an empty part where the
    update sent nothing to it, so every push reaches every shard), or the same report to each."""
    try:
        parts = compressor.compress(grads)
    except compression.NonFiniteGradient as exc:
        return [str(exc).encode()[:REPORT_BYTES]] * split.shards, Flag.NON_FINITE
    if split.shards == 1:
        return [compression.encode(parts, split.layout, wire)], Flag.NONE
    parts = codec.round_trip(parts, wire)  # the values as the servers will decode them, then cut at the bounds
    return [codec.encode(mine, piece, wire, flags) for mine, piece, flags in
            zip(split.split(parts), split.layouts, split.flags(parts, wire.flags))], Flag.NONE


def build_compressor(method: MethodConfig, layout: Layout, seed: int):
    wire = compression.WireFormat(values=method.wire.values, indices=method.wire.indices)
    compressor = compression.build(method.compressor, method.params, layout, seed)
    if method.error_feedback:
        compressor = compression.ErrorFeedback(compressor, wire)
    return compressor, wire


class StepStats:
    """Sums over one reporting interval."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.steps = 0
        self.compute_s = self.compress_s = self.network_s = self.loss = 0.0
        self.compute_cpu_s = self.compress_cpu_s = 0.0
        self.bytes = 0
        self.pulls = self.pull_bytes = 0  # MODEL frames received (whole or delta) and their bytes
        self.rejected = 0
        self.non_finite = 0  # steps whose gradient held NaN or Inf (reported, not pushed)

    def as_record(self) -> dict:
        n = max(1, self.steps)
        return {
            "steps": self.steps, "rejected": self.rejected, "non_finite": self.non_finite, "push_bytes": self.bytes,
            "pulls": self.pulls, "pull_bytes": self.pull_bytes,
            "compute_ms": round(1000 * self.compute_s / n, 3), "compress_ms": round(1000 * self.compress_s / n, 3),
            "network_ms": round(1000 * self.network_s / n, 3), "loss": round(self.loss / n, 5),
            # CPU time of the process: under a CPU quota the wall times above also hold the waits
            # for the next scheduling period, charged to whichever phase ran out of quota.
            "compute_cpu_ms": round(1000 * self.compute_cpu_s / n, 3), "compress_cpu_ms": round(1000 * self.compress_cpu_s / n, 3),
        }


DOWN = (None, None)  # the "reply" of a server that is down while the worker goes on without it (skip)


class Sessions:
    """A worker's sessions with every server, and what it does when one goes away.

    ``wait`` (the default): the lost connection's error reaches the caller, which reconnects to every
    server (:meth:`rejoin_all`) and takes the model again; nothing is pushed meanwhile. ``skip``: the
    worker goes on with the servers that are up; the part of each update that belongs to a down server
    is dropped (counted), its part of the model stays as last pulled, and a background thread
    reconnects; once back, :meth:`rejoined` hands over that server's model. With every server down
    the worker waits for the first to come back."""

    def __init__(self, join, shards: int, *, skip: bool, tel, worker: int):
        self.join, self.shards, self.skip, self.tel, self.worker = join, shards, skip, tel, worker
        self.channels: list[Channel | None] = [join(i) for i in range(shards)]
        self.back: queue.SimpleQueue = queue.SimpleQueue()  # (shard, channel) reconnected in the background
        self.skipped = [0] * shards  # update parts dropped since each server went down
        self.stopping = threading.Event()

    def pull_all(self) -> list:
        """Ask every server for the model: their first replies (sent once training has started)."""
        for i in range(self.shards):
            self.send(i, MsgType.PULL)
        return [self.recv(i) for i in range(self.shards)]

    def _close_all(self) -> None:
        for channel in self.channels:
            if channel is not None:
                channel.close()

    def rejoin_all(self) -> list:
        """wait: close every session, reconnect to every server (with backoff), take the model from each."""
        self._close_all()
        self.channels[:] = [self.join(i) for i in range(self.shards)]
        return self.pull_all()

    def send(self, shard: int, kind: MsgType, body: bytes = b"", **header) -> int:
        """Bytes sent to ``shard``; 0 where it is down (skip: that part of the update is dropped)."""
        channel = self.channels[shard]
        if channel is not None:
            try:
                return channel.send(kind, body, **header)
            except (OSError, protocol.PeerClosed) as exc:
                self._lost(shard, exc)
        self.skipped[shard] += kind == MsgType.PUSH
        return 0

    def recv(self, shard: int):
        channel = self.channels[shard]
        if channel is None:
            return DOWN
        try:
            return channel.recv(keep_buffer=True)
        except (OSError, protocol.PeerClosed) as exc:
            self._lost(shard, exc)
            return DOWN

    def _lost(self, shard: int, exc: Exception) -> None:
        if not self.skip:
            raise exc
        self.channels[shard].close()
        self.channels[shard] = None
        self.tel.event("server_lost", worker=self.worker, shard=shard, detail=str(exc), going_on=True)
        threading.Thread(target=self._reconnect, args=(shard,), daemon=True, name=f"rejoin-{shard}").start()

    def _reconnect(self, shard: int) -> None:
        while not self.stopping.is_set():
            try:
                self.back.put((shard, self.join(shard)))
                return
            except OSError:  # still down after the connect timeout: keep trying
                continue

    def rejoined(self) -> dict[int, tuple]:
        """skip: the servers that came back since the last call, each with its reply to a PULL (its model)."""
        out = {}
        while True:
            if not self.skip or any(c is not None for c in self.channels) or self.stopping.is_set():
                try:
                    shard, channel = self.back.get_nowait()
                except queue.Empty:
                    return out
            else:  # every server is down: nothing to push to, wait for one
                shard, channel = self.back.get()
            self.channels[shard] = channel
            self.send(shard, MsgType.PULL)
            out[shard] = reply = self.recv(shard)
            if reply is not DOWN:
                self.tel.event("reconnected", worker=self.worker, shard=shard, version=reply[0].t0,
                               skipped=self.skipped[shard])
                self.skipped[shard] = 0

    def finish(self) -> dict:
        """Close every session; the update parts dropped for servers still down (skip), for the summary."""
        self.stopping.set()
        self._close_all()
        return {"skipped": sum(self.skipped)} if self.skip else {}


def run(cfg: WorkerConfig, tel) -> int:
    from emulator.runtime.models import TFModel, resolve

    index = cfg.worker
    threads = limit_threads(cfg.cpus)
    x, y = load_shard(cfg.shard)
    model = TFModel(resolve(cfg.model, cfg.model_args, cfg.model_output, checked=True), x.shape[1:], cfg.classes, threads)
    layout = model.layout
    seed = cfg.seed
    compressor, wire = build_compressor(cfg.method, layout, seed)
    pull = cfg.method.pull
    copy = ModelCopy(layout)
    sampler = BatchSampler(x, y, cfg.batch_size, seed)
    shaper = TransportShaper.from_config(cfg.transport, seed)
    token = bytes.fromhex(cfg.token)
    addresses = [tuple(a) for a in cfg.servers] if cfg.servers else [cfg.ps]

    def run_probe(command: dict) -> None:
        try:
            record = {}
            if command.get("up_bytes"):
                address = addresses[command.get("shard", 0)]  # with several servers, the one the controller names
                record.update(probe.measure_link(address, token, shaper, up_bytes=command["up_bytes"], down_bytes=command["down_bytes"]))
            if command.get("cpu_s"):
                record["cpu_share"] = probe.measure_cpu(command["cpu_s"])
            tel.record("fidelity", worker=index, **record)
        except (OSError, protocol.ProtocolError) as exc:
            tel.event("error", reason="probe_failed", detail=str(exc))
            tel.record("fidelity", worker=index, probe_error=str(exc))

    def on_control(command: dict) -> None:
        if command.get("cmd") == "shape":
            shaper.update(command.get("transport", {}))
        elif command.get("cmd") == "probe":
            threading.Thread(target=run_probe, args=(command,), daemon=True, name="probe").start()

    tel.on_control(on_control)
    splits = np.array(layout.offsets[1:])

    local = cfg.method.local
    local_steps = steps_per_push(local, len(x), cfg.batch_size) if local is not None else 0
    # examples: what a federated server weighs this worker's deltas by (its shard's size)
    hello = {"role": "worker", "worker": index, "incarnation": cfg.incarnation, "pull": pull.hello(), "examples": len(x)}
    split = partition.from_json(cfg.partition, layout)
    copies = [copy] if split.shards == 1 else [ModelCopy(piece) for piece in split.layouts]

    def join(shard: int) -> Channel:
        """Connect to one server and introduce ourselves; the server's part of the model must be ours."""
        channel, welcome = open_session(addresses[shard], token, hello, shaper=shaper, max_body=layout.total * 4 + 4096,
                                        worker=index, timeout_s=cfg.connect_timeout_s)
        if Layout.from_json(welcome["layout"]) != split.layouts[shard]:
            raise protocol.ProtocolError("layout_mismatch", "the server's model is not this worker's")
        return channel

    when_down = (cfg.partition or {}).get("when_down", "wait")
    servers = Sessions(join, split.shards, skip=when_down == "skip", tel=tel, worker=index)
    model.warm_up(np.zeros(layout.total, np.float32), *sampler.next())
    tel.event("worker_ready", worker=index, incarnation=cfg.incarnation, shard_size=len(x))
    replies = servers.pull_all()

    stats, last_report = StepStats(), time.monotonic()
    since_pull = 0  # pushes since the model was last received
    while True:
        for shard, reply in servers.rejoined().items():  # skip: a server that came back, its part of the model again
            replies[shard] = reply
        if any(header is not None and header.flags & Flag.DONE for header, _ in replies):
            break
        try:
            rejected = [i for i, (header, _) in enumerate(replies) if header is not None and header.type == MsgType.REJECT]
            if rejected:  # a refused push: that server's model again (the others answered it)
                for i in rejected:
                    stats.rejected += 1
                    tel.event("push_rejected", worker=index, reason=protocol.parse_json(replies[i][1], "reject").get("reason"))
                    servers.send(i, MsgType.PULL)
                    replies[i] = servers.recv(i)
                continue
            for (header, body), mine in zip(replies, copies):
                if header is None:  # that server is down (skip): its part of the model stays as last pulled
                    continue
                if header.type == MsgType.MODEL:
                    mine.receive(header.t0, header.flags, body)
                    stats.pulls += 1
                    stats.pull_bytes += protocol.HEADER.size + header.length
                    since_pull = 0
                elif header.type != MsgType.ACK:
                    raise protocol.ProtocolError("unexpected", f"{header.type.name} from the server")
            params = copy.params if split.shards == 1 else split.assemble([mine.params for mine in copies])
            t_start, c_start = time.perf_counter(), time.process_time()
            if local is None:
                xb, yb = sampler.next()
                loss, grad = model.gradient(params, xb, yb)
            else:
                grad, loss = local_delta(params, model.gradient, sampler.next, local_steps, local.learning_rate)
            t_grad, c_grad = time.perf_counter(), time.process_time()
            messages, flags = push_bodies(compressor, np.split(grad, splits), split, wire)
            t_comp, c_comp = time.perf_counter(), time.process_time()
            since_pull += 1
            if since_pull < pull.every:
                flags |= Flag.NO_MODEL
            for i, (message, mine) in enumerate(zip(messages, copies)):  # to every server, then their answers
                stats.bytes += servers.send(i, MsgType.PUSH, message, t0=mine.version, flags=flags)
            stats.non_finite += bool(flags & Flag.NON_FINITE)
            replies = [servers.recv(i) for i in range(split.shards)]
        except (OSError, protocol.PeerClosed) as exc:
            # wait: a server went away (crash, restart): reconnect to all with backoff, take the model again.
            tel.event("server_lost", worker=index, detail=str(exc))
            replies = servers.rejoin_all()
            tel.event("reconnected", worker=index, version=replies[0][0].t0)
            continue
        t_net = time.perf_counter()
        stats.steps += 1
        stats.loss += loss
        stats.compute_s += t_grad - t_start
        stats.compress_s += t_comp - t_grad
        stats.compute_cpu_s += c_grad - c_start
        stats.compress_cpu_s += c_comp - c_grad
        stats.network_s += t_net - t_comp
        if t_net - last_report >= 1.0:
            tel.record("steps", worker=index, **stats.as_record())
            stats.reset()
            last_report = t_net
    if stats.steps:
        tel.record("steps", worker=index, **stats.as_record())
    tel.event("worker_finished", worker=index, **servers.finish())
    return 0


def main() -> int:
    return run_device(run, WorkerConfig)


if __name__ == "__main__":
    sys.exit(main())
