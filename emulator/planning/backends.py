"""The backends by name: the one table that ``emulate``'s choices, the scenario's ``backend:``,
``emulate clean`` and ``emulate doctor`` all read.

Each entry is ``"module:Class"``, imported only when chosen (:func:`emulator.backends.backend_class`):
the docker SDK stays out of ``emulate --help`` and of the local backend. The table sits here, on
the planning floor, because the scenario's schema names the backends and may not import the
floor that implements them; it imports nothing. A new backend is its module and its line here.
"""

from __future__ import annotations

BACKENDS: dict[str, str] = {
    "local": "emulator.backends.local:LocalBackend",
    "docker": "emulator.backends.docker:DockerBackend",
    "swarm": "emulator.backends.swarm.backend:SwarmBackend",
    "virtual": "emulator.backends.virtual:VirtualBackend",
}
AUTO = "auto"  # docker when a daemon answers, else local
CHOICES: tuple[str, ...] = (AUTO, *BACKENDS)

__all__ = ["AUTO", "BACKENDS", "CHOICES"]
