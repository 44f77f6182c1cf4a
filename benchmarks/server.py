"""Parameter-server ingest on loopback: updates per second and server CPU per update, 8 and 64 pushers.

A real parameter server process (with its telemetry going to a real collector, as in a run)
is driven by synthetic pushers, each a process of its own that pushes pre-encoded updates and
waits for the model in reply, as a worker does: dense pushes (ASGD's, plain rule) and AdaComp's
(top 1 % per tensor, AdaComp's rule), each with dense pulls (the whole model answers every push)
and with delta pulls (what changed since the pusher's version). The AdaComp updates are a pool
taken along a real training trajectory of the paper's CNN (top 1 % of each step's gradient on
real digits), so consecutive updates overlap as a run's do and the deltas have a run's size;
each pusher cycles through the pool from its own position. Beside each row, in the same run: the
exchange floor (the same request and reply sizes, the same number of client processes, answered
by a server that does no work: what the traffic pattern alone allows on this machine); beside
each group of rows, the raw loopback TCP throughput of one Python sender and receiver; and the
AdaComp rule's apply cost at staleness 1, 100 and 10,000 (flat in d).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
import statistics
import time

import numpy as np

from benchmarks.common import cnn_layout, measure, realistic_gradient
from benchmarks.pushers import ServerProcess, pusher


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


def ingest(messages: list[bytes], rule: str, pushers: int, seconds: float, pull: dict | None = None,
           compiled: bool = True) -> dict:
    with ServerProcess(cnn_layout(), rule, compiled=compiled) as server:
        results, cpu = _drive(server.pid, _pusher_with_pull, [(server.address, server.token, i, messages, seconds, None, pull)
                                                   for i in range(pushers)],
                              seconds, before_start=server.start_training)
        loops = _server_loops(server)
    total = sum(r["answered"] for r in results)
    pushed, replies = sum(r["push_bytes"] for r in results), sum(r["reply_bytes"] for r in results)
    errors = [e for r in results for e in r["errors"]]
    return {"pushers": pushers, "pull": (pull or {}).get("mode", "dense"), "loops": loops, "updates": total, "updates_per_s": total / seconds,
            "ingest_bytes_per_s": pushed / seconds, "request_bytes": pushed / max(1, total), "reply_bytes": replies / max(1, total),
            "server_cpu_share": cpu / seconds, "server_cpu_ms_per_update": 1000 * cpu / max(1, total),
            **({"errors": errors[:5]} if errors else {})}


def _server_loops(server: ServerProcess) -> str:
    """What the server's hot path ran: its ``listening`` event's ``kernels`` ("numba x.y" or why numpy)."""
    for line in (server.rundir.path / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("kind") == "listening":
            return event.get("kernels", "?")
    return "?"


def _pusher_with_pull(address, token, worker, messages, seconds, ready, pull, start_evt, result_q):
    pusher(address, token, worker, messages, seconds, start_evt, result_q, ready, pull)


def _cpu_s(pid: int) -> float:
    from emulator.host.procstats import cpu_seconds

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


POOL = 256  # AdaComp updates along the trajectory
CASES = (  # (label, rule, pull, compiled): every push kind with every pull kind; AdaComp + delta also on numpy alone
    ("dense", "plain", None, True), ("dense", "plain", {"mode": "delta"}, True),
    ("adacomp", "adacomp", None, True), ("adacomp", "adacomp", {"mode": "delta"}, True),
    ("adacomp", "adacomp", {"mode": "delta"}, False),
)


def _trajectory(count: int, c: float, seed: int) -> list[bytes]:
    """``count`` AdaComp pushes along ``count`` steps of plain SGD (alpha 0.1, batch 10) of the
    paper's CNN on real digits: each step's gradient, top ``c`` per tensor, encoded."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import compression
    from emulator import datasets
    from emulator.runtime.data import standardize
    from emulator.runtime.models import TFModel, get, initial_parameters

    data = datasets.load("mnist-5k")
    x, y = standardize(data.x_train), data.y_train.astype(np.int32)
    model = TFModel(get("mnist_cnn"), x.shape[1:], 10, 1)
    layout = model.layout
    topk = compression.build("topk", {"c": c}, layout)
    params = initial_parameters(layout, seed)
    rng = np.random.default_rng(seed)
    splits = np.array(layout.offsets[1:])
    out = []
    for _ in range(count):
        batch = rng.choice(len(x), 10, replace=False)
        _, grad = model.gradient(params, x[batch], y[batch])
        out.append(compression.encode(topk.compress(np.split(grad, splits)), layout))
        params = params - np.float32(0.1) * grad
    return out


def update_pool(count: int = POOL, c: float = 0.01, seed: int = 0) -> tuple[list[bytes], str]:
    """AdaComp pushes from a real training trajectory (TensorFlow in a child process, so that the
    pushers forked later do not inherit its threads), and where they came from."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        messages = pool.submit(_trajectory, count, c, seed).result(timeout=600)
    return messages, f"{count} steps of SGD on mnist-5k, top {c:.0%} of each gradient"


def run(quick: bool = False) -> dict:
    import compression

    layout = cnn_layout()
    grad = realistic_gradient(layout)
    splits = np.split(grad, np.array(layout.offsets[1:]))
    dense = compression.encode(compression.build("dense", {}, layout).compress(splits), layout)
    pool, pool_source = update_pool()
    seconds = 3.0 if quick else 8.0
    out = {"raw_loopback_samples": [], "ingest": [], "update_pool": pool_source, "parameters": layout.total}
    for pushers in ((8,) if quick else (8, 64)):
        # Loopback throughput moves by 2x between minutes on this shared machine: it is measured
        # beside every group of rows and the shares use the median of all the samples.
        out["raw_loopback_samples"].append(raw_loopback_bytes_per_s(2.0 if quick else 3.0))
        for label, rule, pull, compiled in CASES:
            row = ingest(pool if label == "adacomp" else [dense], rule, pushers, seconds, pull, compiled)
            row["method"] = label
            floor = exchange_floor(round(row["request_bytes"]), round(row["reply_bytes"]), pushers, seconds)
            row["exchange_floor"] = floor
            row["share_of_exchange_floor"] = row["updates_per_s"] / floor["exchanges_per_s"] if floor["exchanges_per_s"] else None
            out["ingest"].append(row)
    out["raw_loopback_bytes_per_s"] = statistics.median(out["raw_loopback_samples"])
    for row in out["ingest"]:
        row["share_of_loopback"] = row["ingest_bytes_per_s"] / out["raw_loopback_bytes_per_s"]
    parts = compression.decode(pool[0], layout)
    out["adacomp_apply_ms_by_staleness"] = adacomp_apply_vs_staleness(parts, layout, (1, 100) if quick else (1, 100, 10_000))
    return out


def markdown(result: dict) -> list[str]:
    raw = result["raw_loopback_bytes_per_s"]
    samples = ", ".join(f"{x / 1e6:,.0f}" for x in result["raw_loopback_samples"])
    model = 4 * result["parameters"]
    lines = [f"Raw loopback TCP, one Python sender and receiver: **{raw / 1e6:,.0f} MB/s** (median of {samples} MB/s, "
             "one sample beside each group of rows). AdaComp pushes: " + result["update_pool"] + ". Exchange floor: "
             "the row's mean request and reply sizes between processes that do no other work.", "",
             "| push | pull | server loops | pushers | updates/s | server CPU per update (ms) | reply (kB) | two-way per update (kB) | "
             "floor exchanges/s | share of the floor | floor CPU per exchange (ms) | server CPU (cores) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["ingest"]:
        floor = row["exchange_floor"]
        share = "-" if row["share_of_exchange_floor"] is None else f"{row['share_of_exchange_floor']:.1%}"
        lines.append(f"| {row['method']} | {row['pull']} | {row.get('loops', '?')} | {row['pushers']} | {row['updates_per_s']:,.0f} | "
                     f"{row['server_cpu_ms_per_update']:.2f} | {row['reply_bytes'] / 1e3:,.1f} | "
                     f"{(row['request_bytes'] + row['reply_bytes']) / 1e3:,.1f} | {floor['exchanges_per_s']:,.0f} | {share} | "
                     f"{floor['server_cpu_ms_per_exchange']:.2f} | {row['server_cpu_share']:.2f} |")
    lines += ["", f"Whole model: {model / 1e3:,.0f} kB. AdaComp apply cost by staleness d (median ms): " + ", ".join(
        f"d={d}: {v['median_ms']:.3f}" for d, v in result["adacomp_apply_ms_by_staleness"].items())]
    errors = [f"{row['method']}/{row['pull']}/{row['pushers']}: {e}" for row in result["ingest"] for e in row.get("errors", [])]
    if errors:
        lines += ["", "Pusher errors: " + "; ".join(errors[:5])]
    return lines
