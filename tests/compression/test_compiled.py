"""The compiled hot path returns what the numpy code returns, bit for bit, and rejects what it rejects."""

from __future__ import annotations

import numpy as np
import pytest

import compression
from compression import compiled, elias_fano
from compression.layout import Layout, TensorSpec
from compression.parts import DensePart, SparsePart
from emulator.runtime import downlink, rules
from emulator.runtime.downlink import ChangeLog, Holding, _union
from emulator.runtime.models import initial_parameters
from emulator.runtime.protocol import Flag

pytest.importorskip("numba")


@pytest.fixture
def both():
    """Run ``fn`` with the numpy code, then with the compiled loops; returns both results."""

    def run(fn):
        compiled.disable()
        reference = fn()
        assert compiled.enable().startswith("numba")
        try:
            return reference, fn()
        finally:
            compiled.disable()

    return run


def _cases(seed: int, count: int = 150):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(30, 450_000))
        k = int(rng.integers(elias_fano.SMALL + 1, min(n, 20_000)))
        yield n, np.sort(rng.choice(n, k, replace=False)).astype(np.int64)


def test_elias_fano_blocks_and_indices_are_identical(both):
    cases = list(_cases(0))
    reference, fast = both(lambda: [(elias_fano.encode(x, n), elias_fano.decode(elias_fano.encode(x, n), n, x.size))
                                    for n, x in cases])
    for (n, x), (ref_block, ref_x), (block, got) in zip(cases, reference, fast):
        assert block == ref_block
        assert np.array_equal(got, x) and np.array_equal(ref_x, x) and got.dtype == ref_x.dtype


def test_a_corrupted_block_gets_the_numpy_decoders_verdict(both):
    rng = np.random.default_rng(1)
    blocks = []
    for n, x in _cases(2, 200):
        block = bytearray(elias_fano.encode(x, n))
        block[int(rng.integers(len(block)))] ^= 1 << int(rng.integers(8))
        blocks.append((bytes(block), n, x.size))

    def outcomes():
        out = []
        for block, n, k in blocks:
            try:
                out.append(("ok", elias_fano.decode(block, n, k).tolist()))
            except elias_fano.EliasFanoError as exc:
                out.append(("error", str(exc)))
        return out

    reference, fast = both(outcomes)
    assert fast == reference
    assert sum(kind == "error" for kind, _ in reference) > 50  # the flips are caught, not only passed through


def test_the_change_logs_answers_are_identical(both):
    total = 50_000
    rng = np.random.default_rng(3)
    updates = [np.sort(rng.choice(total, int(rng.integers(1, 900)), replace=False)) for _ in range(60)]

    def answers():
        log = ChangeLog(total, 0, budget=total // 4)
        out = []
        for version, idx in enumerate(updates, start=1):
            log.record([idx], version)
            out += [log.since(v) for v in range(max(0, version - 20), version + 1)]
        return out

    reference, fast = both(answers)
    assert len(reference) == len(fast)
    for ref, got in zip(reference, fast):
        assert np.array_equal(ref, got) and ref.dtype == got.dtype


def test_the_compiled_union_is_numpys_union():
    assert compiled.enable().startswith("numba")
    try:
        kernels = compiled.kernels()
        rng = np.random.default_rng(4)
        words = np.zeros(10_000 // 64 + 1, np.uint64)
        for _ in range(50):
            arrays = [np.sort(rng.choice(10_000, int(rng.integers(0, 500)), replace=False)).astype(np.int32)
                      for _ in range(int(rng.integers(2, 9)))]
            merged = np.concatenate(arrays)
            out = np.empty(merged.size, np.int64)
            got = out[: kernels.sorted_union(merged, words, out)]
            assert np.array_equal(got, _union(arrays))
            assert not words.any()  # the scratch bitmap is clean for the next call
    finally:
        compiled.disable()


def test_emulate_compiled_0_keeps_numpy(monkeypatch):
    compiled.disable()
    monkeypatch.setenv("EMULATE_COMPILED", "0")
    assert compiled.enable() == "numpy (EMULATE_COMPILED=0)"
    assert compiled.kernels() is None
    compiled.disable()


# -- the server's per-message loops ------------------------------------------------------------------

LAYOUT = Layout((TensorSpec("kernel", (40, 30)), TensorSpec("bias", (12,)), TensorSpec("big", (5000,)), TensorSpec("out", (3,))))


def _message(rng, density: float, dense_up_to: int = LAYOUT.total) -> bytes:
    """A push as top-k methods send it: per tensor a sparse part, or (now and then, for tensors of
    at most ``dense_up_to`` coordinates, and whenever all are kept) a dense one."""
    parts = []
    for n in LAYOUT.sizes:
        k = int(rng.binomial(n, density))
        if k == n or (n <= dense_up_to and rng.random() < 0.1):
            parts.append(DensePart(rng.normal(size=n).astype(np.float32)))
        else:
            idx = np.sort(rng.choice(n, k, replace=False)).astype(np.int64)
            parts.append(SparsePart(idx, rng.normal(size=k).astype(np.float32)))
    return compression.encode(parts, LAYOUT)


def _flat_coordinates(parts):
    indices, values = [], []
    for part, offset, n in zip(parts, LAYOUT.offsets, LAYOUT.sizes):
        idx, vals = part.coordinates(n)
        indices.append(np.arange(n) + offset if idx is None else idx + offset)
        values.append(vals)
    return np.concatenate(indices), np.concatenate(values)


def test_the_flat_decoder_reads_what_the_codec_reads_and_leaves_it_every_doubtful_message():
    rng = np.random.default_rng(5)
    messages = [_message(rng, d) for d in (0.0, 0.001, 0.01, 0.2, 0.97) for _ in range(8)]
    corrupted = []
    for message in messages:
        for _ in range(6):
            damaged = bytearray(message)
            damaged[int(rng.integers(len(damaged)))] ^= 1 << int(rng.integers(8))
            corrupted.append(bytes(damaged))
    corrupted += [m[:-1] for m in messages[:5]] + [m + b"\0" for m in messages[:5]]
    corrupted.append(compression.encode([DensePart(np.full(n, np.nan, np.float32)) for n in LAYOUT.sizes], LAYOUT))
    compiled.disable()
    assert compression.decode_flat(messages[0], LAYOUT) is None  # off unless enabled
    assert compiled.enable().startswith("numba")
    try:
        taken = 0
        for message in messages:
            flat = compression.decode_flat(message, LAYOUT)
            ref_indices, ref_values = _flat_coordinates(compression.decode(message, LAYOUT))
            if 4 * ref_indices.size > LAYOUT.total:
                assert flat is None  # a dense-ish update goes by slices
                continue
            indices, values = flat
            assert np.array_equal(indices, ref_indices) and indices.dtype == np.int64
            assert values.tobytes() == ref_values.tobytes()
            taken += 1
        assert taken >= 20
        refused = 0
        for message in corrupted:
            flat = compression.decode_flat(message, LAYOUT)
            try:
                reference = _flat_coordinates(compression.decode(message, LAYOUT))
            except compression.CodecError:
                assert flat is None  # the numpy codec names the reason
                refused += 1
                continue
            if flat is not None:  # a flip the format cannot see (a value bit): both read the same
                assert np.array_equal(flat[0], reference[0]) and flat[1].tobytes() == reference[1].tobytes()
        assert refused > 40
        other = compression.build("qsgd", {"s": 4}, LAYOUT)
        grads = [rng.normal(size=n).astype(np.float32) for n in LAYOUT.sizes]
        assert compression.decode_flat(compression.encode(other.compress(grads), LAYOUT), LAYOUT) is None
    finally:
        compiled.disable()


@pytest.mark.parametrize("name", ["adacomp", "plain", "staleness"])
def test_the_compiled_update_writes_the_numpy_updates_numbers(name):
    """Same model bit for bit, same counters, over pushes by three workers with pulls between."""
    rng = np.random.default_rng(6)
    pushes = [(int(rng.integers(3)), _message(rng, 0.05, dense_up_to=100), bool(rng.random() < 0.4)) for _ in range(60)]

    def run(flat: bool):
        params = initial_parameters(LAYOUT, 1)
        rule = rules.build(name, LAYOUT, 0.3)
        for w in range(3):
            rule.on_pull(w)
        reports = []
        for w, message, pull in pushes:
            if flat:
                applied = rule.apply_flat(params, *compression.decode_flat(message, LAYOUT), w, 1 + w)
            else:
                applied = rule.apply(params, compression.decode(message, LAYOUT), w, 1 + w)
            reports.append((applied.entries, applied.mean_scale, applied.mean_sigma))
            if pull:
                rule.on_pull(w)
        return params, rule.state(), reports

    compiled.disable()
    reference = run(False)
    assert compiled.enable().startswith("numba")
    try:
        fast = run(True)
    finally:
        compiled.disable()
    assert fast[0].tobytes() == reference[0].tobytes()
    for key in reference[1]:
        assert np.array_equal(fast[1][key], reference[1][key])
    for (entries, scale, sigma), (ref_entries, ref_scale, ref_sigma) in zip(fast[2], reference[2]):
        assert entries == ref_entries and scale == pytest.approx(ref_scale, rel=1e-5)
        assert sigma == ref_sigma or sigma == pytest.approx(ref_sigma)


def test_a_compiled_update_that_would_overflow_writes_nothing():
    assert compiled.enable().startswith("numba")
    try:
        params = np.full(LAYOUT.total, 3e38, np.float32)
        rule = rules.build("adacomp", LAYOUT, 1.0)
        rule.on_pull(0)
        before, counters = params.copy(), rule.touches.copy()
        indices = np.array([0, 5, 1300], np.int64)
        with pytest.raises(rules.RuleError, match="overflow"):
            rule.apply_flat(params, indices, np.array([1.0, -3e38, 1.0], np.float32), 0, 1)
        assert params.tobytes() == before.tobytes() and np.array_equal(rule.touches, counters)
    finally:
        compiled.disable()


def test_a_compiled_float32_delta_is_the_numpy_deltas_bytes():
    rng = np.random.default_rng(7)
    params = rng.normal(size=LAYOUT.total).astype(np.float32)
    cases = [np.flatnonzero(rng.random(LAYOUT.total) < density) for density in (0.0, 0.002, 0.05, 0.5, 0.9, 1.0)
             for _ in range(5)]

    def replies():
        out = []
        for changed in cases:
            log = ChangeLog(LAYOUT.total, 0)
            log.record([changed.astype(np.int64)], 1)
            holding = Holding("f32")
            holding.version = 0
            reply = downlink.finish(downlink.prepare(holding, params, 1, log, LAYOUT, params.tobytes), holding, LAYOUT)
            out.append((bytes(reply.body), reply.flags, reply.base, reply.entries))
        return out

    compiled.disable()
    reference = replies()
    assert compiled.enable().startswith("numba")
    try:
        fast = replies()
    finally:
        compiled.disable()
    assert fast == reference
    assert {flags for _, flags, _, _ in reference} == {0, int(Flag.DELTA)}  # both forms were exercised
