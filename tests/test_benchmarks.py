"""The benchmark suite's bounded versions: they run, measure something, and report it.

The full suite is ``make bench`` (docs/PERFORMANCE.md); these check the worker, wire and server
benchmarks end to end in their ``--quick`` form, with nothing timed: figures are reported, and
only relations that hold on any machine are asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


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
    assert len(server["raw_loopback_samples"]) == 2 and server["raw_loopback_bytes_per_s"] > 0
    rows = {(row["method"], row["pushers"]): row for row in server["ingest"]}
    assert set(rows) == {(m, p) for m in ("dense", "adacomp") for p in (1, 8)}
    for row in rows.values():
        assert row["updates"] > 0 and row["server_cpu_ms_per_update"] > 0
    for pushers in (1, 8):
        floor = server["exchange_floor"][str(pushers)]
        assert floor["exchanges_per_s"] > 0 and floor["server_cpu_ms_per_exchange"] > 0
        assert rows[("dense", pushers)]["share_of_exchange_floor"] > 0
    assert set(server["adacomp_apply_ms_by_staleness"]) == {"1", "100"}
