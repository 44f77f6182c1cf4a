"""Remove what killed runs left, and only that: by label and owner, from a fresh shell.

Every container, network and Swarm service carries the ``edge-emulator`` label, the run id and
its controller's owner labels (host, boot id, pid, start time: :mod:`emulator.host.owner`);
local devices' cgroups, the kernel probe's veth pair and iptables chain, and image build
contexts carry the owner in their names. :func:`clean_all` removes what is orphaned (its
controller on this host is gone) and lists what it keeps and why: a live run's, one whose
controller runs on another host, and one without owner labels (made by an older emulator, and
maybe still running). ``everything`` removes all of it; ``run_id`` removes one run's, even
while it runs, after saying so. Qdiscs and the devices' iptables chains live in the
containers' namespaces and on the host side of their veths: they go with the containers. A
killed Docker run's working files (``devices/``, ``checkpoint/``, temporary files) are removed
from its run directory; its records stay.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from emulator import backends
from emulator.host import cgroups
from emulator.host.owner import ALIVE, ORPHAN, Owner, start_ticks, verdict

LEGACY_CHAIN_PREFIX = "EMU-"  # older emulators' host chains: EMU-PROBE, no owner in the name
WORKING = ("devices", "checkpoint")  # a run directory's working files, not its records


NOT_REMOVED = " NOT removed: "  # how a backend's removal line says it failed, and why


@dataclass
class Cleaned:
    """What :func:`clean_all` did: ``removed`` (a line each), ``kept`` (what it left, grouped by run
    and reason, a line each)."""

    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    @property
    def gone(self) -> list[str]:
        """The lines of what was removed."""
        return [line for line in self.removed if NOT_REMOVED not in line]

    @property
    def failed(self) -> list[str]:
        """The resources that outlived their removal, a line each (once, however many rounds tried)."""
        return list(dict.fromkeys(line for line in self.removed if NOT_REMOVED in line))


class _Policy:
    """Whether one resource goes: by its owner, unless ``--run`` or ``--all`` say otherwise; what
    stays is gathered per run and reason."""

    def __init__(self, run_id: str | None, everything: bool, say: Callable[[str], None]):
        self.run_id, self.everything, self.say = run_id, everything, say
        self.kept: dict[tuple[str, str], list[str]] = defaultdict(list)
        self._warned: set[str] = set()

    def removes(self, what: str, run: str, owner: Owner | None) -> bool:
        state, why = verdict(owner)
        if self.run_id is not None:  # the caller listed only that run's resources
            if state != ORPHAN and run not in self._warned:
                self._warned.add(run)
                self.say(f"run {run}: {why}; removing it anyway (--run)")
            return True
        if self.everything or state == ORPHAN:
            return True
        hint = "" if state == ALIVE else "; --all removes it"
        if what not in self.kept[(run, why + hint)]:
            self.kept[(run, why + hint)].append(what)
        return False

    def kept_lines(self) -> list[str]:
        return [f"{run or '(no run)'}: {len(things)} resource(s) kept, {why} ({', '.join(things[:4])}{', ...' if len(things) > 4 else ''})"
                for (run, why), things in sorted(self.kept.items())]


def clean_all(run_id: str | None = None, say: Callable[[str], None] = print, *, everything: bool = False) -> Cleaned:
    """Remove the orphaned resources of every run (``run_id``: that run's, orphaned or not;
    ``everything``: every labelled one). Returns what went and what stayed."""
    policy = _Policy(run_id, everything, say)
    done = Cleaned()
    done.removed += _remove_cgroups(policy)
    for name in sorted(backends.BACKENDS, key=_clean_rank):
        try:
            removed, run_dirs = backends.backend_class(name).remove_leftovers(run_id, policy.removes, say)
        except Exception as exc:  # noqa: BLE001 - no daemon, no swarm, no SDK: not an error for clean
            say(f"{name}: skipped ({exc})")
            continue
        done.removed += removed
        for path, run in sorted(run_dirs.items()):
            done.removed += remove_working_files(Path(path), run)
    if run_id is None:  # these belong to a controller, not to a run
        done.removed += remove_probe_leftovers(say, policy) + _remove_build_contexts(policy)
    done.kept = policy.kept_lines()
    return done


def _remove_cgroups(policy: _Policy) -> list[str]:
    removed = []
    for path, run, owner in cgroups.run_groups():
        if (policy.run_id is None or run == policy.run_id) and policy.removes(f"cgroup {path.name}", run, owner):
            removed += [f"cgroup {p}" for p in cgroups.remove_group(path)]
    return removed


def _clean_rank(name: str) -> int:
    try:
        return backends.backend_class(name).clean_rank
    except Exception:  # noqa: BLE001 - its SDK missing: asked last, and skipped with why
        return 99


def remove_working_files(run_dir: Path, run_id: str) -> list[str]:
    """A killed run's working files (device configs, the server's checkpoint, half-written
    temporary files), when ``run_dir`` is that run's directory; its records are left alone."""
    if run_dir.name != run_id or not (run_dir / "plan.json").is_file():
        return []
    removed = []
    for name in WORKING:
        if (run_dir / name).is_dir():
            shutil.rmtree(run_dir / name, ignore_errors=True)
            removed.append(f"files {run_dir / name}")
    for tmp in sorted(run_dir.glob(".*.tmp")):
        tmp.unlink(missing_ok=True)
        removed.append(f"file {tmp}")
    return removed


def remove_probe_leftovers(say: Callable[[str], None] = print, policy: _Policy | None = None) -> list[str]:
    """The kernel probe's veth pairs and iptables chains in the host's namespace, whose controller is gone."""
    policy = policy or _Policy(None, False, say)
    removed = []
    try:
        from emulator.host.links import LEGACY_PROBE_IFACES, PROBE_ALIAS, PROBE_PREFIX, rtnl

        probe = re.compile(rf"^{PROBE_PREFIX}(\d+)a$")
        with rtnl() as ipr:
            for link in ipr.get_links():
                name = link.get_attr("IFLA_IFNAME") or ""
                match = probe.fullmatch(name)
                if match:
                    alias = link.get_attr("IFLA_IFALIAS") or ""
                    owner = Owner.from_token(alias[len(PROBE_ALIAS):]) if alias.startswith(PROBE_ALIAS) else None
                    if owner is None and start_ticks(int(match[1])) is None:  # killed before it named itself
                        owner = Owner.from_token(f"{match[1]}-0")
                    elif owner is None:
                        owner = Owner.of_pid(int(match[1]))  # a live process of that pid: leave it be
                elif name in LEGACY_PROBE_IFACES[:1]:
                    owner = None
                else:
                    continue
                if policy.removes(f"link {name}", "", owner):
                    ipr.link("del", index=link["index"])
                    removed.append(f"link {name}")
    except Exception as exc:  # noqa: BLE001 - no pyroute2, no permission, peer already gone with its pair
        say(f"links: skipped ({exc})")
    return removed + _remove_host_chains(say, policy)


def _iptables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, timeout=30)


def _remove_host_chains(say: Callable[[str], None], policy: _Policy) -> list[str]:
    """Unhook, flush and delete the probe's chains (``EMUP-<pid>-<start>``) of gone controllers in
    the host's filter table; older emulators' ``EMU-*`` chains only with ``--all``."""
    from emulator.host.links import PROBE_CHAIN_PREFIX

    try:
        listing = _iptables("-S")
    except (OSError, subprocess.SubprocessError) as exc:
        say(f"iptables: skipped ({exc})")
        return []
    if listing.returncode != 0:
        return []
    lines = listing.stdout.splitlines()
    chains = []
    for line in lines:
        words = line.split()
        if words[:1] != ["-N"] or len(words) < 2:
            continue
        name = words[1]
        if name.startswith(PROBE_CHAIN_PREFIX):
            owner = Owner.from_token(name[len(PROBE_CHAIN_PREFIX):])
        elif name.startswith(LEGACY_CHAIN_PREFIX):
            owner = None
        else:
            continue
        if policy.removes(f"iptables chain {name}", "", owner):
            chains.append(name)
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


def _remove_build_contexts(policy: _Policy) -> list[str]:
    """Image build contexts (``build-<pid>-<start>-*`` in the cache) of builds whose process is gone."""
    from emulator.host.images import BUILD_PREFIX, cache_root

    named = re.compile(rf"^{BUILD_PREFIX}(\d+-\d+)-")
    removed = []
    root = cache_root()
    for path in sorted(root.glob(f"{BUILD_PREFIX}*")) if root.is_dir() else []:
        match = named.match(path.name)
        if path.is_dir() and policy.removes(f"build context {path.name}", "", Owner.from_token(match[1]) if match else None):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"files {path}")
    return removed
