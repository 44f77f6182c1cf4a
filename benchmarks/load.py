"""Load: 64 synthetic workers push AdaComp-sized updates at a real parameter server for minutes.

Every push must be answered with the model (no error, no refusal), and the server's memory
must stay flat: it may not grow with the number of updates applied. The AdaComp rule keeps one
copy of its touch counters per worker (4 bytes per parameter), taken at the worker's first
pull, so memory climbs once while the 64 workers first pull and is flat from then on: "start"
is the first sample after every worker holds its first model, "middle" and "end" come later.
The server's RSS and PSS are sampled every second from /proc.

``python -m benchmarks.load [--seconds 300] [--pushers 64] [--json FILE]``; the test suite runs
a bounded version (tests/runtime/test_load.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import threading
import time

import numpy as np

from benchmarks.common import cnn_layout, realistic_gradient
from benchmarks.pushers import ServerProcess, pusher

MiB = 1 << 20
END_MARGIN_S = 1.0  # the end sample, this long before the pushers' deadline
WARMUP_S = 10.0  # allocator arenas and buffers settle; at most a fifth of the run


def adacomp_message(layout, c: float = 0.01) -> bytes:
    """What an AdaComp worker pushes: per-tensor top-c of a gradient (values f32, Elias-Fano indices)."""
    import compression

    grad = realistic_gradient(layout)
    splits = np.split(grad, np.array(layout.offsets[1:]))
    return compression.encode(compression.build("topk", {"c": c}, layout).compress(splits), layout)


class ServerWatch:
    """The server's memory once a second, beside its own counters from the traces."""

    def __init__(self, server: ServerProcess):
        from emulator.host.procstats import memory

        self._memory = memory
        self.server = server
        self.samples: list[dict] = []
        self.version = 0
        self.rejections: dict = {}
        self.updates_traced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="server-watch")
        server.observe(self._observe)

    def _observe(self, stream: str, records: list[dict]) -> None:
        if stream == "server":
            last = records[-1]
            self.version = max(self.version, int(last.get("version", 0)))
            self.rejections = last.get("rejections") or {}
        elif stream == "updates":
            self.updates_traced += len(records)

    def sample(self, label: str = "") -> dict:
        usage = self._memory(self.server.pid, pss_every_s=0) or {}  # growth is the point: always fresh
        row = {"t_s": round(time.monotonic() - self.t0, 2), "version": self.version, "label": label,
               "rss_bytes": usage.get("rss_bytes", 0), "pss_bytes": usage.get("pss_bytes", 0)}
        self.samples.append(row)
        return row

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def start(self) -> "ServerWatch":
        self.t0 = time.monotonic()
        self.sample("before training")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_load(seconds: float = 30.0, pushers: int = 64, c: float = 0.01, say=lambda line: None) -> dict:
    """Run the load; returns the figures (see :func:`markdown`)."""
    layout = cnn_layout()
    message = adacomp_message(layout, c)
    ctx = mp.get_context("fork")
    with ServerProcess(layout, "adacomp") as server:
        watch = ServerWatch(server)
        start_evt, result_q, ready = ctx.Event(), ctx.Queue(), ctx.Value("i", 0)
        procs = [ctx.Process(target=pusher, args=(server.address, server.token, i, message, seconds, start_evt, result_q, ready))
                 for i in range(pushers)]
        for p in procs:
            p.start()
        server.start_training()
        watch.start()
        start_evt.set()
        began = time.monotonic()
        while ready.value < pushers and time.monotonic() - began < seconds:
            time.sleep(0.05)
        pulled = watch.sample("all pulled")
        say(f"all {pushers} pushers hold the model after {pulled['t_s']:.1f} s: server RSS {pulled['rss_bytes'] / MiB:.0f} MiB")
        warmup = min(WARMUP_S, 0.2 * seconds)
        marks = {"start": warmup, "middle": (warmup + seconds - END_MARGIN_S) / 2, "end": seconds - END_MARGIN_S}
        taken = {}
        for label, at in marks.items():  # "end": while every pusher is still connected (one that leaves frees its snapshot)
            time.sleep(max(0.0, began + at - time.monotonic()))
            taken[label] = watch.sample(label)
            say(f"{label}: {taken[label]['version']:,} updates, server RSS {taken[label]['rss_bytes'] / MiB:.0f} MiB")
        results = [result_q.get(timeout=seconds + 300) for _ in procs]
        elapsed = time.monotonic() - began
        for p in procs:
            p.join(timeout=30)
        deadline = time.monotonic() + 10  # the last traces are a quarter-second behind
        while min(watch.version, watch.updates_traced) < sum(r["answered"] for r in results) and time.monotonic() < deadline:
            time.sleep(0.1)
        watch.stop()
        version, rejections, traced = watch.version, watch.rejections, watch.updates_traced
    answered = sum(r["answered"] for r in results)
    steady = [row for row in watch.samples if taken["start"]["t_s"] <= row["t_s"] <= taken["end"]["t_s"]]
    slope = np.polyfit([row["version"] for row in steady], [row["rss_bytes"] for row in steady], 1)[0] if len(steady) > 2 else 0.0
    return {
        "pushers": pushers, "seconds": round(elapsed, 1), "message_bytes": len(message), "parameters": layout.total,
        "pushes": sum(r["pushes"] for r in results), "answered": answered, "rejected": sum(r["rejected"] for r in results),
        "errors": [e for r in results for e in r["errors"]][:20], "server_version": version, "updates_traced": traced,
        "server_rejections": rejections, "updates_per_s": round(answered / elapsed, 1),
        "memory": {"before": watch.samples[0], "all_pulled": pulled, **taken},
        "rss_bytes_per_10k_updates": round(float(slope) * 10_000),
        "snapshot_bytes_expected": pushers * layout.total * 4,
        "samples": watch.samples,
    }


def check(result: dict, *, growth_bytes: int = 32 * MiB) -> list[str]:
    """What is wrong with a load result (empty when all is well)."""
    problems = []
    if result["errors"] or result["rejected"] or result["server_rejections"]:
        problems.append(f"errors {result['errors'][:3]}, rejected {result['rejected']}, server rejections {result['server_rejections']}")
    if result["answered"] != result["pushes"]:
        problems.append(f"{result['pushes'] - result['answered']} pushes not answered")
    if not result["answered"] == result["server_version"] == result["updates_traced"]:
        problems.append(f"answered {result['answered']}, server version {result['server_version']}, traced {result['updates_traced']}")
    memory = result["memory"]
    for key in ("rss_bytes", "pss_bytes"):
        grew = memory["end"][key] - memory["start"][key]
        if grew > growth_bytes:
            problems.append(f"{key} grew by {grew / MiB:.1f} MiB after every worker had pulled")
    return problems


def markdown(result: dict) -> list[str]:
    mem = result["memory"]
    lines = [f"{result['pushers']} pushers, {result['seconds']:.0f} s, AdaComp pushes of {result['message_bytes']:,} B "
             f"on the paper's CNN ({result['parameters']:,} parameters): **{result['answered']:,} updates, "
             f"{result['updates_per_s']:,.0f}/s**; {result['rejected']} refused, {len(result['errors'])} errors.", "",
             "| when | t (s) | updates applied | RSS (MiB) | PSS (MiB) |", "|---|---:|---:|---:|---:|"]
    for label in ("before", "all_pulled", "start", "middle", "end"):
        row = mem[label]
        lines.append(f"| {label.replace('_', ' ')} | {row['t_s']:.1f} | {row['version']:,} | {row['rss_bytes'] / MiB:,.1f} | {row['pss_bytes'] / MiB:,.1f} |")
    lines += ["", f"AdaComp's per-worker snapshots: {result['snapshot_bytes_expected'] / MiB:,.1f} MiB expected between "
              f"'before' and 'all pulled'. RSS trend from start to end: {result['rss_bytes_per_10k_updates'] / MiB:+.2f} MiB "
              "per 10,000 updates."]
    return lines


def run(quick: bool = False) -> dict:
    return run_load(30.0 if quick else 300.0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--pushers", type=int, default=64)
    parser.add_argument("--json", help="also write the result (with every memory sample) here")
    args = parser.parse_args(argv)
    result = run_load(args.seconds, args.pushers, say=lambda line: print(line, file=sys.stderr, flush=True))
    print("\n".join(markdown(result)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    problems = check(result)
    for line in problems:
        print(f"FAIL: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
