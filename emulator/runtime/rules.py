"""How the parameter server applies one decoded update, by rule name.

``plain``      theta -= alpha * g                                   (ASGD, Comp-c)
``staleness``  theta -= alpha / max(1, d) * g                       (Zhang et al., IJCAI 2016)
``adacomp``    theta_i -= alpha / max(1, sigma_i) * g_i             (Hardy et al., NCA 2017)

``d = t - t0`` is the number of updates applied since the worker took the model; ``sigma_i``
is how many of those ``d`` updates touched coordinate ``i``. AdaComp keeps a touch counter
per coordinate and, at each pull, a copy of it for that worker, so
``sigma_i = touches_now[i] - touches_at_pull[i]``: O(k) per update whatever ``d`` or the
length of the run. At a pull the copy is refreshed whole (one memory copy of 4 bytes per
parameter), or, when the caller knows which coordinates changed since the worker's previous
pull (a delta pull does), only there: the counters moved nowhere else. Counters are uint32;
their difference is exact modulo 2**32.

Every rule computes all of an update's new values first and writes them only if every one is
finite: finite gradients can still overflow float32 (a huge step, or many of them), and an
update that would make a parameter infinite is refused whole (:class:`RuleError`, reason
``overflow``), the model untouched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from compression import compiled
from compression.layout import Layout
from compression.parts import Part

from emulator import plugins

_NO_COUNTERS = np.zeros(0, np.uint32)  # the compiled loop's counter arguments for rules without them


class RuleError(ValueError):
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Applied:
    entries: int  # coordinates updated
    mean_scale: float  # mean of the per-coordinate learning-rate divisor's inverse (1 = full step)
    mean_sigma: float | None = None  # AdaComp: mean over the pushed coordinates of the updates that touched them since the pull
    targets: list = field(default_factory=list, repr=False)  # where the update wrote: slices or flat index arrays


class UpdateRule(ABC):
    name: ClassVar[str]
    # True when a coordinate's new value depends only on that coordinate's state, the update's
    # value there and the staleness: the model can then be split over several servers exactly
    # (emulator/runtime/partition.py). A user's rule says so itself; False refuses server.shards > 1.
    per_coordinate: ClassVar[bool] = False
    # Whether a pushed model delta (``theta_pulled - theta_after_local_steps``, :mod:`.aggregation`)
    # may be applied as this rule's update, its learning rate then the server's step size.
    takes_model_delta: ClassVar[bool] = False

    def __init__(self, layout: Layout, learning_rate: float):
        self.layout = layout
        self.learning_rate = float(learning_rate)

    def on_pull(self, worker: int, version: int | None = None, since: tuple[int, np.ndarray] | None = None) -> None:
        """A worker has just taken the model at ``version`` (called under the server's lock);
        ``since``, where the caller knows it: ``(v, flat indices of every coordinate changed after v)``."""

    def forget(self, worker: int) -> None:
        """A worker is gone; drop what was kept for it."""

    def apply(self, params: np.ndarray, parts: list[Part], worker: int, staleness: int) -> Applied:
        """Update ``params`` in place (called under the server's lock); all or nothing."""
        return self._apply(params, self._coordinates(parts), worker, staleness)

    def coordinates(self, parts: list[Part]) -> list[tuple[slice | np.ndarray, np.ndarray]]:
        """The update's ``(target, values)`` pairs, as :meth:`steps` takes them."""
        return self._coordinates(parts)

    def apply_coordinates(self, params: np.ndarray, coordinates, worker: int, staleness: int) -> Applied:
        """:meth:`apply` of ``(target, values)`` pairs (an aggregator's step); all or nothing."""
        return self._apply(params, coordinates, worker, staleness)

    def apply_flat(self, params: np.ndarray, indices: np.ndarray, values: np.ndarray, worker: int,
                   staleness: int) -> Applied:
        """:meth:`apply` of an update given as ascending flat ``indices`` and their values
        (:func:`compression.decode_flat`): one compiled loop where it runs, the same numbers."""
        fast = compiled.kernels()
        if fast is None or type(self)._flat_arguments is UpdateRule._flat_arguments:  # a rule without a compiled form (a user's)
            return self._apply(params, [(indices, values)], worker, staleness)
        rate, touches, at_pull = self._flat_arguments(worker, staleness)
        adaptive = touches is not None
        if not adaptive:
            touches = at_pull = _NO_COUNTERS
        ok, inverse_sum, sigma_sum = fast.apply_flat(params, indices, values, np.float32(rate), adaptive, touches, at_pull)
        if not ok:
            raise RuleError("overflow", "the update would make parameters non-finite")
        entries = int(indices.size)
        if not adaptive:
            return Applied(entries, rate / self.learning_rate, targets=[indices])
        return Applied(entries, float(inverse_sum) / max(1, entries), sigma_sum / max(1, entries), targets=[indices])

    def _apply(self, params: np.ndarray, coordinates, worker: int, staleness: int) -> Applied:
        with np.errstate(over="ignore", invalid="ignore"):
            steps, applied = self.steps(coordinates, worker, staleness)
            targets = [target for target, _ in steps]
            new = [(target, np.subtract(params[target], step, out=step)) for target, step in steps]
        for _, values in new:
            if not np.isfinite(values).all():
                raise RuleError("overflow", "the update would make parameters non-finite")
        for target, values in new:
            params[target] = values
        self.committed(targets)
        applied.targets = targets
        return applied

    def _flat_arguments(self, worker: int, staleness: int) -> tuple[float, np.ndarray | None, np.ndarray | None]:
        """For the compiled loop: the step's scale, and AdaComp's touch counters now and at the
        worker's pull (None, None for rules without them)."""
        raise NotImplementedError

    @abstractmethod
    def steps(self, coordinates: list[tuple[slice | np.ndarray, np.ndarray]], worker: int,
              staleness: int) -> tuple[list[tuple[slice | np.ndarray, np.ndarray]], Applied]:
        """``(target, step)`` pairs to subtract from the parameters at ``coordinates`` (``(target,
        values)`` pairs), and what to report; changes no state.

        Each step is a fresh array the rule owns: :meth:`apply` overwrites it with the new
        values (one allocation of the model's size less per update)."""

    def committed(self, targets) -> None:
        """The steps were written at ``targets`` (state that follows the applied updates changes here)."""

    def state(self) -> dict[str, np.ndarray]:
        """Arrays to checkpoint beside the parameters."""
        return {}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        pass

    def _coordinates(self, parts: list[Part]) -> list[tuple[slice | np.ndarray, np.ndarray]]:
        """``(target, values)``: a slice per part that covers its tensor, and one flat index array
        for all the others together (ascending: one numpy call per step, not one per tensor)."""
        out, indices, values = [], [], []
        for part, offset, size in zip(parts, self.layout.offsets, self.layout.sizes):
            idx, vals = part.coordinates(size)
            if idx is None:
                out.append((slice(offset, offset + size), vals))
            elif idx.size:
                indices.append(idx + offset)
                values.append(vals)
        if indices:
            out.append((np.concatenate(indices), np.concatenate(values)))
        return out


class Plain(UpdateRule):
    name = "plain"
    per_coordinate = True
    takes_model_delta = True

    def scale(self, staleness: int) -> float:
        return self.learning_rate

    def steps(self, coordinates, worker, staleness):
        rate = self.scale(staleness)
        steps = [(target, rate * values) for target, values in coordinates]
        return steps, Applied(sum(step.size for _, step in steps), rate / self.learning_rate)

    def _flat_arguments(self, worker, staleness):
        return self.scale(staleness), None, None


class Staleness(Plain):
    name = "staleness"

    def scale(self, staleness):
        return self.learning_rate / max(1, staleness)


class AdaComp(UpdateRule):
    name = "adacomp"
    per_coordinate = True

    def __init__(self, layout, learning_rate):
        super().__init__(layout, learning_rate)
        self.touches = np.zeros(layout.total, np.uint32)
        self.at_pull: dict[int, np.ndarray] = {}  # per worker, the counters at its latest pull
        self.pulled_at: dict[int, int | None] = {}  # ... and that pull's version (None: unknown)

    def on_pull(self, worker, version=None, since=None):
        snapshot = self.at_pull.get(worker)
        held = self.pulled_at.get(worker)
        if snapshot is None:
            self.at_pull[worker] = self.touches.copy()
        elif since is not None and held is not None and since[0] <= held:
            # the counters moved only where the model changed since this copy was taken
            fast = compiled.kernels()
            if fast is None:
                snapshot[since[1]] = self.touches[since[1]]
            else:
                fast.copy_at(snapshot, self.touches, since[1])
        else:
            np.copyto(snapshot, self.touches)
        self.pulled_at[worker] = version

    def forget(self, worker):
        self.at_pull.pop(worker, None)
        self.pulled_at.pop(worker, None)

    def _at_pull(self, worker):
        snapshot = self.at_pull.get(worker)
        if snapshot is None:
            raise RuleError("no_pull", f"worker {worker} pushed without having pulled the model")
        return snapshot

    def steps(self, coordinates, worker, staleness):
        snapshot = self._at_pull(worker)
        steps, entries, inverse_sum, sigma_sum = [], 0, 0.0, 0
        for target, values in coordinates:
            sigma = self.touches[target] - snapshot[target]
            divisor = np.maximum(sigma, 1).astype(np.float32)
            steps.append((target, self.learning_rate * values / divisor))
            entries += values.size
            inverse_sum += float(np.sum(1.0 / divisor))
            sigma_sum += int(np.sum(sigma, dtype=np.int64))
        return steps, Applied(entries, inverse_sum / max(1, entries), sigma_sum / max(1, entries))

    def _flat_arguments(self, worker, staleness):
        return self.learning_rate, self.touches, self._at_pull(worker)

    def committed(self, targets):
        for target in targets:
            self.touches[target] += np.uint32(1)

    def state(self):
        return {"touches": self.touches}

    def load_state(self, state):
        if "touches" in state:
            self.touches = np.asarray(state["touches"], np.uint32).copy()
        self.at_pull.clear()
        self.pulled_at.clear()


RULES: dict[str, type[UpdateRule]] = {cls.name: cls for cls in (Plain, Staleness, AdaComp)}


def lookup(name: str) -> type[UpdateRule]:
    """The rule called ``name`` in :data:`RULES`, or the user's class a reference names (``my_rule.py:MyRule``)."""
    return plugins.lookup(name, RULES, UpdateRule, "update rule", "emulator.runtime.rules.UpdateRule")


def build(name: str, layout: Layout, learning_rate: float) -> UpdateRule:
    return lookup(name)(layout, learning_rate)
