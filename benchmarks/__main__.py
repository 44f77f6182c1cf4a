"""``python -m benchmarks [--quick] [--only NAME ...] [--out DIR]``: run the suite, write JSON and markdown."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
from pathlib import Path

SUITE = ("worker", "wire", "server", "density", "fidelity")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and shorter runs")
    parser.add_argument("--only", nargs="*", choices=SUITE, help="run only these benchmarks")
    parser.add_argument("--out", default=".bench", help="directory for results.json and results.md")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count(), "platform": platform.platform()},
               "command": "python -m benchmarks" + (" --quick" if args.quick else "") + (f" --only {' '.join(args.only)}" if args.only else ""),
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    lines = [f"# Benchmark results ({results['started']})", "", f"Command: `{results['command']}`", ""]
    for name in args.only or SUITE:
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"== {name}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        result = module.run(quick=args.quick)
        result["seconds"] = round(time.perf_counter() - started, 1)
        results[name] = result
        lines += [f"## {name}", "", (module.__doc__ or "").strip().splitlines()[0], "", *module.markdown(result), ""]
        print("\n".join(module.markdown(result)), file=sys.stderr, flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'results.json'} and {out / 'results.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
