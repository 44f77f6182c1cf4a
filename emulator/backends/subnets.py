"""Where a run's network goes: a free subnet of 198.18.0.0/15, sized for its devices.

The Docker backend's bridge and the Swarm backend's overlay both take the first subnet of
:data:`POOL` that overlaps none of the networks the daemon knows (on a swarm manager these
include the swarm's overlays), so runs side by side never share addresses. Two runs starting at
the same moment may pick the same subnet; the daemon refuses the second network, which then
takes the next free one (:func:`create_network`).
"""

from __future__ import annotations

import ipaddress
from typing import Callable, TypeVar

from emulator.backends.base import BackendUnavailable

POOL = ipaddress.ip_network("198.18.0.0/15")
SPARE = 8  # addresses kept free in every subnet: network, gateway, broadcast and some slack


def subnet_size(hosts: int) -> int:
    """Smallest prefix with room for ``hosts`` addresses, the gateway and some spare."""
    for prefix in range(24, 14, -1):
        if 2 ** (32 - prefix) - SPARE >= hosts:
            return prefix
    raise BackendUnavailable(f"{hosts} devices do not fit in {POOL}")


def free_subnet(docker_client, hosts: int, skip: tuple[ipaddress.IPv4Network, ...] = ()) -> ipaddress.IPv4Network:
    """The first subnet of :data:`POOL` for ``hosts`` addresses that no network of the daemon (nor
    any of ``skip``) overlaps."""
    prefix = subnet_size(hosts)
    used = list(skip)
    for net in docker_client.networks.list():
        for cfg in (net.attrs.get("IPAM") or {}).get("Config") or []:
            try:
                used.append(ipaddress.ip_network(cfg["Subnet"]))
            except (KeyError, ValueError):
                pass
    for candidate in POOL.subnets(new_prefix=prefix):
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise BackendUnavailable(f"no free /{prefix} left in {POOL}")


Network = TypeVar("Network")
RACES = 32  # subnets a network may lose to runs starting at the same moment before it gives up


def create_network(docker_client, hosts: int, make: Callable[[ipaddress.IPv4Network], Network]) -> tuple[Network, ipaddress.IPv4Network]:
    """``make(subnet)`` on a free subnet; when the daemon refuses it as overlapping (another run
    took it meanwhile), again on the next free one. Returns (what ``make`` returned, the subnet)."""
    import docker.errors

    lost: list[ipaddress.IPv4Network] = []
    while True:
        subnet = free_subnet(docker_client, hosts, tuple(lost))
        try:
            return make(subnet), subnet
        except docker.errors.APIError as exc:
            if "overlap" not in str(exc).lower() or len(lost) >= RACES:
                raise
            lost.append(subnet)
