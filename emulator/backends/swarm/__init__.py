"""The Swarm backend: the Docker backend's devices spread over the nodes of a Docker swarm.

One module per seam, each importing only those listed before it:

* :mod:`.agent`: the program every node runs (shapes links, sets quotas, injects faults there);
* :mod:`.options`: what the machine says about a run, from the environment;
* :mod:`.manager`: labels, task states, whether a daemon manages a swarm;
* :mod:`.images`: the agent image, pushing to a registry, copying onto nodes;
* :mod:`.relay`: sockets in the anchor's namespace, the relay of trace connections;
* :mod:`.hub`: the controller's end of the agents;
* :mod:`.cleanup`: removal by label across the swarm, the janitor job;
* :mod:`.backend`: :class:`SwarmBackend`, which puts them together.

The names below load on first use: the agent runs this package from its node, and must not
import the controller (the plan and the scenario bring numpy and pydantic along).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "SwarmBackend": "backend",
    "SwarmOptions": "options",
    "placement_of": "options",
    "distribute_images": "images",
    "ensure_agent_image": "images",
    "push_images": "images",
    "Relay": "relay",
    "listen_in_netns": "relay",
    "AgentError": "hub",
    "AgentHub": "hub",
    "remove_swarm_labelled": "cleanup",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = sorted(_EXPORTS)
