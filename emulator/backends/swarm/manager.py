"""The swarm manager as every part of the Swarm backend sees it: the role label on all a run
creates, the task states that count as alive or as over, and whether a daemon manages a swarm."""

from __future__ import annotations

ROLE_LABEL = "edge-emulator.swarm"  # device | agent | anchor | janitor
ALIVE_STATES = {"new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting", "running"}
FAILED_STATES = {"failed", "rejected", "orphaned", "complete", "shutdown", "remove"}


def is_manager(docker_client) -> tuple[bool, str]:
    """(the daemon manages an active swarm, why not)."""
    swarm = docker_client.info().get("Swarm") or {}
    if swarm.get("LocalNodeState") != "active":
        return False, ("this Docker daemon is not in a swarm (`docker swarm init --default-addr-pool 198.19.0.0/16`, "
                       "or point DOCKER_HOST at a manager)")
    if not swarm.get("ControlAvailable"):
        return False, "this Docker daemon is a swarm worker, not a manager"
    return True, ""
