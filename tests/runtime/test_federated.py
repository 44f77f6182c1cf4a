"""Federated aggregation and local steps against independent, sequential numpy references, bit for bit.

Each reference below is written from the method's paper, dense and in plain numpy float32, and
knows nothing of the aggregators' buffers, rounds or coordinates; a fixed schedule of arrivals
(who, how stale, which delta) must give the same model, byte for byte.
"""

from __future__ import annotations

import numpy as np
import pytest

from compression.layout import Layout, TensorSpec
from compression.parts import DensePart, SparsePart
from emulator.runtime import aggregation, rules
from emulator.runtime.aggregation import FedAsync, FedAvg, FedBuff, PerPush, staleness_weight
from emulator.runtime.config import LocalConfig
from emulator.runtime.local import local_delta, steps_per_push

LAYOUT = Layout((TensorSpec("w", (4, 5)), TensorSpec("b", (5,))))  # 25 parameters
SERVER_LR = 0.7


def delta_parts(rng, sparse: bool):
    """A model delta as a compressor's parts: top-k-like sparse parts, or dense ones."""
    out = []
    for size in LAYOUT.sizes:
        values = rng.normal(size=size).astype(np.float32)
        if sparse:
            idx = np.sort(rng.choice(size, size=max(1, size // 3), replace=False)).astype(np.int64)
            out.append(SparsePart(idx, values[idx]))
        else:
            out.append(DensePart(values))
    return out


def dense(parts) -> np.ndarray:
    return np.concatenate([part.dense(size) for part, size in zip(parts, LAYOUT.sizes)]).astype(np.float32)


def schedule(seed: int, n: int, workers: int, sparse: bool):
    rng = np.random.default_rng(seed)
    return [(int(rng.integers(workers)), int(rng.integers(0, 6)), delta_parts(rng, sparse)) for _ in range(n)]


def initial(seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=LAYOUT.total).astype(np.float32)


@pytest.mark.parametrize("sparse", [True, False])
@pytest.mark.parametrize("kind", ["sqrt", "constant", "polynomial", "hinge"])
def test_fedbuff_is_its_sequential_reference_bit_for_bit(sparse, kind):
    rule = rules.build("plain", LAYOUT, SERVER_LR)
    agg = FedBuff(LAYOUT, rule, buffer=3, staleness=kind, a=0.5, b=2)
    params = initial()
    arrivals = schedule(1, 11, 5, sparse)
    steps = 0
    for worker, tau, parts in arrivals:
        if agg.receive(params, rule.coordinates(parts), worker, tau, 100, 0.0) is not None:
            steps += 1
    assert steps == 3 and agg.rounds == 3  # 11 arrivals, buffer 3: two held at the end

    def s(tau):  # the paper's weights, written out
        return {"sqrt": 1 / np.sqrt(1.0 + tau), "constant": 1.0, "polynomial": (1.0 + tau) ** -0.5,
                "hinge": 1.0 if tau <= 2 else 1 / (0.5 * (tau - 2) + 1)}[kind]

    theta, buffer = initial(), []
    for _, tau, parts in arrivals:
        buffer.append(np.float32(s(tau)) * dense(parts))
        if len(buffer) == 3:
            total = np.zeros(LAYOUT.total, np.float32)
            for d in buffer:
                total = total + d
            theta = theta - np.float32(SERVER_LR) * (total / np.float32(3))
            buffer = []
    assert params.tobytes() == theta.tobytes()
    records = agg.closed()
    assert [r.as_record()["participants"] for r in records] == [3, 3, 3]


@pytest.mark.parametrize("kind", ["constant", "polynomial", "hinge"])
def test_fedasync_is_its_sequential_reference_bit_for_bit(kind):
    rule = rules.build("plain", LAYOUT, 1.0)
    agg = FedAsync(LAYOUT, rule, alpha=0.6, staleness=kind, a=0.5, b=1)
    params = initial()
    theta = initial()
    pulled_ref = {}
    rng = np.random.default_rng(4)
    for step in range(12):
        worker = int(rng.integers(3))
        if worker not in pulled_ref or rng.random() < 0.5:  # the worker pulls again, or pushes from its old copy
            agg.on_pull(worker, step, params)
            pulled_ref[worker] = theta.copy()
        tau = int(rng.integers(0, 5))
        parts = delta_parts(rng, sparse=bool(step % 2))
        agg.receive(params, rule.coordinates(parts), worker, tau, 10, 0.0)
        # FedAsync (Xie et al.): theta <- (1 - a_t) theta + a_t theta_client, a_t = alpha s(tau)
        s = {"constant": 1.0, "polynomial": (1.0 + tau) ** -0.5, "hinge": 1.0 if tau <= 1 else 1 / (0.5 * (tau - 1) + 1)}[kind]
        client = pulled_ref[worker] - dense(parts)
        theta = theta - np.float32(1.0) * (np.float32(0.6 * s) * (theta - client))
        assert params.tobytes() == theta.tobytes(), step
        mixed = (1 - 0.6 * s) * theta.astype(np.float64)  # and it is the paper's convex mix, to rounding
    assert np.isfinite(mixed).all() and agg.rounds == 12


def test_fedasync_is_the_convex_mix_of_server_and_client_models():
    rule = rules.build("plain", LAYOUT, 1.0)
    agg = FedAsync(LAYOUT, rule, alpha=0.5, staleness="constant")
    params = initial()
    agg.on_pull(0, 0, params)
    pulled = params.copy()
    params += 1.0  # others' updates since the pull
    before = params.copy()
    parts = [DensePart(np.full(size, 0.25, np.float32)) for size in LAYOUT.sizes]
    agg.receive(params, rule.coordinates(parts), 0, 3, 1, 0.0)
    np.testing.assert_allclose(params, 0.5 * before + 0.5 * (pulled - 0.25), rtol=1e-6)


def fedavg_run(arrival_order_seed: int, sparse=True):
    """Three rounds of FedAvg over 6 clients, 3 sampled, one sampled client late in round 2."""
    rule = rules.build("plain", LAYOUT, SERVER_LR)
    agg = FedAvg(LAYOUT, rule, seed=9, sample=3, deadline_s=5.0)
    params = initial()
    examples = {w: 10 * (w + 1) for w in range(6)}
    rng = np.random.default_rng(arrival_order_seed)
    deltas = {(r, w): delta_parts(np.random.default_rng(100 * r + w), sparse) for r in range(1, 4) for w in range(6)}
    for w in range(6):
        agg.join(w)
    sampled, now = [], 0.0
    for r in range(1, 4):
        chosen = [w for w in range(6) if agg.admit(w, now)]
        sampled.append(chosen)
        for w in chosen:
            agg.on_pull(w, r - 1, params)
        assert not any(agg.admit(w, now) for w in range(6))  # a sampled client takes the model once a round
        late = chosen[0] if r == 2 else None
        for w in rng.permutation(chosen):
            if w != late:
                agg.receive(params, rule.coordinates(deltas[r, w]), int(w), 0, examples[w], now)
        if late is not None:
            assert agg.due(params, now + 1.0) is None  # before the deadline the round waits
            now += 5.0
            assert agg.due(params, now) is not None  # the deadline closes it without the late client
            with pytest.raises(rules.RuleError, match="late_for_round"):  # its round closed: dropped, the model kept
                agg.receive(params, rule.coordinates(deltas[r, late]), late, 0, examples[late], now)
            assert agg.late == 1
    return params, sampled, agg.closed(), deltas, examples


def test_fedavg_is_its_sequential_reference_bit_for_bit_whatever_the_arrival_order():
    params, sampled, records, deltas, examples = fedavg_run(0)
    again, sampled_again, _, _, _ = fedavg_run(1)  # the same rounds, the clients reporting in another order
    assert params.tobytes() == again.tobytes() and sampled == sampled_again
    theta = initial()
    for r, chosen in enumerate(sampled, start=1):
        # the sample: 3 of the 6 connected clients, drawn with the run's seed and the round's number
        assert chosen == sorted(int(w) for w in np.random.default_rng([9, r]).choice(6, size=3, replace=False))
        came = chosen[1:] if r == 2 else chosen
        n = sum(examples[w] for w in came)
        total = np.zeros(LAYOUT.total, np.float32)
        for w in sorted(came):
            total = total + np.float32(examples[w] / n) * dense(deltas[r, w])
        theta = theta - np.float32(SERVER_LR) * total
    assert params.tobytes() == theta.tobytes()
    rows = [rec.as_record() for rec in records]
    assert [(row["round"], row["sampled"], row["participants"], row["dropped"]) for row in rows] == [
        (1, 3, 3, 0), (2, 3, 2, 1), (3, 3, 3, 0)]
    assert rows[1]["dropped_workers"] == [sampled[1][0]]
    assert rows[0]["examples"] == sum(examples[w] for w in sampled[0])


def test_fedavg_samples_only_connected_clients():
    rule = rules.build("plain", LAYOUT, 1.0)
    agg = FedAvg(LAYOUT, rule, seed=1, sample=4)
    for w in (0, 2, 5):  # the others are away (crashed, or not available in the trace)
        agg.join(w)
    agg.forget(2)
    assert agg.admit(0, 0.0) and agg.admit(5, 0.0) and not agg.admit(1, 0.0)
    assert agg._round.sampled == [0, 5]  # fewer there than the sample: all of them


def test_per_push_is_the_rule():
    rule = rules.build("adacomp", LAYOUT, 0.5)
    other = rules.build("adacomp", LAYOUT, 0.5)
    agg = PerPush(LAYOUT, rule)
    a, b = initial(), initial()
    rng = np.random.default_rng(2)
    for w in (0, 1):
        rule.on_pull(w, 0)
        other.on_pull(w, 0)
    for step in range(6):
        parts = delta_parts(rng, True)
        agg.receive(a, rule.coordinates(parts), step % 2, step, 1, 0.0)
        other.apply(b, parts, step % 2, step)
    assert a.tobytes() == b.tobytes()


def test_local_steps_are_sequential_sgd_and_the_delta_has_a_gradients_sign():
    """A linear least-squares model in numpy stands in for the network: H steps of SGD, then the delta."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 25)).astype(np.float32)
    y = rng.normal(size=40).astype(np.float32)

    def gradient(theta, xb, yb):
        r = xb @ theta - yb
        return float(np.mean(r * r)), (xb.T @ r / np.float32(len(xb))).astype(np.float32)

    batches = iter([(x[i : i + 8], y[i : i + 8]) for i in range(0, 40, 8)])
    start = initial()
    delta, loss = local_delta(start, gradient, lambda: next(batches), 5, 0.05)
    assert start.tobytes() == initial().tobytes()  # the pulled model is left as it was
    theta = initial()
    for i in range(0, 40, 8):
        theta = theta - np.float32(0.05) * gradient(theta, x[i : i + 8], y[i : i + 8])[1]
    assert delta.tobytes() == (initial() - theta).tobytes() and delta.dtype == np.float32
    one, _ = local_delta(start, gradient, lambda: (x[:8], y[:8]), 1, 0.05)
    assert one.tobytes() == (start - (start - np.float32(0.05) * gradient(start, x[:8], y[:8])[1])).tobytes()
    assert steps_per_push(LocalConfig(steps=7), 1000, 10) == 7
    assert steps_per_push(LocalConfig(epochs=2), 105, 10) == 20  # whole batches per pass, as the sampler draws them


@pytest.mark.parametrize(("cls", "params", "clients", "field"), [
    (FedAvg, {"sample": 9}, 8, "sample"),
    (FedAvg, {"sample": 2, "deadline_s": 0}, 8, "deadline"),
    (FedBuff, {"buffer": 9}, 8, "buffer"),
    (FedBuff, {"buffer": 2, "staleness": "cubic"}, 8, "staleness"),
    (FedAsync, {"alpha": 1.5}, 8, "alpha"),
])
def test_bad_parameters_name_their_field(cls, params, clients, field):
    (problem,) = cls.problems(params, clients)
    assert problem.field == field


def test_registry_and_rules_that_take_deltas():
    assert set(aggregation.AGGREGATORS) == {"per_push", "fedbuff", "fedasync", "fedavg"}
    assert aggregation.lookup("fedbuff") is FedBuff
    assert rules.RULES["plain"].takes_model_delta and rules.RULES["staleness"].takes_model_delta
    assert not rules.RULES["adacomp"].takes_model_delta
    assert staleness_weight("hinge", 3, a=1.0, b=1) == pytest.approx(1 / 3)
    with pytest.raises(aggregation.AggregatorError) as exc:
        FedBuff(LAYOUT, rules.build("plain", LAYOUT, 1.0), buffer=2, bogus=1)
    assert exc.value.field == "bogus"


def test_fedavg_closes_a_round_whose_other_sampled_clients_left():
    """Without a deadline, a round whose missing clients crashed closes once the others reported."""
    rule = rules.build("plain", LAYOUT, 1.0)
    agg = FedAvg(LAYOUT, rule, seed=0, sample=3)
    params = initial()
    for w in range(3):
        agg.join(w)
    for w in range(3):
        assert agg.admit(w, 0.0)
        agg.on_pull(w, 0, params)
    agg.receive(params, rule.coordinates(delta_parts(np.random.default_rng(0), True)), 0, 0, 5, 0.0)
    agg.forget(1)
    assert agg.due(params, 1.0) is None  # worker 2 may still report
    agg.forget(2)
    agg.join(2)  # it came back: too late for this round
    assert agg.due(params, 2.0) is not None
    (record,) = agg.closed()
    assert record.participants == [0] and record.dropped == [1, 2]


def test_an_aggregated_step_touches_only_the_coordinates_that_move():
    """So that the server's change log, and a delta pull, carry only them: FedBuff over two sparse deltas."""
    rule = rules.build("plain", LAYOUT, 1.0)
    agg = FedBuff(LAYOUT, rule, buffer=2, staleness="constant")
    params = initial()
    first = [SparsePart(np.array([1, 4], np.int64), np.ones(2, np.float32)), SparsePart(np.zeros(0, np.int64), np.zeros(0, np.float32))]
    second = [SparsePart(np.array([4], np.int64), np.ones(1, np.float32)), SparsePart(np.array([2], np.int64), np.ones(1, np.float32))]
    assert agg.receive(params, rule.coordinates(first), 0, 0, 1, 0.0) is None
    applied = agg.receive(params, rule.coordinates(second), 1, 0, 1, 0.0)
    (target,) = applied.targets
    assert target.tolist() == [1, 4, 22] and applied.entries == 3
    assert np.flatnonzero(params != initial()).tolist() == [1, 4, 22]


@pytest.mark.parametrize("name", sorted(aggregation.AGGREGATORS))
def test_every_built_in_aggregator_keeps_the_contract(name):
    """The suite ``emulate check agg.py:Mine`` runs on a user's aggregator, on each built-in."""
    from emulator.runtime import contract

    verdicts = contract.check_aggregator(aggregation.AGGREGATORS[name], {"sample": 3, "deadline_s": 0.9} if name == "fedavg" else {})
    assert [v.check for v in verdicts] == list(contract.AGGREGATOR_CHECKS)
    assert {v.check: v.detail for v in verdicts if not v.ok} == {}


def test_the_aggregator_contract_catches_a_broken_one():
    from emulator.runtime import contract

    class Sneaky(PerPush):
        """Holds every update, but writes half of it into the model anyway."""

        name = "sneaky"

        def receive(self, params, coordinates, worker, staleness, examples, now):
            for target, values in coordinates:
                params[target] -= np.float32(0.5) * values
            return None

    failed = {v.check for v in contract.check_aggregator(Sneaky) if not v.ok}
    assert failed == {"holds_or_applies"}


def test_fedasync_keeps_a_paused_clients_copy_and_refuses_a_push_without_a_pull():
    rule = rules.build("plain", LAYOUT, 1.0)
    agg = FedAsync(LAYOUT, rule, alpha=0.5, staleness="constant")
    params = initial()
    agg.on_pull(0, 0, params)
    agg.available(0, False)  # paused, still connected: its update may yet come
    agg.available(0, True)
    assert agg.receive(params, rule.coordinates(delta_parts(np.random.default_rng(1), True)), 0, 0, 1, 0.0) is not None
    with pytest.raises(rules.RuleError, match="no_pull"):
        agg.receive(params, rule.coordinates(delta_parts(np.random.default_rng(2), True)), 1, 0, 1, 0.0)
