"""Emulation fidelity on Docker: configured against measured uplink, downlink, RTT and CPU per device.

A 16-worker run (8 in quick mode) with two kinds of link (4 mbit up / 16 mbit down / 20 ms,
and 8 / 32 mbit / 40 ms) and 0.1 CPUs per worker, on the first of Fashion-MNIST, MNIST, mnist-5k that is here. The numbers are the controller's own
fidelity.json (emulator/control/fidelity.py): rates shaped by tc are compared as TCP goodput (the line
rate times 1448/1514), the RTT against twice the configured delay, the CPU quota as the
backend reads it back, the CPU share as a worker measures it under its quota.
"""

from __future__ import annotations

import statistics
import tempfile

from benchmarks.common import dataset_line, docker_and_dataset, run_docker_scenario

WITHIN = 0.05
MECHANISM = {"uplink_bps": "uplink", "downlink_bps": "downlink", "rtt_s": "delay", "cpu_quota": "cpus", "cpu_share": "cpus"}
RUN_LIMIT_S = 600


def scenario(workers: int, data: dict) -> dict:
    half = workers // 2
    return {"name": "bench-fidelity", "seed": 3, "model": "mnist_cnn", "dataset": {"name": data["name"], "test_size": data["test_size"]},
            "training": {"max_updates": 20, "duration": "120s", "eval_every": "60s"},
            "server": {"cpus": 1.0}, "evaluator": {"cpus": 0.25},
            "workers": [{"count": half, "cpus": 0.1, "uplink": "4mbit", "downlink": "16mbit", "delay": "20ms"},
                        {"count": workers - half, "cpus": 0.1, "uplink": "8mbit", "downlink": "32mbit", "delay": "40ms"}]}


def summarise(report: dict) -> dict:
    """Per property: devices compared, median and worst relative error, how many within 5 % and
    within fidelity.py's own tolerance, and the mechanisms that realised it."""
    out = {}
    for prop in MECHANISM:
        rows = {name: checks[prop] for name, checks in report["devices"].items()
                if prop in checks and checks[prop].get("ok") is not None}
        if not rows:
            continue
        errors = [row["relative_error"] for row in rows.values()]
        worst = max(errors, key=abs)
        out[prop] = {"devices": len(rows), "median_abs_relative_error": statistics.median(abs(e) for e in errors),
                     "worst_relative_error": worst, "within_5pct": sum(abs(e) <= WITHIN for e in errors),
                     "ok": sum(bool(row["ok"]) for row in rows.values()),
                     "mechanisms": sorted({report.get("mechanisms", {}).get(name, {}).get(MECHANISM[prop], "?") for name in rows})}
    return out


def run(quick: bool = False) -> dict:
    import json

    data, cannot = docker_and_dataset()
    if cannot:
        return cannot
    workers = 8 if quick else 16
    out: dict = {"workers": workers, "dataset": data, "scenario": scenario(workers, data)}
    with tempfile.TemporaryDirectory(prefix="bench-fidelity-") as tmp:
        try:
            summary, path = run_docker_scenario(out["scenario"], tmp, check_fidelity=True, limit_s=RUN_LIMIT_S)
        except Exception as exc:  # noqa: BLE001 - the benchmark reports what failed
            out["error"] = f"{type(exc).__name__}: {exc}"
            return out
        if not (path / "fidelity.json").exists():
            out["error"] = f"no fidelity.json (run {summary['status']}: {summary.get('error')})"
            return out
        report = json.loads((path / "fidelity.json").read_text())
    out.update(status=summary["status"], updates=summary["updates_applied"], tolerance=report["tolerance"],
               rtt_floor_s=report["rtt_floor_s"], probe_seconds=report["seconds"], failures=report["failures"],
               properties=summarise(report), devices=report["devices"])
    return out


def markdown(result: dict) -> list[str]:
    if "skipped" in result:
        return [f"Skipped: {result['skipped']}."]
    if "error" in result:
        return [f"**The run failed:** {result['error']}", *(["", dataset_line(result["dataset"])] if "dataset" in result else [])]
    tol = result["tolerance"]
    lines = [f"{result['workers']} workers, run {result['status']} ({result['updates']} updates); checks took "
             f"{result['probe_seconds']:.1f} s. Relative error = (measured - configured) / configured. "
             f"{dataset_line(result['dataset'])}", "",
             f"| property | devices | median abs. error | worst error | within 5 % | within {tol:.0%} (fidelity.py) | mechanism |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for prop, row in result["properties"].items():
        lines.append(f"| {prop} | {row['devices']} | {row['median_abs_relative_error']:.1%} | {row['worst_relative_error']:+.1%} | "
                     f"{row['within_5pct']}/{row['devices']} | {row['ok']}/{row['devices']} | {', '.join(row['mechanisms'])} |")
    lines += ["", "Rates are compared as TCP goodput (tc shapes whole frames; 1448/1514 of the line rate is payload); "
              f"rtt_s passes fidelity.py's check within {tol:.0%} or {result['rtt_floor_s'] * 1000:g} ms, the 5 % column has no floor."]
    if result["failures"]:
        lines += ["", f"fidelity.py flags: {', '.join(result['failures'][:10])}" + (" ..." if len(result["failures"]) > 10 else "")]
    return lines
