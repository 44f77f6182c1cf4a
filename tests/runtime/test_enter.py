"""The pieces that move a forked device into its container, checked on this machine's own processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.runtime import enter

HOLD = Path(__file__).resolve().parents[2] / "emulator" / "runtime" / "hold.py"


@pytest.mark.skipif(not Path("/proc/self/cgroup").exists() or not Path("/sys/fs/cgroup").is_dir(), reason="no cgroup fs")
def test_cgroup_files_are_the_processes_own_cgroups():
    files = enter.cgroup_files(os.getpid(), "/sys/fs/cgroup")
    assert files and all(f.endswith("/cgroup.procs") and os.path.exists(f) for f in files)
    for path in files:  # each is a cgroup this process is in
        assert str(os.getpid()) in Path(path).read_text().split(), path


def test_cgroup_files_refuse_a_root_with_none_of_them(tmp_path):
    with pytest.raises(OSError, match="no cgroup of process"):
        enter.cgroup_files(os.getpid(), str(tmp_path))


def _status(action) -> int:
    pid = os.fork()
    if pid == 0:
        action()
        os._exit(0)
    return os.waitpid(pid, 0)[1]


@pytest.mark.parametrize("action, said", [(lambda: os._exit(3), "exit 3"), (lambda: os.kill(os.getpid(), signal.SIGKILL), "exit 137")])
def test_the_devices_end_is_told_to_the_init_as_an_exit_code(action, said):
    read_fd, write_fd = os.pipe()
    enter.report_exit(enter.Handles(stdin=write_fd), _status(action))
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        assert pipe.read() == said + "\n"


def test_telling_a_gone_init_is_not_an_error():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        enter.report_exit(enter.Handles(stdin=write_fd), _status(lambda: os._exit(0)))
    finally:
        signal.signal(signal.SIGPIPE, previous)
        os.close(write_fd)


@pytest.mark.parametrize("told, code", [("exit 5\n", 5), ("noise\nexit 0\n", 0), ("exit x\n", 1)])
def test_hold_exits_with_the_code_it_is_told(told, code):
    done = subprocess.run([sys.executable, "-I", "-S", str(HOLD)], input=told, capture_output=True, text=True, timeout=30)
    assert done.returncode == code and "waiting for the device" in done.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a new pid namespace needs root and unshare")
def test_hold_with_its_stdin_closed_lives_as_long_as_the_other_process_of_its_namespace():
    # hold is PID 1 of a new pid namespace, a 1 s sleep the only other process, stdin /dev/null.
    script = f"sleep 1 & exec {sys.executable} -I -S {HOLD} </dev/null"
    started = time.monotonic()
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "watching /proc" in done.stdout, done
    assert time.monotonic() - started >= 1.0  # not before the sleep ended
