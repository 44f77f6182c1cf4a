"""``python -m benchmarks [--quick] [--only NAME ...] [--out DIR]``: run the suite, write JSON and markdown.

A benchmark fails when it raises or when its result carries an ``error``. The others still run
and everything is written; then results.md says at the top which failed, each failed section
starts with the first line of its error, and the exit status is 1."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

SUITE = ("worker", "wire", "server", "density", "fidelity")


def first_line(text: str) -> str:
    return (str(text).strip().splitlines() or [""])[0]


def run_one(name: str, quick: bool) -> tuple[dict, str, list[str]]:
    """(result, the module's one-line summary, its markdown) of one benchmark; a benchmark that
    raises, or whose markdown does, is a result with an ``error``, not the end of the suite."""
    started = time.perf_counter()
    try:
        module = importlib.import_module(f"benchmarks.{name}")
        result = module.run(quick=quick)
    except Exception as exc:  # noqa: BLE001 - one failed benchmark is reported, the suite goes on
        module, result = None, {"error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = round(time.perf_counter() - started, 1)
    title = first_line(module.__doc__ or "") if module else ""
    try:
        body = module.markdown(result) if module else []
    except Exception as exc:  # noqa: BLE001
        if not result.get("error"):
            result["error"] = f"markdown: {type(exc).__name__}: {exc}"
        body = []
    return result, title, body


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and shorter runs")
    parser.add_argument("--only", nargs="*", choices=SUITE, help="run only these benchmarks")
    parser.add_argument("--out", default=".bench", help="directory for results.json and results.md")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
               "command": "python -m benchmarks" + (" --quick" if args.quick else "") + (f" --only {' '.join(args.only)}" if args.only else ""),
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    sections: list[str] = []
    failed: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name in args.only or SUITE:
        print(f"== {name}", file=sys.stderr, flush=True)
        result, title, body = run_one(name, args.quick)
        results[name] = result
        if result.get("error"):
            failed[name] = first_line(result["error"])
            body = [f"**FAILED:** {failed[name]}", "", *body]
        if "skipped" in result:
            skipped[name] = result["skipped"]
        sections += [f"## {name}", "", *([title, ""] if title else []), *body, ""]
        print("\n".join(body), file=sys.stderr, flush=True)
    results["failed"], results["skipped"] = failed, skipped
    header = [f"# Benchmark results ({results['started']})", "", f"Command: `{results['command']}`", ""]
    if failed:
        header += [f"**INCOMPLETE: {len(failed)} of {len(args.only or SUITE)} benchmarks failed ({', '.join(failed)}); "
                   "each failed section starts with its error.**", ""]
    if skipped:
        header += ["Skipped: " + "; ".join(f"{name} ({why})" for name, why in skipped.items()) + ".", ""]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text("\n".join(header + sections) + "\n")
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}", file=sys.stderr)
    for name, why in failed.items():
        print(f"FAILED: {name}: {why}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
