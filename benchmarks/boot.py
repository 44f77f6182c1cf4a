"""Boot time and memory of Docker runs, each device importing TensorFlow (``exec``) against devices forked from one zygote.

``python -m benchmarks.boot [--workers 8 32 64] [--modes exec zygote] [--models builtin user] [--repeat N]
[--out DIR]`` runs, for each worker count, boot mode and model in the same session (models alternating,
repetition by repetition, so that a pair shares the machine's state), a real run (the paper's CNN:
the built-in ``mnist_cnn``, or ``user``: the same network written as a user's Keras file,
``examples/own_workload/paper_cnn.py``, imported through the plug-in path; N workers at 0.03 core,
server 0.5, evaluator 0.25, 20 s of training, no fidelity probes) and reports from its events:
``containers started`` (the controller's ``devices_started``), ``devices ready`` (the last device
ready: TensorFlow loaded, model warmed up), both from the moment the controller began starting
devices; ``prepare`` (run start to that moment: with ``zygote`` it holds the zygote's own import
and its probe); ``boot_s`` (the summary's: run start to training start). Memory from the run's
stats.jsonl during training (PSS: shared pages divided among the processes mapping them), plus
the zygote container's PSS sampled while the run trains, and how many workers the memory
available before the run would hold at that PSS per worker. ``boot CPU``: CPU seconds spent before
training (each device's cgroup at its first sample, as training starts, plus the zygote's), which
other load on the machine does not stretch as it stretches the wall times.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

from benchmarks.common import dataset_line, docker_and_dataset, run_docker_scenario
from benchmarks.density import MB, meminfo, memory, start_times

CPUS, DURATION_S, RUN_LIMIT_S = 0.03, 20, 900
USER_CNN = Path(__file__).resolve().parents[1] / "examples" / "own_workload" / "paper_cnn.py"
MODELS = {"builtin": "mnist_cnn", "user": {"file": str(USER_CNN), "function": "build"}}


def scenario(name: str, workers: int, data: dict, model: str = "builtin") -> dict:
    return {"name": name, "seed": 1, "model": MODELS[model], "dataset": {"name": data["name"], "test_size": data["test_size"]},
            "training": {"duration": f"{DURATION_S}s", "eval_every": "60s"},
            "server": {"cpus": 0.5}, "evaluator": {"cpus": 0.25}, "workers": [{"count": workers, "cpus": CPUS}]}


class ZygoteWatch(threading.Thread):
    """The largest PSS of any zygote container of a benchmark run, sampled every 2 s."""

    def __init__(self, docker, name: str):
        super().__init__(daemon=True)
        self.docker, self.name = docker, name
        self.pss_bytes = 0
        self.cpu_s = 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        from emulator.backends.docker import LABEL, _cgroup_usage

        while not self.stop.wait(2.0):
            for found in self.docker.api.containers(filters={"label": LABEL, "name": "zygote"}):
                if any(f"-{self.name}-" in name and name.endswith("-zygote") for name in found["Names"]):
                    usage = _cgroup_usage(found["Id"]) or {}
                    self.pss_bytes = max(self.pss_bytes, usage.get("pss_bytes", 0))
                    self.cpu_s = max(self.cpu_s, usage.get("cpu_s", 0.0))


def one(docker, image: str, tmp: str, workers: int, mode: str, data: dict, model: str = "builtin", repeat: int = 0) -> dict:
    from emulator.control.rundir import read_jsonl

    name = f"bench-boot-{mode}-{model}-{workers}-{repeat}"
    watch = ZygoteWatch(docker, name)  # the run id, and so the container's name, holds the scenario's
    watch.start()
    available = meminfo()["MemAvailable"]
    out: dict = {"workers": workers, "mode": mode, "model": model, "repeat": repeat, "mem_available_before": available}
    try:
        summary, path = run_docker_scenario(scenario(name, workers, data, model), tmp, image=image, check_fidelity=False,
                                            limit_s=RUN_LIMIT_S, boot=mode)
    except Exception as exc:  # noqa: BLE001 - reported
        return {**out, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        watch.stop.set()
        watch.join()
    out["status"] = summary["status"]
    out["boot"] = json.loads((path / "mechanisms.json").read_text())["worker-0"].get("boot", "exec (before the boot option)")
    out.update(start_times(path, summary))
    events = read_jsonl(path / "events.jsonl")
    started = next(e for e in events if e.get("kind") == "devices_started")
    out["prepare_s"] = round(started["ts"] - started["start_s"], 3)
    out["updates"] = summary.get("updates_applied")
    out["memory"] = memory(path, summary)
    out["zygote_pss_bytes"] = watch.pss_bytes or None
    # CPU spent booting (load on the machine stretches the wall time, not this): every device's
    # cgroup CPU at its first sample (taken as training starts), plus the zygote's.
    first: dict[str, float] = {}
    for row in read_jsonl(path / "stats.jsonl"):
        if row.get("cpu_s") is not None:
            first.setdefault(row["device"], row["cpu_s"])
    out["boot_cpu_s"] = round(sum(first.values()) + watch.cpu_s, 1) if first else None
    out["zygote_cpu_s"] = round(watch.cpu_s, 1) if watch.cpu_s else None
    mem = out["memory"]
    if "error" not in mem:
        fixed = (mem["server_pss_bytes"] or 0) + (mem["evaluator_pss_bytes"] or 0) + (watch.pss_bytes or 0)
        out["workers_that_fit"] = int((available - fixed) // mem["worker_pss_bytes"])
    return out


def run(workers=(8, 32, 64), modes=("exec", "zygote"), runs: str | None = None, models=("builtin",), repeat: int = 1) -> dict:
    data, cannot = docker_and_dataset()
    if cannot:
        return cannot
    from emulator.backends.docker import client
    from emulator.host import images

    docker = client()
    image = images.ensure_runtime_image(docker, progress=lambda line: print(line, file=sys.stderr))
    result: dict = {"dataset": data, "meminfo": meminfo(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench-boot-") as tmp:
        if runs:
            Path(runs).mkdir(parents=True, exist_ok=True)
            tmp = runs
        for n in workers:
            for mode in modes:
                for r in range(repeat):
                    for model in models:
                        print(f"boot benchmark: {n} workers, boot {mode}, model {model}, repetition {r}", file=sys.stderr, flush=True)
                        row = one(docker, image, tmp, n, mode, data, model, r)
                        print(json.dumps(row), file=sys.stderr, flush=True)
                        result["runs"].append(row)
    result["user_over_builtin"] = ratios(result["runs"])
    return result


def ratios(rows: list[dict]) -> list[dict]:
    """Per worker count, boot mode and repetition: the user model's times over the built-in's, pair by pair."""
    by_key = {(r["workers"], r["mode"], r.get("repeat", 0), r.get("model", "builtin")): r for r in rows if not r.get("error")}
    out = []
    for (n, mode, rep, model), user in sorted(by_key.items()):
        builtin = by_key.get((n, mode, rep, "builtin"))
        if model != "user" or builtin is None:
            continue
        out.append({"workers": n, "mode": mode, "repeat": rep, **{
            key: round(user[key] / builtin[key], 3) if user.get(key) and builtin.get(key) else None
            for key in ("devices_ready_s", "boot_s", "boot_cpu_s")}})
    return out


def _s(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _mb(value) -> str:
    return "n/a" if not value else f"{value / MB:,.0f}"


def markdown(result: dict) -> list[str]:
    if "runs" not in result:
        return [f"not run: {result.get('skipped') or result.get('error')}"]
    lines = [dataset_line(result["dataset"]), "",
             "| workers | boot | model | prepare (s) | containers started (s) | all devices ready (s) | boot_s | boot CPU (s) | updates | "
             "PSS per worker (MB) | server / evaluator (MB) | zygote (MB) | all devices (MB) | workers that fit |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["runs"]:
        if row.get("error"):
            lines.append(f"| {row['workers']} | {row['mode']} | {row.get('model', 'builtin')} | failed: {row['error']} ||||||||||||")
            continue
        mem = row.get("memory", {})
        lines.append(
            f"| {row['workers']} | {row['mode']} | {row.get('model', 'builtin')} | {_s(row.get('prepare_s'))} | {_s(row.get('containers_started_s'))} | "
            f"{_s(row.get('devices_ready_s'))} | {_s(row.get('boot_s'))} | {_s(row.get('boot_cpu_s'))} | {row.get('updates')} | "
            f"{_mb(mem.get('worker_pss_bytes'))} | {_mb(mem.get('server_pss_bytes'))} / {_mb(mem.get('evaluator_pss_bytes'))} | "
            f"{_mb(row.get('zygote_pss_bytes'))} | {_mb(mem.get('total_pss_bytes'))} | {row.get('workers_that_fit', 'n/a')} |")
    if result.get("user_over_builtin"):
        lines += ["", "The user's Keras CNN over the built-in, pair by pair (the same network; 1.0: no cost):", "",
                  "| workers | boot | repetition | all devices ready | boot_s | boot CPU |", "|---:|---|---:|---:|---:|---:|"]
        for r in result["user_over_builtin"]:
            cells = " | ".join("n/a" if r[k] is None else f"{r[k]:.2f}x" for k in ("devices_ready_s", "boot_s", "boot_cpu_s"))
            lines.append(f"| {r['workers']} | {r['mode']} | {r['repeat']} | {cells} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.boot", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--modes", nargs="+", choices=("exec", "zygote"), default=["exec", "zygote"])
    parser.add_argument("--out", default=".bench", help="directory for boot.json and boot.md")
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=["builtin"],
                        help="builtin: mnist_cnn; user: the same CNN as a user's Keras file (examples/own_workload/paper_cnn.py)")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions of each (models alternate within one)")
    parser.add_argument("--runs", help="keep the run directories here (default: a temporary directory)")
    args = parser.parse_args(argv)
    result = run(args.workers, args.modes, args.runs, args.models, args.repeat)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "boot.json").write_text(json.dumps(result, indent=1))
    (out / "boot.md").write_text("\n".join(markdown(result)) + "\n")
    print("\n".join(markdown(result)))
    return 1 if "error" in result or any(r.get("error") for r in result.get("runs", [])) else 0


if __name__ == "__main__":
    sys.exit(main())
