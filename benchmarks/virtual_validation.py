"""The same scenario on Docker and on the virtual clock, paired by seed: what matches and what does not.

``python -m benchmarks.virtual_validation scenarios/quickstart.yaml --seeds 1 2 3`` runs each seed on
both backends (``--runs DIR`` reuses runs made before under DIR: a pair already there is read, not
run again), then writes per pair: updates per second (over the whole run, and steady: between its
10th and 90th percent of updates), a worker step's phases (gradient, compression, exchange), up
and down bytes per update, the staleness distribution (Kolmogorov-Smirnov distance between the two runs' staleness samples), accuracy at
equal time, time to a target accuracy, final accuracy and training time; and per scenario each
target of docs/VIRTUAL_TIME.md with whether it is met. ``--set`` overrides the scenario as
``emulate run --set`` does (``--label`` names the result), so one file gives dense and delta pulls::

    python -m benchmarks.virtual_validation scenarios/validation/symmetric-8.yaml --label symmetric-8-delta \\
        --set method.pull=delta --out docs/performance/virtual-validation

Times are seconds since training started: wall seconds on Docker, virtual seconds on the virtual
backend. Accuracy is read from each run's evaluations (``accuracy.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from analysis.outcomes import mean_ci
from analysis.runs import step_phases

TARGETS = {"updates_per_s": 0.10, "steady_updates_per_s": 0.10, "up_bytes_per_update": 0.01, "down_bytes_per_update": 0.01, "staleness_ks": 0.10,
           "time_to_target": 0.15}
TARGET_SHARE = 0.9  # time to target: the first evaluation at 90 % of the Docker run's best accuracy


STEADY = (0.1, 0.9)  # the steady rate: updates between these shares of the run's updates, over the time between them


def update_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "updates.jsonl").read_text().splitlines() if line.strip()]


def phases(run: Path) -> dict:
    """A worker step's phases in one run (:func:`analysis.runs.step_phases`): where a rate gap comes
    from, gradient, compression or the exchange (push sent to reply taken, the reply's reading included)."""
    path = run / "steps.jsonl"
    return step_phases([json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else [])


def staleness(rows: list[dict]) -> np.ndarray:
    return np.array([row["staleness"] for row in rows], float)


def steady_rate(rows: list[dict]) -> float | None:
    """Updates per second between the 10th and the 90th percent of the run's updates: the clock's
    rate without the start (first pulls, every device starting at once) and the end, which a short
    run's whole-run rate mixes in (8 devices on delta pulls do 300 updates in 5 s)."""
    times = sorted(row["ts"] for row in rows if "ts" in row)
    if len(times) < 20:
        return None
    first, last = int(STEADY[0] * (len(times) - 1)), int(STEADY[1] * (len(times) - 1))
    span = times[last] - times[first]
    return round((last - first) / span, 3) if span > 0 else None


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Largest gap between the two empirical distribution functions."""
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


def evaluations(run: Path, summary: dict) -> list[tuple[float, float]]:
    """(seconds since training started, accuracy) of every evaluation of the run, in time order."""
    start = summary.get("training_started_ts") or 0.0
    rows = [json.loads(line) for line in (run / "accuracy.jsonl").read_text().splitlines() if line.strip()]
    return sorted((max(0.0, r["model_ts"] - start), r["accuracy"]) for r in rows if r.get("accuracy") is not None)


def accuracy_at(evals: list[tuple[float, float]], t: float) -> float | None:
    """The accuracy of the last evaluation at or before ``t``."""
    before = [a for s, a in evals if s <= t + 1e-9]
    return before[-1] if before else None


def time_to(evals: list[tuple[float, float]], target: float) -> float | None:
    return next((s for s, a in evals if a >= target), None)


def compare_pair(docker: Path, virtual: Path) -> dict:
    d, v = (json.loads((r / "summary.json").read_text()) for r in (docker, virtual))
    row = {"seed": d["seed"]}
    for key in ("updates_per_s", "up_bytes_per_update", "down_bytes_per_update", "final_accuracy", "duration_s"):
        row[f"docker_{key}"], row[f"virtual_{key}"] = d.get(key), v.get(key)
        if d.get(key) and v.get(key) is not None:
            row[f"{key}_rel_err"] = round((v[key] - d[key]) / d[key], 4)
    rows_d, rows_v = update_rows(docker), update_rows(virtual)
    row["docker_steady_updates_per_s"], row["virtual_steady_updates_per_s"] = steady_rate(rows_d), steady_rate(rows_v)
    if row["docker_steady_updates_per_s"] and row["virtual_steady_updates_per_s"] is not None:
        row["steady_updates_per_s_rel_err"] = round(row["virtual_steady_updates_per_s"] / row["docker_steady_updates_per_s"] - 1, 4)
    row["docker_phases"], row["virtual_phases"] = phases(docker), phases(virtual)
    sd, sv = staleness(rows_d), staleness(rows_v)
    row["staleness_ks"] = round(ks_distance(sd, sv), 4)
    row["docker_mean_staleness"], row["virtual_mean_staleness"] = round(float(sd.mean()), 3), round(float(sv.mean()), 3)
    ed, ev = evaluations(docker, d), evaluations(virtual, v)
    if ed and ev:
        equal = min(ed[-1][0], ev[-1][0])  # the later of the two runs cut at the earlier one's last evaluation
        row["equal_time_s"] = round(equal, 3)
        row["docker_accuracy_at_equal_time"], row["virtual_accuracy_at_equal_time"] = accuracy_at(ed, equal), accuracy_at(ev, equal)
        target = round(TARGET_SHARE * max(a for _, a in ed), 4)
        row["target_accuracy"] = target
        row["docker_time_to_target_s"], row["virtual_time_to_target_s"] = time_to(ed, target), time_to(ev, target)
        if row["docker_time_to_target_s"] and row["virtual_time_to_target_s"] is not None:
            row["time_to_target_rel_err"] = round(row["virtual_time_to_target_s"] / row["docker_time_to_target_s"] - 1, 4)
    return row


def verdicts(pairs: list[dict]) -> dict:
    """Each target over the pairs: the values, and met (every pair within) or not; accuracy at equal
    time: the virtual mean inside the Docker runs' 95 % t-interval."""
    out = {}
    for key, bound in TARGETS.items():
        field = key if key == "staleness_ks" else f"{key}_rel_err"
        values = [p.get(field) for p in pairs]
        known = [x for x in values if x is not None]
        out[key] = {"values": values, "bound": bound,
                    "met": bool(known) and len(known) == len(values) and all(abs(x) <= bound for x in known)}
    docker = [p.get("docker_accuracy_at_equal_time") for p in pairs]
    virtual = [p.get("virtual_accuracy_at_equal_time") for p in pairs]
    if len(docker) >= 2 and None not in docker and None not in virtual:
        _, mean, half = mean_ci(docker)
        vmean = statistics.mean(virtual)
        out["accuracy_at_equal_time"] = {"docker_interval": [round(mean - half, 4), round(mean + half, 4)],
                                         "virtual_mean": round(vmean, 4), "met": mean - half <= vmean <= mean + half}
    return out


TABLE_KEYS = ("updates_per_s", "steady_updates_per_s", "down_bytes_per_update", "staleness_ks", "time_to_target")


def table(folder: Path, labels: list[str]) -> list[str]:
    """The validation page's table, from the committed ``validation-<label>.json`` files: per target,
    each pair's value (relative error in %, or the KS distance) and a check mark where all pairs meet it."""
    lines = ["| scenario | updates/s (%) | steady updates/s (%) | down bytes / update (%) | staleness KS | time to target (%) | "
             "accuracy at equal time: virtual mean in Docker's interval |", "|---|---|---|---|---|---|---|"]
    for label in labels:
        verdicts_ = json.loads((Path(folder) / f"validation-{label}.json").read_text())["verdicts"]
        cells = []
        for key in TABLE_KEYS:
            fmt = (lambda x: f"{x:.2f}") if key == "staleness_ks" else (lambda x: f"{100 * x:+.1f}")
            values = ", ".join("-" if x is None else fmt(x) for x in verdicts_[key]["values"])
            cells.append(values + (" **met**" if verdicts_[key]["met"] else ""))
        accuracy = verdicts_.get("accuracy_at_equal_time")
        cells.append("-" if not accuracy else f"{accuracy['virtual_mean']:.3f} in {accuracy['docker_interval'][0]:.3f}-"
                     f"{accuracy['docker_interval'][1]:.3f}" + (" **met**" if accuracy["met"] else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def container_table(calibration: Path) -> list[str]:
    """The worker loop as containers measured it, from a committed calibration file: per container
    entry (``emulate calibrate --from-run``), each worker's gradient, compression, loop and whole-step
    CPU (median and range over the run's workers, in ms), then the in-process entries beside them."""
    entries = json.loads(Path(calibration).read_text())["entries"]
    ms = lambda values: f"{1e3 * statistics.median(values):.2f} ({1e3 * min(values):.2f}-{1e3 * max(values):.2f})"
    lines = ["| pulls | run (seed) | workers | steps a worker | gradient (ms) | compression (ms) | loop (ms) | CPU a step (ms) |",
             "|---|---|---:|---|---|---|---|---|"]
    for key, entry in sorted(entries.items()):
        if not key.startswith("loop|"):
            continue
        provenance = entry["provenance"]
        workers = list(provenance["workers"].values())
        pull = json.loads(key.split("pull=", 1)[1].split("|", 1)[0])["mode"]
        steps = [w["steps"] for w in workers]
        lines.append(f"| {pull} | {Path(provenance['run']).name} ({provenance['run_seed']}) | {len(workers)} | {min(steps)}-{max(steps)} | "
                     + " | ".join(ms([w[k] for w in workers]) for k in ("gradient_s", "compress_s", "loop_s", "cpu_per_step_s")) + " |")
    lines.append("")
    for key, entry in sorted(entries.items()):
        if key.startswith(("step|", "compress|")):
            lines.append(f"- in process, {entry['what']}: {1e3 * entry['cpu_s']:.2f} ms (p10 {1e3 * entry['p10_s']:.2f}, "
                         f"p90 {1e3 * entry['p90_s']:.2f}; {entry['samples']} samples)")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", help="the scenario file (not with --table)")
    ap.add_argument("--table", nargs="+", metavar="LABEL", help="run nothing: print the table of these committed results")
    ap.add_argument("--containers", metavar="CALIBRATION", help="run nothing: print the worker loop's per-worker figures of this calibration file")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="a scenario override, as emulate run --set")
    ap.add_argument("--label", help="the result's name (default: the scenario file's stem)")
    ap.add_argument("--out", default="runs/virtual-validation", help="folder for the runs and validation-<label>.json")
    ap.add_argument("--runs", help="reuse the runs under this folder where a pair is already there")
    args = ap.parse_args()
    if args.table:
        print("\n".join(table(Path(args.out), args.table)))
        return
    if args.containers:
        print("\n".join(container_table(Path(args.containers))))
        return
    if not args.scenario:
        ap.error("a scenario file, or --table")
    from emulator.control.run import run_scenario

    label = args.label or Path(args.scenario).stem
    out = Path(args.out)
    base = Path(args.runs) if args.runs else out / "runs"
    rows, failed = [], []
    for seed in args.seeds:
        runs = {}
        for backend in ("docker", "virtual"):
            path = base / label / backend / f"seed-{seed}"
            if not (path / "summary.json").exists():
                summary = run_scenario(args.scenario, base / label / backend, overrides=[*args.overrides, f"seed={seed}"],
                                       backend=backend, run_id=f"seed-{seed}", check_fidelity=False, say=lambda _m: None)
                path = summary.path
            status = json.loads((path / "summary.json").read_text()).get("status")
            if status != "completed":
                failed.append(f"{backend} seed {seed}: {status}")
            runs[backend] = path
        rows.append(compare_pair(runs["docker"], runs["virtual"]))
        print(json.dumps(rows[-1]))
    result = {"scenario": args.scenario, "overrides": args.overrides, "label": label, "seeds": args.seeds,
              "targets": TARGETS, "target_share": TARGET_SHARE, "pairs": rows, "verdicts": verdicts(rows), "failed": failed}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"validation-{label}.json").write_text(json.dumps(result, indent=1) + "\n")
    for key, verdict in result["verdicts"].items():
        print(f"{label}: {key}: {'met' if verdict['met'] else 'MISSED'} {verdict}")
    if failed:
        raise SystemExit(f"{label}: runs that did not complete: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
