"""Sweeps: grid expansion, seeds, run ids, validation, resumability, and the aggregate maths.

The running is tested with a fake runner injected into :func:`emulator.experiments.sweep.run_sweep`: it
writes the run directory a real run would (``support.runs.write_synthetic_run``). One slow
test runs a real 2 x 1 sweep on the local backend and reports on it.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.runs import load_collection
from analysis.sweep import FAULTS, METRICS, aggregate, mean_ci, metrics_for, paired_to_first, plotted_keys, t_central, t_quantile, value_label, write_tables
from emulator.cli import main
from emulator.experiments.sweep import (
    SEED_STRIDE, Axis, Sweep, SweepError, default_jobs, grid_points, repetition_seed, run_id, run_sweep, split_values,
)
from conftest import TEST_SCENARIOS
from support.runs import FakeRunner

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # emulator.control.rundir's rule for run directories

@pytest.fixture
def scenario(tmp_path) -> Path:
    """A copy of tests/scenarios/tiny-sweep.yaml that the test may edit: two workers, 30 updates, crashes off."""
    return Path(shutil.copy(TEST_SCENARIOS / "tiny-sweep.yaml", tmp_path))


# -- the grid ----------------------------------------------------------------------------


def test_values_split_at_top_level_commas_only():
    assert split_values("0,6,30") == ["0", "6", "30"]
    assert split_values("0.2,{uniform: [0.1, 0.3]}, {normal: [0.2, 0.05], clip: [0.05, 0.4]}") == [
        "0.2", "{uniform: [0.1, 0.3]}", "{normal: [0.2, 0.05], clip: [0.05, 0.4]}"]
    assert split_values("'a,b',\"c,d\",[1, 2]") == ["'a,b'", '"c,d"', "[1, 2]"]
    with pytest.raises(SweepError, match="unbalanced"):
        split_values("{uniform: [0.1, 0.3]")


@pytest.mark.parametrize("option, message", [
    ("faults.crash.rate_per_hour", "expected key=value1,value2"),
    ("=1,2", "expected key=value1,value2"),
    ("seed=1,,2", "empty value"),
    ("seed=1,2,1", "given twice"),
])
def test_bad_grid_options_are_refused(option, message):
    with pytest.raises(SweepError, match=message):
        Axis.parse(option)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=0, max_size=4))
def test_the_grid_is_the_cartesian_product_first_axis_slowest(sizes):
    axes = tuple(Axis(f"k{i}", tuple(str(v) for v in range(n))) for i, n in enumerate(sizes))
    points = grid_points(axes)
    assert len(points) == math.prod(sizes)
    assert len(set(points)) == len(points)
    assert all([k for k, _ in p] == [a.key for a in axes] for p in points)
    assert points == sorted(points, key=lambda p: [int(v) for _, v in p])  # lexicographic: first axis slowest
    ids = {run_id(p, r) for p in points for r in range(3)}
    assert len(ids) == 3 * len(points) and all(RUN_ID.match(i) for i in ids)


def test_a_key_given_twice_is_refused():
    with pytest.raises(SweepError, match="given twice"):
        grid_points((Axis("seed", ("1",)), Axis("seed", ("2",))))


@settings(max_examples=100)
@given(st.integers(0, 2**32 - 1))
def test_repetition_seeds_start_at_the_scenario_seed_and_never_repeat(seed):
    seeds = [repetition_seed(seed, r) for r in range(200)]
    assert seeds[0] == seed
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**32 for s in seeds)
    assert seeds[1] == (seed + SEED_STRIDE) % 2**32


def test_run_ids_are_deterministic_readable_and_distinct():
    point = (("faults.crash.rate_per_hour", "30"), ("workers[0].cpus", "{uniform: [0.1, 0.3]}"))
    assert run_id(point, 0) == run_id(point, 0)
    assert run_id(point, 0).startswith("rate_per_hour-30_cpus-uniform_0.1_0.3-")
    assert run_id(point, 0).endswith("-r0") and run_id(point, 1).endswith("-r1")
    other = (("faults.crash.rate_per_hour", "30"), ("workers[0].cpus", "{uniform: [0.1, 0.31]}"))
    assert run_id(other, 0) != run_id(point, 0)
    assert RUN_ID.match(run_id((("method", "{name: asgd}"),), 0))


def test_every_point_is_planned_with_its_seed_before_anything_runs(scenario):
    sweep = Sweep.from_options(scenario, ["faults.crash.rate_per_hour=0,30", "method.c=0.01,0.05,0.1"], repeat=2)
    planned = sweep.plan()
    assert len(planned) == 2 * 3 * 2
    assert [p.point for p in planned] == [i // 2 for i in range(12)]
    assert {p.seed for p in planned if p.repetition == 0} == {3}
    assert {p.seed for p in planned if p.repetition == 1} == {repetition_seed(3, 1)}
    first = planned[1]
    assert first.overrides == ("faults.crash.rate_per_hour=0", "method.c=0.01", f"seed={repetition_seed(3, 1)}")
    assert first.cpus == pytest.approx(0.5 + 0.25 + 2 * 0.25)
    assert len({p.plan_digest for p in planned}) == 12  # the seed and the values change the plan


def test_invalid_grid_points_are_named_and_nothing_runs(scenario, tmp_path):
    calls = []
    sweep = Sweep.from_options(scenario, ["faults.crash.rate_per_hour=0,-1", "workers[0].cpus=0.25,{uniform: [0.3, 0.1]}"])
    with pytest.raises(SweepError) as caught:
        run_sweep(sweep, tmp_path / "sweep", runner=lambda *a: calls.append(a), say=lambda m: None)
    problems = caught.value.problems
    assert any(p.startswith("grid point 1 (faults.crash.rate_per_hour=0, workers[0].cpus={uniform: [0.3, 0.1]}): workers[0].cpus")
               for p in problems), problems
    assert any(p.startswith("grid point 2 (faults.crash.rate_per_hour=-1, workers[0].cpus=0.25): faults.crash.rate_per_hour: must be >= 0")
               for p in problems), problems
    assert not any(p.startswith("grid point 0 ") for p in problems)
    assert calls == [] and not (tmp_path / "sweep").exists()


def test_an_unknown_grid_key_is_named_with_its_grid_point(scenario):
    with pytest.raises(SweepError, match=r"grid point 0 \(faults\.crash\.rate=1\): --set faults\.crash\.rate: unknown key"):
        Sweep.from_options(scenario, ["faults.crash.rate=1,2"]).plan()


def test_the_default_concurrency_fits_the_heaviest_run_in_the_cpus(scenario):
    planned = Sweep.from_options(scenario, ["server.cpus=0.5,2.0"]).plan()  # runs of 1.25 and 2.75 cpus
    assert default_jobs(planned, cpu_count=16) == 5  # floor(16 / 2.75)
    assert default_jobs(planned, cpu_count=2) == 1
    assert default_jobs(planned[:1], cpu_count=5) == 4  # floor(5 / 1.25)
    heavy = Sweep.from_options(scenario, ["server.cpus=64"]).plan()
    assert default_jobs(heavy, cpu_count=8) == 1


# -- running, with a fake runner -----------------------------------------------------------


def test_a_sweep_runs_every_point_and_records_it(scenario, tmp_path):
    runner, messages = FakeRunner(), []
    sweep = Sweep.from_options(scenario, ["faults.crash.rate_per_hour=0,30"], repeat=2)
    result = run_sweep(sweep, tmp_path / "sweep", jobs=2, runner=runner, say=messages.append)
    assert sorted(runner.calls) == sorted(p.run_id for p in sweep.plan())
    assert result.count("completed") == 4 and not result.failed
    data = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert data["grid"] == [{"key": "faults.crash.rate_per_hour", "values": [0, 30], "texts": ["0", "30"]}]
    assert [p["values"] for p in data["points"]] == [{"faults.crash.rate_per_hour": 0}, {"faults.crash.rate_per_hour": 30}]
    assert [[r["status"] for r in p["runs"]] for p in data["points"]] == [["completed"] * 2] * 2
    assert data["points"][0]["runs"][1]["seed"] == repetition_seed(3, 1)
    assert "seed_r = (seed + r * 2654435761) mod 2**32" in data["seed_rule"]
    assert messages[0].endswith("4 run(s), 2 at a time")
    assert any(m.startswith("[sweep 4/4]") for m in messages)
    assert any("ETA" in m for m in messages[1:3])


def test_a_second_call_skips_finished_runs_and_retries_failed_ones(scenario, tmp_path):
    sweep = Sweep.from_options(scenario, ["faults.crash.rate_per_hour=0,30,60"])
    failing = FakeRunner(fail={"rate_per_hour-30"})
    first = run_sweep(sweep, tmp_path / "sweep", jobs=1, runner=failing, say=lambda m: None)
    assert [r["status"] for r in first.runs] == ["completed", "failed", "completed"]
    assert "boom" in first.runs[1]["error"]
    assert len(failing.calls) == 3  # a failure does not stop the sweep

    second = FakeRunner()
    again = run_sweep(sweep, tmp_path / "sweep", jobs=1, runner=second, say=lambda m: None)
    assert second.calls == [first.runs[1]["run_id"]]
    assert [r["status"] for r in again.runs] == ["completed"] * 3
    assert [r.get("reused", False) for r in again.runs] == [True, False, True]
    assert (tmp_path / "sweep" / ".attempts" / f"{first.runs[1]['run_id']}.1" / "summary.json").exists()

    third = FakeRunner()
    run_sweep(sweep, tmp_path / "sweep", runner=third, say=lambda m: None)
    assert third.calls == []


def test_a_runner_that_dies_without_a_summary_is_a_failed_run(scenario, tmp_path):
    def crashing(run, sweep, directory):
        raise OSError("no such file: python")

    result = run_sweep(Sweep.from_options(scenario, ["seed=1,2"]), tmp_path / "sweep", runner=crashing, say=lambda m: None)
    assert [r["status"] for r in result.runs] == ["failed", "failed"]
    assert result.runs[0]["error"] == "OSError: no such file: python"


def test_ctrl_c_stops_the_sweep_and_records_what_did_not_run(scenario, tmp_path):
    import signal

    class Interrupting(FakeRunner):
        interrupted = False

        def __call__(self, run, sweep, directory):
            if not self.calls:
                signal.raise_signal(signal.SIGINT)  # as a Ctrl-C during the first run: the main thread gets it
            super().__call__(run, sweep, directory)

        def interrupt(self):
            self.interrupted = True

    runner = Interrupting()
    # Python leaves SIGINT ignored when it starts ignored (a suite launched with nohup ... &): give it
    # the terminal's Ctrl-C behaviour for this test, whatever launched the suite.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = run_sweep(Sweep.from_options(scenario, ["seed=1,2,3"]), tmp_path / "sweep", jobs=1, runner=runner,
                           say=lambda m: None)
    finally:
        signal.signal(signal.SIGINT, before)
    assert result.interrupted and runner.interrupted
    assert [r["status"] for r in result.runs] == ["completed", "interrupted", "interrupted"]
    data = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [p["runs"][0]["status"] for p in data["points"]] == ["completed", "interrupted", "interrupted"]
    again = FakeRunner()
    run_sweep(Sweep.from_options(scenario, ["seed=1,2,3"]), tmp_path / "sweep", runner=again, say=lambda m: None)
    assert len(again.calls) == 2  # resumed where it stopped


def test_a_changed_scenario_does_not_reuse_old_runs(scenario, tmp_path):
    sweep = Sweep.from_options(scenario, ["faults.crash.rate_per_hour=0,30"])
    run_sweep(sweep, tmp_path / "sweep", runner=FakeRunner(), say=lambda m: None)
    scenario.write_text(scenario.read_text().replace("max_updates: 30", "max_updates: 40"))
    with pytest.raises(SweepError, match="completed run of another plan"):
        run_sweep(sweep, tmp_path / "sweep", runner=FakeRunner(), say=lambda m: None)


def test_the_sweep_command_names_a_bad_grid_point_and_runs_nothing(scenario, tmp_path):
    result = CliRunner().invoke(main, ["sweep", str(scenario), "--grid", "training.batch_size=10,0", "--backend", "local",
                                       "--dir", str(tmp_path / "sweep")])
    assert result.exit_code == 2, result.output
    assert "grid point 1 (training.batch_size=0): training.batch_size: must be > 0" in result.output
    assert not (tmp_path / "sweep").exists()


# -- aggregate maths -------------------------------------------------------------------------


@pytest.mark.parametrize("df, quantile", [
    (1, 12.706204736), (2, 4.302652730), (3, 3.182446305), (4, 2.776445105), (5, 2.570581836),
    (9, 2.262157163), (10, 2.228138852), (29, 2.045229642), (100, 1.983971519),
])
def test_t_quantiles_match_the_tables(df, quantile):
    assert t_quantile(0.975, df) == pytest.approx(quantile, abs=1e-8)
    assert t_quantile(0.025, df) == pytest.approx(-quantile, abs=1e-8)
    assert t_central(quantile, df) == pytest.approx(0.95, abs=1e-10)


def test_t_quantiles_agree_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 80):
        for p in (0.55, 0.9, 0.95, 0.975, 0.995, 0.9995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9)


@settings(max_examples=100)
@given(st.integers(1, 300), st.floats(0.5, 0.9999))
def test_t_quantiles_are_odd_and_shrink_towards_the_normal(df, p):
    q = t_quantile(p, df)
    assert q == pytest.approx(-t_quantile(1 - p, df), rel=1e-9, abs=1e-12)
    assert t_quantile(p, df + 1) <= q + 1e-12
    assert q >= _normal_quantile(p) - 1e-9


def _normal_quantile(p):
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def test_mean_and_interval_by_hand():
    n, mean, half = mean_ci([0.8, 0.9, 1.0])
    assert n == 3 and mean == pytest.approx(0.9)
    assert half == pytest.approx(4.302652730 * 0.1 / math.sqrt(3), rel=1e-9)  # t(0.975, 2) * s / sqrt(n), s = 0.1
    n, mean, half = mean_ci([2.0, 4.0])
    assert (n, mean) == (2, 3.0) and half == pytest.approx(12.706204736 * math.sqrt(2) / math.sqrt(2), rel=1e-9)
    assert mean_ci([5.0])[:2] == (1, 5.0) and math.isnan(mean_ci([5.0])[2])
    n, mean, half = mean_ci([])
    assert n == 0 and math.isnan(mean) and math.isnan(half)
    assert mean_ci([1.0, float("nan"), None, 3.0])[:2] == (2, 2.0)


@settings(max_examples=100)
@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=30), st.floats(-1e3, 1e3), st.floats(0.1, 10))
def test_the_interval_moves_with_shifts_and_scales_with_scale(values, shift, scale):
    n, mean, half = mean_ci(values)
    _, mean2, half2 = mean_ci([v + shift for v in values])
    _, mean3, half3 = mean_ci([v * scale for v in values])
    assert half >= 0
    assert mean2 == pytest.approx(mean + shift, abs=1e-6 * (1 + abs(mean)))
    assert half2 == pytest.approx(half, rel=1e-6, abs=1e-3)
    assert mean3 == pytest.approx(mean * scale, rel=1e-9, abs=1e-6)
    assert half3 == pytest.approx(half * scale, rel=1e-6, abs=1e-6)
    assert min(values) - 1e-9 <= mean <= max(values) + 1e-9


def test_aggregate_averages_completed_repetitions_per_point():
    table = pd.DataFrame([
        {"point": 0, "rate": 0, "method.name": "asgd", "status": "completed", "final_accuracy": 0.8, "ingress_payload_bytes": 100, "updates": 10, "duration_s": 1.0},
        {"point": 0, "rate": 0, "method.name": "asgd", "status": "completed", "final_accuracy": 0.9, "ingress_payload_bytes": 300, "updates": 30, "duration_s": 3.0},
        {"point": 0, "rate": 0, "method.name": "asgd", "status": "completed", "final_accuracy": 1.0, "ingress_payload_bytes": 200, "updates": 20, "duration_s": 2.0},
        {"point": 1, "rate": 30, "method.name": "asgd", "status": "completed", "final_accuracy": 0.5, "ingress_payload_bytes": 50, "updates": 5, "duration_s": 1.0},
        {"point": 1, "rate": 30, "method.name": "asgd", "status": "failed", "final_accuracy": 0.1, "ingress_payload_bytes": 1, "updates": 1, "duration_s": 0.1},
    ])
    agg = aggregate(table, ["rate", "method.name"])
    assert list(agg["rate"]) == [0, 30] and list(agg["runs"]) == [3, 2] and list(agg["n"]) == [3, 1]
    first = agg.iloc[0]
    assert first["final_accuracy_mean"] == pytest.approx(0.9)
    assert first["final_accuracy_ci95"] == pytest.approx(4.302652730 * 0.1 / math.sqrt(3))
    assert first["ingress_payload_bytes_mean"] == pytest.approx(200)
    assert first["ingress_payload_bytes_ci95"] == pytest.approx(4.302652730 * 100 / math.sqrt(3))
    assert first["final_accuracy_low"] == pytest.approx(0.9 - first["final_accuracy_ci95"])
    second = agg.iloc[1]
    assert second["final_accuracy_mean"] == 0.5 and math.isnan(second["final_accuracy_ci95"])  # the failed run is left out


def test_each_point_is_paired_with_its_baseline_by_repetition_and_holm_adjusted():
    def run(point, rate, method, repetition, accuracy, updates, outcome="ok"):
        return {"point": point, "rate": rate, "method.name": method, "repetition": repetition, "status": "completed",
                "outcome": outcome, "final_accuracy_last_k": accuracy, "updates": updates}

    table = pd.DataFrame([
        run(0, 0, "asgd", 0, 0.80, 100), run(0, 0, "asgd", 1, 0.70, 110), run(0, 0, "asgd", 2, 0.90, 90),
        run(1, 0, "adacomp", 0, 0.50, 50), run(1, 0, "adacomp", 1, 0.50, 50),
        run(2, 30, "asgd", 0, 0.75, 80), run(2, 30, "asgd", 1, 0.60, 100), run(2, 30, "asgd", 2, 0.10, 70, "diverged"),
        run(3, 30, "adacomp", 0, 0.40, 40), run(3, 30, "adacomp", 1, 0.45, 45),
    ])
    headers, rows = paired_to_first(table, ["rate", "method.name"])
    assert headers[:3] == ["rate", "method.name", "against rate ="] and [r[:3] for r in rows] == [["30", "asgd", "0"], ["30", "adacomp", "0"]]
    asgd, adacomp = rows
    assert asgd[3].startswith("1 of 3 against 0 of 3; p 1,")  # Fisher's exact: 1 of 3 cannot be told from 0 of 3
    # trained pairs only: repetitions 0 and 1, differences -0.05 and -0.10; updates over all three: -20, -10, -20
    assert asgd[4].startswith("-0.0750 ± 0.3177 (2);")  # 12.706 (t, 1 degree of freedom) x 0.025 (standard error)
    assert adacomp[4].startswith("-0.0750 ± 0.3177 (2);") and adacomp[5].startswith("-8 ± 32 (2);")
    assert asgd[5].startswith("-17 ± 14 (3);") and asgd[5].endswith("can't tell")
    assert paired_to_first(table.drop(columns="repetition"), ["rate", "method.name"]) == ([], [])
    assert paired_to_first(table[table["rate"] == 0], ["rate", "method.name"]) == ([], [])


def test_crashes_and_lost_pushes_are_columns_only_where_a_run_crashed():
    calm = pd.DataFrame({"crashes": [0, 0], "lost_updates": [0, 0]})
    assert metrics_for(calm) == METRICS and metrics_for(calm.assign(crashes=[0, 3])) == METRICS + FAULTS


def test_grid_values_become_labels_and_methods_become_lines():
    assert value_label({"uniform": [0.1, 0.3]}) == "{uniform: [0.1, 0.3]}"
    assert value_label(30) == 30 and value_label("asgd") == "asgd"
    grid = {"faults.crash.rate_per_hour": [0, 30], "method": [{"name": "asgd"}, {"name": "adacomp"}], "workers[0].cpus": [0.2, {"uniform": [0.1, 0.3]}]}
    assert plotted_keys(grid) == ["faults.crash.rate_per_hour", "workers[0].cpus"]
    assert plotted_keys({"method.name": ["asgd", "adacomp"]}) == ["method.name"]
    assert plotted_keys({"seed": [1], "method.name": ["asgd", "adacomp"], "server.cpus": [1, 2]}) == ["server.cpus"]


def test_sweep_tables_and_report_from_a_sweep_directory(scenario, tmp_path):
    sweep = Sweep.from_options(scenario, ["faults.crash.rate_per_hour=0,30,120", "method.name=comp_c,adacomp"], repeat=2)
    run_sweep(sweep, tmp_path / "sweep", runner=FakeRunner(), say=lambda m: None)
    c = load_collection(tmp_path / "sweep")
    assert c.is_sweep and len(c.runs) == 12
    assert list(c.grid) == ["faults.crash.rate_per_hour", "method.name"]
    agg = write_tables(c)
    assert len(agg) == 6 and set(agg["n"]) == {2}
    csv = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert list(csv["faults.crash.rate_per_hour"]) == [0, 0, 30, 30, 120, 120]
    md = (tmp_path / "sweep" / "sweep.md").read_text()
    assert ("| faults.crash.rate_per_hour | method.name | runs (completed) | diverged or dead (95% CI, exact) | "
            "final accuracy, trained runs (mean of last 3 evaluations ± 95% CI) | final_accuracy (mean ± 95% CI) |") in md
    assert "| 0 of 2 (0%; 0%-84%) |" in md  # no run diverged: the rate and its exact interval
    assert "Each point against its baseline" in md and md.count("| 0 of 2 against 0 of 2; p 1, Holm 1 |") == 4
    assert set(agg["not_trained"]) == {0} and set(agg["trained"]) == {2}
    assert " ± " in md
    result = CliRunner().invoke(main, ["report", str(tmp_path / "sweep")])
    assert result.exit_code == 0, result.output
    out = tmp_path / "sweep" / "report"
    names = {p.name for p in out.glob("*.png")}
    assert {"sweep_faults-crash-rate_per_hour_final_accuracy.png", "sweep_faults-crash-rate_per_hour_ingress_payload_bytes.png",
            "accuracy_ingress.png", "staleness.png"} <= names
    report = (out / "report.md").read_text()
    assert "## Per grid point" in report and report.count("| completed |") == 12


# -- a real sweep ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_two_point_sweep_then_its_report(scenario, tmp_path):
    """Two grid points x one repetition on the local backend (~30 updates each), then ``emulate report``."""
    out = tmp_path / "sweep"
    result = CliRunner().invoke(main, ["sweep", str(scenario), "--grid", "method.c=0.02,0.1", "--backend", "local",
                                       "--dir", str(out), "--jobs", "1", "--no-fidelity", "--no-report"])
    assert result.exit_code == 0, result.output + "\n" + "\n".join(p.read_text()[-2000:] for p in out.glob("logs/*.log"))
    data = json.loads((out / "sweep.json").read_text())
    runs = [r for p in data["points"] for r in p["runs"]]
    assert [r["status"] for r in runs] == ["completed", "completed"]
    for r in runs:
        summary = json.loads((out / r["run_id"] / "summary.json").read_text())
        assert summary["updates_applied"] == 30 and summary["plan_digest"] == r["plan_digest"]
    assert (out / "logs" / f"{runs[0]['run_id']}.log").exists()

    result = CliRunner().invoke(main, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "sweep.csv").exists() and (out / "sweep.md").exists()
    md = (out / "report" / "report.md").read_text()
    assert md.count("| completed |") == 2 and "sweep_method-c_final_accuracy.png" in md
    assert (out / "report" / "sweep_method-c_final_accuracy.png").stat().st_size > 5_000

    again = CliRunner().invoke(main, ["sweep", str(scenario), "--grid", "method.c=0.02,0.1", "--backend", "local",
                                      "--dir", str(out), "--no-report"])
    assert again.exit_code == 0 and "2 already done" in again.output
