"""Timing helpers shared by the benchmarks: repeat, take the median, report spread."""

from __future__ import annotations

import statistics
import time
from typing import Callable


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
