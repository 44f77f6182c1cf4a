"""What one tensor contributes to an update message, and how it is laid out in bytes.

A compressor turns each gradient tensor into one ``Part``. Only parts travel; the server
turns each received part back into coordinates to update with :meth:`Part.coordinates`.
New kinds of part register here under a new kind id with their own ``write``/``read``; the
codec frames them all the same way. Every ``read`` checks lengths before it slices, bounds
every count by the tensor's size, and refuses NaN/Inf (reason ``non_finite``).

====  ================  =====================================================  ===============
kind  part              body                                                   bits per entry
====  ================  =====================================================  ===============
1     DensePart         values                                                 32 (16 with f16)
2     SparsePart        u32 k, indices, values                                 ~2+log2(n/k) + 32
4     HalfPart          float16 values, whatever the flags                     16
5     QuantizedPart     u16 s, f32 scale, codes 0..2s                          ceil(log2(2s+1))
6     SignPart          f32 scale, sign bits                                   1
7     SparseSignPart    u32 k, f32 scale, indices, sign bits                   ~2+log2(n/k) + 1
8     LowRankPart       u32 rows, u32 cols, u32 r, P (rows x r), Q (cols x r)  32 r (rows+cols) / n
9     SparseLevelsPart  u32 k, u16 s, f32 scale, indices, codes 0..2s          ~2+log2(n/k) + ceil(log2(2s+1))
====  ================  =====================================================  ===============
"""

from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from compression import bitpack, elias_fano

FLAG_F16_VALUES = 0x01
FLAG_RAW32_INDICES = 0x02
KNOWN_FLAGS = FLAG_F16_VALUES | FLAG_RAW32_INDICES  # any other bit: a format this reader does not know
_F16_MAX = float(np.finfo(np.float16).max)
_F32_MAX = float(np.finfo(np.float32).max)


class PartError(ValueError):
    """A part's bytes do not describe a valid part for its tensor; ``reason`` labels it in traces."""

    def __init__(self, detail: str, reason: str = "bad_part"):
        super().__init__(detail)
        self.reason = reason


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
        raise PartError("non-finite value (NaN or Inf)", reason="non_finite")
    return values, need


def round_values(values: np.ndarray, flags: int) -> np.ndarray:
    """The values exactly as the server will read them (for error feedback)."""
    if flags & FLAG_F16_VALUES:
        return np.clip(values, -_F16_MAX, _F16_MAX).astype(np.float16).astype(np.float32)
    return np.asarray(values, dtype=np.float32)


def write_indices(indices: np.ndarray, size: int, flags: int) -> bytes:
    """Strictly increasing flat indices: Elias-Fano, or 4 bytes each under ``FLAG_RAW32_INDICES``."""
    if flags & FLAG_RAW32_INDICES:
        return np.asarray(indices, dtype="<u4").tobytes()
    return elias_fano.encode(indices, size)


def read_indices(body: memoryview, pos: int, k: int, size: int, flags: int) -> tuple[np.ndarray, int]:
    """``k`` indices written by :func:`write_indices` at ``body[pos:]``; returns them and where they end."""
    if flags & FLAG_RAW32_INDICES:
        end = pos + 4 * k
        if end > len(body):
            raise PartError("raw indices truncated")
        indices = np.frombuffer(body[pos:end], dtype="<u4").astype(np.int64)
        if k and (indices[-1] >= size or np.any(np.diff(indices) <= 0) or indices[0] < 0):
            raise PartError("indices are not strictly increasing within the tensor")
        return indices, end
    end = pos + elias_fano.encoded_size(size, k)
    if end > len(body):
        raise PartError("Elias-Fano block truncated")
    try:
        return elias_fano.decode(body[pos:end], size, k), end
    except elias_fano.EliasFanoError as exc:
        raise PartError(str(exc)) from None


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


@dataclass(frozen=True)
class _EveryCoordinate(Part):
    """A part that carries one value per coordinate of the tensor, in order (not registered)."""

    values: np.ndarray

    @property
    def entries(self) -> int:
        return int(self.values.size)

    def coordinates(self, size):
        return None, self.values


@register_part
@dataclass(frozen=True)
class DensePart(_EveryCoordinate):
    """Every coordinate, in order."""

    kind: ClassVar[int] = 1

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
        return k.to_bytes(4, "little") + write_indices(self.indices, size, flags) + write_values(self.values, flags)

    @classmethod
    def read(cls, body, size, flags):
        if len(body) < 4:
            raise PartError("sparse part shorter than its count")
        k = int.from_bytes(body[:4], "little")
        if k > size:
            raise PartError(f"sparse part claims {k} entries for a tensor of {size}")
        indices, end = read_indices(body, 4, k, size, flags)
        values, used = read_values(body[end:], k, flags)
        if end + used != len(body):
            raise PartError(f"sparse part: {len(body) - end - used} trailing bytes")
        return cls(indices, values)

    def rounded(self, flags):
        return SparsePart(self.indices, round_values(self.values, flags))


# ---------------------------------------------------------------------------------------
# Kinds for the compressors beyond top-k. Scales and norms are always float32 (the f16 flag
# applies to arrays of float values only: dense, sparse and low-rank parts).

_SCALE = struct.Struct("<f")
_LEVELS = struct.Struct("<H")
_COUNT = struct.Struct("<I")
_SHAPE = struct.Struct("<III")
MAX_LEVELS = 32767  # QSGD's s; codes 0..2s fit in 16 bits


def write_scale(scale: float) -> bytes:
    return _SCALE.pack(scale)


def read_scale(body: memoryview, pos: int) -> tuple[float, int]:
    """A float32 scale at ``body[pos:]``: finite and not negative."""
    end = pos + _SCALE.size
    if end > len(body):
        raise PartError("scale truncated")
    (scale,) = _SCALE.unpack_from(body, pos)
    if not math.isfinite(scale):
        raise PartError("non-finite scale (NaN or Inf)", reason="non_finite")
    if scale < 0:
        raise PartError(f"negative scale {scale}")
    return scale, end


def as_scale(value: float) -> float:
    """``value`` as the float32 the receiver will read, so both sides compute the same values."""
    return float(np.float32(value))


def _unpack(body: memoryview, count: int, width: int, what: str) -> np.ndarray:
    try:
        return bitpack.unpack(body, count, width)
    except bitpack.BitPackError as exc:
        raise PartError(f"{what}: {exc}") from None


def _signed(negative: np.ndarray, scale: float) -> np.ndarray:
    return np.where(negative, np.float32(-scale), np.float32(scale)).astype(np.float32)


@register_part
@dataclass(frozen=True)
class HalfPart(_EveryCoordinate):
    """Every coordinate as IEEE half precision, whatever the wire's value format: 16 bits per entry.

    ``values`` are float32 holding float16-representable numbers (see :func:`to_half`).
    """

    kind: ClassVar[int] = 4

    def write(self, size, flags):
        if self.values.size != size:
            raise PartError(f"half part has {self.values.size} values for a tensor of {size}")
        return write_values(self.values.ravel(), FLAG_F16_VALUES)

    @classmethod
    def read(cls, body, size, flags):
        if len(body) != 2 * size:
            raise PartError(f"half part: {len(body)} bytes, expected {2 * size}")
        values, _ = read_values(body, size, FLAG_F16_VALUES)
        return cls(values)

    def rounded(self, flags):
        return HalfPart(to_half(self.values))


def to_half(values: np.ndarray) -> np.ndarray:
    """Values rounded to float16 (clipped to its range), held as float32."""
    return round_values(values, FLAG_F16_VALUES)


def level_bits(levels: int) -> int:
    """Bits per code for ``2 * levels + 1`` codes: ``ceil(log2(2s + 1))``."""
    return (2 * levels).bit_length()


@register_part
@dataclass(frozen=True)
class QuantizedPart(Part):
    """Every coordinate as one of ``2s + 1`` levels: ``value = scale * (code - s) / s``.

    Body: u16 ``s`` (1..32767), f32 ``scale`` (finite, >= 0), then one code in ``0..2s`` per
    entry, ``ceil(log2(2s + 1))`` bits each, packed MSB first (:mod:`compression.bitpack`).
    QSGD (scale = the tensor's 2-norm) and TernGrad (``s = 1``, 2 bits, scale = max ``|g|``)
    both travel as this kind.
    """

    levels: int
    scale: float
    codes: np.ndarray
    kind: ClassVar[int] = 5

    @property
    def entries(self) -> int:
        return int(self.codes.size)

    def coordinates(self, size):
        step = np.float32(self.scale / self.levels)
        return None, (self.codes - self.levels).astype(np.float32) * step

    def write(self, size, flags):
        if self.codes.size != size:
            raise PartError(f"quantized part has {self.codes.size} codes for a tensor of {size}")
        if not 1 <= self.levels <= MAX_LEVELS:
            raise PartError(f"quantized part: {self.levels} levels, at most {MAX_LEVELS}")
        return _LEVELS.pack(self.levels) + write_scale(self.scale) + bitpack.pack(self.codes, level_bits(self.levels))

    @classmethod
    def read(cls, body, size, flags):
        if len(body) < _LEVELS.size:
            raise PartError("quantized part shorter than its level count")
        (levels,) = _LEVELS.unpack_from(body, 0)
        if not 1 <= levels <= MAX_LEVELS:
            raise PartError(f"quantized part: {levels} levels, expected 1..{MAX_LEVELS}")
        scale, pos = read_scale(body, _LEVELS.size)
        codes = _unpack(body[pos:], size, level_bits(levels), "quantized part")
        if codes.size and codes.max() > 2 * levels:
            raise PartError(f"quantized part: code {int(codes.max())} above {2 * levels}")
        return cls(levels, scale, codes)


@register_part
@dataclass(frozen=True)
class SignPart(Part):
    """Every coordinate as ``+scale`` or ``-scale``: f32 ``scale``, then one bit per entry (1 = negative)."""

    scale: float
    negative: np.ndarray  # bool, one per entry
    kind: ClassVar[int] = 6

    @property
    def entries(self) -> int:
        return int(self.negative.size)

    def coordinates(self, size):
        return None, _signed(self.negative, self.scale)

    def write(self, size, flags):
        if self.negative.size != size:
            raise PartError(f"sign part has {self.negative.size} signs for a tensor of {size}")
        return write_scale(self.scale) + bitpack.pack(self.negative, 1)

    @classmethod
    def read(cls, body, size, flags):
        scale, pos = read_scale(body, 0)
        return cls(scale, _unpack(body[pos:], size, 1, "sign part").astype(bool))


@register_part
@dataclass(frozen=True)
class SparseSignPart(Part):
    """Some coordinates, each ``+scale`` or ``-scale``.

    Body: u32 ``k`` (<= the tensor's size), f32 ``scale``, the ``k`` strictly increasing indices
    (Elias-Fano, or raw u32 under ``FLAG_RAW32_INDICES``), then one sign bit per index (1 = negative).
    """

    indices: np.ndarray
    scale: float
    negative: np.ndarray
    kind: ClassVar[int] = 7

    @property
    def entries(self) -> int:
        return int(self.indices.size)

    def coordinates(self, size):
        return self.indices, _signed(self.negative, self.scale)

    def write(self, size, flags):
        k = int(self.indices.size)
        if self.negative.size != k:
            raise PartError(f"sparse sign part: {self.negative.size} signs for {k} indices")
        return (_COUNT.pack(k) + write_scale(self.scale) + write_indices(self.indices, size, flags)
                + bitpack.pack(self.negative, 1))

    @classmethod
    def read(cls, body, size, flags):
        if len(body) < _COUNT.size:
            raise PartError("sparse sign part shorter than its count")
        (k,) = _COUNT.unpack_from(body, 0)
        if k > size:
            raise PartError(f"sparse sign part claims {k} entries for a tensor of {size}")
        scale, pos = read_scale(body, _COUNT.size)
        indices, end = read_indices(body, pos, k, size, flags)
        negative = _unpack(body[end:], k, 1, "sparse sign part").astype(bool)
        return cls(indices, scale, negative)


def _product_bound(p: np.ndarray, q: np.ndarray) -> float:
    """An upper bound of ``|P @ Q.T|`` (Cauchy-Schwarz on rows), without forming the product."""
    largest = [float(np.max(np.sum(np.square(m, dtype=np.float64), axis=1))) for m in (p, q)]
    return math.sqrt(largest[0]) * math.sqrt(largest[1])


@register_part
@dataclass(frozen=True)
class LowRankPart(Part):
    """The tensor as the ``rows x cols`` matrix ``P @ Q.T`` (row-major), ``P`` rows x r, ``Q`` cols x r.

    Body: u32 rows, u32 cols, u32 rank (``rows * cols`` = the tensor's size, 1 <= rank <=
    min(rows, cols)), then ``P`` and ``Q`` row-major as values (float32, or float16 under
    ``FLAG_F16_VALUES``). Finite factors can still multiply to infinity: factors whose product
    could leave float32's range are refused (``non_finite``).
    """

    p: np.ndarray
    q: np.ndarray
    kind: ClassVar[int] = 8

    @property
    def entries(self) -> int:
        return int(self.p.shape[0] * self.q.shape[0])

    def coordinates(self, size):
        return None, (self.p @ self.q.T).astype(np.float32).ravel()

    def write(self, size, flags):
        (rows, rank), (cols, rank_q) = self.p.shape, self.q.shape
        if rows * cols != size or rank != rank_q or not 1 <= rank <= min(rows, cols):
            raise PartError(f"low-rank part: P {self.p.shape}, Q {self.q.shape} for a tensor of {size}")
        return _SHAPE.pack(rows, cols, rank) + write_values(self.p.ravel(), flags) + write_values(self.q.ravel(), flags)

    @classmethod
    def read(cls, body, size, flags):
        if len(body) < _SHAPE.size:
            raise PartError("low-rank part shorter than its shape")
        rows, cols, rank = _SHAPE.unpack_from(body, 0)
        if rows * cols != size:
            raise PartError(f"low-rank part: {rows} x {cols} for a tensor of {size}")
        if not 1 <= rank <= min(rows, cols):
            raise PartError(f"low-rank part: rank {rank} for a {rows} x {cols} matrix")
        width = 2 if flags & FLAG_F16_VALUES else 4
        expected = _SHAPE.size + (rows + cols) * rank * width
        if len(body) != expected:
            raise PartError(f"low-rank part: {len(body)} bytes, expected {expected}")
        p, used = read_values(body[_SHAPE.size :], rows * rank, flags)
        q, _ = read_values(body[_SHAPE.size + used :], cols * rank, flags)
        p, q = p.reshape(rows, rank), q.reshape(cols, rank)
        if not _product_bound(p, q) < _F32_MAX / 2:
            raise PartError("low-rank factors whose product may overflow float32", reason="non_finite")
        return cls(p, q)

    def rounded(self, flags):
        return LowRankPart(round_values(self.p, flags), round_values(self.q, flags))


@register_part
@dataclass(frozen=True)
class SparseLevelsPart(Part):
    """Some coordinates, each one of ``2s + 1`` levels: ``value = scale * (code - s) / s``.

    :class:`QuantizedPart` at the coordinates of a :class:`SparsePart` (the 8-bit model deltas of
    :mod:`compression.delta`). Body: u32 ``k`` (<= the tensor's size), u16 ``s``, f32 ``scale``,
    the ``k`` strictly increasing indices (Elias-Fano, or raw u32 under ``FLAG_RAW32_INDICES``),
    then ``k`` codes of ``ceil(log2(2s + 1))`` bits, packed MSB first.
    """

    indices: np.ndarray
    levels: int
    scale: float
    codes: np.ndarray
    kind: ClassVar[int] = 9

    @property
    def entries(self) -> int:
        return int(self.indices.size)

    def coordinates(self, size):
        step = np.float32(self.scale / self.levels)
        return self.indices, (self.codes - self.levels).astype(np.float32) * step

    def write(self, size, flags):
        k = int(self.indices.size)
        if self.codes.size != k:
            raise PartError(f"sparse levels part: {self.codes.size} codes for {k} indices")
        if not 1 <= self.levels <= MAX_LEVELS:
            raise PartError(f"sparse levels part: {self.levels} levels, at most {MAX_LEVELS}")
        return (_COUNT.pack(k) + _LEVELS.pack(self.levels) + write_scale(self.scale)
                + write_indices(self.indices, size, flags) + bitpack.pack(self.codes, level_bits(self.levels)))

    @classmethod
    def read(cls, body, size, flags):
        head = _COUNT.size + _LEVELS.size
        if len(body) < head:
            raise PartError("sparse levels part shorter than its count and levels")
        (k,) = _COUNT.unpack_from(body, 0)
        (levels,) = _LEVELS.unpack_from(body, _COUNT.size)
        if k > size:
            raise PartError(f"sparse levels part claims {k} entries for a tensor of {size}")
        if not 1 <= levels <= MAX_LEVELS:
            raise PartError(f"sparse levels part: {levels} levels, expected 1..{MAX_LEVELS}")
        scale, pos = read_scale(body, head)
        indices, end = read_indices(body, pos, k, size, flags)
        codes = _unpack(body[end:], k, level_bits(levels), "sparse levels part")
        if codes.size and codes.max() > 2 * levels:
            raise PartError(f"sparse levels part: code {int(codes.max())} above {2 * levels}")
        return cls(indices, levels, scale, codes)
