"""Traces: the formats of docs/TRACES.md read and checked, expanded into the plan's timed events,
converted from the published formats and generated with a seed."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator.cli import main
from emulator.planning import replay, tracegen, traces
from emulator.planning.plan import make_plan
from emulator.planning.problems import ScenarioError
from emulator.planning.loader import load_scenario

ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """\
name: traced
seed: {seed}
training: {{max_updates: 100, duration: {duration}}}
workers:
  - name: phones
    count: {count}
    cpus: 0.5
    uplink: 5mbit
    downlink: 20mbit
    traces:
{block}
faults:
  at: {at}
"""


def scenario(tmp_path: Path, files: dict[str, str], block: str, *, count: int = 2, seed: int = 3, duration: str = "100s",
             at: str = "[]") -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    path = tmp_path / "scenario.yaml"
    indented = "\n".join("      " + line for line in block.strip().splitlines())
    path.write_text(SCENARIO.format(seed=seed, count=count, duration=duration, block=indented, at=at))
    return path


def plan_of(path: Path, overrides=()):
    return make_plan(load_scenario(path, list(overrides))[0])


def refused(path: Path, overrides=()) -> str:
    with pytest.raises(ScenarioError) as caught:
        plan_of(path, overrides)
    return str(caught.value)


def events(plan, source="trace"):
    return [(e.time_s, e.action, e.target, e.params) for e in plan.events if e.source == source]


AVAILABILITY = "device,start_s,end_s\na,0,10\na,20,30\nb,5,40\n"


# -- reading and expanding ---------------------------------------------------------------------------


def test_availability_becomes_pauses_and_resumes_at_speed_and_offset(tmp_path):
    path = scenario(tmp_path, {"av.csv": AVAILABILITY}, "availability: av.csv\ndevices: in_order\nspeedup: 2\noffset: [0s, 10s]\nloop: false")
    got = events(plan_of(path))
    # a: online 0-10, 20-30 -> at 2x: pause 5, resume 10, pause 15. b from trace time 10 (online 5-40): pause at 15.
    assert got == [(5.0, "pause", "worker-0", {}), (10.0, "resume", "worker-0", {}), (15.0, "pause", "worker-0", {}),
                   (15.0, "pause", "worker-1", {})]


def test_a_looped_trace_repeats_and_offline_can_mean_crash(tmp_path):
    path = scenario(tmp_path, {"av.csv": "device,start_s,end_s\na,0,10\n"},
                    "availability: av.csv\noffline: crash\nlength: 15s", count=1, duration="40s")
    got = events(plan_of(path))
    assert got == [(10.0, "crash", "worker-0", {}), (15.0, "restart", "worker-0", {}), (25.0, "crash", "worker-0", {}),
                   (30.0, "restart", "worker-0", {})]


def test_a_device_offline_at_the_start_is_paused_at_time_zero(tmp_path):
    path = scenario(tmp_path, {"av.csv": "device,start_s,end_s\na,5,50\n"}, "availability: av.csv\nloop: false", count=1)
    assert events(plan_of(path)) == [(0.0, "pause", "worker-0", {}), (5.0, "resume", "worker-0", {}), (50.0, "pause", "worker-0", {})]


def test_a_link_trace_sets_time_zero_and_changes_only_what_changes(tmp_path):
    text = "time_s,up_mbit,down_kbit,delay_ms\n0,4,8000,20\n10,2,8000,20\n20,2,8000,50\n30,4,8000,20\n"
    path = scenario(tmp_path, {"link.csv": text}, "link: link.csv\nloop: false", count=1)
    plan = plan_of(path)
    assert (plan.workers[0].link.uplink_bps, plan.workers[0].link.downlink_bps, plan.workers[0].link.delay_s) == (4e6, 8e6, 0.02)
    assert events(plan) == [(10.0, "link", "worker-0", {"uplink_bps": 2e6}), (20.0, "link", "worker-0", {"delay_s": 0.05}),
                            (30.0, "link", "worker-0", {"uplink_bps": 4e6, "delay_s": 0.02})]


def test_json_lines_and_csv_give_the_same_plan(tmp_path):
    rows = [{"device": "a", "start_s": 0, "end_s": 10}, {"device": "a", "start_s": 20, "end_s": 30}, {"device": "b", "start_s": 5, "end_s": 40}]
    (tmp_path / "av.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    csv_plan = plan_of(scenario(tmp_path, {"av.csv": AVAILABILITY}, "availability: av.csv"))
    jsonl_plan = plan_of(scenario(tmp_path, {}, "availability: av.jsonl"))
    assert events(csv_plan) == events(jsonl_plan) and events(csv_plan)


def test_same_seed_same_bytes_and_another_seed_draws_other_devices(tmp_path):
    many = "device,start_s,end_s\n" + "".join(f"d{i},{i},{i + 30}\n" for i in range(40))
    path = scenario(tmp_path, {"av.csv": many}, "availability: av.csv\noffset: random", count=4)
    assert plan_of(path).dumps() == plan_of(path).dumps()
    assert events(plan_of(path)) != events(plan_of(path, ["seed=4"]))


def test_a_compute_factor_scales_the_groups_quota(tmp_path):
    path = scenario(tmp_path, {"cpu.csv": "time_s,cpu_factor\n0,1\n5,0.5\n"}, "compute: cpu.csv\nloop: false", count=1)
    plan = plan_of(path)
    assert plan.workers[0].cpus == 0.5 and events(plan) == [(5.0, "cpus", "worker-0", {"cpus": 0.25})]


def test_a_population_is_drawn_with_the_seed_and_scaled_with_its_order_kept(tmp_path):
    rows = "".join(f"p{i},{2 ** (i % 7) * (1 + i / 100)},{1000 + i},{5000 + i}\n" for i in range(50))
    path = scenario(tmp_path, {"pop.csv": "device,speed,up_kbit,down_kbit\n" + rows}, "population: pop.csv\ncpu_range: [0.1, 0.8]",
                    count=10)
    plan = plan_of(path)
    speeds = {f"{1000 + i}": 2 ** (i % 7) * (1 + i / 100) for i in range(50)}
    drawn = [(speeds[f"{w.link.uplink_bps / 1e3:.0f}"], w.cpus) for w in plan.workers]
    assert len({up for up, _ in drawn}) == 10  # without replacement
    assert all(0.1 <= cpus <= 0.8 for _, cpus in drawn)
    assert [c for _, c in sorted(drawn)] == sorted(c for _, c in drawn)  # faster devices get more CPU
    assert plan_of(path).dumps() == plan.dumps() and plan_of(path, ["seed=9"]).workers != plan.workers


@pytest.mark.parametrize("scaling", ["log", "rank"])
def test_scaling_keeps_the_rank_and_spans_the_range(scaling):
    import numpy as np

    speeds = np.array([5.0, 1.0, 300.0, 2.0, 2.5])
    cpus = replay.scale_speeds(speeds, 0.05, 0.5, scaling)
    assert list(np.argsort(cpus)) == list(np.argsort(speeds))
    assert cpus.min() == pytest.approx(0.05) and cpus.max() == pytest.approx(0.5)


def test_a_timed_link_change_of_a_traced_worker_is_refused(tmp_path):
    path = scenario(tmp_path, {"link.csv": "time_s,up_mbit\n0,4\n10,2\n"}, "link: link.csv", count=1,
                    at="[{time: 5s, link: {uplink: 1mbit}}]")
    assert "faults.at[0]: a timed link change of worker 0, whose link comes from a trace" in refused(path)


def test_a_trace_pause_that_clashes_with_a_timed_pause_is_refused(tmp_path):
    path = scenario(tmp_path, {"av.csv": "device,start_s,end_s\na,0,10\n"}, "availability: av.csv\nloop: false", count=1,
                    at="[{time: 12s, pause: 0}]")
    assert "pause worker-0 at 12s, but it is paused then" in refused(path)


def test_the_trace_files_are_read_beside_the_scenario_wherever_it_is_run_from(tmp_path, monkeypatch):
    path = scenario(tmp_path, {"av.csv": AVAILABILITY}, "availability: av.csv")
    monkeypatch.chdir(ROOT)
    assert events(plan_of(path))


# -- bad traces: file, line and field named; exit 2 --------------------------------------------------


@pytest.mark.parametrize("kind, text, expected", [
    ("link", "time_s,up_mbit\n0,4\n10,2\n5,3\n", "line 4, field time_s: unsorted: goes back from the time of line 3"),
    ("link", "time_s,up_mbit\n0,4\n10,2\n10,3\n", "line 4, field time_s: repeats the time of line 3"),
    ("link", "time_s,up_mbit\n0,4\n10,-2\n", "line 3, field up_mbit: a rate must be > 0 bits/s, got -2e+06"),
    ("link", "time_s,up_mbit\n5,4\n", "line 2, field time_s: the first row must be at time 0"),
    ("link", "time_s,up_kbps\n0,4\n", "line 1, field up_kbps: unit 'kbps' is ambiguous"),
    ("link", "time,up_mbit\n0,4\n", "line 1, field time: needs its unit in the name: time_s, time_ms"),
    ("link", "time_s,up_mbit\n0,4mbit\n", "line 2, field up_mbit: expected a number, got '4mbit' (the unit goes in the column's name"),
    ("link", "time_s,up_bit\n0,4\n", "line 2, field up_bit: 4 bits/s is less than 1 kbit/s: a wrong unit?"),
    ("link", "time_s,up_mbit\n0,4\n5000000,3\n", "line 3, field time_s: 5e+06 s is more than 31 days: a wrong unit?"),
    ("link", "time_s,up_mbit,loss\n0,4,5\n", "line 2, field loss: a loss must be a fraction between 0 and 1, got 5 (percent: loss_pct)"),
    ("link", "time_s,speed\n0,4\n", "line 1, field speed: unknown column for a link trace"),
    ("link", "time_s,up_mbit\n0,4,5\n", "line 2: 3 fields, the header has 2"),
    ("availability", "device,start_s,end_s\na,0,10\na,5,20\n", "line 3, field start_s: overlaps the interval on line 2 (device a)"),
    ("availability", "device,start_s,end_s\na,20,30\na,0,10\n", "line 3, field start_s: unsorted: starts before the interval on line 2"),
    ("availability", "device,start_s,end_s\na,10,10\n", "line 2, field end_s: an interval must end after it starts"),
    ("availability", "start_s,end_s\n0,10\n", "line 1, field device: missing: a availability trace needs a device column"),
    ("availability", "device,start_s,end_s\n", "no rows"),
    ("compute", "time_s,cpus\n0,0\n", "line 2, field cpus: must be > 0"),
])
def test_a_bad_trace_is_refused_naming_file_line_and_field(tmp_path, kind, text, expected):
    name = "bad.csv"
    path = scenario(tmp_path, {name: text}, f"{kind}: {name}\ndevices: in_order", count=1)
    message = refused(path)
    assert f"workers[0].traces: {kind}: bad.csv, " in message or f"workers[0].traces: {kind}: bad.csv:" in message, message
    assert expected in message, message


def test_a_bad_json_lines_row_names_its_line_and_key(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"time_s": 0, "up_mbit": 4}\n{"time_s": 5, "up_mbits": 4}\n')
    message = refused(scenario(tmp_path, {}, "link: bad.jsonl", count=1))
    assert "bad.jsonl, line 2, field up_mbits: key not in the first row" in message


def test_unknown_device_ids_are_refused(tmp_path):
    path = scenario(tmp_path, {"av.csv": AVAILABILITY}, "availability: av.csv\ndevices: [a, zz]")
    assert "workers[0].traces.devices[1]: unknown device id 'zz': av.csv has no rows for it (its 2 devices: a, b)" in refused(path)
    path = scenario(tmp_path, {"av.csv": AVAILABILITY, "link.csv": "device,time_s,up_mbit\na,0,4\nc,0,3\n"},
                    "availability: av.csv\nlink: link.csv\ndevices: in_order")
    assert "workers[0].traces.link: unknown device id 'b': link.csv has no rows for it" in refused(path)


def test_too_few_trace_devices_for_the_group_is_refused(tmp_path):
    path = scenario(tmp_path, {"av.csv": AVAILABILITY}, "availability: av.csv", count=3)
    assert "workers[0].traces.availability: av.csv has 2 devices, the group needs 3" in refused(path)


def test_a_huge_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 1024)
    big = "time_s,up_mbit\n" + "".join(f"{i},4\n" for i in range(500))
    assert "big.csv: 0 MiB, larger than 0 MiB" in refused(scenario(tmp_path, {"big.csv": big}, "link: big.csv", count=1))


def test_a_trace_that_would_exceed_the_event_cap_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(replay, "MAX_TRACE_EVENTS", 50)
    path = scenario(tmp_path, {"link.csv": "time_s,up_mbit\n0,4\n1,2\n"}, "link: link.csv\nspeedup: 10", count=2)
    message = refused(path)
    assert "workers[0].traces: link.csv (with the scenario's other traces) expands into more than 50 events" in message
    assert "lower the speedup" in message


def test_a_missing_file_and_a_wrong_extension_are_refused(tmp_path):
    assert "availability: nowhere.csv: cannot read the file" in refused(scenario(tmp_path, {}, "availability: nowhere.csv"))
    message = refused(scenario(tmp_path, {"av.txt": AVAILABILITY}, "availability: av.txt"))
    assert "av.txt: unknown trace format '.txt': name it .csv or .jsonl" in message


def test_the_cli_exits_2_naming_the_file_line_and_field(tmp_path):
    path = scenario(tmp_path, {"link.csv": "time_s,up_mbit\n0,4\n10,-1\n"}, "link: link.csv", count=1)
    result = CliRunner().invoke(main, ["plan", str(path)])
    assert result.exit_code == 2
    assert "link.csv, line 3, field up_mbit: a rate must be > 0" in result.output


# -- converters and the generator ---------------------------------------------------------------------


def test_mahimahi_deliveries_become_a_rate_per_window(tmp_path):
    # 1,000 packets in the first 2 s (6 Mbit/s), 250 in the next 2 s (1.5 Mbit/s), then none for 2 s.
    stamps = [i * 2 for i in range(1000)] + [2000 + i * 8 for i in range(250)] + [5999]
    (tmp_path / "up.trace").write_text("\n".join(map(str, stamps)) + "\n")
    result = tracegen.mahimahi(tmp_path / "up.trace", tmp_path / "link.csv", window_s=2.0)
    read = traces.read_trace(tmp_path / "link.csv", "link")
    series = read.series[""]
    assert series.times == (0.0, 2.0, 4.0)
    assert [round(v["up"]) for v in series.values] == [6_000_000, 1_500_000, 10_000]  # the empty window floored at 10 kbit/s
    assert result["windows_floored"] == 0 or result["windows_floored"] == 1


def test_mahimahi_refuses_unsorted_and_non_integer_lines(tmp_path):
    (tmp_path / "bad").write_text("10\n5\n")
    with pytest.raises(traces.TraceError, match=r"bad, line 2, field timestamp: unsorted"):
        tracegen.mahimahi(tmp_path / "bad", tmp_path / "out.csv")
    (tmp_path / "bad").write_text("10\n1.5\n")
    with pytest.raises(traces.TraceError, match=r"line 2, field timestamp: expected a whole number of milliseconds"):
        tracegen.mahimahi(tmp_path / "bad", tmp_path / "out.csv")


def test_fedscale_pickles_convert(tmp_path):
    behaviour = {1: {"active": [0, 100, 50], "inactive": [40, 200, 60], "finish_time": 300}, 2: {"active": [10], "inactive": [10]},
                 3: {"active": [5], "inactive": [25]}}
    (tmp_path / "behave.pkl").write_bytes(pickle.dumps(behaviour))
    result = tracegen.fedscale_behavior(tmp_path / "behave.pkl", tmp_path / "av.csv")
    read = traces.read_trace(tmp_path / "av.csv", "availability")
    assert read.series["1"].times == (0.0, 50.0, 100.0) and read.series["1"].values == (40.0, 60.0, 200.0)
    assert "2" not in read.series and result["dropped_empty"] == 1
    capacity = {7: {"computation": 20.0, "communication": 1500.0}, 8: {"computation": 0, "communication": 10.0}}
    (tmp_path / "cap.pkl").write_bytes(pickle.dumps(capacity))
    assert tracegen.fedscale_capacity(tmp_path / "cap.pkl", tmp_path / "pop.csv")["dropped"] == 1
    row = traces.read_trace(tmp_path / "pop.csv", "population").series["7"].values[0]
    assert row == {"speed": 50.0, "up": 1.5e6, "down": 1.5e6}


def test_a_pickle_that_names_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({1: Evil()}))
    with pytest.raises(traces.TraceError, match="refused: the pickle names builtins.print"):
        tracegen.fedscale_capacity(tmp_path / "evil.pkl", tmp_path / "pop.csv")


def test_plato_lines_convert(tmp_path):
    (tmp_path / "plato.txt").write_text("# id: start_state, [transitions]\n1: 1, [10, 25, 40]\n2: offline, [5]\n")
    tracegen.plato(tmp_path / "plato.txt", tmp_path / "av.csv", length_s=60)
    read = traces.read_trace(tmp_path / "av.csv", "availability")
    assert list(zip(read.series["1"].times, read.series["1"].values)) == [(0.0, 10.0), (25.0, 40.0)]
    assert list(zip(read.series["2"].times, read.series["2"].values)) == [(5.0, 60.0)]
    (tmp_path / "bad.txt").write_text("1: 1, [10, 5]\n")
    with pytest.raises(traces.TraceError, match=r"bad.txt, line 1, field transition times: unsorted"):
        tracegen.plato(tmp_path / "bad.txt", tmp_path / "av.csv")


@pytest.mark.parametrize("kind", tracegen.GENERATORS)
def test_the_generator_is_seeded_and_writes_what_scenarios_read(kind, tmp_path):
    out = "a.trace" if kind == "mahimahi" else "a.csv"
    args = ["traces", "generate", kind, str(tmp_path / out), "--devices", "3", "--duration", "1min", "--seed", "5"]
    assert CliRunner().invoke(main, args).exit_code == 0
    first = (tmp_path / out).read_bytes()
    assert CliRunner().invoke(main, args).exit_code == 0 and (tmp_path / out).read_bytes() == first
    assert CliRunner().invoke(main, [*args[:-1], "6"]).exit_code == 0 and (tmp_path / out).read_bytes() != first
    if kind == "mahimahi":
        result = CliRunner().invoke(main, ["traces", "convert", "--from", "mahimahi", str(tmp_path / out), str(tmp_path / "l.jsonl")])
        assert result.exit_code == 0, result.output
        assert traces.read_trace(tmp_path / "l.jsonl", "link").columns == ("time", "up")


def test_convert_refuses_an_option_of_another_format(tmp_path):
    result = CliRunner().invoke(main, ["traces", "convert", "--from", "plato", "a.txt", "b.csv", "--window", "2s"])
    assert result.exit_code == 2 and "--window does not apply to --from plato" in result.output


def test_the_example_scenarios_plan_with_trace_events():
    for path in sorted((ROOT / "scenarios" / "traces").glob("*.yaml")):
        plan = plan_of(path)
        assert any(e.source == "trace" for e in plan.events), path.name


def test_the_committed_example_traces_are_what_the_documented_commands_make(tmp_path):
    """docs/TRACES.md lists the commands that made scenarios/traces/*.csv: rerun, they give the same bytes."""
    import shlex

    section = (ROOT / "docs" / "TRACES.md").read_text().split("## The generator and the examples")[1].split("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("emulate traces ")]
    made = []
    for line in lines:
        if "scenarios/traces/" not in line and "/tmp/traces/" not in line:
            continue
        args = [a.replace("scenarios/traces/", f"{tmp_path}/").replace("/tmp/traces/", f"{tmp_path}/") for a in shlex.split(line)[1:]]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (line, result.output)
        made += [a for a in shlex.split(line) if a.startswith("scenarios/traces/") and a.endswith(".csv")]
    committed = sorted(p.name for p in (ROOT / "scenarios" / "traces").glob("*.csv"))
    assert sorted({Path(m).name for m in made}) == committed
    for name in committed:
        assert (tmp_path / name).read_bytes() == (ROOT / "scenarios" / "traces" / name).read_bytes(), name
