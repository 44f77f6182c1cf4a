"""The parameter server with each federated aggregator, over real localhost sockets and frames.

What the aggregators do is checked against numpy references in test_federated.py; here, that
the server holds pushes, moves its version only on an aggregation, gates pulls by a round's
sample, closes a round at its deadline, refuses a late update, and traces rounds with their bytes.
"""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from compression.parts import DensePart
from emulator.runtime import protocol
from emulator.runtime.models import initial_parameters
from emulator.runtime.protocol import MsgType

from support.paramserver import LAYOUT, TIMEOUT, Client

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


def client(h, worker, examples):
    """A worker that says how many examples its shard holds, as the real worker's HELLO does."""
    c = Client(h.port, "worker", worker, hello=False)
    c.channel.send(MsgType.HELLO, protocol.json_body({"role": "worker", "worker": worker, "incarnation": 0, "examples": examples}))
    header, _ = c.channel.recv()
    assert header.type == MsgType.WELCOME
    h.clients.append(c)
    return c


def delta(value):
    return [DensePart(np.full(size, value, np.float32)) for size in LAYOUT.sizes]


def test_fedbuff_holds_pushes_and_applies_the_buffers_mean(harness):
    h = harness(rule="plain", learning_rate=1.0, aggregation="fedbuff", aggregation_params={"buffer": 2, "staleness": "constant"})
    h.start()
    a, b = client(h, 0, 10), client(h, 1, 30)
    for c in (a, b):
        c.pull()
        c.model()
    theta = initial_parameters(LAYOUT, 3)
    a.push(delta(1.0), t0=0)
    header, held = a.model()
    assert header.t0 == 0 and held.tobytes() == theta.tobytes()  # held: the model as it was
    b.push(delta(3.0), t0=0)
    header, after = b.model()
    assert header.t0 == 1 and h.server.version == 1
    assert after.tobytes() == (theta - np.float32(1.0) * ((np.float32(1.0) * np.full(10, 1, np.float32)
                                                            + np.float32(1.0) * np.full(10, 3, np.float32)) / np.float32(2))).tobytes()
    rows = h.tel.stream("updates")
    assert [r.get("held", False) for r in rows] == [True, False] and [r["t"] for r in rows] == [0, 1]
    (round_,) = h.tel.stream("rounds")
    assert round_["participants"] == 2 and round_["examples"] == 40 and round_["version"] == 1
    assert round_["ingress_bytes"] == sum(r["bytes"] for r in rows)
    assert round_["egress_bytes"] > 0  # the two initial models and the reply to the held push


def test_fedavg_answers_only_the_sampled_clients_and_closes_the_round_when_all_reported(harness):
    h = harness(rule="plain", learning_rate=1.0, aggregation="fedavg", aggregation_params={"sample": 2})
    clients = [client(h, w, 10 * (w + 1)) for w in range(3)]
    h.start()
    for c in clients:
        c.pull()
    chosen = sorted(int(w) for w in np.random.default_rng([3, 1]).choice(3, size=2, replace=False))  # the run's seed is 3
    (left,) = set(range(3)) - set(chosen)
    for w in chosen:
        assert clients[w].model()[0].t0 == 0
    clients[left].sock.settimeout(0.3)
    with pytest.raises(socket.timeout):
        clients[left].sock.recv(1, socket.MSG_PEEK)  # not sampled: its pull waits
    clients[left].sock.settimeout(TIMEOUT)
    theta = initial_parameters(LAYOUT, 3)
    for w in chosen:
        clients[w].push(delta(float(w + 1)), t0=0)
    n = sum(10 * (w + 1) for w in chosen)
    total = np.zeros(LAYOUT.total, np.float32)
    for w in chosen:
        total = total + np.float32(10 * (w + 1) / n) * np.full(LAYOUT.total, w + 1, np.float32)
    expected = theta - np.float32(1.0) * total
    # round 2's sample is answered with the new model; who is not in it waits
    second = sorted(int(w) for w in np.random.default_rng([3, 2]).choice(3, size=2, replace=False))
    for w in second:
        header, params = clients[w].model()
        assert header.t0 == 1 and params.tobytes() == expected.tobytes()
    assert h.server.params.tobytes() == expected.tobytes()
    (round_,) = h.tel.stream("rounds")
    assert (round_["round"], round_["sampled"], round_["participants"], round_["dropped"]) == (1, 2, 2, 0)


def test_fedavg_drops_a_straggler_at_the_deadline_and_refuses_its_late_update(harness):
    h = harness(rule="plain", learning_rate=1.0, aggregation="fedavg", aggregation_params={"sample": 2, "deadline_s": 0.3})
    threading.Thread(target=h.server.tick, daemon=True).start()
    clients = [client(h, w, 5) for w in range(2)]
    h.start()
    for c in clients:
        c.pull()
        assert c.model()[0].t0 == 0
    clients[0].push(delta(2.0), t0=0)  # client 1 is a straggler
    header, params = clients[0].model()  # after the deadline: round 2 opens with both clients again
    assert header.t0 == 1
    assert params.tobytes() == (initial_parameters(LAYOUT, 3) - np.float32(1.0) * (np.float32(1.0) * np.full(10, 2, np.float32))).tobytes()
    clients[1].push(delta(5.0), t0=0)
    assert clients[1].rejected() == "late_for_round"
    clients[1].pull()
    assert clients[1].model()[0].t0 == 1  # and it takes part in round 2
    (round_,) = h.tel.stream("rounds")
    assert round_["dropped"] == 1 and round_["dropped_workers"] == [1] and round_["participants"] == 1
    assert round_["duration_s"] >= 0.3
    assert [r["reason"] for r in h.tel.stream("rejections")] == ["late_for_round"]


def test_fedasync_mixes_each_arrival_in_at_once(harness):
    h = harness(rule="plain", learning_rate=1.0, aggregation="fedasync", aggregation_params={"alpha": 0.5, "staleness": "constant"})
    h.start()
    a = client(h, 0, 1)
    a.pull()
    _, theta = a.model()
    a.push(delta(1.0), t0=0)
    header, after = a.model()
    step = np.float32(0.5) * (theta - (theta - np.full(10, 1, np.float32)))
    assert header.t0 == 1 and after.tobytes() == (theta - np.float32(1.0) * step).tobytes()


USER_AGGREGATOR = '''
import numpy as np
from emulator.runtime.aggregation import Aggregator


class EveryOther(Aggregator):
    """A user's aggregator: applies the sum of every two updates, halved, as one step."""

    name = "every_other"
    takes_model_delta = True
    PARAMS = {"scale": float}

    def __init__(self, layout, rule, seed=0, scale=0.5, **unknown):
        super().__init__(layout, rule, seed, **unknown)
        self.scale = np.float32(scale)
        self.total = np.zeros(layout.total, np.float32)
        self.count = 0

    def receive(self, params, coordinates, worker, staleness, examples, now):
        for target, values in coordinates:
            self.total[target] += values
        self.count += 1
        if self.count < 2:
            return None
        step, self.count = self.scale * self.total, 0
        self.total[:] = 0
        return self.rule.apply_coordinates(params, [(slice(0, self.layout.total), step)], worker, 0)
'''


def test_a_users_aggregator_runs_in_the_server_as_the_built_ins_do(harness, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(USER_AGGREGATOR)
    h = harness(rule="plain", learning_rate=1.0, aggregation=f"{path}:EveryOther", aggregation_params={"scale": 0.25})
    h.start()
    a = client(h, 0, 1)
    a.pull()
    _, theta = a.model()
    a.push(delta(1.0), t0=0)
    assert a.model()[0].t0 == 0  # held
    a.push(delta(3.0), t0=0)
    header, after = a.model()
    assert header.t0 == 1
    assert after.tobytes() == (theta - np.float32(1.0) * (np.float32(0.25) * np.full(10, 4, np.float32))).tobytes()


def test_an_unavailable_client_is_not_sampled_and_a_round_does_not_wait_for_it(harness):
    """The controller says a worker paused (an availability trace's offline spell): the open round
    closes without it at once, and the next rounds sample among the others until it is back."""
    h = harness(rule="plain", learning_rate=1.0, aggregation="fedavg", aggregation_params={"sample": 3, "deadline_s": 60.0})
    threading.Thread(target=h.server.tick, daemon=True).start()
    clients = [client(h, w, 5) for w in range(3)]
    h.start()
    for c in clients:
        c.pull()
        assert c.model()[0].t0 == 0
    clients[0].push(delta(1.0), t0=0)
    clients[1].push(delta(1.0), t0=0)
    h.server.control({"cmd": "availability", "worker": 2, "available": False})
    assert clients[0].model()[0].t0 == 1  # round 1 closed without worker 2, long before its deadline
    assert clients[1].model()[0].t0 == 1
    h.server.control({"cmd": "availability", "worker": 2, "available": True})
    rounds = h.tel.stream("rounds")
    assert [(r["sampled"], r["participants"], r["dropped_workers"]) for r in rounds] == [(3, 2, [2])]
    assert h.server.aggregator._round.sampled == [0, 1]  # round 2 was drawn while worker 2 was away


def test_a_restored_server_numbers_its_rounds_on_from_the_checkpoint(harness, tmp_path):
    import time

    from emulator.runtime import checkpoint
    from emulator.runtime.config import CheckpointConfig

    ckpt = CheckpointConfig(dir=str(tmp_path), every_updates=1, every_s=None)
    fed = {"rule": "plain", "learning_rate": 1.0, "aggregation": "fedbuff", "aggregation_params": {"buffer": 1},
           "checkpoint": ckpt}
    h = harness(**fed)
    h.start()
    a = client(h, 0, 1)
    a.pull()
    a.model()
    for _ in range(3):
        a.push(delta(1.0), t0=h.server.version)
        a.model()
    deadline = time.monotonic() + TIMEOUT
    while checkpoint.load(str(tmp_path)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # a checkpoint still being written finishes
    saved = checkpoint.load(str(tmp_path))[0]
    again = harness(**fed)  # the restarted server
    assert saved >= 1 and again.server.version == saved and again.server.aggregator.rounds == saved
