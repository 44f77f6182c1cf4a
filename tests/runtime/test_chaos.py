"""Faults survived: a worker dying mid-frame, a controller killed over and over, cut-off traces.

* In-process (fast): a worker that sends a header and part of a frame, then dies. The server
  drops the partial frame, counts it (``partial_frame`` in its rejections), keeps serving the
  others meanwhile, and takes the same worker id back when it reconnects.
* Docker (slow): ``emulate run`` (or, every fifth cycle, ``emulate images build --force``) started
  and SIGKILLed at a seeded random moment, in turn during the image build, the devices' start,
  their boot, training and teardown, then a plain ``emulate clean``, ``EMU_CHAOS_CYCLES`` times (20 for the full
  test). Nothing of the cycle may be left: no container or network of the run, no cgroup of its
  containers, no host veth of theirs (the downlink qdiscs live there), no probe link or
  iptables chain of the killed controller, no build context; a killed run's directory holds its
  records only, every stream still reads (at most a cut-off last line, skipped with a warning),
  and a run that completed before the kill keeps all of its records.
* A run directory whose streams end in a cut-off line: :func:`read_jsonl` and the analysis
  loaders warn and skip it.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import compression
from conftest import ROOT, TEST_SCENARIOS
from emulator.control.rundir import STREAMS, read_jsonl
from emulator.runtime import protocol
from emulator.runtime.protocol import HEADER, MsgType
from support.paramserver import LAYOUT, TIMEOUT, TOKEN, expected_step, update

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")


# ---------------------------------------------------------------------------------------
# A worker that dies mid-frame


def _wait_for(predicate, timeout_s: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


CUTS = {  # where the dying worker stops, in bytes of its PUSH frame (header 38 bytes)
    "in_the_header": lambda frame: 20,
    "after_the_header": lambda frame: HEADER.size,
    "in_the_body": lambda frame: HEADER.size + (len(frame) - HEADER.size) // 2,
    "one_byte_short": lambda frame: len(frame) - 1,
}


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_a_worker_dying_mid_frame_is_dropped_counted_and_may_come_back(harness, cut):
    h = harness()
    h.start()
    other = h.client(worker=1)
    other.pull()
    _, p0 = other.model()
    dying = h.client(worker=0)
    dying.pull()
    dying.model()
    message = compression.encode(update(), LAYOUT)
    frame = protocol.pack_header(MsgType.PUSH, TOKEN, len(message), worker=0, t0=0) + message
    dying.sock.sendall(frame[: CUTS[cut](frame)])

    # While the partial frame hangs, the others are served.
    other.push(update(), t0=0)
    header, p1 = other.model()
    assert header.t0 == 1
    np.testing.assert_array_equal(p1, expected_step(p0, update()))

    dying.close()  # dies with its frame half sent
    _wait_for(lambda: any(e["kind"] == "disconnected" and e["worker"] == 0 for e in h.tel.stream("events")))
    assert h.server.rejections == {"partial_frame": 1}
    (row,) = h.tel.stream("rejections")
    assert row["reason"] == "partial_frame" and row["worker"] == 0 and "closed after" in row["detail"]
    gone = next(e for e in h.tel.stream("events") if e["kind"] == "disconnected" and e["worker"] == 0)
    assert gone["pending"] is True  # the update it was sending is lost, and counted as such
    assert h.server.version == 1 and 0 not in h.server.rule.at_pull
    np.testing.assert_array_equal(h.server.params, p1)  # nothing of the partial frame was applied

    back = h.client(worker=0)  # the same worker id, a new incarnation
    back.pull()
    header, p_back = back.model()
    assert header.t0 == 1
    back.push(update(), t0=1)
    header, p2 = back.model()
    assert header.t0 == 2
    np.testing.assert_array_equal(p2, expected_step(p_back, update()))
    other.push(update(), t0=1)
    assert other.model()[0].t0 == 3
    assert h.server.rejections == {"partial_frame": 1}


def test_a_worker_closing_between_frames_is_not_a_refusal(harness):
    h = harness()
    h.start()
    w = h.client(worker=0)
    w.pull()
    w.model()
    w.push(update(), t0=0)
    w.model()
    w.close()
    _wait_for(lambda: any(e["kind"] == "disconnected" for e in h.tel.stream("events")))
    assert not h.server.rejections and not h.tel.stream("rejections")


def test_many_workers_dying_mid_frame_while_others_push():
    """Eight workers push in a loop while eight others die mid-frame, again and again."""
    import threading

    from support.paramserver import Harness

    h = Harness(rule="plain")
    try:
        h.start()
        message = compression.encode(update(), LAYOUT)
        frame = protocol.pack_header(MsgType.PUSH, TOKEN, len(message), t0=0) + message
        errors, answered = [], []
        stop = threading.Event()

        def push_forever(worker):
            try:
                c = h.client(worker=worker)
                c.pull()
                header, _ = c.model()
                while not stop.is_set():
                    c.push(update(), t0=header.t0)
                    header, _ = c.model()
                    answered.append(header.t0)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        def die_mid_frame(worker, times):
            rng = random.Random(worker)
            try:
                for _ in range(times):
                    c = h.client(worker=worker)
                    c.pull()
                    c.model()
                    c.sock.sendall(frame[: rng.randrange(1, len(frame))])
                    c.close()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        pushers = [threading.Thread(target=push_forever, args=(w,)) for w in range(8)]
        dying = [threading.Thread(target=die_mid_frame, args=(100 + w, 10)) for w in range(8)]
        for t in pushers + dying:
            t.start()
        for t in dying:
            t.join(30)
        stop.set()
        for t in pushers:
            t.join(30)
        assert not errors, errors
        _wait_for(lambda: h.server.rejections["partial_frame"] == 80, 10)
        assert set(h.server.rejections) == {"partial_frame"}
        assert h.server.version == len(answered)  # every push answered was applied, once
    finally:
        h.close()


# ---------------------------------------------------------------------------------------
# Cut-off traces


def _write_cut_run(run: Path) -> dict[str, int]:
    """A run directory killed mid-write: each stream's last line cut off; returns complete rows per stream."""
    run.mkdir()
    rows = {
        "events": [{"ts": 0.1 * i, "source": "controller", "kind": "fault", "action": "crash", "target": "worker-1"} for i in range(5)]
        + [{"ts": 0.0, "source": "controller", "kind": "training_started", "boot_s": 0.0}],
        "updates": [{"ts": 1.0 + i, "t": i + 1, "worker": i % 2, "t0": i, "staleness": 0, "bytes": 100, "entries": 3,
                     "scale": 1.0, "decode_us": 5, "apply_us": 7} for i in range(7)],
        "accuracy": [{"ts": 2.0 * i, "version": i, "accuracy": 0.1 * i, "loss": 2.0 - i / 10, "final": False, "model_ts": 2.0 * i}
                     for i in range(4)],
        "traffic": [{"ts": float(i), "worker": 0, "ingress_bytes": 1000, "pushes": 2, "egress_bytes": 9000} for i in range(3)],
        "steps": [{"ts": float(i), "worker": 1, "steps": 5, "loss": 1.0} for i in range(3)],
    }
    for stream, records in rows.items():
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        cut = json.dumps(records[-1], separators=(",", ":"))
        with open(run / f"{stream}.jsonl", "w") as fh:
            fh.write(text + cut[: len(cut) // 2])  # the kill came halfway through a line
    return {stream: len(records) for stream, records in rows.items()}


def test_cut_off_last_lines_are_skipped_with_a_warning(tmp_path):
    run = tmp_path / "killed"
    complete = _write_cut_run(run)
    for stream, count in complete.items():
        with pytest.warns(UserWarning, match="last line is incomplete") as caught:
            records = read_jsonl(run / f"{stream}.jsonl")
        assert len(caught) == 1
        assert len(records) == count and all(isinstance(r, dict) for r in records)
    # A line spoiled in the middle is skipped too, and said so with its line number.
    path = run / "traffic.jsonl"
    lines = path.read_text().split("\n")
    path.write_text("\n".join([lines[0], '{"ts": 1, "wor\x00\x00', *lines[1:]]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_jsonl(path)
    assert len(records) == complete["traffic"]
    assert sorted(str(w.message).split(": ", 1)[1] for w in caught) == [
        "last line is incomplete (run interrupted?); skipped", "not valid JSON; skipped"]
    path.write_bytes(b'{"ts": 1}\n\xff\xfe{"ts"\n{"ts": 2}\n')  # not even UTF-8
    with pytest.warns(UserWarning, match=":2: not valid JSON"):
        assert read_jsonl(path) == [{"ts": 1}, {"ts": 2}]


def test_analysis_loaders_read_a_killed_run(tmp_path):
    runs = pytest.importorskip("analysis.runs")
    run = tmp_path / "killed"
    complete = _write_cut_run(run)
    for stream, loader in (("updates", runs.load_updates), ("accuracy", runs.load_accuracy), ("events", runs.load_events),
                           ("traffic", runs.load_traffic), ("steps", runs.load_steps)):
        with pytest.warns(UserWarning, match="last line is incomplete"):
            frame = loader(run)
        assert len(frame) == complete[stream], stream
        assert frame["time_s"].notna().all()
    with pytest.warns(UserWarning):
        updates = runs.load_updates(run)
    assert updates["t"].tolist() == list(range(1, 8)) and updates["cum_bytes"].iloc[-1] == 700


# ---------------------------------------------------------------------------------------
# Docker: kill the controller at random moments (image build, device start, training, teardown), clean

CHAOS_CYCLES = int(os.environ.get("EMU_CHAOS_CYCLES", 5))
CHAOS_SEED = int(os.environ.get("EMU_CHAOS_SEED", 6))
# Where each cycle's kill lands, in turn: the event after which it waits, and for how long at most
# (seeded uniform). None: an image build, killed 0.3-2 s after it starts.
TARGETS = (
    ("image build", None, 2.0),
    ("device start", "run_started", 4.0),  # containers being created and started
    ("boot", "devices_started", 10.0),  # TensorFlow loading in the devices, links probed
    ("training", "training_started", 8.0),
    ("teardown", "training_done", 2.0),  # final evaluation, logs, container removal
)
RECORDS = {"scenario.yaml", "scenario.resolved.json", "plan.json", "mechanisms.json", "data.json", "workload.json", "workload", "fidelity.json",
           "summary.json", "logs", *(f"{s}.jsonl" for s in STREAMS)}


def _emulate(*args: str) -> list[str]:
    return [sys.executable, "-m", "emulator.cli", *args]


def _containers(docker_client, run_id: str) -> list[dict]:
    """A run's containers as the daemon lists them (no inspect: they come and go meanwhile)."""
    from emulator.backends.docker import RUN_LABEL

    return docker_client.api.containers(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})


def _networks(docker_client, run_id: str) -> list[dict]:
    from emulator.backends.docker import RUN_LABEL

    return docker_client.api.networks(filters={"label": f"{RUN_LABEL}={run_id}"})


def _phase(run: Path) -> str:
    """How far the run had got when it was killed, from what it wrote."""
    if not run.exists():
        return "loading"  # killed before it made its run directory
    if (run / "summary.json").exists():
        return json.loads((run / "summary.json").read_text()).get("status", "?")
    kinds = {e.get("kind") for e in read_jsonl(run / "events.jsonl")} if (run / "events.jsonl").exists() else set()
    for kind, phase in (("training_done", "teardown"), ("training_started", "training"), ("devices_started", "booting"),
                        ("run_started", "starting devices")):
        if kind in kinds:
            return phase
    return "preparing"


def _check_streams(run: Path) -> tuple[int, int]:
    """Every stream reads; at most its last line is cut off (and said so). Returns (lines read, lines cut)."""
    total = cut = 0
    for path in sorted(run.glob("*.jsonl")):
        assert path.stem in STREAMS, path
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records = read_jsonl(path)
        messages = [str(w.message) for w in caught]
        assert len(messages) <= 1 and all("last line is incomplete" in m for m in messages), (path, messages)
        lines = path.read_text().split("\n")
        assert len(records) == len([line for line in lines if line.strip()]) - len(messages)
        assert all(isinstance(r, dict) and "ts" in r for r in records), path
        total += len(records)
        cut += len(messages)
    return total, cut


def _watch(docker_client, run_id: str, seen: dict) -> None:
    """Note the run's containers and, for running ones, the host side of their veth (where the
    downlink's qdiscs are): after clean, none of them may be left."""
    from emulator.host import links

    for container in _containers(docker_client, run_id):
        seen.setdefault(container["Id"], None)
        if container["State"] == "running" and seen[container["Id"]] is None:
            try:
                pid = docker_client.api.inspect_container(container["Id"])["State"]["Pid"]
                seen[container["Id"]] = links.peer_index(f"/proc/{pid}/ns/net")[1]
            except Exception:  # noqa: BLE001 - gone or not networked yet: looked at again next time
                pass


def _leftovers(docker_client, run_id: str | None, controller: int, seen: dict) -> list[str]:
    """What a killed controller's run may have left: containers, networks, the containers' cgroups,
    the host veths (with their qdiscs), the probe's link and iptables chain, a build context."""
    from emulator.host.images import cache_root

    found = []
    if run_id is not None:
        found += [f"container {c['Names']}" for c in _containers(docker_client, run_id)]
        found += [f"network {n['Name']}" for n in _networks(docker_client, run_id)]
    for container, veth in seen.items():
        found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/docker/{container}")]
        if veth is not None:
            try:
                found.append(f"host veth {socket.if_indextoname(veth)} of {container[:12]}")
            except OSError:
                pass
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    found += [f"link: {line[:80]}" for line in links.splitlines() if f"emup{controller}a" in line]
    chains = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True, check=True).stdout
    found += [f"iptables: {line}" for line in chains.splitlines() if f"EMUP-{controller}-" in line]
    found += [f"files {p}" for p in cache_root().glob(f"build-{controller}-*")]
    return found


def _events(run: Path) -> set:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a line being written
        return {e.get("kind") for e in read_jsonl(run / "events.jsonl")}


def _cycle_run(docker_client, scenario: Path, out: Path, run_id: str, after: str, most_s: float, rng, log: Path) -> dict:
    """A run killed a random moment (up to ``most_s``) after its event ``after``, or when it ends."""
    t0 = time.monotonic()
    seen: dict = {}
    delay = rng.uniform(0.0, most_s)
    kill_at = None
    with open(log, "w") as fh:
        proc = subprocess.Popen(_emulate("run", str(scenario), "--backend", "docker", "--out", str(out), "--run-id", run_id,
                                         "--no-fidelity", "--quiet"), cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None and (kill_at is None or time.monotonic() < kill_at):
                assert time.monotonic() - t0 < 600, f"{run_id}: {after} never came"
                if kill_at is None and after in _events(out / run_id):
                    kill_at = time.monotonic() + delay
                _watch(docker_client, run_id, seen)
                time.sleep(0.1)
        finally:  # also when the test fails: nothing of it may outlive it
            proc.send_signal(signal.SIGKILL)
            code = proc.wait(timeout=30)
    return {"pid": proc.pid, "seen": seen, "exit": code, "phase": _phase(out / run_id), "delay": delay, "seconds": time.monotonic() - t0}


def _cycle_build(delay: float, log: Path) -> dict:
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.Popen(_emulate("images", "build", "--force"), cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            pass
        finally:
            proc.send_signal(signal.SIGKILL)
            code = proc.wait(timeout=30)
    text = log.read_text()
    phase = "image built" if code == 0 else ("image build" if "[build] building" in text else "image build (context)")
    return {"pid": proc.pid, "seen": {}, "exit": code, "phase": phase, "delay": delay, "seconds": time.monotonic() - t0}


@pytest.mark.docker
@pytest.mark.slow
def test_kill_and_clean_twenty_times_leaves_nothing_behind(docker_client, runtime_image, tmp_path):
    """EMU_CHAOS_CYCLES kills (20 for the full test; 5 by default), at seeded random moments, in
    turn during an image build, the devices' start, their boot, training and teardown. After
    each, a plain ``emulate clean`` (orphans only: other users' live runs stay). Nothing of the
    cycle may be left, a killed run keeps only its records, a completed one all of them."""
    rng = random.Random(CHAOS_SEED)
    scenario = tmp_path / "chaos.yaml"
    scenario.write_text((TEST_SCENARIOS / "chaos.yaml").read_text())
    out = tmp_path / "runs"
    tag = secrets.token_hex(2)
    started = time.monotonic()
    cycles = []
    for cycle in range(CHAOS_CYCLES):
        run_id = f"chaos-{tag}-{cycle:02d}"
        log = tmp_path / f"{run_id}.log"
        target, after, most_s = TARGETS[cycle % len(TARGETS)]
        if after is None:
            result = _cycle_build(rng.uniform(0.3, most_s), log)
        else:
            result = _cycle_run(docker_client, scenario, out, run_id, after, most_s, rng, log)
        t0 = time.monotonic()
        clean = subprocess.run(_emulate("clean"), cwd=ROOT, capture_output=True, text=True, timeout=300)
        clean_s = time.monotonic() - t0
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "still there" not in clean.stdout + clean.stderr, clean.stdout + clean.stderr
        is_run = not result["phase"].startswith("image")
        assert _leftovers(docker_client, run_id if is_run else None, result["pid"], result["seen"]) == [], (cycle, result["phase"], clean.stdout)
        lines = cut = 0
        if is_run and (out / run_id).exists():
            run = out / run_id
            lines, cut = _check_streams(run)
            if (run / "summary.json").exists():  # it ended before the kill: every record written and closed
                assert cut == 0, (cycle, result["phase"])
                assert result["phase"] != "completed" or json.loads((run / "summary.json").read_text())["updates_applied"] > 0
            else:
                stray = sorted(p.name for p in run.iterdir() if p.name not in RECORDS)
                assert stray == [], (cycle, result["phase"], stray)
        cycles.append({"cycle": cycle, "target": target, "phase": result["phase"], "delay_s": round(result["delay"], 2), "lines": lines, "cut": cut,
                       "containers": len(result["seen"]), "clean_s": round(clean_s, 1), "seconds": round(time.monotonic() - t0 + result["seconds"], 1)})
    total = time.monotonic() - started
    phases: dict[str, int] = {}
    for c in cycles:
        phases[c["phase"]] = phases.get(c["phase"], 0) + 1
    print(f"\nchaos: {len(cycles)} kill/clean cycles in {total:.0f} s; killed during: "
          + ", ".join(f"{k} {v}" for k, v in sorted(phases.items()))
          + f"; clean took {min(c['clean_s'] for c in cycles):.1f}-{max(c['clean_s'] for c in cycles):.1f} s; "
          f"{sum(c['containers'] for c in cycles)} containers seen, none left; {sum(c['lines'] for c in cycles)} trace lines read back, "
          f"{sum(c['cut'] for c in cycles)} cut-off last lines skipped")
    for c in cycles:
        print(f"  {c}")
    assert len(cycles) == CHAOS_CYCLES
