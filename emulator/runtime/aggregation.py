"""What the parameter server does with arriving updates, by aggregation name: the seam of federated methods.

An :class:`Aggregator` sits between the decoded push and the update rule (:mod:`.rules`). The
server tells it and asks it, always under its lock:

``join(worker)``            a client connected (``forget(worker)``: gone; ``available``: paused or back)
``admit(worker, now)``      may this worker take the model and train now? (a round's sample)
``receive(params, ...)``    an update arrived: apply something now (an :class:`~.rules.Applied`,
                            the server's version moves on) or hold it (``None``)
``due(params, now)``        the clock moved: close a round whose deadline passed

and takes each aggregation it closed (``closed()``) as a :class:`Round` (who took part, who was
dropped) for the ``rounds`` trace.

``per_push``  every update through the rule at once: ASGD, AdaComp and every compressor's path
``fedbuff``   the staleness-weighted mean of ``buffer`` deltas, then one rule step (Nguyen et al., AISTATS 2022)
``fedasync``  each arriving model mixed in: theta <- (1 - a s(tau)) theta + a s(tau) theta_client (Xie et al., 2019)
``fedavg``    synchronous rounds: ``sample`` clients drawn (seeded) among those connected, a
              ``deadline`` after which late ones are dropped, the example-weighted mean of the
              deltas that came (McMahan et al., AISTATS 2017)

A federated update is a model delta, ``theta_pulled - theta_after_local_steps`` (the sign of a
gradient), so the rule subtracts it: the rule's learning rate is the server's step size. Steps
are float32 throughout and sums run in a fixed order (arrival for ``fedbuff``, worker id for
``fedavg``), so a fixed schedule gives the same model bit for bit (tests/runtime/test_federated.py
checks each against a sequential numpy reference).

A user's aggregator is a subclass in their own file (``method: {aggregation: {name: agg.py:Mine}}``),
found by :func:`lookup` as rules and compressors are. Standard library and numpy only: the server imports it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from compression.layout import Layout

from emulator import plugins
from emulator.runtime.rules import Applied, RuleError, UpdateRule

LATE = "late_for_round"  # the rejection reason of a FedAvg update that missed its round
Coordinates = list  # [(slice | flat index array, float32 values)], as UpdateRule.steps takes them


@dataclass
class Round:
    """One aggregation the server closed: what the ``rounds`` trace records."""

    index: int
    started: float  # the server's monotonic clock
    closed: float
    sampled: list[int] = field(default_factory=list)  # clients asked to train (fedavg), or those that arrived
    participants: list[int] = field(default_factory=list)  # whose update is in the step
    dropped: list[int] = field(default_factory=list)  # sampled but late or gone: stragglers
    examples: int = 0  # training examples behind the step (by the clients' shards)
    applied: bool = False  # whether the model changed

    def as_record(self) -> dict:
        return {"round": self.index, "duration_s": round(self.closed - self.started, 6), "sampled": len(self.sampled),
                "participants": len(self.participants), "dropped": len(self.dropped), "examples": self.examples,
                "applied": self.applied, "dropped_workers": self.dropped}


class AggregatorError(ValueError):
    """Parameters an aggregator refuses; ``field`` is the key, for ``method.aggregation.<field>``."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


# -- staleness functions (FedAsync's names; FedBuff's default is its authors' 1/sqrt(1 + tau)) ------------


def staleness_weight(kind: str, tau: int, a: float = 0.5, b: int = 4) -> float:
    """``s(tau)``: ``constant`` 1; ``polynomial`` (1 + tau)^-a; ``hinge`` 1 up to b, then 1 / (a (tau - b) + 1);
    ``sqrt`` 1 / sqrt(1 + tau) (FedBuff's)."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1.0 + tau) ** -a)
    if kind == "hinge":
        return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)
    if kind == "sqrt":
        return 1.0 / math.sqrt(1.0 + tau)
    raise AggregatorError("staleness", f"unknown staleness function {kind!r}; known: {', '.join(STALENESS)}")


STALENESS = ("constant", "polynomial", "hinge", "sqrt")


class Aggregator(ABC):
    """What the server does with arriving updates; made with the model's layout, the rule, the
    run's seed and the scenario's ``method.aggregation`` keys (other than ``name``)."""

    name: ClassVar[str]
    takes_model_delta: ClassVar[bool] = False  # True: clients must push model deltas (local steps)
    PARAMS: ClassVar[dict[str, type]] = {}  # the keys it takes and their types, for the plan's checks

    def __init__(self, layout: Layout, rule: UpdateRule, seed: int = 0, **params):
        unknown = sorted(set(params) - set(self.PARAMS))  # a subclass passes on only the keys it does not take
        if unknown:
            raise AggregatorError(unknown[0], f"unknown parameter for {self.name} (parameters: {', '.join(self.PARAMS) or 'none'})")
        self.layout = layout
        self.rule = rule
        self.seed = seed
        self.rounds = 0  # aggregations closed so far

    @classmethod
    def problems(cls, params: dict, clients: int) -> list[AggregatorError]:
        """What is wrong with ``params`` for a run of ``clients`` workers, before any device starts."""
        return []

    @classmethod
    def defaults(cls, params: dict, clients: int) -> dict:
        """``params`` with the defaults that depend on the number of clients filled in (the plan records them)."""
        return dict(params)

    def join(self, worker: int) -> None:
        """``worker`` connected (its HELLO): it is available from now until :meth:`forget`."""

    def available(self, worker: int, available: bool) -> None:
        """``worker`` went offline (paused: an availability trace's spell) or came back, still connected."""

    def admit(self, worker: int, now: float) -> bool:
        """May ``worker`` take the model and train on it now? (False: its pull waits.)"""
        return True

    def on_pull(self, worker: int, version: int, params: np.ndarray) -> None:
        """``worker`` took the model at ``version``."""

    def forget(self, worker: int) -> None:
        """``worker`` is gone."""

    @abstractmethod
    def receive(self, params: np.ndarray, coordinates: Coordinates, worker: int, staleness: int,
                examples: int, now: float) -> Applied | None:
        """An update from ``worker``: change ``params`` now (through the rule, all or nothing) or hold it."""

    def due(self, params: np.ndarray, now: float) -> Applied | None:
        """Called every few milliseconds: an aggregation closed by the clock, or None."""
        return None

    def closed(self) -> list[Round]:
        """The aggregations closed since the last call (the server records them)."""
        return []

    def receive_flat(self, params: np.ndarray, indices: np.ndarray, values: np.ndarray, worker: int, staleness: int,
                     examples: int, now: float) -> Applied | None:
        """:meth:`receive` of an update given as ascending flat indices and their values (the codec's compiled shortcut)."""
        return self.receive(params, [(indices, values)], worker, staleness, examples, now)


class PerPush(Aggregator):
    """Every update applied by the rule when it arrives: the parameter server's asynchronous SGD."""

    name = "per_push"

    def receive(self, params, coordinates, worker, staleness, examples, now):
        return self.rule.apply_coordinates(params, coordinates, worker, staleness)

    def receive_flat(self, params, indices, values, worker, staleness, examples, now):
        return self.rule.apply_flat(params, indices, values, worker, staleness)  # the rule's compiled loop where it has one


def changed(step: np.ndarray) -> Coordinates:
    """A whole-model step as coordinates where it is not zero: the model is the same (``x - 0`` is
    ``x``), and the server's change log, hence a delta pull, sees only the coordinates that moved."""
    where = np.flatnonzero(step)
    if where.size == step.size:
        return [(slice(0, step.size), step)]
    return [(where, step[where])] if where.size else []


def _accumulate(total: np.ndarray, coordinates: Coordinates, weight: np.float32) -> None:
    for target, values in coordinates:
        total[target] += weight * values


class _Buffered(Aggregator):
    """Shared by the buffered methods: a float32 sum of weighted deltas and the round it belongs to."""

    def __init__(self, layout, rule, seed=0, **params):
        super().__init__(layout, rule, seed, **params)
        self.total = np.zeros(layout.total, np.float32)
        self._round: Round | None = None
        self._closed: list[Round] = []
        self._last_close: float | None = None

    def _open(self, now: float) -> Round:
        """The round under way; a new one starts where the previous closed (a buffer fills from then)."""
        if self._round is None:
            start = now if self._last_close is None else self._last_close
            self._round = Round(self.rounds + 1, start, now)
        return self._round

    def _close(self, params, step: np.ndarray, worker: int, now: float, examples: int) -> Applied | None:
        round_, self._round = self._round, None
        self.rounds += 1
        round_.closed = self._last_close = now
        round_.examples = examples
        applied = None
        try:
            if round_.participants:
                applied = self.rule.apply_coordinates(params, changed(step), worker, 0)
                round_.applied = True
        finally:
            self.total[:] = 0
            self._closed.append(round_)
        return applied

    def closed(self):
        out, self._closed = self._closed, []
        return out


class FedBuff(_Buffered):
    """Buffered asynchronous aggregation: each delta weighted by ``s(staleness)`` joins a sum; at
    ``buffer`` deltas the rule applies their mean (the server's step size is the rule's rate)."""

    name = "fedbuff"
    takes_model_delta = True
    PARAMS = {"buffer": int, "staleness": str, "a": float, "b": int}

    def __init__(self, layout, rule, seed=0, buffer: int = 10, staleness: str = "sqrt", a: float = 0.5, b: int = 4, **unknown):
        super().__init__(layout, rule, seed, **unknown)
        self.buffer, self.kind, self.a, self.b = int(buffer), staleness, float(a), int(b)
        self.examples = 0

    @classmethod
    def defaults(cls, params, clients):
        return {"buffer": min(10, clients), **params}  # K = 10 as its authors', or every client when fewer

    @classmethod
    def problems(cls, params, clients):
        buffer = params.get("buffer", min(10, clients))
        return _clients_problems("buffer", buffer, clients, f"{buffer} is larger than the number of clients ({clients})") \
            + _staleness_problems(params)

    def receive(self, params, coordinates, worker, staleness, examples, now):
        round_ = self._open(now)
        weight = np.float32(staleness_weight(self.kind, staleness, self.a, self.b))
        _accumulate(self.total, coordinates, weight)
        round_.sampled.append(worker)
        round_.participants.append(worker)
        self.examples += examples
        if len(round_.participants) < self.buffer:
            return None
        mean = self.total / np.float32(self.buffer)
        examples, self.examples = self.examples, 0
        return self._close(params, mean, worker, now, examples)


class FedAsync(Aggregator):
    """Each arriving model mixed in at once: ``theta <- theta - rate * alpha s(tau) (theta - theta_client)``
    with ``theta_client = theta_pulled - delta`` (the server keeps the model each client pulled);
    at rate 1 this is FedAsync's ``(1 - alpha_t) theta + alpha_t theta_client``."""

    name = "fedasync"
    takes_model_delta = True
    PARAMS = {"alpha": float, "staleness": str, "a": float, "b": int}

    def __init__(self, layout, rule, seed=0, alpha: float = 0.6, staleness: str = "polynomial", a: float = 0.5, b: int = 4,
                 **unknown):
        super().__init__(layout, rule, seed, **unknown)
        self.alpha, self.kind, self.a, self.b = float(alpha), staleness, float(a), int(b)
        self.pulled: dict[int, np.ndarray] = {}
        self._closed: list[Round] = []

    @classmethod
    def problems(cls, params, clients):
        out = []
        alpha = params.get("alpha", 0.6)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 < alpha <= 1:
            out.append(AggregatorError("alpha", f"{alpha!r} is not in (0, 1]"))
        return out + _staleness_problems(params, default="polynomial")

    def on_pull(self, worker, version, params):
        held = self.pulled.get(worker)
        if held is None:
            self.pulled[worker] = params.copy()
        else:
            np.copyto(held, params)

    def forget(self, worker):
        self.pulled.pop(worker, None)

    def receive(self, params, coordinates, worker, staleness, examples, now):
        pulled = self.pulled.get(worker)
        if pulled is None:
            raise RuleError("no_pull", f"worker {worker} pushed without having pulled the model")
        client = pulled.copy()
        for target, values in coordinates:
            client[target] -= values
        mix = np.float32(self.alpha * staleness_weight(self.kind, staleness, self.a, self.b))
        step = mix * (params - client)
        applied = self.rule.apply_coordinates(params, changed(step), worker, 0)
        self.rounds += 1
        self._closed.append(Round(self.rounds, now, now, [worker], [worker], [], examples, True))
        return applied

    def closed(self):
        out, self._closed = self._closed, []
        return out


class FedAvg(_Buffered):
    """Synchronous rounds. A round samples ``sample`` clients (seeded by the run's seed and the round)
    among those connected; only they may take the model. It closes when all of them reported or at
    ``deadline_s`` after it opened: the late ones are dropped (counted), and the example-weighted
    mean of the deltas that came is one rule step. An update from an earlier round is dropped."""

    name = "fedavg"
    takes_model_delta = True
    PARAMS = {"sample": int, "deadline_s": float}

    def __init__(self, layout, rule, seed=0, sample: int = 10, deadline_s: float | None = None, **unknown):
        super().__init__(layout, rule, seed, **unknown)
        self.sample = int(sample)
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        self.connected: set[int] = set()
        self.chosen: set[int] = set()  # this round's sample
        self.took: dict[int, int] = {}  # worker -> the round whose model it took
        self.deltas: dict[int, tuple[Coordinates, int]] = {}  # this round's reports, by worker
        self.lost: set[int] = set()  # this round's sampled clients that left before reporting
        self.late = 0  # updates dropped for arriving after their round closed

    @classmethod
    def defaults(cls, params, clients):
        return {"sample": min(10, clients), **params}  # 10 clients a round, or every client when fewer

    @classmethod
    def problems(cls, params, clients):
        sample = params.get("sample", min(10, clients))
        out = _clients_problems("sample", sample, clients, f"{sample} clients per round is above the population ({clients} workers)")
        deadline = params.get("deadline_s")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not deadline > 0):
            out.append(AggregatorError("deadline", f"{deadline!r}: a round's deadline must be > 0"))
        return out

    def _start(self, now: float) -> None:
        """Open the next round: draw its sample among the connected clients."""
        pool = sorted(self.connected)
        if not pool:
            return
        rng = np.random.default_rng([self.seed, self.rounds + 1])
        chosen = rng.choice(pool, size=min(self.sample, len(pool)), replace=False)
        self.chosen = {int(w) for w in chosen}
        round_ = self._open(now)
        round_.sampled = sorted(self.chosen)

    def join(self, worker):
        self.connected.add(worker)

    def available(self, worker, available):
        if available:
            self.join(worker)
        else:
            self.forget(worker)

    def admit(self, worker, now):
        if self._round is None:
            self._start(now)
        if worker in self.chosen and self.took.get(worker) != self._round.index:
            return True
        return False

    def on_pull(self, worker, version, params):
        if self._round is not None and worker in self.chosen:
            self.took[worker] = self._round.index

    def forget(self, worker):
        self.connected.discard(worker)
        if worker in self.chosen and worker not in self.deltas:
            self.lost.add(worker)  # gone mid-round (crashed, unavailable): it will not report to this round

    def receive(self, params, coordinates, worker, staleness, examples, now):
        round_ = self._round
        if round_ is None or worker not in self.chosen or self.took.get(worker) != round_.index or worker in self.deltas:
            self.late += 1  # its round closed without it (it was counted as dropped there)
            raise RuleError(LATE, f"worker {worker}'s update came after its round closed")
        self.deltas[worker] = ([(target, values.copy()) for target, values in coordinates], examples)
        round_.participants.append(worker)
        if len(self.deltas) < len(self.chosen):
            return None
        return self._finish(params, worker, now)

    def due(self, params, now):
        round_ = self._round
        if round_ is None:
            if self.connected:
                self._start(now)
            return None
        if self.deadline_s is not None and now - round_.started >= self.deadline_s:
            return self._finish(params, _named_worker(round_), now)
        if self.chosen and self.chosen <= set(self.deltas) | self.lost:  # the rest of the sample is gone
            return self._finish(params, _named_worker(round_), now)
        return None

    def _finish(self, params, worker, now) -> Applied | None:
        round_ = self._round
        round_.dropped = sorted(self.chosen - set(self.deltas))
        round_.participants = sorted(self.deltas)
        examples = sum(n for _, n in self.deltas.values())
        if self.deltas:
            for w in sorted(self.deltas):  # a fixed order: the same sum whatever the arrival order
                coordinates, n = self.deltas[w]
                _accumulate(self.total, coordinates, np.float32(n / examples) if examples else np.float32(1 / len(self.deltas)))
        step = self.total.copy()
        self.deltas.clear()
        self.lost.clear()
        self.chosen = set()
        applied = self._close(params, step, worker, now, examples)
        self._start(now)
        return applied


def _named_worker(round_: Round) -> int:
    """The worker to name in the rule's call for a step closed by the clock (the rules that take deltas ignore it)."""
    return round_.sampled[0] if round_.sampled else 0


AGGREGATORS: dict[str, type[Aggregator]] = {cls.name: cls for cls in (PerPush, FedBuff, FedAsync, FedAvg)}


def _clients_problems(key: str, count, clients: int, above: str) -> list[AggregatorError]:
    """A count of clients (FedBuff's buffer, FedAvg's sample) must be a whole number from 1 to the population."""
    if not isinstance(count, int) or count < 1:
        return [AggregatorError(key, f"{count!r} is not a whole number >= 1")]
    return [AggregatorError(key, above)] if count > clients else []


def _staleness_problems(params: dict, default: str = "sqrt") -> list[AggregatorError]:
    kind = params.get("staleness", default)
    if kind not in STALENESS:
        return [AggregatorError("staleness", f"unknown staleness function {kind!r}; known: {', '.join(STALENESS)}")]
    return []


def lookup(name: str) -> type[Aggregator]:
    """The aggregator called ``name`` in :data:`AGGREGATORS`, or the user's class a reference names (``agg.py:Mine``)."""
    return plugins.lookup(name, AGGREGATORS, Aggregator, "aggregator", "emulator.runtime.aggregation.Aggregator")


def build(name: str, layout: Layout, rule: UpdateRule, seed: int, params: dict) -> Aggregator:
    return lookup(name)(layout, rule, seed, **params)


__all__ = ["Aggregator", "AggregatorError", "Round", "PerPush", "FedBuff", "FedAsync", "FedAvg", "AGGREGATORS",
           "STALENESS", "staleness_weight", "changed", "lookup", "build"]
