"""The parameter server in-process, driven over real localhost sockets with the real frames.

No TensorFlow: the layout is tiny and the server only needs numpy.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest

import compression
from compression.layout import Layout, TensorSpec
from compression.parts import DensePart, WireFormat
from emulator.runtime import protocol
from emulator.runtime.models import initial_parameters
from emulator.runtime.paramserver import ParameterServer
from emulator.runtime.protocol import HEADER, Flag, MsgType

from support.paramserver import ALPHA, LAYOUT, RecordingTelemetry, TIMEOUT, TOKEN, expected_step, server_config, sparse, update

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def test_hello_welcome_and_pull_waits_for_start(harness):
    h = harness()
    w = h.client(worker=0)
    assert w.welcome == {"version": 0, "layout": LAYOUT.to_json()}
    w.pull()
    w.sock.settimeout(0.3)
    with pytest.raises(socket.timeout):
        w.sock.recv(1, socket.MSG_PEEK)  # nothing until the controller says start
    w.sock.settimeout(TIMEOUT)
    h.start()
    header, params = w.model()
    assert header.t0 == 0 and not header.flags & Flag.DONE
    np.testing.assert_array_equal(params, initial_parameters(LAYOUT, 3))
    np.testing.assert_array_equal(params[6:], np.full(4, 0.1, np.float32))  # biases
    assert [e["kind"] for e in h.tel.stream("events")].count("training_started") == 1
    h.start()  # a second start is harmless
    assert [e["kind"] for e in h.tel.stream("events")].count("training_started") == 1


def test_push_applies_the_rule_and_answers_with_the_model(harness):
    h = harness()
    h.start()
    w = h.client(worker=2)
    w.pull()
    _, p0 = w.model()
    parts = update()
    w.push(parts, t0=0)
    header, p1 = w.model()
    assert header.t0 == 1 and h.server.version == 1
    np.testing.assert_array_equal(p1, expected_step(p0, parts))
    np.testing.assert_array_equal(h.server.params, p1)
    (rec,) = h.tel.stream("updates")
    assert rec["t"] == 1 and rec["worker"] == 2 and rec["t0"] == 0 and rec["staleness"] == 0
    assert rec["entries"] == 3 and rec["scale"] == 1.0
    assert rec["bytes"] == HEADER.size + len(compression.encode(parts, LAYOUT))
    assert (h.server._traffic[2]["ingress_bytes"], h.server._traffic[2]["pushes"]) == (rec["bytes"], 1)


def test_adacomp_sigma_across_workers(harness):
    h = harness()
    h.start()
    a, b, c = h.client(worker=0), h.client(worker=1), h.client(worker=2)
    for x in (a, b, c):
        x.pull()
        _, p = x.model()
    b.push(update((0, 1), (1.0, 2.0), (), ()), t0=0)
    b.model()
    c.push(update((1,), (2.0,), (), ()), t0=0)
    c.model()
    before = h.server.params.copy()
    a.push(update((1, 2), (4.0, 2.0), (), ()), t0=0)  # d = 2; sigma(1) = 2, sigma(2) = 0
    header, after = a.model()
    assert header.t0 == 3
    expected = before.copy()
    expected[1] -= np.float32(ALPHA) * np.float32(4.0) / np.float32(2)
    expected[2] -= np.float32(ALPHA) * np.float32(2.0)
    np.testing.assert_array_equal(after, expected)
    assert h.tel.stream("updates")[-1]["staleness"] == 2
    assert h.tel.stream("updates")[-1]["scale"] == 0.75


def test_dense_push_with_plain_rule(harness):
    h = harness(rule="plain")
    h.start()
    w = h.client(worker=0)
    w.pull()
    _, p0 = w.model()
    g = [DensePart(np.arange(6, dtype=np.float32)), DensePart(np.ones(4, np.float32))]
    w.push(g, t0=0, wire=WireFormat("f16"))
    _, p1 = w.model()
    np.testing.assert_array_equal(p1, expected_step(p0, g))


MALFORMED = {
    "truncated": lambda good: good[:-3],
    "bad_layout": lambda good: good[:1] + struct.pack("<H", 3) + good[3:],
    "bad_format": lambda good: b"\x07" + good[1:],
    "trailing": lambda good: good + b"\0",
}


def test_malformed_pushes_are_refused_and_the_model_kept(harness):
    h = harness()
    h.start()
    w, other = h.client(worker=0), h.client(worker=1)
    w.pull()
    w.model()
    other.pull()
    _, p0 = other.model()
    good = compression.encode(update(), LAYOUT)
    for reason, corrupt in MALFORMED.items():
        w.push_raw(corrupt(good), t0=0)
        assert w.rejected() == reason
    nan = update(b_val=(float("nan"),))
    w.push(nan, t0=0)
    assert w.rejected() == "non_finite"
    w.push(update(), t0=5)  # from the future
    assert w.rejected() == "future_version"
    assert h.server.version == 0
    np.testing.assert_array_equal(h.server.params, p0)
    expected = {r: 1 for r in MALFORMED} | {"non_finite": 1, "future_version": 1}
    assert dict(h.server.rejections) == expected
    assert len(h.tel.stream("rejections")) == len(expected)
    # The same connection still works, and so does the other one.
    w.push(update(), t0=0)
    header, p1 = w.model()
    assert header.t0 == 1
    np.testing.assert_array_equal(p1, expected_step(p0, update()))
    other.push(update(), t0=0)
    assert other.model()[0].t0 == 2


def test_bad_frames_close_only_their_connection(harness):
    h = harness()
    h.start()
    good = h.client(worker=1)
    good.pull()
    _, p0 = good.model()

    # A frame with another run's token.
    intruder = h.client(worker=0)
    intruder.pull()
    intruder.model()
    message = compression.encode(update(), LAYOUT)
    intruder.sock.sendall(protocol.pack_header(MsgType.PUSH, bytes(16), len(message), worker=0) + message)
    assert intruder.rejected() == "bad_token"
    assert intruder.closed()

    # A header declaring more than the server will ever read (no body follows).
    big = h.client(worker=2)
    big.pull()
    big.model()
    big.sock.sendall(protocol.pack_header(MsgType.PUSH, TOKEN, h.server.max_body + 1, worker=2))
    assert big.rejected() == "oversize"
    assert big.closed()

    # Garbage instead of a header.
    junk = h.client(worker=3)
    junk.sock.sendall(b"GET / HTTP/1.1\r\n" + bytes(40))
    assert junk.rejected() == "bad_magic"

    # No HELLO first.
    rude = h.client(worker=4, hello=False)
    rude.pull()
    assert rude.rejected() == "no_hello"

    # A push from the evaluator.
    ev = h.client(role="evaluator")
    ev.push(update(), t0=0)
    assert ev.rejected() == "push_from_non_worker"

    for reason in ("bad_token", "oversize", "bad_magic", "no_hello", "push_from_non_worker"):
        assert h.server.rejections[reason] == 1, reason
    assert h.server.version == 0
    np.testing.assert_array_equal(h.server.params, p0)
    good.push(update(), t0=0)
    header, p1 = good.model()
    assert header.t0 == 1
    np.testing.assert_array_equal(p1, expected_step(p0, update()))


@pytest.mark.parametrize("hello", [{"role": "worker"}, {"role": "worker", "worker": "x"}, {"role": "worker", "worker": -1}, {"role": "worker", "worker": 2**32}])
def test_bad_hello_is_refused(harness, hello):
    h = harness()
    c = h.client(hello=False)
    c.channel.send(MsgType.HELLO, protocol.json_body(hello))
    assert c.rejected() == "bad_hello"
    assert c.closed()
    assert h.server.rejections["bad_hello"] == 1


def test_push_without_pull(harness):
    h = harness()
    h.start()
    w = h.client(worker=0)
    w.push(update(), t0=0)
    assert w.rejected() == "no_pull"
    w.pull()
    w.model()
    w.push(update(), t0=0)
    assert w.model()[0].t0 == 1


def test_disconnect_forgets_the_worker(harness):
    h = harness()
    h.start()
    w = h.client(worker=7)
    w.pull()
    w.model()
    assert 7 in h.server.rule.at_pull
    w.close()
    for t in h.threads:
        t.join(TIMEOUT)
    assert 7 not in h.server.rule.at_pull
    kinds = [e["kind"] for e in h.tel.stream("events")]
    assert "disconnected" in kinds


def test_reconnected_worker_keeps_its_new_pull(harness):
    """A restarted worker (same id) that connects before its old connection is noticed closed."""
    h = harness()
    h.start()
    old = h.client(worker=5)
    old.pull()
    old.model()
    new = h.client(worker=5)
    new.pull()
    _, p0 = new.model()
    old.close()
    h.threads[0].join(TIMEOUT)
    assert not h.threads[0].is_alive()
    new.push(update(), t0=0)
    header, p1 = new.model()  # the old connection's end must not drop the new one's pull
    assert header.t0 == 1
    np.testing.assert_array_equal(p1, expected_step(p0, update()))


def test_max_updates_then_done_and_late(harness):
    h = harness(max_updates=2)
    h.start()
    a, b = h.client(worker=0), h.client(worker=1)
    for x in (a, b):
        x.pull()
        x.model()
    a.push(update(), t0=0)
    header, _ = a.model()
    assert header.t0 == 1 and not header.flags & Flag.DONE
    a.push(update(), t0=1)
    header, p2 = a.model()
    assert header.t0 == 2 and header.flags & Flag.DONE
    assert h.server.done
    b.push(update(), t0=0)  # computed before the end, arrives after it
    header, p_late = b.model()
    assert header.flags & Flag.DONE and header.t0 == 2
    np.testing.assert_array_equal(p_late, p2)
    assert h.server.rejections["late"] == 1
    assert h.server.version == 2
    b.pull()
    header, _ = b.model()
    assert header.flags & Flag.DONE
    done = [e for e in h.tel.stream("events") if e["kind"] == "training_done"]
    assert len(done) == 1 and done[0]["updates"] == 2


def test_stop_command(harness):
    h = harness()
    w = h.client(worker=0)
    w.pull()
    time.sleep(0.05)
    h.server.control({"cmd": "stop"})  # also releases a pull waiting for the start
    header, _ = w.model()
    assert header.flags & Flag.DONE


def test_shape_command_reaches_the_shaper(harness):
    h = harness()
    h.server.control({"cmd": "shape", "transport": {"downlink_bps": 8e6}})
    assert h.server.shaper.recv_bucket.rate == 1e6
    h.server.control({"cmd": "unknown"})


def test_evaluator_long_poll(harness):
    h = harness()
    h.start()
    w, ev = h.client(worker=0), h.client(role="evaluator")
    assert ev.welcome["version"] == 0
    w.pull()
    w.model()
    ev.pull(t0=2, wait_ms=10_000)
    ev.sock.settimeout(0.2)
    with pytest.raises(socket.timeout):
        ev.sock.recv(1, socket.MSG_PEEK)
    ev.sock.settimeout(TIMEOUT)
    w.push(update(), t0=0)
    _, _ = w.model()
    ev.sock.settimeout(0.2)
    with pytest.raises(socket.timeout):
        ev.sock.recv(1, socket.MSG_PEEK)  # version 1 is not enough
    ev.sock.settimeout(TIMEOUT)
    w.push(update(), t0=1)
    _, p2 = w.model()
    header, params = ev.model()
    assert header.t0 == 2 and not header.flags & Flag.DONE
    np.testing.assert_array_equal(params, p2)
    assert protocol.NO_WORKER not in h.server.rule.at_pull  # the evaluator takes no AdaComp snapshot


def test_evaluator_poll_times_out_with_the_current_model(harness):
    h = harness()
    h.start()
    ev = h.client(role="evaluator")
    start = time.monotonic()
    ev.pull(t0=2**62, wait_ms=200)
    header, _ = ev.model()
    elapsed = time.monotonic() - start
    assert header.t0 == 0 and 0.15 < elapsed < 3.0
    ev.pull(t0=0, wait_ms=10_000)  # already there: at once
    start = time.monotonic()
    assert ev.model()[0].t0 == 0
    assert time.monotonic() - start < 1.0


def test_concurrent_workers(harness):
    """Several workers pushing at once: every update applied once, each with its own version.

    A reply carries the version at the moment it is sent, so two replies may share a later
    version; the versions the updates were applied as are what must be distinct."""
    h = harness(rule="plain")
    h.start()
    workers = [h.client(worker=i) for i in range(6)]
    steps = 25
    seen: list[int] = []
    lock = threading.Lock()
    errors = []

    def run(c):
        try:
            c.pull()
            header, _ = c.model()
            for _ in range(steps):
                c.push([sparse([0], [1.0]), sparse([], [])], t0=header.t0)
                header, _ = c.model()
                with lock:
                    seen.append(header.t0)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in workers]
    p0 = h.server.params.copy()
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    assert h.server.version == 6 * steps
    assert sorted(u["t"] for u in h.tel.stream("updates")) == list(range(1, 6 * steps + 1))
    assert all(1 <= v <= 6 * steps for v in seen)
    assert h.server.params[0] == pytest.approx(p0[0] - ALPHA * 6 * steps, rel=1e-6)
    assert len(h.tel.stream("updates")) == 6 * steps


@pytest.mark.parametrize("wire", [WireFormat(), WireFormat("f32", "raw32")])
def test_any_valid_message_fits_the_frame_limit(harness, wire):
    """topk at c = 1 (a legal setting) sends more than 4 bytes per coordinate: not 'oversize'."""
    big = Layout((TensorSpec("k", (100, 100)), TensorSpec("bias", (100,))))
    h = harness(layout=big.to_json(), rule="plain")
    h.start()
    w = h.client(worker=0)
    w.pull()
    _, p0 = w.model()
    grads = [np.ones(n, np.float32) for n in big.sizes]
    message = compression.encode(compression.build("topk", {"c": 1.0}, big).compress(grads), big, wire)
    assert len(message) > 4 * big.total  # larger than the dense message
    w.push_raw(message, t0=0)
    header, p1 = w.model()
    assert header.t0 == 1
    np.testing.assert_allclose(p1, p0 - np.float32(ALPHA), rtol=1e-6)


def test_a_run_of_non_finite_gradients_ends_training_as_diverged(monkeypatch):
    from emulator.runtime import paramserver

    monkeypatch.setattr(paramserver, "DIVERGED_AFTER", 3)
    tel = RecordingTelemetry()
    server = ParameterServer(server_config(), tel)
    nan = compression.encode([DensePart(np.full(6, np.nan, np.float32)), DensePart(np.zeros(4, np.float32))], LAYOUT)
    for _ in range(3):
        assert server.push(0, 0, memoryview(nan), len(nan)).reason == "non_finite"
    assert server.done
    done = [f for f in tel.stream("events") if f["kind"] == "training_done"]
    assert len(done) == 1 and done[0]["reason"].startswith("diverged")


# -- non-finite gradients: the worker reports them, the server counts them toward divergence --


def nan_gradient() -> list[np.ndarray]:
    return [np.full(6, np.nan, np.float32), np.zeros(4, np.float32)]


def test_the_worker_reports_a_non_finite_gradient_in_a_few_bytes():
    from emulator.runtime.worker import REPORT_BYTES, push_body

    compressor = compression.build("topk", {"c": 0.5}, LAYOUT)
    body, flags = push_body(compressor, nan_gradient(), LAYOUT, WireFormat())
    assert flags == Flag.NON_FINITE
    assert b"k 6" in body and len(body) <= REPORT_BYTES
    finite = [np.arange(6, dtype=np.float32) - 2.5, np.ones(4, np.float32)]
    body, flags = push_body(compressor, finite, LAYOUT, WireFormat())
    assert flags == Flag.NONE
    assert body == compression.encode(compression.build("topk", {"c": 0.5}, LAYOUT).compress(finite), LAYOUT)


def test_a_reported_non_finite_gradient_is_refused_and_counted_toward_divergence(harness, monkeypatch):
    from emulator.runtime import paramserver
    from emulator.runtime.worker import push_body

    monkeypatch.setattr(paramserver, "DIVERGED_AFTER", 3)
    h = harness()
    h.start()
    w = h.client(worker=0)
    w.pull()
    _, p0 = w.model()
    compressor = compression.build("topk", {"c": 0.5}, LAYOUT)

    def report():
        body, flags = push_body(compressor, nan_gradient(), LAYOUT, WireFormat())
        w.channel.send(MsgType.PUSH, body, t0=h.server.version, flags=flags)
        return w.rejected()

    assert [report(), report()] == ["non_finite_gradient"] * 2
    np.testing.assert_array_equal(h.server.params, p0)
    assert h.server.version == 0 and not h.server.done
    w.push(update(), t0=0)  # an applied update: the run of non-finite gradients starts again
    w.model()
    assert [report(), report()] == ["non_finite_gradient"] * 2
    assert not h.server.done
    assert report() == "non_finite_gradient"
    assert h.server.done
    assert h.server.rejections["non_finite_gradient"] == 5
    rows = [r for r in h.tel.stream("rejections") if r["reason"] == "non_finite_gradient"]
    assert len(rows) == 5 and all("k 6" in r["detail"] for r in rows)
    done = [f for f in h.tel.stream("events") if f["kind"] == "training_done"]
    assert len(done) == 1 and done[0]["reason"].startswith("diverged")
    # After the end a report is late, like any push: refused, not counted again.
    w.channel.send(MsgType.PUSH, b"k 6", t0=1, flags=Flag.NON_FINITE)
    header, _ = w.model()
    assert header.flags & Flag.DONE
    assert h.server.rejections["non_finite_gradient"] == 5 and h.server.rejections["late"] == 1


def test_every_refusal_for_nan_or_inf_counts_toward_divergence_and_in_the_summary(monkeypatch):
    """The summary counts as non-finite exactly the reasons the server counts toward divergence."""
    from emulator.runtime import paramserver
    from emulator.control.summary import NON_FINITE_REASONS

    monkeypatch.setattr(paramserver, "DIVERGED_AFTER", 3)
    tel = RecordingTelemetry()
    server = ParameterServer(server_config(rule="plain"), tel)
    huge = compression.encode([DensePart(np.full(6, 3e38, np.float32)), DensePart(np.zeros(4, np.float32))], LAYOUT)
    nan = compression.encode([DensePart(np.full(6, np.nan, np.float32)), DensePart(np.zeros(4, np.float32))], LAYOUT)
    assert [server.push(0, t0, memoryview(huge), len(huge)).reason for t0 in (0, 1)] == [None, None]  # -3e38: still finite
    reasons = [server.push(0, 2, memoryview(nan), len(nan)).reason,
               server.push(0, 2, memoryview(b"k 6"), 41, Flag.NON_FINITE).reason,
               server.push(0, 2, memoryview(huge), len(huge)).reason]
    assert reasons == ["non_finite", "non_finite_gradient", "overflow"]
    assert server.done and server.version == 2  # three in a row: diverged
    assert set(reasons) == NON_FINITE_REASONS
