"""Shaping a device's link in the kernel, from the host: tc through pyroute2, drops through iptables.

A device's link has two directions. The uplink is shaped on the egress of the device's own
interface (``eth0`` inside its network namespace); the downlink on the egress of the host
side of its veth pair. Rate uses an htb class; delay, jitter and loss use netem where the
kernel has it. Where it does not, loss falls back to iptables' ``statistic`` match inside the
device's namespace (real drops, real TCP retransmissions) and delay to the device's own
transport shaper. :func:`detect` finds out once what the kernel offers; :func:`plan_mechanisms`
says, per property, which mechanism will realise it, so every run records it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import socket
import subprocess
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the swarm agent imports this module without the controller's dependencies
    from emulator.planning.plan import LinkPlan

HTB_ROOT = 0x10000
HTB_CLASS = 0x10010
NETEM_LEAF = 0x100000
LEGACY_PROBE_IFACES = ("emuprobe0", "emuprobe1")  # one pair for every controller: what older emulators made
PROBE_PREFIX = "emup"  # the probe's veth pair is emup<pid>a/emup<pid>b, one per controller, its owner in its alias
PROBE_ALIAS = "edge-emulator probe "
PROBE_CHAIN_PREFIX = "EMUP-"  # the statistic probe's chain is EMUP-<pid>-<start>, one per controller
IPTABLES_CHAINS = {"loss": "EMU-LOSS", "partition": "EMU-CUT"}


class LinkError(RuntimeError):
    pass


CLONE_NEWNET = 0x40000000
NETLINK_ROUTE = 0


def in_netns(netns_path: str, make):
    """``make()`` run inside the network namespace at ``netns_path``; returns what it returns.

    A short-lived thread enters the namespace (setns is per thread), calls ``make`` and ends;
    sockets it creates stay bound to that namespace, usable from any thread. pyroute2's own
    netns support forks the whole controller instead, which is unsafe in a multi-threaded
    program with signal handlers. Raises LinkError when the namespace cannot be entered, and
    what ``make`` raised.
    """
    result: dict = {}

    def enter_and_make():
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.open(netns_path, os.O_RDONLY)
        except OSError as exc:
            result["error"] = LinkError(f"cannot open {netns_path}: {exc.strerror}")
            return
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                result["error"] = LinkError(f"setns({netns_path}): {os.strerror(ctypes.get_errno())}")
                return
            result["value"] = make()
        except Exception as exc:  # noqa: BLE001 - handed to the caller's thread
            result["error"] = exc
        finally:
            os.close(fd)

    thread = threading.Thread(target=enter_and_make, name="netns-enter")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _netns_netlink_socket(netns_path: str) -> int:
    """A rtnetlink socket created inside another network namespace; returns its fd."""
    return in_netns(netns_path, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE).detach())


@contextmanager
def rtnl(netns_path: str | None = None):
    """pyroute2's IPRoute on the host, or inside the namespace at ``netns_path``."""
    from pyroute2 import IPRoute

    ipr = IPRoute() if netns_path is None else IPRoute(fileno=_netns_netlink_socket(netns_path))
    try:
        yield ipr
    finally:
        ipr.close()


@dataclass(frozen=True)
class KernelFeatures:
    htb: bool
    tbf: bool
    netem: bool
    iptables_statistic: bool
    detail: str = ""

    def to_json(self) -> dict:
        return {"htb": self.htb, "tbf": self.tbf, "netem": self.netem, "iptables_statistic": self.iptables_statistic, "detail": self.detail}


def _try_qdisc(ipr, index: int, kind: str, **kwargs) -> bool:
    try:
        ipr.tc("add", kind, index, HTB_ROOT, **kwargs)
    except Exception:  # noqa: BLE001 - any refusal means "not available"
        return False
    try:
        ipr.tc("del", kind, index, HTB_ROOT)
    except Exception:  # noqa: BLE001
        pass
    return True


def probe_names(owner) -> tuple[str, str, str]:
    """The probe's veth pair and iptables chain for the controller ``owner``: controllers probing
    at the same moment never touch each other's, and cleaning knows whose they are."""
    return f"{PROBE_PREFIX}{owner.pid}a", f"{PROBE_PREFIX}{owner.pid}b", f"{PROBE_CHAIN_PREFIX}{owner.token}"


@functools.lru_cache(maxsize=1)
def detect() -> KernelFeatures:
    """Try each qdisc on a throwaway veth pair, and iptables' statistic match on a throwaway chain."""
    from emulator.host.owner import Owner

    owner = Owner.current()
    first, second, chain = probe_names(owner)
    notes = []
    htb = tbf = netem = False
    with rtnl() as ipr:
        for index in ipr.link_lookup(ifname=first):  # left by a killed process that had our pid
            ipr.link("del", index=index)
        try:
            ipr.link("add", ifname=first, kind="veth", peer=second)
            index = ipr.link_lookup(ifname=first)[0]
            ipr.link("set", index=index, ifalias=PROBE_ALIAS + owner.token)
            htb = _try_qdisc(ipr, index, "htb", default=0x10)
            tbf = _try_qdisc(ipr, index, "tbf", rate="1000000bit", burst=20000, latency=100000)
            netem = _try_qdisc(ipr, index, "netem", delay=1000)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"cannot create a probe veth pair: {exc}")
        finally:
            for index in ipr.link_lookup(ifname=first):
                ipr.link("del", index=index)
    statistic = _iptables_statistic_works(chain)
    if not statistic:
        notes.append("iptables statistic match unavailable")
    return KernelFeatures(htb, tbf, netem, statistic, "; ".join(notes))


def _iptables_statistic_works(chain: str) -> bool:
    subprocess.run(["iptables", "-w", "-F", chain], capture_output=True, timeout=10)  # left by a killed namesake
    subprocess.run(["iptables", "-w", "-X", chain], capture_output=True, timeout=10)
    try:
        subprocess.run(["iptables", "-w", "-N", chain], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    try:
        done = subprocess.run(
            ["iptables", "-w", "-A", chain, "-m", "statistic", "--mode", "random", "--probability", "0.5", "-j", "RETURN"],
            capture_output=True, timeout=10,
        )
        return done.returncode == 0
    finally:
        subprocess.run(["iptables", "-w", "-F", chain], capture_output=True, timeout=10)
        subprocess.run(["iptables", "-w", "-X", chain], capture_output=True, timeout=10)


def plan_mechanisms(features: KernelFeatures, link: LinkPlan) -> dict[str, str]:
    """Property -> mechanism, for a device whose namespace the host can shape."""
    def rate(value):
        if not value:
            return "unshaped"
        return "tc-htb" if features.htb else ("tc-tbf" if features.tbf else "transport-token-bucket")

    def timing(value):
        if not value:
            return "unshaped"
        return "tc-netem" if features.netem else "transport-delay"

    if not link.loss:
        loss = "unshaped"
    elif features.netem:
        loss = "tc-netem"
    elif features.iptables_statistic:
        loss = "iptables-statistic"
    else:
        loss = "none (no netem, no iptables statistic match)"
    return {"uplink": rate(link.uplink_bps), "downlink": rate(link.downlink_bps), "delay": timing(link.delay_s),
            "jitter": timing(link.jitter_s), "loss": loss}


def burst_bytes(rate_bps: float) -> int:
    """The shapers' bucket: large enough for one GSO burst (64 KiB) and 10 ms at the rate. A link
    that was idle sends this much at once (the virtual backend's links model it too)."""
    return int(max(64 * 1024, rate_bps / 8 / 100))


def shape_egress(ipr, index: int, *, rate_bps: float | None, delay_s: float, jitter_s: float, loss: float, features: KernelFeatures) -> None:
    """Replace the root qdisc of one interface with what the link needs (nothing: plain default).

    A change that keeps the qdiscs' shape (a new rate, delay or loss on a link that had them
    already: a trace's or a fault's ``link`` event) changes them in place: replacing the root
    qdisc would drop the packets queued in it, and the sender's TCP would stall on the losses
    (a replayed trace lost up to a third of a 2.5 s window's rate so)."""
    use_netem = features.netem and (delay_s or jitter_s or loss)
    netem_args = {"delay": int(delay_s * 1e6), "jitter": int(jitter_s * 1e6), "loss": loss * 100, "limit": 100_000}
    if rate_bps and features.htb and _ours(ipr, index) == {"htb": True, "netem": bool(use_netem)}:
        burst = burst_bytes(rate_bps)
        ipr.tc("change-class", "htb", index, HTB_CLASS, parent=HTB_ROOT, rate=f"{int(rate_bps)}bit",
               ceil=f"{int(rate_bps)}bit", burst=burst, cburst=burst)
        if use_netem:
            ipr.tc("change", "netem", index, NETEM_LEAF, parent=HTB_CLASS, **netem_args)
        return
    try:
        ipr.tc("del", index=index, handle=0, parent=0xFFFFFFFF)
    except Exception:  # noqa: BLE001 - there was no root qdisc of ours
        pass
    if rate_bps and features.htb:
        ipr.tc("add", "htb", index, HTB_ROOT, default=0x10)
        burst = burst_bytes(rate_bps)
        ipr.tc("add-class", "htb", index, HTB_CLASS, parent=HTB_ROOT, rate=f"{int(rate_bps)}bit",
               ceil=f"{int(rate_bps)}bit", burst=burst, cburst=burst)
        if use_netem:
            ipr.tc("add", "netem", index, NETEM_LEAF, parent=HTB_CLASS, **netem_args)
    elif rate_bps and features.tbf:
        ipr.tc("add", "tbf", index, HTB_ROOT, rate=f"{int(rate_bps)}bit", burst=burst_bytes(rate_bps), latency=1_000_000)
    elif use_netem:
        ipr.tc("add", "netem", index, HTB_ROOT, **netem_args)


def _ours(ipr, index: int) -> dict | None:
    """Which of our qdiscs the interface has now ({"htb": root is our htb, "netem": our leaf under it})."""
    try:
        found = {(q.get_attr("TCA_KIND"), q["handle"]) for q in ipr.get_qdiscs(index=index)}
    except Exception:  # noqa: BLE001 - cannot tell: replace it all
        return None
    return {"htb": ("htb", HTB_ROOT) in found, "netem": ("netem", NETEM_LEAF) in found}


def peer_index(netns_path: str, ifname: str = "eth0") -> tuple[int, int]:
    """(index of ``ifname`` inside the namespace, index of its veth peer on the host)."""
    with rtnl(netns_path) as ns:
        found = ns.link_lookup(ifname=ifname)
        if not found:
            raise LinkError(f"no {ifname} in {netns_path}")
        link = ns.get_links(found[0])[0]
        return found[0], int(link.get_attr("IFLA_LINK"))


def shape_device(netns_path: str, link: LinkPlan, features: KernelFeatures, ifname: str = "eth0", peer_netns: str | None = None) -> None:
    """Shape both directions of a device's link: uplink inside its namespace, downlink on the
    veth peer, which is on the host (a bridge network) or in ``peer_netns`` (an overlay
    network's namespace, where Docker puts the peer of a Swarm task's interface)."""
    inner, outer = peer_index(netns_path, ifname)
    with rtnl(netns_path) as ns:
        shape_egress(ns, inner, rate_bps=link.uplink_bps, delay_s=link.delay_s, jitter_s=link.jitter_s, loss=link.loss, features=features)
    with rtnl(peer_netns) as peer:
        shape_egress(peer, outer, rate_bps=link.downlink_bps, delay_s=link.delay_s, jitter_s=link.jitter_s, loss=link.loss, features=features)
    if not features.netem and features.iptables_statistic:
        set_loss(netns_path, link.loss, ifname)


def drop_default_route(netns_path: str) -> int:
    """Remove every IPv4 default route in a device's namespace; returns how many there were.

    Docker before 25 gives a container on an ``--internal`` network a default route through the
    gateway (the host), so packets for any address reach the host, which delivers those for its
    own addresses. The run's subnet stays on-link: the server, the other devices and the
    collector on the gateway are reached as before, and nothing else is."""
    with rtnl(netns_path) as ns:
        routes = ns.get_default_routes(family=socket.AF_INET)
        for route in routes:
            ns.route("del", dst="0.0.0.0/0", gateway=route.get_attr("RTA_GATEWAY"), table=route.get_attr("RTA_TABLE"))
        return len(routes)


def _iptables(netns_path: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["nsenter", f"--net={netns_path}", "iptables", "-w", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise LinkError(f"iptables {' '.join(args)} in {netns_path}: {done.stderr.strip()}")
    return done


def _reset_chain(netns_path: str, chain: str) -> None:
    """Make ``chain`` exist, empty, and hooked into INPUT and OUTPUT exactly once."""
    if _iptables(netns_path, "-N", chain, check=False).returncode != 0:
        _iptables(netns_path, "-F", chain)
    for hook in ("INPUT", "OUTPUT"):
        if _iptables(netns_path, "-C", hook, "-j", chain, check=False).returncode != 0:
            _iptables(netns_path, "-I", hook, "1", "-j", chain)


def set_loss(netns_path: str, loss: float, ifname: str = "eth0") -> None:
    """Drop each packet in each direction with probability ``loss`` (iptables statistic match)."""
    chain = IPTABLES_CHAINS["loss"]
    _reset_chain(netns_path, chain)
    if loss > 0:
        p = f"{loss:.6f}"
        _iptables(netns_path, "-A", chain, "-o", ifname, "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP")
        _iptables(netns_path, "-A", chain, "-i", ifname, "-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP")


def set_partition(netns_path: str, cut: bool, ifname: str = "eth0") -> None:
    """Cut every packet in and out of the device's interface (a network partition), or restore it."""
    chain = IPTABLES_CHAINS["partition"]
    _reset_chain(netns_path, chain)
    if cut:
        _iptables(netns_path, "-A", chain, "-o", ifname, "-j", "DROP")
        _iptables(netns_path, "-A", chain, "-i", ifname, "-j", "DROP")


def interface_counters(index: int) -> tuple[int, int] | None:
    """(rx_bytes, tx_bytes) of a host interface by index, from sysfs."""
    import socket

    try:
        name = socket.if_indextoname(index)
        base = f"/sys/class/net/{name}/statistics"
        with open(f"{base}/rx_bytes") as rx, open(f"{base}/tx_bytes") as tx:
            return int(rx.read()), int(tx.read())
    except OSError:
        return None
