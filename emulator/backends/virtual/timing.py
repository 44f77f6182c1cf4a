"""What time things take in the virtual backend: CPU under a CFS quota, and TCP over shaped links.

CPU: a device with ``cpus`` q < 1 under the kernel's CFS bandwidth control may run q * period
seconds in each period, then waits for the next one. A 1.5 ms compression that starts after
the gradient spent the period's quota waits for the next period: measured at 59 ms of wall time
under Docker. So the quota is modelled period by period (:class:`CpuQuota`), not as a slowdown
of 1/q, which would get both the short phases and the period's effect wrong. A device runs
one thread of work at a time; q >= 1 runs at full speed.

Links: a transfer of B payload bytes is shaped at the device's rate on the wire (payload plus
TCP/IP headers per segment, :data:`WIRE_OVERHEAD`), capped by the TCP throughput a lossy path
allows (Mathis et al.: MSS / RTT * sqrt(3/2) / sqrt(p)), arrives one delay later, and shares the
server's link with the transfers in flight at the same time (:class:`SharedLink`: max-min fair
shares, each flow also capped by its own device's rate). The device's shaper lets an idle link
send its bucket at once (:class:`TokenBucket`, the burst Docker's htb is given). Not modelled:
the server's own bucket, slow start after idle, queueing delay in the shapers' buffers,
retransmission timeouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from emulator.backends.virtual.clock import Clock, Handle

MSS = 1448  # TCP payload per segment with timestamps, on a 1500-byte MTU
WIRE_OVERHEAD = (MSS + 52 + 14) / MSS  # IP + TCP (with timestamps) + Ethernet headers per segment, as tc counts them
CFS_PERIOD_S = 0.1  # Linux's default cpu.cfs_period_us (Docker's --cpus sets the quota against it)


class CpuQuota:
    """One device's CPU under a CFS quota: when a burst of CPU work started now ends."""

    def __init__(self, cpus: float, period_s: float = CFS_PERIOD_S):
        self.period_s = period_s
        self.set(cpus)
        self._period = -1
        self._used = 0.0

    def set(self, cpus: float) -> None:
        """Change the quota (a ``cpus`` fault or a compute trace); takes effect at once."""
        self.cpus = cpus

    def finish(self, start_s: float, cpu_s: float) -> float:
        """The virtual time at which ``cpu_s`` seconds of one thread's work begun at ``start_s`` end."""
        if self.cpus >= 1.0:
            return start_s + cpu_s
        budget = self.cpus * self.period_s
        t, left = start_s, cpu_s
        while left > 1e-12:
            k = math.floor(t / self.period_s + 1e-12)
            if k != self._period:
                self._period, self._used = k, 0.0
            end = (k + 1) * self.period_s
            room = min(budget - self._used, end - t)
            if room <= 1e-12:
                t = end
                continue
            run = min(left, room)
            t += run
            left -= run
            self._used += run
        return t


def tcp_rate_bps(rate_bps: float | None, delay_s: float, loss: float) -> float:
    """Payload bits per second a long TCP transfer gets: the shaped rate less headers, capped by loss."""
    rate = math.inf if not rate_bps else rate_bps / WIRE_OVERHEAD
    if loss > 0:
        rtt = max(2 * delay_s, 1e-4)
        rate = min(rate, MSS * 8 / rtt * math.sqrt(1.5) / math.sqrt(loss))
    return rate


class _Flow:
    __slots__ = ("left_bits", "since", "cap_bps", "rate_bps", "done", "handle")

    def __init__(self, bits: float, cap_bps: float, done: Callable[[], None], now: float):
        self.left_bits = bits  # as of ``since``
        self.since = now
        self.cap_bps = cap_bps
        self.rate_bps = 0.0
        self.done = done
        self.handle: Handle | None = None


class SharedLink:
    """One direction of the server's link: concurrent transfers share its rate max-min fairly,
    each flow also capped by its own device's rate; ``rate_bps`` None is unshaped.

    While the flows' caps add up to no more than the link, none slows another: each flow has its
    own completion event, and one that starts or ends touches only itself (O(1)). While they
    contend, every start or end computes the shares again (water-filling) and one event waits
    for the earliest completion (O(n) per change, n the flows in flight).
    """

    def __init__(self, clock: Clock, rate_bps: float | None):
        self.clock = clock
        self.rate_bps = math.inf if not rate_bps else rate_bps / WIRE_OVERHEAD
        self.flows: dict[_Flow, None] = {}  # in start order: deterministic
        self.sum_caps = 0.0
        self._tick: Handle | None = None  # the earliest completion, while contended

    @property
    def contended(self) -> bool:
        return self.sum_caps > self.rate_bps

    def send(self, bits: float, cap_bps: float, done: Callable[[], None]) -> _Flow:
        """Start a transfer of ``bits``; ``done()`` runs when its last bit has left."""
        flow = _Flow(bits, cap_bps, done, self.clock.now)
        if bits <= 0 or (math.isinf(self.rate_bps) and math.isinf(cap_bps)):
            self.clock.after(0.0, done)
            return flow
        if math.isinf(self.rate_bps):  # an unshaped server link: flows do not meet, each goes at its own rate
            self.clock.after(bits / cap_bps, done)
            return flow
        was = self.contended
        self._advance()
        self.flows[flow] = None
        self.sum_caps += cap_bps
        if not was and not self.contended:
            self._own(flow)
        else:
            self._reshare()
        return flow

    def drop(self, flow: _Flow) -> None:
        """A transfer whose device crashed stops taking a share."""
        if flow in self.flows:
            self._remove(flow)

    def set_rate(self, rate_bps: float | None) -> None:
        self._advance()
        self.rate_bps = math.inf if not rate_bps else rate_bps / WIRE_OVERHEAD
        self._reshare()

    def _advance(self) -> None:
        """Bring every flow's remaining bits to now, at the rate it had."""
        now = self.clock.now
        for flow in self.flows:
            if flow.since != now:
                flow.left_bits = max(0.0, flow.left_bits - flow.rate_bps * (now - flow.since))
                flow.since = now

    def _own(self, flow: _Flow) -> None:
        """Uncontended: the flow at its cap, with its own completion event."""
        flow.rate_bps = flow.cap_bps
        flow.handle = self.clock.after(flow.left_bits / flow.rate_bps, self._finish, flow)

    def _remove(self, flow: _Flow) -> None:
        if flow.handle is not None:
            flow.handle.cancel()
            flow.handle = None
        was = self.contended
        if was:
            self._advance()
        del self.flows[flow]
        self.sum_caps = sum(f.cap_bps for f in self.flows)
        if was:
            self._reshare()

    def _finish(self, flow: _Flow) -> None:
        flow.handle = None
        flow.left_bits, flow.since = 0.0, self.clock.now
        self._remove(flow)
        flow.done()

    def _reshare(self) -> None:
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        for flow in self.flows:
            if flow.handle is not None:
                flow.handle.cancel()
                flow.handle = None
        if not self.flows:
            return
        if not self.contended:  # back to independent flows
            for flow in self.flows:
                self._own(flow)
            return
        # Water-filling: flows capped below an equal share keep their cap, the rest split what is left.
        left, ordered = self.rate_bps, sorted(self.flows, key=lambda f: f.cap_bps)
        n = len(ordered)
        for i, flow in enumerate(ordered):
            flow.rate_bps = min(flow.cap_bps, left / (n - i))
            left -= flow.rate_bps
        soonest = min(self.flows, key=lambda f: f.left_bits / f.rate_bps)
        self._tick = self.clock.after(soonest.left_bits / soonest.rate_bps, self._contended_tick)

    def _contended_tick(self) -> None:
        self._tick = None
        self._advance()
        finished = [f for f in self.flows if f.left_bits <= f.rate_bps * 1e-9]
        for flow in finished:
            del self.flows[flow]
        self.sum_caps = sum(f.cap_bps for f in self.flows)
        self._reshare()
        for flow in finished:
            flow.done()


class TokenBucket:
    """A shaper's burst allowance: htb (and tbf) let a class that was idle send up to ``burst``
    bytes at once before its rate holds it back, and refill at the rate while it is idle. A worker
    that computes between transfers finds its bucket full, so a 21 kB push on a 10 Mbit/s uplink
    leaves at once and the first 64 KiB of every reply come at once. Without it the model was
    11-12 % slow per transfer against Docker (docs/VIRTUAL_TIME.md). Counted in wire bytes, as tc counts."""

    __slots__ = ("tokens", "since")

    def __init__(self):
        self.tokens = math.inf  # full at start (capped at the burst of the rate in force when first used)
        self.since = 0.0

    def take(self, now: float, rate_bps: float, burst: float, wire_bytes: float) -> float:
        """Wire bytes of a transfer of ``wire_bytes`` starting ``now`` that leave at once."""
        self.tokens = min(burst, self.tokens + (now - self.since) * rate_bps / 8)
        used = min(self.tokens, wire_bytes)
        self.tokens -= used
        self.since = now
        return used

    def empty_at(self, now: float) -> None:
        """A transfer that went on at the rate ended now: the bucket refills from empty."""
        self.tokens, self.since = 0.0, now


@dataclass(frozen=True)
class Path:
    """One device's side of a transfer: its shaped rate, one-way delay, jitter and loss."""

    rate_bps: float | None
    delay_s: float
    jitter_s: float
    loss: float

    def cap_bps(self) -> float:
        return tcp_rate_bps(self.rate_bps, self.delay_s, self.loss)


__all__ = ["CFS_PERIOD_S", "CpuQuota", "MSS", "Path", "SharedLink", "TokenBucket", "WIRE_OVERHEAD", "tcp_rate_bps"]
