"""Per-process CPU time and memory from /proc, for the local backend's stats stream."""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


def memory(pid: int) -> dict | None:
    """RSS and PSS in bytes (PSS shares pages fairly between the processes that map them)."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss", "Pss_Anon", "Pss_File"):
                    out[key.lower() + "_bytes"] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    return out
