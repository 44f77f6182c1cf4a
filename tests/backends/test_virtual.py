"""The virtual backend: its clock, its timing models, and runs that a seed determines bit for bit.

The contract every backend owes a run is in ``test_contract.py`` (parametrised over the registry,
the virtual backend included); here what only a simulated clock can promise or must refuse.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import read_json, run_scenario
from emulator.backends.virtual.clock import Clock
from emulator.backends.virtual.timing import WIRE_OVERHEAD, CpuQuota, SharedLink, TokenBucket, tcp_rate_bps
from emulator.planning.problems import ScenarioError

SCENARIO = """\
name: virtual-determinism
seed: 11
model: mlp
dataset: {name: digits, partition: iid}
training: {batch_size: 10, learning_rate: 0.1, max_updates: 160, eval_every: 1s}
method: {name: adacomp, c: 0.05}
server: {cpus: 0.5, uplink: 4mbit, downlink: 4mbit}
evaluator: {cpus: 0.25}
workers:
  - {count: 3, cpus: {uniform: [0.1, 0.4]}, uplink: 2mbit, downlink: 8mbit, delay: 20ms, jitter: 5ms, loss: 0.5%}
faults:
  at:
    - {time: 1s, crash: 0, restart_after: 1s}
    - {time: 1.5s, pause: 1, for: 0.5s}
    - {time: 1s, link: {uplink: 1mbit}, workers: 2}
"""
STREAMS = ("updates", "accuracy", "steps", "traffic", "server")


# -- the clock and its models ------------------------------------------------------------------


def test_the_clock_runs_in_time_order_and_breaks_ties_in_scheduling_order():
    clock, seen = Clock(), []
    for name, t in (("b", 2.0), ("a", 1.0), ("c", 2.0), ("d", 1.0)):
        clock.at(t, seen.append, name)
    dead = clock.at(0.5, seen.append, "cancelled")
    dead.cancel()
    clock.run()
    assert seen == ["a", "d", "b", "c"] and clock.now == 2.0


def test_a_cfs_quota_delays_work_to_the_next_period_once_the_periods_quota_is_spent():
    cpu = CpuQuota(0.3, period_s=0.1)  # 30 ms of CPU in each 100 ms period
    assert cpu.finish(0.0, 0.025) == pytest.approx(0.025)  # within the quota: full speed
    # a 1.5 ms compression right after fits the 5 ms left ...
    assert cpu.finish(0.025, 0.0015) == pytest.approx(0.0265)
    # ... a 10 ms one does not: 3.5 ms now, the rest once the next period starts
    assert cpu.finish(0.0265, 0.010) == pytest.approx(0.1065)
    # 100 ms of work at 0.3 of a core: three full periods and a bit, not 100 / 0.3 = 333 ms
    assert CpuQuota(0.3, period_s=0.1).finish(0.0, 0.1) == pytest.approx(0.31)
    assert CpuQuota(1.0).finish(5.0, 0.2) == pytest.approx(5.2)


def test_the_server_link_is_shared_max_min_among_the_transfers_in_flight():
    clock, done = Clock(), {}
    link = SharedLink(clock, 1e6)  # 1 Mbit/s on the wire
    payload = 1e6 / WIRE_OVERHEAD  # what one second of it carries
    link.send(payload / 2, math.inf, lambda: done.setdefault("a", clock.now))
    link.send(payload / 2, math.inf, lambda: done.setdefault("b", clock.now))
    clock.run()
    assert done["a"] == pytest.approx(1.0) and done["b"] == pytest.approx(1.0)  # each had half, both end together
    clock, done = Clock(), {}
    link = SharedLink(clock, 1e6)
    link.send(0.2 * payload, 0.2 * payload, lambda: done.setdefault("slow", clock.now))  # capped by its own device
    link.send(0.8 * payload, math.inf, lambda: done.setdefault("fast", clock.now))  # takes what is left
    clock.run()
    assert done["slow"] == pytest.approx(1.0) and done["fast"] == pytest.approx(1.0)
    clock, done = Clock(), {}
    link = SharedLink(clock, 1e6)
    link.send(0.5 * payload, math.inf, lambda: done.setdefault("short", clock.now))
    link.send(1.5 * payload, math.inf, lambda: done.setdefault("long", clock.now))
    clock.run()  # half each until the short one ends at 1 s; then the long one has the link: its last 1.0 by 2 s
    assert done["short"] == pytest.approx(1.0) and done["long"] == pytest.approx(2.0)


def test_an_idle_shaper_sends_its_bucket_at_once_and_refills_at_its_rate():
    bucket, rate, burst = TokenBucket(), 8e6, 65536.0  # 1 MB/s, 64 KiB bucket
    assert bucket.take(0.0, rate, burst, 20_000) == 20_000  # a push smaller than the bucket leaves at once
    assert bucket.take(0.0, rate, burst, 100_000) == burst - 20_000  # what is left of it, the rest at the rate
    bucket.empty_at(0.1)  # that transfer ended at 0.1 s
    assert bucket.take(0.11, rate, burst, 100_000) == pytest.approx(10_000)  # 10 ms of refill at 1 MB/s
    bucket.empty_at(0.2)
    assert bucket.take(5.0, rate, burst, 1e9) == burst  # idle for long: a full bucket, never more


def test_loss_caps_tcp_throughput_and_headers_cost_their_share():
    assert tcp_rate_bps(10e6, 0.01, 0.0) == pytest.approx(10e6 / WIRE_OVERHEAD)
    lossy = tcp_rate_bps(10e6, 0.05, 0.01)  # RTT 100 ms, 1 % loss: about 1.4 Mbit/s
    assert 1.2e6 < lossy < 1.6e6
    assert tcp_rate_bps(None, 0.0, 0.0) == math.inf


# -- runs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory):
    """The same scenario and seed run twice on the virtual backend, with one calibration file."""
    out = tmp_path_factory.mktemp("virtual")
    path = out / "scenario.yaml"
    path.write_text(SCENARIO)
    mp = pytest.MonkeyPatch()
    mp.setenv("EDGE_EMULATOR_CALIBRATION", str(out / "calibration.json"))
    try:
        runs = [run_scenario(path, out / f"runs-{i}", backend="virtual") for i in range(2)]
    finally:
        mp.undo()
    return runs


def test_same_scenario_and_seed_give_bit_identical_models_traces_and_summaries(twin_runs):
    (first, a), (second, b) = twin_runs
    assert first["status"] == "completed" and first["updates_applied"] == 160
    for stream in STREAMS:
        assert (a / f"{stream}.jsonl").read_bytes() == (b / f"{stream}.jsonl").read_bytes(), stream
    events = [[{k: v for k, v in e.items() if k != "run_id"} for e in map(json.loads, (r / "events.jsonl").read_text().splitlines())]
              for r in (a, b)]
    assert events[0] == events[1]
    assert (a / "final_model.npy").read_bytes() == (b / "final_model.npy").read_bytes()
    assert {k: v for k, v in first.items() if k != "run_id"} == {k: v for k, v in second.items() if k != "run_id"}
    assert not np.array_equal(np.load(a / "final_model.npy"), np.load(a / "workload" / "initial.npy"))  # it trained


def test_times_are_virtual_and_the_calibration_is_recorded(twin_runs):
    (summary, run), _ = twin_runs
    assert summary["clock"] == "virtual" and summary["time_unit"] == "virtual seconds"
    used = read_json(run / "calibration.json")
    assert summary["calibration"] == {"file": "calibration.json", "digest": used["digest"]}
    assert len(used["entries"]) == 3 and all(e["cpu_s"] > 0 and e["provenance"]["cpu_model"] is not None for e in used["entries"].values())
    wall = read_json(run / "virtual_wall.json")
    assert wall["updates"] == 160 and wall["floor_s"] > 0 and wall["wall_s"] > 0


FEDERATED = """\
name: virtual-federated
seed: 3
model: mlp
dataset: {name: digits, partition: iid}
training: {batch_size: 10, learning_rate: 0.05, max_updates: 30, eval_every: 10 updates}
method: {name: topk, c: 0.2, error_feedback: true, rule: plain, pull: delta, local: {steps: 4},
         aggregation: {name: fedavg, sample: 3, deadline: 0.5s}}
server: {cpus: 0.5}
evaluator: {cpus: 0.25}
workers:
  - {count: 4, cpus: 0.2, uplink: 2mbit, downlink: 8mbit, delay: 20ms}
faults:
  at:
    - {time: 0.2s, pause: [0, 1], for: 1s}
"""


def test_federated_rounds_local_steps_and_deadlines_run_on_the_virtual_clock(tmp_path, monkeypatch):
    # Not silently the parameter-server path: FedAvg's sample, its deadline in virtual seconds, clients'
    # local steps and their deltas, the same twice.
    path = tmp_path / "federated.yaml"
    path.write_text(FEDERATED)
    monkeypatch.setenv("EDGE_EMULATOR_CALIBRATION", str(tmp_path / "calibration.json"))
    (first, a), (second, b) = (run_scenario(path, tmp_path / f"runs-{i}", backend="virtual") for i in range(2))
    assert first["status"] == "completed" and first["updates_applied"] == 30
    rounds = [json.loads(line) for line in (a / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == first["rounds"]["count"] >= 30 and all(r["sampled"] <= 3 for r in rounds)
    assert max(r["duration_s"] for r in rounds) <= 0.5 + 0.021  # no round outlives its deadline (virtual s, one tick)
    # workers 0 and 1 offline from 0.2 s to 1.2 s: the rounds drawn meanwhile sample the two that are there
    during = [r for r in rounds if 0.25 < r["ts"] - r["duration_s"] and r["ts"] < 1.2]
    assert during and all(r["sampled"] == 2 for r in during)
    assert any(r["sampled"] == 3 for r in rounds if r["ts"] - r["duration_s"] > 1.25)  # and all three once they are back
    plan = json.loads((a / "plan.json").read_text())
    assert plan["method"]["aggregation"]["name"] == "fedavg" and plan["method"]["local"]["steps"] == 4
    held = [u for u in map(json.loads, (a / "updates.jsonl").read_text().splitlines()) if u.get("held")]
    assert held  # the clients' deltas wait for their round, as on the real server
    assert (a / "final_model.npy").read_bytes() == (b / "final_model.npy").read_bytes()
    assert (a / "rounds.jsonl").read_bytes() == (b / "rounds.jsonl").read_bytes()


def test_faults_play_at_their_virtual_instants(twin_runs):
    (summary, run), _ = twin_runs
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    faults = {(e["action"], e["target"]): e["ts"] for e in events if e.get("kind") == "fault"}
    assert faults[("crash", "worker-0")] == 1.0 and faults[("restart", "worker-0")] == 2.0
    assert faults[("pause", "worker-1")] == 1.5 and faults[("resume", "worker-1")] == 2.0
    updates = [json.loads(line) for line in (run / "updates.jsonl").read_text().splitlines()]
    # worker 0 is down from 1 s to 2 s: what it had on the wire may still land just after, then nothing until it is back
    assert not any(u["worker"] == 0 and 1.5 < u["ts"] < 2.0 for u in updates)
    assert any(u["worker"] == 0 and u["ts"] > 2.0 for u in updates)
    assert [e["incarnation"] for e in events if e.get("kind") == "connected" and e.get("worker") == 0] == [0, 1]


def test_what_the_virtual_backend_does_not_model_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "server-crash.yaml"
    path.write_text(SCENARIO.replace("    - {time: 1s, crash: 0, restart_after: 1s}", "    - {time: 1s, crash: server, restart_after: 1s}"))
    with pytest.raises(ScenarioError) as caught:
        run_scenario(path, tmp_path / "runs", backend="virtual")
    assert caught.value.problems[0].path == "faults.at" and "server" in caught.value.problems[0].message
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_command_line_refuses_it_with_exit_2(tmp_path):
    from click.testing import CliRunner

    from emulator.cli import main

    path = tmp_path / "server-crash.yaml"
    path.write_text(SCENARIO.replace("    - {time: 1s, crash: 0, restart_after: 1s}", "    - {time: 1s, crash: server, restart_after: 1s}"))
    result = CliRunner().invoke(main, ["run", str(path), "--backend", "virtual", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert "faults.at" in result.output and "not modelled by the virtual backend" in result.output


def test_calibrate_measures_what_a_scenario_needs_with_its_provenance(tmp_path):
    from click.testing import CliRunner

    from emulator.cli import main

    path = tmp_path / "scenario.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "calibration.json"
    result = CliRunner().invoke(main, ["calibrate", str(path), "--out", str(out), "--repeat", "5"])
    assert result.exit_code == 0, result.output
    entries = json.loads(out.read_text())["entries"]
    assert sorted(key.split("|")[0] for key in entries) == ["compress", "server", "step"]
    for entry in entries.values():
        assert 0 < entry["p10_s"] <= entry["cpu_s"] <= entry["p90_s"] and entry["samples"] == 5
        assert entry["provenance"]["command"].startswith("emulate calibrate") and entry["provenance"]["cores"]
    assert "mlp" in next(k for k in entries if k.startswith("step")) and "batch=10" in next(k for k in entries if k.startswith("step"))
    server = next(v for k, v in entries.items() if k.startswith("server"))
    # a worker's CPU to read and apply a reply: per byte, and whole replies of about the model's size
    assert server["receive_cpu_s_per_byte"] > 0 and server["receive_cpu_s"] > 0
    assert server["receive_mean_bytes"] > 4 * 1000  # dense pulls: each reply is the whole float32 model (thousands of parameters)
    assert 0.2 < server["receive_cpu_s_per_byte"] * server["receive_mean_bytes"] / server["receive_cpu_s"] < 5


def test_a_calibration_measured_before_the_receive_cost_existed_is_measured_again(tmp_path):
    from emulator.backends.virtual import calibration

    keys = calibration.Keys("step|a", "compress|a", "server|a")
    store = calibration.Store(tmp_path / "c.json")
    old = {"cpu_s": 1e-3, "p10_s": 1e-3, "p90_s": 1e-3, "samples": 3}
    store.add({keys.step: old, keys.compress: old, keys.server: {**old, "pull_cpu_s": 1e-4}})
    assert store.missing(keys) == [keys.server]
    store.add({keys.server: {**old, "pull_cpu_s": 1e-4, "receive_cpu_s_per_byte": 1e-9}})
    assert store.missing(keys) == []


def test_the_worker_loop_is_calibrated_from_the_containers_cpu_counters_and_recorded_when_used(tmp_path):
    """A Docker run's workers used 7.5 ms of CPU a step, 5 of them on the gradient and 0.5 on the
    compression (their step records), 1 reading 100 kB of reply: the loop's 1 ms is the rest."""
    import json

    from analysis.runs import container_usage
    from emulator.backends.virtual import calibration

    keys = calibration.Keys("step|m|batch=10", "compress|a", "server|a")
    entries = {keys.step: {"cpu_s": 7e-3}, keys.compress: {"cpu_s": 0.4e-3},  # in process: not what the containers saw
               keys.server: {"cpu_s": 1e-3, "pull_cpu_s": 1e-4, "receive_cpu_s_per_byte": 1e-8}}
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"backend": "docker", "training_started_ts": 100.0, "seed": 1}))
    steps, stats = [], []
    for i, name in enumerate(("worker-0", "worker-1", "worker-2")):
        loop = (0.5e-3, 1e-3, 1.5e-3)[i]
        for second in range(10):  # 10 steps a second, each pulling 100 kB: 1 ms of reading at 1e-8 s a byte
            steps.append({"ts": 100.0 + second + 1, "source": name, "steps": 10, "pull_bytes": 1_000_000,
                          "compute_cpu_ms": 5.0, "compress_cpu_ms": 0.5})
        stats += [{"ts": 100.0 + t, "device": name, "cpu_s": 3.0 + t * 10 * (6.5e-3 + loop)} for t in (0.5, 10.5)]
        stats.append({"ts": 90.0, "device": name, "cpu_s": 0.1})  # before training: not counted
    (run / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (run / "stats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stats))
    (loop,) = calibration.loop_from_run(container_usage(run), entries, keys).values()
    assert loop["cpu_s"] == pytest.approx(1e-3) and loop["samples"] == 3
    assert (loop["step_cpu_s"], loop["compress_cpu_s"]) == pytest.approx((5e-3, 0.5e-3))
    assert loop["provenance"]["workers"]["worker-0"]["cpu_per_step_s"] == pytest.approx(7e-3)
    store = calibration.Store(tmp_path / "c.json")
    store.add({**entries, keys.loop: loop})
    assert keys.loop in store.used(keys)["entries"] and store.missing(keys) == []  # optional: never measured at first use
    (run / "summary.json").write_text(json.dumps({"backend": "local", "training_started_ts": 100.0}))
    with pytest.raises(ValueError, match="docker"):
        calibration.loop_from_run(container_usage(run), entries, keys)


def test_the_server_links_delay_is_on_every_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_EMULATOR_CALIBRATION", str(tmp_path / "calibration.json"))
    path = tmp_path / "s.yaml"
    times = {}
    for delay in ("0ms", "50ms"):
        path.write_text(SCENARIO.replace("server: {cpus: 0.5, uplink: 4mbit, downlink: 4mbit}",
                                         f"server: {{cpus: 0.5, uplink: 4mbit, downlink: 4mbit, delay: {delay}}}")
                        .split("faults:")[0])
        summary, _ = run_scenario(path, tmp_path / delay, backend="virtual")
        times[delay] = summary["duration_s"]
    # 160 updates by 3 workers: about 53 round trips each, 100 ms more apiece
    assert times["50ms"] - times["0ms"] > 0.8 * 160 / 3 * 0.1


def test_a_calibrated_worker_loop_is_charged_on_every_step_and_recorded(tmp_path, monkeypatch):
    import json

    from emulator.backends.virtual import calibration

    store_path = tmp_path / "calibration.json"
    monkeypatch.setenv("EDGE_EMULATOR_CALIBRATION", str(store_path))
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.split("faults:")[0])
    plain, _ = run_scenario(path, tmp_path / "plain", backend="virtual")
    used = json.loads((tmp_path / "plain" / plain["run_id"] / "calibration.json").read_text())["entries"]
    keys = calibration.Keys(*(next(k for k in used if k.startswith(kind)) for kind in ("step|", "compress|", "server|")))
    store = calibration.Store(store_path)
    measured = used[keys.step]["cpu_s"], used[keys.compress]["cpu_s"]  # the containers' parts as measured here, and a loop
    store.add({keys.loop: {"cpu_s": 0.02, "p10_s": 0.02, "p90_s": 0.02, "samples": 3, "step_cpu_s": measured[0],
                           "compress_cpu_s": measured[1]}})
    looped, _ = run_scenario(path, tmp_path / "looped", backend="virtual")
    assert keys.loop in json.loads((tmp_path / "looped" / looped["run_id"] / "calibration.json").read_text())["entries"]
    # 20 ms more CPU a step under quotas of 0.1-0.4 core: each of about 53 steps a worker 50-200 ms longer
    assert looped["duration_s"] > plain["duration_s"] + 53 * 0.05 * 0.8
