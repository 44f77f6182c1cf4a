"""Emulation density on Docker: start time against bare containers, memory per device, most concurrent workers.

Start: N bare containers of the runtime image (``sleep 600`` on an internal network), started
one ``docker run`` after another and with as many threads as the backend uses, against a real
N-worker run through the library (mnist_cnn, the first of Fashion-MNIST, MNIST, mnist-5k that is
here, 2 CPUs shared by the workers).
From its events.jsonl: "containers started" is the controller's ``devices_started`` (N workers
plus server and evaluator running and shaped), "workers connected" the server's last
``connected`` event, "devices ready" the last device ready (TensorFlow loaded, model warmed up);
all measured from the moment the controller began starting devices.
Memory: PSS per device from the same run's stats.jsonl during training (PSS shares the
libraries the containers have in common fairly, so the devices' PSS add up to the machine's use).
Concurrency: available memory over PSS per worker, and (full mode) a real 64-worker run.
"""

from __future__ import annotations

import os
import secrets
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import dataset_line, docker_and_dataset, run_docker_scenario

MB = 1e6
STEADY_AFTER_S = 5.0  # memory samples this long after training started count as steady state
PSS_TARGET = 300 * MB
START_TARGET = 2.0  # emulator start within this many times the bare containers' start
MANY, MANY_CPUS, MANY_DURATION_S = 64, 0.03, 30
RUN_LIMIT_S = 600  # a run still going after this is interrupted (and torn down) and reported


def scenario(name: str, workers: int, cpus: float, duration_s: float, data: dict) -> dict:
    return {"name": name, "seed": 1, "model": "mnist_cnn", "dataset": {"name": data["name"], "test_size": data["test_size"]},
            "training": {"duration": f"{duration_s}s", "eval_every": "60s"},
            "server": {"cpus": 0.5}, "evaluator": {"cpus": 0.25}, "workers": [{"count": workers, "cpus": cpus}]}


def bare_start(docker, image: str, n: int, threads: int, attempts: int = 3) -> float:
    """Seconds until n ``sleep 600`` containers run on a fresh internal network (removed after).

    Tried again when some are not running at the end: another user's ``emulate clean`` removes
    every labelled container, ours included."""
    for attempt in range(attempts):
        try:
            return _bare_start(docker, image, n, threads)
        except BareStartError as exc:
            if attempt + 1 == attempts:
                raise
            print(f"  bare start: {exc}; again", file=sys.stderr)
    raise AssertionError("unreachable")


class BareStartError(RuntimeError):
    pass


def _bare_start(docker, image: str, n: int, threads: int) -> float:
    from docker.errors import DockerException

    from emulator.backends.docker import LABEL, RUN_LABEL, remove_labelled

    run_id = f"bench-density-{secrets.token_hex(3)}"
    labels = {LABEL: "1", RUN_LABEL: run_id}
    try:
        network = docker.networks.create(f"emu-{run_id}", driver="bridge", internal=True, labels=labels)

        def one(i: int) -> None:
            docker.containers.run(image, ["sleep", "600"], name=f"emu-{run_id}-{i}", network=network.name,
                                  labels=labels, detach=True)

        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(n)))
        seconds = time.perf_counter() - started
        running = docker.api.containers(filters={"label": f"{RUN_LABEL}={run_id}", "status": "running"})
        if len(running) != n:
            raise BareStartError(f"{len(running)} of {n} bare containers running")
        return seconds
    except DockerException as exc:
        raise BareStartError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        remove_labelled(run_id, docker, rounds=5, say=lambda msg: print(msg, file=sys.stderr))


def start_times(path: Path, summary: dict) -> dict:
    """Start and boot times of a run, from its events (seconds since devices began starting)."""
    from emulator.control.runstate import READY_EVENTS
    from emulator.control.rundir import read_jsonl

    events = read_jsonl(path / "events.jsonl")
    started = next(e for e in events if e.get("kind") == "devices_started")
    t0 = started["ts"] - started["start_s"]
    connected = [e for e in events if e.get("kind") == "connected" and e.get("role") == "worker"]
    ready = [e for e in events if e.get("kind") in READY_EVENTS]
    return {"devices": started["count"], "containers_started_s": started["start_s"],
            "workers_connected": len({e.get("worker") for e in connected}),
            "workers_connected_s": round(max(e["ts"] for e in connected) - t0, 3) if connected else None,
            "devices_ready": len({e.get("source") for e in ready}),
            "devices_ready_s": round(max(e["ts"] for e in ready) - t0, 3) if ready else None,
            "boot_s": summary.get("boot_s")}


def memory(path: Path, summary: dict) -> dict:
    """Median PSS/RSS per device during training; the total is the median of per-sample sums."""
    from emulator.control.rundir import read_jsonl

    start = summary.get("training_started_ts") or 0.0
    rows = [r for r in read_jsonl(path / "stats.jsonl") if r.get("pss_bytes")]
    steady = [r for r in rows if r["ts"] >= start + STEADY_AFTER_S] or [r for r in rows if r["ts"] >= start]
    if not steady:
        return {"error": "no PSS samples in stats.jsonl (cgroup v1 layout needed)"}
    by_device: dict[str, list] = {}
    by_ts: dict[float, int] = {}
    for r in steady:
        by_device.setdefault(r["device"], []).append(r)
        by_ts[r["ts"]] = by_ts.get(r["ts"], 0) + r["pss_bytes"]
    pss = {d: statistics.median(r["pss_bytes"] for r in rs) for d, rs in by_device.items()}
    rss = {d: statistics.median(r["rss_bytes"] for r in rs) for d, rs in by_device.items()}
    workers = [d for d in pss if d.startswith("worker-")]
    return {"samples": len(steady), "workers": len(workers),
            "worker_pss_bytes": statistics.median(pss[d] for d in workers),
            "worker_pss_max_bytes": max(pss[d] for d in workers),
            "worker_rss_bytes": statistics.median(rss[d] for d in workers),
            "server_pss_bytes": pss.get("server"), "evaluator_pss_bytes": pss.get("evaluator"),
            "total_pss_bytes": statistics.median(by_ts.values())}


def meminfo() -> dict:
    fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return {k: int(fields[k].split()[0]) * 1024 for k in ("MemTotal", "MemAvailable")}


def _run(name: str, workers: int, cpus: float, duration_s: float, image: str, tmp: str,
         data: dict) -> tuple[dict | None, Path | None, str | None]:
    """(summary, run directory, error) of one run: a failed run is reported, not raised."""
    try:
        summary, path = run_docker_scenario(scenario(name, workers, cpus, duration_s, data), tmp, image=image,
                                            check_fidelity=False, limit_s=RUN_LIMIT_S)
    except Exception as exc:  # noqa: BLE001 - the benchmark reports what failed
        return None, None, f"{type(exc).__name__}: {exc}"
    if summary["status"] != "completed":
        return summary, path, f"run {summary['status']} (limit {RUN_LIMIT_S}s)" + (f": {summary['error']}" if summary.get("error") else "")
    return summary, path, None


def many_workers(image: str, tmp: str, data: dict) -> dict:
    """64 workers at once: did every one connect and get at least one update applied?"""
    from emulator.control.rundir import read_jsonl

    summary, path, error = _run("bench-density-64", MANY, MANY_CPUS, MANY_DURATION_S, image, tmp, data)
    out: dict = {"workers": MANY, "cpus": MANY_CPUS, "duration_s": MANY_DURATION_S, "error": error}
    if path is not None and (path / "events.jsonl").exists():
        try:
            out.update(start_times(path, summary))
        except StopIteration:
            pass  # the devices never all started
        out["workers_pushed"] = len({r.get("worker") for r in read_jsonl(path / "updates.jsonl")})
        out["updates"] = summary.get("updates_applied")
        out["memory"] = memory(path, summary)
    out["ok"] = error is None and out.get("workers_connected") == MANY and out.get("workers_pushed") == MANY
    return out


def run(quick: bool = False) -> dict:
    data, cannot = docker_and_dataset()
    if cannot:
        return cannot
    from emulator.host import images
    from emulator.backends.docker import START_THREADS, client

    docker = client()
    image = images.ensure_runtime_image(docker, progress=lambda line: print(line, file=sys.stderr))
    n = 8 if quick else 32
    out: dict = {"workers": n, "worker_cpus": round(2.0 / n, 4), "cores": os.cpu_count(), "start_threads": START_THREADS,
                 "dataset": data}
    try:
        out["bare"] = {"sequential_s": bare_start(docker, image, n, 1), "parallel_s": bare_start(docker, image, n, START_THREADS)}
    except BareStartError as exc:
        return {**out, "error": f"bare containers: {exc}"}
    out["meminfo"] = meminfo()
    with tempfile.TemporaryDirectory(prefix="bench-density-") as tmp:
        summary, path, out["error"] = _run(f"bench-density-{n}", n, 2.0 / n, 20, image, tmp, data)
        if out["error"] is None:
            out["emulator"] = start_times(path, summary)
            out["memory"] = memory(path, summary)
            for label, bare in out["bare"].items():
                out["emulator"][f"ratio_to_bare_{label.removesuffix('_s')}"] = out["emulator"]["containers_started_s"] / bare
            mem = out["memory"]
            if "error" not in mem:
                spare = out["meminfo"]["MemAvailable"] - (mem["server_pss_bytes"] or 0) - (mem["evaluator_pss_bytes"] or 0)
                out["estimated_max_workers"] = int(spare // mem["worker_pss_bytes"])
        if not quick and out["error"] is None:
            out["many"] = many_workers(image, tmp, data)
            if out["many"]["error"]:
                out["error"] = f"{MANY}-worker run: {out['many']['error']}"
    return out


def _mb(value) -> str:
    return "n/a" if value is None else f"{value / MB:,.0f}"


def _s(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def markdown(result: dict) -> list[str]:
    if "skipped" in result:
        return [f"Skipped: {result['skipped']}."]
    if "workers" not in result:
        return [f"**Failed:** {result['error']}"]
    n, bare = result["workers"], result.get("bare")
    lines = [f"{n} workers at {result['worker_cpus']} CPUs each on {result['cores']} cores; "
             f"bare containers: runtime image, `sleep 600`, internal network. {dataset_line(result['dataset'])}", ""]
    if bare is None:
        return lines + [f"**Failed:** {result['error']}"]
    if "emulator" not in result:
        return lines + [f"Bare start: {_s(bare['sequential_s'])} s one after another, {_s(bare['parallel_s'])} s "
                        f"with {result['start_threads']} threads.", "", f"**The emulator run failed:** {result['error']}"]
    emu, mem = result["emulator"], result["memory"]
    lines += ["| start | seconds | x bare (one by one) | x bare (threads) |", "|---|---:|---:|---:|",
              f"| {n} bare containers, `docker run` one after another | {_s(bare['sequential_s'])} | 1.00 | |",
              f"| {n} bare containers, {result['start_threads']} threads | {_s(bare['parallel_s'])} | | 1.00 |"]
    for label, key in ((f"emulator: {emu['devices']} containers started and shaped", "containers_started_s"),
                       (f"emulator: {emu['workers_connected']} workers connected to the server", "workers_connected_s"),
                       (f"emulator: {emu['devices_ready']} devices ready (TensorFlow loaded, warmed up)", "devices_ready_s")):
        value = emu[key]
        ratios = " | ".join("n/a" if value is None else f"{value / b:.2f}" for b in (bare["sequential_s"], bare["parallel_s"]))
        lines.append(f"| {label} | {_s(value)} | {ratios} |")
    met = [emu[f"ratio_to_bare_{k}"] <= START_TARGET for k in ("sequential", "parallel")]
    lines += ["", f"Controller start to training start (summary `boot_s`): {_s(emu['boot_s'])} s. "
              f"Target, containers started within {START_TARGET:g}x bare: "
              f"{'met' if met[0] else 'NOT met'} against `docker run` one by one, "
              f"{'met' if met[1] else 'NOT met'} against threaded `docker run`" + (" (quick: fewer workers than the target's 32)." if n < 32 else "."), ""]
    if "error" in mem:
        lines.append(f"Memory: {mem['error']}.")
    else:
        lines += [f"Memory during training ({mem['samples']} samples, median per device):", "",
                  "| device | PSS (MB) |", "|---|---:|",
                  f"| worker (median of {mem['workers']}) | {_mb(mem['worker_pss_bytes'])} |",
                  f"| worker (largest) | {_mb(mem['worker_pss_max_bytes'])} |",
                  f"| server | {_mb(mem['server_pss_bytes'])} |", f"| evaluator | {_mb(mem['evaluator_pss_bytes'])} |",
                  f"| all {mem['workers'] + 2} devices | {_mb(mem['total_pss_bytes'])} |", "",
                  f"Worker RSS (median) {_mb(mem['worker_rss_bytes'])} MB. Target, under {_mb(PSS_TARGET)} MB PSS per worker: "
                  f"{'met' if mem['worker_pss_bytes'] < PSS_TARGET else 'NOT met'}.", "",
                  f"Most concurrent workers by memory: ({_mb(result['meminfo']['MemAvailable'])} MB available of "
                  f"{_mb(result['meminfo']['MemTotal'])} MB, less server and evaluator) / {_mb(mem['worker_pss_bytes'])} MB "
                  f"per worker = **{result['estimated_max_workers']}** (CPU aside: {result['cores']} cores)."]
    many = result.get("many")
    if many is None:
        lines += ["", f"{MANY}-worker run: not in quick mode."]
    else:
        lines += ["", f"{MANY} workers at once ({many['cpus']} CPUs each, {many['duration_s']} s of training): "
                  f"**{'all connected and pushed' if many['ok'] else 'NOT all'}**" + (f"; {many['error']}" if many.get("error") else "."), "",
                  "| workers connected | workers that pushed | updates | containers started (s) | all ready (s) | boot_s | PSS per worker (MB) |",
                  "|---:|---:|---:|---:|---:|---:|---:|",
                  f"| {many.get('workers_connected', 'n/a')} | {many.get('workers_pushed', 'n/a')} | {many.get('updates', 'n/a')} | "
                  f"{_s(many.get('containers_started_s'))} | {_s(many.get('devices_ready_s'))} | {_s(many.get('boot_s'))} | "
                  f"{_mb((many.get('memory') or {}).get('worker_pss_bytes'))} |"]
    return lines
