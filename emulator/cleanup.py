"""Remove what runs created, by label, even after the controller was killed.

Every container, network and image carries the ``edge-emulator`` label (with the run id);
local devices live in cgroups under ``edge-emulator/<run-id>``. Cleaning finds them by those
marks alone, so it works from a fresh shell after a SIGKILL.
"""

from __future__ import annotations

from typing import Callable

from . import cgroups


def clean_all(run_id: str | None = None, say: Callable[[str], None] = print) -> list[str]:
    removed = [f"cgroup {p}" for p in cgroups.remove_tree(run_id)]
    try:
        from .backends.docker import remove_labelled
    except ImportError:
        return removed
    try:
        removed += remove_labelled(run_id)
    except Exception as exc:  # noqa: BLE001 - no daemon is not an error for clean
        say(f"docker: skipped ({exc})")
    return removed
