"""The planner: pure and seeded (same scenario and seed, same bytes), distributions drawn within
their bounds, random crashes that are statistically right and never clash with the schedule,
explicit events expanded and checked, independent streams per group and per worker."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator.cli import main
from emulator.planning.plan import EventPlan, Plan, make_plan, worker_name
from emulator.planning.loader import load_scenario
from emulator.planning.problems import ScenarioError
from emulator.planning.scenario import validate

HERE = Path(__file__).resolve().parents[1]  # tests/
FULL = HERE / "scenarios" / "full.yaml"


def scenario(workers=None, faults=None, seed=0, **extra) -> dict:
    return {
        "name": "t", "seed": seed, "training": extra.pop("training", {"max_updates": 10}),
        "workers": workers if workers is not None else [{"count": 2}],
        **({"faults": faults} if faults is not None else {}), **extra,
    }


def plan_of(data: dict) -> Plan:
    return make_plan(validate(data))


def plan_problems(data: dict) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        plan_of(data)
    return [str(p) for p in info.value.problems]


def events(plan: Plan, source: str | None = None) -> list[tuple[float, str, str]]:
    return [(e.time_s, e.action, e.target) for e in plan.events if source is None or e.source == source]


def by_worker(plan: Plan) -> dict[str, list[EventPlan]]:
    out: dict[str, list[EventPlan]] = defaultdict(list)
    for e in plan.events:
        out[e.target].append(e)
    return out


# -- determinism -----------------------------------------------------------------------------


def test_same_scenario_and_seed_give_identical_bytes():
    first = make_plan(load_scenario(FULL)[0]).dumps()
    second = make_plan(load_scenario(FULL)[0]).dumps()
    assert first == second
    assert json.loads(first)["seed"] == 42


def test_same_bytes_through_the_cli():
    runs = [CliRunner().invoke(main, ["plan", str(FULL), "--json"]) for _ in range(2)]
    assert [r.exit_code for r in runs] == [0, 0]
    assert runs[0].output == runs[1].output
    assert runs[0].output == make_plan(load_scenario(FULL)[0]).dumps()


def test_dumps_is_canonical_json():
    plan = make_plan(load_scenario(FULL)[0])
    text = plan.dumps()
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, indent=1) + "\n"
    assert set(data) == {"name", "seed", "model", "dataset", "training", "method", "backend", "horizon_s", "server",
                         "evaluator", "workers", "events", "triggers", "checkpoint"}
    assert len(data["workers"]) == 10 and data["workers"][3]["name"] == "worker-3"
    assert plan.digest() == make_plan(load_scenario(FULL)[0]).digest() and len(plan.digest()) == 16


def test_a_different_seed_changes_the_draws():
    base = make_plan(load_scenario(FULL)[0])
    other = make_plan(load_scenario(FULL, ["seed=43"])[0])
    assert [w.cpus for w in base.workers[5:]] != [w.cpus for w in other.workers[5:]]
    assert [w.link.uplink_bps for w in base.workers[5:]] != [w.link.uplink_bps for w in other.workers[5:]]
    assert [w.seed for w in base.workers] != [w.seed for w in other.workers]
    # fixed values do not depend on the seed
    assert [w.cpus for w in base.workers[:5]] == [w.cpus for w in other.workers[:5]]


def test_device_seeds_differ_between_devices():
    plan = make_plan(load_scenario(FULL)[0])
    seeds = [d.seed for d in plan.devices]
    assert len(set(seeds)) == len(seeds)


# -- devices ---------------------------------------------------------------------------------


def test_devices_of_the_full_scenario():
    plan = make_plan(load_scenario(FULL)[0])
    assert [d.name for d in plan.devices] == ["server", "evaluator"] + [f"worker-{i}" for i in range(10)]
    assert [w.index for w in plan.workers] == list(range(10))
    assert [w.group for w in plan.workers] == ["fixed"] * 2 + ["listed"] * 3 + ["drawn"] * 5
    server = plan.device("server")
    assert (server.role, server.cpus, server.memory_bytes) == ("server", 2.0, 512 * 1024**2)
    assert (server.link.uplink_bps, server.link.downlink_bps, server.link.delay_s) == (100e6, 1e9, pytest.approx(0.005))
    w0 = plan.device("worker-0")
    assert (w0.cpus, w0.memory_bytes, w0.link.uplink_bps, w0.link.downlink_bps) == (0.25, 256 * 1024**2, 2e6, 1e6)
    assert (w0.link.delay_s, w0.link.jitter_s, w0.link.loss) == pytest.approx((0.03, 0.005, 0.001))
    with pytest.raises(KeyError):
        plan.device("worker-10")


def test_per_device_lists_map_in_order():
    plan = make_plan(load_scenario(FULL)[0])
    listed = plan.workers[2:5]
    assert [w.cpus for w in listed] == [0.1, 0.2, 0.3]
    assert [w.link.uplink_bps for w in listed] == [1e6, 2e6, 3e6]
    assert [w.link.delay_s for w in listed] == pytest.approx([0.01, 0.02, 0.03])
    assert [w.link.loss for w in listed] == pytest.approx([0.0, 0.005, 0.01])
    assert [w.link.downlink_bps for w in listed] == [None] * 3


def test_unnamed_groups_get_a_group_label():
    plan = plan_of(scenario([{"count": 1}, {"count": 1, "name": "b"}, {"count": 1}]))
    assert [w.group for w in plan.workers] == ["group-0", "b", "group-2"]


N = 2000


def drawn(group: dict, seed: int = 3) -> list:
    return list(plan_of(scenario([{"count": N, **group}], seed=seed)).workers)


def test_uniform_draws_stay_in_range_and_spread():
    cpus = [w.cpus for w in drawn({"cpus": {"uniform": [0.1, 0.3]}})]
    assert all(0.1 <= c <= 0.3 for c in cpus)
    assert statistics.mean(cpus) == pytest.approx(0.2, abs=0.01)  # sd of the mean ~0.0013
    assert min(cpus) < 0.11 and max(cpus) > 0.29


def test_normal_draws_respect_the_clip():
    rates = [w.link.uplink_bps for w in drawn({"uplink": {"normal": ["2mbit", "1mbit"], "clip": ["1mbit", "3mbit"]}})]
    assert all(1e6 <= r <= 3e6 for r in rates)
    # about 16% of draws fall beyond each bound and are clipped onto it
    assert 0.1 < rates.count(1e6) / N < 0.22 and 0.1 < rates.count(3e6) / N < 0.22
    assert statistics.mean(rates) == pytest.approx(2e6, rel=0.03)


def test_normal_without_clip_has_the_right_moments():
    delays = [w.link.delay_s for w in drawn({"delay": {"normal": {"mean": "50ms", "std": "5ms"}}})]
    assert statistics.mean(delays) == pytest.approx(0.05, abs=0.001)  # sd of the mean ~0.0001
    assert statistics.stdev(delays) == pytest.approx(0.005, rel=0.1)


def test_choice_draws_follow_the_weights():
    rates = [w.link.downlink_bps for w in drawn({"downlink": {"choice": ["5mbit", "10mbit"], "weights": [3, 1]}})]
    assert set(rates) == {5e6, 10e6}
    assert 0.70 < rates.count(5e6) / N < 0.80  # 0.75 +- 0.01 (one sd)


def test_choice_without_weights_is_uniform():
    jitters = [w.link.jitter_s for w in drawn({"jitter": {"choice": ["0ms", "1ms", "2ms", "3ms"]}})]
    for value in (0.0, 0.001, 0.002, 0.003):
        assert 0.2 < jitters.count(value) / N < 0.3


def test_zero_weight_choices_are_never_drawn():
    loss = [w.link.loss for w in drawn({"loss": {"choice": ["0%", "1%"], "weights": [1, 0]}})]
    assert set(loss) == {0.0}


def test_a_draw_outside_the_bounds_is_refused():
    problems = plan_problems(scenario([{"count": 50, "cpus": {"normal": [0.2, 0.5]}}], seed=1))
    assert len(problems) == 1
    assert problems[0].startswith("workers[0].cpus: a draw gave -")
    assert problems[0].endswith("add or tighten 'clip'")
    loss = plan_problems(scenario([{"count": 50, "loss": {"normal": ["5%", "10%"]}}], seed=1))
    assert loss[0].startswith("workers[0].loss: a draw gave")


def test_adding_a_second_group_does_not_change_the_first():
    first = {"name": "a", "count": 20, "cpus": {"uniform": [0.1, 0.9]}, "uplink": {"normal": ["5mbit", "1mbit"], "clip": ["1mbit", "9mbit"]},
             "delay": {"choice": ["10ms", "20ms", "30ms"]}}
    second = {"name": "b", "count": 30, "cpus": {"uniform": [0.1, 0.9]}, "loss": {"uniform": [0, 0.01]}}
    crash = {"crash": {"rate_per_hour": 30, "restart_after": "1min"}}
    alone = plan_of(scenario([first], faults=crash, training={"duration": "1h"}))
    both = plan_of(scenario([first, second], faults=crash, training={"duration": "1h"}))
    assert both.workers[:20] == alone.workers
    assert [e for e in both.events if int(e.target.split("-")[1]) < 20] == list(alone.events)
    assert len(both.events) > len(alone.events) > 0


def test_adding_faults_does_not_change_the_devices():
    group = {"count": 10, "cpus": {"uniform": [0.1, 0.9]}}
    quiet = plan_of(scenario([group]))
    faulty = plan_of(scenario([group], faults={"crash": {"rate_per_hour": 10}, "at": [{"time": 5, "pause": 1}]}))
    assert quiet.workers == faulty.workers


# -- random crashes --------------------------------------------------------------------------


def crash_plan(workers: int, rate: float, restart_after=None, seed=11, horizon="1h", extra_events=None) -> Plan:
    crash = {"rate_per_hour": rate, **({"restart_after": restart_after} if restart_after is not None else {})}
    faults = {"horizon": horizon, "crash": crash, **({"at": extra_events} if extra_events else {})}
    return plan_of(scenario([{"count": workers}], faults=faults, seed=seed))


@pytest.fixture(scope="module")
def busy() -> Plan:
    """200 workers, 60 crashes per hour each, restart 1 s later, over 1 h."""
    return crash_plan(200, 60, restart_after="1s")


def test_crash_counts_match_the_rate(busy):
    # a renewal process with mean cycle 61 s, over 1 h
    per_worker = by_worker(busy)
    counts = [sum(e.action == "crash" for e in per_worker[worker_name(i)]) for i in range(200)]
    expected = 3600 / 61  # ~59.0 per worker; the sd of the mean over 200 workers is ~0.54
    assert statistics.mean(counts) == pytest.approx(expected, rel=0.10)
    assert 0 < statistics.pstdev(counts) < 2 * math.sqrt(expected)  # Poisson-like spread, not all the same


def test_crash_gaps_are_exponential(busy):
    gaps = []
    for evs in by_worker(busy).values():
        restarts = [e.time_s for e in evs if e.action == "restart"]
        crashes = [e.time_s for e in evs if e.action == "crash"]
        gaps += [c - r for r, c in zip(restarts, crashes[1:])]
    mean = statistics.mean(gaps)
    assert mean == pytest.approx(60, rel=0.05)  # ~11,000 gaps: sd of the mean ~0.6 s
    assert statistics.pstdev(gaps) / mean == pytest.approx(1.0, abs=0.1)  # an exponential's sd equals its mean


def test_without_restart_a_worker_crashes_at_most_once_and_stays_down():
    # rate 1/h over 1 h: a worker crashes within the horizon with probability 1 - 1/e
    plan = crash_plan(2000, 1)
    per_worker = by_worker(plan)
    assert all([e.action for e in evs] == ["crash"] for evs in per_worker.values())
    assert len(per_worker) / 2000 == pytest.approx(1 - math.exp(-1), abs=0.05)  # sd ~0.011
    assert all(e.source == "random" for e in plan.events)


def test_restart_follows_crash_by_restart_after():
    plan = crash_plan(50, 20, restart_after="45s")
    for evs in by_worker(plan).values():
        actions = [e.action for e in evs]
        assert actions[::2] == ["crash"] * len(actions[::2])
        assert actions[1::2] == ["restart"] * len(actions[1::2])
        for crash, restart in zip(evs[::2], evs[1::2]):
            assert restart.time_s - crash.time_s == pytest.approx(45, abs=0.002)  # times are rounded to 1 ms
        assert len(evs) % 2 == 0 or evs[-1].time_s + 45 >= 3600  # a last crash near the horizon restarts after it


def test_crashes_stay_inside_the_horizon():
    plan = crash_plan(100, 30, restart_after="1min", horizon="10min")
    assert plan.horizon_s == 600
    assert plan.events and all(0 < e.time_s < 600 for e in plan.events)


def test_the_horizon_defaults_to_the_duration_then_one_hour():
    assert plan_of(scenario(training={"duration": "5min"})).horizon_s == 300
    assert plan_of(scenario()).horizon_s == 3600
    assert plan_of(scenario(training={"duration": "5min"}, faults={"horizon": "2min"})).horizon_s == 120


def test_crash_process_targets_a_group():
    plan = plan_of(scenario([{"name": "a", "count": 5}, {"name": "b", "count": 5}], training={"duration": "1h"},
                            faults={"crash": {"rate_per_hour": 20, "workers": "b"}}))
    assert plan.events and {e.target for e in plan.events} <= {worker_name(i) for i in range(5, 10)}


def test_rate_zero_means_no_crashes():
    assert crash_plan(10, 0, restart_after="1s").events == ()


def test_an_absurd_crash_rate_is_refused_not_drawn():
    problems = plan_problems(scenario(faults={"crash": {"rate_per_hour": 1e12, "restart_after": 0}}))
    assert problems == ["faults.crash.rate_per_hour: about 2,000,000,000,000 random crashes over the 3600s horizon; "
                        "at most 100,000 (lower the rate or faults.horizon)"]


SCHEDULE = [
    {"time": "5min", "pause": [0, 1], "for": "2min"},
    {"time": "10min", "crash": 2, "restart_after": "3min"},
    {"time": "15min", "crash": 3},
    {"time": "20min", "restart": 3},
    {"time": "25min", "partition": [4, 5], "for": "1min"},
    {"time": "30min", "pause": 6},
    {"time": "40min", "resume": 6},
    {"time": "45min", "crash": 7},
]


def walk(plan: Plan) -> None:
    """Replays the timeline with the state machine the backends rely on; fails on any clash."""
    state: dict[str, str] = defaultdict(lambda: "up")
    network: dict[str, str] = defaultdict(lambda: "connected")
    needs = {"crash": ("up", "paused"), "restart": ("down",), "pause": ("up",), "resume": ("paused",)}
    leaves = {"crash": "down", "restart": "up", "pause": "paused", "resume": "up"}
    for e in plan.events:
        if e.action in needs:
            allowed = ("up",) if e.source == "random" and e.action == "crash" else needs[e.action]
            assert state[e.target] in allowed, f"{e} while {state[e.target]}"
            state[e.target] = leaves[e.action]
        elif e.action in ("partition", "heal"):
            assert network[e.target] == ("connected" if e.action == "partition" else "partitioned"), e
            network[e.target] = "partitioned" if e.action == "partition" else "connected"
    times = [e.time_s for e in plan.events]
    assert times == sorted(times)


@pytest.mark.parametrize("seed", range(40))
def test_random_crashes_never_clash_with_the_schedule(seed):
    plan = crash_plan(10, 12, restart_after="4min", seed=seed, extra_events=SCHEDULE)
    walk(plan)
    scheduled = events(plan, "schedule")
    assert len(scheduled) == 15  # every explicit event kept: random draws never make a valid schedule fail
    # no random event on a worker while the schedule has it down or paused
    for e in plan.events:
        if e.source != "random":
            continue
        if e.target in ("worker-0", "worker-1"):
            assert not 300 <= e.time_s <= 420
        if e.target == "worker-3":
            assert not 900 <= e.time_s <= 1200
        if e.target == "worker-6":
            assert not 1800 <= e.time_s <= 2400
        if e.target == "worker-7":
            assert e.time_s < 2700


def test_random_crashes_do_happen_around_the_schedule():
    total = sum(len(events(crash_plan(10, 12, restart_after="4min", seed=s, extra_events=SCHEDULE), "random"))
                for s in range(10))
    assert total > 100  # ~12/h x 10 workers x 10 seeds, a few dropped


def test_a_random_crash_is_dropped_when_an_explicit_event_falls_in_its_downtime():
    # Rate so high that every worker crashes within seconds; the explicit pause at 300 s must survive.
    for seed in range(5):
        plan = crash_plan(1, 3600, restart_after="10min", seed=seed, extra_events=[{"time": 300, "pause": 0, "for": 10}])
        walk(plan)
        assert (300.0, "pause", "worker-0") in events(plan) and (310.0, "resume", "worker-0") in events(plan)
        for crash in (e for e in plan.events if e.action == "crash"):
            assert not crash.time_s <= 310 <= crash.time_s + 600


def test_a_permanent_random_crash_is_dropped_before_a_later_explicit_event():
    plan = crash_plan(20, 100, seed=2, extra_events=[{"time": 3000, "crash": "all"}])
    walk(plan)
    assert all(e.source == "schedule" for e in plan.events)
    assert len(plan.events) == 20


# -- explicit events -------------------------------------------------------------------------


def test_explicit_events_of_the_full_scenario_expand():
    plan = make_plan(load_scenario(FULL)[0])
    scheduled = [(e.time_s, e.action, e.target, e.params) for e in plan.events if e.source == "schedule"]
    assert (30.0, "crash", "worker-0", {}) in scheduled
    assert (50.0, "restart", "worker-0", {}) in scheduled  # restart_after 20 s
    assert (100.0, "pause", "worker-2", {}) in scheduled and (110.0, "resume", "worker-2", {}) in scheduled
    assert (100.0, "pause", "worker-3", {}) in scheduled and (110.0, "resume", "worker-3", {}) in scheduled
    for w in (2, 3, 4):  # the group 'listed', partitioned for 15 s
        assert (140.0, "partition", f"worker-{w}", {}) in scheduled and (155.0, "heal", f"worker-{w}", {}) in scheduled
    for w in (0, 1):  # cpus of the group 'fixed' for 30 s, then back to 0.25
        assert (180.0, "cpus", f"worker-{w}", {"cpus": 0.05}) in scheduled
        assert (210.0, "cpus", f"worker-{w}", {"cpus": 0.25}) in scheduled
    change = {"uplink_bps": 5e5, "delay_s": 0.2, "loss": 0.01}
    assert (200.0, "link", "worker-2", change) in scheduled
    assert (260.0, "link", "worker-2", {"uplink_bps": 1e6, "delay_s": 0.01, "loss": 0.0}) in scheduled
    assert (260.0, "link", "worker-4", {"uplink_bps": 3e6, "delay_s": 0.03, "loss": 0.01}) in scheduled
    # a link change with no 'workers' applies to every worker, no undo
    assert [e[2] for e in scheduled if e[0] == 300.0] == [f"worker-{i}" for i in range(10)]
    assert {e[1] for e in scheduled if e[0] > 300} == set()


def test_events_are_sorted_by_time_whatever_the_file_order():
    plan = plan_of(scenario(faults={"at": [{"time": 50, "resume": 0}, {"time": 10, "pause": 0}]}))
    assert events(plan) == [(10.0, "pause", "worker-0"), (50.0, "resume", "worker-0")]


def test_for_restores_the_values_in_effect_just_before():
    plan = plan_of(scenario([{"count": 1, "cpus": 0.5, "uplink": "4mbit"}], faults={"at": [
        {"time": 10, "cpus": 0.3},
        {"time": 20, "cpus": 0.1, "for": 5},
        {"time": 30, "link": {"uplink": "1mbit", "delay": "50ms"}},
        {"time": 40, "link": {"uplink": "100kbit"}, "for": 10},
        {"time": 45, "link": {"uplink": "200kbit", "loss": "1%"}, "for": 20},
    ]}))
    got = [(e.time_s, e.action, e.params) for e in plan.events]
    assert got == [
        (10.0, "cpus", {"cpus": 0.3}),
        (20.0, "cpus", {"cpus": 0.1}),
        (25.0, "cpus", {"cpus": 0.3}),  # what 10 s set, not the plan's 0.5
        (30.0, "link", {"uplink_bps": 1e6, "delay_s": 0.05}),
        (40.0, "link", {"uplink_bps": 1e5}),
        (45.0, "link", {"uplink_bps": 2e5, "loss": 0.01}),
        (50.0, "link", {"uplink_bps": 1e6}),  # what 30 s set, not the plan's 4mbit
        (65.0, "link", {"uplink_bps": 1e5, "loss": 0.0}),  # what was in effect at 45 s
    ]


def test_undo_of_an_unshaped_link_restores_unshaped():
    plan = plan_of(scenario([{"count": 1}], faults={"at": [{"time": 1, "link": {"downlink": "1mbit"}, "for": 1}]}))
    assert [e.params for e in plan.events] == [{"downlink_bps": 1e6}, {"downlink_bps": None}]


def test_crash_with_restart_after_and_group_targets():
    plan = plan_of(scenario([{"name": "a", "count": 2}, {"name": "b", "count": 2}],
                            faults={"at": [{"time": 10, "crash": "b", "restart_after": 0}]}))
    assert events(plan) == [(10.0, "crash", "worker-2"), (10.0, "restart", "worker-2"),
                            (10.0, "crash", "worker-3"), (10.0, "restart", "worker-3")]


def test_back_to_back_pauses_are_fine():
    plan = plan_of(scenario(faults={"at": [{"time": 10, "pause": 0, "for": 5}, {"time": 15, "pause": 0, "for": 5}]}))
    assert events(plan) == [(10.0, "pause", "worker-0"), (15.0, "resume", "worker-0"), (15.0, "pause", "worker-0"),
                            (20.0, "resume", "worker-0")]


def test_a_paused_worker_may_crash_and_restart():
    plan = plan_of(scenario(faults={"at": [{"time": 10, "pause": 0}, {"time": 20, "crash": 0, "restart_after": 5}]}))
    assert [a for _, a, _ in events(plan)] == ["pause", "crash", "restart"]


def test_partition_is_independent_of_the_process_state():
    plan = plan_of(scenario(faults={"at": [{"time": 10, "partition": 0}, {"time": 20, "pause": 0, "for": 5},
                                           {"time": 30, "heal": 0}]}))
    assert [a for _, a, _ in events(plan)] == ["partition", "pause", "resume", "heal"]


@pytest.mark.parametrize(
    "at, line",
    [
        ([{"time": 10, "resume": 0}], "faults.at[0]: resume worker-0 at 10s, but it is up then"),
        ([{"time": 10, "restart": 1}], "faults.at[0]: restart worker-1 at 10s, but it is up then"),
        ([{"time": 10, "crash": 0}, {"time": 20, "crash": 0}], "faults.at[1]: crash worker-0 at 20s, but it is down then"),
        ([{"time": 10, "crash": 0}, {"time": 20, "resume": 0}], "faults.at[1]: resume worker-0 at 20s, but it is down then"),
        ([{"time": 10, "pause": 0, "for": 10}, {"time": 15, "resume": 0}],
         "faults.at[0]: resume worker-0 at 20s, but it is up then"),
        ([{"time": 10, "heal": 1}], "faults.at[0]: heal worker-1 at 10s, but it is connected then"),
        ([{"time": 10, "partition": "all"}, {"time": 20, "partition": 1}],
         "faults.at[1]: partition worker-1 at 20s, but it is partitioned then"),
    ],
)
def test_impossible_schedules_are_refused(at, line):
    assert line in plan_problems(scenario(faults={"at": at}))


def test_an_event_after_the_end_is_reported_once_for_many_workers():
    problems = plan_problems(scenario([{"count": 50}], training={"duration": "1min"},
                                      faults={"at": [{"time": "2min", "pause": "all", "for": "1s"}]}))
    assert problems == ["faults.at[0]: pause at 120s, after the run ends (60s)",
                        "faults.at[0]: resume at 121s, after the run ends (60s)"]


def test_without_a_duration_events_may_come_late():
    plan = plan_of(scenario(faults={"at": [{"time": "10h", "pause": 0}]}))
    assert events(plan) == [(36000.0, "pause", "worker-0")]


# -- triggers and the rest -------------------------------------------------------------------


def test_triggers_are_carried_into_the_plan():
    plan = make_plan(load_scenario(FULL)[0])
    assert list(plan.triggers) == [
        {"worker": "worker-5", "after_pushes": 50, "action": "crash", "restart_after_s": None, "for_s": None},
        {"worker": "worker-6", "after_pushes": 20, "action": "pause", "restart_after_s": None, "for_s": 10.0},
        {"worker": "worker-7", "after_pushes": 30, "action": "crash", "restart_after_s": 5.0, "for_s": None},
        {"worker": "worker-8", "after_pushes": 40, "action": "partition", "restart_after_s": None, "for_s": 60.0},
    ]
    assert json.loads(plan.dumps())["triggers"] == list(plan.triggers)


def test_training_method_and_dataset_are_resolved():
    plan = make_plan(load_scenario(FULL)[0])
    assert plan.training == {"batch_size": 16, "learning_rate": 0.05, "max_updates": 5000, "duration": 600.0,
                             "eval_every": {"seconds": 30.0}}
    m = plan.method
    assert (m.name, m.compressor, m.params, m.rule, m.error_feedback) == ("comp_c", "topk", {"c": 0.02}, "staleness", True)
    assert m.wire == {"values": "f16", "indices": "raw32"}
    assert plan.dataset["partition"] == "non_iid" and plan.dataset["classes_per_worker"] == 2
    assert (plan.model, plan.backend, plan.name) == ({"name": "mlp", "args": {}, "output": "auto"}, "local", "full-feature.v1")


@pytest.mark.parametrize(
    "method, compressor, rule",
    [("asgd", "dense", "plain"), ("staleness_asgd", "dense", "staleness"), ("comp_c", "topk", "plain"),
     ("adacomp", "topk", "adacomp"), ("topk", "topk", "plain"), ("dense", "dense", "plain")],
)
def test_method_presets(method, compressor, rule):
    m = plan_of(scenario(method={"name": method})).method
    assert (m.compressor, m.rule) == (compressor, rule)


def test_ten_thousand_workers_plan_quickly():
    import time

    started = time.monotonic()
    plan = plan_of(scenario([{"count": 10_000, "cpus": {"uniform": [0.1, 0.5]}}]))
    assert len(plan.workers) == 10_000
    assert time.monotonic() - started < 5


# --- the data a scenario asks for, checked against this machine -----------------------


def test_check_dataset_refuses_more_test_images_than_the_dataset_has():
    from emulator.planning.plan import check_dataset

    with pytest.raises(ScenarioError) as caught:
        check_dataset(validate(scenario(dataset={"name": "digits", "test_size": 2000})))
    [problem] = caught.value.problems
    assert problem.path == "dataset.test_size" and "2,000" in problem.message and "360" in problem.message
    assert check_dataset(validate(scenario(dataset={"name": "digits", "test_size": "50%"}))).test_examples == 360


def test_check_dataset_refuses_an_absent_dataset_and_more_workers_than_examples(tmp_path, monkeypatch):
    from emulator.planning.plan import check_dataset

    monkeypatch.setenv("EMULATE_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(ScenarioError) as caught:
        check_dataset(validate(scenario(dataset={"name": "fashion-mnist"})))
    assert caught.value.problems[0].path == "dataset.name" and "dataset-fashion-mnist" in caught.value.problems[0].message
    with pytest.raises(ScenarioError) as caught:
        check_dataset(validate(scenario(workers=[{"count": 4}], dataset={"name": "digits", "train_size": 3})))
    assert caught.value.problems[0].path == "workers" and "3 training examples" in caught.value.problems[0].message


def test_emulate_plan_exits_2_when_the_dataset_is_too_small(tmp_path):
    result = CliRunner().invoke(main, ["plan", str(HERE.parent / "scenarios" / "quickstart.yaml"), "--set", "dataset.test_size=2000"])
    assert result.exit_code == 2, result.output
    assert "dataset.test_size: asks for 2,000 examples but 'mnist-5k' has 1,000 here" in result.output
