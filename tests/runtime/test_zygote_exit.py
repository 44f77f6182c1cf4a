"""A device forked from a zygote ends as the interpreter would end it: messages and codes kept."""

from __future__ import annotations

import os
import sys

import pytest

from emulator.runtime.zygote import _exit_as_python_would


def _end_of(run) -> tuple[int, str]:
    """Fork, end the child through the zygote's exit path with stderr on a pipe; its code and output."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(write, 2)
        sys.stderr = open(2, "w", closefd=False)  # the real fd 2, as in a device (pytest captures sys.stderr)
        _exit_as_python_would(run)
    os.close(write)
    with os.fdopen(read) as fh:
        output = fh.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output


def _raise_value_error():
    raise ValueError("bad shard")


@pytest.mark.parametrize("run,code,says", [
    (lambda: 0, 0, ""),
    (lambda: 3, 3, ""),
    (lambda: sys.exit(), 0, ""),
    (lambda: sys.exit(4), 4, ""),
    (lambda: sys.exit("config.json: worker config: missing key 'token'"), 1, "missing key 'token'"),
    (_raise_value_error, 1, "ValueError: bad shard"),
])
def test_codes_and_messages_are_those_of_a_program_run_by_python(run, code, says):
    got_code, output = _end_of(run)
    assert got_code == code
    assert says in output and (says or output == "")
