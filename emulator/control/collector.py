"""The controller's end of the trace path: devices connect, stream records, receive commands.

One small TCP server per run, bound only where the devices can reach it (loopback for the
local backend, the run network's gateway for Docker). Every frame must carry the run's
token; records go to the run directory as they arrive and to any observers (live progress,
training-aware fault triggers). Commands go back on the same connection by device name.
"""

from __future__ import annotations

import socket
import threading
from typing import Callable

from emulator.host.peerserver import PeerServer
from emulator.control.rundir import STREAMS, RunDirectory
from emulator.runtime import protocol

MAX_TRACE_FRAME = 8 << 20

Observer = Callable[[str, list[dict]], None]


class Collector(PeerServer):
    thread_name = "collector"

    def __init__(self, rundir: RunDirectory, token: bytes, host: str = "127.0.0.1", port: int = 0, *,
                 clock: Callable[[], float] | None = None):
        super().__init__(socket.create_server((host, port), backlog=1024))
        self.rundir = rundir
        self.token = token
        self.clock = clock  # the run's trace clock, for the collector's own records
        self.address = self._listener.getsockname()[:2]
        self._observers: list[Observer] = []
        self.refused: dict[str, int] = {}

    def observe(self, observer: Observer) -> None:
        self._observers.append(observer)

    def emit(self, stream: str, records: list[dict]) -> None:
        """Write records (the controller's own, or a device's) and tell the observers."""
        self.rundir.append(stream, records)
        for observer in self._observers:
            observer(stream, records)

    def send(self, device: str, command: dict) -> bool:
        """Send a command to a connected device; False if it is not connected."""
        with self._lock:
            peer = self._peers.get(device)
        if peer is None:
            return False
        sock, lock = peer
        try:
            with lock:
                protocol.send_frame(sock, protocol.MsgType.CONTROL, self.token, protocol.json_body(command))
            return True
        except OSError:
            return False

    def connected(self) -> list[str]:
        with self._lock:
            return sorted(self._peers)

    def _refuse(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1

    def _serve(self, sock: socket.socket, peer) -> None:
        source = None
        try:
            header, body = protocol.recv_frame(sock, self.token, MAX_TRACE_FRAME)
            if header.type != protocol.MsgType.HELLO:
                raise protocol.ProtocolError("no_hello")
            source = str(protocol.parse_json(body, "hello").get("source", "?"))[:64]
            with self._lock:
                self._peers[source] = (sock, threading.Lock())
            while True:
                header, body = protocol.recv_frame(sock, self.token, MAX_TRACE_FRAME)
                if header.type != protocol.MsgType.TRACE:
                    raise protocol.ProtocolError("unexpected", header.type.name)
                message = protocol.parse_json(body, "trace")
                stream, records = message.get("stream"), message.get("records")
                if stream not in STREAMS or not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                    self._refuse("bad_trace")
                    continue
                self.emit(stream, records)
        except protocol.PeerClosed:
            pass
        except protocol.ProtocolError as exc:
            self._refuse(exc.reason)
            if exc.reason == "bad_token":
                stamp = {"ts": round(self.clock(), 4)} if self.clock else {}
                self.emit("events", [{**stamp, "source": "collector", "kind": "collector_refused", "reason": "bad_token",
                                      "peer": f"{peer[0]}:{peer[1]}"}])
        except OSError:
            pass
        finally:
            with self._lock:
                if source and self._peers.get(source, (None,))[0] is sock:
                    del self._peers[source]
            sock.close()
