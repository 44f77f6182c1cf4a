"""Run directories written by the tests themselves, with the records a real run writes (same
streams, same fields, same clocks), and a sweep runner that writes them instead of running.

:func:`write_synthetic_run`: three workers, a crash and a restart, one evaluation every ten
updates. Used by the analysis, report and sweep tests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

START_TS = 12.5  # trace-clock second at which training started (devices booted before)
LINK = {"uplink_bps": 1e6, "downlink_bps": 10e6, "delay_s": 0.02, "jitter_s": 0.0, "loss": 0.0}  # every worker's


def _jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))


def write_synthetic_run(path: Path, *, method: str = "adacomp", updates: int = 60, workers: int = 3, seed: int = 1,
                        backend: str = "docker", accuracy_gain: float = 0.8, with_summary: bool = True,
                        update_bytes: int = 2_000, run_id: str | None = None) -> Path:
    """A run directory as a real run leaves it; returns its path."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    (path / "logs").mkdir(exist_ok=True)
    run_id = run_id or path.name
    names = [f"worker-{i}" for i in range(workers)]
    cpus = [0.2 + 0.1 * i for i in range(workers)]
    plan = {
        "name": "synthetic", "seed": seed, "model": "mlp", "backend": backend, "horizon_s": 3600.0,
        "dataset": {"name": "digits", "partition": "iid"},
        "training": {"batch_size": 10, "learning_rate": 0.1, "max_updates": updates, "duration": None, "eval_every": {"updates": 10}},
        "method": {"name": method, "compressor": "topk" if method != "asgd" else "dense", "params": {"c": 0.01} if method != "asgd" else {},
                   "rule": method if method != "comp_c" else "plain", "error_feedback": False, "wire": {"values": "f32", "indices": "elias_fano"}},
        "server": {"name": "server", "role": "server", "index": -1, "group": "server", "cpus": 1.0, "memory_bytes": 2 << 30,
                   "link": dict(LINK, uplink_bps=None, downlink_bps=None)},
        "evaluator": {"name": "evaluator", "role": "evaluator", "index": -1, "group": "evaluator", "cpus": 0.5, "memory_bytes": 2 << 30,
                      "link": dict(LINK, uplink_bps=None, downlink_bps=None, delay_s=0.0)},
        "workers": [{"name": n, "role": "worker", "index": i, "group": "slow" if i == 0 else "fast", "cpus": cpus[i],
                     "memory_bytes": 1 << 30, "link": dict(LINK)} for i, n in enumerate(names)],
        "events": [], "triggers": [],
    }
    (path / "plan.json").write_text(json.dumps(plan, indent=1))
    link_mechanism = "tc-htb" if backend == "docker" else "transport-token-bucket"
    (path / "mechanisms.json").write_text(json.dumps(
        {d["name"]: {"cpus": "cgroup-cfs", "uplink": link_mechanism if d["link"]["uplink_bps"] else "unshaped",
                     "downlink": link_mechanism if d["link"]["downlink_bps"] else "unshaped"}
         for d in (plan["server"], plan["evaluator"], *plan["workers"])}))
    (path / "fidelity.json").write_text(json.dumps({"tolerance": 0.1, "failures": ["worker-0.uplink_bps"], "ok": False, "devices": {
        n: {"cpu_quota": {"configured": cpus[i], "measured": cpus[i], "error": 0.0, "relative_error": 0.0, "ok": True},
            "uplink_bps": {"configured": 0.95e6, "measured": 0.7e6 if i == 0 else 0.94e6, "error": 0, "relative_error": -0.263 if i == 0 else -0.01,
                           "ok": i != 0, "line_rate": 1e6}} for i, n in enumerate(names)}}))
    duration = updates * 0.1
    # updates: one every 0.1 s of training, round-robin with some noise; worker 1 is down 2 s - 3.5 s
    ups, t0_of = [], {}
    for t in range(1, updates + 1):
        ts = START_TS + t * 0.1
        candidates = [w for w in range(workers) if not (w == 1 and 2.0 <= ts - START_TS < 3.5)]
        w = candidates[int(rng.integers(len(candidates)))]
        t0 = t0_of.get(w, 0)
        ups.append({"t": t, "worker": w, "t0": t0, "staleness": t - 1 - t0, "bytes": update_bytes, "entries": 48,
                    "scale": 1.0, "decode_us": 300, "apply_us": 200, "ts": round(ts, 4), "source": "server"})
        t0_of[w] = t
    _jsonl(path / "updates.jsonl", ups)
    acc = []
    for v in range(0, updates + 1, 10):
        model_ts = START_TS + v * 0.1
        accuracy = 0.1 + accuracy_gain * (1 - math.exp(-v / (updates / 3)))
        acc.append({"version": v, "model_ts": round(model_ts, 4), "accuracy": round(accuracy, 4), "loss": round(2.3 * (1.05 - accuracy), 4),
                    "final": v == updates, "eval_s": 0.05, "test_size": 360, "ts": round(model_ts + 0.05, 4), "source": "evaluator"})
    _jsonl(path / "accuracy.jsonl", acc)
    traffic = []
    for second in range(int(math.ceil(duration)) + 1):
        ts = START_TS + second + 1.0
        for w in range(workers):
            pushed = [u for u in ups if u["worker"] == w and ts - 1.0 <= u["ts"] < ts]
            if pushed or w != 1:
                traffic.append({"worker": w, "ingress_bytes": sum(u["bytes"] for u in pushed), "pushes": len(pushed),
                                "egress_bytes": 20_000 * len(pushed), "ts": round(ts, 4), "source": "server"})
        traffic.append({"worker": 0xFFFFFFFF, "ingress_bytes": 0, "pushes": 0, "egress_bytes": 20_000, "ts": round(ts, 4), "source": "server"})
    _jsonl(path / "traffic.jsonl", traffic)
    events = [
        {"ts": 1.2, "source": "controller", "kind": "run_started", "run_id": run_id, "backend": backend, "workers": workers},
        {"kind": "training_started", "version": 0, "ts": START_TS - 0.05, "source": "server"},
        {"ts": START_TS, "source": "controller", "kind": "training_started", "boot_s": START_TS},
        {"ts": START_TS + 2.0, "source": "controller", "kind": "fault", "action": "crash", "target": "worker-1", "planned_s": 2.0, "origin": "schedule"},
        {"ts": START_TS + 3.5, "source": "controller", "kind": "fault", "action": "restart", "target": "worker-1", "planned_s": 3.5,
         "origin": "schedule", "incarnation": 1},
        {"ts": START_TS + duration, "source": "controller", "kind": "training_done", "reason": "max_updates reached", "updates": updates},
    ]
    _jsonl(path / "events.jsonl", events)
    devices = ["server", "evaluator", *names]
    quota = {"server": 1.0, "evaluator": 0.5, **dict(zip(names, cpus))}
    stats, net, cpu, rx, tx = [], [], dict.fromkeys(devices, 5.0), dict.fromkeys(devices, 0), dict.fromkeys(devices, 0)
    for second in range(-2, int(math.ceil(duration)) + 2):
        ts = START_TS + second
        for d in devices:
            if d == "worker-1" and 2 <= second < 4:
                continue  # down: no sample
            if d == "worker-1" and second == 4:
                cpu[d] = 1.0  # a new process: the counter starts again
            cpu[d] += quota[d] * float(rng.uniform(0.7, 1.0))
            rx[d] += 40_000 if d != "server" else 3 * update_bytes * 10
            tx[d] += 3 * update_bytes * 10 if d != "server" else 120_000
            stats.append({"ts": round(ts, 3), "device": d, "cpu_s": round(cpu[d], 3), "memory_bytes": 300_000_000})
            net.append({"ts": round(ts, 3), "device": d, "rx_bytes": rx[d], "tx_bytes": tx[d]})
    _jsonl(path / "stats.jsonl", stats)
    if backend == "docker":
        _jsonl(path / "net.jsonl", net)
    steps = [{"worker": w, "steps": 3, "rejected": 0, "push_bytes": 3 * update_bytes, "compute_ms": 20.0, "compress_ms": 2.0,
              "network_ms": 30.0, "loss": 1.0, "ts": round(START_TS + s + 1.0, 4), "source": f"worker-{w}"}
             for s in range(int(duration)) for w in range(workers)]
    _jsonl(path / "steps.jsonl", steps)
    if with_summary:
        summary = {
            "run_id": run_id, "name": "synthetic", "status": "completed", "error": None, "backend": backend, "method": method,
            "rule": plan["method"]["rule"], "compressor": plan["method"]["compressor"], "workers": workers, "seed": seed,
            "final_accuracy": acc[-1]["accuracy"], "final_loss": acc[-1]["loss"], "final_version": updates, "final_is_end_of_training": True,
            "updates_applied": updates, "ingress_payload_bytes": sum(r["ingress_bytes"] for r in traffic),
            "applied_update_bytes": sum(u["bytes"] for u in ups), "rejected_frames": 0, "late_updates": 2, "duration_s": duration,
            "boot_s": START_TS, "training_started_ts": START_TS, "updates_per_s": updates / duration,
            "faults": {"crash": 1, "restart": 1}, "lost_updates": 0, "done_reason": "max_updates reached", "diverged": False,
            "parameters": 4810, "dataset": "scikit-learn's load_digits", "plan_digest": f"{seed:016x}",
            "ingress_wire_bytes": int(sum(r["ingress_bytes"] for r in traffic) * 1.1) if backend == "docker" else None,
        }
        (path / "summary.json").write_text(json.dumps(summary, indent=1))
    return path


class FakeRunner:
    """Writes what a real run writes; fails the runs whose id contains one of ``fail``."""

    def __init__(self, fail=()):
        self.calls: list[str] = []
        self.fail = set(fail)

    def __call__(self, run, sweep, directory):
        self.calls.append(run.run_id)
        if any(f in run.run_id for f in self.fail):
            path = directory / run.run_id
            path.mkdir()
            (path / "summary.json").write_text(json.dumps({"status": "failed", "error": "RuntimeError: boom"}))
            raise RuntimeError("exit status 1: boom")
        rate = dict(run.assignments).get("faults.crash.rate_per_hour", "0")
        spread = (run.seed % 7) / 100  # repetitions differ a little, as real ones do
        path = write_synthetic_run(directory / run.run_id, seed=run.seed % 1000, accuracy_gain=0.8 - 0.002 * float(rate) - spread,
                                   run_id=run.run_id, backend="local", update_bytes=2_000 if "adacomp" in run.run_id else 50_000)
        summary = json.loads((path / "summary.json").read_text())
        summary["plan_digest"] = run.plan_digest
        (path / "summary.json").write_text(json.dumps(summary))
