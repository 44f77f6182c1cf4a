"""scripts/system-deps.sh: one line per thing asked for, and the exact command for what it cannot install.

Nothing is installed here: a thing is made missing on purpose (``PYTHON`` pointing nowhere makes
``python3-venv`` missing), and the script runs with ``--dry-run`` or as an unprivileged user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "system-deps.sh"
MISSING = {**os.environ, "PYTHON": "/nonexistent/python3"}
APT = "run: as root: apt-get update && apt-get install -y python3-venv"


def deps(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, str(SCRIPT), *args], capture_output=True, text=True, env=MISSING, timeout=60)


def test_dry_run_says_one_line_per_thing_and_installs_nothing():
    done = deps("--dry-run", "python3-venv", "fashion-mnist")
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["python3-venv", "dataset-fashion-mnist"]
    assert lines[0].startswith("python3-venv: missing python3-venv; would run: as root: apt-get update && apt-get install -y python3-venv")
    assert done.returncode == 1  # something is still missing


def test_an_unknown_thing_is_refused_before_anything_is_done():
    done = deps("python3-venv", "dokcer")
    assert done.returncode == 2
    assert done.stdout == ""
    assert "unknown thing 'dokcer'" in done.stderr and "docker" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop to an unprivileged user")
def test_not_root_says_what_to_run_and_goes_on():
    done = deps("python3-venv", "make", prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    lines = done.stdout.splitlines()
    assert lines[0] == f"python3-venv: could not install (not root); {APT}"
    assert lines[1].startswith("make: ")  # the next thing is still checked
    assert done.returncode == 1
