"""What the machine tells a Swarm run, from the environment: registry, encryption, placement,
the nodes' Docker APIs, CPU reservations and where the nodes keep the run's files.

No scenario field: where a run's devices go is the machine's business, not the experiment's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emulator.backends.base import BackendUnavailable

if TYPE_CHECKING:
    from emulator.planning.plan import DevicePlan

NODE_ROOT = "/var/lib/edge-emulator/swarm"  # on every node: <root>/<run>/<node id>/{data,checkpoint}


@dataclass(frozen=True)
class SwarmOptions:
    registry: str | None = None  # EMULATE_SWARM_REGISTRY: host:port the nodes pull from
    encrypted: bool = False  # EMULATE_SWARM_ENCRYPT=1: IPsec on the run's overlay
    placement: dict = field(default_factory=dict)  # EMULATE_SWARM_PLACEMENT: {device, group or role: [constraint | "spread=<label>"]}
    node_docker: dict = field(default_factory=dict)  # EMULATE_SWARM_NODE_DOCKER: {node hostname or id: Docker URL}
    reserve_cpus: bool = False  # EMULATE_SWARM_RESERVE_CPUS=1: schedule by the plan's CPUs (no overcommitted node)
    node_root: str = NODE_ROOT

    @classmethod
    def from_env(cls, env=None) -> "SwarmOptions":
        env = os.environ if env is None else env

        def flag(name):
            return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")

        def mapping(name):
            raw = env.get(name, "").strip()
            if not raw:
                return {}
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise BackendUnavailable(f"{name} is not JSON: {exc}") from None
            if not isinstance(value, dict):
                raise BackendUnavailable(f"{name} must be a JSON object")
            return value

        placement = {str(k): tuple([v] if isinstance(v, str) else v) for k, v in mapping("EMULATE_SWARM_PLACEMENT").items()}
        return cls(registry=env.get("EMULATE_SWARM_REGISTRY") or None, encrypted=flag("EMULATE_SWARM_ENCRYPT"),
                   placement=placement, node_docker=mapping("EMULATE_SWARM_NODE_DOCKER"),
                   reserve_cpus=flag("EMULATE_SWARM_RESERVE_CPUS"), node_root=env.get("EMULATE_SWARM_NODE_ROOT") or NODE_ROOT)


def placement_of(device: DevicePlan, options: SwarmOptions) -> tuple[list[str], list[tuple[str, str]]]:
    """(constraints, spread preferences) for a device: the plan's ``placement`` when the
    scenario has one, then the options' entries for its name, its group and its role."""
    entries = list(getattr(device, "placement", None) or ())
    for key in dict.fromkeys((device.name, device.group, device.role)):
        entries += options.placement.get(key, ())
    constraints = [e for e in entries if not e.startswith("spread=")]
    spread = [("spread", e.split("=", 1)[1]) for e in entries if e.startswith("spread=")]
    return constraints, spread
