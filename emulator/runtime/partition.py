"""How the model's parameters are split over several server processes (shards).

A :class:`Partition` cuts the model's flat float32 vector into ``shards`` contiguous ranges;
shard ``i`` holds ``[bounds[i], bounds[i + 1])`` and nothing else, so every coordinate lives on
exactly one shard. What differs between partitions is only where the bounds may fall:

``tensors``  on tensor boundaries (TensorFlow's ``fixed_size_partitioner`` over whole
             variables): every part a compressor makes reaches one shard whole, but a model
             whose largest tensor dominates cannot be balanced (the paper's CNN: ``fc1/kernel``
             is 95% of its 421,642 parameters).
``ranges``   balanced key ranges of the flat vector, cut inside tensors (ps-lite's and
             BytePS's key ranges): bytes and server CPU per shard within one coordinate of
             equal; a part that straddles a bound is cut there (:meth:`Partition.split`).

A shard sees its range as a :class:`~compression.layout.Layout` of *pieces*: a whole tensor
keeps its name and shape, a cut one is ``name[a:b]`` of shape ``(b - a,)``. Workers split each
update into one message per shard (:meth:`Partition.split`), an empty part where they sent
nothing there, so every push reaches every shard: each shard's update counter, a worker's
``t0`` and the staleness are those of one server, and every rule (AdaComp's per-coordinate
sigma included) computes the same numbers per coordinate. The evaluator and the workers put the
model back together with :meth:`Partition.assemble`.

Cutting a part: a part that covers a piece whole travels as it is; a part cut at a bound
travels as the float32 values it decodes to there (dense, or sparse with local indices), the
numbers the server would have applied, so the model is the same bit for bit. Per-tensor scales
(quantised parts) and low-rank factors do not survive a cut on the wire: their cut pieces cost
float32 bytes (see :meth:`Partition.split`).

Another split is one subclass (``_bounds``) and its line in :data:`PARTITIONS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from functools import cached_property
from typing import ClassVar, NamedTuple

import numpy as np

from compression.layout import Layout, TensorSpec
from compression.parts import FLAG_F16_VALUES, DensePart, Part, SparsePart


class PartitionError(ValueError):
    """A split the model cannot have (more shards than it has tensors or coordinates, fewer than one)."""


class Piece(NamedTuple):
    tensor: int  # the tensor's index in the model's layout
    start: int  # the piece's first coordinate within the tensor
    stop: int  # one past its last
    whole: bool  # the piece is the whole tensor


class Partition(ABC):
    name: ClassVar[str]

    def __init__(self, layout: Layout, shards: int):
        if not isinstance(shards, int) or shards < 1:
            raise PartitionError(f"shards: {shards!r} is not a whole number >= 1")
        self.layout = layout
        self.shards = shards
        bounds = tuple(int(b) for b in self._bounds())
        if len(bounds) != shards + 1 or bounds[0] != 0 or bounds[-1] != layout.total or any(
                a >= b for a, b in zip(bounds, bounds[1:])):
            raise AssertionError(f"{type(self).__name__}: bounds {bounds} for {shards} shards of {layout.total}")
        self.bounds = bounds

    @abstractmethod
    def _bounds(self) -> tuple[int, ...]:
        """``shards + 1`` strictly increasing flat offsets from 0 to the model's size; raise
        :class:`PartitionError` when the model cannot be split this way into that many."""

    # -- what a shard holds ----------------------------------------------------------------

    def range(self, shard: int) -> tuple[int, int]:
        return self.bounds[shard], self.bounds[shard + 1]

    @cached_property
    def pieces(self) -> tuple[tuple[Piece, ...], ...]:
        out = []
        for lo, hi in zip(self.bounds, self.bounds[1:]):
            pieces = []
            for t, (offset, size) in enumerate(zip(self.layout.offsets, self.layout.sizes)):
                a, b = max(lo, offset) - offset, min(hi, offset + size) - offset
                if a < b:
                    pieces.append(Piece(t, a, b, a == 0 and b == size))
            out.append(tuple(pieces))
        return tuple(out)

    @cached_property
    def layouts(self) -> tuple[Layout, ...]:
        """Each shard's layout: its pieces as tensors."""
        out = []
        for pieces in self.pieces:
            specs = []
            for p in pieces:
                spec = self.layout.tensors[p.tensor]
                specs.append(spec if p.whole else TensorSpec(f"{spec.name}[{p.start}:{p.stop}]", (p.stop - p.start,)))
            out.append(Layout(tuple(specs)))
        return tuple(out)

    # -- what travels ----------------------------------------------------------------------

    def split(self, parts: list[Part]) -> list[list[Part]]:
        """One update's parts (one per tensor of the model) as each shard's parts (one per piece)."""
        if self.shards == 1:
            return [list(parts)]
        sizes = self.layout.sizes
        cache: dict[int, tuple[np.ndarray | None, np.ndarray]] = {}
        out = []
        for pieces in self.pieces:
            mine = []
            for p in pieces:
                part = parts[p.tensor]
                if p.whole:
                    mine.append(part)
                    continue
                if p.tensor not in cache:
                    cache[p.tensor] = part.coordinates(sizes[p.tensor])
                indices, values = cache[p.tensor]
                if indices is None:
                    mine.append(DensePart(np.ascontiguousarray(values[p.start:p.stop], np.float32)))
                else:
                    keep = (indices >= p.start) & (indices < p.stop)
                    mine.append(SparsePart((indices[keep] - p.start).astype(np.int64), values[keep].astype(np.float32)))
            out.append(mine)
        return out

    def flags(self, parts: list[Part], flags: int) -> list[list[int]]:
        """Each shard's parts' wire flags for :meth:`split`'s parts: the update's own, but float32
        values for a cut of a part whose values are derived (quantised, sign, low-rank parts: the
        numbers they decode to would not survive f16), so that the cut is exact."""
        exact = flags & ~FLAG_F16_VALUES
        return [[flags if p.whole or isinstance(parts[p.tensor], (DensePart, SparsePart)) else exact for p in pieces]
                for pieces in self.pieces]

    def split_model(self, params: np.ndarray) -> list[np.ndarray]:
        """The flat model as each shard's flat vector (views)."""
        return [params[lo:hi] for lo, hi in zip(self.bounds, self.bounds[1:])]

    def assemble(self, shards: list[np.ndarray]) -> np.ndarray:
        """The whole flat model from each shard's flat vector, in shard order."""
        if len(shards) != self.shards:
            raise ValueError(f"{len(shards)} shards' models for a partition into {self.shards}")
        return np.concatenate(shards) if self.shards > 1 else np.asarray(shards[0])

    # -- configuration ---------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"split": self.name, "shards": self.shards}

    def describe(self) -> list[dict]:
        """Per shard: its range and how many coordinates, tensors whole and cut it holds."""
        return [{"shard": i, "start": lo, "stop": hi, "parameters": hi - lo,
                 "tensors": [spec.name for spec in layout.tensors]}
                for i, ((lo, hi), layout) in enumerate(zip(zip(self.bounds, self.bounds[1:]), self.layouts))]


class ByTensor(Partition):
    """Bounds on tensor boundaries, each as near the balanced cut as the tensors allow."""

    name = "tensors"

    def _bounds(self):
        n = len(self.layout)
        if self.shards > n:
            raise PartitionError(f"shards: {self.shards} is more than the model's {n} tensors (split: tensors)")
        ends = np.cumsum(self.layout.sizes)  # the boundary after tensor j
        bounds, prev = [0], -1
        for i in range(1, self.shards):
            target = self.layout.total * i / self.shards
            lo, hi = prev + 1, n - (self.shards - i) - 1  # leave a tensor for every shard still to come
            j = lo + int(np.argmin(np.abs(ends[lo : hi + 1] - target)))
            bounds.append(int(ends[j]))
            prev = j
        return (*bounds, self.layout.total)


class KeyRanges(Partition):
    """Balanced contiguous ranges of the flat vector: sizes differ by at most one coordinate."""

    name = "ranges"

    def _bounds(self):
        total = self.layout.total
        if self.shards > total:
            raise PartitionError(f"shards: {self.shards} is more than the model's {total} parameters (split: ranges)")
        return tuple(total * i // self.shards for i in range(self.shards + 1))


PARTITIONS: dict[str, type[Partition]] = {cls.name: cls for cls in (ByTensor, KeyRanges)}
DEFAULT_SPLIT = "ranges"


def build(layout: Layout, shards: int = 1, split: str = DEFAULT_SPLIT) -> Partition:
    cls = PARTITIONS.get(split)
    if cls is None:
        raise PartitionError(f"split: {split!r} is not one of {', '.join(PARTITIONS)}")
    return cls(layout, shards)


def from_json(data: dict | None, layout: Layout) -> Partition:
    """A partition as :meth:`Partition.to_json` wrote it; None: the whole model on one server."""
    if data is None:
        return build(layout, 1)
    return build(layout, int(data["shards"]), data["split"])


__all__ = ["ByTensor", "DEFAULT_SPLIT", "KeyRanges", "PARTITIONS", "Partition", "PartitionError", "Piece", "build",
           "from_json"]
