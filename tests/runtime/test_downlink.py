"""The model's way down: delta pulls (lossless, f16, q8), the server's bookkeeping, pulls every m pushes.

Properties over random orders of pushes, pulls and restarts, on the real server object (its
change log, its replies, AdaComp's copies at pull) and the worker's :class:`ModelCopy`; then the
same over real sockets. The properties run with the numpy code and with the compiled loops
(:mod:`compression.compiled`), which build float32 deltas and AdaComp's counters at a pull their own way.
"""

from __future__ import annotations

import contextlib
import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compression
from compression import compiled, delta
from compression.layout import Layout, TensorSpec
from compression.parts import SparsePart, to_half
from emulator.runtime import downlink, protocol
from emulator.runtime.config import CheckpointConfig, PullConfig
from emulator.runtime.downlink import ChangeLog, Holding, ModelCopy
from emulator.runtime.paramserver import ParameterServer
from emulator.runtime.protocol import HEADER, Flag, MsgType
from support.paramserver import TIMEOUT, Client, RecordingTelemetry, server_config

BIG = Layout((TensorSpec("kernel", (30, 20)), TensorSpec("bias", (8,)), TensorSpec("out", (50,))))  # 600, 8, 50
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LOOPS = pytest.mark.parametrize("loops", ["numpy", "numba"])


@contextlib.contextmanager
def running(loops: str):
    """The server's hot path as numpy code or as the compiled loops."""
    compiled.disable()
    if loops == "numba":
        pytest.importorskip("numba")
        assert compiled.enable().startswith("numba")
    try:
        yield
    finally:
        compiled.disable()


def server(rule="adacomp", layout=BIG, **cfg) -> ParameterServer:
    ps = ParameterServer(server_config(layout=layout.to_json(), seed=5, rule=rule, learning_rate=0.05, **cfg), RecordingTelemetry())
    ps.control({"cmd": "start"})
    return ps


def random_update(rng, layout=BIG, density=0.05) -> bytes:
    parts = []
    for n in layout.sizes:
        k = max(1, int(rng.binomial(n, density)))
        idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
        parts.append(SparsePart(idx, rng.normal(size=k).astype(np.float32)))
    return compression.encode(parts, layout)


class Device:
    """A worker as the server sees it (its Holding) and as it is (its ModelCopy)."""

    def __init__(self, index, values: str | None, layout=BIG):
        self.index = index
        self.holding = None if values is None else Holding(values)
        self.copy = ModelCopy(layout)
        self.pulled_from: list[int | None] = []  # the base of every reply

    def pull(self, ps: ParameterServer) -> downlink.Reply:
        reply, _ = ps.pull(self.index, self.holding)
        self.pulled_from.append(reply.base)
        self.copy.receive(reply.version, reply.flags, reply.body)
        return reply

    def push(self, ps: ParameterServer, message: bytes) -> None:
        assert ps.push(self.index, self.copy.version, memoryview(message), len(message)).reason is None


def check_copy(device: Device, ps: ParameterServer) -> None:
    """The invariant of the device's value format, right after a pull."""
    params = ps.params
    fmt = None if device.holding is None else device.holding.fmt.name
    if fmt in (None, "f32"):
        assert device.copy.params.tobytes() == params.tobytes()  # bit for bit
    elif fmt == "f16":
        np.testing.assert_array_equal(device.copy.params, to_half(params))
    else:
        assert device.copy.params.tobytes() == device.holding.reference.tobytes()  # the server knows the copy exactly


# -- the pure codec --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(delta.DELTA_VALUES))
def test_select_counts_the_exact_bytes_and_takes_the_smaller_form(fmt):
    rng = np.random.default_rng(1)
    values = delta.values_format(fmt)
    params = rng.normal(size=BIG.total).astype(np.float32)
    reference = params + rng.normal(scale=1e-3, size=BIG.total).astype(np.float32)
    for density in (0.0, 0.01, 0.2, 0.9):
        changed = np.flatnonzero(rng.random(BIG.total) < density)
        selection, size = delta.select(values, BIG, changed)
        for idx, n in zip(selection, BIG.sizes):
            if idx is not None:
                assert values.sparse_bytes(n, idx.size) < values.dense_bytes(n)
        parts = delta.parts(values, BIG, selection, delta.take(params, BIG, selection), reference)
        assert len(delta.message(values, BIG, parts)) == size == delta.message_bytes(values, BIG, selection)


def test_q8_quantize_rounds_to_the_nearest_level():
    diff = np.array([-2.0, -1.0, 0.0, 0.004, 1.0, 2.0], np.float32)
    scale, codes = delta.quantize(diff)
    assert scale == 2.0 and codes.tolist() == [0, 63, 127, 127, 191, 254]  # -63.5 and 63.5 round to even
    assert delta.quantize(np.zeros(3, np.float32)) == (0.0, pytest.approx(np.full(3, 127)))


# -- properties on the server object -----------------------------------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["push", "pull", "push_no_model", "restart"]), st.integers(0, 3),
                         st.integers(0, 2**31)), min_size=1, max_size=60)


@LOOPS
@PROPERTY
@given(OPS, st.sampled_from(["f32", "f16", "q8"]), st.sampled_from(["adacomp", "plain"]))
def test_after_every_pull_the_copy_is_what_the_format_promises(loops, ops, fmt, rule):
    """Random pushes, pulls and restarts by four workers (one pulls dense): after each pull, a
    lossless copy equals the server's model bit for bit, an f16 copy equals the model rounded,
    and a q8 copy equals what the server keeps for it; AdaComp's copy of the counters at a pull
    equals the counters (copied whole, or only where the model changed since the last pull)."""
    with running(loops):
        _pushes_pulls_and_restarts(ops, fmt, rule)


def _pushes_pulls_and_restarts(ops, fmt, rule):
    ps = server(rule)
    devices = [Device(i, None if i == 3 else fmt) for i in range(4)]
    for d in devices:
        d.pull(ps)
    for op, i, seed in ops:
        d = devices[i]
        if op == "restart":  # a new connection: the server assumes nothing
            devices[i] = d = Device(i, None if i == 3 else fmt)
            ps.rule.forget(i)
            d.pull(ps)
            assert d.pulled_from[-1] in (None, downlink.WHOLE)
        elif op == "pull":
            d.pull(ps)
        else:
            d.push(ps, random_update(np.random.default_rng(seed)))
            if op == "push":
                d.pull(ps)
            else:
                continue  # an ACK: the copy stays as it was
        check_copy(d, ps)
        if rule == "adacomp":
            np.testing.assert_array_equal(ps.rule.at_pull[i], ps.rule.touches)


@LOOPS
@PROPERTY
@given(st.integers(0, 2**31), st.integers(1, 40))
def test_a_lossless_delta_carries_exactly_what_changed_since_the_version_held(loops, seed, pushes):
    with running(loops):
        _a_delta_after(seed, pushes)


def _a_delta_after(seed, pushes):
    ps = server("plain")
    rng = np.random.default_rng(seed)
    d = Device(0, "f32")
    d.pull(ps)
    held = ps.params.copy()
    for _ in range(pushes):
        other = random_update(rng)
        ps.push(1, ps.version, memoryview(other), len(other))
    reply = d.pull(ps)
    changed = int(np.count_nonzero(held != ps.params))
    if reply.flags & Flag.DELTA:
        assert reply.base == ps.version - pushes and reply.entries >= changed
        assert len(reply.body) < 4 * BIG.total
    else:
        assert len(reply.body) == 4 * BIG.total  # the delta would have been no smaller
    assert d.copy.params.tobytes() == ps.params.tobytes()


def test_a_delta_is_far_smaller_than_the_model_when_few_coordinates_changed():
    ps = server()
    d = Device(0, "f32")
    whole = d.pull(ps)
    assert not whole.flags & Flag.DELTA and len(whole.body) == 4 * BIG.total  # first pull: the raw model
    message = random_update(np.random.default_rng(2), density=0.01)
    d.push(ps, message)
    reply = d.pull(ps)
    assert reply.flags & Flag.DELTA and not reply.flags & Flag.INCREMENT
    assert len(reply.body) < 0.25 * len(whole.body)
    (row,) = ps.tel.stream("updates") or [None]
    assert row is None  # push() hands the row to its reply; the connection records it


def test_q8_drift_stays_within_half_a_step_of_the_last_delta_that_carried_each_coordinate():
    """1,000 updates by three workers, the q8 worker pulling after each of its pushes: the
    copy's error on each coordinate is at most half the code step of the last delta that
    carried it (and a few float32 roundings), so it does not grow with the number of pulls."""
    ps = server("plain")
    rng = np.random.default_rng(7)
    d = Device(0, "q8")
    d.pull(ps)
    step = np.zeros(BIG.total, np.float64)  # half-step bound per coordinate
    errors = []
    for i in range(1000):
        message = random_update(rng, density=0.02)
        pusher = i % 3
        if pusher:
            assert ps.push(pusher, ps.version, memoryview(message), len(message)).reason is None
            continue
        d.push(ps, message)
        reply, _ = ps.pull(0, d.holding)
        d.copy.receive(reply.version, reply.flags, reply.body)
        if reply.flags & Flag.DELTA:
            parts = compression.decode(memoryview(reply.body)[downlink.BASE.size :], BIG)
            for offset, n, part in zip(BIG.offsets, BIG.sizes, parts):
                idx, _ = part.coordinates(n)
                target = np.arange(offset, offset + n) if idx is None else idx + offset
                step[target] = part.scale / delta.LEVELS / 2
        else:
            step[:] = 0.0
        error = np.abs(d.copy.params.astype(np.float64) - ps.params)
        slack = 4 * np.spacing(np.maximum(np.abs(ps.params), np.abs(d.copy.params))).astype(np.float64)
        assert np.all(error <= step + slack)
        errors.append(float(error.max()))
    assert max(errors[-50:]) <= 2 * max(errors[:50]) + 1e-6  # bounded: no growth over the run
    assert max(errors) < 0.05 * float(np.abs(ps.params).max())


def test_f16_error_is_half_an_ulp_of_each_parameter_whatever_the_number_of_pulls():
    ps = server("plain")
    rng = np.random.default_rng(3)
    d = Device(0, "f16")
    first = d.pull(ps)
    assert first.flags & Flag.DELTA and first.base == downlink.WHOLE  # the whole model, in half precision
    assert len(first.body) < 0.6 * 4 * BIG.total
    for _ in range(300):
        d.push(ps, random_update(rng))
        d.pull(ps)
    np.testing.assert_array_equal(d.copy.params, to_half(ps.params))
    assert np.all(np.abs(d.copy.params - ps.params) <= np.spacing(np.abs(ps.params).astype(np.float16)).astype(np.float32))


def test_the_change_log_forgets_nothing_after_its_start_and_claims_nothing_before():
    log = ChangeLog(10, version=5)
    assert log.since(None) is None and log.since(4) is None
    log.record([np.array([1, 7]), slice(3, 5)], 6)
    log.record([np.array([7])], 7)
    assert log.since(5).tolist() == [1, 3, 4, 7] and log.since(6).tolist() == [7] and log.since(7).tolist() == []
    log.record([slice(0, 4), slice(4, 10)], 8)  # a dense update: everything changed, no scan needed
    assert log.since(7) is None and log.since(8).tolist() == []


def test_the_change_log_answers_from_its_ring_or_its_scan_alike():
    rng = np.random.default_rng(4)
    ring, scan = ChangeLog(1000, budget=300), ChangeLog(1000, budget=0)
    for version in range(1, 60):
        written = [np.sort(rng.choice(1000, int(rng.integers(0, 40)), replace=False))]
        ring.record(written, version)
        scan.record(written, version)
        for v in range(max(0, version - 12), version + 1):
            assert ring.since(v).tolist() == scan.since(v).tolist()
    assert 0 < ring.recent_size <= 300 and not scan.recent


def test_a_restored_server_sends_whole_models(tmp_path):
    from emulator.runtime import checkpoint

    ps = server()
    d = Device(0, "f32")
    d.pull(ps)
    for seed in range(3):
        d.push(ps, random_update(np.random.default_rng(seed)))
        d.pull(ps)
    checkpoint.save(tmp_path, ps.version - 1, ps.params, ps.rule.state())
    again = server(checkpoint=CheckpointConfig(dir=str(tmp_path), every_updates=1000, every_s=None))
    assert again.changes.start == again.version == 2
    d.holding.version = 2  # the version number it held, of a model the restored server never had
    reply, _ = again.pull(0, Holding("f32"))  # a new connection: nothing assumed
    assert not reply.flags & Flag.DELTA and reply.base is None
    assert again.changes.since(1) is None  # and nothing built on a version from before the restore


def test_a_hello_s_pull_is_checked():
    hello = PullConfig(mode="delta", values="q8", every=4).hello()
    assert hello == {"mode": "delta", "values": "q8"}  # every stays with the worker
    assert downlink.parse_hello(hello).fmt == delta.values_format("q8")
    assert downlink.parse_hello(PullConfig().hello()) is None and downlink.parse_hello(None) is None
    for bad in ({"mode": "sparse"}, {"values": "f8"}, {"mode": "delta", "colour": 1}, "delta", [1]):
        with pytest.raises(protocol.ProtocolError, match="pull"):
            downlink.parse_hello(bad)


def test_the_scenario_literals_are_the_registries():
    from emulator.planning.scenario import PullSpec

    assert set(PullSpec.model_fields["mode"].annotation.__args__) == set(downlink.PULL_MODES)
    assert set(PullSpec.model_fields["values"].annotation.__args__) == set(delta.DELTA_VALUES)


# -- over real sockets ------------------------------------------------------------------------------


class DeltaClient(Client):
    """A test client whose HELLO asks for delta pulls and that keeps a ModelCopy."""

    def __init__(self, port, worker, pull: dict, layout):
        super().__init__(port, "worker", worker, hello=False)
        self.channel.send(MsgType.HELLO, protocol.json_body({"role": "worker", "worker": worker, "incarnation": 0, "pull": pull}))
        header, body = self.channel.recv()
        assert header.type == MsgType.WELCOME, (header.type, bytes(body))
        self.copy = ModelCopy(layout)

    def model(self):
        header, body = self.recv()
        assert header.type == MsgType.MODEL, (header.type, body)
        return header, self.copy.receive(header.t0, header.flags, body).copy()


def test_delta_pulls_over_the_wire(harness):
    h = harness(layout=BIG.to_json())
    h.start()
    c = DeltaClient(h.port, 0, {"mode": "delta", "values": "f32"}, BIG)
    h.clients.append(c)
    c.pull()
    header, _ = c.model()
    assert not header.flags & Flag.DELTA
    message = random_update(np.random.default_rng(0), density=0.01)
    c.push_raw(message, t0=header.t0)
    header, params = c.model()
    assert header.flags & Flag.DELTA and header.t0 == 1
    assert params.tobytes() == h.server.params.tobytes()
    (row,) = h.tel.stream("updates")
    assert row["reply"] == "delta" and row["reply_base"] == 0 and row["reply_entries"] == row["entries"]
    assert row["reply_bytes"] == HEADER.size + header.length < HEADER.size + BIG.total
    traffic = counted(h.server, 0, "pulls", 2)  # counted once sent: the client may read it first
    assert (traffic["pulls"], traffic["delta_pulls"]) == (2, 1)
    assert traffic["egress_bytes"] == traffic["pull_bytes"] == HEADER.size * 2 + 4 * BIG.total + header.length


def counted(server, worker, key, value):
    """The server's traffic counters of ``worker`` once ``key`` reaches ``value`` (or TIMEOUT passed)."""
    deadline = time.monotonic() + TIMEOUT
    while server._traffic[worker][key] < value and time.monotonic() < deadline:
        time.sleep(0.005)
    return server._traffic[worker]


def test_a_push_flagged_no_model_is_answered_with_an_ack(harness):
    from support.paramserver import update

    h = harness()
    h.start()
    w = h.client(worker=0)
    w.pull()
    header, p0 = w.model()
    w.channel.send(MsgType.PUSH, compression.encode(update(), w_layout()), t0=0, flags=Flag.NO_MODEL)
    header, body = w.recv()
    assert header.type == MsgType.ACK and header.t0 == 1 and body == b""
    w.push(update(), t0=0)  # a second step on the same (stale) model
    header, _ = w.model()
    assert header.t0 == 2
    rows = h.tel.stream("updates")
    assert [r["reply"] for r in rows] == ["ack", "model"] and [r["staleness"] for r in rows] == [0, 1]
    assert rows[0]["reply_bytes"] == HEADER.size


def w_layout():
    from support.paramserver import LAYOUT

    return LAYOUT


def test_a_hello_with_a_bad_pull_is_refused(harness):
    h = harness()
    c = Client(h.port, "worker", 0, hello=False)
    h.clients.append(c)
    c.channel.send(MsgType.HELLO, protocol.json_body({"role": "worker", "worker": 0, "pull": {"mode": "delta", "values": "f8"}}))
    header, body = c.recv()
    assert header.type == MsgType.REJECT and json.loads(body)["reason"] == "bad_hello"


def test_a_reconnected_worker_gets_the_whole_model(harness):
    h = harness(layout=BIG.to_json())
    h.start()
    first = DeltaClient(h.port, 0, {"mode": "delta"}, BIG)
    h.clients.append(first)
    first.pull()
    first.model()
    first.push_raw(random_update(np.random.default_rng(1), density=0.01), t0=0)
    header, _ = first.model()
    assert header.flags & Flag.DELTA
    again = DeltaClient(h.port, 0, {"mode": "delta"}, BIG)  # a restarted worker: a fresh copy
    h.clients.append(again)
    again.pull()
    header, params = again.model()
    assert not header.flags & Flag.DELTA and params.tobytes() == h.server.params.tobytes()


def test_a_delta_from_another_version_than_the_copy_holds_is_refused():
    ps = server()
    d = Device(0, "f32")
    d.pull(ps)
    d.push(ps, random_update(np.random.default_rng(0)))
    reply, _ = ps.pull(0, d.holding)
    d.copy.version = 99
    with pytest.raises(protocol.ProtocolError, match="bad_delta"):
        d.copy.receive(reply.version, reply.flags, reply.body)


