"""Traces of in-process devices on the virtual clock: the runtime's Telemetry, stamped in virtual seconds.

The real server and worker code records through an object with ``record``, ``event``,
``on_control`` and ``now``; this one hands each record to the run's sink at once, stamped with
the virtual clock, so the run directory's streams are those of every backend.
"""

from __future__ import annotations

from typing import Callable


class VirtualTelemetry:
    def __init__(self, now: Callable[[], float], sink: Callable[[str, dict], None], source: str):
        self.now = now
        self.sink = sink
        self.source = source
        self.handlers: list[Callable[[dict], None]] = []

    def record(self, stream: str, **fields) -> None:
        fields.setdefault("ts", round(self.now(), 6))
        fields["source"] = self.source
        self.sink(stream, fields)

    def event(self, kind: str, **fields) -> None:
        self.record("events", kind=kind, **fields)

    def on_control(self, handler: Callable[[dict], None]) -> None:
        self.handlers.append(handler)

    def control(self, command: dict) -> None:
        for handler in self.handlers:
            handler(command)

    def close(self, timeout_s: float = 0.0) -> None:
        pass


__all__ = ["VirtualTelemetry"]
