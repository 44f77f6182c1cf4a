"""Binary, length-prefixed frames spoken between devices, and between devices and the controller.

Header (38 bytes, little-endian)::

    2s  magic b"EE"        B  protocol version     B  message type     H  flags
    I   worker id          16s run token           Q  model version t0 I  body length

No pickle anywhere: bodies are raw little-endian arrays, codec messages or short UTF-8 JSON.
A frame whose declared body exceeds the receiver's limit is refused before any allocation.
"""

from __future__ import annotations

import enum
import hmac
import json
import socket
import struct
from dataclasses import dataclass

MAGIC = b"EE"
VERSION = 1
HEADER = struct.Struct("<2sBBHI16sQI")
TOKEN_BYTES = 16
NO_WORKER = 0xFFFFFFFF


class MsgType(enum.IntEnum):
    HELLO = 1  # device -> server: JSON {role, worker, incarnation}
    WELCOME = 2  # server -> device: JSON {version, layout}
    PULL = 3  # device -> server: t0 = wait until the model reaches this version; body u32 max wait ms
    MODEL = 4  # server -> device: t0 = version; body = float32 parameters (flagged DELTA: see downlink)
    PUSH = 5  # worker -> server: t0 = version the gradient was computed on; body = codec message
    REJECT = 6  # server -> device: JSON {reason}
    PROBE = 7  # device -> server: t0 = mode (1 up: body is the bulk; 2 down: body u32 bytes wanted; 3 ping)
    PROBE_REPLY = 8  # server -> device: up: JSON {bytes, seconds, rate_bps}; down: the bulk; ping: empty
    ACK = 9  # server -> worker: t0 = version after a push flagged NO_MODEL was applied; no body
    TRACE = 16  # device -> controller: JSON {stream, records}
    CONTROL = 17  # controller -> device: JSON command


class Flag(enum.IntFlag):
    NONE = 0
    DONE = 0x1  # server: training is over; the device should finish and exit
    NON_FINITE = 0x2  # worker, on a PUSH: its gradient held NaN or Inf; the body names the tensors (UTF-8)
    DELTA = 0x4  # server, on a MODEL: the body is u64 base version + a codec message of the coordinates that changed
    INCREMENT = 0x8  # server, on a MODEL with DELTA: the message's values are added to the worker's, not put in place
    NO_MODEL = 0x10  # worker, on a PUSH: answer with an ACK, not the model (pull every m pushes)


class ProtocolError(Exception):
    """The peer sent something that is not a valid frame; ``reason`` labels it in traces."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class PeerClosed(ProtocolError):
    """The peer closed the connection; ``mid_frame`` when it did so part-way through a frame
    (a device that died while sending): the partial frame is discarded and counted."""

    def __init__(self, detail: str = "connection closed", *, mid_frame: bool = False):
        super().__init__("closed", detail)
        self.mid_frame = mid_frame


@dataclass(frozen=True)
class Header:
    type: MsgType
    flags: int
    worker: int
    token: bytes
    t0: int
    length: int


def pack_header(type_: MsgType, token: bytes, length: int, *, worker: int = NO_WORKER, t0: int = 0, flags: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, int(type_), flags, worker, token, t0, length)


def parse_header(raw: bytes | memoryview, token: bytes | None, max_body: int) -> Header:
    magic, version, type_, flags, worker, tok, t0, length = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError("bad_magic", repr(bytes(magic)))
    if version != VERSION:
        raise ProtocolError("bad_version", f"protocol version {version}, expected {VERSION}")
    try:
        kind = MsgType(type_)
    except ValueError:
        raise ProtocolError("bad_type", f"unknown message type {type_}") from None
    if token is not None and not hmac.compare_digest(tok, token):
        raise ProtocolError("bad_token", "run token does not match")
    if length > max_body:
        raise ProtocolError("oversize", f"body of {length} bytes exceeds the limit of {max_body}")
    return Header(kind, flags, worker, tok, t0, length)


def recv_exact(sock: socket.socket, size: int, into: bytearray | None = None) -> memoryview:
    """Read exactly ``size`` bytes (into ``into`` when given, to avoid a fresh allocation)."""
    buf = into if into is not None and len(into) >= size else bytearray(size)
    view = memoryview(buf)[:size]
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise PeerClosed(f"closed after {got} of {size} bytes", mid_frame=got > 0)
        got += n
    return view


def recv_body(sock: socket.socket, header: Header, buffer: bytearray | None = None) -> memoryview:
    """The body announced by ``header``; a close before its end is a partial frame."""
    if not header.length:
        return memoryview(b"")
    try:
        return recv_exact(sock, header.length, buffer)
    except PeerClosed as exc:
        raise PeerClosed(f"{header.type.name} frame cut short: {exc}", mid_frame=True) from None


def recv_frame(sock: socket.socket, token: bytes | None, max_body: int, buffer: bytearray | None = None) -> tuple[Header, memoryview]:
    """One whole frame: header checked (token, size limit) before the body is read."""
    header = parse_header(recv_exact(sock, HEADER.size), token, max_body)
    return header, recv_body(sock, header, buffer)


def send_frame(sock: socket.socket, type_: MsgType, token: bytes, body: bytes | memoryview = b"", **fields) -> int:
    """Send one frame; returns the bytes written (header + body)."""
    head = pack_header(type_, token, len(body), **fields)
    if len(body) < 65536:
        sock.sendall(head + bytes(body))
    else:
        sock.sendall(head)
        sock.sendall(body)
    return HEADER.size + len(body)


def json_body(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def parse_json(body: memoryview, what: str) -> dict:
    try:
        data = json.loads(bytes(body).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # also integers past Python's digit limit, deep nesting
        raise ProtocolError("bad_json", f"{what}: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad_json", f"{what}: expected an object")
    return data
