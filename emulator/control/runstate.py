"""What the controller knows of a run while it goes: counters kept from the traces as they arrive,
and the progress line drawn from them.

:class:`LiveState` is fed every batch of records the collector receives (:meth:`LiveState.observe`,
on the collector's threads, hence the lock); the controller reads it to know when devices are
ready, when training started and ended, and what to put in ``summary.json``
(:func:`emulator.control.summary.summarize` reads it too). :class:`Progress` turns it into the line
``emulate run`` shows every few seconds.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from emulator.runtime.protocol import NO_WORKER
from emulator.planning.units import format_bytes, format_duration

READY_EVENTS = {"listening", "worker_ready", "evaluator_ready"}


@dataclass
class LiveState:
    """What the controller knows from the traces, updated as records arrive."""

    updates: int = 0
    applied_bytes: int = 0
    ingress_bytes: int = 0
    egress_bytes: int = 0  # every frame the server sent
    downlink_bytes: int = 0  # ... of which to workers
    pushes: dict[str, int] = field(default_factory=dict)
    accuracy: dict | None = None
    final_accuracy: dict | None = None
    done: threading.Event = field(default_factory=threading.Event)
    done_reason: str = ""
    rejections: int = 0
    late_updates: int = 0
    errors: list[dict] = field(default_factory=list)
    ready: set = field(default_factory=set)
    newly_ready: list = field(default_factory=list)
    training_started: threading.Event = field(default_factory=threading.Event)
    probes: dict = field(default_factory=dict)  # device -> merged fidelity measurements
    max_version: int = 0  # highest model version seen (the version drops when a server restores)
    lost_to_server: int = 0  # updates applied after the last checkpoint of a server that crashed
    server_started_ts: float | None = None  # the server's own clock reading when training started
    server_done_flushed: threading.Event = field(default_factory=threading.Event)
    counting: str = "server"  # the server whose update rows count each worker's pushes (every push reaches every server)
    servers: dict = field(default_factory=dict)  # server name -> its bytes in and out and updates (several servers only)
    flushed: set = field(default_factory=set)  # the servers that flushed their traffic at the end of training
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pushes_of(self, worker: str) -> int:
        """Updates of ``worker`` (``worker-3``) the server applied so far."""
        with self.lock:
            return self.pushes.get(worker, 0)

    def observe(self, stream: str, records: list[dict]) -> None:
        with self.lock:
            if stream == "updates":
                for r in records:
                    # max: a row is traced once its reply is built, so rows can swap places
                    self.updates = max(self.updates, int(r.get("t", 0)))
                    self.max_version = max(self.max_version, self.updates)
                    self.applied_bytes += int(r.get("bytes", 0))
                    if r.get("source", self.counting) == self.counting:
                        name = f"worker-{r.get('worker')}"
                        self.pushes[name] = self.pushes.get(name, 0) + 1
                    if self.servers:
                        self.servers.setdefault(r.get("source"), Counter())["updates"] += 1
            elif stream == "traffic":
                if self.servers:
                    for r in records:
                        own = self.servers.setdefault(r.get("source"), Counter())
                        own["ingress_payload_bytes"] += int(r.get("ingress_bytes", 0))
                        own["egress_payload_bytes"] += int(r.get("egress_bytes", 0))
                self.ingress_bytes += sum(int(r.get("ingress_bytes", 0)) for r in records)
                self.egress_bytes += sum(int(r.get("egress_bytes", 0)) for r in records)
                self.downlink_bytes += sum(int(r.get("egress_bytes", 0)) for r in records if r.get("worker") != NO_WORKER)
            elif stream == "accuracy":
                for r in records:
                    self.accuracy = r
                    if r.get("final"):
                        self.final_accuracy = r
            elif stream == "server":
                self.flushed.update(r.get("source") for r in records if r.get("done"))
                if self.flushed and (not self.servers or self.flushed >= set(self.servers)):
                    self.server_done_flushed.set()  # every server's traffic records up to the end are in
            elif stream == "fidelity":
                for r in records:
                    self.probes.setdefault(r.get("source"), {}).update(r)
            elif stream == "rejections":
                late = sum(1 for r in records if r.get("reason") == "late")
                self.late_updates += late
                self.rejections += len(records) - late
            elif stream == "events":
                for r in records:
                    kind = r.get("kind")
                    if kind in READY_EVENTS:
                        self.ready.add(r.get("source"))
                        self.newly_ready.append(r.get("source"))
                    elif kind == "training_started":
                        if self.server_started_ts is None:
                            self.server_started_ts = float(r.get("ts", 0.0))
                        self.training_started.set()
                    elif kind == "restored":
                        # The server's own count (its version mark survives the crash); the
                        # traces alone would miss the updates of its last, unsent batch.
                        lost = r.get("lost")
                        self.lost_to_server += int(lost) if lost is not None else max(0, self.max_version - int(r.get("version", 0)))
                        self.updates = self.max_version = int(r.get("version", 0))
                    elif kind == "training_done":
                        self.done_reason = r.get("reason", "")
                        self.done.set()
                    elif kind == "error":
                        self.errors.append(r)


@dataclass
class Progress:
    """The live progress line: updates and ingress rates since the previous line, accuracy, workers
    up, and an ETA from ``max_updates`` (at the current rate) or ``duration``, whichever is sooner."""

    max_updates: int | None
    duration_s: float | None
    workers: int
    t: float = 0.0  # the previous line's training time, updates and ingress bytes
    updates: int = 0
    ingress: int = 0

    def line(self, now_s: float, state: LiveState, workers_up: int) -> str:
        with state.lock:
            updates, ingress, acc = state.updates, state.ingress_bytes, state.accuracy
        rate = (updates - self.updates) / max(1e-6, now_s - self.t)
        ingress_rate = (ingress - self.ingress) / max(1e-6, now_s - self.t)
        eta = []
        if self.max_updates and rate > 0:
            eta.append((self.max_updates - updates) / rate)
        if self.duration_s:
            eta.append(self.duration_s - now_s)
        parts = [f"[{format_duration(now_s):>7}]", f"updates {updates}" + (f"/{self.max_updates}" if self.max_updates else "") + f" ({rate:.1f}/s)"]
        if acc:
            parts.append(f"acc {acc['accuracy']:.3f} @ {acc['version']}")
        parts.append(f"ingress {format_bytes(ingress_rate)}/s (total {format_bytes(ingress)})")
        parts.append(f"workers {workers_up}/{self.workers} up")
        if eta:
            parts.append(f"ETA {format_duration(max(0.0, min(eta)))}")
        self.t, self.updates, self.ingress = now_s, updates, ingress
        return " | ".join(parts)


__all__ = ["LiveState", "Progress", "READY_EVENTS"]
