"""Parameter-server ingest with the model split over 1, 2 and 4 server processes, on loopback.

Each server is a real ``python -m emulator.runtime.paramserver`` holding one balanced key range
of the paper's CNN (``split: ranges``); each synthetic pusher is a process that, as a worker
does, sends every server its part of each update (cut by the same partition, pre-encoded) and
waits for every server's reply before the next push. Rows: dense pushes (ASGD: plain rule,
dense pulls) and AdaComp's (top 1 % per tensor of heavy-tailed synthetic gradients, AdaComp's
rule, delta pulls), at 8 and 64 pushers, all in one run so that the ratios to one shard compare
like with like. Beside updates/s: the servers' CPU per update (all shards together), updates
per server core-second, the busiest shard's CPU share and the pushers' CPU; the row says which
resource bounded it: ``machine CPU`` when servers and pushers together used the machine's
cores, ``a server's core`` when the busiest shard used one core, else ``exchange latency``.
Run: ``python -m benchmarks.shards [--quick] [--json FILE]``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np

from benchmarks.common import cnn_layout, realistic_gradient, standalone
from benchmarks.pushers import ServerProcess

POOL = 32  # AdaComp updates the pushers cycle through
SHARDS = (1, 2, 4)


def sharded_pusher(addresses, token, worker, messages, seconds, pull, start_evt, result_q) -> None:
    """One synthetic worker over ``len(addresses)`` servers; ``messages[k][i]``: update k's part for server i."""
    from emulator.runtime import protocol
    from emulator.runtime.protocol import MsgType
    from emulator.runtime.transport import Channel, connect

    out = {"answered": 0, "errors": [], "push_bytes": 0, "reply_bytes": 0, "cpu_s": 0.0}
    channels = []
    try:
        for address in addresses:
            channel = Channel(connect(address), token, None, 16 << 20, worker=worker)
            channel.send(MsgType.HELLO, protocol.json_body({"role": "worker", "worker": worker, **({"pull": pull} if pull else {})}))
            channel.recv()
            channels.append(channel)
        start_evt.wait()
        cpu0 = time.process_time()
        for channel in channels:
            channel.send(MsgType.PULL)
        headers = [channel.recv(keep_buffer=True)[0] for channel in channels]
        deadline, position = time.perf_counter() + seconds, worker
        while time.perf_counter() < deadline and not any(h.flags & protocol.Flag.DONE for h in headers):
            parts = messages[position % len(messages)]
            position += 1
            sent = sum(channel.send(MsgType.PUSH, part, t0=h.t0) for channel, part, h in zip(channels, parts, headers))
            replies = [channel.recv(keep_buffer=True)[0] for channel in channels]
            if any(h.type != MsgType.MODEL for h in replies):
                out["errors"].append(f"unexpected {[h.type.name for h in replies]}")
                break
            headers = replies
            out["answered"] += 1
            out["push_bytes"] += sent
            out["reply_bytes"] += sum(protocol.HEADER.size + h.length for h in replies)
        out["cpu_s"] = time.process_time() - cpu0
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out["errors"].append(f"{type(exc).__name__}: {exc}")
    finally:
        for channel in channels:
            channel.close()
        result_q.put(out)


def _cpu_s(pid: int) -> float:
    from emulator.host.procstats import cpu_seconds

    return cpu_seconds(pid) or 0.0


def ingest(updates: list[list], rule: str, pushers: int, shards: int, seconds: float, pull: dict | None) -> dict:
    """``updates``: each a list of parts for the whole model; cut for ``shards`` servers, pushed for ``seconds``."""
    import contextlib

    import compression
    from emulator.runtime import partition

    layout = cnn_layout()
    split = partition.build(layout, shards)
    messages = [[compression.encode(mine, piece) for mine, piece in zip(split.split(parts), split.layouts)] for parts in updates]
    token = os.urandom(16)
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(ServerProcess(layout, rule, token=token, partition=None if shards == 1 else split.to_json(),
                                                     shard=i)) for i in range(shards)]
        ctx = mp.get_context("fork")
        start_evt, result_q = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=sharded_pusher, args=([s.address for s in servers], token, i, messages, seconds, pull,
                                                          start_evt, result_q)) for i in range(pushers)]
        for p in procs:
            p.start()
        for server in servers:
            server.start_training()
        cpu0 = [_cpu_s(s.pid) for s in servers]
        wall0 = time.perf_counter()
        start_evt.set()
        results = [result_q.get(timeout=seconds + 120) for _ in procs]
        wall = time.perf_counter() - wall0
        cpu = [_cpu_s(s.pid) - c for s, c in zip(servers, cpu0)]
        for p in procs:
            p.join()
    total = sum(r["answered"] for r in results)
    server_cpu, pusher_cpu = sum(cpu), sum(r["cpu_s"] for r in results)
    cores = os.cpu_count() or 1
    busiest = max(cpu) / wall
    used = (server_cpu + pusher_cpu) / wall
    bound = "machine CPU" if used >= 0.85 * cores else "a server's core" if busiest >= 0.85 else "exchange latency"
    errors = [e for r in results for e in r["errors"]]
    return {"shards": shards, "pushers": pushers, "updates_per_s": total / seconds,
            "server_cpu_ms_per_update": 1000 * server_cpu / max(1, total),
            "updates_per_server_core_s": total / server_cpu if server_cpu else None,
            "busiest_shard_cpu_share": busiest, "servers_cpu_share": server_cpu / wall, "pushers_cpu_share": pusher_cpu / wall,
            "ingest_bytes_per_s": sum(r["push_bytes"] for r in results) / seconds,
            "bound": bound, **({"errors": errors[:5]} if errors else {})}


def run(quick: bool = False) -> dict:
    import compression

    layout = cnn_layout()
    splits = np.array(layout.offsets[1:])
    dense = [compression.build("dense", {}, layout).compress(np.split(realistic_gradient(layout, 0), splits))]
    topk = compression.build("topk", {"c": 0.01}, layout)
    adacomp = [topk.compress(np.split(realistic_gradient(layout, seed), splits)) for seed in range(POOL)]
    seconds = 3.0 if quick else 6.0
    rows = []
    for pushers in ((8,) if quick else (8, 64)):
        for method, parts, rule, pull in (("dense", dense, "plain", None), ("adacomp", adacomp, "adacomp", {"mode": "delta"})):
            for shards in SHARDS:
                row = ingest(parts, rule, pushers, shards, seconds, pull)
                row["method"] = method
                rows.append(row)
    for row in rows:  # ratios to one shard, in this run
        one = next(r for r in rows if r["method"] == row["method"] and r["pushers"] == row["pushers"] and r["shards"] == 1)
        row["vs_one_shard"] = row["updates_per_s"] / one["updates_per_s"] if one["updates_per_s"] else None
    return {"cores": os.cpu_count(), "seconds": seconds, "rows": rows}


def markdown(result: dict) -> list[str]:
    lines = [f"{result['cores']} cores; {result['seconds']:g} s per row; servers hold balanced key ranges of the paper's CNN.", "",
             "| push | pull | pushers | shards | updates/s | x one shard | server CPU per update (ms, all shards) | "
             "updates per server core-s | busiest shard (cores) | servers (cores) | pushers (cores) | bound by |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        pull = "delta" if r["method"] == "adacomp" else "dense"
        per_core = "-" if r["updates_per_server_core_s"] is None else f"{r['updates_per_server_core_s']:,.0f}"
        lines.append(f"| {r['method']} | {pull} | {r['pushers']} | {r['shards']} | {r['updates_per_s']:,.0f} | "
                     f"{r['vs_one_shard']:.2f} | {r['server_cpu_ms_per_update']:.3f} | {per_core} | "
                     f"{r['busiest_shard_cpu_share']:.2f} | {r['servers_cpu_share']:.2f} | {r['pushers_cpu_share']:.2f} | {r['bound']} |")
    errors = [e for r in result["rows"] for e in r.get("errors", [])]
    if errors:
        lines += ["", "Pusher errors: " + "; ".join(errors[:5])]
    return lines


if __name__ == "__main__":
    standalone(run, markdown, __doc__)
