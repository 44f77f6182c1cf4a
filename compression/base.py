"""The compressor contract and the registry that builds compressors by name from config.

A compressor lives on a worker. ``compress`` takes the gradient, one flat float32 array per
tensor of the layout, and returns one :class:`~compression.parts.Part` per tensor; only the
parts travel (encoded by :mod:`compression.codec`), anything else a compressor keeps (random
state, warm starts) stays on the worker. The server never needs the compressor: it reads
parts. Parameters are a pydantic model per compressor, so ``method: {name: topk, c: 0.01}``
is validated field by field with the same error paths as the rest of the scenario.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from .layout import Layout
from .parts import Part


class Params(BaseModel):
    """Base for compressor parameters: immutable, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Compressor(ABC):
    name: ClassVar[str]
    Params: ClassVar[type[Params]] = Params
    # True when the compressor keeps what it did not send and adds it back itself (DGC's
    # accumulation, Chen et al.'s residual): wrapping it in ErrorFeedback is refused.
    has_own_memory: ClassVar[bool] = False

    def __init__(self, params: Params, layout: Layout, seed: int = 0):
        self.params = params
        self.layout = layout
        self.rng = np.random.default_rng(seed)

    @abstractmethod
    def compress(self, grads: list[np.ndarray]) -> list[Part]:
        """One part per tensor; ``grads[i]`` is flat float32 of ``layout.sizes[i]`` values."""


COMPRESSORS: dict[str, type[Compressor]] = {}


def register(cls: type[Compressor]) -> type[Compressor]:
    if cls.name in COMPRESSORS:
        raise ValueError(f"compressor {cls.name!r} registered twice")
    COMPRESSORS[cls.name] = cls
    return cls


def build(name: str, params: dict, layout: Layout, seed: int = 0) -> Compressor:
    """``COMPRESSORS[name](Params(**params), layout, seed)``, with a clear error for unknown names."""
    try:
        cls = COMPRESSORS[name]
    except KeyError:
        raise ValueError(f"unknown compressor {name!r}; known: {', '.join(sorted(COMPRESSORS))}") from None
    return cls(cls.Params(**params), layout, seed)
