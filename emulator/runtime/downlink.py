"""The model's way down: what a pull sends, what the server keeps to build it, what the worker does with it.

A worker says in its HELLO how it pulls (``{"mode": "dense" | "delta", "values": "f32" | "f16" |
"q8"}``; ``every`` stays with the worker: it flags the pushes whose reply is an ACK).

- ``dense``: the MODEL frame's body is the float32 model, as always.
- ``delta``: the body (flagged ``DELTA``) is the version the delta starts from (u64) and a codec
  message of the coordinates that changed since then (:mod:`compression.delta`), or the float32
  model when that is no larger. The server never trusts a version a worker claims: it builds on
  the version it last sent on that connection (:class:`Holding`), so a restarted or reconnected
  worker, or one whose version predates the server's log (a restored checkpoint), gets the model
  whole.

What the server keeps, bounded whatever the length of the run: one :class:`ChangeLog` (per
coordinate the version that last changed it, 4 bytes per parameter, and the index sets of the
latest updates, at most an eighth of the parameters at 4 bytes each: 1.9 MB in all for the
paper's CNN), per delta connection the version it holds, and per ``q8`` connection that
worker's exact copy (4 bytes per parameter, 1.7 MB for the CNN, freed when the connection ends).
"""

from __future__ import annotations

import collections
import struct
from dataclasses import dataclass

import numpy as np

import compression
from compression import compiled, delta
from compression.layout import Layout

from emulator.runtime.config import PullConfig
from emulator.runtime.protocol import Flag, ProtocolError

BASE = struct.Struct("<Q")  # the version a delta starts from
WHOLE = 2**64 - 1  # base of a delta whose every tensor is whole: it applies to any copy
PULL_MODES = ("dense", "delta")


class ChangeLog:
    """Per coordinate, the version that last changed it: which coordinates a worker holding
    version ``v`` lacks (those changed after ``v``), for any ``v`` since the log began.

    Finding them is a scan of the whole model (about 0.5 ms for the paper's CNN, most of it
    numpy's ``nonzero``). So the log also keeps the index sets of the latest updates, at most
    ``budget`` indices in all (an eighth of the model by default): when every update after
    ``v`` is among them, their sorted union is the answer, at a cost that grows with the delta
    rather than with the model.
    """

    def __init__(self, total: int, version: int = 0, budget: int | None = None):
        self.changed_at = np.zeros(total, np.uint32)
        self.start = version  # the log knows every change after this version
        self.version = version
        self.budget = max(1, total // 8) if budget is None else budget
        self.recent: collections.deque[tuple[int, np.ndarray]] = collections.deque()  # (version, sorted flat int32 indices)
        self.recent_size = 0  # indices held, plus one per update
        self.rewritten = version  # the last update that wrote every coordinate (a dense one)
        self._words = np.zeros(total // 64 + 1, np.uint64)  # the compiled union's scratch bitmap, zero between calls

    def record(self, targets, version: int) -> None:
        """The update that made ``version`` wrote ``targets`` (slices or flat index arrays)."""
        for target in targets:
            self.changed_at[target] = version
        self.version = version
        if sum(t.stop - t.start for t in targets if isinstance(t, slice)) == self.changed_at.size:
            self.rewritten = version
        written = _flat(targets, self.budget)
        if written is None:  # a whole tensor or a large update: from here on, scans until the ring refills
            self.recent.clear()
            self.recent_size = 0
            return
        self.recent.append((version, written))
        self.recent_size += written.size + 1  # + 1: empty updates are bounded too
        while self.recent_size > self.budget:
            self.recent_size -= self.recent.popleft()[1].size + 1

    def since(self, version: int | None) -> np.ndarray | None:
        """Sorted flat indices changed after ``version``; None when the log cannot tell, or when an
        update since then rewrote every coordinate (a dense one: no need to look)."""
        if version is None or version < self.start or version < self.rewritten:
            return None
        if version >= self.version:
            return np.zeros(0, np.int64)
        fast = compiled.kernels()
        if self.recent and self.recent[0][0] <= version + 1:
            arrays = [written for v, written in self.recent if v > version]
            if fast is None or len(arrays) == 1:
                return _union(arrays)
            merged = np.concatenate(arrays)
            out = np.empty(merged.size, np.int64)
            return out[: fast.sorted_union(merged, self._words, out)]
        return np.flatnonzero(self.changed_at > version)


def _flat(targets, budget: int) -> np.ndarray | None:
    """The sorted flat indices of an update's targets (index arrays, ascending by tensor), or None
    when one is a slice or there are more than ``budget``."""
    if any(isinstance(t, slice) for t in targets) or sum(t.size for t in targets) > budget:
        return None
    return np.concatenate(targets).astype(np.int32) if targets else np.zeros(0, np.int32)


def _union(arrays: list[np.ndarray]) -> np.ndarray:
    merged = np.sort(np.concatenate(arrays)) if len(arrays) > 1 else arrays[0]
    if merged.size > 1:
        keep = np.empty(merged.size, bool)
        keep[0] = True
        np.not_equal(merged[1:], merged[:-1], out=keep[1:])
        merged = merged[keep]
    return merged.astype(np.int64)


class Holding:
    """What one delta connection's worker holds, as the server knows it (it sent it)."""

    def __init__(self, values: str):
        self.fmt = delta.values_format(values)
        self.version: int | None = None
        self.reference: np.ndarray | None = None  # q8: the worker's exact copy


def parse_hello(pull) -> Holding | None:
    """The HELLO's ``pull`` -> a :class:`Holding` for delta pulls, None for dense ones."""
    if pull is None:
        return None
    try:
        config = PullConfig(**pull)  # a worker's PullConfig.hello(); a peer's word, so checked here
        if config.mode not in PULL_MODES:
            raise ValueError(f"unknown pull mode {config.mode!r}; known: {', '.join(PULL_MODES)}")
        delta.values_format(config.values)
    except (TypeError, ValueError) as exc:
        raise ProtocolError("bad_hello", f"pull {pull!r}: {exc}") from None
    return Holding(config.values) if config.mode == "delta" else None


@dataclass
class Reply:
    """One MODEL frame for a worker, and what to trace about it."""

    version: int
    body: bytes | memoryview = b""
    flags: int = 0
    base: int | None = None  # the version a delta starts from (WHOLE: every tensor whole); None: the raw model
    entries: int | None = None  # coordinates a delta carries
    selection: list | None = None  # a delta still to build: per tensor, local indices or None (whole)
    values: list | np.ndarray | None = None  # ... and the model's values there, read under the lock
    changed: np.ndarray | None = None  # a float32 delta the compiled loops build: its flat coordinates
    since: tuple[int, np.ndarray] | None = None  # (v, every coordinate changed after v) where known


def prepare(holding: Holding, params: np.ndarray, version: int, log: ChangeLog, layout: Layout, snapshot) -> Reply:
    """Under the server's lock: what ``holding``'s worker gets at ``version``. Reads only what
    changed; the whole model (``snapshot()``, the raw float32 bytes) when the worker holds nothing
    the log can build on or the delta would be no smaller."""
    fmt = holding.fmt
    changed = log.since(holding.version)
    since = None if changed is None else (holding.version, changed)  # for AdaComp's counters (rules.AdaComp.on_pull)
    if changed is not None:
        fast = compiled.kernels()
        if fast is not None and fmt.name == "f32":  # one loop reads the values and sizes the message
            offsets, sizes = layout.arrays
            size, values = fast.delta_take(changed, params, offsets, sizes)
            if BASE.size + size < 4 * layout.total:
                return Reply(version, base=holding.version, entries=int(changed.size), values=values, changed=changed,
                             since=since)
        else:
            selection, size = delta.select(fmt, layout, changed)
            if BASE.size + size < 4 * layout.total:
                return Reply(version, base=holding.version, entries=int(changed.size), selection=selection,
                             values=delta.take(params, layout, selection), since=since)
    if fmt.whole_model:
        selection = delta.whole(layout)
        return Reply(version, base=WHOLE, entries=int(layout.total), selection=selection,
                     values=delta.take(params, layout, selection), since=since)
    return Reply(version, body=snapshot(), since=since)


def finish(reply: Reply, holding: Holding, layout: Layout) -> Reply:
    """Outside the lock: encode a prepared delta; the holding now holds what the reply carries."""
    fmt = holding.fmt
    if reply.changed is not None:
        offsets, sizes = layout.arrays
        body = compiled.kernels().delta_encode(reply.changed, reply.values, offsets, sizes, np.uint64(reply.base))
        reply.body, reply.flags = memoryview(body), int(Flag.DELTA)
        reply.changed = reply.values = None
    elif reply.selection is None:
        if fmt.keeps_reference:
            holding.reference = np.frombuffer(reply.body, dtype="<f4").copy()
    else:
        if fmt.keeps_reference and holding.reference is None:
            raise AssertionError("an increment for a worker whose copy the server does not hold")
        parts = delta.parts(fmt, layout, reply.selection, reply.values, holding.reference)
        reply.body = BASE.pack(reply.base) + delta.message(fmt, layout, parts)
        reply.flags = Flag.DELTA | (Flag.INCREMENT if fmt.increments else 0)
        if fmt.keeps_reference:
            delta.apply(holding.reference, parts, layout, increments=True)
        reply.selection = reply.values = None
    holding.version = reply.version
    return reply


class ModelCopy:
    """The worker's copy of the model, brought up to date by each MODEL frame."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.params = np.zeros(layout.total, np.float32)
        self.version: int | None = None

    def receive(self, version: int, flags: int, body) -> np.ndarray:
        """Apply one MODEL frame; returns the parameters (owned by this copy)."""
        if flags & Flag.DELTA:
            if len(body) < BASE.size:
                raise ProtocolError("bad_delta", "delta shorter than its base version")
            (base,) = BASE.unpack_from(body, 0)
            if base != WHOLE and base != self.version:
                raise ProtocolError("bad_delta", f"a delta from version {base}; this copy holds {self.version}")
            try:
                parts = compression.decode(memoryview(body)[BASE.size :], self.layout)
            except compression.CodecError as exc:
                raise ProtocolError("bad_delta", str(exc)) from None
            delta.apply(self.params, parts, self.layout, bool(flags & Flag.INCREMENT))
        else:
            model = np.frombuffer(body, dtype="<f4")
            if model.size != self.params.size:
                raise ProtocolError("bad_model", f"{model.size} parameters, the model has {self.params.size}")
            np.copyto(self.params, model)
        self.version = version
        return self.params


__all__ = ["BASE", "ChangeLog", "Holding", "ModelCopy", "PULL_MODES", "PullConfig", "Reply", "WHOLE", "finish", "parse_hello",
           "prepare"]
