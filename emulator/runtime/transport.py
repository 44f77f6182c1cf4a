"""Link properties applied by the process itself, where the kernel cannot apply them.

The backend decides per property who realises it (netem, tc rate limiting, iptables, or
this module) and hands the rest to :class:`TransportShaper`: a token bucket per direction
and a one-way delay (with jitter) applied to whole frames. The worker applies its own
uplink on send and its downlink on receive; a server applies its caps to all its
connections through shared buckets. Settings change at run time through :meth:`update`.
"""

from __future__ import annotations

import random
import socket
import threading
import time

from emulator.runtime import protocol
from emulator.runtime.config import LinkConfig

CHUNK = 16 * 1024


class TokenBucket:
    """Blocking token bucket in bytes; ``rate_bps`` None means unlimited."""

    def __init__(self, rate_bps: float | None = None):
        self._lock = threading.Lock()
        self._tokens = 0.0
        self._stamp = time.monotonic()
        self.set_rate(rate_bps)

    def set_rate(self, rate_bps: float | None) -> None:
        with self._lock:
            self.rate = rate_bps / 8.0 if rate_bps else None
            self.burst = max(CHUNK, (self.rate or 0) * 0.005)
            self._tokens = min(self._tokens, self.burst)

    def consume(self, nbytes: int) -> None:
        if not self.rate:
            return
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= nbytes
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


class TransportShaper:
    """The link properties this process must realise itself: rate per direction and delay."""

    def __init__(self, uplink_bps=None, downlink_bps=None, delay_s=0.0, jitter_s=0.0, seed=0, *, send_bucket=None, recv_bucket=None):
        self.send_bucket = send_bucket or TokenBucket(uplink_bps)
        self.recv_bucket = recv_bucket or TokenBucket(downlink_bps)
        self.delay_s = float(delay_s or 0.0)
        self.jitter_s = float(jitter_s or 0.0)
        self._rng = random.Random(seed)
        self._open = threading.Event()
        self._open.set()

    @classmethod
    def from_config(cls, link: LinkConfig | None, seed: int = 0) -> "TransportShaper":
        """The shaper of a device's configured ``transport`` (None: unshaped); it never drops packets, so ``loss`` is not its."""
        link = link or LinkConfig()
        return cls(link.uplink_bps, link.downlink_bps, link.delay_s, link.jitter_s, seed)

    def update(self, cfg: dict) -> None:
        """Apply a run-time change (only the keys present)."""
        if "uplink_bps" in cfg:
            self.send_bucket.set_rate(cfg["uplink_bps"])
        if "downlink_bps" in cfg:
            self.recv_bucket.set_rate(cfg["downlink_bps"])
        if "delay_s" in cfg:
            self.delay_s = float(cfg["delay_s"] or 0.0)
        if "jitter_s" in cfg:
            self.jitter_s = float(cfg["jitter_s"] or 0.0)
        if "blocked" in cfg:
            (self._open.clear if cfg["blocked"] else self._open.set)()

    def wait_open(self) -> None:
        """Block while the link is cut (a partition realised in the transport); an open link takes
        no lock (Event.wait does: three times an update, in every connection thread)."""
        if not self._open.is_set():
            self._open.wait()

    def one_way_delay(self) -> float:
        if self.jitter_s:
            return max(0.0, self._rng.gauss(self.delay_s, self.jitter_s))
        return self.delay_s


class ShapedSocket:
    """A socket whose ``sendall``/``recv_into`` pace bytes through the shaper's buckets."""

    def __init__(self, sock: socket.socket, shaper: TransportShaper):
        self.sock = sock
        self.shaper = shaper

    def sendall(self, data) -> None:
        self.shaper.wait_open()
        view = memoryview(data).cast("B")
        if not self.shaper.send_bucket.rate:
            self.sock.sendall(view)
            return
        for pos in range(0, len(view), CHUNK):
            chunk = view[pos : pos + CHUNK]
            self.shaper.send_bucket.consume(len(chunk))
            self.sock.sendall(chunk)

    def recv_into(self, view, nbytes: int = 0) -> int:
        """Up to ``nbytes``: paced in chunks under a rate, else all of them in one call
        (``MSG_WAITALL``: one system call and one GIL hand-off per frame, not one per segment)."""
        self.shaper.wait_open()
        limit = nbytes or len(view)
        if self.shaper.recv_bucket.rate:
            got = self.sock.recv_into(view, min(limit, CHUNK))
            self.shaper.recv_bucket.consume(got)
            return got
        return self.sock.recv_into(view, limit, socket.MSG_WAITALL)


class Channel:
    """Framed, shaped, authenticated conversation with one peer."""

    def __init__(self, sock: socket.socket, token: bytes, shaper: TransportShaper | None = None, max_body: int = 1 << 20, worker: int = protocol.NO_WORKER):
        self.sock = sock
        self.token = token
        self.shaper = shaper or TransportShaper()
        self.io = ShapedSocket(sock, self.shaper)
        self.max_body = max_body
        self.worker = worker
        self._buffer = bytearray()
        self.bytes_sent = 0
        self.bytes_received = 0

    def send(self, type_: protocol.MsgType, body: bytes | memoryview = b"", **fields) -> int:
        delay = self.shaper.one_way_delay()
        if delay:
            time.sleep(delay)
        fields.setdefault("worker", self.worker)
        sent = protocol.send_frame(self.io, type_, self.token, body, **fields)
        self.bytes_sent += sent
        return sent

    def recv(self, keep_buffer: bool = False) -> tuple[protocol.Header, memoryview]:
        """Next frame; with ``keep_buffer`` the body reuses one buffer (valid until the next recv)."""
        header = self.recv_header()
        body = protocol.recv_body(self.io, header, self._buffer if keep_buffer else None)
        if keep_buffer and len(self._buffer) < header.length:
            self._buffer = body.obj if isinstance(body.obj, bytearray) else bytearray(body)
        self.after_receive()
        return header, body

    def recv_header(self) -> protocol.Header:
        """The next frame's header only (checked); the caller reads exactly ``length`` body bytes."""
        header = protocol.parse_header(protocol.recv_exact(self.io, protocol.HEADER.size), self.token, self.max_body)
        self.bytes_received += protocol.HEADER.size + header.length
        return header

    def after_receive(self) -> None:
        """The link's one-way delay, applied once a whole frame has arrived."""
        delay = self.shaper.one_way_delay()
        if delay:
            time.sleep(delay)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def tune(sock: socket.socket) -> None:
    """No Nagle delay on small frames; keepalives so a peer lost behind a partition is noticed."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def connect(address: tuple[str, int], *, timeout_s: float = 60.0, what: str = "peer") -> socket.socket:
    """Connect with exponential backoff until ``timeout_s``: peers start in any order."""
    deadline = time.monotonic() + timeout_s
    wait = 0.05
    while True:
        try:
            sock = socket.create_connection(tuple(address), timeout=10)
            sock.settimeout(None)
            tune(sock)
            return sock
        except OSError as exc:
            if time.monotonic() + wait > deadline:
                raise ConnectionError(f"cannot reach {what} at {address[0]}:{address[1]}: {exc}") from None
            time.sleep(wait)
            wait = min(wait * 2, 1.0)


def open_session(address, token: bytes, hello: dict, *, shaper: TransportShaper | None = None, max_body: int = 1 << 20,
                 worker: int = protocol.NO_WORKER, timeout_s: float = 300.0) -> tuple[Channel, dict]:
    """Connect, say HELLO and read the WELCOME, retrying with backoff until ``timeout_s``.

    A server that is restarting may accept a connection and drop it before answering; that
    counts as "not up yet", not as a failure."""
    deadline = time.monotonic() + timeout_s
    wait = 0.1
    while True:
        channel = None
        try:
            sock = connect(tuple(address), timeout_s=max(1.0, deadline - time.monotonic()), what="parameter server")
            channel = Channel(sock, token, shaper, max_body, worker=worker)
            channel.send(protocol.MsgType.HELLO, protocol.json_body(hello))
            header, body = channel.recv()
            if header.type != protocol.MsgType.WELCOME:
                raise protocol.ProtocolError("no_welcome", f"got {header.type.name}")
            return channel, protocol.parse_json(body, "welcome")
        except (OSError, protocol.PeerClosed) as exc:
            if channel is not None:
                channel.close()
            if time.monotonic() + wait > deadline:
                raise ConnectionError(f"parameter server at {address[0]}:{address[1]} unreachable: {exc}") from None
            time.sleep(wait)
            wait = min(wait * 2, 2.0)
