"""The update message: a list of parts, one per tensor of the layout, framed for the wire.

Message layout (little-endian)::

    u8  format version (1)
    u16 number of parts (must equal the layout's tensor count)
    per part: u8 kind, u8 flags, u32 body length, body

Decoding checks every length before it slices and every index and value before it returns,
and raises :class:`CodecError` with a short reason that the server records per rejection.
"""

from __future__ import annotations

import struct

import numpy as np

from compression import compiled
from compression.layout import Layout
from compression.parts import KNOWN_FLAGS, PART_KINDS, Part, PartError, WireFormat

FORMAT_VERSION = 1
_HEAD = struct.Struct("<BH")
_PART_HEAD = struct.Struct("<BBI")


class CodecError(ValueError):
    """A message that must not be applied; ``reason`` is a short stable label for traces."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def encode(parts: list[Part], layout: Layout, wire: WireFormat = WireFormat(), part_flags: list[int] | None = None) -> bytes:
    """The message; ``part_flags``: each part's own flags where they differ (default ``wire``'s for all)."""
    if len(parts) != len(layout):
        raise ValueError(f"{len(parts)} parts for a layout of {len(layout)} tensors")
    chunks = [_HEAD.pack(FORMAT_VERSION, len(parts))]
    for part, size, flags in zip(parts, layout.sizes, part_flags or [wire.flags] * len(parts)):
        body = part.write(size, flags)
        chunks.append(_PART_HEAD.pack(part.kind, flags, len(body)))
        chunks.append(body)
    return b"".join(chunks)


def decode(message: bytes | memoryview, layout: Layout) -> list[Part]:
    view = memoryview(message)
    if len(view) < _HEAD.size:
        raise CodecError("truncated", "message shorter than its header")
    version, count = _HEAD.unpack_from(view, 0)
    if version != FORMAT_VERSION:
        raise CodecError("bad_format", f"message format {version}, expected {FORMAT_VERSION}")
    if count != len(layout):
        raise CodecError("bad_layout", f"{count} parts, the model has {len(layout)} tensors")
    pos = _HEAD.size
    parts: list[Part] = []
    for size in layout.sizes:
        if pos + _PART_HEAD.size > len(view):
            raise CodecError("truncated", "part header past the end")
        kind, flags, length = _PART_HEAD.unpack_from(view, pos)
        pos += _PART_HEAD.size
        if pos + length > len(view):
            raise CodecError("truncated", f"part of {length} bytes past the end")
        part_type = PART_KINDS.get(kind)
        if part_type is None:
            raise CodecError("bad_kind", f"unknown part kind {kind}")
        if flags & ~KNOWN_FLAGS:
            raise CodecError("bad_flags", f"unknown flag bits {flags & ~KNOWN_FLAGS:#04x}")
        try:
            parts.append(part_type.read(view[pos : pos + length], size, flags))
        except PartError as exc:
            raise CodecError(exc.reason, str(exc)) from None
        pos += length
    if pos != len(view):
        raise CodecError("trailing", f"{len(view) - pos} bytes after the last part")
    return parts


def decode_flat(message: bytes | memoryview, layout: Layout) -> tuple[np.ndarray, np.ndarray] | None:
    """The compiled decoder's shortcut past :class:`Part` objects: the message's coordinates as
    one ascending flat index array (int64, offsets added) and their float32 values, for the
    messages top-k methods send (dense and sparse float32 parts, Elias-Fano indices, at most a
    quarter of the model). None when the compiled loops are off, for any other message and for a
    malformed one: :func:`decode` then decodes it, or says why not."""
    fast = compiled.kernels()
    if fast is None:
        return None
    offsets, sizes = layout.arrays
    taken, indices, values = fast.decode_flat(np.frombuffer(message, np.uint8), offsets, sizes)
    return (indices, values) if taken else None


def round_trip(parts: list[Part], wire: WireFormat) -> list[Part]:
    """The parts as the receiver will see them (lossy value formats applied), without bytes."""
    return [part.rounded(wire.flags) for part in parts]
