"""The shape of a model's parameters as the wire sees it: an ordered list of named tensors.

Workers, the parameter server and the codec agree on one ``Layout``; every tensor also has
an offset into the single flat float32 vector that the server keeps and ships.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
import math

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Layout:
    tensors: tuple[TensorSpec, ...]

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        return tuple(t.size for t in self.tensors)

    @cached_property
    def offsets(self) -> tuple[int, ...]:
        out, pos = [], 0
        for size in self.sizes:
            out.append(pos)
            pos += size
        return tuple(out)

    @cached_property
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, sizes)`` as int64 arrays, for compiled loops."""
        return np.array(self.offsets, np.int64), np.array(self.sizes, np.int64)

    @cached_property
    def total(self) -> int:
        return sum(self.sizes)

    def __len__(self) -> int:
        return len(self.tensors)

    def to_json(self) -> list[dict]:
        return [{"name": t.name, "shape": list(t.shape)} for t in self.tensors]

    @classmethod
    def from_json(cls, data: list[dict]) -> "Layout":
        return cls(tuple(TensorSpec(d["name"], tuple(int(x) for x in d["shape"])) for d in data))
