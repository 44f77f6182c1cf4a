"""Shared fixtures: running a scenario through the library, and a Docker engine when one is needed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from emulator.control.run import run_scenario as run

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
TEST_SCENARIOS = Path(__file__).resolve().parent / "scenarios"


def run_scenario(path, out_root, *, backend: str = "local", overrides=(), check_fidelity: bool = True, say=None):
    """Run a scenario file to the end through the library's one entry point, quietly unless
    ``say`` is given; returns (summary, run directory)."""
    summary = run(path, out_root, backend=backend, overrides=overrides, check_fidelity=check_fidelity,
                  say=say or (lambda _msg: None))
    return summary.data, summary.path


def read_jsonl(path) -> list[dict]:
    from emulator.control.rundir import read_jsonl as _read

    return _read(path)


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="session")
def docker_client():
    """A Docker client, or a skip (a failure under CI, where .ci/run must have started the engine)."""
    from emulator.backends.docker import DockerBackend, client

    ok, why = DockerBackend.available()
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"Docker is required under CI: {why}")
        pytest.skip(f"no usable Docker engine: {why}")
    return client()


@pytest.fixture(scope="session")
def runtime_image(docker_client):
    """The runtime image for the current code (built once per session if missing)."""
    from emulator.host import images

    return images.ensure_runtime_image(docker_client, progress=lambda line: None)


@pytest.fixture
def harness():
    """Make in-process parameter servers (``support.paramserver.Harness``); each is closed after the test."""
    from support.paramserver import Harness

    made = []

    def make(**overrides):
        h = Harness(**overrides)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
