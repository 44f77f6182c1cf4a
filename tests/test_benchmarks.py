"""The benchmark suite's bounded versions: they run, measure something, and report it.

The full suite is ``make bench`` (docs/PERFORMANCE.md); the slow test checks the worker, wire and
server benchmarks end to end in their ``--quick`` form, with nothing timed: figures are reported,
and only relations that hold on any machine are asserted. The fast ones check the driver with
stand-in benchmarks (a failed one is marked and makes the exit status 1) and the data set choice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from benchmarks import __main__ as driver
from benchmarks import common, density, fidelity

ROOT = Path(__file__).resolve().parents[1]


def stand_in(name: str, run, markdown=lambda result: [f"value {result['value']}"]) -> types.ModuleType:
    module = types.ModuleType(f"benchmarks.{name}", f"Stand-in benchmark {name}.")
    module.run, module.markdown = run, markdown
    return module


def raises(quick: bool = False) -> dict:
    raise ValueError("dataset 'x' is not available here; tried, in order:\n  - /nowhere: no such directory")


@pytest.fixture
def suite(monkeypatch):
    """Puts stand-in benchmarks where the driver looks them up, as its whole suite."""

    def install(**modules: types.ModuleType) -> None:
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, f"benchmarks.{name}", module)
        monkeypatch.setattr(driver, "SUITE", tuple(modules))

    return install


def test_a_failed_benchmark_is_marked_and_makes_the_exit_status_1_after_the_rest_ran(suite, tmp_path):
    suite(boom=stand_in("boom", raises), fine=stand_in("fine", lambda quick: {"value": 3}),
          broken=stand_in("broken", lambda quick: {"error": "run failed: DatasetUnavailable: no data\nmore"},
                          markdown=lambda result: ["**The run failed.**"]))
    assert driver.main(["--quick", "--out", str(tmp_path)]) == 1

    markdown = (tmp_path / "results.md").read_text()
    assert "**INCOMPLETE: 2 of 3 benchmarks failed (boom, broken)" in markdown
    boom = markdown.split("## boom")[1].split("## fine")[0]
    assert "**FAILED:** ValueError: dataset 'x' is not available here; tried, in order:" in boom
    assert "/nowhere" not in boom  # the first line of the error only
    assert "value 3" in markdown.split("## fine")[1]  # the benchmark after the failed one ran
    assert "**FAILED:** run failed: DatasetUnavailable: no data\n\n**The run failed.**" in markdown
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["fine"]["value"] == 3
    assert set(results["failed"]) == {"boom", "broken"}
    assert results["boom"]["error"].startswith("ValueError: dataset 'x'")  # the whole error is kept here


def test_a_suite_where_nothing_failed_exits_0_and_says_what_was_skipped(suite, tmp_path):
    suite(fine=stand_in("fine", lambda quick: {"value": 1}),
          away=stand_in("away", lambda quick: {"skipped": "no Docker here"}, markdown=lambda result: ["Skipped."]))
    assert driver.main(["--out", str(tmp_path)]) == 0
    markdown = (tmp_path / "results.md").read_text()
    assert "INCOMPLETE" not in markdown and "FAILED" not in markdown
    assert "Skipped: away (no Docker here)." in markdown


def test_docker_benchmarks_train_on_the_best_data_set_here_and_say_which(monkeypatch, tmp_path):
    monkeypatch.setenv("EMULATE_DATA_ROOT", str(tmp_path))  # Fashion-MNIST and MNIST hidden
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.delenv("EMULATE_DOWNLOAD", raising=False)
    data = common.dataset()
    assert (data["name"], data["passed_over"]) == ("mnist-5k", ["fashion-mnist", "mnist"])
    assert data["test_size"] == 1000
    for scenario in (density.scenario("d", 8, 0.25, 20, data), fidelity.scenario(8, data)):
        assert scenario["dataset"] == {"name": "mnist-5k", "test_size": 1000}
    assert common.dataset_line(data).startswith("Data set: mnist-5k (")
    assert common.dataset_line(data).endswith("; not available here: fashion-mnist, mnist).")


@pytest.mark.slow
def test_quick_worker_wire_and_server_benchmarks_write_their_results(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "worker", "wire", "server",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stderr[-6000:])
    results = json.loads((tmp_path / "results.json").read_text())
    markdown = (tmp_path / "results.md").read_text()
    assert all(f"## {name}" in markdown for name in ("worker", "wire", "server"))

    worker = results["worker"]
    assert worker["parameters"] == 421_642
    topk = worker["methods"]["topk c=1% (adacomp, comp_c)"]
    assert topk["message_bytes"] < worker["methods"]["dense (asgd)"]["message_bytes"] / 50
    assert topk["share_of_gradient_step"] > 0

    wire = results["wire"]["by_c"]  # bytes, not times: the targets themselves are checked
    assert all(row["index_vs_floor"] <= 1.3 for row in wire.values())
    assert wire["c=0.01"]["f32"]["overhead_share"] < 0.01

    server = results["server"]
    assert len(server["raw_loopback_samples"]) == 1 and server["raw_loopback_bytes_per_s"] > 0
    rows = {(row["method"], row["pull"], row["pushers"]): row for row in server["ingest"]}
    assert set(rows) == {(m, pull, 8) for m in ("dense", "adacomp") for pull in ("dense", "delta")}
    for row in rows.values():
        assert row["updates"] > 0 and row["server_cpu_ms_per_update"] > 0 and "errors" not in row
        floor = row["exchange_floor"]
        assert floor["exchanges_per_s"] > 0 and floor["server_cpu_ms_per_exchange"] > 0 and row["share_of_exchange_floor"] > 0
    model = 4 * server["parameters"]
    assert rows[("adacomp", "dense", 8)]["reply_bytes"] == rows[("dense", "dense", 8)]["reply_bytes"] > model
    assert rows[("dense", "delta", 8)]["reply_bytes"] > model  # every coordinate changed: the whole model
    assert rows[("adacomp", "delta", 8)]["reply_bytes"] < model / 4  # bytes, not times: a delta is far smaller
    assert set(server["adacomp_apply_ms_by_staleness"]) == {"1", "100"}


def test_the_committed_user_model_boot_table_is_rendered_from_its_json():
    """docs/performance/boot-user-model.md is what benchmarks.boot renders from the committed JSON beside it."""
    import json

    from benchmarks import boot

    folder = ROOT / "docs" / "performance"
    result = json.loads((folder / "boot-user-model.json").read_text())
    assert (folder / "boot-user-model.md").read_text() == "\n".join(boot.markdown(result)) + "\n"
    assert boot.ratios(result["runs"]) == result["user_over_builtin"]
    assert {r["model"] for r in result["runs"]} == {"builtin", "user"}


def _run_dir(root: Path, name: str, seed: int, started: float, evals: list[tuple[float, float]], stalenesses: list[int],
             rate: float = 10.0, **summary) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"seed": seed, "training_started_ts": started, **summary}))
    (run / "accuracy.jsonl").write_text("".join(json.dumps({"model_ts": started + t, "accuracy": a}) + "\n" for t, a in evals))
    (run / "updates.jsonl").write_text("".join(json.dumps({"staleness": s, "ts": started + i / rate}) + "\n"
                                               for i, s in enumerate(stalenesses)))
    return run


def test_virtual_validation_reads_time_to_target_and_accuracy_at_equal_time_from_the_runs(tmp_path):
    from benchmarks.virtual_validation import compare_pair, verdicts

    docker = _run_dir(tmp_path, "d", 1, 100.0, [(0, 0.1), (10, 0.5), (20, 0.8), (30, 0.9)], [1, 2, 3, 3],
                      updates_per_s=10.0, up_bytes_per_update=100.0, down_bytes_per_update=1000.0)
    virtual = _run_dir(tmp_path, "v", 1, 5.0, [(0, 0.1), (11, 0.6), (22, 0.85), (25, 0.88)], [1, 2, 3, 4],
                       updates_per_s=9.5, up_bytes_per_update=100.0, down_bytes_per_update=1010.0)
    row = compare_pair(docker, virtual)
    assert row["equal_time_s"] == 25.0  # the virtual run's last evaluation
    assert (row["docker_accuracy_at_equal_time"], row["virtual_accuracy_at_equal_time"]) == (0.8, 0.88)
    assert row["target_accuracy"] == 0.81  # 90 % of Docker's best
    assert (row["docker_time_to_target_s"], row["virtual_time_to_target_s"]) == (30.0, 22.0)
    assert row["time_to_target_rel_err"] == pytest.approx(22 / 30 - 1, abs=1e-4)
    assert row["staleness_ks"] == 0.25 and row["updates_per_s_rel_err"] == -0.05
    judged = verdicts([row, {**row, "docker_accuracy_at_equal_time": 0.82}])
    assert judged["updates_per_s"]["met"] and judged["down_bytes_per_update"]["met"]
    assert not judged["time_to_target"]["met"] and not judged["staleness_ks"]["met"]
    assert judged["accuracy_at_equal_time"]["virtual_mean"] == 0.88
    assert row["docker_steady_updates_per_s"] is None  # 4 updates: too few to cut a start and an end from
    assert row["docker_phases"] == {}  # no steps.jsonl


def test_a_steps_phases_are_weighted_by_the_steps_of_each_interval(tmp_path):
    from benchmarks.virtual_validation import phases

    (tmp_path / "steps.jsonl").write_text(json.dumps({"steps": 3, "compute_ms": 10, "network_ms": 100}) + "\n"
                                          + json.dumps({"steps": 1, "compute_ms": 30, "network_ms": 20}) + "\n")
    assert phases(tmp_path)["compute_ms"] == 15.0 and phases(tmp_path)["network_ms"] == 80.0


def test_the_steady_rate_leaves_out_a_runs_start_and_end(tmp_path):
    """A run whose first tenth of updates came slowly (the first pulls) has a steady rate of its middle."""
    from benchmarks.virtual_validation import steady_rate

    times = [i * 1.0 for i in range(5)] + [5 + 0.1 * i for i in range(95)]
    rows = [{"ts": t, "staleness": 1} for t in times]
    assert steady_rate(rows) == pytest.approx(10.0)  # 100 updates in 14.4 s overall (7 a second), 10 a second after the start


def test_the_validation_pages_table_is_printed_from_the_committed_results():
    """docs/VIRTUAL_TIME.md's table of every validation scenario is what --table prints from the committed JSON."""
    from benchmarks.virtual_validation import table

    labels = [f"{name}{suffix}" for name in ("quickstart-eval-25", "symmetric-8-delta-2000", "uneven-cpu-16", "crash-8",
                                              "availability-6", "devices-64") for suffix in ("", "-loop")]
    lines = table(ROOT / "docs" / "performance" / "virtual-validation", labels)
    assert "\n".join(lines) in (ROOT / "docs" / "VIRTUAL_TIME.md").read_text()


def test_the_container_calibration_table_is_printed_from_the_committed_file():
    """docs/VIRTUAL_TIME.md's per-worker figures of the container calibration are what --containers
    prints from the committed calibration file, one row per container entry and both in-process entries."""
    from benchmarks.virtual_validation import container_table

    lines = container_table(ROOT / "docs" / "performance" / "virtual-validation" / "calibration-2026-12-06.json")
    assert [line.split(" | ")[0] for line in lines if line.startswith("| de")] == ["| delta", "| dense"]
    assert sum(line.startswith("- in process") for line in lines) == 2
    assert "\n".join(lines) in (ROOT / "docs" / "VIRTUAL_TIME.md").read_text()


def test_the_server_breakdown_times_every_stage_of_the_servers_own_calls_and_leaves_the_server_as_it_was():
    """benchmarks.breakdown wraps the calls a connection thread makes (push, pull, trace): every
    stage is reached, the updates are applied as the server applies them, and the wrappers go."""
    import compression
    from benchmarks import breakdown
    from benchmarks.common import cnn_layout, realistic_gradient
    from emulator.runtime import downlink

    layout = cnn_layout()
    topk = compression.build("topk", {"c": 0.01}, layout, 0)
    messages = []
    for seed in range(6):
        flat = realistic_gradient(layout, seed)
        messages.append(compression.encode(topk.compress([flat[o:o + n] for o, n in zip(layout.offsets, layout.sizes)]), layout))
    functions = (compression.decode_flat, compression.decode, downlink.prepare, downlink.finish)
    result = breakdown.in_process(messages, workers=3, updates=40)  # numpy's loops: decode, not decode_flat, is what runs
    assert (compression.decode_flat, compression.decode, downlink.prepare, downlink.finish) == functions  # restored
    assert set(result["stages_us"]) == {name for name, _ in breakdown.STAGES}
    assert all(us > 0 for us in result["stages_us"].values()), result["stages_us"]
    assert sum(result["stages_us"].values()) < result["us_per_update"]
    lines = breakdown.markdown({"kernels": "numpy", "update_pool": "6 synthetic pushes", "pushers": 3, "in_process": result,
                                "server_process": {"updates_per_s": 1.0, "us_per_update": 2 * result["us_per_update"],
                                                   "request_bytes": 1, "reply_bytes": 1, "loops": "numpy"},
                                "exchange_floor": {"exchanges_per_s": 1.0, "us_per_exchange": 1.0},
                                "socket_path_us": result["us_per_update"]})
    assert sum(line.startswith("| ") for line in lines) == len(breakdown.STAGES) + 5


def test_the_committed_server_breakdown_table_is_rendered_from_its_json():
    """docs/performance/server-breakdown.md is what benchmarks.breakdown renders from the committed JSON beside it."""
    from benchmarks import breakdown

    folder = ROOT / "docs" / "performance"
    result = json.loads((folder / "server-breakdown.json").read_text())
    assert (folder / "server-breakdown.md").read_text() == "\n".join(breakdown.markdown(result)) + "\n"
    inside = result["in_process"]
    assert abs(sum(inside["stages_us"].values()) + inside["glue_us"] - inside["us_per_update"]) < 0.5  # the stages add up
