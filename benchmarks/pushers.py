"""A real parameter-server process on loopback, and synthetic workers that push at it.

:class:`ServerProcess` starts ``python -m emulator.runtime.paramserver`` as a run does, its
telemetry going to a real :class:`~emulator.control.collector.Collector` (and run directory) in this
process. :func:`pusher` is one synthetic worker, a process of its own: HELLO, pull, then push
pre-encoded updates (one, or a pool it cycles through) and wait for the model in reply, as a
worker does, until its time is up. With ``pull`` it asks for delta pulls in its HELLO; it counts
the replies' bytes but does not apply them (the server's side is what is measured).
Used by the ingest benchmark (:mod:`benchmarks.server`) and the load test (:mod:`benchmarks.load`).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ServerProcess:
    """``with ServerProcess(layout, rule) as ps:`` a parameter server listening on ``ps.address``."""

    def __init__(self, layout, rule: str, *, learning_rate: float = 0.01, max_updates: int | None = None,
                 compiled: bool = True, partition: dict | None = None, shard: int = 0, token: bytes | None = None):
        self.layout = layout
        self.partition, self.shard = partition, shard  # one shard of a model split over several servers
        self.name = "server" if partition is None else f"server-{shard}"
        self.rule = rule
        self.learning_rate = learning_rate
        self.max_updates = max_updates
        self.compiled = compiled  # False: the server's hot path runs numpy (EMULATE_COMPILED=0)
        self.token = token or secrets.token_bytes(16)
        self.observers = []

    def __enter__(self) -> "ServerProcess":
        from emulator.backends.local import free_port
        from emulator.control.collector import Collector
        from emulator.control.rundir import RunDirectory
        from emulator.runtime.config import LinkConfig, ServerConfig

        self._tmp = tempfile.TemporaryDirectory()
        self.rundir = RunDirectory(Path(self._tmp.name) / "run")
        self.collector = Collector(self.rundir, self.token).start()
        self.address = ("127.0.0.1", free_port())
        cfg = ServerConfig(name=self.name, token=self.token.hex(), start_time=time.time(), seed=0,
                           collector=tuple(self.collector.address), bind=self.address, layout=self.layout.to_json(),
                           rule=self.rule, learning_rate=self.learning_rate, max_updates=self.max_updates,
                           transport=LinkConfig(), checkpoint=None, partition=self.partition, shard=self.shard)
        env = dict(os.environ, EMU_CONFIG=json.dumps(cfg.to_json()), PYTHONPATH=str(ROOT),
                   EMULATE_COMPILED="1" if self.compiled else "0")
        self.process = subprocess.Popen([sys.executable, "-m", "emulator.runtime.paramserver"], env=env, stderr=subprocess.DEVNULL)
        self.pid = self.process.pid
        return self

    def observe(self, observer) -> None:
        """``observer(stream, records)`` for every trace the server sends."""
        self.collector.observe(observer)

    def start_training(self, timeout_s: float = 60.0) -> None:
        """Wait for the server's telemetry to connect, then send ``start`` (pulls wait for it)."""
        deadline = time.monotonic() + timeout_s
        while self.name not in self.collector.connected():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the parameter server did not come up")
            time.sleep(0.05)
        time.sleep(0.5)
        self.collector.send(self.name, {"cmd": "start"})

    def stop_training(self) -> None:
        self.collector.send(self.name, {"cmd": "stop"})

    def __exit__(self, *exc) -> None:
        try:
            self.process.terminate()
            self.process.wait(timeout=10)
        finally:
            self.collector.close()
            self.rundir.close()
            self._tmp.cleanup()


def pusher(address, token: bytes, worker: int, message: bytes | list[bytes], seconds: float, start_evt, result_q, ready=None,
           pull: dict | None = None) -> None:
    """One synthetic worker; puts ``{worker, pushes, answered, rejected, errors, push_bytes, reply_bytes}``
    on ``result_q`` (bytes of the frames, headers included, of the answered exchanges).

    ``message``: one update, or a list that this worker cycles through from position ``worker``.
    ``ready`` (a shared counter) is incremented once this worker holds its first model. ``pull``:
    the HELLO's pull setting (``{"mode": "delta", "values": "f32"}``; None: dense pulls)."""
    from emulator.runtime import protocol
    from emulator.runtime.protocol import MsgType
    from emulator.runtime.transport import Channel, connect

    out = {"worker": worker, "pushes": 0, "answered": 0, "rejected": 0, "errors": [], "push_bytes": 0, "reply_bytes": 0}
    messages = [message] if isinstance(message, (bytes, bytearray)) else list(message)
    channel = None
    try:
        channel = Channel(connect(address), token, None, 16 << 20, worker=worker)
        hello = {"role": "worker", "worker": worker, **({"pull": pull} if pull else {})}
        channel.send(MsgType.HELLO, protocol.json_body(hello))
        channel.recv()
        start_evt.wait()
        channel.send(MsgType.PULL)
        header, _ = channel.recv(keep_buffer=True)
        if ready is not None:
            with ready.get_lock():
                ready.value += 1
        deadline = time.perf_counter() + seconds
        position = worker
        while time.perf_counter() < deadline and not header.flags & protocol.Flag.DONE:
            sent = channel.send(MsgType.PUSH, messages[position % len(messages)], t0=header.t0)
            position += 1
            out["pushes"] += 1
            header, body = channel.recv(keep_buffer=True)
            if header.type == MsgType.MODEL:
                out["answered"] += 1
                out["push_bytes"] += sent
                out["reply_bytes"] += protocol.HEADER.size + header.length
            elif header.type == MsgType.REJECT:
                out["rejected"] += 1
                out["errors"].append(f"rejected: {bytes(body)[:200]!r}")
                channel.send(MsgType.PULL)
                header, _ = channel.recv(keep_buffer=True)
            else:
                out["errors"].append(f"unexpected {header.type.name}")
                break
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out["errors"].append(f"{type(exc).__name__}: {exc}")
    finally:
        if channel is not None:
            channel.close()
        result_q.put(out)
