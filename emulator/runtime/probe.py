"""Fidelity probes: measure a device's link and CPU share as the device experiences them.

Before training the controller asks each worker to measure its uplink and downlink with a
bulk transfer to and from the server, its round-trip time with small frames, and the CPU
share a busy loop gets under its quota. Rates are taken over the second half of each
transfer, so the token buckets' initial bursts do not inflate them.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from emulator.runtime import protocol
from emulator.runtime.protocol import MsgType
from emulator.runtime.transport import Channel, TransportShaper, connect

CHUNK = 16 * 1024
MODE_UP, MODE_DOWN, MODE_PING = 1, 2, 3


def timed_read(io, size: int, clock=time.perf_counter) -> tuple[float, float]:
    """Read ``size`` bytes; returns (seconds in all, bits/s over the second half of the bytes).

    The rate is the least-squares slope of bytes received against time over the second half
    (past slow start), not the two end points: a reader that shares a process with other
    threads (the server) sees some reads late, and one late end point moved the estimate by
    10 % on a 4 Mbit/s link."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    got, start = 0, clock()
    times: list[float] = []
    counts: list[int] = []
    while got < size:
        n = io.recv_into(view, min(CHUNK, size - got))
        if n == 0:
            raise protocol.PeerClosed("closed during a probe")
        got += n
        if got >= size / 2:
            times.append(clock())
            counts.append(got)
    end = clock()
    if len(times) < 2 or times[-1] <= times[0]:
        return end - start, float("nan")
    return end - start, slope(times, counts) * 8


MAX_PROBE_BYTES = 4 << 20


def probe_sizes(rate_bps: float | None, seconds: float = 2.0) -> int:
    """Bytes for a transfer of about ``seconds`` at ``rate_bps`` (4 MiB when unshaped or fast)."""
    if not rate_bps:
        return MAX_PROBE_BYTES
    return int(min(MAX_PROBE_BYTES, max(128 << 10, rate_bps / 8 * seconds)))


def measure_link(address, token: bytes, shaper: TransportShaper, *, up_bytes: int, down_bytes: int, pings: int = 7) -> dict:
    """Round-trip time, then uplink and downlink rate, over a connection of its own."""
    channel = Channel(connect(tuple(address), what="parameter server"), token, shaper, max_body=max(up_bytes, down_bytes) + 4096)
    try:
        channel.send(MsgType.HELLO, protocol.json_body({"role": "probe"}))
        channel.recv()
        rtts = []
        for _ in range(pings):
            start = time.perf_counter()
            channel.send(MsgType.PROBE, t0=MODE_PING)
            channel.recv()
            rtts.append(time.perf_counter() - start)
        channel.send(MsgType.PROBE, bytes(up_bytes), t0=MODE_UP)
        _, body = channel.recv()
        up = protocol.parse_json(body, "probe reply")
        channel.send(MsgType.PROBE, down_bytes.to_bytes(4, "little"), t0=MODE_DOWN)
        header = channel.recv_header()
        _, down_rate = timed_read(channel.io, header.length)
        channel.after_receive()
        return {"rtt_s": statistics.median(rtts), "uplink_bps": up["rate_bps"], "downlink_bps": down_rate,
                "up_bytes": up_bytes, "down_bytes": down_bytes}
    finally:
        channel.close()


def measure_cpu(seconds: float = 1.0, *, throttle_gap_s: float = 0.015, clock=time.perf_counter, cpu=time.thread_time) -> float:
    """Share of one core a busy loop gets, timed over whole CFS periods where it is throttled.

    Under a quota the loop runs in bursts, one per period. A window cut at arbitrary moments
    holds a fraction of a burst too many or too few: up to 10 % off at 0.1 core over 1 s. So
    the share is the least-squares slope of CPU time against wall time at the start of each
    burst (the loop resuming after a pause longer than ``throttle_gap_s``) for ``seconds``,
    leaving out the first: every device's probe starts at once and the first bursts queue for
    the cores. Against real quotas, 15 loops at 0.1 core on 2 cores: median error 5.5 % with
    the plain window, about 1 % with this one. A loop never throttled (a share near 1) is
    timed over the plain window, where the phase error is at most one short pause."""
    start_wall, start_cpu = clock(), cpu()
    walls: list[float] = []
    cpus: list[float] = []
    bursts = 0
    previous = start_wall
    x = 0
    while True:
        for _ in range(1000):
            x += 1
        now = clock()
        if now - previous > throttle_gap_s:  # resumed after a throttled pause: a burst begins
            bursts += 1
            if bursts > 1:
                walls.append(now)
                cpus.append(cpu())
                if len(walls) >= 3 and now - walls[0] >= seconds:
                    return slope(walls, cpus)
        previous = now
        if now - start_wall >= 2 * seconds + 0.5:  # not throttled (or never resumed in time)
            return (cpu() - start_cpu) / (now - start_wall)


def slope(xs, ys) -> float:
    """Least-squares slope of ``ys`` against ``xs``."""
    x = np.asarray(xs, np.float64) - xs[0]
    y = np.asarray(ys, np.float64)
    return float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))
