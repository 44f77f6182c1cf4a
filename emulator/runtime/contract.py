"""The contracts of the plug-ins devices run, as checks a program can run: on the built-ins (tests)
and on a user's class (``emulate check my_compressor.py:MyCompressor``), so a user knows their
plug-in is sound before an hour of runs. Each check raises :class:`ContractFailure` saying what broke.

A compressor (:func:`check_compressor`, with its parameters):

- ``builds``: made from its parameters on a layout; the parameters are frozen and refuse unknown keys;
- ``parts``: one part per tensor, of the tensor's size, float32, finite for a finite gradient;
- ``wire``: what the server decodes is what the sender predicts (``part.rounded``), exactly;
- ``bytes``: each frame's length is its body, the frames fill the message, decode-encode is identity;
- ``seeded``: the same seed and gradients give the same bytes;
- ``non_finite``: a gradient with NaN or Inf raises NonFiniteGradient and changes no state;
- ``error_feedback``: wrapped in ErrorFeedback, residual + everything sent = everything given
  (a compressor that keeps its own residual must say so: ``has_own_memory``);
- ``rules``: every built-in update rule applies its parts and keeps the model finite.

An update rule (:func:`check_rule`, made with a layout and a learning rate):

- ``builds``: made from a layout and a learning rate;
- ``applies``: dense and sparse updates are applied, entries counted, the model stays finite;
- ``all_or_nothing``: an update that would overflow raises RuleError(``overflow``), the model untouched;
- ``flat``: ``apply_flat`` (the server's path for top-k messages) gives the model ``apply`` gives;
- ``deterministic``: the same pulls and pushes give the same model;
- ``checkpoint``: a rule restored from another's ``state()`` goes on as the other does.

An aggregator (:func:`check_aggregator`, :mod:`.aggregation`, made with a layout, the ``plain``
rule, a seed and its parameters), driven by four clients that pull when admitted and push deltas:

- ``builds``: made from a layout, a rule, a seed and its parameters; an unknown parameter refused;
- ``holds_or_applies``: an update held (``None``) leaves the model as it was; an applied one
  changes it only where its targets say, and the model stays finite;
- ``progress``: over the schedule, the model takes at least one step, and each round it reports
  closed has participants among the clients;
- ``deterministic``: the same schedule gives the same model, bit for bit.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np

from compression.base import Compressor, NonFiniteGradient
from compression.codec import decode, encode
from compression.layout import Layout, TensorSpec
from compression.memory import ErrorFeedback
from compression.parts import DensePart, SparsePart, WireFormat

from emulator.runtime import rules as rules_module

WIRES = (WireFormat(), WireFormat("f16", "raw32"))
STEPS = 3


class ContractFailure(AssertionError):
    """One check of the contract failed; the message says what and where."""


@dataclass(frozen=True)
class Verdict:
    check: str
    ok: bool
    detail: str = ""


def default_layout() -> Layout:
    """A small convolution and dense layer, kernels and biases: every shape kind a model has."""
    return Layout((
        TensorSpec("conv/kernel", (3, 3, 2, 4)), TensorSpec("conv/bias", (4,)),
        TensorSpec("dense/kernel", (24, 10)), TensorSpec("dense/bias", (10,)),
    ))


def gradients(layout: Layout, seed: int, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=n) * scale).astype(np.float32) for n in layout.sizes]


def _make(cls: type[Compressor], params: dict, layout: Layout, seed: int = 0) -> Compressor:
    return cls(cls.Params(**params), layout, seed)


def _builds(cls, params, layout):
    from pydantic import ValidationError

    compressor = _make(cls, params, layout)
    if not isinstance(compressor, Compressor):
        raise ContractFailure(f"{cls.__name__}(...) is not a Compressor")
    try:
        cls.Params(**params, no_such_parameter_of_the_contract=1)
    except ValidationError:
        pass
    else:
        raise ContractFailure("its Params accept an unknown key (subclass compression.Params: extra keys are refused)")
    field = next(iter(cls.Params.model_fields), None)
    if field is not None:
        try:
            setattr(compressor.params, field, getattr(compressor.params, field))
        except (ValidationError, TypeError, AttributeError):
            pass
        else:
            raise ContractFailure(f"its parameters can be changed after it is made ({field}): they must be frozen")


def _parts(cls, params, layout):
    compressor = _make(cls, params, layout)
    for step in range(STEPS):
        parts = compressor.compress(gradients(layout, step))
        if len(parts) != len(layout):
            raise ContractFailure(f"step {step}: {len(parts)} parts for {len(layout)} tensors (one per tensor)")
        for part, spec in zip(parts, layout.tensors):
            dense = part.dense(spec.size)
            if dense.shape != (spec.size,) or dense.dtype != np.float32:
                raise ContractFailure(f"step {step}, tensor {spec.name}: dense() is {dense.dtype} {dense.shape}, "
                                      f"expected float32 ({spec.size},)")
            if not np.isfinite(dense).all():
                raise ContractFailure(f"step {step}, tensor {spec.name}: non-finite values for a finite gradient")


def _wire(cls, params, layout):
    for wire in WIRES:
        compressor = _make(cls, params, layout)
        for step in range(STEPS):
            parts = compressor.compress(gradients(layout, 10 + step))
            received = decode(encode(parts, layout, wire), layout)
            for sent, got, spec in zip(parts, received, layout.tensors):
                if type(got) is not type(sent) or got.entries != sent.entries:
                    raise ContractFailure(f"{wire}: tensor {spec.name}: sent {type(sent).__name__} of {sent.entries} "
                                          f"entries, received {type(got).__name__} of {got.entries}")
                if not np.array_equal(got.dense(spec.size), sent.rounded(wire.flags).dense(spec.size)):
                    raise ContractFailure(f"{wire}: tensor {spec.name}: the server decodes other values than "
                                          "part.rounded() predicts (error feedback would keep a wrong residual)")


def _bytes(cls, params, layout):
    for wire in WIRES:
        compressor = _make(cls, params, layout, seed=1)
        message = encode(compressor.compress(gradients(layout, 20)), layout, wire)
        pos = 3
        for size, spec in zip(layout.sizes, layout.tensors):
            _kind, _flags, length = struct.unpack_from("<BBI", message, pos)
            pos += 6 + length
            if pos > len(message):
                raise ContractFailure(f"{wire}: tensor {spec.name}'s frame runs past the message")
        if pos != len(message):
            raise ContractFailure(f"{wire}: {len(message) - pos} bytes of the message belong to no frame")
        if encode(decode(message, layout), layout, wire) != message:
            raise ContractFailure(f"{wire}: decoding then encoding gives other bytes")


def _seeded(cls, params, layout):
    a, b = _make(cls, params, layout, seed=5), _make(cls, params, layout, seed=5)
    for step in range(STEPS):
        grads = gradients(layout, 30 + step)
        if encode(a.compress(grads), layout) != encode(b.compress(grads), layout):
            raise ContractFailure(f"step {step}: two compressors with seed 5 sent different bytes (draw from self.rng)")


def _non_finite(cls, params, layout):
    seen, fresh = _make(cls, params, layout, seed=4), _make(cls, params, layout, seed=4)
    for compressor in (seen, fresh):
        compressor.compress(gradients(layout, 1))
    bad = gradients(layout, 3)
    bad[-2][7] = np.nan
    try:
        seen.compress(bad)
    except NonFiniteGradient:
        pass
    else:
        raise ContractFailure("a gradient with NaN was compressed (override _compress, not compress)")
    after = gradients(layout, 2)
    if encode(seen.compress(after), layout) != encode(fresh.compress(after), layout):
        raise ContractFailure("refusing a NaN gradient changed its state: the next message differs")


def _error_feedback(cls, params, layout):
    if cls.has_own_memory:
        return
    wire = WIRES[0]
    ef = ErrorFeedback(_make(cls, params, layout, seed=2), wire)
    total = [np.zeros(n, np.float64) for n in layout.sizes]
    sent = [np.zeros(n, np.float64) for n in layout.sizes]
    for step in range(6):
        grads = gradients(layout, 100 + step)
        received = decode(encode(ef.compress(grads), layout, wire), layout)
        for i, (g, part, spec) in enumerate(zip(grads, received, layout.tensors)):
            total[i] += g
            sent[i] += part.dense(spec.size)
            if not np.allclose(sent[i] + ef.residual[i], total[i], rtol=0, atol=1e-3):
                raise ContractFailure(f"step {step}, tensor {spec.name}: residual + sent differs from the gradients given")


def _rules(cls, params, layout):
    for name in sorted(rules_module.RULES):
        compressor = _make(cls, params, layout)
        rule = rules_module.build(name, layout, 0.1)
        model = np.zeros(layout.total, np.float32)
        rule.on_pull(0)
        for step in range(2):
            parts = decode(encode(compressor.compress(gradients(layout, 40 + step)), layout), layout)
            rule.apply(model, parts, worker=0, staleness=step)
        if not np.isfinite(model).all():
            raise ContractFailure(f"rule {name}: the model is not finite after two updates")


CHECKS: dict[str, Callable] = {
    "builds": _builds, "parts": _parts, "wire": _wire, "bytes": _bytes, "seeded": _seeded,
    "non_finite": _non_finite, "error_feedback": _error_feedback, "rules": _rules,
}


# -- update rules ------------------------------------------------------------------------------


def _sparse_update(layout: Layout, seed: int, scale: float = 1.0) -> list:
    """A top-k-like update: a few coordinates of each tensor, ascending."""
    rng = np.random.default_rng(seed)
    parts = []
    for size in layout.sizes:
        k = max(1, size // 8)
        indices = np.sort(rng.choice(size, k, replace=False)).astype(np.int64)
        parts.append(SparsePart(indices, (rng.normal(size=k) * scale).astype(np.float32)))
    return parts


def _dense_update(layout: Layout, seed: int) -> list:
    return [DensePart(g) for g in gradients(layout, seed)]


def _schedule(rule, model, layout, start: int = 0, steps: int = 6) -> None:
    """Two workers taking turns: pull, push a sparse or a dense update, with growing staleness."""
    for step in range(start, start + steps):
        worker = step % 2
        rule.on_pull(worker, version=step)
        update = _sparse_update(layout, 50 + step) if step % 3 else _dense_update(layout, 50 + step)
        rule.apply(model, update, worker=worker, staleness=step % 4)


def _rule_builds(cls, layout):
    rule = cls(layout, 0.1)
    if not isinstance(rule, rules_module.UpdateRule):
        raise ContractFailure(f"{cls.__name__}(layout, learning_rate) is not an UpdateRule")


def _rule_applies(cls, layout):
    rule, model = cls(layout, 0.1), np.zeros(layout.total, np.float32)
    for step, update in enumerate((_dense_update(layout, 1), _sparse_update(layout, 2))):
        rule.on_pull(0, version=step)
        applied = rule.apply(model, update, worker=0, staleness=step)
        expected = sum(part.entries for part in update)
        if applied.entries != expected:
            raise ContractFailure(f"update {step}: reports {applied.entries} entries applied, the update has {expected}")
    if not np.isfinite(model).all() or not model.any():
        raise ContractFailure("after a dense and a sparse update the model is unchanged or not finite")


def _rule_all_or_nothing(cls, layout):
    rule = cls(layout, 1.0)
    model = np.full(layout.total, 3e38, np.float32)
    before = model.copy()
    rule.on_pull(0, version=0)
    huge = [DensePart(np.full(size, -3e38, np.float32)) for size in layout.sizes]
    try:
        rule.apply(model, huge, worker=0, staleness=0)
    except rules_module.RuleError as error:
        if error.reason != "overflow":
            raise ContractFailure(f"an overflowing update raised RuleError({error.reason!r}), expected 'overflow'") from None
    else:
        raise ContractFailure("an update that makes the model infinite was applied (it must raise RuleError('overflow'))")
    if not np.array_equal(model, before):
        raise ContractFailure("a refused update changed the model (all or nothing)")


def _rule_flat(cls, layout):
    by_parts, by_flat = cls(layout, 0.1), cls(layout, 0.1)
    a, b = np.ones(layout.total, np.float32), np.ones(layout.total, np.float32)
    for step in range(4):
        update = _sparse_update(layout, 60 + step)
        indices = np.concatenate([p.indices + off for p, off in zip(update, layout.offsets)])
        values = np.concatenate([p.values for p in update])
        for rule in (by_parts, by_flat):
            rule.on_pull(step % 2, version=step)
        by_parts.apply(a, update, worker=step % 2, staleness=step)
        by_flat.apply_flat(b, indices, values, worker=step % 2, staleness=step)
        if not np.array_equal(a, b):
            raise ContractFailure(f"update {step}: apply_flat gives another model than apply")


def _rule_deterministic(cls, layout):
    models = []
    for _ in range(2):
        rule, model = cls(layout, 0.1), np.zeros(layout.total, np.float32)
        _schedule(rule, model, layout)
        models.append(model)
    if not np.array_equal(*models):
        raise ContractFailure("the same pulls and pushes gave two different models")


def _rule_checkpoint(cls, layout):
    first, model = cls(layout, 0.1), np.zeros(layout.total, np.float32)
    _schedule(first, model, layout)
    restored = cls(layout, 0.1)
    restored.load_state({k: np.array(v, copy=True) for k, v in first.state().items()})
    first.load_state(first.state())  # a restart forgets what was kept per worker: both start from the checkpoint alone
    twin = model.copy()
    _schedule(first, model, layout, start=6)
    _schedule(restored, twin, layout, start=6)
    if not np.array_equal(model, twin):
        raise ContractFailure("a rule restored from state() goes on differently: state() misses something it keeps")


RULE_CHECKS: dict[str, Callable] = {
    "builds": _rule_builds, "applies": _rule_applies, "all_or_nothing": _rule_all_or_nothing, "flat": _rule_flat,
    "deterministic": _rule_deterministic, "checkpoint": _rule_checkpoint,
}


# -- aggregators ---------------------------------------------------------------------------------

CLIENTS = 4


def _make_aggregator(cls, params: dict, layout: Layout, seed: int = 0):
    from emulator.runtime import aggregation

    made = cls(layout, rules_module.Plain(layout, 1.0), seed, **params)
    if not isinstance(made, aggregation.Aggregator):
        raise ContractFailure(f"{cls.__name__}(layout, rule, seed, **params) is not an Aggregator")
    return made


def _delta(layout: Layout, seed: int) -> list:
    parts = _sparse_update(layout, seed, 0.01) if seed % 2 else [DensePart(g * np.float32(0.01)) for g in gradients(layout, seed)]
    return rules_module.Plain(layout, 1.0).coordinates(parts)


def _drive(agg, layout: Layout, on_step: Callable | None = None, rounds: int = 12) -> np.ndarray:
    """Four clients, one second a turn: each admitted one takes the model, then each that holds one
    pushes a delta (in a fixed order), then the clock is asked. ``on_step(before, after, applied)``
    sees every model change and every hold."""
    model = np.ones(layout.total, np.float32)
    for worker in range(CLIENTS):
        agg.join(worker)
    holding: dict[int, int] = {}  # worker -> the version it pulled
    version = 0
    for turn in range(rounds):
        now = float(turn)
        for worker in range(CLIENTS):
            if worker not in holding and agg.admit(worker, now):
                agg.on_pull(worker, version, model)
                holding[worker] = version
        for worker in sorted(holding):
            before = model.copy()
            try:
                applied = agg.receive(model, _delta(layout, 100 * turn + worker), worker, version - holding.pop(worker), 10 + worker, now)
            except rules_module.RuleError:
                applied = None  # refused (late for its round): the model must be as it was
            if on_step:
                on_step(before, model, applied)
            version += applied is not None
        before = model.copy()
        applied = agg.due(model, now + 0.5)
        if on_step:
            on_step(before, model, applied)
        version += applied is not None
    return model


def _aggregator_builds(cls, params, layout):
    _make_aggregator(cls, params, layout)
    try:
        _make_aggregator(cls, {**params, "no_such_parameter": 1}, layout)
    except (ValueError, TypeError):
        return
    raise ContractFailure("an unknown parameter (no_such_parameter) was accepted")


def _aggregator_holds_or_applies(cls, params, layout):
    def on_step(before, after, applied):
        if applied is None:
            if not np.array_equal(before, after):
                raise ContractFailure("an update held (None returned) changed the model")
            return
        moved = np.flatnonzero(before != after)
        allowed = np.zeros(layout.total, bool)
        for target in applied.targets:
            allowed[target] = True
        if not allowed[moved].all():
            raise ContractFailure("an applied step changed coordinates outside its targets (delta pulls would miss them)")
        if not np.isfinite(after).all():
            raise ContractFailure("the model is not finite after a step")

    _drive(_make_aggregator(cls, params, layout), layout, on_step)


def _aggregator_progress(cls, params, layout):
    agg = _make_aggregator(cls, params, layout)
    model = _drive(agg, layout)
    if np.array_equal(model, np.ones(layout.total, np.float32)):
        raise ContractFailure(f"{CLIENTS} clients pushed for 12 turns and the model never moved")
    for record in agg.closed():
        if not set(record.participants) <= set(range(CLIENTS)):
            raise ContractFailure(f"round {record.index} reports participants {record.participants} that are not clients")


def _aggregator_deterministic(cls, params, layout):
    a = _drive(_make_aggregator(cls, params, layout, seed=5), layout)
    b = _drive(_make_aggregator(cls, params, layout, seed=5), layout)
    if not np.array_equal(a, b):
        raise ContractFailure("the same schedule gave two different models")


AGGREGATOR_CHECKS: dict[str, Callable] = {
    "builds": _aggregator_builds, "holds_or_applies": _aggregator_holds_or_applies, "progress": _aggregator_progress,
    "deterministic": _aggregator_deterministic,
}


def _run(checks: dict[str, Callable], *args) -> list[Verdict]:
    verdicts = []
    for name, check in checks.items():
        try:
            check(*args)
        except ContractFailure as failure:
            verdicts.append(Verdict(name, False, str(failure)))
        except Exception as error:  # noqa: BLE001 - a plug-in's own exception is a failed check, reported
            verdicts.append(Verdict(name, False, f"raised {type(error).__name__}: {error}"))
        else:
            verdicts.append(Verdict(name, True))
    return verdicts


def check_compressor(cls: type[Compressor], params: dict | None = None, layout: Layout | None = None) -> list[Verdict]:
    """Every check of the compressor contract on ``cls`` with ``params`` (default: its defaults), each a
    :class:`Verdict`; an exception other than ContractFailure fails its check too, with its type and message."""
    return _run(CHECKS, cls, dict(params or {}), layout or default_layout())


def check_rule(cls: type[rules_module.UpdateRule], layout: Layout | None = None) -> list[Verdict]:
    """Every check of the update-rule contract on ``cls``, each a :class:`Verdict`."""
    return _run(RULE_CHECKS, cls, layout or default_layout())


def check_aggregator(cls, params: dict | None = None, layout: Layout | None = None) -> list[Verdict]:
    """Every check of the aggregator contract on ``cls`` with ``params`` (default: its defaults), each a :class:`Verdict`."""
    return _run(AGGREGATOR_CHECKS, cls, dict(params or {}), layout or default_layout())


__all__ = ["CHECKS", "RULE_CHECKS", "AGGREGATOR_CHECKS", "check_aggregator", "ContractFailure", "Verdict", "check_compressor", "check_rule", "default_layout", "gradients"]
