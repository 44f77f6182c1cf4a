"""Bytes on both bases: the authors' pickled messages (Python 2 cPickle's byte stream, rebuilt)
and this project's compact wire, on the same update."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from analysis import byte_bases
from analysis.byte_bases import AUTHORS_FRAME, HEAP_VALUE_CLASS, HeapValue, cpickle2


class _AuthorsUnpickler(pickle.Unpickler):
    """Python 3 reading a Python 2 pickle of the authors' messages: their float subclass is ours."""

    def find_class(self, module, name):
        if (module, name) == HEAP_VALUE_CLASS:
            return HeapValue
        raise AssertionError(f"unexpected class {module}.{name}")


def load(blob: bytes):
    return _AuthorsUnpickler(io.BytesIO(blob), encoding="bytes").load()


def sparse_update(rng, sizes=(5, 300, 70_000)):
    names = [f"layer{i}/kernel" for i in range(len(sizes))]
    indices = [np.sort(rng.choice(n, size=min(n, 1_500), replace=False)) for n in sizes]
    values = [rng.standard_normal(len(i)).astype(np.float32) for i in indices]
    return names, indices, values


def test_the_sparse_message_is_a_pickle_that_loads_back_to_the_same_update():
    names, indices, values = sparse_update(np.random.default_rng(0))
    blob = byte_bases.authors_sparse_message(names, indices, values, t0=70_000)
    t0, kept_values, kept_indices = load(blob)
    assert t0 == 70_000
    for name, idx, vals in zip(names, indices, values):
        key = f"{name}_grad".encode()
        assert kept_indices[key] == idx.tolist()  # int widths 1, 2 and 4 bytes, batches of 1,000
        assert all(type(v) is HeapValue for v in kept_values[key])
        assert np.array_equal(np.asarray(kept_values[key], np.float32), vals)


def test_the_dense_message_is_a_pickle_of_plain_floats():
    rng = np.random.default_rng(1)
    tensors = [rng.standard_normal(n).astype(np.float32) for n in (3, 2_500)]
    t0, updates = load(byte_bases.authors_dense_message(["a", "b"], tensors, t0=12))
    assert t0 == 12 and np.array_equal(np.asarray(updates[b"b_grad"], np.float32), tensors[1])
    # 9 bytes a value, plus a MARK and an APPENDS per batch of 1,000 and the list's own opcodes.
    assert byte_bases.authors_dense_bytes(["a", "b"], tensors, 12) - AUTHORS_FRAME == pytest.approx(9 * 2_503, abs=60)


def test_a_kept_entry_costs_what_cpickle_writes_for_it():
    """Past the 255th memo entry a value is BINGET(class) 2 + BINFLOAT 9 + TUPLE1 1 + NEWOBJ 1 +
    LONG_BINPUT 5 + EMPTY_DICT 1 + LONG_BINPUT 5 + BUILD 1 = 25 bytes; an index past 65,535 is 5."""
    def size(count):
        values = {b"w": [HeapValue(float(i)) for i in range(count)]}
        indices = {b"w": [100_000 + i for i in range(count)]}
        return len(cpickle2((7, values, indices)))

    assert size(900) - size(800) == 100 * (25 + 5)


def test_python3_pickle_differs_and_is_not_the_basis():
    """Python 3 memoizes the lone tuple of each value (+5 bytes) and drops an empty state: a
    reminder of why the stream is rebuilt rather than taken from Python 3's pickle."""
    values = [HeapValue(float(i)) for i in range(600)]
    assert len(pickle.dumps(values, protocol=2)) != len(cpickle2(values))


@pytest.mark.slow
def test_both_bases_on_the_papers_cnn():
    layout, grads = byte_bases.real_gradient("mnist-5k")
    rows = byte_bases.measure(layout, grads, cs=(0.01, 0.001))
    dense, one, tenth = rows
    assert dense.entries == layout.total == 421_642 and dense.compact_ratio == dense.authors_ratio == 1.0
    # Dense: 4 bytes a value on the compact wire, 9 in the authors' pickle.
    assert dense.compact_bytes == pytest.approx(4 * layout.total, rel=0.001)
    assert dense.authors_bytes == pytest.approx(9 * layout.total, rel=0.01)
    assert one.entries == sum(max(1, int(0.01 * s)) for s in layout.sizes)
    assert 25 <= (one.authors_bytes - AUTHORS_FRAME) / one.entries <= 31
    assert tenth.compact_ratio > one.compact_ratio > one.authors_ratio > 1
    c = byte_bases.c_for_ratio(rows, 191.0, "authors")
    assert c is not None and 0.001 < c < 0.01
