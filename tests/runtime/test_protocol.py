"""Frames, their checks, and the transport shaper (token buckets, partitions), over socketpairs."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from emulator.runtime import protocol
from emulator.runtime.protocol import HEADER, Flag, MsgType, ProtocolError
from emulator.runtime.transport import CHUNK, Channel, ShapedSocket, TokenBucket, TransportShaper

TOKEN = bytes(range(16))


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    yield a, b
    a.close()
    b.close()


def test_header_round_trip():
    raw = protocol.pack_header(MsgType.PUSH, TOKEN, 1234, worker=7, t0=2**40 + 5, flags=Flag.DONE)
    assert len(raw) == HEADER.size == 38
    h = protocol.parse_header(raw, TOKEN, 10_000)
    assert h == protocol.Header(MsgType.PUSH, Flag.DONE, 7, TOKEN, 2**40 + 5, 1234)
    assert h.type is MsgType.PUSH
    default = protocol.parse_header(protocol.pack_header(MsgType.HELLO, TOKEN, 0), TOKEN, 0)
    assert default.worker == protocol.NO_WORKER and default.t0 == 0 and default.flags == 0
    # Without a token to check (the collector's first look), any token parses.
    assert protocol.parse_header(raw, None, 10_000).token == TOKEN


def _tamper(raw: bytes, offset: int, value: bytes) -> bytes:
    return raw[:offset] + value + raw[offset + len(value):]


@pytest.mark.parametrize(
    "offset,value,reason",
    [
        (0, b"XE", "bad_magic"),
        (2, bytes([0]), "bad_version"),
        (2, bytes([2]), "bad_version"),
        (3, bytes([0]), "bad_type"),
        (3, bytes([99]), "bad_type"),
        (12, b"\xff", "bad_token"),
        (25, b"\x00", "bad_token"),
    ],
)
def test_header_rejections(offset, value, reason):
    raw = protocol.pack_header(MsgType.PULL, TOKEN, 4)
    with pytest.raises(ProtocolError) as info:
        protocol.parse_header(_tamper(raw, offset, value), TOKEN, 100)
    assert info.value.reason == reason


def test_header_oversize():
    raw = protocol.pack_header(MsgType.PUSH, TOKEN, 101)
    protocol.parse_header(protocol.pack_header(MsgType.PUSH, TOKEN, 100), TOKEN, 100)
    with pytest.raises(ProtocolError) as info:
        protocol.parse_header(raw, TOKEN, 100)
    assert info.value.reason == "oversize"


def test_wrong_token_is_checked_before_size():
    raw = protocol.pack_header(MsgType.PUSH, bytes(16), 2**31)
    with pytest.raises(ProtocolError) as info:
        protocol.parse_header(raw, TOKEN, 100)
    assert info.value.reason == "bad_token"


def test_frame_round_trip(pair):
    a, b = pair
    body = bytes(range(256)) * 300  # over 64 KiB: header and body sent separately
    sent = []

    def sender():  # a socketpair's buffer is smaller than the frame: send while the peer reads
        sent.append(protocol.send_frame(a, MsgType.PUSH, TOKEN, body, worker=3, t0=9))
        protocol.send_frame(a, MsgType.PULL, TOKEN, b"\x01\x02\x03\x04", worker=3, t0=1)
        protocol.send_frame(a, MsgType.WELCOME, TOKEN)

    t = threading.Thread(target=sender)
    t.start()
    h, got = protocol.recv_frame(b, TOKEN, 1 << 20)
    assert (h.type, h.worker, h.t0, h.length) == (MsgType.PUSH, 3, 9, len(body)) and bytes(got) == body
    h, got = protocol.recv_frame(b, TOKEN, 1 << 20, bytearray(1 << 20))
    assert h.type == MsgType.PULL and bytes(got) == b"\x01\x02\x03\x04"
    h, got = protocol.recv_frame(b, TOKEN, 1 << 20)
    assert h.type == MsgType.WELCOME and h.length == 0 and bytes(got) == b""
    t.join(5)
    assert sent == [HEADER.size + len(body)]


def test_oversize_frame_refused_before_the_body(pair):
    a, b = pair
    a.sendall(protocol.pack_header(MsgType.PUSH, TOKEN, 50_000_000))  # header only, no body follows
    b.settimeout(2)
    start = time.monotonic()
    with pytest.raises(ProtocolError) as info:
        protocol.recv_frame(b, TOKEN, 1 << 20)
    assert info.value.reason == "oversize"
    assert time.monotonic() - start < 1.0  # did not wait for a body that never comes


def test_recv_exact_chunked(pair):
    a, b = pair
    payload = bytes(i % 251 for i in range(100_000))

    def sender():
        for pos in range(0, len(payload), 997):
            a.sendall(payload[pos : pos + 997])
            if pos % 20_000 < 997:
                time.sleep(0.005)

    t = threading.Thread(target=sender)
    t.start()
    buf = bytearray(200_000)
    first = protocol.recv_exact(b, 60_000, buf)
    assert first.obj is buf  # reused the buffer given
    assert bytes(first) == payload[:60_000]
    rest = protocol.recv_exact(b, 40_000, bytearray(10))  # too small a buffer: a fresh one
    assert len(rest) == 40_000 and bytes(rest) == payload[60_000:]
    t.join()


def test_recv_exact_peer_closed(pair):
    a, b = pair
    a.sendall(b"abc")
    a.close()
    with pytest.raises(protocol.PeerClosed) as info:
        protocol.recv_exact(b, 10)
    assert info.value.reason == "closed"
    assert isinstance(info.value, ProtocolError)


def test_truncated_header_is_peer_closed(pair):
    a, b = pair
    a.sendall(protocol.pack_header(MsgType.PULL, TOKEN, 0)[:20])
    a.close()
    with pytest.raises(protocol.PeerClosed):
        protocol.recv_frame(b, TOKEN, 100)


def test_json_helpers():
    assert protocol.parse_json(memoryview(protocol.json_body({"a": [1, 2]})), "x") == {"a": [1, 2]}
    for bad in (b"\xff\xfe", b"{nope", b"[1, 2]", b"3"):
        with pytest.raises(ProtocolError) as info:
            protocol.parse_json(memoryview(bad), "hello")
        assert info.value.reason == "bad_json"


# ---------------------------------------------------------------------------------------
# transport


def test_token_bucket_unlimited_is_free():
    bucket = TokenBucket(None)
    start = time.monotonic()
    for _ in range(1000):
        bucket.consume(1 << 20)
    assert time.monotonic() - start < 0.5


def test_token_bucket_paces():
    bucket = TokenBucket(8e6)  # 1 MB/s
    assert bucket.rate == 1e6
    start = time.monotonic()
    for _ in range(13):
        bucket.consume(CHUNK)
    elapsed = time.monotonic() - start
    rate = 13 * CHUNK / elapsed
    assert rate < 1.5 * bucket.rate, f"{rate:.0f} B/s through a {bucket.rate:.0f} B/s bucket"


def test_shaper_limits_a_socketpair(pair):
    a, b = pair
    rate_bps = 8e6
    shaper = TransportShaper(uplink_bps=rate_bps)
    sender = Channel(a, TOKEN, shaper)
    receiver = Channel(b, TOKEN)
    body = bytes(200_000)
    got = {}

    def receive():
        got["frame"] = receiver.recv()

    t = threading.Thread(target=receive)
    t.start()
    start = time.monotonic()
    sender.send(MsgType.MODEL, body)
    elapsed = time.monotonic() - start
    t.join(5)
    header, data = got["frame"]
    assert header.length == len(body) and bytes(data) == body
    measured_bps = 8 * (HEADER.size + len(body)) / elapsed
    print(f"shaped send: {elapsed:.3f} s, {measured_bps / 1e6:.2f} Mbit/s at {rate_bps / 1e6:.0f} Mbit/s")
    assert measured_bps < 1.5 * rate_bps
    assert sender.bytes_sent == HEADER.size + len(body)
    assert receiver.bytes_received == HEADER.size + len(body)


def test_shaper_limits_receive(pair):
    a, b = pair
    body = bytes(150_000)
    a.sendall(protocol.pack_header(MsgType.MODEL, TOKEN, len(body)) + body)
    receiver = Channel(b, TOKEN, TransportShaper(downlink_bps=8e6))
    start = time.monotonic()
    header, data = receiver.recv()
    elapsed = time.monotonic() - start
    assert len(data) == len(body)
    assert 8 * len(body) / elapsed < 1.5 * 8e6


def test_shaper_update_at_run_time():
    shaper = TransportShaper.from_config(None)
    assert shaper.send_bucket.rate is None and shaper.recv_bucket.rate is None and shaper.one_way_delay() == 0
    shaper.update({"uplink_bps": 800, "downlink_bps": 1600, "delay_s": 0.25})
    assert shaper.send_bucket.rate == 100 and shaper.recv_bucket.rate == 200
    assert shaper.one_way_delay() == 0.25
    shaper.update({"uplink_bps": None, "delay_s": None})
    assert shaper.send_bucket.rate is None and shaper.delay_s == 0.0 and shaper.recv_bucket.rate == 200
    shaper.update({"delay_s": 0.1, "jitter_s": 0.05})
    draws = [shaper.one_way_delay() for _ in range(200)]
    assert min(draws) >= 0 and 0.05 < sum(draws) / len(draws) < 0.15


def test_shared_buckets():
    bucket = TokenBucket(8e6)
    s1 = TransportShaper(send_bucket=bucket)
    s2 = TransportShaper(send_bucket=bucket)
    assert s1.send_bucket is s2.send_bucket
    s1.update({"uplink_bps": 16e6})
    assert s2.send_bucket.rate == 2e6


def test_blocked_link_holds_sends_until_unblocked(pair):
    a, b = pair
    shaper = TransportShaper()
    shaper.update({"blocked": True})
    sender = Channel(a, TOKEN, shaper)
    done = threading.Event()

    def send():
        sender.send(MsgType.PULL, b"\0\0\0\0")
        done.set()

    t = threading.Thread(target=send, daemon=True)
    t.start()
    assert not done.wait(0.3)  # held
    b.settimeout(0.05)
    with pytest.raises(socket.timeout):
        b.recv(1)  # and nothing reached the peer
    shaper.update({"blocked": False})
    assert done.wait(2)
    b.settimeout(2)
    header, body = protocol.recv_frame(b, TOKEN, 100)
    assert header.type == MsgType.PULL and bytes(body) == b"\0\0\0\0"
    t.join(2)


def test_blocked_link_holds_receives(pair):
    a, b = pair
    shaper = TransportShaper()
    shaped = ShapedSocket(b, shaper)
    a.sendall(b"hello")
    shaper.update({"blocked": True})
    got = []
    t = threading.Thread(target=lambda: got.append(protocol.recv_exact(shaped, 5)), daemon=True)
    t.start()
    t.join(0.2)
    assert t.is_alive() and not got
    shaper.update({"blocked": False})
    t.join(2)
    assert bytes(got[0]) == b"hello"


def test_channel_keeps_one_buffer(pair):
    a, b = pair
    sender, receiver = Channel(a, TOKEN, worker=5), Channel(b, TOKEN)
    sender.send(MsgType.PUSH, bytes(1000), t0=3)
    h, body = receiver.recv(keep_buffer=True)
    assert h.worker == 5 and h.t0 == 3 and len(body) == 1000
    buffer = receiver._buffer
    assert body.obj is buffer
    sender.send(MsgType.PUSH, b"x" * 500)
    h, body = receiver.recv(keep_buffer=True)
    assert body.obj is buffer and bytes(body) == b"x" * 500
    sender.send(MsgType.PUSH, b"y" * 5000)  # bigger: the buffer grows once
    h, body = receiver.recv(keep_buffer=True)
    assert bytes(body) == b"y" * 5000 and len(receiver._buffer) >= 5000
    sender.send(MsgType.PUSH, b"z" * 10)
    h, body = receiver.recv()  # without keep_buffer: a private copy
    assert body.obj is not receiver._buffer and bytes(body) == b"z" * 10


def test_channel_enforces_its_limit_and_token(pair):
    a, b = pair
    Channel(a, TOKEN).send(MsgType.PUSH, bytes(2000))
    with pytest.raises(ProtocolError) as info:
        Channel(b, TOKEN, max_body=1000).recv()
    assert info.value.reason == "oversize"
    a2, b2 = socket.socketpair()
    try:
        Channel(a2, bytes(16)).send(MsgType.PULL)
        with pytest.raises(ProtocolError) as info:
            Channel(b2, TOKEN).recv()
        assert info.value.reason == "bad_token"
    finally:
        a2.close()
        b2.close()


# ---------------------------------------------------------------------------------------
# telemetry over a real connection to a fake collector


def test_telemetry_sends_traces_and_receives_controls():
    from emulator.runtime.telemetry import Telemetry

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    port = listener.getsockname()[1]
    tel = Telemetry(("127.0.0.1", port), TOKEN, "worker-3", time.time())
    commands = []
    got_command = threading.Event()
    tel.on_control(lambda c: (commands.append(c), got_command.set()))
    tel.record("steps", worker=3, steps=10)
    tel.event("worker_ready", worker=3)
    conn, _ = listener.accept()
    conn.settimeout(5)
    try:
        header, body = protocol.recv_frame(conn, TOKEN, 1 << 20)
        assert header.type == MsgType.HELLO and protocol.parse_json(body, "hello") == {"source": "worker-3"}
        streams = {}
        while set(streams) != {"steps", "events"}:
            header, body = protocol.recv_frame(conn, TOKEN, 1 << 20)
            assert header.type == MsgType.TRACE
            data = protocol.parse_json(body, "trace")
            streams.setdefault(data["stream"], []).extend(data["records"])
        (step,) = streams["steps"]
        assert step["worker"] == 3 and step["steps"] == 10 and step["source"] == "worker-3" and "ts" in step
        assert streams["events"][0]["kind"] == "worker_ready"
        protocol.send_frame(conn, MsgType.CONTROL, TOKEN, protocol.json_body({"cmd": "shape", "transport": {}}))
        assert got_command.wait(5)
        assert commands == [{"cmd": "shape", "transport": {}}]
        tel.record("steps", worker=3, steps=11)
        tel.close(timeout_s=2)
        header, body = protocol.recv_frame(conn, TOKEN, 1 << 20)  # flushed on close
        assert protocol.parse_json(body, "trace")["records"][0]["steps"] == 11
    finally:
        conn.close()
        listener.close()


def test_telemetry_without_collector_prints(capsys):
    from emulator.runtime.telemetry import Telemetry

    tel = Telemetry(None, TOKEN, "ps", time.time())
    tel.event("hello", x=1)
    tel.close()
    assert "events" in capsys.readouterr().err


class _PacedReader:
    """A socket stand-in that delivers ``chunk`` bytes per read at ``rate_bps`` on a fake clock;
    the reads listed in ``late`` are seen ``lag`` seconds late (a reader busy elsewhere)."""

    def __init__(self, rate_bps: float, chunk: int, late=(), lag: float = 0.0):
        self.now, self.reads, self.rate, self.chunk, self.late, self.lag = 0.0, 0, rate_bps, chunk, set(late), lag
        self.pending_lag = 0.0

    def clock(self) -> float:
        lag, self.pending_lag = self.pending_lag, 0.0
        return self.now + lag

    def recv_into(self, view, n: int) -> int:
        n = min(n, self.chunk)
        self.now += n * 8 / self.rate
        if self.reads in self.late:
            self.pending_lag = self.lag
        self.reads += 1
        return n


def test_probe_rate_is_the_slope_over_the_second_half_and_shrugs_off_a_late_read():
    from emulator.runtime.probe import timed_read

    steady = _PacedReader(4e6, 16384)
    seconds, rate = timed_read(steady, 1_000_000, clock=steady.clock)
    assert rate == pytest.approx(4e6, rel=1e-6) and seconds == pytest.approx(2.0, rel=0.02)
    # The last read seen 0.1 s late: the two end points alone would say 3.64 Mbit/s (-9 %).
    chunks = -(-1_000_000 // 16384)
    late = _PacedReader(4e6, 16384, late={chunks - 1}, lag=0.1)
    _, rate = timed_read(late, 1_000_000, clock=late.clock)
    assert rate == pytest.approx(4e6, rel=0.03)


class _ThrottledLoop:
    """A fake CFS: a busy loop that may run ``quota_s`` of each ``period_s``, in steps of ``step_s``."""

    def __init__(self, share: float, phase_s: float, period_s: float = 0.1, step_s: float = 0.0004):
        self.period, self.quota, self.step = period_s, share * period_s, step_s
        self.wall, self.cpu_used, self.in_period = phase_s, 0.0, 0.0

    def clock(self) -> float:
        self.wall += self.step
        self.cpu_used += self.step
        self.in_period += self.step
        if self.in_period >= self.quota - 1e-12:  # quota spent: throttled until the next period
            self.wall = (self.wall // self.period + 1) * self.period
            self.in_period = 0.0
        return self.wall

    def cpu(self) -> float:
        return self.cpu_used


PHASES = [0.0, 0.0123, 0.05, 0.0987]


def _plain_window_share(phase: float) -> float:
    """The old estimate: CPU time over wall time from the start to the first reading past 1 s."""
    loop = _ThrottledLoop(0.1, phase)
    start = loop.clock()
    while loop.clock() - start < 1.0:
        pass
    return loop.cpu() / (loop.wall - start)


def test_cpu_share_is_timed_over_whole_throttling_periods():
    from emulator.runtime.probe import measure_cpu

    aligned = [measure_cpu(1.0, clock=loop.clock, cpu=loop.cpu) for loop in (_ThrottledLoop(0.1, p) for p in PHASES)]
    assert aligned == [pytest.approx(0.1, rel=0.01)] * len(PHASES)
    # The same fake quota timed over a window cut anywhere: off by the burst it cuts (here > 3 %).
    assert max(abs(_plain_window_share(p) / 0.1 - 1) for p in PHASES) > 0.03


def test_cpu_share_of_an_unthrottled_loop_is_its_plain_ratio():
    from emulator.runtime.probe import measure_cpu

    loop = _ThrottledLoop(1.0, 0.0)
    loop.quota = float("inf")  # never waits
    assert measure_cpu(0.2, clock=loop.clock, cpu=loop.cpu) == pytest.approx(1.0, rel=0.01)
