"""``emulate compare --repeat N``: paired seeds, intervals per column, paired differences with verdicts.

Fast tests feed the statistics synthetic run rows (known differences, known intervals), and run
:func:`emulator.experiments.compare.compare` with a stand-in for the emulation that writes traces as a run
would; one slow test compares two methods twice on the local backend.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis.sweep import t_quantile
from conftest import TEST_SCENARIOS

T_975_2 = 4.302652729911275  # Student t, 97.5 % quantile, 2 degrees of freedom (tables)

TINY_SCENARIO = TEST_SCENARIOS / "tiny-compare.yaml"  # two workers, an MLP on digits, 20 updates


def row(method, repeat, accuracy, time_s=None, status="completed", **extra):
    """A run row as :func:`emulator.experiments.compare.summarize_run` and :func:`write_report` leave it."""
    return {"method": method, "repeat": repeat, "seed": 100 + repeat, "status": status, "final_accuracy": accuracy,
            "updates": 20, "ingress_payload_bytes": 1000, "bytes_per_update": 50.0, "ratio_to_dense": None,
            "compress_overhead": 0.1, "compressor": "topk", "rule": "plain", "diverged": False, "outcome": "ok",
            "curve": [], "time_to_target": None if time_s is None else {"time_s": time_s, "version": 10}, **extra}


# -- the statistics ----------------------------------------------------------------------


def test_a_known_paired_difference_gives_the_known_interval():
    from emulator.experiments.compare import pairs

    rows = [row("a", r, acc, t) for r, (acc, t) in enumerate([(0.80, 5.0), (0.82, 6.0), (0.84, 7.0)])]
    rows += [row("b", r, acc, 4.0) for r, acc in enumerate([0.70, 0.71, 0.75])]
    (pair,) = pairs(rows)
    assert (pair["a"], pair["b"], pair["repeats"], pair["left_out"]) == ("a", "b", 3, [])
    accuracy = pair["final_accuracy"]  # differences 0.10, 0.11, 0.09: mean 0.10, s = 0.01
    half = T_975_2 * 0.01 / math.sqrt(3)
    assert accuracy["n"] == 3
    assert accuracy["mean"] == pytest.approx(0.10)
    assert accuracy["half_width"] == pytest.approx(half, rel=1e-6)
    assert (accuracy["low"], accuracy["high"]) == (pytest.approx(0.10 - half, rel=1e-6), pytest.approx(0.10 + half, rel=1e-6))
    assert accuracy["verdict"] == "A better"
    time = pair["time_to_target"]  # differences 1, 2, 3 s: mean 2, s = 1, interval [-0.48, 4.48] holds 0
    assert time["mean"] == pytest.approx(2.0)
    assert time["half_width"] == pytest.approx(T_975_2 / math.sqrt(3), rel=1e-6)
    assert time["verdict"] == "can't tell"
    # A shorter time is better: b always 3 s faster than c is "A better" for (b, c).
    rows += [row("c", r, 0.7, 7.0 + 0.1 * r) for r in range(3)]
    by = {(p["a"], p["b"]): p for p in pairs(rows)}
    assert by[("b", "c")]["time_to_target"]["verdict"] == "A better"
    assert by[("a", "c")]["final_accuracy"]["verdict"] == "A better"
    assert by[("b", "c")]["final_accuracy"]["mean"] == pytest.approx(0.02)


def test_the_shared_t_quantile_is_students():
    assert t_quantile(0.975, 2) == pytest.approx(T_975_2, rel=1e-9)


def test_identical_methods_cannot_be_told_apart():
    from emulator.experiments.compare import pairs

    accuracies = [0.81, 0.77, 0.85, 0.79]
    rows = [row("a", r, acc, 3.0 + r) for r, acc in enumerate(accuracies)]
    rows += [row("b", r, acc, 3.0 + r) for r, acc in enumerate(accuracies)]
    (pair,) = pairs(rows)
    for measure in ("final_accuracy", "time_to_target"):
        assert pair[measure]["n"] == 4 and pair[measure]["mean"] == 0.0
        assert pair[measure]["verdict"] == "can't tell"


def test_one_pair_says_nothing():
    from emulator.experiments.compare import pairs

    (pair,) = pairs([row("a", 0, 0.9, 1.0), row("b", 0, 0.1, 9.0)])
    assert pair["final_accuracy"]["n"] == 1 and pair["final_accuracy"]["half_width"] is None
    assert pair["final_accuracy"]["verdict"] == pair["time_to_target"]["verdict"] == "can't tell"


def test_a_failed_repetition_is_left_out_of_its_pairs_only():
    from emulator.experiments.compare import aggregate, pairs

    rows = [row("a", r, 0.8 + 0.01 * r, 5.0) for r in range(3)]
    rows += [row("b", r, 0.6, None, status="failed" if r == 1 else "completed") for r in range(3)]
    rows += [row("c", r, 0.7, 6.0) for r in range(2)]  # repetition 2 of c never ran (interrupted)
    by = {(p["a"], p["b"]): p for p in pairs(rows)}
    assert by[("a", "b")]["final_accuracy"]["n"] == 2
    assert by[("a", "b")]["left_out"] == [{"repeat": 1, "why": "b failed"}]
    assert by[("a", "c")]["final_accuracy"]["n"] == 2
    assert by[("a", "c")]["left_out"] == [{"repeat": 2, "why": "c not run"}]
    assert by[("b", "c")]["left_out"] == [{"repeat": 1, "why": "b failed"}, {"repeat": 2, "why": "c not run"}]
    assert by[("b", "c")]["final_accuracy"]["n"] == 1
    # b never reached the target: no time difference, counted instead.
    assert by[("a", "b")]["time_to_target"]["n"] == 0
    assert by[("a", "b")]["time_to_target"]["only_a_reached"] == 2
    stats = {entry["method"]: entry for entry in aggregate(rows)}
    assert (stats["b"]["runs"], stats["b"]["completed"], stats["b"]["final_accuracy"]["n"]) == (3, 2, 2)
    assert stats["a"]["final_accuracy"]["mean"] == pytest.approx(0.81)
    assert stats["a"]["final_accuracy"]["half_width"] == pytest.approx(T_975_2 * 0.01 / math.sqrt(3), rel=1e-6)
    assert stats["b"]["reached_target"] == 0 and stats["b"]["time_to_target"]["n"] == 0


def test_a_run_that_never_reached_the_target_bounds_the_time_ratio_by_its_length():
    """Censored times: B not reached by the end of its 120 s run means B's time exceeds 120 s, so A / B
    is at most A's time / 120; the note says what every repetition supports."""
    from emulator.experiments.compare import pairs, render_markdown

    end = [{"time_s": 0.0, "accuracy": 0.1}, {"time_s": 120.0, "accuracy": 0.5}]
    rows = [row("a", r, 0.8, t, curve=end) for r, t in enumerate([50.0, 60.0, 30.0])]
    rows += [row("b", r, 0.6, t, curve=end) for r, t in enumerate([None, None, 90.0])]
    (pair,) = pairs(rows)
    ratio = pair["time_to_target"]["ratio"]
    assert ratio == [{"value": pytest.approx(50 / 120), "bound": "at most"},
                     {"value": pytest.approx(0.5), "bound": "at most"}, {"value": pytest.approx(1 / 3), "bound": "exact"}]
    report = {"repeat": 3, "target_accuracy": 0.7, "dense_reference": None, "figure": "f.png", "methods": rows,
              "aggregate": [], "pairs": [pair]}
    note = next(line for line in render_markdown(report).splitlines() if "per repetition" in line)
    assert "<= 0.42, <= 0.50, 0.33" in note and "A took at most 0.50 of B's time in every repetition" in note
    # The other way round: B reached it where A did not; and a repetition where neither did.
    rows = [row("a", 0, 0.5, None, curve=end), row("a", 1, 0.5, None, curve=end)]
    rows += [row("b", 0, 0.8, 40.0, curve=end), row("b", 1, 0.8, None, curve=end)]
    (pair,) = pairs(rows)
    assert pair["time_to_target"]["ratio"] == [{"value": pytest.approx(3.0), "bound": "at least"}, None]


# -- the report --------------------------------------------------------------------------


def fake_run(path: Path, compressor: str, sizes: list[int], accuracy: list[tuple[int, float]], seed: int = 3,
             status: str = "completed", down: float | None = None) -> None:
    """A run directory with the traces :func:`summarize_run` reads (``down``: bytes sent per update,
    None for a run from before they were counted)."""
    path.mkdir(parents=True, exist_ok=True)
    two_way = None if down is None else (sum(sizes) + 100) / len(sizes) + down
    (path / "summary.json").write_text(json.dumps({
        "status": status, "compressor": compressor, "rule": "plain", "final_accuracy": accuracy[-1][1], "seed": seed,
        "updates_applied": len(sizes), "ingress_payload_bytes": sum(sizes) + 100, "training_started_ts": 5.5,
        **({} if down is None else {"down_bytes_per_update": down, "two_way_bytes_per_update": two_way}),
    }))
    (path / "updates.jsonl").write_text("".join(json.dumps({"t": t, "bytes": b}) + "\n" for t, b in enumerate(sizes, 1)))
    (path / "accuracy.jsonl").write_text("".join(
        json.dumps({"version": v, "accuracy": a, "ts": 5.0 + v}) + "\n" for v, a in accuracy))
    (path / "events.jsonl").write_text(json.dumps({"kind": "training_started", "source": "server", "ts": 5.0}) + "\n")
    (path / "steps.jsonl").write_text(json.dumps({"steps": 3, "compute_ms": 10.0, "compress_ms": 1.0}) + "\n")


# What compare.md said for this comparison before repetitions existed, with the downlink's columns
# (the dense run is one from before they were counted).
ONE_REPETITION = """\
# Comparison: tiny

Scenario `s.yaml`, seed 3, backend local; target accuracy 0.8100; ratios against `asgd`.

| method | final accuracy | updates | ingress payload (B) | bytes / update | vs dense | down B / update | two-way B / update | time to target (s) | compress / compute |
|---|---|---|---|---|---|---|---|---|---|
| `asgd` | 0.8000 | 4 | 4,100 | 1,000 | 1.0x | - | - | not reached | 0.100 |
| `adacomp` | 0.9000 | 4 | 200 | 25 | 40.0x | 1,500 | 1,550 | 4.0 (update 4) | 0.100 |

![accuracy versus cumulative ingress bytes](accuracy_vs_ingress.png)
"""
META = {"scenario": "s.yaml", "name": "tiny", "seed": 3, "backend": "local", "overrides": []}


def test_one_repetition_reports_as_before(tmp_path):
    from emulator.experiments.compare import summarize_run, write_report

    fake_run(tmp_path / "01-asgd", "dense", [1000] * 4, [(0, 0.1), (2, 0.5), (4, 0.8)])
    fake_run(tmp_path / "02-adacomp", "topk", [10, 20, 30, 40], [(0, 0.1), (2, 0.7), (4, 0.9)], down=1500.0)
    rows = [{**summarize_run(tmp_path / "01-asgd", "asgd"), "repeat": 0, "seed": 3},
            {**summarize_run(tmp_path / "02-adacomp", "adacomp"), "repeat": 0, "seed": 3}]
    report = write_report(tmp_path, rows, meta={**META, "repeat": 1, "seeds": [3]})
    assert (tmp_path / "compare.md").read_text() == ONE_REPETITION
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert [r["run_id"] for r in saved["methods"]] == ["01-asgd", "02-adacomp"]
    assert saved["methods"][1]["ratio_to_dense"] == 40.0 and saved["methods"][1]["time_to_target"] == {"time_s": 4.0, "version": 4}
    assert saved["target_accuracy"] == pytest.approx(0.81) and saved["dense_reference"] == "asgd"
    assert saved["aggregate"][1]["final_accuracy"] == {"n": 1, "mean": 0.9, "half_width": None, "low": None, "high": None}
    assert saved["pairs"][0]["final_accuracy"]["verdict"] == "can't tell"
    assert report["repeat"] == 1


def test_repetitions_report_means_intervals_and_verdicts(tmp_path):
    from emulator.experiments.compare import summarize_run, write_report

    rows = []
    for r, (dense, sparse) in enumerate([(0.80, 0.90), (0.79, 0.91), (0.81, 0.92)]):
        for i, (label, compressor, sizes, final) in enumerate(
                [("asgd", "dense", [1000] * 4, dense), ("adacomp", "topk", [10, 20, 30, 40], sparse)], start=1):
            path = tmp_path / f"{i:02d}-{label}-r{r}"
            fake_run(path, compressor, sizes, [(0, 0.1), (2, final - 0.1 * i), (4, final)], seed=10 + r)
            rows.append({**summarize_run(path, label), "repeat": r, "seed": 10 + r})
    report = write_report(tmp_path, rows, meta={**META, "repeat": 3, "seeds": [10, 11, 12], "seed_rule": "seed_r = ..."})
    # One target for every run: 90 % of the best mean final accuracy (adacomp's 0.91).
    assert report["target_accuracy"] == pytest.approx(0.9 * 0.91)
    assert "adacomp" in report["target_rule"]
    stats = {entry["method"]: entry for entry in report["aggregate"]}
    assert stats["adacomp"]["final_accuracy"]["mean"] == pytest.approx(0.91)
    assert stats["adacomp"]["final_accuracy"]["half_width"] == pytest.approx(T_975_2 * 0.01 / math.sqrt(3), rel=1e-6)
    assert stats["asgd"]["reached_target"] == 0 and stats["adacomp"]["reached_target"] == 3
    (pair,) = report["pairs"]
    assert pair["final_accuracy"]["mean"] == pytest.approx(-0.11) and pair["final_accuracy"]["verdict"] == "B better"
    markdown = (tmp_path / "compare.md").read_text()
    assert "3 paired repetitions" in markdown and "seeds 10, 11, 12" in markdown
    # Final accuracy: the mean of the last 3 evaluations of the trained model (versions 2 and 4 here).
    assert "| `adacomp` | 0 of 3 (0%; 0%-71%) | 0.8100 ± 0.0248 (3) | 0.9100 ± 0.0248 (3) | 4 ± 0 (3) |" in markdown
    assert "| `asgd` | `adacomp` | -0.0600 ± 0.0248 (3) | 0.00913 | 0.00913 | `adacomp` better |" in markdown
    assert "only `adacomp` reached the target in 3 of the 3 repetitions" in markdown
    assert "| 40.0x ± 0.0x (3) |" in markdown
    assert (tmp_path / "accuracy_vs_ingress.png").stat().st_size > 5000


def test_mean_band_draws_the_mean_and_its_interval():
    import numpy as np
    import pandas as pd
    from matplotlib.figure import Figure

    from analysis.figures import mean_band

    ax = Figure().add_subplot()
    runs = [pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0.1, 0.5, 0.7]}), pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0.3, 0.7, 0.9]})]
    assert mean_band(ax, runs, "x", "y", label="m", points=3)
    (line,) = ax.get_lines()
    assert line.get_label() == "m (mean of 2)"
    assert np.allclose(line.get_ydata(), [0.2, 0.6, 0.8])
    (band,) = ax.collections  # half-width t(0.975, 1) * s / sqrt(2) = 12.706 * 0.1: the band's vertices span it
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(0.2 - t_quantile(0.975, 1) * 0.1, rel=1e-6)
    assert not mean_band(ax, [pd.DataFrame({"x": [], "y": []})], "x", "y")


# -- running: seeds, order, reuse (a stand-in for the emulation) --------------------------


class FakeEmulation:
    """Writes what a run leaves, with an accuracy that depends on the seed and the method only."""

    ran: list[tuple[str, int]] = []
    fail: set[str] = set()
    interrupt: set[str] = set()

    def __init__(self, plan, backend, rundir, **kwargs):
        self.plan, self.rundir = plan, rundir

    def run(self) -> dict:
        path = self.rundir.path
        FakeEmulation.ran.append((path.name, self.plan.seed))
        if path.name in FakeEmulation.fail:
            (path / "summary.json").write_text(json.dumps({"status": "failed", "seed": self.plan.seed}))
            raise RuntimeError("boom")
        if path.name in FakeEmulation.interrupt:  # Ctrl-C: the run tears down and says so
            (path / "summary.json").write_text(json.dumps({"status": "interrupted", "seed": self.plan.seed}))
            return {"status": "interrupted"}
        accuracy = 0.5 + (self.plan.seed % 7) / 100 + (0.2 if "adacomp" in path.name else 0.0)
        sizes = [40] * 4 if "adacomp" in path.name else [1000] * 4
        fake_run(path, "topk" if "adacomp" in path.name else "dense", sizes, [(0, 0.1), (4, accuracy)], seed=self.plan.seed)
        return {"status": "completed"}


@pytest.fixture
def fake_emulation(monkeypatch):
    import emulator.control.controller

    FakeEmulation.ran, FakeEmulation.fail, FakeEmulation.interrupt = [], set(), set()
    monkeypatch.setattr(emulator.control.controller, "Emulation", FakeEmulation)
    return FakeEmulation


def test_repetitions_pair_seeds_and_run_repetitions_outside(tmp_path, fake_emulation):
    from emulator.experiments.compare import compare
    from emulator.experiments.sweep import repetition_seed

    out = compare(TINY_SCENARIO, ["asgd", "adacomp"], tmp_path, repeat=3, say=lambda _: None)
    seeds = [3, repetition_seed(3, 1), repetition_seed(3, 2)]
    assert fake_emulation.ran == [(f"{i:02d}-{m}-r{r}", seeds[r]) for r in range(3) for i, m in ((1, "asgd"), (2, "adacomp"))]
    report = json.loads((out / "compare.json").read_text())
    assert [(r["method"], r["repeat"], r["seed"]) for r in report["methods"]] == [
        (m, r, seeds[r]) for r in range(3) for m in ("asgd", "adacomp")]
    assert report["seeds"] == seeds and report["repeat"] == 3
    (pair,) = report["pairs"]
    assert pair["final_accuracy"]["n"] == 3 and pair["final_accuracy"]["mean"] == pytest.approx(-0.2)
    assert pair["final_accuracy"]["verdict"] == "B better"


def test_one_repetition_runs_the_scenario_seed_as_before(tmp_path, fake_emulation):
    from emulator.experiments.compare import compare

    out = compare(TINY_SCENARIO, ["asgd", "adacomp"], tmp_path, say=lambda _: None)
    assert fake_emulation.ran == [("01-asgd", 3), ("02-adacomp", 3)]
    assert "seed 3, backend local" in (out / "compare.md").read_text()


def test_a_rerun_into_the_directory_reuses_completed_runs(tmp_path, fake_emulation):
    from emulator.experiments.compare import compare

    directory = tmp_path / "cmp"
    fake_emulation.fail = {"02-adacomp-r1"}
    compare(TINY_SCENARIO, ["asgd", "adacomp"], tmp_path, repeat=2, directory=directory, say=lambda _: None)
    first = json.loads((directory / "compare.json").read_text())
    assert first["pairs"][0]["left_out"] == [{"repeat": 1, "why": "adacomp failed"}]
    fake_emulation.ran, fake_emulation.fail = [], set()
    compare(TINY_SCENARIO, ["asgd", "adacomp"], tmp_path, repeat=2, directory=directory, say=lambda _: None)
    assert [name for name, _ in fake_emulation.ran] == ["02-adacomp-r1"]  # only the failed run again
    assert (directory / ".attempts" / "02-adacomp-r1.1" / "summary.json").exists()
    again = json.loads((directory / "compare.json").read_text())
    assert again["pairs"][0]["left_out"] == [] and again["pairs"][0]["final_accuracy"]["n"] == 2


def test_known_rows_are_taken_instead_of_running_and_each_run_is_reported_as_it_ends(tmp_path, fake_emulation):
    """Rows recorded elsewhere (an earlier session's records) stand for their runs where the plan is the same."""
    from emulator.experiments.compare import compare, summarize_run

    ended = []
    compare(TINY_SCENARIO, ["asgd", "adacomp"], tmp_path, repeat=2, directory=tmp_path / "a", say=lambda _: None,
            after_run=lambda run, run_dir: ended.append((run, run_dir)))
    assert [run.run_id for run, _ in ended] == ["01-asgd-r0", "02-adacomp-r0", "01-asgd-r1", "02-adacomp-r1"]
    known = {run.plan_digest: summarize_run(run_dir, run.spec.label) for run, run_dir in ended if run.run_id != "02-adacomp-r1"}
    known["another plan"] = summarize_run(ended[-1][1], "adacomp")  # recorded for another scenario: not this run
    fake_emulation.ran = []
    directory = compare(TINY_SCENARIO, ["asgd", "adacomp"], tmp_path, repeat=2, directory=tmp_path / "b", say=lambda _: None,
                        known=known)
    assert [name for name, _ in fake_emulation.ran] == ["02-adacomp-r1"]
    first, second = (json.loads((tmp_path / d / "compare.json").read_text())["methods"] for d in ("a", "b"))
    assert [r["final_accuracy"] for r in second] == [r["final_accuracy"] for r in first]


def test_an_interrupted_comparison_reports_the_whole_pairs_it_has(tmp_path, fake_emulation):
    from emulator.experiments.compare import compare

    fake_emulation.interrupt = {"01-asgd-r1"}
    with pytest.raises(KeyboardInterrupt):
        compare(TINY_SCENARIO, ["asgd", "adacomp"], tmp_path, repeat=3, directory=tmp_path / "cmp", say=lambda _: None)
    assert [name for name, _ in fake_emulation.ran] == ["01-asgd-r0", "02-adacomp-r0", "01-asgd-r1"]
    report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [(r["method"], r["repeat"], r["status"]) for r in report["methods"]] == [
        ("asgd", 0, "completed"), ("adacomp", 0, "completed"), ("asgd", 1, "interrupted")]
    (pair,) = report["pairs"]
    assert pair["final_accuracy"]["n"] == 1 and pair["repeats"] == 2
    assert pair["left_out"] == [{"repeat": 1, "why": "asgd interrupted, adacomp not run"}]


def test_a_directory_holding_another_plan_is_refused(tmp_path, fake_emulation):
    from emulator.experiments.compare import compare
    from emulator.planning.problems import ScenarioError

    directory = tmp_path / "cmp"
    directory.mkdir()
    fake_run(directory / "01-asgd", "dense", [1000], [(0, 0.1), (1, 0.2)])
    summary = json.loads((directory / "01-asgd" / "summary.json").read_text())
    (directory / "01-asgd" / "summary.json").write_text(json.dumps({**summary, "plan_digest": "0123456789abcdef"}))
    with pytest.raises(ScenarioError, match="another plan"):
        compare(TINY_SCENARIO, ["asgd"], tmp_path, directory=directory, say=lambda _: None)
    assert fake_emulation.ran == []
    with pytest.raises(ScenarioError, match="--repeat"):
        compare(TINY_SCENARIO, ["asgd"], tmp_path, repeat=0, say=lambda _: None)


def test_the_cli_passes_repeat_and_rejects_zero(tmp_path, fake_emulation):
    from click.testing import CliRunner

    from emulator.cli import main

    bad = CliRunner().invoke(main, ["compare", str(TINY_SCENARIO), "-m", "asgd", "--repeat", "0", "--backend", "local"])
    assert bad.exit_code == 2 and "--repeat" in bad.output
    result = CliRunner().invoke(main, ["compare", str(TINY_SCENARIO), "-m", "asgd", "-m", "adacomp", "--repeat", "2",
                                       "--backend", "local", "--dir", str(tmp_path / "cmp"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "## Paired differences" in result.output
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir() if p.is_dir() and p.name not in ("report", "logs")) == [
        "01-asgd-r0", "01-asgd-r1", "02-adacomp-r0", "02-adacomp-r1"]
    assert f"report: {tmp_path / 'cmp' / 'report' / 'report.html'}" in result.output  # a report by default


# -- a real comparison --------------------------------------------------------------------


@pytest.mark.slow
def test_two_methods_twice_on_the_local_backend(tmp_path):
    from emulator.experiments.compare import compare

    out = compare(TINY_SCENARIO, ["asgd", "adacomp"], tmp_path, backend="local", repeat=2, say=lambda _: None,
                  check_fidelity=False)
    report = json.loads((out / "compare.json").read_text())
    runs = {(r["method"], r["repeat"]): r for r in report["methods"]}
    assert sorted(runs) == [("adacomp", 0), ("adacomp", 1), ("asgd", 0), ("asgd", 1)]
    for r in runs.values():
        assert r["status"] == "completed" and r["updates"] == 20
        summary = json.loads((out / r["run_id"] / "summary.json").read_text())
        assert summary["seed"] == r["seed"]  # the run ran with the seed its row says
    assert runs[("asgd", 0)]["seed"] == runs[("adacomp", 0)]["seed"] == 3  # paired, r0 the scenario's
    assert runs[("asgd", 1)]["seed"] == runs[("adacomp", 1)]["seed"] != 3
    assert [a["method"] for a in report["aggregate"]] == ["asgd", "adacomp"]
    assert all(a["final_accuracy"]["n"] == 2 and a["final_accuracy"]["half_width"] is not None for a in report["aggregate"])
    (pair,) = report["pairs"]
    assert pair["final_accuracy"]["n"] == 2 and pair["final_accuracy"]["verdict"] in ("A better", "B better", "can't tell")
    assert (out / "accuracy_vs_ingress.png").stat().st_size > 5000
    print("\n" + (out / "compare.md").read_text())


@pytest.mark.slow
def test_one_method_on_two_backends_is_compared_paired_by_seed(tmp_path, monkeypatch):
    # the same scenario on the local backend (wall clock) and on virtual time: one option apart
    from emulator.experiments.compare import compare

    monkeypatch.setenv("EDGE_EMULATOR_CALIBRATION", str(tmp_path / "calibration.json"))
    out = compare(TINY_SCENARIO, ["adacomp", "adacomp:backend=virtual"], tmp_path, backend="local", repeat=2,
                  say=lambda _: None, check_fidelity=False)
    report = json.loads((out / "compare.json").read_text())
    backends = {}
    for r in report["methods"]:
        summary = json.loads((out / r["run_id"] / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["updates_applied"] == 20
        backends[(r["method"], r["repeat"])] = (summary["backend"], summary["seed"])
    assert {k: b for k, (b, _) in backends.items()} == {("adacomp", 0): "local", ("adacomp", 1): "local",
                                                       ("adacomp:backend=virtual", 0): "virtual", ("adacomp:backend=virtual", 1): "virtual"}
    assert backends[("adacomp", 1)][1] == backends[("adacomp:backend=virtual", 1)][1]  # paired by seed
    (pair,) = report["pairs"]
    assert pair["final_accuracy"]["n"] == 2


def test_a_backend_in_a_method_spec_sets_that_methods_runs_backend():
    from emulator.experiments.compare import parse_method_spec

    spec = parse_method_spec("adacomp:c=0.02:backend=virtual")
    assert spec.backend == "virtual" and "backend=virtual" in spec.overrides and "method.c=0.02" in spec.overrides
    assert parse_method_spec("adacomp").backend is None


# -- outcomes as rates, accuracy over trained runs, Holm over the comparison's pairs --------


def outcome_row(method: str, repeat: int, accuracy: float, outcome: str = "ok") -> dict:
    return {**row(method, repeat, accuracy, None), "outcome": outcome, "final_accuracy_last_k": accuracy}


def test_divergence_is_a_rate_with_an_exact_test_and_accuracy_is_over_trained_runs():
    from emulator.experiments.compare import aggregate, pairs

    # The 64-device case: Comp-c diverged in 2 of 3 runs, AdaComp in none.
    rows = [outcome_row("comp_c", 0, 0.10, "diverged"), outcome_row("adacomp", 0, 0.70),
            outcome_row("comp_c", 1, 0.10, "diverged"), outcome_row("adacomp", 1, 0.66),
            outcome_row("comp_c", 2, 0.75), outcome_row("adacomp", 2, 0.69)]
    (pair,) = pairs(rows)
    rates = pair["not_trained"]
    assert (rates["a"]["x"], rates["a"]["n"], rates["b"]["x"], rates["b"]["n"]) == (2, 3, 0, 3)
    assert rates["p"] == pytest.approx(0.4) and rates["verdict"] == "can't tell"
    # Accuracy only where both trained: repetition 2, one pair, no test.
    assert pair["trained_pairs"] == 1 and pair["trained_accuracy"]["n"] == 1
    assert pair["trained_accuracy"]["mean"] == pytest.approx(0.06) and pair["trained_accuracy"]["verdict"] == "can't tell"
    stats = {entry["method"]: entry for entry in aggregate(rows)}
    assert stats["comp_c"]["trained"] == 1 and stats["comp_c"]["trained_accuracy"]["mean"] == pytest.approx(0.75)
    assert stats["comp_c"]["not_trained"]["low"] == pytest.approx(0.0943, abs=1e-4)  # Clopper-Pearson, 2 of 3
    assert stats["adacomp"]["not_trained"]["high"] == pytest.approx(1 - 0.025 ** (1 / 3), rel=1e-9)


def test_verdicts_are_adjusted_over_the_family_of_pairs():
    from emulator.experiments.compare import pairs

    # Three methods, three pairs: a and b differ clearly from c.
    rows = []
    for rep, (a, b, c) in enumerate([(0.80, 0.78, 0.60), (0.81, 0.80, 0.61), (0.79, 0.77, 0.62), (0.82, 0.79, 0.60)]):
        rows += [outcome_row("a", rep, a), outcome_row("b", rep, b), outcome_row("c", rep, c)]
    by = {(p["a"], p["b"]): p["trained_accuracy"] for p in pairs(rows)}
    assert all(test["family"] == 3 for test in by.values())
    assert by[("a", "c")]["verdict"] == "A better" and by[("b", "c")]["verdict"] == "A better"
    assert all(test["p_holm"] >= test["p"] for test in by.values())
    ranked = sorted(by.values(), key=lambda t: t["p"])
    assert ranked[0]["p_holm"] == pytest.approx(min(1.0, 3 * ranked[0]["p"]))


def _shard(path: Path, ingress: list[int]) -> None:
    """Make ``path``'s run one whose model was split over ``len(ingress)`` servers with these ingress payloads."""
    summary = json.loads((path / "summary.json").read_text())
    summary["servers"] = [{"name": f"server-{i}", "updates": summary["updates_applied"], "ingress_payload_bytes": b,
                           "egress_payload_bytes": 2 * b, "ingress_wire_bytes": b + 60, "egress_wire_bytes": 2 * b + 60}
                          for i, b in enumerate(ingress)]
    (path / "summary.json").write_text(json.dumps(summary))


def test_runs_on_several_servers_add_the_busiest_servers_ingress(tmp_path):
    """A comparison where a method split its model over servers says how many and what its busiest
    server's link carried; one where no run did keeps its table as it was."""
    from emulator.experiments.compare import render_markdown, report_of, summarize_run

    fake_run(tmp_path / "01-asgd", "dense", [1000] * 4, [(0, 0.1), (4, 0.8)])
    fake_run(tmp_path / "02-asgd-2", "dense", [1000] * 4, [(0, 0.1), (4, 0.8)])
    unsharded = [{**summarize_run(tmp_path / "01-asgd", "asgd"), "repeat": 0, "seed": 3}]
    assert unsharded[0]["servers"] == 1 and unsharded[0]["busiest_server_ingress_bytes"] == 4100
    assert "busiest server" not in render_markdown(report_of(unsharded, meta={**META, "repeat": 1}))
    _shard(tmp_path / "02-asgd-2", [2300, 1800])
    rows = unsharded + [{**summarize_run(tmp_path / "02-asgd-2", "asgd:server.shards=2"), "repeat": 0, "seed": 3}]
    single = render_markdown(report_of(rows, meta={**META, "repeat": 1}))
    assert "| servers | busiest server's ingress payload (B) |" in single
    assert single.count(" | 1 | 4,100 |") == 1 and " | 2 | 2,300 |" in single
    repeated = [{**r, "repeat": k, "seed": 3 + k} for r in rows for k in range(2)]
    text = render_markdown(report_of(repeated, meta={**META, "repeat": 2, "seeds": [3, 4]}))
    assert "| 2 | 2,300 ± 0 (2) |" in text and "| 1 | 4,100 ± 0 (2) |" in text


def test_a_sweep_over_shards_tabulates_the_busiest_server():
    import pandas as pd

    from analysis.sweep import METRICS, aggregate, aggregate_rows, metrics_for

    base = {"status": "completed", "outcome": "ok", "final_accuracy": 0.8, "final_accuracy_last_k": 0.8, "updates": 10,
            "ingress_payload_bytes": 4096, "egress_payload_bytes": 8192, "two_way_bytes_per_update": 1228.8, "duration_s": 5.0}
    one = pd.DataFrame([{**base, "server.shards": 1, "servers": 1, "busiest_server_ingress_bytes": 4096}])
    assert metrics_for(one) == METRICS
    table = pd.DataFrame([{**base, "server.shards": n, "servers": n, "busiest_server_ingress_bytes": 4096 // n} for n in (1, 2, 4)])
    agg = aggregate(table, ["server.shards"])
    assert list(agg["busiest_server_ingress_bytes_mean"]) == [4096, 2048, 1024]
    headers, rows = aggregate_rows(agg, ["server.shards"])
    assert headers[-1] == "busiest_server_ingress_bytes (mean ± 95% CI)"
    assert [r[-1] for r in rows] == ["4.00 KiB", "2.00 KiB", "1.00 KiB"]


def test_a_sharded_runs_report_has_a_row_per_server():
    from analysis.report import server_rows

    rows = server_rows([{"name": "server-0", "updates": 300, "ingress_payload_bytes": 2048, "egress_payload_bytes": 4096,
                         "ingress_wire_bytes": 3072, "egress_wire_bytes": None}])
    assert rows == [("server-0", "300", "2.00 KiB", "4.00 KiB", "3.00 KiB", "-")]


def test_a_sharded_runs_update_is_the_sum_of_its_parts_not_one_part():
    """Two servers each trace their half of every push: an update is both halves (1,000 B, not 500)."""
    from emulator.experiments.compare import push_bytes

    rows = [{"bytes": 500, "source": f"server-{i % 2}"} for i in range(8)] + [{"bytes": 502, "source": "server-1"}]
    assert push_bytes(rows) == pytest.approx(500 + (4 * 500 + 502) / 5)
    assert push_bytes([{"bytes": 40}, {"bytes": 60}]) == 50.0 and push_bytes([]) is None
