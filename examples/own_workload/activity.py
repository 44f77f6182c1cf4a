"""A small activity-recognition data set, generated: 2 s of a phone's 3-axis accelerometer at 25 Hz.

Four activities (resting, walking, running, climbing stairs), each a few periodic components with a
random phase, amplitude, cadence and orientation, plus sensor noise. Not one of the emulator's
built-in data sets and not images: a stand-in for the sensor data an edge device holds.

As a data set loader (the scenario's ``dataset: {loader: activity.py:load}``) it returns the four
arrays; run as a script it also writes them as ``activity.npz`` and ``activity.csv`` beside itself,
the two file forms a scenario can name instead (``dataset: {file: activity.npz}``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ACTIVITIES = ("rest", "walk", "run", "stairs")
RATE_HZ = 25
STEPS = 50  # 2 s windows
AXES = 3


def _window(rng: np.random.Generator, activity: int) -> np.ndarray:
    t = np.arange(STEPS) / RATE_HZ
    gravity = rng.normal(0, 0.3, AXES) + np.array([0.0, 0.0, 9.81])
    cadence, amplitude = {0: (0.0, 0.0), 1: (1.9, 1.2), 2: (2.8, 3.0), 3: (1.4, 1.6)}[activity]
    cadence *= rng.uniform(0.85, 1.15)
    amplitude *= rng.uniform(0.7, 1.3)
    axis = rng.normal(size=AXES)
    axis /= np.linalg.norm(axis)
    phase = rng.uniform(0, 2 * np.pi)
    motion = amplitude * np.sin(2 * np.pi * cadence * t + phase)[:, None] * axis[None, :]
    if activity == 3:  # climbing: a slow vertical drift and a harmonic
        motion[:, 2] += 0.6 * np.sin(2 * np.pi * 2 * cadence * t + phase) + np.linspace(0, 0.8, STEPS)
    noise = rng.normal(0, 0.35 if activity else 0.1, (STEPS, AXES))
    return (gravity + motion + noise).astype(np.float32)


def load(per_class: int = 400, test_per_class: int = 100, seed: int = 0):
    """``(x_train, y_train, x_test, y_test)``: float32 windows (N, 50, 3) and labels 0..3, shuffled."""
    rng = np.random.default_rng(seed)

    def draw(count: int):
        labels = np.repeat(np.arange(len(ACTIVITIES)), count)
        rng.shuffle(labels)
        return np.stack([_window(rng, int(a)) for a in labels]), labels.astype(np.int64)

    x_train, y_train = draw(per_class)
    x_test, y_test = draw(test_per_class)
    return x_train, y_train, x_test, y_test


def write(folder: Path) -> None:
    """activity.npz (the four arrays) and activity.csv (150 feature columns, a label column, a split column)."""
    x_train, y_train, x_test, y_test = load()
    np.savez_compressed(folder / "activity.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    columns = [f"{axis}{i}" for i in range(STEPS) for axis in "xyz"]
    with open(folder / "activity.csv", "w") as fh:
        fh.write(",".join(columns + ["activity"]) + "\n")
        for x, y in zip(x_train, y_train):
            fh.write(",".join(f"{v:.4f}" for v in x.ravel()) + f",{ACTIVITIES[y]}\n")
    with open(folder / "activity-test.csv", "w") as fh:
        fh.write(",".join(columns + ["activity"]) + "\n")
        for x, y in zip(x_test, y_test):
            fh.write(",".join(f"{v:.4f}" for v in x.ravel()) + f",{ACTIVITIES[y]}\n")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
    write(target)
    print(f"wrote {target / 'activity.npz'}, {target / 'activity.csv'} and {target / 'activity-test.csv'}")
