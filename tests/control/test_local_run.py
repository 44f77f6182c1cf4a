"""The quickstart, end to end on the local backend, for the paper's three methods (real TensorFlow)."""

from __future__ import annotations

import pytest

from conftest import SCENARIOS, read_json, read_jsonl, run_scenario

pytestmark = pytest.mark.slow
METHODS = ("asgd", "comp_c", "adacomp")
UPDATES = 200
# Dense ASGD at the paper's alpha = 0.1 diverges in some runs (stale dense gradients, see
# docs/REPRODUCTION.md); so does Comp-c, which has no staleness control (CI of 2026-12-06: its loss
# ended at 0.604 of the initial one against the 0.6 bound); the integration test runs both at 0.05.
METHOD_SETTINGS = {
    "asgd": ["method={name: asgd}", "training.learning_rate=0.05"],
    "comp_c": ["method={name: comp_c, c: 0.01}", "training.learning_rate=0.05"],
    "adacomp": ["method={name: adacomp, c: 0.01}"],
}
RESULTS: dict[str, dict] = {}


@pytest.mark.parametrize("method", METHODS)
def test_quickstart_trains_well_above_chance(method, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"runs-{method}")
    summary, run = run_scenario(
        SCENARIOS / "quickstart.yaml", out, backend="local",
        overrides=[*METHOD_SETTINGS[method], f"training.max_updates={UPDATES}", "training.eval_every=100 updates"],
    )
    RESULTS[method] = summary
    assert summary["status"] == "completed"
    assert summary["updates_applied"] == UPDATES
    assert summary["final_is_end_of_training"] and summary["final_version"] == UPDATES
    # Asynchronous runs differ from run to run (Comp-c most: it has no staleness control), so
    # the bound is twice chance and a loss well below the initial one, not a tuned figure.
    accuracy = read_jsonl(run / "accuracy.jsonl")
    assert summary["final_accuracy"] > 0.2, f"{method}: {summary['final_accuracy']} is not well above chance (0.1)"
    assert accuracy[-1]["loss"] < 0.6 * accuracy[0]["loss"]

    updates = read_jsonl(run / "updates.jsonl")
    assert [u["t"] for u in sorted(updates, key=lambda u: u["t"])] == list(range(1, UPDATES + 1))
    assert {u["worker"] for u in updates} == {0, 1, 2, 3}
    assert all(u["staleness"] >= 0 for u in updates)
    assert [a["version"] for a in accuracy][:1] == [0] and accuracy[-1]["final"]
    # The payload the server counted is the sum of what it received, frame by frame.
    assert summary["ingress_payload_bytes"] >= sum(u["bytes"] for u in updates)
    assert read_json(run / "mechanisms.json")["worker-0"]["uplink"] == "transport-token-bucket"
    fidelity = read_json(run / "fidelity.json")
    assert fidelity["devices"]["worker-0"]["uplink_bps"]["measured"] > 0


def test_compression_cuts_ingress_and_report_the_ratio():
    missing = [m for m in METHODS if m not in RESULTS]
    if missing:
        pytest.skip(f"needs the runs of {missing}")
    dense = RESULTS["asgd"]["ingress_payload_bytes"]
    for method in ("comp_c", "adacomp"):
        ratio = dense / RESULTS[method]["ingress_payload_bytes"]
        print(f"\ningress payload over {UPDATES} updates: asgd {dense:,} B, {method} "
              f"{RESULTS[method]['ingress_payload_bytes']:,} B, ratio {ratio:.1f}x; "
              f"accuracy asgd {RESULTS['asgd']['final_accuracy']:.3f}, {method} {RESULTS[method]['final_accuracy']:.3f}")
        # Top 1% per tensor with 4-byte values and ~1.1-byte indices: far more than 10x fewer bytes.
        assert ratio > 10


def test_a_run_into_a_relative_directory_from_the_command_line(tmp_path, monkeypatch):
    # `emulate run scenario.yaml` writes under ./runs by default. The local backend starts its
    # devices with the run directory as their working directory, so a relative run path once
    # pointed every device's log at a directory that did not exist there: no device started.
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    done = subprocess.run([sys.executable, "-m", "emulator.cli", "run", str(SCENARIOS / "quickstart.yaml"), "--backend", "local",
                           "--set", "training.max_updates=10", "--no-fidelity", "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert read_json(run / "summary.json")["status"] == "completed"
    assert (run / "logs" / "worker-0.log").exists()
