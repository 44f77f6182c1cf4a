"""A thousand devices on the virtual clock, with a FedScale-format availability trace, on this machine.

``python -m benchmarks.virtual_scale --devices 1000 --updates 3000`` writes a behaviour trace in
FedScale's format (a pickle of ``{client: {"active": [...], "inactive": [...]}}``; synthetic,
seeded: alternating online and offline spells, exponential, 70 % online, since FedScale's own
file is not shipped here), converts it with ``emulate traces convert --from fedscale-behavior``'s
code, runs the scenario on the virtual backend, and prints what the run cost this host: wall
time, peak memory, and wall time per update against the compute floor (gradient + compression +
server apply, measured in the same run, :mod:`emulator.control.simulation`'s ``virtual_wall.json``).
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path

import numpy as np

SCENARIO = """\
name: virtual-scale-{devices}
seed: 3
model: {model}
dataset: {{name: fashion-mnist, partition: iid}}
training: {{batch_size: 10, learning_rate: 0.05, max_updates: {updates}, duration: {duration}, eval_every: 60s}}
method: {{name: {method}}}
server: {{cpus: 1.0}}  # its link unshaped, as the quickstart's
evaluator: {{cpus: 1.0}}
workers:
  - name: phones
    count: {devices}
    cpus: {{uniform: [0.1, 0.5]}}
    uplink: {{uniform: [1mbit, 10mbit]}}
    downlink: {{uniform: [5mbit, 50mbit]}}
    delay: {{choice: [20ms, 50ms, 100ms]}}
    traces:
      availability: availability.csv
      offline: crash
      devices: in_order
      offset: random
      speedup: {speedup}
"""


def behaviour_trace(path: Path, clients: int, horizon_s: float, seed: int, online: float = 0.7, mean_online_s: float = 180.0) -> None:
    """A FedScale behaviour trace (its format: active/inactive second lists per client), synthetic and seeded."""
    rng = np.random.default_rng(seed)
    mean_offline_s = mean_online_s * (1 - online) / online
    data = {}
    for client in range(clients):
        t = float(rng.exponential(mean_offline_s)) if rng.random() > online else 0.0
        active, inactive = [], []
        while t < horizon_s:
            end = t + float(rng.exponential(mean_online_s))
            active.append(round(t, 3))
            inactive.append(round(min(end, horizon_s), 3))
            t = end + float(rng.exponential(mean_offline_s))
        data[client + 1] = {"active": active, "inactive": inactive, "finish_time": horizon_s, "model": "synthetic"}
    path.write_bytes(pickle.dumps(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--updates", type=int, default=3000)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--speedup", type=float, default=10.0, help="trace seconds per virtual second")
    ap.add_argument("--duration", default="600s", help="training.duration: the plan's horizon for the trace's events")
    ap.add_argument("--method", default="adacomp, c: 0.01", help="the method mapping's inside: 'asgd' or 'adacomp, c: 0.01'")
    ap.add_argument("--out", default="runs/virtual-scale")
    args = ap.parse_args()
    from emulator.control.run import run_scenario
    from emulator.planning import tracegen

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    behaviour = out / "behaviour.pkl"
    behaviour_trace(behaviour, args.devices, 4 * 3600.0, seed=1)
    converted = tracegen.convert("fedscale-behavior", behaviour, out / "availability.csv")
    scenario = out / "scenario.yaml"
    scenario.write_text(SCENARIO.format(devices=args.devices, updates=args.updates, model=args.model, speedup=args.speedup,
                                              duration=args.duration, method=args.method))
    started = time.perf_counter()
    summary = run_scenario(scenario, out / "runs", backend="virtual", say=print)
    wall = json.loads((summary.path / "virtual_wall.json").read_text())
    result = {"devices": args.devices, "model": args.model, "speedup": args.speedup, "method": args.method, "duration": args.duration, "trace": converted, "updates": summary.data["updates_applied"],
              "virtual_s": summary.data["duration_s"], "faults": summary.data["faults"], "final_accuracy": summary.data["final_accuracy"],
              "command_wall_s": round(time.perf_counter() - started, 1), **wall, "run": str(summary.path)}
    print(json.dumps(result, indent=1))
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
