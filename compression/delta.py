"""Model deltas for the way down: what a worker lacks, in the codec the pushes travel in.

The server knows which coordinates changed since the version a worker holds
(:class:`emulator.runtime.downlink.ChangeLog`). A delta carries those coordinates, one part per
tensor of the layout: their indices Elias-Fano coded (a sparse part) or, when that is no
smaller, the whole tensor. The message is a push's message (:mod:`compression.codec`); only
what the receiver does with its values differs, and that is the value format's:

======  =====================================================  =============================
format  a part carries                                         the receiver's copy afterwards
======  =====================================================  =============================
f32     the model's values; they replace the copy's            the model, bit for bit
f16     the model's values rounded to half precision; replace  ``round_f16(model)``, bit for bit
q8      8-bit codes of ``model - copy``, one scale per tensor;  within half a code step of the
        added to the copy                                      last delta that carried it
======  =====================================================  =============================

No drift, by two routes. ``f16`` rounds the server's exact value each time (the server's own
model is the shared reference): a rounding error is never built upon, so ``|copy - model|`` is
at most half an f16 unit in the last place of each parameter, however many pulls. ``q8`` codes
a difference, so the server keeps each such worker's copy exactly (its reference, 4 bytes per
parameter per worker) and codes ``model - copy``: what a code could not carry stays in that
difference and travels with the coordinate's next change (error feedback).

Pure functions and small classes, no I/O: the server gathers values under its lock
(:func:`take`), builds parts outside it (:func:`parts`); the worker and the server's
reference both :func:`apply` the same parts, so they compute the same float32 numbers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from compression import bitpack, elias_fano
from compression.codec import encode
from compression.layout import Layout
from compression.parts import DensePart, Part, QuantizedPart, SparseLevelsPart, SparsePart, WireFormat, as_scale, level_bits

MESSAGE_HEAD = 3  # the codec's format version and part count
PART_HEAD = 6  # per part: kind, flags, body length
LEVELS = 127  # q8: codes 0..254, 8 bits

Selection = list  # per tensor: sorted local indices, or None for the whole tensor


class DeltaValues(ABC):
    """How a delta's values travel and what the receiver does with them."""

    name: ClassVar[str]
    wire: ClassVar[WireFormat] = WireFormat()
    increments: ClassVar[bool] = False  # the values are added to the copy (else they replace it)
    keeps_reference: ClassVar[bool] = False  # the sender must keep the receiver's exact copy
    whole_model: ClassVar[bool] = False  # a receiver that holds nothing gets this format's parts (else the raw model)

    @abstractmethod
    def sparse_bytes(self, n: int, k: int) -> int:
        """Bytes of the body of a part carrying ``k`` of a tensor's ``n`` coordinates."""

    @abstractmethod
    def dense_bytes(self, n: int) -> int:
        """Bytes of the body of a part carrying all ``n`` coordinates."""

    @abstractmethod
    def part(self, values: np.ndarray, indices: np.ndarray | None, reference: np.ndarray | None) -> Part:
        """The part for one tensor: ``values`` are the model's at ``indices`` (the whole tensor
        when None), ``reference`` the receiver's copy there (formats that keep one)."""


class Exact(DeltaValues):
    name = "f32"

    def sparse_bytes(self, n, k):
        return 4 + elias_fano.encoded_size(n, k) + 4 * k

    def dense_bytes(self, n):
        return 4 * n

    def part(self, values, indices, reference):
        return DensePart(values) if indices is None else SparsePart(indices, values)


class Half(Exact):
    name = "f16"
    wire = WireFormat(values="f16")
    whole_model = True  # half the raw model, and the copy is round_f16(model) from the first pull on

    def sparse_bytes(self, n, k):
        return 4 + elias_fano.encoded_size(n, k) + 2 * k

    def dense_bytes(self, n):
        return 2 * n


class Levels8(DeltaValues):
    name = "q8"
    increments = True
    keeps_reference = True

    def sparse_bytes(self, n, k):
        return 10 + elias_fano.encoded_size(n, k) + bitpack.packed_size(k, level_bits(LEVELS))

    def dense_bytes(self, n):
        return 6 + bitpack.packed_size(n, level_bits(LEVELS))

    def part(self, values, indices, reference):
        difference = values - reference
        scale, codes = quantize(difference)
        if indices is None:
            return QuantizedPart(LEVELS, scale, codes)
        return SparseLevelsPart(indices, LEVELS, scale, codes)


def quantize(difference: np.ndarray) -> tuple[float, np.ndarray]:
    """``(scale, codes)``: the scale is ``max |difference|`` (as float32), codes round to nearest."""
    scale = as_scale(float(np.max(np.abs(difference)))) if difference.size else 0.0
    if not scale > 0:
        return 0.0, np.full(difference.size, LEVELS, np.int64)
    levels = np.rint(difference.astype(np.float64) * (LEVELS / scale))
    return scale, (np.clip(levels, -LEVELS, LEVELS) + LEVELS).astype(np.int64)


DELTA_VALUES: dict[str, DeltaValues] = {cls.name: cls() for cls in (Exact, Half, Levels8)}


def values_format(name: str) -> DeltaValues:
    try:
        return DELTA_VALUES[name]
    except KeyError:
        raise ValueError(f"unknown delta value format {name!r}; known: {', '.join(DELTA_VALUES)}") from None


def whole(layout: Layout) -> Selection:
    """Every tensor whole."""
    return [None] * len(layout)


def select(fmt: DeltaValues, layout: Layout, changed: np.ndarray) -> tuple[Selection, int]:
    """Split sorted flat ``changed`` indices by tensor, each tensor sparse or whole, whichever is
    smaller; returns the selection and the exact bytes of the message it makes."""
    bounds = np.searchsorted(changed, layout.offsets[1:])
    selection, size = [], MESSAGE_HEAD
    for offset, n, chunk in zip(layout.offsets, layout.sizes, np.split(changed, bounds)):
        sparse, dense = fmt.sparse_bytes(n, chunk.size), fmt.dense_bytes(n)
        if sparse < dense:
            selection.append(chunk - offset)
            size += PART_HEAD + sparse
        else:
            selection.append(None)
            size += PART_HEAD + dense
    return selection, size


def message_bytes(fmt: DeltaValues, layout: Layout, selection: Selection) -> int:
    """Bytes of the message for ``selection`` (as :func:`select` counts them)."""
    return MESSAGE_HEAD + sum(PART_HEAD + (fmt.dense_bytes(n) if idx is None else fmt.sparse_bytes(n, idx.size))
                              for n, idx in zip(layout.sizes, selection))


def take(params: np.ndarray, layout: Layout, selection: Selection) -> list[np.ndarray]:
    """Copies of the model's values at ``selection`` (what must be read under the server's lock)."""
    return [params[offset : offset + n].copy() if idx is None else params[idx + offset]
            for offset, n, idx in zip(layout.offsets, layout.sizes, selection)]


def parts(fmt: DeltaValues, layout: Layout, selection: Selection, values: list[np.ndarray],
          reference: np.ndarray | None = None) -> list[Part]:
    """One part per tensor from the values :func:`take` read."""
    out = []
    for offset, n, idx, vals in zip(layout.offsets, layout.sizes, selection, values):
        ref = None
        if fmt.keeps_reference:
            ref = reference[offset : offset + n] if idx is None else reference[idx + offset]
        out.append(fmt.part(vals, idx, ref))
    return out


def message(fmt: DeltaValues, layout: Layout, delta: list[Part]) -> bytes:
    return encode(delta, layout, fmt.wire)


def apply(copy: np.ndarray, delta: list[Part], layout: Layout, increments: bool) -> None:
    """Bring ``copy`` (flat float32) up to date in place: the parts' values replace the copy's, or
    with ``increments`` are added to them. The server's reference of a worker goes through here
    with the parts it built (rounded as the wire rounds them), the worker with the parts it decoded."""
    for offset, n, part in zip(layout.offsets, layout.sizes, delta):
        indices, values = part.coordinates(n)
        target = slice(offset, offset + n) if indices is None else indices + offset
        if increments:
            copy[target] += values
        else:
            copy[target] = values


__all__ = ["DELTA_VALUES", "DeltaValues", "LEVELS", "apply", "message", "message_bytes", "parts", "quantize",
           "select", "take", "values_format", "whole"]
