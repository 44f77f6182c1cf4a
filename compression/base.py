"""The compressor contract and the registry that builds compressors by name from config.

A compressor lives on a worker. ``compress`` takes the gradient, one flat float32 array per
tensor of the layout, and returns one :class:`~compression.parts.Part` per tensor; only the
parts travel (encoded by :mod:`compression.codec`), anything else a compressor keeps (random
state, warm starts) stays on the worker. The server never needs the compressor: it reads
parts. Parameters are a pydantic model per compressor, so ``method: {name: topk, c: 0.01}``
is validated field by field with the same error paths as the rest of the scenario.

A gradient with any NaN or Inf is never compressed: :meth:`Compressor.compress` raises
:class:`NonFiniteGradient` before a subclass sees it (and before any state it keeps, a residual
or a momentum, changes). Selections silently trim such input (the top-k of an all-NaN tensor is
empty), so the worker reports the gradient to the server instead, which counts it toward
divergence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from compression.layout import Layout
from compression.parts import Part

from emulator import plugins


class NonFiniteGradient(ValueError):
    """The gradient holds NaN or Inf; ``tensors`` maps each such tensor's name to how many it holds."""

    def __init__(self, tensors: dict[str, int]):
        self.tensors = tensors
        super().__init__("non-finite gradient: " + ", ".join(f"{name} {n}" for name, n in tensors.items()))


def require_finite(grads: list[np.ndarray], layout: Layout) -> None:
    """Raise :class:`NonFiniteGradient` if any value of ``grads`` is NaN or Inf."""
    if all(np.isfinite(g).all() for g in grads):
        return
    counts = {spec.name: int(g.size - np.count_nonzero(np.isfinite(g))) for spec, g in zip(layout.tensors, grads)}
    raise NonFiniteGradient({name: n for name, n in counts.items() if n})


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

    def compress(self, grads: list[np.ndarray]) -> list[Part]:
        """One part per tensor; ``grads[i]`` is flat float32 of ``layout.sizes[i]`` values.

        Raises :class:`NonFiniteGradient` (nothing compressed, no state changed) if any is NaN or Inf."""
        require_finite(grads, self.layout)
        return self._compress(grads)

    @abstractmethod
    def _compress(self, grads: list[np.ndarray]) -> list[Part]:
        """:meth:`compress` for a gradient known to be finite."""


COMPRESSORS: dict[str, type[Compressor]] = {}


def register(cls: type[Compressor]) -> type[Compressor]:
    if cls.name in COMPRESSORS:
        raise ValueError(f"compressor {cls.name!r} registered twice")
    COMPRESSORS[cls.name] = cls
    return cls


def lookup(name: str) -> type[Compressor]:
    """The compressor class called ``name`` in :data:`COMPRESSORS`, or the user's class a reference names
    (``path/my_compressor.py:MyCompressor``); ValueError naming what is wrong otherwise."""
    cls = plugins.lookup(name, COMPRESSORS, Compressor, "compressor", "compression.Compressor")
    if not (isinstance(cls.Params, type) and issubclass(cls.Params, Params)):
        raise plugins.PluginError(f"{name}: its Params must subclass compression.Params (a pydantic model), got {cls.Params!r}")
    return cls


def build(name: str, params: dict, layout: Layout, seed: int = 0) -> Compressor:
    """``lookup(name)(Params(**params), layout, seed)``: a built-in or a user's compressor from config."""
    cls = lookup(name)
    return cls(cls.Params(**params), layout, seed)
