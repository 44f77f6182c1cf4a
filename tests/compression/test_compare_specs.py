"""Method specs and ``emulate compare``'s measures (fast), and a real three-method comparison (slow).

They came with the compressors beyond top-k; by subject they belong beside tests/experiments/test_compare.py."""

from __future__ import annotations

import json

import pytest


TINY = """\
name: tiny-compare
seed: 3
model: mlp
dataset: {name: digits, partition: shards}
training: {batch_size: 16, learning_rate: 0.1, max_updates: 60, eval_every: 20 updates}
method: {name: adacomp, c: 0.01}
server: {cpus: 1.0}
evaluator: {cpus: 0.5}
workers:
  - {count: 4, cpus: 0.5, uplink: 1mbit, downlink: 10mbit, delay: 20ms}
"""  # slow links: training lasts seconds, not a fraction of one


@pytest.fixture
def tiny_scenario(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def test_method_spec_syntax():
    from emulator.experiments.compare import parse_method_spec

    spec = parse_method_spec("topk:c=0.001:error_feedback=true")
    assert spec.overrides == ('method={"name": "topk"}', "method.c=0.001", "method.error_feedback=true")
    assert spec.slug == "topk_c-0.001_error_feedback-true"
    assert parse_method_spec("adacomp").overrides == ('method={"name": "adacomp"}',)
    assert parse_method_spec("topk:wire.values=f16").overrides[-1] == "method.wire.values=f16"
    # Another section of the scenario is set for that method's run only.
    assert parse_method_spec("asgd:training.learning_rate=0.05").overrides == ('method={"name": "asgd"}', "training.learning_rate=0.05")
    for bad in ("", "qsgd:s", "qsgd:=4", "qsgd:name=dgc", "q sgd", "qsgd:s.=4"):
        with pytest.raises(ValueError):
            parse_method_spec(bad)


@pytest.mark.parametrize("spec,expected", [
    ("qsgd:s=0", "method.s"), ("qsgd:q=1", "unknown parameter for qsgd"), ("nope", "method.name"),
    ("dgc:error_feedback=true", "method.error_feedback: dgc keeps its own residual"),
    ("topk:rule=fast", "method.rule"), ("topk:wire.values=f8", "method.wire.values"),
])
def test_method_specs_are_validated_with_the_scenario(spec, expected, tiny_scenario, tmp_path):
    from emulator.experiments.compare import compare
    from emulator.planning.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=expected.replace(".", r"\.")):
        compare(tiny_scenario, ["asgd", spec], tmp_path / "out", say=lambda _: None)
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_compare_refuses_method_overrides_and_repeats(tiny_scenario, tmp_path):
    from emulator.experiments.compare import compare
    from emulator.planning.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="method specs"):
        compare(tiny_scenario, ["asgd"], tmp_path, overrides=["method.c=0.1"], say=lambda _: None)
    with pytest.raises(ScenarioError, match="twice"):
        compare(tiny_scenario, ["asgd", "asgd"], tmp_path, say=lambda _: None)
    with pytest.raises(ScenarioError, match="at least one"):
        compare(tiny_scenario, [], tmp_path, say=lambda _: None)


def _fake_run(path, compressor, sizes, accuracy, compute_ms=10.0, compress_ms=1.0):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({
        "status": "completed", "compressor": compressor, "rule": "plain", "final_accuracy": accuracy[-1][1],
        "updates_applied": len(sizes), "ingress_payload_bytes": sum(sizes) + 100, "training_started_ts": 5.5,
    }))
    (path / "updates.jsonl").write_text("".join(json.dumps({"t": t, "bytes": b}) + "\n" for t, b in enumerate(sizes, 1)))
    (path / "accuracy.jsonl").write_text("".join(
        json.dumps({"version": v, "accuracy": a, "ts": 5.0 + v}) + "\n" for v, a in accuracy))
    (path / "events.jsonl").write_text(json.dumps({"kind": "training_started", "source": "server", "ts": 5.0}) + "\n")
    (path / "steps.jsonl").write_text(
        json.dumps({"steps": 3, "compute_ms": compute_ms, "compress_ms": compress_ms}) + "\n"
        + json.dumps({"steps": 1, "compute_ms": 2 * compute_ms, "compress_ms": 0.0}) + "\n")


def test_compare_measures_from_traces(tmp_path):
    from emulator.experiments.compare import summarize_run, training_start, write_report

    _fake_run(tmp_path / "a", "dense", [1000] * 4, [(0, 0.1), (2, 0.5), (4, 0.8)])
    _fake_run(tmp_path / "b", "topk", [10, 20, 30, 40], [(0, 0.1), (2, 0.7), (4, 0.9)], compress_ms=5.0)
    rows = [summarize_run(tmp_path / "a", "asgd"), summarize_run(tmp_path / "b", "adacomp")]
    assert training_start(tmp_path / "a", {"training_started_ts": 5.5}) == 5.0  # the server's event first
    assert training_start(tmp_path / "missing", {"training_started_ts": 5.5}) == 5.5
    assert rows[1]["curve"] == [
        {"version": 0, "bytes": 0, "accuracy": 0.1, "time_s": 0.0},
        {"version": 2, "bytes": 30, "accuracy": 0.7, "time_s": 2.0},
        {"version": 4, "bytes": 100, "accuracy": 0.9, "time_s": 4.0},
    ]
    assert rows[1]["bytes_per_update"] == 25.0
    assert rows[1]["compress_overhead"] == pytest.approx(15.0 / 50.0)
    report = write_report(tmp_path, rows)
    assert report["target_accuracy"] == pytest.approx(0.81)
    asgd, adacomp = report["methods"]
    assert asgd["ratio_to_dense"] == 1.0 and adacomp["ratio_to_dense"] == 40.0
    assert asgd["time_to_target"] is None and adacomp["time_to_target"] == {"time_s": 4.0, "version": 4}
    markdown = (tmp_path / "compare.md").read_text()
    assert "| `adacomp` | 0.9000 | 4 | 200 | 25 | 40.0x | - | - | 4.0 (update 4) | 0.300 |" in markdown  # no downlink counted
    assert "not reached" in markdown
    assert (tmp_path / "accuracy_vs_ingress.png").stat().st_size > 1000
    assert json.loads((tmp_path / "compare.json").read_text())["methods"][1]["ratio_to_dense"] == 40.0
    assert write_report(tmp_path, rows, target_accuracy=0.5)["methods"][0]["time_to_target"] == {"time_s": 2.0, "version": 2}


@pytest.mark.slow
def test_compare_three_methods(tiny_scenario, tmp_path):
    from emulator.experiments.compare import compare

    lines = []
    out = compare(tiny_scenario, ["asgd", "adacomp", "qsgd"], tmp_path, backend="local", say=lines.append)
    assert out.parent == tmp_path and out.name.startswith("compare-tiny-compare-")
    report = json.loads((out / "compare.json").read_text())
    rows = {row["method"]: row for row in report["methods"]}
    assert list(rows) == ["asgd", "adacomp", "qsgd"]
    for row in rows.values():
        assert row["status"] == "completed" and row["updates"] == 60
        assert (out / row["run_id"] / "summary.json").exists()
        assert row["curve"] and row["curve"][-1]["bytes"] > 0
    assert rows["adacomp"]["bytes_per_update"] < rows["qsgd"]["bytes_per_update"] < rows["asgd"]["bytes_per_update"]
    assert rows["adacomp"]["ingress_payload_bytes"] < rows["asgd"]["ingress_payload_bytes"]
    assert rows["asgd"]["ratio_to_dense"] == 1.0 and rows["adacomp"]["ratio_to_dense"] > 5
    markdown = (out / "compare.md").read_text()
    assert markdown.count("\n| `") == 3
    assert (out / "accuracy_vs_ingress.png").stat().st_size > 5000
    print("\n" + markdown)


def test_compress_overhead_prefers_cpu_time_to_wall_time():
    from emulator.experiments.compare import compress_overhead

    # Under a CPU quota a phase that runs out of quota waits for the next period: wall 60 ms of
    # compression that cost 1.5 ms of CPU must not read as 4x the gradient.
    throttled = [{"steps": 2, "compute_ms": 15.0, "compress_ms": 60.0, "compute_cpu_ms": 14.0, "compress_cpu_ms": 1.4},
                 {"steps": 1, "compute_ms": 15.0, "compress_ms": 60.0, "compute_cpu_ms": 16.0, "compress_cpu_ms": 1.7}]
    assert compress_overhead(throttled) == pytest.approx((2 * 1.4 + 1.7) / (2 * 14.0 + 16.0))
    older = [{"steps": 1, "compute_ms": 10.0, "compress_ms": 1.0}]  # traces from before CPU times were recorded
    assert compress_overhead(older) == pytest.approx(0.1)
    assert compress_overhead([]) is None
