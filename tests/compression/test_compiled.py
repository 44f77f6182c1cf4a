"""The compiled hot path returns what the numpy code returns, bit for bit, and rejects what it rejects."""

from __future__ import annotations

import numpy as np
import pytest

from compression import compiled, elias_fano
from emulator.runtime.downlink import ChangeLog, _union

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
