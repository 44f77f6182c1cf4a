"""Isolation of the Docker devices, seen from the daemon and from inside a running container.

During a small Docker run: every device container runs as a non-root user, on a read-only
root filesystem (a write to ``/`` fails inside, also as uid 0: EROFS), with every capability
dropped (``CapEff`` of its PID 1 is 0, and of every process in it: with ``boot: zygote`` the
device is forked in from the zygote container, not PID 1), no new privileges, under Docker's
seccomp filter, memory and pids limits, on an
internal network (no default route in its routing table; nothing here connects outward).
A peer with another run's token is refused by the parameter server (``rejections.jsonl``,
reason ``bad_token``) and by the collector (``events.jsonl``, kind ``collector_refused``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, TEST_SCENARIOS, read_json, read_jsonl
from emulator.runtime import protocol
from emulator.runtime.protocol import MsgType

pytestmark = [pytest.mark.docker, pytest.mark.slow]
DEVICE_USER = "10001:10001"
EROFS = 30

# Run inside a device container: who it is, what it may write, its capabilities, its routes.
INSIDE = r"""
import errno, json, os
def status(pid):
    return dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
def write(path):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        os.remove(path)
        return 0
    except OSError as exc:
        return exc.errno
init, me = status(1), status("self")
others = {pid: status(pid) for pid in os.listdir("/proc") if pid.isdigit() and int(pid) not in (1, os.getpid(), os.getppid())}
routes = [line.split() for line in open("/proc/net/route").read().splitlines()[1:]]
root_mount = [line.split()[3].split(",") for line in open("/proc/mounts") if line.split()[1] == "/"]
print(json.dumps({
    "uid": os.getuid(), "init_uid": init["Uid"].split(), "write_root": write("/isolation-probe"),
    "write_tmp": write("/tmp/isolation-probe"), "root_mount": root_mount[-1] if root_mount else [],
    "init_caps": {k: int(init[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
    "my_caps": {k: int(me[k], 16) for k in ("CapPrm", "CapEff", "CapBnd")},
    "no_new_privs": int(init["NoNewPrivs"]), "routes": [(r[0], r[1], r[2]) for r in routes],
    "processes": {pid: {"uid": st["Uid"].split(), "gid": st["Gid"].split(), "groups": st["Groups"].split(),
                        "no_new_privs": int(st["NoNewPrivs"]), "seccomp": int(st["Seccomp"]),
                        "caps": {k: int(st[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}}
                  for pid, st in others.items()},
}))
"""


def _events(run: Path) -> list[dict]:
    return read_jsonl(run / "events.jsonl")


def _inside(container, user: str) -> dict:
    code, output = container.exec_run(["python", "-c", INSIDE], user=user)
    assert code == 0, output.decode(errors="replace")
    return json.loads(output.decode().strip().splitlines()[-1])


def _knock(address, token: bytes, hello: dict) -> tuple[str | None, bool]:
    """Say HELLO with ``token``; returns (the REJECT reason if any, whether the peer then closed)."""
    with socket.create_connection(tuple(address), timeout=10) as sock:
        protocol.send_frame(sock, MsgType.HELLO, token, protocol.json_body(hello))
        reason = None
        try:
            header, body = protocol.recv_frame(sock, None, 1 << 20)
            if header.type == MsgType.REJECT:
                reason = protocol.parse_json(body, "reject")["reason"]
            rest = sock.recv(1)
        except protocol.PeerClosed:
            rest = b""
        except ConnectionResetError:
            rest = b""
        return reason, rest == b""


def test_device_containers_are_isolated_and_strangers_refused(docker_client, runtime_image, tmp_path):
    scenario = tmp_path / "isolation.yaml"
    scenario.write_text((TEST_SCENARIOS / "isolation.yaml").read_text())
    run_id = f"isolation-{secrets.token_hex(2)}"
    run = tmp_path / "runs" / run_id
    log = open(tmp_path / "controller.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "emulator.cli", "run", str(scenario), "--backend", "docker", "--out",
                             str(tmp_path / "runs"), "--run-id", run_id, "--no-fidelity", "--quiet"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not any(e.get("kind") == "training_started" and e.get("source") == "controller" for e in _events(run)):
            assert proc.poll() is None, (tmp_path / "controller.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.5)
        labelled = docker_client.containers.list(filters={"label": f"edge-emulator.run={run_id}"})
        containers = {c.labels["edge-emulator.device"]: c for c in labelled if "edge-emulator.device" in c.labels}
        assert set(containers) == {"server", "evaluator", "worker-0", "worker-1"}
        boot = read_json(run / "mechanisms.json")["worker-0"]["boot"]
        others = [c.name for c in labelled if "edge-emulator.device" not in c.labels]
        zygotes = [n for n in others if n.startswith(f"emu-{run_id}-") and n.endswith("-zygote")]
        assert others == zygotes and len(zygotes) == (1 if boot.startswith("zygote") else 0), (boot, others)

        for name, container in containers.items():
            container.reload()
            host = container.attrs["HostConfig"]
            assert container.attrs["Config"]["User"] == DEVICE_USER, name
            assert host["ReadonlyRootfs"] is True and "ALL" in host["CapDrop"] and not host.get("CapAdd"), name
            assert "no-new-privileges" in host["SecurityOpt"] and host["Privileged"] is False, name
            assert host["Memory"] > 0 and host["MemorySwap"] == host["Memory"] and host["PidsLimit"] == 512, name
            (network,) = container.attrs["NetworkSettings"]["Networks"]
            assert docker_client.networks.get(network).attrs["Internal"] is True, name
        assert containers["worker-0"].attrs["HostConfig"]["Memory"] == 768 << 20

        for name in ("server", "worker-0"):
            seen = _inside(containers[name], DEVICE_USER)
            assert seen["uid"] == 10001 and set(seen["init_uid"]) == {"10001"}, (name, seen)
            assert seen["write_root"] != 0 and seen["write_tmp"] == 0, (name, seen)
            assert "ro" in seen["root_mount"], (name, seen)
            assert set(seen["init_caps"].values()) == {0} and set(seen["my_caps"].values()) == {0}, (name, seen)
            assert seen["no_new_privs"] == 1, (name, seen)
            # The device program itself (PID 1's child with exec, a process forked in with the zygote).
            assert seen["processes"], (name, "no device process seen beside PID 1")
            for pid, process in seen["processes"].items():
                assert set(process["uid"]) == set(process["gid"]) == {"10001"} and not process["groups"], (name, pid, process)
                assert set(process["caps"].values()) == {0} and process["no_new_privs"] == 1, (name, pid, process)
                assert process["seccomp"] == 2, (name, pid, process)  # Docker's default profile (the zygote's, inherited)
            assert seen["routes"], "no routing table at all"
            assert all(destination != "00000000" for _, destination, _ in seen["routes"]), (name, seen["routes"])
            as_root = _inside(containers[name], "0:0")  # uid 0 owns "/": only the read-only mount stops it
            assert as_root["write_root"] == EROFS and set(as_root["my_caps"].values()) == {0}, (name, as_root)

        config = read_json(run / "devices" / "worker-0" / "config.json")
        wrong = bytes(b ^ 0xFF for b in bytes.fromhex(config["token"]))
        reason, closed = _knock(config["ps"], wrong, {"role": "worker", "worker": 7, "incarnation": 0})
        assert reason == "bad_token" and closed
        reason, closed = _knock(config["collector"], wrong, {"source": "worker-7"})
        assert reason is None and closed  # the collector says nothing to strangers; it hangs up

        output_left = proc.wait(timeout=300)
        assert output_left == 0, (tmp_path / "controller.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
        log.close()
    summary = read_json(run / "summary.json")
    assert summary["status"] == "completed" and summary["rejected_frames"] >= 1
    refused = [r for r in read_jsonl(run / "rejections.jsonl") if r["reason"] == "bad_token"]
    assert len(refused) == 1 and refused[0]["source"] == "server"
    collector = [e for e in _events(run) if e.get("kind") == "collector_refused"]
    assert len(collector) == 1 and collector[0]["reason"] == "bad_token"
    assert not docker_client.containers.list(all=True, filters={"label": f"edge-emulator.run={run_id}"})


@pytest.mark.skipif(os.geteuid() != 0, reason="entering a network namespace needs root")
def test_sockets_made_in_another_network_namespace_live_there(tmp_path):
    """links.in_netns: what it makes belongs to that namespace; errors come back to the caller."""
    from emulator.host import links

    name = f"emutest{secrets.token_hex(2)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        path = f"/run/netns/{name}"
        listener = links.in_netns(path, lambda: socket.create_server(("127.0.0.1", 0)))
        port = listener.getsockname()[1]
        with pytest.raises(OSError):  # nothing listens on the host's loopback at that port
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        listener.close()
        # The namespace's own loopback is down until brought up: its rtnetlink socket sees it.
        with links.rtnl(path) as ipr:
            assert [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()] == ["lo"]
        with pytest.raises(links.LinkError, match="cannot open"):
            links.in_netns(str(tmp_path / "missing"), lambda: None)
        with pytest.raises(ZeroDivisionError):
            links.in_netns(path, lambda: 1 / 0)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
