"""Parameter-server ingest on loopback: updates applied per second with 1, 8 and 64 pushers.

A real parameter server process (with its telemetry going to a real collector, as in a run)
is driven by synthetic pushers, each a process of its own that pushes a pre-encoded update
and waits for the model in reply, as a worker does. Beside it, in the same run: the raw
loopback TCP throughput of one Python sender and receiver (bytes one way, nothing else), the
exchange floor (the same request and reply sizes with the same number of client processes,
answered by a server that does no work: what the traffic pattern alone allows on this
machine), and the AdaComp rule's apply cost at staleness 1, 100 and 10,000 (flat in d).
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import statistics
import time

import numpy as np

from emulator.runtime.protocol import HEADER

from .common import cnn_layout, measure, realistic_gradient
from .pushers import ServerProcess, pusher


def _loopback_receiver(port_q, seconds, result_q):
    server = socket.create_server(("127.0.0.1", 0))
    port_q.put(server.getsockname()[1])
    conn, _ = server.accept()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    total, start = 0, None
    while True:
        n = conn.recv_into(view)
        if n == 0:
            break
        if start is None:
            start = time.perf_counter()
        total += n
    result_q.put(total / (time.perf_counter() - start))


def raw_loopback_bytes_per_s(seconds: float = 2.0) -> float:
    port_q, result_q = mp.Queue(), mp.Queue()
    receiver = mp.Process(target=_loopback_receiver, args=(port_q, seconds, result_q))
    receiver.start()
    sock = socket.create_connection(("127.0.0.1", port_q.get()))
    chunk = bytes(1 << 20)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        sock.sendall(chunk)
    sock.close()
    rate = result_q.get()
    receiver.join()
    return rate


def _echo_connection(conn, request_bytes: int, reply: bytes) -> None:
    from emulator.runtime.protocol import PeerClosed, recv_exact

    buf = bytearray(request_bytes)
    try:
        while True:
            recv_exact(conn, request_bytes, buf)
            conn.sendall(reply)
    except (PeerClosed, OSError):
        conn.close()


def _echo_server(port_q, request_bytes: int, reply_bytes: int) -> None:
    """Answers each request of ``request_bytes`` with ``reply_bytes``: a server that does no work."""
    import threading

    server = socket.create_server(("127.0.0.1", 0), backlog=1024)
    port_q.put(server.getsockname()[1])
    reply = bytes(reply_bytes)
    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_echo_connection, args=(conn, request_bytes, reply), daemon=True).start()


def _echo_client(port: int, request: bytes, reply_bytes: int, seconds: float, start_evt, result_q) -> None:
    from emulator.runtime.protocol import recv_exact

    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(reply_bytes)
    start_evt.wait()
    done, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        sock.sendall(request)
        recv_exact(sock, reply_bytes, buf)
        done += 1
    sock.close()
    result_q.put(done)


def exchange_floor(request_bytes: int, reply_bytes: int, clients: int, seconds: float) -> dict:
    """The same exchanges as a push and its model reply, between processes that do nothing else.

    What loopback TCP and Python's sockets allow for this traffic pattern on this machine, the
    clients sharing the CPUs with the server as the pushers do: the floor for ingest."""
    ctx = mp.get_context("fork")
    port_q = ctx.Queue()
    server = ctx.Process(target=_echo_server, args=(port_q, request_bytes, reply_bytes), daemon=True)
    server.start()
    try:
        port = port_q.get(timeout=30)
        request = bytes(request_bytes)
        done, cpu = _drive(server.pid, _echo_client, [(port, request, reply_bytes, seconds)] * clients, seconds)
    finally:
        server.terminate()
        server.join()
    total = sum(done)
    return {"clients": clients, "exchanges_per_s": total / seconds, "ingest_bytes_per_s": total * request_bytes / seconds,
            "server_cpu_ms_per_exchange": 1000 * cpu / max(1, total)}


def _drive(server_pid: int, target, client_args: list[tuple], seconds: float, before_start=None) -> tuple[list, float]:
    """One process per ``client_args`` running ``target(*args, start_evt, result_q)``, released
    together; returns what each put on the queue and the server's CPU seconds meanwhile."""
    ctx = mp.get_context("fork")
    start_evt, result_q = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, start_evt, result_q)) for args in client_args]
    for p in procs:
        p.start()
    if before_start is not None:
        before_start()
    cpu0 = _cpu_s(server_pid)
    start_evt.set()
    results = [result_q.get(timeout=seconds + 120) for _ in procs]
    cpu = _cpu_s(server_pid) - cpu0
    for p in procs:
        p.join()
    return results, cpu


def ingest(message: bytes, rule: str, pushers: int, seconds: float) -> dict:
    with ServerProcess(cnn_layout(), rule) as server:
        results, cpu = _drive(server.pid, pusher, [(server.address, server.token, i, message, seconds) for i in range(pushers)],
                              seconds, before_start=server.start_training)
    total = sum(r["answered"] for r in results)
    frame = len(message) + HEADER.size
    return {"pushers": pushers, "updates": total, "updates_per_s": total / seconds,
            "ingest_bytes_per_s": total * frame / seconds, "server_cpu_share": cpu / seconds,
            "server_cpu_ms_per_update": 1000 * cpu / max(1, total)}


def _cpu_s(pid: int) -> float:
    from emulator.procstats import cpu_seconds

    return cpu_seconds(pid) or 0.0


def adacomp_apply_vs_staleness(parts, layout, staleness_values=(1, 100, 10_000)) -> dict:
    from emulator.runtime.rules import AdaComp

    out = {}
    for d in staleness_values:
        rule = AdaComp(layout, 0.01)
        params = np.zeros(layout.total, np.float32)
        rule.on_pull(0)
        for _ in range(d):  # d updates from another worker after worker 0 pulled
            rule.on_pull(1)
            rule.apply(params, parts, 1, 0)
        out[str(d)] = measure(lambda: rule.apply(params, parts, 0, d), repeat=50)
    return out


def run(quick: bool = False) -> dict:
    import compression

    layout = cnn_layout()
    grad = realistic_gradient(layout)
    splits = np.split(grad, np.array(layout.offsets[1:]))
    sparse = compression.encode(compression.build("topk", {"c": 0.01}, layout).compress(splits), layout)
    dense = compression.encode(compression.build("dense", {}, layout).compress(splits), layout)
    seconds = 3.0 if quick else 8.0
    out = {"raw_loopback_samples": [], "ingest": [], "exchange_floor": {}}
    model_frame = layout.total * 4 + HEADER.size
    for pushers in ((1, 8) if quick else (1, 8, 64)):
        # Loopback throughput moves by 2x between minutes on this shared machine: it is measured
        # beside every group of rows and the shares use the median of all the samples.
        out["raw_loopback_samples"].append(raw_loopback_bytes_per_s(2.0 if quick else 3.0))
        floor = exchange_floor(len(dense) + HEADER.size, model_frame, pushers, seconds)
        out["exchange_floor"][str(pushers)] = floor
        for label, message, rule in (("dense", dense, "plain"), ("adacomp", sparse, "adacomp")):
            row = ingest(message, rule, pushers, seconds)
            row["method"] = label
            if label == "dense":
                row["share_of_exchange_floor"] = row["ingest_bytes_per_s"] / floor["ingest_bytes_per_s"]
            out["ingest"].append(row)
    out["raw_loopback_bytes_per_s"] = statistics.median(out["raw_loopback_samples"])
    for row in out["ingest"]:
        row["share_of_loopback"] = row["ingest_bytes_per_s"] / out["raw_loopback_bytes_per_s"]
    parts = compression.decode(sparse, layout)
    out["adacomp_apply_ms_by_staleness"] = adacomp_apply_vs_staleness(parts, layout, (1, 100) if quick else (1, 100, 10_000))
    return out


def markdown(result: dict) -> list[str]:
    raw = result["raw_loopback_bytes_per_s"]
    floors = result["exchange_floor"]
    samples = ", ".join(f"{x / 1e6:,.0f}" for x in result["raw_loopback_samples"])
    lines = [f"Raw loopback TCP, one Python sender and receiver: **{raw / 1e6:,.0f} MB/s** (median of {samples} MB/s, "
             "one sample beside each group of rows). Exchange floor: the same push-sized requests and model-sized "
             "replies between processes that do no other work.", "",
             "| method | pushers | updates/s | ingest MB/s | share of raw loopback | exchange floor MB/s | share of the floor | server CPU (cores) | server CPU per update (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["ingest"]:
        floor = floors.get(str(row["pushers"])) if row["method"] == "dense" else None
        floor_cells = (f"{floor['ingest_bytes_per_s'] / 1e6:,.1f} | {row['share_of_exchange_floor']:.1%}" if floor else "- | -")
        floor_cpu = f" (floor {floor['server_cpu_ms_per_exchange']:.2f})" if floor else ""
        lines.append(f"| {row['method']} | {row['pushers']} | {row['updates_per_s']:,.0f} | {row['ingest_bytes_per_s'] / 1e6:,.1f} | "
                     f"{row['share_of_loopback']:.1%} | {floor_cells} | {row['server_cpu_share']:.2f} | "
                     f"{row['server_cpu_ms_per_update']:.2f}{floor_cpu} |")
    lines += ["", "AdaComp apply cost by staleness d (median ms): " + ", ".join(
        f"d={d}: {v['median_ms']:.3f}" for d, v in result["adacomp_apply_ms_by_staleness"].items())]
    return lines
