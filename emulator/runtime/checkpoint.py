"""Parameter-server checkpoints: the model, its version and the update rule's state, on disk.

Written atomically (write a temporary file, fsync, rename), so a crash at any instant leaves
either the previous checkpoint or the new one, never a torn file. The server copies what it
needs under its lock and writes outside it, from a background thread, so training does not
wait on the disk.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from pathlib import Path

import numpy as np

FILE = "server.npz"
MARK = "version.mark"


def save(directory: str | Path, version: int, params: np.ndarray, rule_state: dict[str, np.ndarray]) -> Path:
    directory = Path(directory)
    target = directory / FILE
    tmp = directory / f".{FILE}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, version=np.int64(version), params=params, **{f"rule_{k}": v for k, v in rule_state.items()})
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return target


def load(directory: str | Path) -> tuple[int, np.ndarray, dict[str, np.ndarray]] | None:
    """(version, params, rule state) from the last checkpoint, or None if there is none."""
    path = Path(directory) / FILE
    if not path.exists():
        return None
    with np.load(path) as data:
        rule_state = {k[len("rule_"):]: data[k].copy() for k in data.files if k.startswith("rule_")}
        return int(data["version"]), data["params"].copy(), rule_state


class Checkpointer:
    """Decides when to checkpoint (every N updates or T seconds) and writes in the background."""

    def __init__(self, directory: str | Path, every_updates: int | None, every_s: float | None, on_saved=None):
        self.directory = Path(directory)
        self.every_updates = every_updates
        self.every_s = every_s
        self.on_saved = on_saved or (lambda version, seconds: None)
        self._last_version = 0
        self._last_time = time.monotonic()
        self._busy = threading.Lock()

    def due(self, version: int) -> bool:
        if self._busy.locked():
            return False
        if self.every_updates and version - self._last_version >= self.every_updates:
            return True
        return bool(self.every_s) and time.monotonic() - self._last_time >= self.every_s and version > self._last_version

    def write_async(self, version: int, params: np.ndarray, rule_state: dict[str, np.ndarray]) -> None:
        """``params`` and ``rule_state`` must be copies the server no longer mutates."""
        self._last_version, self._last_time = version, time.monotonic()

        def work():
            with self._busy:
                started = time.perf_counter()
                save(self.directory, version, params, rule_state)
                self.on_saved(version, time.perf_counter() - started)

        threading.Thread(target=work, name="checkpoint", daemon=True).start()


class VersionMark:
    """The server's current version in a memory-mapped file: one store per update, no system
    call, and it survives a SIGKILL (the page belongs to the file, not to the process), so a
    restarted server knows exactly how many updates its crash lost."""

    def __init__(self, directory: str | Path):
        path = Path(directory) / MARK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < 8:
                os.ftruncate(fd, 8)
            self._map = mmap.mmap(fd, 8)
        finally:
            os.close(fd)

    def read(self) -> int:
        return struct.unpack_from("<q", self._map, 0)[0]

    def set(self, version: int) -> None:
        struct.pack_into("<q", self._map, 0, version)
