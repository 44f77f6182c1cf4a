"""Remove what runs created, by label, even after the controller was killed.

Every container, network and image carries the ``edge-emulator`` label (with the run id);
local devices live in cgroups under ``edge-emulator/<run-id>``. Cleaning finds them by those
marks alone, so it works from a fresh shell after a SIGKILL. Qdiscs on the host side of a
container's veth go with the veth when the container is removed. What belongs to no run is
removed too: the throwaway veth pair (``emuprobe*``) and iptables chain (``EMU-*`` on the
host) that :func:`emulator.host.links.detect` makes for a moment, should a controller have been
killed in that moment.
"""

from __future__ import annotations

import shlex
import subprocess
from typing import Callable

from emulator.host import cgroups

HOST_CHAIN_PREFIX = "EMU-"
DOCKER_ROUNDS = 5  # passes of label-based removal, a second apart, until nothing labelled is left


def clean_all(run_id: str | None = None, say: Callable[[str], None] = print) -> list[str]:
    removed = [f"cgroup {p}" for p in cgroups.remove_tree(run_id)]
    try:  # swarm first: its services' containers and networks are labelled too, and Swarm owns them
        from emulator.backends.swarm import remove_swarm_labelled

        removed += remove_swarm_labelled(run_id, say=say)
    except Exception as exc:  # noqa: BLE001 - no daemon, no swarm
        say(f"swarm: skipped ({exc})")
    try:
        removed += _remove_docker(run_id, say)
    except Exception as exc:  # noqa: BLE001 - no daemon is not an error for clean
        say(f"docker: skipped ({exc})")
    return removed + remove_probe_leftovers(say)


def _remove_docker(run_id: str | None, say: Callable[[str], None]) -> list[str]:
    """Remove labelled containers and networks, looking again until none is left."""
    from emulator.backends.docker import client, remove_labelled

    return remove_labelled(run_id, client(timeout=30), rounds=DOCKER_ROUNDS, say=say)


def remove_probe_leftovers(say: Callable[[str], None] = print) -> list[str]:
    """The kernel probe's veth pair and the emulator's iptables chains in the host's namespace."""
    removed = []
    try:
        from emulator.host.links import PROBE_IFACES, rtnl

        with rtnl() as ipr:
            for name in PROBE_IFACES:
                for index in ipr.link_lookup(ifname=name):
                    ipr.link("del", index=index)
                    removed.append(f"link {name}")
    except Exception as exc:  # noqa: BLE001 - no pyroute2, no permission, peer already gone with its pair
        say(f"links: skipped ({exc})")
    return removed + _remove_host_chains(say)


def _iptables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, timeout=30)


def _remove_host_chains(say: Callable[[str], None]) -> list[str]:
    """Unhook, flush and delete every ``EMU-*`` chain of the host's filter table."""
    try:
        listing = _iptables("-S")
    except (OSError, subprocess.SubprocessError) as exc:
        say(f"iptables: skipped ({exc})")
        return []
    if listing.returncode != 0:
        return []
    lines = listing.stdout.splitlines()
    chains = [line.split()[1] for line in lines if line.startswith(f"-N {HOST_CHAIN_PREFIX}")]
    if not chains:
        return []
    for line in lines:  # rules of other chains that jump to ours
        words = shlex.split(line)
        if words[:1] == ["-A"] and "-j" in words and words[words.index("-j") + 1] in chains and words[1] not in chains:
            _iptables("-D", *words[1:])
    removed = []
    for chain in chains:
        _iptables("-F", chain)
    for chain in chains:
        if _iptables("-X", chain).returncode == 0:
            removed.append(f"iptables chain {chain}")
    return removed
