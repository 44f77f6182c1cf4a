"""The bookkeeping that turns a run's traces into ``summary.json``, fed with recorded traces.

``tests/data/traces/`` holds real runs (see its README): a healthy one with a crashed worker,
one whose workers reported NaN gradients until the server stopped it, one whose server
crashed and restored its checkpoint, and one whose model died at chance while the compressor
of the time trimmed its NaN gradients away. Each is replayed through the controller's
``LiveState`` and :func:`emulator.control.summary.summarize`; the counts are checked against the raw
streams, and the flags against what each run was. Fast: no TensorFlow, no devices.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from emulator.control.controller import Emulation
from emulator.control.rundir import RunDirectory, read_jsonl
from emulator.control.runstate import LiveState
from emulator.runtime.protocol import NO_WORKER
from emulator.control.summary import (
    CHANCE_FACTOR, LOSS_MARGIN, NON_FINITE_REASONS, WARMUP_UPDATES, RunFacts, flag, judge, pushes_behind, summarize,
    wire_bytes,
)

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
STREAMS = ("events", "updates", "accuracy", "traffic", "rejections")
CURRENT = ("healthy-faults", "diverged-nan", "server-crash")  # recorded with this summary's code
ALL = (*CURRENT, "dead-before-fix")
ROOT = Path(__file__).resolve().parents[2]
SCENARIO = {  # the scenario and overrides each trace was recorded with (README)
    "healthy-faults": ("scenarios/quickstart.yaml", ["training.max_updates=120",
                                                    "faults={at: [{time: 2s, crash: 1, restart_after: 3s}]}"]),
    "diverged-nan": ("scenarios/quickstart.yaml", ["training.max_updates=300", "training.learning_rate=5"]),
    "server-crash": ("tests/scenarios/server-crash.yaml", [
        "training.duration=20s", "training.max_updates=300", "faults={at: [{time: 0.7s, crash: server, restart_after: 1s}]}"]),
}
CLASSES = 10  # every trace is of MNIST digits
# Both directions' fields, added after the traces were recorded (their streams hold what they need).
TWO_WAY = ("egress_payload_bytes", "downlink_payload_bytes", "up_bytes_per_update", "down_bytes_per_update",
           "two_way_bytes_per_update", "server_kernels")  # keys the recorded summaries predate


def streams(name: str) -> dict[str, list[dict]]:
    return {stream: read_jsonl(TRACES / name / f"{stream}.jsonl") for stream in STREAMS}


def recorded(name: str) -> dict:
    return json.loads((TRACES / name / "summary.json").read_text())


def replay(records: dict[str, list[dict]]) -> LiveState:
    """The controller's live counters after every record, in the order of the trace clock."""
    state = LiveState()
    merged = sorted(((r.get("ts", 0.0), i, stream, r) for stream in STREAMS for i, r in enumerate(records[stream])),
                    key=lambda item: (item[0], STREAMS.index(item[2]), item[1]))
    for _, _, stream, record in merged:
        state.observe(stream, [record])
    return state


def facts_of(summary: dict) -> RunFacts:
    """What the controller knew beyond the traces, as that run's summary says it."""
    return RunFacts(
        run_id=summary["run_id"], name=summary["name"], status=summary["status"], backend=summary["backend"],
        method=summary["method"], rule=summary["rule"], compressor=summary["compressor"], workers=summary["workers"],
        seed=summary["seed"], plan_digest=summary["plan_digest"], duration_s=summary["duration_s"], error=summary["error"],
        classes=CLASSES, parameters=summary["parameters"], dataset=summary["dataset"],
        training_started_ts=summary["training_started_ts"], payload_at_end=summary["ingress_payload_bytes"],
    )


def assert_same(got: dict, want: dict, ignore=()) -> None:
    """Equal, but for ``ignore`` and the rate, which the run computed from the unrounded duration."""
    assert got["updates_per_s"] == pytest.approx(want["updates_per_s"], rel=1e-3)
    skip = {"updates_per_s", *ignore}
    assert {k: v for k, v in got.items() if k not in skip} == {k: v for k, v in want.items() if k not in skip}


def summary_of(name: str) -> dict:
    records = streams(name)
    return summarize(replay(records), records["events"], records["rejections"], facts_of(recorded(name)))


# -- replayed traces give what the run wrote, and what the raw streams say ----------------


@pytest.mark.parametrize("name", CURRENT)
def test_replayed_traces_give_the_summary_the_run_wrote(name):
    assert_same(summary_of(name), recorded(name), ignore=TWO_WAY)


def test_a_summary_from_before_the_outcome_differs_only_in_the_new_fields():
    old, new = recorded("dead-before-fix"), summary_of("dead-before-fix")
    assert_same({k: new[k] for k in old}, old)
    assert set(new) - set(old) == {"outcome", "outcome_detail", "non_finite_updates", *TWO_WAY}


@pytest.mark.parametrize("name", ALL)
def test_counts_are_those_of_the_raw_streams(name):
    records, summary = streams(name), summary_of(name)
    updates, rejections, events = records["updates"], records["rejections"], records["events"]
    reasons = Counter(r["reason"] for r in rejections)
    assert summary["updates_applied"] == max(u["t"] for u in updates)
    assert summary["applied_update_bytes"] == sum(u["bytes"] for u in updates)
    assert summary["late_updates"] == reasons["late"]
    assert summary["rejected_frames"] == len(rejections) - reasons["late"]
    assert summary["non_finite_updates"] == sum(n for reason, n in reasons.items() if reason in NON_FINITE_REASONS)
    assert summary["lost_updates"] == sum(1 for e in events if e.get("kind") == "disconnected" and e.get("pending"))
    assert summary["faults"] == dict(Counter(e["action"] for e in events if e.get("kind") == "fault"))
    received = sum(r["ingress_bytes"] for r in records["traffic"])
    assert summary["ingress_payload_bytes"] + summary["late_payload_bytes"] == received
    sent = [(r["worker"], r["egress_bytes"]) for r in records["traffic"]]
    assert summary["egress_payload_bytes"] == sum(n for _, n in sent)
    assert summary["downlink_payload_bytes"] == sum(n for worker, n in sent if worker != NO_WORKER) > 0
    updates_applied = summary["updates_applied"]
    assert summary["down_bytes_per_update"] == round(summary["downlink_payload_bytes"] / updates_applied, 1)
    assert summary["two_way_bytes_per_update"] == pytest.approx(
        summary["up_bytes_per_update"] + summary["down_bytes_per_update"], abs=0.11)
    final = [a for a in records["accuracy"] if a.get("final")][-1]
    assert [summary[f"final_{k}"] for k in ("accuracy", "loss", "version")] == [final[k] for k in ("accuracy", "loss", "version")]
    assert summary["diverged"] == (summary["outcome"] == "diverged")


def test_a_healthy_run_with_a_crashed_worker():
    s = summary_of("healthy-faults")
    assert (s["outcome"], s["diverged"], s["status"]) == ("ok", False, "completed")
    assert s["faults"] == {"crash": 1, "restart": 1}
    assert s["lost_updates"] == 1  # the crashed worker's step in flight
    assert s["late_updates"] == 3 and s["rejected_frames"] == 0 and s["non_finite_updates"] == 0
    assert s["updates_applied"] == 120 and s["applied_update_bytes"] == 120 * 21505
    assert flag(s) == ""


def test_a_run_whose_workers_reported_nan_is_diverged():
    s = summary_of("diverged-nan")
    assert s["diverged"] is True and s["outcome"] == "diverged"
    assert s["done_reason"].startswith("diverged")
    assert s["non_finite_updates"] == s["rejected_frames"] == 50
    assert s["updates_applied"] == 13
    assert all(r["reason"] == "late" or "non-finite gradient" in r["detail"] for r in streams("diverged-nan")["rejections"])
    assert flag(s) == " (diverged)"


def test_a_server_crash_counts_the_updates_lost_with_it():
    records, s = streams("server-crash"), summary_of("server-crash")
    (restored,) = [e for e in records["events"] if e.get("kind") == "restored"]
    assert s["updates_lost_to_server_crashes"] == restored["lost"] == 1
    assert s["faults"] == {"crash": 1, "restart": 1}
    assert s["updates_applied"] == 300
    assert len(records["updates"]) < 300  # the crashed server's last unsent records are not in the trace
    assert s["outcome"] == "ok"


def test_a_model_dead_at_chance_is_flagged_even_without_nan_in_its_traces():
    """The issue's run: NaN gradients trimmed to partial updates, accuracy 0.1, said completed, not diverged."""
    s, updates = summary_of("dead-before-fix"), streams("dead-before-fix")["updates"]
    assert recorded("dead-before-fix")["diverged"] is False and s["status"] == "completed"
    assert sum(1 for u in updates if u["entries"] == 202 and u["bytes"] == 51329) == 286
    assert s["outcome"] == "dead" and not s["diverged"] and s["non_finite_updates"] == 0
    assert "at chance" in s["outcome_detail"]
    assert flag(s) == " (dead)"


@pytest.mark.parametrize("name", CURRENT)
def test_the_controller_writes_this_summary(name, tmp_path):
    """Emulation.summary() on the replayed state gives what summarize() gives."""
    from emulator.planning.plan import make_plan
    from emulator.planning.loader import load_scenario

    path, overrides = SCENARIO[name]
    plan = make_plan(load_scenario(ROOT / path, overrides)[0])
    rundir = RunDirectory(tmp_path / name)
    emulation = Emulation(plan, SimpleNamespace(name="local"), rundir, say=lambda _: None)
    for stream in ("events", "rejections"):
        shutil.copy(TRACES / name / f"{stream}.jsonl", rundir.path / f"{stream}.jsonl")
    was = recorded(name)
    emulation.state = replay(streams(name))
    emulation.status = "completed"
    emulation.training_start, emulation.training_end = was["training_started_ts"], was["duration_s"]
    emulation.payload_at_end = was["ingress_payload_bytes"]
    emulation.shards = SimpleNamespace(classes=CLASSES, source=was["dataset"])
    emulation.layout = SimpleNamespace(total=was["parameters"])
    got = emulation.summary()
    assert_same(got, was, ignore=("plan_digest", *TWO_WAY))  # the plan may change with the code
    assert {k: got[k] for k in TWO_WAY} == {k: summary_of(name)[k] for k in TWO_WAY}


def test_the_summary_says_which_loops_the_server_ran_from_its_latest_listening_event():
    """A restarted server says it again; the summary keeps the last (the recorded traces predate the key)."""
    name = CURRENT[0]
    records = streams(name)
    events = [*records["events"], {"kind": "listening", "kernels": "numpy (numba unavailable: No module named 'numba')"},
              {"kind": "fault", "action": "crash"}, {"kind": "listening", "kernels": "numba 0.68.1"}]
    summary = summarize(replay(records), events, records["rejections"], facts_of(recorded(name)))
    assert summary["server_kernels"] == "numba 0.68.1"
    for name in CURRENT:
        assert summary_of(name)["server_kernels"] is None  # their servers did not say


def test_update_parts_skipped_while_a_server_was_down_are_summed_from_the_workers_events():
    name = CURRENT[0]
    records = streams(name)
    events = [*records["events"], {"kind": "reconnected", "worker": 0, "shard": 1, "skipped": 7},
              {"kind": "reconnected", "worker": 1, "shard": 1, "skipped": 5}, {"kind": "worker_finished", "worker": 0, "skipped": 2},
              {"kind": "reconnected", "worker": 2, "version": 9}]  # a worker that waited: no count
    summary = summarize(replay(records), events, records["rejections"], facts_of(recorded(name)))
    assert summary["update_parts_skipped"] == 14
    assert "update_parts_skipped" not in summary_of(name)  # workers that wait: no such key


# -- the outcome, rule by rule ------------------------------------------------------------

CHANCE_LOSS = math.log(10)


def evaluation(accuracy, loss, version=WARMUP_UPDATES):
    return {"accuracy": accuracy, "loss": loss, "version": version}


@pytest.mark.parametrize("final,classes,non_finite,done,expected", [
    (evaluation(0.9, 0.3), 10, 0, "max_updates reached", "ok"),
    (evaluation(0.1, CHANCE_LOSS), 10, 0, "max_updates reached", "dead"),
    (evaluation(0.1, 2.881), 10, 0, "max_updates reached", "dead"),  # a fixed non-uniform guess: loss above ln C
    (evaluation(0.1, CHANCE_LOSS * (1 - LOSS_MARGIN) - 1e-6), 10, 0, "", "ok"),  # below ln C by more than 1 %: learning
    (evaluation(0.1, CHANCE_LOSS * (1 - LOSS_MARGIN) + 1e-6), 10, 0, "", "dead"),
    (evaluation(CHANCE_FACTOR / 10, CHANCE_LOSS), 10, 0, "", "ok"),  # accuracy at 1.5 / classes: not at chance
    (evaluation(CHANCE_FACTOR / 10 - 1e-6, CHANCE_LOSS), 10, 0, "", "dead"),
    (evaluation(0.1, CHANCE_LOSS, WARMUP_UPDATES - 1), 10, 0, "", "unknown"),  # before the warm-up: not judged
    (evaluation(0.1, CHANCE_LOSS), None, 0, "", "unknown"),
    (evaluation(0.1, CHANCE_LOSS), 10, 3, "", "diverged"),  # at chance after NaN: diverged
    (evaluation(0.9, 0.3), 10, 3, "", "ok"),  # a few NaN refused, the model fine: counted, not flagged
    (evaluation(0.1, float("nan")), 10, 0, "", "diverged"),
    (evaluation(float("nan"), 2.0, 5), None, 0, "", "diverged"),
    (evaluation(0.9, 0.3, 5), 10, 0, "diverged: 50 non-finite gradients in a row", "diverged"),
    ({}, 10, 0, "diverged: 50 non-finite gradients in a row", "diverged"),
    ({}, 10, 0, "max_updates reached", "unknown"),
    (evaluation(0.01, 4.6), 100, 0, "", "dead"),  # ln 100 = 4.605
])
def test_outcome(final, classes, non_finite, done, expected):
    outcome, detail = judge(final, classes, non_finite, done)
    assert outcome == expected
    assert (detail == "") == (outcome == "ok")


def federated_rounds(count: int, participants: int) -> list[dict]:
    """A FedAvg server's ``rounds`` trace: ``count`` applied rounds (versions 1..count), and one closed
    without being applied (its 3 reports add nothing to the model)."""
    return [*({"round": v, "version": v, "participants": participants, "applied": True} for v in range(1, count + 1)),
            {"round": count + 1, "version": count, "participants": 3, "applied": False}]


def test_a_federated_model_is_judged_by_the_pushes_behind_it_not_by_its_version():
    """The run that showed it (2026-12-07): FedAvg, 16 clients a round, 22 rounds in 240 s, judged
    "unknown" because 22 versions are under the warm-up, though 352 pushes were behind the model; a
    FedAvg model at chance would then have counted as trained."""
    rounds = federated_rounds(22, 16)
    assert pushes_behind(rounds, 22) == 352 and pushes_behind(rounds, 5) == 80 and pushes_behind(rounds, None) is None
    at_chance, trained = evaluation(0.1, CHANCE_LOSS, 22), evaluation(0.8, 0.56, 22)
    assert judge(at_chance, 10, 0, "", pushes_behind(rounds, 22))[0] == "dead"
    assert judge(trained, 10, 0, "", pushes_behind(rounds, 22)) == ("ok", "")
    outcome, detail = judge(at_chance, 10, 0, "")  # per push, version 22 is 22 pushes: still warming up
    assert outcome == "unknown" and "22 pushes behind it" in detail
    assert judge(evaluation(0.1, CHANCE_LOSS, 5), 10, 0, "", pushes_behind(rounds, 5))[0] == "unknown"  # 80 pushes


def test_the_summary_judges_a_federated_run_through_its_rounds(tmp_path):
    """summarize passes the rounds trace to the judgement: the same counters and final evaluation at
    version 22 are "dead" with 22 rounds of 16 behind them and "unknown" without rounds."""
    healthy = summary_of("healthy-faults")
    counters = SimpleNamespace(**{**vars(replay(streams("healthy-faults"))), "updates": 22,
                                  "final_accuracy": evaluation(0.1, CHANCE_LOSS, 22), "accuracy": None})
    facts = facts_of(healthy)
    with_rounds = summarize(counters, [], [], facts, federated_rounds(22, 16))
    assert with_rounds["outcome"] == "dead" and with_rounds["rounds"]["count"] == 23
    assert summarize(counters, [], [], facts)["outcome"] == "unknown"


def test_wire_bytes_from_the_server_interface_counters():
    marks = {"start": {"server": {"rx_bytes": 1000, "tx_bytes": 50}}, "end": {"server": {"rx_bytes": 12000, "tx_bytes": 9050}}}
    assert wire_bytes(marks, 10000) == {"ingress_wire_bytes": 11000, "egress_wire_bytes": 9000, "wire_overhead_ratio": 1.1}
    assert wire_bytes({}, 10000) == {"ingress_wire_bytes": None, "egress_wire_bytes": None}
    assert wire_bytes(marks, None) == {"ingress_wire_bytes": 11000, "egress_wire_bytes": 9000}


def test_flag_reads_outcome_and_older_summaries_diverged():
    assert [flag({"outcome": o}) for o in ("ok", "unknown", "dead", "diverged")] == ["", "", " (dead)", " (diverged)"]
    assert flag({"diverged": True}) == " (diverged)" and flag({"diverged": False}) == ""


# -- the tables show it ------------------------------------------------------------------


@pytest.fixture
def run_dirs(tmp_path) -> dict[str, Path]:
    """Each recorded trace as a run directory whose summary.json is this code's."""
    out = {}
    for name in ALL:
        path = tmp_path / name
        shutil.copytree(TRACES / name, path)
        (path / "summary.json").write_text(json.dumps(summary_of(name)))
        out[name] = path
    return out


def test_compare_table_marks_diverged_and_dead_runs(run_dirs, tmp_path):
    from emulator.experiments.compare import render_markdown, summarize_run, write_report

    rows = [summarize_run(path, name) for name, path in run_dirs.items()]
    table = render_markdown(write_report(tmp_path, rows)).splitlines()
    lines = {name: next(line for line in table if line.startswith(f"| `{name}`")) for name in run_dirs}
    assert "(diverged)" in lines["diverged-nan"] and "(dead)" in lines["dead-before-fix"]
    assert "(diverged)" not in lines["healthy-faults"] + lines["server-crash"]
    assert "(dead)" not in lines["healthy-faults"] + lines["server-crash"]


def test_sweep_table_counts_diverged_and_dead_runs(run_dirs):
    import pandas as pd

    from analysis.runs import load_run, summary_row
    from analysis.sweep import aggregate, aggregate_rows

    table = pd.DataFrame([{"point": 0, "lr": "mixed", **summary_row(load_run(path))} for path in run_dirs.values()])
    agg = aggregate(table, ["lr"])
    _, rows = aggregate_rows(agg, ["lr"])
    assert rows[0][1] == "4 (4; 1 diverged, 1 dead)"
