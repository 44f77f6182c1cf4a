"""A parameter server in-process on localhost sockets, and a client that speaks the real frames.

The server, runtime and downlink tests drive it, and so do the chaos and fuzz tests; no
TensorFlow: the layout is tiny and the server needs numpy only.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np

import compression
from compression.layout import Layout, TensorSpec
from compression.parts import SparsePart, WireFormat
from emulator.runtime import protocol
from emulator.runtime.config import LinkConfig, ServerConfig
from emulator.runtime.paramserver import ParameterServer
from emulator.runtime.protocol import MsgType
from emulator.runtime.telemetry import Telemetry
from emulator.runtime.transport import Channel

TOKEN = bytes.fromhex("00112233445566778899aabbccddeeff")
LAYOUT = Layout((TensorSpec("k", (2, 3)), TensorSpec("bias", (4,))))  # sizes 6 and 4
ALPHA = 0.5
TIMEOUT = 5.0


class RecordingTelemetry(Telemetry):
    """Telemetry that keeps its records in a list instead of sending them."""

    def __init__(self):
        super().__init__(None, TOKEN, "ps", time.time())
        self.records: list[tuple[str, dict]] = []
        self.lock = threading.Lock()

    def record(self, stream, **fields):
        with self.lock:
            self.records.append((stream, dict(fields)))

    def stream(self, name):
        with self.lock:
            return [f for s, f in self.records if s == name]


def server_config(**overrides) -> ServerConfig:
    """A server's configuration as the controller writes it, with ``overrides`` by field."""
    fields = {"name": "server", "token": TOKEN.hex(), "start_time": 0.0, "collector": None, "seed": 3,
              "bind": ("127.0.0.1", 0), "layout": LAYOUT.to_json(), "rule": "adacomp", "learning_rate": ALPHA,
              "max_updates": None, "transport": LinkConfig(), "checkpoint": None}
    return ServerConfig(**{**fields, **overrides})


class Harness:
    def __init__(self, **overrides):
        self.tel = RecordingTelemetry()
        self.server = ParameterServer(server_config(**overrides), self.tel)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.clients: list[Client] = []
        self.threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._loop, daemon=True)
        self._accept.start()

    def _loop(self):  # what ParameterServer.serve does, on a port the test knows
        while True:
            try:
                sock, peer = self.listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self.server.serve_connection, args=(sock, peer), daemon=True)
            self.threads.append(t)
            t.start()

    def client(self, role="worker", worker=0, hello=True) -> "Client":
        c = Client(self.port, role, worker, hello)
        self.clients.append(c)
        return c

    def start(self):
        self.server.control({"cmd": "start"})

    def close(self):
        self.server.finish("test over")  # releases pulls still waiting for the start
        self.listener.close()
        for c in self.clients:
            c.close()
        for t in self.threads:
            t.join(TIMEOUT)
            assert not t.is_alive(), "a connection thread did not end"


class Client:
    def __init__(self, port, role, worker, hello):
        sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.sock = sock
        self.channel = Channel(sock, TOKEN, max_body=1 << 20, worker=worker if role == "worker" else protocol.NO_WORKER)
        if hello:
            self.channel.send(MsgType.HELLO, protocol.json_body({"role": role, "worker": worker, "incarnation": 0}))
            header, body = self.channel.recv()
            assert header.type == MsgType.WELCOME
            self.welcome = protocol.parse_json(body, "welcome")

    def pull(self, t0=0, wait_ms=None):
        self.channel.send(MsgType.PULL, b"" if wait_ms is None else int(wait_ms).to_bytes(4, "little"), t0=t0)

    def push(self, parts, t0, wire=WireFormat()):
        self.channel.send(MsgType.PUSH, compression.encode(parts, LAYOUT, wire), t0=t0)

    def push_raw(self, message: bytes, t0):
        self.channel.send(MsgType.PUSH, message, t0=t0)

    def recv(self):
        header, body = self.channel.recv()
        return header, bytes(body)

    def model(self):
        header, body = self.recv()
        assert header.type == MsgType.MODEL, (header.type, body)
        return header, np.frombuffer(body, "<f4").copy()

    def rejected(self) -> str:
        header, body = self.recv()
        assert header.type == MsgType.REJECT, header.type
        return json.loads(body)["reason"]

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True

    def close(self):
        self.channel.close()


def sparse(indices, values):
    return SparsePart(np.array(indices, np.int64), np.array(values, np.float32))


def update(k_idx=(1, 4), k_val=(1.0, -2.0), b_idx=(0,), b_val=(4.0,)):
    return [sparse(k_idx, k_val), sparse(b_idx, b_val)]


def expected_step(params, parts, scale=1.0):
    out = params.copy()
    for part, offset, size in zip(parts, LAYOUT.offsets, LAYOUT.sizes):
        out[offset : offset + size] -= np.float32(ALPHA * scale) * part.dense(size)
    return out


# ---------------------------------------------------------------------------------------
