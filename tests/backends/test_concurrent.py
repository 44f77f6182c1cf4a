"""Runs side by side on one Docker daemon, and a clean that removes only what is orphaned.

* Labelled objects made by hand for three owners (a process that has exited, one that runs, and
  none: an older emulator's): ``emulate clean`` removes the first's containers, network and its
  run directory's working files, keeps the other two and says why; ``--run`` removes a live one
  after saying so.
* Two ``emulate run`` of the same run id (as two sweeps of one scenario make) into two
  directories, at once, and a third killed (SIGKILL) mid-run: ``emulate clean`` while the two
  run removes the third's objects only; both complete with their own records, and neither saw
  the other's devices or token.

Only what these tests made is looked at: other runs may share the daemon.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TEST_SCENARIOS, read_json, read_jsonl
from emulator.backends.docker import DEVICE_LABEL, INSTANCE_LABEL, LABEL, RUN_LABEL, RUNDIR_LABEL, remove_labelled
from emulator.host.owner import Owner

pytestmark = pytest.mark.docker

DEVICES = 4


def _emulate(*args: str, **kwargs):
    return [sys.executable, "-m", "emulator.cli", *args]


def _objects(docker_client, run_id: str) -> tuple[list, list]:
    label = f"{RUN_LABEL}={run_id}"
    return docker_client.api.containers(all=True, filters={"label": label}), docker_client.api.networks(filters={"label": label})


def _gone_owner() -> Owner:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    me = Owner.of_pid(proc.pid)
    proc.wait()
    return Owner.from_token(f"{proc.pid}-{me.start if me else 1}")


def test_clean_removes_a_gone_controllers_objects_keeps_the_others_and_says_why(docker_client, runtime_image, tmp_path):
    tag = secrets.token_hex(3)
    sleeper = subprocess.Popen(["sleep", "300"])
    live = Owner.of_pid(sleeper.pid)
    dead = _gone_owner()
    runs = {"dead": f"cleantest-{tag}-dead", "live": f"cleantest-{tag}-live", "unknown": f"cleantest-{tag}-unknown"}
    run_dir = tmp_path / runs["dead"]
    (run_dir / "devices" / "server").mkdir(parents=True)
    (run_dir / "checkpoint").mkdir()
    for name in ("plan.json", "events.jsonl", "summary.json"):
        (run_dir / name).write_text("{}\n")
    owners = {"dead": dead.labels(), "live": live.labels(), "unknown": {}}  # unknown: an older emulator's, no owner labels
    try:
        for key, run_id in runs.items():
            labels = {LABEL: "1", RUN_LABEL: run_id, **owners[key]}
            if key != "unknown":
                labels.update({INSTANCE_LABEL: tag, RUNDIR_LABEL: str(tmp_path / run_id)})
            network = docker_client.networks.create(f"emu-{run_id}", driver="bridge", internal=True, labels=labels)
            docker_client.containers.create(runtime_image, ["sleep", "300"], name=f"emu-{run_id}-server", labels=labels,
                                            network=network.name)
        started = time.monotonic()
        done = subprocess.run(_emulate("clean"), cwd=ROOT, capture_output=True, text=True, timeout=300)
        seconds = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert f"  container emu-{runs['dead']}-server" in out and f"  network emu-{runs['dead']}" in out
        assert f"  files {run_dir / 'devices'}" in out and f"  files {run_dir / 'checkpoint'}" in out
        assert _objects(docker_client, runs["dead"]) == ([], [])
        assert sorted(p.name for p in run_dir.iterdir()) == ["events.jsonl", "plan.json", "summary.json"]
        kept = {line.strip().split(":")[0]: line for line in out.split("kept", 1)[1].splitlines() if line.startswith("  ")}
        assert f"its controller (pid {sleeper.pid} on {live.host}) is running" in kept[runs["live"]]
        assert "owner unknown" in kept[runs["unknown"]] and "--all removes it" in kept[runs["unknown"]]
        for key in ("live", "unknown"):
            containers, networks = _objects(docker_client, runs[key])
            assert len(containers) == 1 and len(networks) == 1, key
        forced = subprocess.run(_emulate("clean", "--run", runs["live"]), cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert forced.returncode == 0, forced.stderr
        assert f"run {runs['live']}: its controller (pid {sleeper.pid} on {live.host}) is running; removing it anyway (--run)" in forced.stderr
        assert _objects(docker_client, runs["live"]) == ([], [])
        assert len(_objects(docker_client, runs["unknown"])[0]) == 1  # --run touches that run only
        print(f"\nclean: 2 objects and 2 working folders of a gone controller removed in {seconds:.1f} s; "
              f"a live run's and an unlabelled one's kept")
    finally:
        sleeper.kill()
        sleeper.wait()
        for run_id in runs.values():
            remove_labelled(run_id, docker_client, rounds=3)


def _wait_for_containers(docker_client, run_id: str, proc, log: Path, timeout_s: float = 300) -> float:
    started = time.monotonic()
    device_containers = {"label": [f"{RUN_LABEL}={run_id}", DEVICE_LABEL], "status": "running"}  # not the zygote
    while len(docker_client.api.containers(filters=device_containers)) < DEVICES:
        assert proc.poll() is None, f"{run_id} exited early: {log.read_text()[-3000:]}"
        assert time.monotonic() - started < timeout_s, f"{run_id}: containers never appeared"
        time.sleep(0.2)
    return time.monotonic() - started


def _peers(run: Path) -> dict[str, set]:
    """What the run's server and collector saw: the peers (address) by role, the worker ids."""
    events = read_jsonl(run / "events.jsonl")
    connected = [e for e in events if e.get("kind") == "connected"]
    return {"addresses": {e["peer"].rsplit(":", 1)[0] for e in connected},
            "workers": {e["worker"] for e in connected if e.get("role") == "worker"},
            "refused": {json.dumps(e) for e in events if e.get("kind") == "collector_refused"}}


@pytest.mark.slow
def test_two_runs_at_once_never_touch_each_other_and_a_killed_third_is_cleaned(docker_client, runtime_image, tmp_path):
    scenario = tmp_path / "side.yaml"
    scenario.write_text((TEST_SCENARIOS / "concurrent.yaml").read_text())
    tag = secrets.token_hex(3)
    same = f"side-{tag}"  # one id for both: as two sweeps of one scenario into two directories make
    killed = f"side-{tag}-killed"
    procs, logs = {}, {}
    started = time.monotonic()
    try:
        for key, out, run_id in (("a", "a", same), ("b", "b", same), ("c", "c", killed)):
            logs[key] = tmp_path / f"{key}.log"
            procs[key] = subprocess.Popen(
                _emulate("run", str(scenario), "--backend", "docker", "--out", str(tmp_path / out), "--run-id", run_id, "--quiet"),
                cwd=ROOT, stdout=open(logs[key], "w"), stderr=subprocess.STDOUT)
        up = _wait_for_containers(docker_client, killed, procs["c"], logs["c"])
        _wait_for_containers(docker_client, same, procs["a"], logs["a"])
        time.sleep(3)
        procs["c"].send_signal(signal.SIGKILL)
        procs["c"].wait(30)
        both_before = {c["Id"] for c in _objects(docker_client, same)[0]}
        per_run = len(both_before) // 2  # its devices, and the zygote they were forked from when it boots them
        assert per_run in (DEVICES, DEVICES + 1) and len(both_before) == 2 * per_run, both_before
        t0 = time.monotonic()
        clean = subprocess.run(_emulate("clean"), cwd=ROOT, capture_output=True, text=True, timeout=300)
        clean_s = time.monotonic() - t0
        assert clean.returncode == 0, clean.stderr
        assert procs["a"].poll() is None and procs["b"].poll() is None, "the two runs must still be running while clean runs"
        assert _objects(docker_client, killed) == ([], []), clean.stdout
        assert {c["Id"] for c in _objects(docker_client, same)[0]} == both_before  # not one of theirs touched
        assert f"{same}: {2 * per_run + 2} resource(s) kept, its controller" not in clean.stdout  # two owners: two lines
        assert sum(line.startswith(f"  {same}: {per_run + 1} resource(s) kept, its controller (pid ") for line in clean.stdout.splitlines()) == 2
        for key in ("a", "b"):
            assert procs[key].wait(900) == 0, logs[key].read_text()[-3000:]
        wall = time.monotonic() - started
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for run_id in (same, killed):
            remove_labelled(run_id, docker_client, rounds=3)
    runs = {key: tmp_path / key / same for key in ("a", "b")}
    seen = {}
    for key, run in runs.items():
        summary = read_json(run / "summary.json")
        assert summary["status"] == "completed" and summary["run_id"] == same and summary["updates_applied"] > 0
        refused = [r for r in read_jsonl(run / "rejections.jsonl") if r["reason"] != "late"]  # late: after training ended, not an error
        assert not refused, f"{key}: a peer was refused (another run's token?): {refused}"
        seen[key] = _peers(run)
        assert seen[key]["workers"] == {0, 1} and not seen[key]["refused"], (key, seen[key])
        workers = {u["worker"] for u in read_jsonl(run / "updates.jsonl")}
        assert workers == {0, 1}
        assert len(seen[key]["addresses"]) == DEVICES - 1  # two workers and the evaluator, each from its own address
    assert not seen["a"]["addresses"] & seen["b"]["addresses"], seen  # separate subnets, no peer in common
    killed_dir = tmp_path / "c" / killed
    assert not (killed_dir / "devices").exists() and not (killed_dir / "checkpoint").exists()
    assert not (killed_dir / "summary.json").exists() and (killed_dir / "plan.json").exists()
    assert _objects(docker_client, same) == ([], []) and _objects(docker_client, killed) == ([], [])
    updates = {key: read_json(run / "summary.json")["updates_applied"] for key, run in runs.items()}
    print(f"\nside by side: 3 runs started at once, the third's containers up after {up:.1f} s and killed 3 s later; "
          f"clean took {clean_s:.1f} s and removed its {per_run} containers and network only; both others completed "
          f"({updates['a']} and {updates['b']} updates) in {wall:.0f} s, each with peers {sorted(seen['a']['addresses'])} vs "
          f"{sorted(seen['b']['addresses'])}")
