"""What one tensor contributes to an update message, and how it is laid out in bytes.

A compressor turns each gradient tensor into one ``Part``. Only parts travel; the server
turns each received part back into coordinates to update with :meth:`Part.coordinates`.
New kinds of part (quantised levels, low-rank factors, ...) register here under a new
kind id with their own ``write``/``read``; the codec frames them all the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from . import elias_fano

FLAG_F16_VALUES = 0x01
FLAG_RAW32_INDICES = 0x02
KNOWN_FLAGS = FLAG_F16_VALUES | FLAG_RAW32_INDICES  # any other bit: a format this reader does not know
_F16_MAX = float(np.finfo(np.float16).max)


class PartError(ValueError):
    """A part's bytes do not describe a valid part for its tensor."""


@dataclass(frozen=True)
class WireFormat:
    """How values and indices are written: lossless float32 and Elias-Fano by default."""

    values: str = "f32"  # "f32" | "f16"
    indices: str = "elias_fano"  # "elias_fano" | "raw32"

    def __post_init__(self):
        if self.values not in ("f32", "f16") or self.indices not in ("elias_fano", "raw32"):
            raise ValueError(f"unknown wire format values={self.values!r} indices={self.indices!r}")

    @property
    def flags(self) -> int:
        return (FLAG_F16_VALUES if self.values == "f16" else 0) | (
            FLAG_RAW32_INDICES if self.indices == "raw32" else 0
        )


def write_values(values: np.ndarray, flags: int) -> bytes:
    if flags & FLAG_F16_VALUES:
        return np.clip(values, -_F16_MAX, _F16_MAX).astype("<f2").tobytes()
    return np.ascontiguousarray(values, dtype="<f4").tobytes()


def read_values(body: memoryview, count: int, flags: int) -> tuple[np.ndarray, int]:
    width = 2 if flags & FLAG_F16_VALUES else 4
    need = count * width
    if len(body) < need:
        raise PartError(f"values truncated: {len(body)} bytes for {count} values")
    raw = np.frombuffer(body[:need], dtype="<f2" if width == 2 else "<f4")
    values = raw.astype(np.float32)
    if not np.isfinite(values).all():
        raise PartError("non-finite value (NaN or Inf)")
    return values, need


def round_values(values: np.ndarray, flags: int) -> np.ndarray:
    """The values exactly as the server will read them (for error feedback)."""
    if flags & FLAG_F16_VALUES:
        return np.clip(values, -_F16_MAX, _F16_MAX).astype(np.float16).astype(np.float32)
    return np.asarray(values, dtype=np.float32)


class Part(ABC):
    """One tensor's share of an update message."""

    kind: ClassVar[int]

    @property
    @abstractmethod
    def entries(self) -> int:
        """How many coordinates this part updates."""

    @abstractmethod
    def coordinates(self, size: int) -> tuple[np.ndarray | None, np.ndarray]:
        """``(indices, values)`` to apply; ``indices`` is None when every coordinate is updated."""

    @abstractmethod
    def write(self, size: int, flags: int) -> bytes:
        """The part's bytes on the wire."""

    @classmethod
    @abstractmethod
    def read(cls, body: memoryview, size: int, flags: int) -> "Part":
        """Parse exactly ``body``; raise :class:`PartError` on anything inconsistent."""

    def dense(self, size: int) -> np.ndarray:
        indices, values = self.coordinates(size)
        if indices is None:
            return values
        out = np.zeros(size, np.float32)
        out[indices] = values
        return out

    def rounded(self, flags: int) -> "Part":
        """This part as the receiver will decode it under ``flags`` (lossy value formats)."""
        return self


PART_KINDS: dict[int, type[Part]] = {}


def register_part(cls: type[Part]) -> type[Part]:
    if cls.kind in PART_KINDS:
        raise ValueError(f"part kind {cls.kind} registered twice")
    PART_KINDS[cls.kind] = cls
    return cls


@register_part
@dataclass(frozen=True)
class DensePart(Part):
    """Every coordinate, in order."""

    values: np.ndarray
    kind: ClassVar[int] = 1

    @property
    def entries(self) -> int:
        return int(self.values.size)

    def coordinates(self, size):
        return None, self.values

    def write(self, size, flags):
        if self.values.size != size:
            raise PartError(f"dense part has {self.values.size} values for a tensor of {size}")
        return write_values(self.values.ravel(), flags)

    @classmethod
    def read(cls, body, size, flags):
        values, used = read_values(body, size, flags)
        if used != len(body):
            raise PartError(f"dense part: {len(body)} bytes, expected {used}")
        return cls(values)

    def rounded(self, flags):
        return DensePart(round_values(self.values, flags))


@register_part
@dataclass(frozen=True)
class SparsePart(Part):
    """Some coordinates: strictly increasing flat ``indices`` within the tensor and their values."""

    indices: np.ndarray
    values: np.ndarray
    kind: ClassVar[int] = 2

    @property
    def entries(self) -> int:
        return int(self.indices.size)

    def coordinates(self, size):
        return self.indices, self.values

    def write(self, size, flags):
        k = int(self.indices.size)
        if flags & FLAG_RAW32_INDICES:
            index_block = np.asarray(self.indices, dtype="<u4").tobytes()
        else:
            index_block = elias_fano.encode(self.indices, size)
        return k.to_bytes(4, "little") + index_block + write_values(self.values, flags)

    @classmethod
    def read(cls, body, size, flags):
        if len(body) < 4:
            raise PartError("sparse part shorter than its count")
        k = int.from_bytes(body[:4], "little")
        if k > size:
            raise PartError(f"sparse part claims {k} entries for a tensor of {size}")
        pos = 4
        if flags & FLAG_RAW32_INDICES:
            end = pos + 4 * k
            if end > len(body):
                raise PartError("raw indices truncated")
            indices = np.frombuffer(body[pos:end], dtype="<u4").astype(np.int64)
            if k and (indices[-1] >= size or np.any(np.diff(indices) <= 0) or indices[0] < 0):
                raise PartError("indices are not strictly increasing within the tensor")
        else:
            end = pos + elias_fano.encoded_size(size, k)
            if end > len(body):
                raise PartError("Elias-Fano block truncated")
            try:
                indices = elias_fano.decode(body[pos:end], size, k)
            except elias_fano.EliasFanoError as exc:
                raise PartError(str(exc)) from None
        values, used = read_values(body[end:], k, flags)
        if end + used != len(body):
            raise PartError(f"sparse part: {len(body) - end - used} trailing bytes")
        return cls(indices, values)

    def rounded(self, flags):
        return SparsePart(self.indices, round_values(self.values, flags))
