"""Bad input: bounded coverage-guided fuzzing (atheris) and property tests of every refusal.

Two fuzz targets, each run by atheris in a subprocess of its own (libFuzzer owns its argv and
ends the process), seeded, for a bounded number of executions:

* ``frame``: a byte stream read as consecutive frames (header parser, then the body) through
  :func:`protocol.recv_frame` or a :class:`Channel`, from a memory socket. Only
  ``ProtocolError`` may come out; a body is never read (nor a buffer allocated) beyond the
  receiver's limit; a close mid-frame is told apart from a close between frames.
* ``update``: ``2 bytes of control + a codec message``: :func:`compression.decode`, then the
  decoded parts applied by every update rule (plain, staleness, adacomp) to long-lived
  parameters, as a server does. Only ``CodecError``/``RuleError`` may come out, what decodes
  is applicable (finite, in range, sized), a refused update leaves the model untouched, and
  the parameters stay finite.

Property tests (hypothesis) cover what the unit tests of tests/compression/
do not: every float of every part kind made NaN or Inf, duplicate,
disordered and out-of-range indices in both index codings, any other body length, bodies read
under other flags, every unknown version, type, kind and flag byte; and the server counting
every refusal by reason in its traces.

``EMU_FUZZ_RUNS`` / ``EMU_FUZZ_SECONDS`` raise the fuzzers' budget (e.g. 1,000,000 runs, 600 s),
``EMU_PROPERTY_EXAMPLES`` the property tests' (150 examples each by default).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compression
from compression import elias_fano
from compression.codec import CodecError, decode, encode
from compression.layout import Layout, TensorSpec
from compression.parts import (
    FLAG_F16_VALUES, FLAG_RAW32_INDICES, KNOWN_FLAGS, MAX_LEVELS, PART_KINDS, DensePart, HalfPart, LowRankPart, Part,
    QuantizedPart, SignPart, SparseLevelsPart, SparsePart, SparseSignPart, write_indices,
)
from emulator.runtime import protocol, rules
from emulator.runtime.models import initial_parameters
from emulator.runtime.protocol import HEADER, MsgType, ProtocolError
from emulator.runtime.transport import Channel

ROOT = Path(__file__).resolve().parents[2]
FUZZ_RUNS = int(os.environ.get("EMU_FUZZ_RUNS", 20_000))
FUZZ_SECONDS = int(os.environ.get("EMU_FUZZ_SECONDS", 20))
FUZZ_SEED = 20171030  # NCA 2017

TOKEN = bytes(range(16))
LIMITS = (0, HEADER.size, 4096, 1 << 20)  # receivers' body limits the frame target picks from
JSON_TYPES = {MsgType.HELLO, MsgType.WELCOME, MsgType.REJECT, MsgType.TRACE, MsgType.CONTROL}
# Sizes 30 (a 6 x 5 matrix: low-rank parts), 7 (a bias) and 40; the names pick the initial values.
LAYOUT = Layout((TensorSpec("a/kernel", (6, 5)), TensorSpec("a/bias", (7,)), TensorSpec("b/kernel", (40,))))
RULE_NAMES = tuple(sorted(rules.RULES))
ALL_FLAGS = (0, FLAG_F16_VALUES, FLAG_RAW32_INDICES, FLAG_F16_VALUES | FLAG_RAW32_INDICES)


# ---------------------------------------------------------------------------------------
# What any decoded update must be


def assert_applicable(parts: list[Part], layout: Layout) -> None:
    """Each part's coordinates are finite float32 values for in-range, strictly increasing indices."""
    assert len(parts) == len(layout)
    for part, size in zip(parts, layout.sizes):
        indices, values = part.coordinates(size)
        assert values.dtype == np.float32 and np.isfinite(values).all()
        assert part.entries == values.size
        if indices is None:
            assert values.shape == (size,)
        else:
            assert indices.shape == values.shape and indices.dtype.kind in "iu"
            assert indices.size == 0 or (indices[0] >= 0 and indices[-1] < size and np.all(np.diff(indices) > 0))


# ---------------------------------------------------------------------------------------
# Fuzz targets (run in-process on their seeds below, and by atheris in a subprocess)


class MemorySocket:
    """The receiving end of a socket over fixed bytes, ``chunk`` bytes at most per read.

    ``largest`` is the largest read asked for: a frame's body is read into a buffer of its
    declared size, so it bounds what the reader allocated."""

    def __init__(self, data: bytes, chunk: int):
        self.data = memoryview(data)
        self.pos = 0
        self.chunk = chunk
        self.largest = 0

    def recv_into(self, view, nbytes: int = 0, flags: int = 0) -> int:  # short reads even under MSG_WAITALL
        self.largest = max(self.largest, len(view))
        n = min(nbytes or len(view), self.chunk, len(self.data) - self.pos)
        view[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def frame_target(data: bytes) -> str:
    """Read ``data[2:]`` as frames until it ends or a frame is refused; returns how it ended."""
    if len(data) < 2:
        return "short"
    mode, chunk = data[0], 1 + data[1] % 64
    token = TOKEN if mode & 1 else None  # None: the collector's first look, any token parses
    limit = LIMITS[(mode >> 1) & 3]
    stream = data[2:]
    sock = MemorySocket(stream, chunk)
    channel = Channel(sock, token, max_body=limit) if mode & 8 else None
    outcome = "end"
    while True:
        start = sock.pos
        try:
            header, body = channel.recv(keep_buffer=True) if channel else protocol.recv_frame(sock, token, limit)
        except protocol.PeerClosed as exc:
            assert exc.mid_frame == (start < len(stream)), (start, len(stream), exc)
            outcome = "partial_frame" if exc.mid_frame else "end"
            break
        except ProtocolError as exc:
            outcome = exc.reason
            break
        assert isinstance(header.type, MsgType) and len(body) == header.length <= limit
        assert token is None or header.token == token
        if header.type in JSON_TYPES:
            try:
                assert isinstance(protocol.parse_json(body, header.type.name), dict)
            except ProtocolError as exc:
                assert exc.reason == "bad_json"
    assert sock.largest <= max(HEADER.size, limit), f"read {sock.largest} bytes with a limit of {limit}"
    return outcome


class UpdateTarget:
    """Decode, then apply with every rule to parameters that live across inputs, as a server's do.

    ``data[0]`` is control bits (worker 0-3, pull first, forget the worker, reset the model),
    ``data[1]`` the staleness, the rest the codec message."""

    LEARNING_RATE = 0.5

    def __init__(self):
        self.rules = {name: rules.build(name, LAYOUT, self.LEARNING_RATE) for name in RULE_NAMES}
        self.params = {name: initial_parameters(LAYOUT, 0) for name in RULE_NAMES}

    def __call__(self, data: bytes) -> str:
        if len(data) < 2:
            return "short"
        control, staleness = data[0], data[1]
        try:
            parts = compression.decode(data[2:], LAYOUT)
        except CodecError as exc:
            return exc.reason
        assert_applicable(parts, LAYOUT)
        outcome = "applied"
        for name, rule in self.rules.items():
            params = self.params[name]
            if control & 0x80:
                params[:] = initial_parameters(LAYOUT, 0)
            worker = control & 3
            if control & 4:
                rule.on_pull(worker)
            before = params.copy()
            try:
                applied = rule.apply(params, parts, worker, staleness)
            except rules.RuleError as exc:
                assert np.array_equal(params, before, equal_nan=True), f"{name} refused ({exc.reason}) but changed the model"
                outcome = exc.reason
            else:
                assert applied.entries == sum(p.entries for p in parts)
                assert 0 < applied.mean_scale <= 1 or applied.entries == 0
            assert np.isfinite(params).all(), f"{name} made the model non-finite"
            if control & 8:
                rule.forget(worker)
        return outcome


# -- seeds: valid inputs of every shape, for the fuzzer to start from -----------------------


SIZE, SHAPE = 30, (6, 5)
ONE = Layout((TensorSpec("m", SHAPE),))
KINDS = ("dense", "sparse", "half", "quantized", "sign", "sparse_sign", "sparse_levels", "low_rank")


def random_part(kind: str, seed: int, size: int = SIZE, shape: tuple[int, ...] = SHAPE) -> Part:
    """A valid part of ``kind`` for a tensor of ``shape``: values over ten decades, about 30% of
    the entries for sparse kinds, any number of levels, ranks up to 5."""
    rng = np.random.default_rng(seed)
    k = int(rng.binomial(size, 0.3))
    indices = np.sort(rng.choice(size, k, replace=False)).astype(np.int64)
    values = (rng.normal(size=size) * 10.0 ** rng.integers(-6, 4, size=size)).astype(np.float32)
    if kind == "dense":
        return DensePart(values)
    if kind == "sparse":
        return SparsePart(indices, values[:k])
    if kind == "half":
        return HalfPart(values.astype(np.float16).astype(np.float32))
    if kind == "quantized":
        levels = int(rng.choice([1, 2, 7, 127, MAX_LEVELS]))
        return QuantizedPart(levels, float(np.float32(rng.exponential())), rng.integers(0, 2 * levels + 1, size=size))
    if kind == "sign":
        return SignPart(float(np.float32(rng.exponential())), rng.random(size) < 0.5)
    if kind == "sparse_sign":
        return SparseSignPart(indices, float(np.float32(rng.exponential())), rng.random(k) < 0.5)
    if kind == "sparse_levels":
        levels = int(rng.choice([1, 7, 127, MAX_LEVELS]))
        return SparseLevelsPart(indices, levels, float(np.float32(rng.exponential())), rng.integers(0, 2 * levels + 1, size=k))
    rows, cols = shape
    rank = int(rng.integers(1, min(rows, cols, 5) + 1))
    return LowRankPart(rng.normal(size=(rows, rank)).astype(np.float32), rng.normal(size=(cols, rank)).astype(np.float32))


def sample_parts(size: int, shape: tuple[int, ...], seed: int) -> list[Part]:
    """One valid part of every kind for a tensor (low-rank only for a matrix), an empty sparse
    one, and a dense one of finite values so large that a few of them overflow the model."""
    kinds = [kind for kind in KINDS if kind != "low_rank" or len(shape) == 2]
    return [random_part(kind, seed, size, shape) for kind in kinds] + [
        SparsePart(np.zeros(0, np.int64), np.zeros(0, np.float32)), DensePart(np.full(size, 3.0e38, np.float32))]


def update_seeds() -> list[bytes]:
    seeds = []
    per_tensor = [sample_parts(t.size, t.shape, i) for i, t in enumerate(LAYOUT.tensors)]
    for flags in ALL_FLAGS:
        for j in range(max(len(p) for p in per_tensor)):
            parts = [options[j % len(options)] for options in per_tensor]
            body = b"".join(struct.pack("<BBI", p.kind, flags, len(w)) + w
                            for p, w in ((p, p.write(n, flags)) for p, n in zip(parts, LAYOUT.sizes)))
            for control in (0x04, 0x05, 0x00):
                seeds.append(bytes([control, j % 3]) + struct.pack("<BH", 1, len(LAYOUT)) + body)
    return seeds


def frame_seeds() -> list[bytes]:
    message = update_seeds()[0][2:]
    hello = protocol.json_body({"role": "worker", "worker": 3, "incarnation": 1})
    frames = (protocol.pack_header(MsgType.HELLO, TOKEN, len(hello), worker=3) + hello
              + protocol.pack_header(MsgType.PULL, TOKEN, 4, worker=3) + (1000).to_bytes(4, "little")
              + protocol.pack_header(MsgType.PUSH, TOKEN, len(message), worker=3, t0=7) + message
              + protocol.pack_header(MsgType.MODEL, TOKEN, 0, flags=protocol.Flag.DONE))
    return [bytes([mode, chunk]) + frames for mode in (0x05, 0x0D, 0x04, 0x0C, 0x07) for chunk in (63, 6)]


TARGETS = {"frame": (frame_target, frame_seeds), "update": (UpdateTarget, update_seeds)}


# -- the subprocess ----------------------------------------------------------------------

RUNNER = """\
import sys
import atheris
with atheris.instrument_imports(include=["compression", "emulator"]):
    import compression, emulator.runtime.protocol, emulator.runtime.transport, emulator.runtime.rules
import test_fuzz
test_fuzz.fuzz_main(sys.argv[1:])
"""


def fuzz_main(argv: list[str]) -> None:
    """``TARGET --runs N --seconds S --seed X --corpus DIR --stats FILE --artifacts DIR``: fuzz, counting outcomes."""
    import atheris

    parser = argparse.ArgumentParser()
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--runs", type=int, default=FUZZ_RUNS)
    parser.add_argument("--seconds", type=int, default=FUZZ_SECONDS)
    parser.add_argument("--seed", type=int, default=FUZZ_SEED)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--stats", required=True)
    parser.add_argument("--artifacts", required=True, help="where libFuzzer writes the input of a failure")
    args = parser.parse_args(argv)
    make_target, make_seeds = TARGETS[args.target]
    target = make_target() if isinstance(make_target, type) else make_target
    corpus = Path(args.corpus)
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(make_seeds()):
        (corpus / f"seed-{i:03d}").write_bytes(seed)
    outcomes: dict[str, int] = {}
    count = 0

    def one_input(data: bytes) -> None:
        nonlocal count
        outcome = target(data)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        count += 1
        if count % 1000 == 0 or count == args.runs:  # libFuzzer exits without Python's atexit
            Path(args.stats).write_text(json.dumps({"executions": count, "outcomes": outcomes}))

    atheris.Setup([sys.argv[0], f"-runs={args.runs}", f"-max_total_time={args.seconds}", f"-seed={args.seed}",
                   f"-max_len={args.max_len}", "-print_final_stats=1", f"-artifact_prefix={args.artifacts}/", str(corpus)], one_input)
    atheris.Fuzz()


def run_fuzzer(target: str, tmp_path: Path) -> dict:
    """Fuzz ``target`` in a subprocess; returns executions, outcomes, coverage and seconds."""
    pytest.importorskip("atheris", reason="atheris (the test extra) is not installed")
    stats = tmp_path / f"{target}.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, target, "--runs", str(FUZZ_RUNS), "--seconds", str(FUZZ_SECONDS),
         "--corpus", str(tmp_path / f"corpus-{target}"), "--stats", str(stats), "--artifacts", str(tmp_path)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{Path(__file__).resolve().parent}"),
        capture_output=True, text=True, timeout=FUZZ_SECONDS + 120,
    )
    seconds = time.monotonic() - started
    log = done.stdout + done.stderr
    assert done.returncode == 0, f"the {target} fuzzer found a failure:\n{log[-6000:]}"
    finished = re.search(r"Done (\d+) runs in (\d+) second", log)
    coverage = re.findall(r"cov: (\d+) ft: (\d+)", log)
    assert finished, log[-3000:]
    result = json.loads(stats.read_text())
    result.update(executions=int(finished.group(1)), seconds=round(seconds, 1),
                  coverage=int(coverage[-1][0]) if coverage else None, features=int(coverage[-1][1]) if coverage else None)
    print(f"\nfuzz {target}: {result['executions']:,} executions in {seconds:.1f} s, cov {result['coverage']}, "
          f"ft {result['features']}, outcomes {dict(sorted(result['outcomes'].items(), key=lambda kv: -kv[1]))}")
    return result


def test_fuzz_frames(tmp_path):
    result = run_fuzzer("frame", tmp_path)
    assert result["executions"] >= min(FUZZ_RUNS, 5000)
    outcomes = result["outcomes"]
    # It got past the header checks into bodies, and found refusals of several kinds.
    assert outcomes.get("end", 0) and outcomes.get("partial_frame", 0)
    assert len(set(outcomes) - {"end", "partial_frame", "short"}) >= 3, outcomes


def test_fuzz_updates(tmp_path):
    result = run_fuzzer("update", tmp_path)
    assert result["executions"] >= min(FUZZ_RUNS, 5000)
    outcomes = result["outcomes"]
    assert outcomes.get("applied", 0) > 0, outcomes  # it reached the rules, not only the codec
    assert len(set(outcomes) - {"applied", "short"}) >= 5, outcomes


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_seeds_pass_in_process(target):
    """The seeds themselves, without atheris: a failure here reads better than a fuzzer's."""
    make_target, make_seeds = TARGETS[target]
    fn = make_target() if isinstance(make_target, type) else make_target
    outcomes = {fn(seed) for seed in make_seeds()}
    assert ("applied" in outcomes) if target == "update" else ("end" in outcomes), outcomes


# ---------------------------------------------------------------------------------------
# Property tests: every part kind

def framed(kind: int, flags: int, body: bytes) -> bytes:
    """A one-part message around ``body``, its lengths consistent."""
    return struct.pack("<BH", 1, 1) + struct.pack("<BBI", kind, flags, len(body)) + body


def float_slots(part: Part, flags: int) -> list[tuple[int, int]]:
    """``(offset, width)`` of every float a part's body carries: its values, or its scale."""
    width = 2 if flags & FLAG_F16_VALUES else 4
    if isinstance(part, HalfPart):
        return [(2 * i, 2) for i in range(SIZE)]
    if isinstance(part, DensePart):
        return [(width * i, width) for i in range(SIZE)]
    if isinstance(part, SparsePart):
        start = 4 + len(write_indices(part.indices, SIZE, flags))
        return [(start + width * i, width) for i in range(part.entries)]
    if isinstance(part, LowRankPart):
        count = part.p.size + part.q.size
        return [(12 + width * i, width) for i in range(count)]
    return [({QuantizedPart: 2, SignPart: 0, SparseSignPart: 4, SparseLevelsPart: 6}[type(part)], 4)]


def non_finite_bytes(value: float, width: int) -> bytes:
    return np.array([value], "<f2" if width == 2 else "<f4").tobytes()


def reason_of(message: bytes, layout: Layout = ONE) -> str | None:
    """The codec's refusal, or None when the message decodes (then it must be applicable)."""
    try:
        parts = decode(message, layout)
    except CodecError as exc:
        return exc.reason
    assert_applicable(parts, layout)
    return None


PROPERTY = settings(max_examples=int(os.environ.get("EMU_PROPERTY_EXAMPLES", 150)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.sampled_from(KINDS), st.sampled_from(ALL_FLAGS), st.integers(0, 2**32 - 1), st.integers(0, 10**6),
       st.sampled_from([math.nan, math.inf, -math.inf]))
def test_any_float_made_non_finite_is_refused(kind, flags, seed, which, bad):
    part = random_part(kind, seed)
    body = bytearray(part.write(SIZE, flags))
    assert reason_of(framed(part.kind, flags, bytes(body))) is None
    slots = float_slots(part, flags)
    if not slots:
        return  # a sparse part with no entries carries no float
    offset, width = slots[which % len(slots)]
    body[offset : offset + width] = non_finite_bytes(bad, width)
    assert reason_of(framed(part.kind, flags, bytes(body))) == "non_finite"


def _ef_block(values: np.ndarray, n: int) -> bytes | None:
    """An Elias-Fano block of ``len(values)`` entries out of ``n`` holding any values whose high
    parts fit the block (so out-of-range and unordered ones too); None when they cannot."""
    k = values.size
    width = elias_fano.low_bits(n, k)
    low_bytes = (k * width + 7) // 8
    upper_bytes = elias_fano.encoded_size(n, k) - low_bytes
    positions = (values >> width) + np.arange(k)
    if positions.max() >= 8 * upper_bytes or np.unique(positions).size != k:
        return None
    low_bits = ((values[:, None] >> np.arange(width - 1, -1, -1)) & 1).astype(np.uint8).ravel() if width else np.zeros(0, np.uint8)
    upper = np.zeros(8 * upper_bytes, np.uint8)
    upper[positions] = 1
    return np.packbits(low_bits).tobytes()[:low_bytes].ljust(low_bytes, b"\0") + np.packbits(upper).tobytes()


@st.composite
def bad_index_sets(draw):
    """k >= 1 indices for a tensor of SIZE that are not strictly increasing within it."""
    k = draw(st.integers(1, SIZE))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = np.sort(rng.choice(SIZE, k, replace=False)).astype(np.int64)
    how = draw(st.sampled_from(["duplicate", "disorder", "out_of_range"] if k > 1 else ["out_of_range"]))
    if how == "duplicate":
        j = draw(st.integers(1, k - 1))
        x[j] = x[j - 1]
    elif how == "disorder":
        i, j = sorted(draw(st.lists(st.integers(0, k - 1), min_size=2, max_size=2, unique=True)))
        x[i], x[j] = x[j], x[i]
    else:
        x[-1] = draw(st.integers(SIZE, 2**32 - 1) | st.integers(SIZE, SIZE + 64))
        x = np.sort(x)
    return how, x


PART_KINDS_BY_NAME = {"sparse": SparsePart.kind, "sparse_sign": SparseSignPart.kind}


@PROPERTY
@given(bad_index_sets(), st.sampled_from(["sparse", "sparse_sign"]), st.sampled_from(["raw32", "elias_fano"]),
       st.booleans())
def test_duplicate_disordered_or_out_of_range_indices_are_refused(case, kind, coding, f16):
    how, x = case
    k = x.size
    flags = (FLAG_RAW32_INDICES if coding == "raw32" else 0) | (FLAG_F16_VALUES if f16 else 0)
    if coding == "raw32":
        block = x.astype("<u4").tobytes()
    else:
        block = _ef_block(x, SIZE)
        if block is None:
            return  # not representable in an Elias-Fano block of this size at all
    if kind == "sparse":
        values = np.ones(k, "<f2" if f16 else "<f4").tobytes()
        body = struct.pack("<I", k) + block + values
    else:
        body = struct.pack("<If", k, 1.0) + block + np.packbits(np.zeros(k, np.uint8)).tobytes()
    reason = reason_of(framed(PART_KINDS_BY_NAME[kind], flags, body))
    if coding == "elias_fano" and how == "disorder":
        # Elias-Fano's unary high parts come out sorted whatever order they went in: such a
        # block reads as some other index set, which must then be a valid one (reason_of checks).
        assert reason in (None, "bad_part")
    else:
        assert reason == "bad_part", (how, x)


@PROPERTY
@given(st.sampled_from(KINDS), st.sampled_from(ALL_FLAGS), st.integers(0, 2**32 - 1), st.integers(-64, 64).filter(bool),
       st.binary(min_size=64, max_size=64))
def test_any_other_body_length_is_refused(kind, flags, seed, delta, filler):
    part = random_part(kind, seed)
    body = part.write(SIZE, flags)
    changed = body[:delta] if delta < 0 else body + filler[:delta]
    assert reason_of(framed(part.kind, flags, changed)) == "bad_part"


@PROPERTY
@given(st.sampled_from(KINDS), st.sampled_from(ALL_FLAGS), st.sampled_from(ALL_FLAGS), st.integers(0, 2**32 - 1))
def test_a_body_read_under_other_flags_is_refused_or_applicable(kind, written, read, seed):
    """Wrong value width (f16 for f32) or index coding (raw32 for Elias-Fano): never a crash."""
    part = random_part(kind, seed)
    reason_of(framed(part.kind, read, part.write(SIZE, written)))


@PROPERTY
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**32 - 1)), min_size=3, max_size=3),
       st.sampled_from(ALL_FLAGS), st.integers(0, 1000), st.sampled_from(RULE_NAMES))
def test_any_valid_message_applies_finitely_with_every_rule(choices, flags, staleness, rule_name):
    parts = [random_part("dense" if kind == "low_rank" and len(spec.shape) != 2 else kind, seed, spec.size, spec.shape)
             for (kind, seed), spec in zip(choices, LAYOUT.tensors)]
    decoded = decode(encode(parts, LAYOUT, compression.WireFormat(
        "f16" if flags & FLAG_F16_VALUES else "f32", "raw32" if flags & FLAG_RAW32_INDICES else "elias_fano")), LAYOUT)
    assert_applicable(decoded, LAYOUT)
    rule = rules.build(rule_name, LAYOUT, 0.1)
    rule.on_pull(0)
    params = initial_parameters(LAYOUT, 1)
    rule.apply(params, decoded, 0, staleness)
    assert np.isfinite(params).all()


@pytest.mark.parametrize("rule_name", RULE_NAMES)
def test_an_update_that_would_overflow_is_refused_whole(rule_name):
    """Finite gradients can still overflow float32: the update is refused and nothing changes."""
    rule = rules.build(rule_name, LAYOUT, 1.0)
    rule.on_pull(0)
    params = initial_parameters(LAYOUT, 1)
    small = [SparsePart(np.array([0]), np.array([1.0], np.float32)), DensePart(np.ones(7, np.float32)),
             SparsePart(np.zeros(0, np.int64), np.zeros(0, np.float32))]
    huge = [small[0], DensePart(np.full(7, -3.0e38, np.float32)), small[2]]
    rule.apply(params, huge, 0, 0)  # 0.1 + 3e38: still finite
    before = params.copy()
    state = {k: v.copy() for k, v in rule.state().items()}
    with pytest.raises(rules.RuleError) as info:
        rule.apply(params, huge, 0, 0)  # 3e38 + 3e38 is not
    assert info.value.reason == "overflow"
    np.testing.assert_array_equal(params, before)  # the first tensor's step was not written either
    for key, value in rule.state().items():
        np.testing.assert_array_equal(value, state[key])  # nor AdaComp's touch counters
    rule.apply(params, small, 0, 0)
    assert params[0] == before[0] - np.float32(1.0)


# -- unknown versions, types, kinds and flags: every byte value --------------------------


def test_every_unknown_format_version_kind_and_flag_is_refused():
    message = update_seeds()[0][2:]
    assert reason_of(message, LAYOUT) is None
    for version in range(256):
        if version != 1:
            assert reason_of(bytes([version]) + message[1:], LAYOUT) == "bad_format"
    offsets, pos = [], 3
    for _ in LAYOUT.sizes:
        offsets.append(pos)
        pos += 6 + struct.unpack_from("<I", message, pos + 2)[0]
    for offset in offsets:
        for kind in range(256):
            bad = bytearray(message)
            bad[offset] = kind
            reason = reason_of(bytes(bad), LAYOUT)
            assert (reason == "bad_kind") == (kind not in PART_KINDS), (kind, reason)
        for flags in range(256):
            bad = bytearray(message)
            bad[offset + 1] = flags
            reason = reason_of(bytes(bad), LAYOUT)
            assert (reason == "bad_flags") == bool(flags & ~KNOWN_FLAGS), (flags, reason)


def test_every_unknown_protocol_version_and_type_is_refused():
    raw = protocol.pack_header(MsgType.PULL, TOKEN, 4)
    for version in range(256):
        if version != protocol.VERSION:
            with pytest.raises(ProtocolError, match="bad_version"):
                protocol.parse_header(raw[:2] + bytes([version]) + raw[3:], TOKEN, 100)
    known = {int(t) for t in MsgType}
    for type_ in range(256):
        tampered = raw[:3] + bytes([type_]) + raw[4:]
        if type_ in known:
            assert protocol.parse_header(tampered, TOKEN, 100).type == type_
        else:
            with pytest.raises(ProtocolError, match="bad_type"):
                protocol.parse_header(tampered, TOKEN, 100)


@pytest.mark.parametrize("body", [b"[" * 5000, b'{"worker": ' + b"7" * 5000 + b"}", b'{"a": 1e999999}', b"\xed\xa0\x80"],
                         ids=["deep", "huge_int", "huge_float", "surrogate"])
def test_json_bodies_that_break_the_json_module_are_bad_json(body):
    try:
        data = protocol.parse_json(memoryview(body), "hello")
    except ProtocolError as exc:
        assert exc.reason == "bad_json"
    else:
        assert isinstance(data, dict)


# ---------------------------------------------------------------------------------------
# The server counts every refusal by reason, in its traces


def test_the_server_counts_every_refusal_by_reason_in_its_traces():
    from support.paramserver import LAYOUT as PS_LAYOUT, Harness, update

    h = Harness(learning_rate=1.0)
    try:
        threading.Thread(target=h.server.report_traffic, daemon=True).start()
        h.start()
        w = h.client(worker=0)
        good = compression.encode(update(), PS_LAYOUT)
        w.push_raw(good, t0=0)
        assert w.rejected() == "no_pull"
        w.pull()
        w.model()
        parts_at = [3]
        for _ in PS_LAYOUT.sizes[:-1]:
            parts_at.append(parts_at[-1] + 6 + struct.unpack_from("<I", good, parts_at[-1] + 2)[0])
        huge = compression.encode([DensePart(np.full(6, 3.0e38, np.float32)), DensePart(np.zeros(4, np.float32))], PS_LAYOUT)
        nan = compression.encode([DensePart(np.full(6, np.nan, np.float32)), DensePart(np.zeros(4, np.float32))], PS_LAYOUT)
        malformed = {
            "bad_format": b"\x09" + good[1:],
            "bad_layout": good[:1] + struct.pack("<H", 5) + good[3:],
            "truncated": good[:-1],
            "trailing": good + b"\0\0",
            "bad_kind": good[: parts_at[0]] + b"\x03" + good[parts_at[0] + 1 :],
            "bad_flags": good[: parts_at[1] + 1] + b"\x80" + good[parts_at[1] + 2 :],
            "bad_part": good[: parts_at[0]] + b"\x01" + good[parts_at[0] + 1 :],
            "non_finite": nan,
        }
        for reason, message in malformed.items():
            w.push_raw(message, t0=0)
            assert w.rejected() == reason
        w.push_raw(good, t0=99)
        assert w.rejected() == "future_version"
        w.push_raw(huge, t0=0)  # -3e38 is finite; the second one overflows
        assert w.model()[0].t0 == 1
        w.push_raw(huge, t0=1)
        assert w.rejected() == "overflow"
        w.push_raw(huge, t0=1)
        assert w.rejected() == "overflow"
        hello = h.client(worker=1, hello=False)
        hello.channel.send(MsgType.HELLO, b"[" * 1200)  # nested past Python's recursion limit, within the frame limit
        assert hello.rejected() == "bad_json"
        expected = {reason: 1 for reason in malformed} | {"no_pull": 1, "future_version": 1, "overflow": 2, "bad_json": 1}
        assert dict(h.server.rejections) == expected
        traced: dict[str, int] = {}
        for row in h.tel.stream("rejections"):
            traced[row["reason"]] = traced.get(row["reason"], 0) + 1
            assert row["detail"] and row["worker"] in (0, protocol.NO_WORKER)
        assert traced == expected
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(r["rejections"] == expected for r in h.tel.stream("server")):
            h.server._flush_now.set()
            time.sleep(0.05)
        assert any(r["rejections"] == expected for r in h.tel.stream("server")), h.tel.stream("server")[-1:]
        assert h.server.version == 1 and np.isfinite(h.server.params).all()
    finally:
        h.close()


def test_the_collector_refuses_a_bad_token_and_logs_it(tmp_path):
    from emulator.control.collector import Collector
    from emulator.control.rundir import RunDirectory, read_jsonl

    rundir = RunDirectory(tmp_path / "run")
    collector = Collector(rundir, TOKEN, clock=lambda: 12.5).start()
    try:
        with socket.create_connection(collector.address, timeout=5) as stranger:
            protocol.send_frame(stranger, MsgType.HELLO, bytes(16), protocol.json_body({"source": "worker-9"}))
            try:
                assert stranger.recv(1) == b""  # hung up on
            except ConnectionResetError:
                pass
        with socket.create_connection(collector.address, timeout=5) as device:
            protocol.send_frame(device, MsgType.HELLO, TOKEN, protocol.json_body({"source": "worker-1"}))
            protocol.send_frame(device, MsgType.TRACE, TOKEN, protocol.json_body({"stream": "steps", "records": [{"ts": 1}]}))
        deadline = time.monotonic() + 5
        while collector.refused.get("bad_token") != 1 or rundir.counts.get("steps") != 1:
            assert time.monotonic() < deadline, (collector.refused, rundir.counts)
            time.sleep(0.02)
    finally:
        collector.close()
        rundir.close()
    (refused,) = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert refused["kind"] == "collector_refused" and refused["reason"] == "bad_token" and refused["ts"] == 12.5
    assert read_jsonl(tmp_path / "run" / "steps.jsonl") == [{"ts": 1}]  # only the device with the run's token


if __name__ == "__main__":
    sys.exit("run through pytest; the fuzzers start with: python -c test_fuzz.RUNNER (see run_fuzzer)")
