"""Fidelity over time: a link trace replayed on the Docker backend measures as configured, window by window.

The example cellular trace (scenarios/traces/cellular.yaml's, 2 s windows of 1.7 to 12 Mbit/s)
is planned at speedup 2/3, so each rate holds 3 s of run time; the fault injector applies the
plan's ``link`` events through the Docker backend's own setter while one container sends to
another as fast as its shaped uplink lets it. The rate each window gets is read from the host
side of the sender's veth (the counters behind ``net.jsonl`` and the report's figure) from 0.5 s
after the change to the window's end (2.5 s), and must be within 5 % of the configured rate.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = [pytest.mark.docker, pytest.mark.slow]
WINDOWS = 10
WINDOW_S = 3.0
SETTLE_S = 0.5
WITHIN = 0.05
PORT = 9000
# The sink prints its monotonic clock (the host's: containers share the kernel's) and the payload
# bytes received so far, every 50 ms.
SINK = ("import socket, sys, time\ns = socket.socket(); s.bind(('0.0.0.0', %d)); s.listen(1)\nc, _ = s.accept()\n"
        "buf, got, last = bytearray(1 << 16), 0, 0.0\nwhile True:\n    n = c.recv_into(buf)\n    if not n: break\n    got += n\n"
        "    now = time.monotonic()\n    if now - last >= 0.05:\n        print(now, got, flush=True); last = now\n") % PORT
SENDER = ("import socket, sys, time\nfor _ in range(100):\n    try:\n        c = socket.create_connection((sys.argv[1], %d)); break\n"
          "    except OSError: time.sleep(0.1)\nblock = bytes(1 << 16)\nwhile True: c.sendall(block)\n") % PORT


def _plan(tmp_path: Path):
    from emulator.planning.plan import make_plan
    from emulator.planning.loader import load_scenario

    scenario = tmp_path / "trace.yaml"
    scenario.write_text(f"""\
name: trace-fidelity
training: {{duration: {WINDOWS * WINDOW_S + 1}s}}
workers:
  - count: 1
    traces: {{link: {ROOT / 'scenarios' / 'traces' / 'cell-link.csv'}, speedup: {2 / WINDOW_S}, loop: false}}
""")
    return make_plan(load_scenario(scenario)[0])


def test_a_replayed_link_trace_measures_as_configured_in_every_window(docker_client, runtime_image, tmp_path):
    import docker.types

    from emulator.backends.base import RunContext
    from emulator.backends.docker import LABEL, RUN_LABEL, DockerBackend, remove_labelled
    from emulator.backends.subnets import free_subnet
    from emulator.control.faults import Devices, FaultInjector
    from emulator.control.fidelity import TCP_GOODPUT

    plan = _plan(tmp_path)
    worker = plan.workers[0]
    changes = [e for e in plan.events if e.source == "trace" and e.action == "link" and e.time_s < WINDOWS * WINDOW_S]
    assert [e.time_s for e in changes] == [WINDOW_S * i for i in range(1, WINDOWS)]
    run_id = f"trace-fidelity-{int(time.time())}"
    labels = {LABEL: "1", RUN_LABEL: run_id}
    backend = DockerBackend(image=runtime_image)
    backend.ctx = RunContext(run_id, str(tmp_path), str(tmp_path), time.time())
    try:
        subnet = free_subnet(docker_client, 2)
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet), gateway=str(subnet.network_address + 1))])
        network = docker_client.networks.create(f"emu-{run_id}", driver="bridge", internal=True, ipam=ipam, labels=labels)
        common = {"image": runtime_image, "network": network.name, "labels": labels, "detach": True, "user": "10001:10001",
                  "read_only": True, "cap_drop": ["ALL"]}
        sink = docker_client.containers.run(command=["python", "-c", SINK], name=f"emu-{run_id}-sink", **common)
        sender = docker_client.containers.run(command=["python", "-c", SENDER, sink.name], name=f"emu-{run_id}-{worker.name}", **common)
        backend.containers[worker.name] = sender
        backend.set_link(worker, worker.link)  # time zero's rate, as the controller shapes a device when it is ready
        injector = FaultInjector(plan, backend, Devices.of(plan), config=lambda device: {}, send=lambda name, message: None,
                                 record=lambda *args, **kwargs: None)
        samples: list[tuple[float, int]] = []  # (seconds since the trace's time 0, bytes the sender's interface sent)
        time.sleep(3.0)  # the connection up and the queue full at the first rate
        start = time.monotonic()
        while (now := time.monotonic() - start) < WINDOWS * WINDOW_S:
            injector.advance(now, lambda name: 0)
            for row in backend.sample():
                if row["device"] == worker.name and "tx_bytes" in row:
                    samples.append((time.monotonic() - start, row["tx_bytes"]))  # the host veth's rx: what the device sent
            time.sleep(0.02)
    finally:
        remove_labelled(run_id, docker_client, rounds=3)

    configured = [worker.link.uplink_bps] + [e.params["uplink_bps"] for e in changes]
    rows = []
    for w, rate in enumerate(configured):
        lo, hi = w * WINDOW_S + SETTLE_S, (w + 1) * WINDOW_S
        inside = [(t, b) for t, b in samples if lo <= t <= hi]
        (t0, b0), (t1, b1) = inside[0], inside[-1]
        measured = (b1 - b0) * 8 / (t1 - t0)
        rows.append((w, rate, measured, measured / (rate * TCP_GOODPUT) - 1, t1 - t0))
    print("\nwindow  configured (bit/s)  measured (bit/s)  error against configured x 1448/1514  seconds")
    for w, rate, measured, error, seconds in rows:
        print(f"{w:6d}  {rate:19,.0f}  {measured:16,.0f}  {error:+.2%}  {seconds:.2f}")
    assert all(rate >= 1e6 for _, rate, _, _, _ in rows)
    assert all(seconds >= 2.0 for *_, seconds in rows)
    off = [row for row in rows if abs(row[3]) > WITHIN]
    assert not off, off
