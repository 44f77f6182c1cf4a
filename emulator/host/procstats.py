"""Per-process CPU time and memory from /proc, for the local backend's stats stream."""

from __future__ import annotations

import os
import time

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (OSError, IndexError, ValueError):
        return None


PSS_EVERY_S = 10.0  # reading smaps_rollup of a TensorFlow process costs ~18 ms of kernel time
_pss_seen: dict[tuple[str, int], tuple[float, int]] = {}  # (proc root, pid) -> (when read, PSS)


def memory(pid: int, proc: str = "/proc", *, pss_every_s: float = PSS_EVERY_S) -> dict | None:
    """RSS and PSS in bytes (PSS shares pages fairly between the processes that map them).

    RSS is read every call (``statm``: microseconds). PSS is read again at most every
    ``PSS_EVERY_S`` per process: ``smaps_rollup`` walks every mapping, ~18 ms for a TensorFlow
    process, so reading it each second for 16 devices took a third of a core from the devices
    being emulated. ``proc`` is another /proc (the swarm agent reads its host's);
    ``pss_every_s=0`` reads PSS every time (a benchmark watching one process's growth)."""
    try:
        with open(f"{proc}/{pid}/statm") as fh:
            rss = int(fh.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None
    key, now = (proc, pid), time.monotonic()
    seen = _pss_seen.get(key)
    if seen is None or now - seen[0] >= pss_every_s:
        pss = _pss(f"{proc}/{pid}/smaps_rollup")
        if pss is None:
            return {"rss_bytes": rss}
        if len(_pss_seen) > 4096:  # processes come and go over a long sweep
            _pss_seen.clear()
        seen = _pss_seen[key] = (now, pss)
    return {"rss_bytes": rss, "pss_bytes": seen[1]}


def _pss(path: str) -> int | None:
    try:
        with open(path) as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key == "Pss":
                    return int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    return None
