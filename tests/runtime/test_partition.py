"""The model split over several servers: the partitions' bounds, the cut of an update, and
the property that matters: a fixed sequential schedule of pushes and pulls leaves the same model,
bit for bit, on 1, 2 and 4 shards, for every rule and pull mode, on the real server objects."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compression
from compression.layout import Layout, TensorSpec
from compression import compiled
from compression.parts import DensePart, SparsePart
from emulator.runtime import partition
from emulator.runtime.downlink import Holding, ModelCopy
from emulator.runtime.paramserver import ParameterServer
from emulator.runtime.partition import ByTensor, KeyRanges, PartitionError
from support.paramserver import RecordingTelemetry, server_config

BIG = Layout((TensorSpec("kernel", (30, 20)), TensorSpec("bias", (8,)), TensorSpec("out", (50,)), TensorSpec("b2", (5,))))
CNN = Layout((TensorSpec("conv1/kernel", (5, 5, 1, 32)), TensorSpec("conv1/bias", (32,)),
              TensorSpec("conv2/kernel", (5, 5, 32, 64)), TensorSpec("conv2/bias", (64,)),
              TensorSpec("fc1/kernel", (3136, 128)), TensorSpec("fc1/bias", (128,)),
              TensorSpec("fc2/kernel", (128, 10)), TensorSpec("fc2/bias", (10,))))  # not the paper's sizes; a shape like it
LOOPS = pytest.mark.parametrize("loops", ["numpy", "numba"])
PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextlib.contextmanager
def running(loops: str):
    """The servers' hot path as numpy code or as the compiled loops."""
    compiled.disable()
    if loops == "numba":
        pytest.importorskip("numba")
        assert compiled.enable().startswith("numba")
    try:
        yield
    finally:
        compiled.disable()


# -- the bounds -------------------------------------------------------------------------------------


@pytest.mark.parametrize("split", list(partition.PARTITIONS))
@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_every_coordinate_lives_on_exactly_one_shard(split, shards):
    p = partition.build(BIG, shards, split)
    covered = np.zeros(BIG.total, int)
    for i, (lo, hi) in enumerate(zip(p.bounds, p.bounds[1:])):
        assert p.layouts[i].total == hi - lo > 0
        covered[lo:hi] += 1
    assert (covered == 1).all()
    model = np.arange(BIG.total, dtype=np.float32)
    assert p.assemble([m.copy() for m in p.split_model(model)]).tobytes() == model.tobytes()


def test_key_ranges_balance_the_model_and_tensors_cannot_when_one_tensor_dominates():
    ranges, tensors = KeyRanges(CNN, 4), ByTensor(CNN, 4)
    sizes = [hi - lo for lo, hi in zip(ranges.bounds, ranges.bounds[1:])]
    assert max(sizes) - min(sizes) <= 1
    whole = [hi - lo for lo, hi in zip(tensors.bounds, tensors.bounds[1:])]
    assert max(whole) >= CNN.sizes[4]  # fc1/kernel is on one shard, whole
    assert all(p.whole for pieces in tensors.pieces for p in pieces)
    assert sum(not p.whole for pieces in ranges.pieces for p in pieces) >= 1


@pytest.mark.parametrize("split, shards", [("tensors", 5), ("ranges", BIG.total + 1), ("ranges", 0), ("tensors", -1)])
def test_a_split_the_model_cannot_have_is_refused_naming_shards(split, shards):
    with pytest.raises(PartitionError, match="shards"):
        partition.build(BIG, shards, split)


def test_an_unknown_split_is_refused_naming_it():
    with pytest.raises(PartitionError, match="split"):
        partition.build(BIG, 2, "hash")


# -- the cut of an update -----------------------------------------------------------------------------


def random_parts(rng, layout=BIG) -> list:
    parts = []
    for n in layout.sizes:
        kind = rng.integers(3)
        if kind == 0:
            parts.append(DensePart(rng.normal(size=n).astype(np.float32)))
        else:
            k = int(rng.integers(0, n + 1)) if kind == 1 else 0  # some tensors sent nothing
            idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
            parts.append(SparsePart(idx, rng.normal(size=k).astype(np.float32)))
    return parts


@pytest.mark.parametrize("split", list(partition.PARTITIONS))
@pytest.mark.parametrize("shards", [2, 4])
def test_the_cut_carries_every_coordinate_once_with_its_value(split, shards):
    p = partition.build(BIG, shards, split)
    rng = np.random.default_rng(4)
    for _ in range(20):
        parts = random_parts(rng)
        dense = np.concatenate([part.dense(n) for part, n in zip(parts, BIG.sizes)])
        cut = p.split(parts)
        assert len(cut) == shards
        pieces = []
        for i, mine in enumerate(cut):
            layout = p.layouts[i]
            decoded = compression.decode(compression.encode(mine, layout), layout)  # each shard's message is valid
            pieces.append(np.concatenate([part.dense(n) for part, n in zip(decoded, layout.sizes)]))
        assert np.concatenate(pieces).tobytes() == dense.tobytes()


# -- the property: 1, 2 and 4 shards, the same model --------------------------------------------------


class Servers:
    """Every shard's server object, and each worker's copies of each shard (the worker's side of
    the split: one message per shard per push, a pull from every shard)."""

    def __init__(self, rule, shards, split, pull, workers=3):
        self.p = partition.build(BIG, shards, split)
        cfg = dict(layout=BIG.to_json(), seed=5, rule=rule, learning_rate=0.05,
                   partition=None if shards == 1 else self.p.to_json())
        self.servers = [ParameterServer(server_config(shard=i, **cfg), RecordingTelemetry()) for i in range(shards)]
        for ps in self.servers:
            ps.control({"cmd": "start"})
        self.pull_mode = pull
        self.holdings = [[None if pull == "dense" else Holding(pull) for _ in range(shards)] for _ in range(workers)]
        self.copies = [[ModelCopy(self.p.layouts[i]) for i in range(shards)] for _ in range(workers)]

    def pull(self, w):
        for i, ps in enumerate(self.servers):
            reply, _ = ps.pull(w, self.holdings[w][i])
            self.copies[w][i].receive(reply.version, reply.flags, reply.body)

    def push(self, w, parts):
        for i, (ps, mine) in enumerate(zip(self.servers, self.p.split(parts))):
            body = compression.encode(mine, self.p.layouts[i])
            assert ps.push(w, self.copies[w][i].version, memoryview(body), len(body)).reason is None

    def model(self):
        return self.p.assemble([ps.params for ps in self.servers])

    def copy(self, w):
        return self.p.assemble([c.params for c in self.copies[w]])

    def versions(self):
        return {ps.version for ps in self.servers}


def replay(schedule, rule, shards, split, pull):
    servers = Servers(rule, shards, split, pull)
    for w in range(3):
        servers.pull(w)
    for op, w, seed in schedule:
        if op == "pull":
            servers.pull(w)
        else:
            servers.push(w, random_parts(np.random.default_rng(seed)))
            if op == "push":
                servers.pull(w)
    assert len(servers.versions()) == 1  # every push reached every shard
    return servers


SCHEDULES = st.lists(st.tuples(st.sampled_from(["push", "pull", "push_no_model"]), st.integers(0, 2),
                               st.integers(0, 2**31)), min_size=1, max_size=25)


@LOOPS
@PROPERTY
@given(SCHEDULES, st.sampled_from(["plain", "staleness", "adacomp"]), st.sampled_from(["dense", "f32", "f16"]),
       st.sampled_from(list(partition.PARTITIONS)))
def test_a_sequential_schedule_leaves_the_same_model_on_1_2_and_4_shards(loops, schedule, rule, pull, split):
    """Random pushes (dense, sparse and empty parts) and pulls by three workers: the model and
    every worker's copy after the schedule are the same bytes whatever the number of shards."""
    with running(loops):
        one = replay(schedule, rule, 1, split, pull)
        for shards in (2, 4):
            many = replay(schedule, rule, shards, split, pull)
            assert many.model().tobytes() == one.model().tobytes()
            assert many.versions() == one.versions()
            for w in range(3):
                assert many.copy(w).tobytes() == one.copy(w).tobytes()


def test_one_shard_is_the_server_of_old():
    """``partition`` None and a partition into one shard are the same server, bit for bit."""
    old = ParameterServer(server_config(layout=BIG.to_json(), seed=5), RecordingTelemetry())
    new = ParameterServer(server_config(layout=BIG.to_json(), seed=5, partition=partition.build(BIG, 1).to_json()),
                          RecordingTelemetry())
    assert old.layout == new.layout and old.params.tobytes() == new.params.tobytes()


# -- what a worker sends: every compressor's update, cut for the servers --------------------------------


@pytest.mark.parametrize("values", ["f32", "f16"])
@pytest.mark.parametrize("name", sorted(compression.COMPRESSORS))
def test_every_compressor_s_push_cut_for_4_servers_is_the_update_one_server_applies(name, values):
    """The worker's messages for 4 servers (balanced ranges, cut inside tensors) decode, put side by
    side, to exactly the coordinates and values one server decodes from the whole message."""
    from compression.parts import WireFormat
    from emulator.runtime.worker import push_bodies

    rng = np.random.default_rng(7)
    wire = WireFormat(values=values)
    grads = [rng.normal(size=n).astype(np.float32) for n in BIG.sizes]
    one, four = partition.build(BIG, 1), partition.build(BIG, 4)
    whole, _ = push_bodies(compression.build(name, {}, BIG, 3), grads, one, wire)
    cut, _ = push_bodies(compression.build(name, {}, BIG, 3), grads, four, wire)
    assert len(cut) == 4

    def dense(messages, split):
        out = []
        for body, layout in zip(messages, split.layouts):
            out += [part.dense(n) for part, n in zip(compression.decode(body, layout), layout.sizes)]
        return np.concatenate(out)

    assert dense(cut, four).tobytes() == dense(whole, one).tobytes()
