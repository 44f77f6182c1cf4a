"""Traces from a device to the controller's collector, and control commands back.

Records are batched and sent every quarter second as TRACE frames over one TCP connection
per device; the collector writes them to the run directory as they arrive. The same
connection carries CONTROL commands (stop, change the transport shaper, ...) the other way.
If the collector cannot be reached, records are kept (bounded) and sent after reconnecting;
what had to be dropped is counted and reported.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Callable

from emulator.runtime import protocol
from emulator.runtime.transport import connect

FLUSH_S = 0.25
MAX_PENDING = 200_000


class Telemetry:
    def __init__(self, address: tuple[str, int] | None, token: bytes, source: str, start_time: float):
        self.address = tuple(address) if address else None
        self.token = token
        self.source = source
        self.start_time = start_time
        self._pending: collections.deque = collections.deque()
        self._dropped = 0
        self._lock = threading.Lock()
        self._handlers: list[Callable[[dict], None]] = []
        self._closing = threading.Event()
        self._sock = None
        self._sent_any = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        if self.address:
            self._thread.start()

    def now(self) -> float:
        """Seconds since the run started (the timeline's clock)."""
        return time.time() - self.start_time

    def record(self, stream: str, **fields) -> None:
        fields.setdefault("ts", round(self.now(), 4))
        fields["source"] = self.source
        if not self.address:
            print(stream, fields, file=sys.stderr)
            return
        with self._lock:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self._dropped += 1
            self._pending.append((stream, fields))

    def event(self, kind: str, **fields) -> None:
        self.record("events", kind=kind, **fields)

    def on_control(self, handler: Callable[[dict], None]) -> None:
        self._handlers.append(handler)

    def close(self, timeout_s: float = 3.0) -> None:
        """Flush what is pending (up to ``timeout_s``) and stop."""
        if not self.address:
            return
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.02)
        self._closing.set()
        self._thread.join(timeout=max(0.1, deadline - time.monotonic()))
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass

    # -- background ---------------------------------------------------------------------

    def _take_batch(self) -> dict[str, list]:
        batch: dict[str, list] = {}
        with self._lock:
            while self._pending:
                stream, fields = self._pending.popleft()
                batch.setdefault(stream, []).append(fields)
            if self._dropped:
                batch.setdefault("events", []).append(
                    {"kind": "telemetry_dropped", "count": self._dropped, "source": self.source, "ts": round(self.now(), 4)}
                )
                self._dropped = 0
        return batch

    def _requeue(self, batch: dict[str, list]) -> None:
        with self._lock:
            for stream, records in reversed(list(batch.items())):
                self._pending.extendleft((stream, r) for r in reversed(records))

    def _run(self) -> None:
        batch: dict[str, list] = {}
        while not self._closing.is_set():
            try:
                self._sock = connect(self.address, timeout_s=30.0, what="collector")
                reader = threading.Thread(target=self._read_controls, args=(self._sock,), daemon=True)
                reader.start()
                protocol.send_frame(self._sock, protocol.MsgType.HELLO, self.token, protocol.json_body({"source": self.source}))
                while True:
                    closing = self._closing.is_set()
                    batch = self._take_batch()
                    for stream in list(batch):
                        body = protocol.json_body({"stream": stream, "records": batch[stream]})
                        protocol.send_frame(self._sock, protocol.MsgType.TRACE, self.token, body)
                        del batch[stream]
                    if closing:
                        return
                    self._closing.wait(FLUSH_S)
            except (OSError, ConnectionError, protocol.ProtocolError) as exc:
                self._requeue(batch)
                batch = {}
                if self._closing.is_set():
                    return
                print(f"[{self.source}] collector connection lost: {exc}; retrying", file=sys.stderr)
                time.sleep(0.5)

    def _read_controls(self, sock) -> None:
        try:
            while True:
                header, body = protocol.recv_frame(sock, self.token, 1 << 20)
                if header.type == protocol.MsgType.CONTROL:
                    command = protocol.parse_json(body, "control")
                    for handler in self._handlers:
                        handler(command)
        except (OSError, protocol.ProtocolError):
            return
