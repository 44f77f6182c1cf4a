"""Where a run's network goes: a free subnet of 198.18.0.0/15, sized for its devices.

The Docker backend's bridge and the Swarm backend's overlay both take the first subnet of
:data:`POOL` that overlaps none of the networks the daemon knows (on a swarm manager these
include the swarm's overlays), so runs side by side never share addresses.
"""

from __future__ import annotations

import ipaddress

from emulator.backends.base import BackendUnavailable

POOL = ipaddress.ip_network("198.18.0.0/15")
SPARE = 8  # addresses kept free in every subnet: network, gateway, broadcast and some slack


def subnet_size(hosts: int) -> int:
    """Smallest prefix with room for ``hosts`` addresses, the gateway and some spare."""
    for prefix in range(24, 14, -1):
        if 2 ** (32 - prefix) - SPARE >= hosts:
            return prefix
    raise BackendUnavailable(f"{hosts} devices do not fit in {POOL}")


def free_subnet(docker_client, hosts: int) -> ipaddress.IPv4Network:
    """The first subnet of :data:`POOL` for ``hosts`` addresses that no network of the daemon overlaps."""
    prefix = subnet_size(hosts)
    used = []
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
