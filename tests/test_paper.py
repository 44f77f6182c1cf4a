"""`make figures`' driver: the ratio maths on hand-made curves, and the whole pipeline on a tiny budget."""

from __future__ import annotations

import subprocess
import sys

import pytest

from analysis.paper import bytes_to_reach, dense_reference, matched_ratios
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


@pytest.mark.slow
def test_the_figures_pipeline_runs_end_to_end_on_a_tiny_budget(tmp_path):
    done = subprocess.run([sys.executable, "-m", "analysis.paper", "--profile", "smoke", "--backend", "local", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = (tmp_path / "results.md").read_text()
    for section in ("Accuracy and bytes per method", "Server ingress against the number of workers",
                    "Device CPU heterogeneity", "Device crashes"):
        assert f"## {section}" in results
    assert "Dataset: **" in results and "Command: `emulate compare scenarios/paper/methods.yaml" in results
    for image in ("accuracy_vs_updates.png", "accuracy_vs_ingress.png", "bytes_per_method.png", "ingress_vs_workers.png"):
        assert (tmp_path / image).stat().st_size > 10_000 and f"]({image})" in results
