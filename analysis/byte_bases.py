"""Bytes per update on two bases: this project's compact wire, and the authors' pickled messages.

The paper's 191x was measured on the authors' own messages (their released code, 2017): a
4-byte length and a 1-byte command, then Python 2 ``cPickle.dumps(..., protocol=-1)`` (protocol
2) of

- a dense push: ``[t0, {name: values.tolist()}]``, every value a Python float;
- a sparse push: ``(t0, {name: [values]}, {name: [indices]})``, every value an instance of a
  float subclass (their top-k heap orders values by magnitude), every index a Python int.

No Python 2 runs here, and Python 3's pickle writes these structures differently (it memoizes
every tuple; cPickle skips objects with a single reference), so :func:`cpickle2` writes the
byte stream cPickle writes, by its rules, for exactly these types: a float is ``BINFLOAT`` (9
bytes), an int ``BININT1``/``BININT2``/``BININT`` (2, 3 or 5), a byte string key
``SHORT_BINSTRING``; lists and dicts are ``EMPTY_LIST``/``EMPTY_DICT``, a memo entry, then items
in batches of 1,000 between ``MARK`` and ``APPENDS``/``SETITEMS``; a float-subclass instance is
its class (``GLOBAL`` once, then a memo get), its float in a ``TUPLE1`` that is not memoized,
``NEWOBJ``, a memo entry, and its empty instance ``__dict__`` as state (``EMPTY_DICT``, a memo
entry, ``BUILD``: Python 2 returns ``__dict__`` as the state even when it is empty). Memo
entries are numbered from 1 and take 2 bytes below 256, 5 above. The stream is a valid pickle:
Python 3 loads it back to the same values (a test checks that), which is how it is verified here.

The compact wire is the codec the emulator really sends (Elias-Fano indices, float32 values,
the frame header), measured by encoding the same update. ``python -m analysis.byte_bases``
prints both for the paper's CNN on a real gradient across c.
"""

from __future__ import annotations

import argparse
import struct
import sys
from dataclasses import dataclass

import numpy as np

AUTHORS_FRAME = 5  # their 4-byte big-endian length and 1-byte command ('P' for a push)
DEFAULT_CS = (0.01, 0.005, 0.0025, 0.001)
PAPER_RATIO = 191.0
BATCH = 1000  # cPickle writes list items and dict entries in batches of this many
HEAP_VALUE_CLASS = ("Communication", "backwards")  # module and name of the authors' float subclass


class HeapValue(float):
    """A float that the authors' top-k heap orders by magnitude; written as cPickle writes an
    instance of a float subclass."""


class _CPickle2:
    """cPickle protocol 2's byte stream for ints, floats, byte strings, lists, dicts, tuples and
    HeapValue, with its memo rules (see the module docstring)."""

    def __init__(self):
        self.out = bytearray(b"\x80\x02")
        self.memo_size = 0
        self.class_index: int | None = None

    def put(self) -> int:
        self.memo_size += 1
        index = self.memo_size
        self.out += b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index)
        return index

    def get(self, index: int) -> None:
        self.out += b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)

    def save(self, obj, memoize: bool = True) -> None:
        if isinstance(obj, HeapValue):
            self.heap_value(obj)
        elif isinstance(obj, bool) or obj is None:
            raise TypeError(f"not part of the authors' messages: {obj!r}")
        elif isinstance(obj, int):
            self.integer(obj)
        elif isinstance(obj, float):
            self.out += b"G" + struct.pack(">d", obj)
        elif isinstance(obj, bytes):
            self.out += (b"U" + bytes([len(obj)]) if len(obj) < 256 else b"T" + struct.pack("<I", len(obj))) + obj
            self.put()
        elif isinstance(obj, tuple):
            self.tuple(obj, memoize)
        elif isinstance(obj, list):
            self.out += b"]"
            if memoize:
                self.put()
            self.batches(obj, b"a", b"e", lambda item: self.save(item))
        elif isinstance(obj, dict):
            self.out += b"}"
            if memoize:
                self.put()
            self.batches(list(obj.items()), b"s", b"u", lambda kv: (self.save(kv[0]), self.save(kv[1])))
        else:
            raise TypeError(f"not part of the authors' messages: {type(obj).__name__}")

    def integer(self, value: int) -> None:
        if 0 <= value < 256:
            self.out += b"K" + bytes([value])
        elif 0 <= value < 65536:
            self.out += b"M" + struct.pack("<H", value)
        elif -(2 ** 31) <= value < 2 ** 31:
            self.out += b"J" + struct.pack("<i", value)
        else:
            raise ValueError(f"an index beyond 32 bits: {value}")

    def tuple(self, items: tuple, memoize: bool) -> None:
        if len(items) > 3:
            raise TypeError("the authors' messages hold tuples of at most 3 items")
        for item in items:
            self.save(item)
        self.out += {0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(items)]
        if memoize:
            self.put()

    def batches(self, items: list, one: bytes, many: bytes, write) -> None:
        for start in range(0, len(items), BATCH):
            chunk = items[start:start + BATCH]
            if len(chunk) == 1:
                write(chunk[0])
                self.out += one
            else:
                self.out += b"("
                for item in chunk:
                    write(item)
                self.out += many

    def heap_value(self, value: HeapValue) -> None:
        if self.class_index is None:
            module, name = HEAP_VALUE_CLASS
            self.out += b"c" + f"{module}\n{name}\n".encode()
            self.class_index = self.put()
        else:
            self.get(self.class_index)
        self.out += b"G" + struct.pack(">d", float(value)) + b"\x85"  # its __getnewargs__, a lone tuple: no memo
        self.out += b"\x81"  # NEWOBJ
        self.put()
        self.out += b"}"  # the empty instance __dict__, memoized, then BUILD
        self.put()
        self.out += b"b"


def cpickle2(obj, top_level_memo: bool = False) -> bytes:
    """What Python 2's ``cPickle.dumps(obj, 2)`` writes for the authors' message structures.

    The top-level container is a temporary with one reference, which cPickle does not memoize."""
    writer = _CPickle2()
    writer.save(obj, memoize=top_level_memo)
    writer.out += b"."
    return bytes(writer.out)


def _key(name: str) -> bytes:
    """Their dictionary keys are the gradient variables' op names (the weight's name + ``_grad``)."""
    return f"{name}_grad".encode()


def authors_dense_message(names: list[str], tensors: list[np.ndarray], t0: int) -> bytes:
    """The pickle of the authors' dense push of ``tensors`` (one array per name), without its frame."""
    return cpickle2([t0, {_key(n): np.asarray(t, np.float32).ravel().tolist() for n, t in zip(names, tensors)}])


def authors_sparse_message(names: list[str], indices: list[np.ndarray], values: list[np.ndarray], t0: int) -> bytes:
    """The pickle of the authors' sparse push (per tensor, kept flat indices and values), without its frame."""
    kept_values = {_key(n): [HeapValue(v) for v in np.asarray(vals, np.float32).tolist()] for n, vals in zip(names, values)}
    kept_indices = {_key(n): [int(i) for i in idx] for n, idx in zip(names, indices)}
    return cpickle2((t0, kept_values, kept_indices))


def authors_dense_bytes(names: list[str], tensors: list[np.ndarray], t0: int) -> int:
    return AUTHORS_FRAME + len(authors_dense_message(names, tensors, t0))


def authors_sparse_bytes(names: list[str], indices: list[np.ndarray], values: list[np.ndarray], t0: int) -> int:
    return AUTHORS_FRAME + len(authors_sparse_message(names, indices, values, t0))


@dataclass(frozen=True)
class BasesRow:
    """One setting measured on both bases; ratios are dense bytes over this setting's bytes."""

    label: str
    c: float | None
    entries: int
    compact_bytes: int
    authors_bytes: int
    compact_ratio: float
    authors_ratio: float


def compact_bytes(compressor, grads: list[np.ndarray], layout) -> tuple[int, int]:
    """(frame bytes the emulator sends for this update, entries kept) with the real codec."""
    from compression import codec
    from emulator.runtime.protocol import HEADER

    parts = compressor.compress(grads)
    entries = sum(int(getattr(p, "entries", 0) or 0) for p in parts)
    return HEADER.size + len(codec.encode(parts, layout)), entries


def measure(layout, grads: list[np.ndarray], cs=DEFAULT_CS, t0: int = 50_000) -> list[BasesRow]:
    """Dense and top-c pushes of one gradient, each on both bases (t0: a typical update counter)."""
    from compression import build
    from compression.topk import keep_count, top_magnitude

    names = [t.name for t in layout.tensors]
    dense_compact, _ = compact_bytes(build("dense", {}, layout), grads, layout)
    dense_authors = authors_dense_bytes(names, grads, t0)
    rows = [BasesRow("dense (ASGD)", None, layout.total, dense_compact, dense_authors, 1.0, 1.0)]
    for c in cs:
        wire, entries = compact_bytes(build("topk", {"c": c}, layout), grads, layout)
        indices = [top_magnitude(g.ravel(), keep_count(g.size, c)) for g in grads]
        values = [g.ravel()[i] for g, i in zip(grads, indices)]
        authors = authors_sparse_bytes(names, indices, values, t0)
        rows.append(BasesRow(f"top-k c = {c:.2%}", c, sum(len(i) for i in indices), wire, authors,
                             dense_compact / wire, dense_authors / authors))
    return rows


def c_for_ratio(rows: list[BasesRow], ratio: float, basis: str) -> float | None:
    """The c at which a basis reaches ``ratio``, interpolated log-log between measured c's (bytes are
    close to affine in the kept entries, so the ratio is close to a power of c)."""
    points = sorted((r.c, getattr(r, f"{basis}_ratio")) for r in rows if r.c)
    for (c_lo, r_lo), (c_hi, r_hi) in zip(points, points[1:]):
        if min(r_lo, r_hi) <= ratio <= max(r_lo, r_hi):
            slope = (np.log(r_hi) - np.log(r_lo)) / (np.log(c_hi) - np.log(c_lo))
            return float(np.exp(np.log(c_lo) + (np.log(ratio) - np.log(r_lo)) / slope))
    return None


def markdown(rows: list[BasesRow]) -> list[str]:
    lines = ["| push | entries kept | compact wire (B) | ratio to dense | authors' pickled format (B) | ratio to dense | "
             "bytes per kept entry (authors') |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        per_entry = f"{(r.authors_bytes - AUTHORS_FRAME) / r.entries:.1f}" if r.entries else "-"
        lines.append(f"| {r.label} | {r.entries:,} | {r.compact_bytes:,} | {r.compact_ratio:.1f}x | {r.authors_bytes:,} | "
                     f"{r.authors_ratio:.1f}x | {per_entry} |")
    for basis, title in (("authors", "the authors' format"), ("compact", "the compact wire")):
        c = c_for_ratio(rows, PAPER_RATIO, basis)
        where = f"c = {c:.3%} (interpolated between the measured c)" if c else "outside the measured range of c"
        lines.append("")
        lines.append(f"{PAPER_RATIO:.0f}x per update on {title}: {where}.")
    return lines


def real_gradient(dataset: str, batch: int = 10, seed: int = 0) -> tuple[object, list[np.ndarray]]:
    """(layout, per-tensor gradients) of the paper's CNN at its initial weights on one real batch."""
    from emulator import datasets
    from emulator.runtime.data import standardize
    from emulator.runtime.models import TFModel, get, initial_parameters

    data = datasets.load(dataset)
    model = TFModel(get("mnist_cnn"), data.input_shape, data.classes, 1)
    pick = np.random.default_rng(seed).choice(len(data.x_train), batch, replace=False)
    x, y = standardize(data.x_train[pick]), data.y_train[pick].astype(np.int32)
    _, flat = model.gradient(initial_parameters(model.layout, seed), x, y)
    layout = model.layout
    return layout, [flat[o:o + s] for o, s in zip(layout.offsets, layout.sizes)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.byte_bases", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default=None, help="default: the best available (mnist, fashion-mnist, mnist-5k)")
    parser.add_argument("--c", type=float, nargs="*", default=list(DEFAULT_CS))
    args = parser.parse_args(argv)
    from emulator import datasets

    name = args.dataset or datasets.best_available(("mnist", "fashion-mnist", "mnist-5k")).name
    layout, grads = real_gradient(name)
    print(f"The paper's CNN ({layout.total:,} parameters), one batch-10 gradient of {name} at the initial weights:\n")
    print("\n".join(markdown(measure(layout, grads, tuple(args.c)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["BasesRow", "HeapValue", "authors_dense_bytes", "authors_dense_message", "authors_sparse_bytes",
           "authors_sparse_message", "c_for_ratio", "cpickle2", "markdown", "measure"]
