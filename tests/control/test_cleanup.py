"""Cleaning removes what is orphaned and only that: owners told apart by host, boot, pid and
start time; cgroups, probe links and chains, build contexts and run directories' working files,
each made here for a controller that is gone and for one that runs, and cleaned.

Every assertion looks only at what the test made: other runs may share this machine.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.control import cleanup
from emulator.host import cgroups, owner as owner_lib
from emulator.host.owner import ALIVE, ORPHAN, REMOTE, UNKNOWN, Owner, verdict


@pytest.fixture
def gone() -> Owner:
    """The owner identity of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    me = Owner.of_pid(proc.pid)
    proc.wait()
    assert me is None or verdict(me)[0] == ORPHAN
    return Owner.from_token(f"{proc.pid}-{(me.start if me else 1)}")


@pytest.fixture
def sleeper():
    """A live process that is not this one (a controller still running)."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_an_owner_is_alive_gone_elsewhere_or_unknown(gone, sleeper):
    me = Owner.current()
    assert verdict(me)[0] == ALIVE and "is running" in verdict(me)[1]
    assert Owner.from_labels(me.labels()) == me and Owner.from_token(me.token) == me
    assert verdict(Owner.of_pid(sleeper.pid))[0] == ALIVE
    assert verdict(gone) == (ORPHAN, f"its controller (pid {gone.pid} on {me.host}) is gone")
    reused = Owner(me.host, me.boot, sleeper.pid, Owner.of_pid(sleeper.pid).start - 1)  # same pid, another process
    assert verdict(reused) == (ORPHAN, f"its controller (pid {sleeper.pid} on {me.host}) is gone (the pid now names another process)")
    assert verdict(Owner(me.host, "another-boot", me.pid, me.start))[0] == ORPHAN
    assert verdict(Owner("elsewhere", me.boot, me.pid, me.start))[0] == REMOTE
    assert verdict(None)[0] == UNKNOWN
    assert Owner.from_labels({owner_lib.HOST_LABEL: "h", owner_lib.PID_LABEL: "1"}) is None  # partial labels name no one
    assert Owner.from_labels({**me.labels(), owner_lib.PID_LABEL: "x"}) is None


def test_start_time_reads_past_a_command_name_with_spaces_and_parentheses(tmp_path):
    odd = tmp_path / "a b) (c"
    odd.write_text("#!/bin/sh\nsleep 30\n")
    odd.chmod(0o755)
    proc = subprocess.Popen([str(odd)])
    try:
        ticks = owner_lib.start_ticks(proc.pid)
        assert ticks is not None and ticks >= owner_lib.start_ticks(os.getpid())
    finally:
        proc.kill()
        proc.wait()
    assert owner_lib.start_ticks(proc.pid) is None


def _policy(**kwargs):
    said = []
    return cleanup._Policy(kwargs.get("run_id"), kwargs.get("everything", False), said.append), said


def test_the_policy_removes_orphans_keeps_the_rest_and_says_why(gone, sleeper):
    live = Owner.of_pid(sleeper.pid)
    policy, said = _policy()
    assert policy.removes("container a", "run-a", gone)
    assert not policy.removes("container b", "run-b", live)
    assert not policy.removes("container c", "run-c", None)
    assert not policy.removes("network c", "run-c", None)
    assert not policy.removes("container d", "run-d", Owner("elsewhere", "b", 1, 1))
    lines = policy.kept_lines()
    assert f"run-b: 1 resource(s) kept, its controller (pid {sleeper.pid} on {live.host}) is running (container b)" in lines
    assert ("run-c: 2 resource(s) kept, owner unknown (no owner labels: made by an older emulator, or not by a run); "
            "--all removes it (container c, network c)") in lines
    assert any(line.startswith("run-d: 1 resource(s) kept, its controller runs on host elsewhere") and "--all removes it" in line
               for line in lines)
    assert not said
    everything, _ = _policy(everything=True)
    assert all(everything.removes("x", "r", o) for o in (gone, live, None))
    one, said = _policy(run_id="run-b")
    assert one.removes("container b", "run-b", live) and one.removes("network b", "run-b", live)
    assert said == [f"run run-b: its controller (pid {sleeper.pid} on {live.host}) is running; removing it anyway (--run)"]


@pytest.mark.skipif(not cgroups.available()[0], reason="needs writable cgroups (root)")
def test_cgroups_of_a_gone_controller_go_with_their_processes_a_live_ones_stay(gone, sleeper):
    run = f"cleantest-{secrets.token_hex(3)}"
    live = Owner.of_pid(sleeper.pid)
    orphan = cgroups.CpuGroup(run, "worker-0", gone)
    orphan.create()
    straggler = subprocess.Popen(["sleep", "300"])  # a device its killed controller left running
    orphan.add(straggler.pid)
    kept = cgroups.CpuGroup(run + "-live", "worker-0", live)
    kept.create()
    try:
        mine = {path.name: (run_id, owner) for path, run_id, owner in cgroups.run_groups() if path.name.startswith(run)}
        assert mine == {f"{run}@{gone.token}": (run, gone), f"{run}-live@{live.token}": (run + "-live", live)}
        policy, _ = _policy()
        removed = cleanup._remove_cgroups(policy)
        assert f"cgroup {orphan.path.parent}" in removed and not orphan.path.parent.exists()
        assert straggler.wait(10) == -9  # killed with its group
        assert kept.path.exists()
        assert any(line.startswith(f"{run}-live: 1 resource(s) kept, its controller (pid {sleeper.pid}") for line in policy.kept_lines())
    finally:
        straggler.kill()
        straggler.wait()
        cgroups.remove_group(kept.path.parent)
        cgroups.remove_group(orphan.path.parent)
    assert not kept.path.parent.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="making links and iptables chains needs root")
def test_probe_links_and_chains_of_a_gone_controller_go_a_live_ones_stay(gone, sleeper):
    from emulator.host import links

    live = Owner.of_pid(sleeper.pid)
    made = []
    try:
        for owner in (gone, live):
            first, second, chain = links.probe_names(owner)
            subprocess.run(["ip", "link", "add", first, "type", "veth", "peer", "name", second], check=True)
            subprocess.run(["ip", "link", "set", first, "alias", links.PROBE_ALIAS + owner.token], check=True)
            subprocess.run(["iptables", "-w", "-N", chain], check=True)
            made.append((first, chain))
        policy, _ = _policy()
        removed = cleanup.remove_probe_leftovers(lambda line: None, policy)
        (gone_link, gone_chain), (live_link, live_chain) = made
        assert f"link {gone_link}" in removed and f"iptables chain {gone_chain}" in removed
        assert f"link {live_link}" not in removed and f"iptables chain {live_chain}" not in removed
        listing = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        chains = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True).stdout
        assert gone_link not in listing and live_link in listing
        assert f"-N {gone_chain}" not in chains and f"-N {live_chain}" in chains
        assert any(f"link {live_link}" in line and f"iptables chain {live_chain}" in line for line in policy.kept_lines())
    finally:
        for link, chain in made:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
            subprocess.run(["iptables", "-w", "-X", chain], capture_output=True)


def test_build_contexts_of_a_gone_build_go(tmp_path, monkeypatch, gone, sleeper):
    monkeypatch.setenv("EDGE_EMULATOR_CACHE", str(tmp_path))
    dead = tmp_path / f"build-{gone.token}-x1"
    alive = tmp_path / f"build-{Owner.of_pid(sleeper.pid).token}-x2"
    legacy = tmp_path / "build-abc123"
    for path in (dead, alive, legacy):
        (path / "src").mkdir(parents=True)
    policy, _ = _policy()
    assert cleanup._remove_build_contexts(policy) == [f"files {dead}"]
    assert not dead.exists() and alive.exists() and legacy.exists()


def test_working_files_go_records_stay(tmp_path):
    run = tmp_path / "r1"
    (run / "devices" / "worker-0").mkdir(parents=True)
    (run / "devices" / "worker-0" / "config.json").write_text("{}")
    (run / "checkpoint").mkdir()
    (run / "logs").mkdir()
    for name in ("plan.json", "events.jsonl", "logs/server.log", ".summary.json.tmp"):
        (run / name).write_text("x")
    assert cleanup.remove_working_files(run, "another-run") == []  # a label naming a directory not the run's: untouched
    removed = cleanup.remove_working_files(run, "r1")
    assert sorted(removed) == sorted([f"files {run / 'devices'}", f"files {run / 'checkpoint'}", f"file {run / '.summary.json.tmp'}"])
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == ["events.jsonl", "logs", "logs/server.log", "plan.json"]
    assert cleanup.remove_working_files(Path(tmp_path / "missing"), "missing") == []
