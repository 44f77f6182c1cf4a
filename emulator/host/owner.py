"""Who made a resource: the controller's host, boot, pid and process start time.

``emulate clean`` must remove what a killed controller left and nothing of a run still going,
also when both were started from other terminals. Every resource a run makes carries its
controller's :class:`Owner` (as Docker labels, in a cgroup's or a temporary file's name, in a
probe link's alias). A resource is an orphan when its owner was on this host and that process
is gone: another boot, or no live process with that pid *and* start time (a pid is reused,
the pair is not). An owner on another host cannot be checked from here, and a resource without
owner marks (made by an older emulator) cannot be checked at all: both are kept unless asked.
"""

from __future__ import annotations

import functools
import os
import re
import socket
from dataclasses import dataclass

HOST_LABEL = "edge-emulator.owner.host"
BOOT_LABEL = "edge-emulator.owner.boot"
PID_LABEL = "edge-emulator.owner.pid"
START_LABEL = "edge-emulator.owner.start"
TOKEN = re.compile(r"^(\d+)-(\d+)$")  # "<pid>-<start>": the owner in a name, on this host and boot

ORPHAN, ALIVE, REMOTE, UNKNOWN = "orphan", "alive", "remote", "unknown"


def start_ticks(pid: int) -> int | None:
    """Process start time in clock ticks since boot (field 22 of ``/proc/<pid>/stat``), or None
    when no such process exists (a zombie counts as gone: it runs nothing)."""
    try:
        text = open(f"/proc/{pid}/stat").read()
    except (OSError, ValueError):
        return None
    fields = text[text.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    if not fields or fields[0] in ("Z", "X"):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    try:
        return open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        return "unknown"


@functools.lru_cache(maxsize=1)
def host_name() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class Owner:
    """A process, named so that it cannot be mistaken for another one."""

    host: str
    boot: str
    pid: int
    start: int  # clock ticks since boot

    @classmethod
    def current(cls) -> "Owner":
        """This process (computed each time: a forked sweep child is an owner of its own)."""
        pid = os.getpid()
        return cls(host_name(), boot_id(), pid, start_ticks(pid) or 0)

    @classmethod
    def of_pid(cls, pid: int) -> "Owner | None":
        ticks = start_ticks(pid)
        return None if ticks is None else cls(host_name(), boot_id(), pid, ticks)

    def labels(self) -> dict[str, str]:
        return {HOST_LABEL: self.host, BOOT_LABEL: self.boot, PID_LABEL: str(self.pid), START_LABEL: str(self.start)}

    @classmethod
    def from_labels(cls, labels: dict | None) -> "Owner | None":
        """The owner a resource's labels name; None when they name none (or not fully)."""
        labels = labels or {}
        try:
            return cls(labels[HOST_LABEL], labels[BOOT_LABEL], int(labels[PID_LABEL]), int(labels[START_LABEL]))
        except (KeyError, ValueError, TypeError):
            return None

    @property
    def token(self) -> str:
        """``<pid>-<start>``: the owner in a file or cgroup name (those live on this host, this boot)."""
        return f"{self.pid}-{self.start}"

    @classmethod
    def from_token(cls, token: str) -> "Owner | None":
        match = TOKEN.fullmatch(token)
        return cls(host_name(), boot_id(), int(match[1]), int(match[2])) if match else None

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def verdict(owner: Owner | None) -> tuple[str, str]:
    """(``orphan`` | ``alive`` | ``remote`` | ``unknown``, why), for a resource owned by ``owner``."""
    if owner is None:
        return UNKNOWN, "owner unknown (no owner labels: made by an older emulator, or not by a run)"
    if owner.host != host_name():
        return REMOTE, f"its controller runs on host {owner.host}, which cannot be checked from here"
    if owner.boot != boot_id():
        return ORPHAN, f"its controller ({owner.describe()}) ran before this machine rebooted"
    ticks = start_ticks(owner.pid)
    if ticks == owner.start:
        return ALIVE, f"its controller ({owner.describe()}) is running"
    if ticks is None:
        return ORPHAN, f"its controller ({owner.describe()}) is gone"
    return ORPHAN, f"its controller ({owner.describe()}) is gone (the pid now names another process)"


__all__ = ["ALIVE", "ORPHAN", "Owner", "REMOTE", "UNKNOWN", "boot_id", "start_ticks", "verdict"]
