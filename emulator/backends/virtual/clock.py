"""The discrete-event clock of the virtual backend: a heap of (time, sequence, action).

Ties in time are broken by the order actions were scheduled (a sequence number), never by
object identity or hashing, so one scenario and seed replay the same order on any machine:
that is what makes virtual runs bit-identical. Cancelling marks a handle dead instead of
searching the heap.
"""

from __future__ import annotations

import heapq
from typing import Callable


class Handle:
    """A scheduled action; :meth:`cancel` keeps it from running."""

    __slots__ = ("time_s", "action", "args", "live")

    def __init__(self, time_s: float, action: Callable, args: tuple):
        self.time_s = time_s
        self.action = action
        self.args = args
        self.live = True

    def cancel(self) -> None:
        self.live = False


class Clock:
    """Virtual seconds since training started; :meth:`run` executes actions in time order."""

    def __init__(self):
        self.now = 0.0
        self._heap: list[tuple[float, int, Handle]] = []
        self._seq = 0
        self.executed = 0
        self.stopped = False

    def at(self, time_s: float, action: Callable, *args) -> Handle:
        """Run ``action(*args)`` at virtual time ``time_s`` (never before now)."""
        handle = Handle(max(time_s, self.now), action, args)
        self._seq += 1
        heapq.heappush(self._heap, (handle.time_s, self._seq, handle))
        return handle

    def after(self, delay_s: float, action: Callable, *args) -> Handle:
        return self.at(self.now + max(0.0, delay_s), action, *args)

    def stop(self) -> None:
        self.stopped = True

    def run(self, until_s: float | None = None) -> None:
        """Execute actions until none is left, :meth:`stop` is called, or the next is after ``until_s``."""
        heap = self._heap
        while heap and not self.stopped:
            time_s, _, handle = heap[0]
            if until_s is not None and time_s > until_s:
                self.now = until_s
                return
            heapq.heappop(heap)
            if not handle.live:
                continue
            self.now = time_s
            self.executed += 1
            handle.action(*handle.args)

    def pending(self) -> int:
        return sum(1 for _, _, h in self._heap if h.live)


__all__ = ["Clock", "Handle"]
