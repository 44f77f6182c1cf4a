"""Where the parameter server's CPU per AdaComp update (delta pulls) goes: stages, glue, sockets.

Three measurements of the same pushes (AdaComp top 1 % along a real SGD trajectory, the server
benchmark's pool) in one run, so that their differences mean something on a noisy machine:

- **server process**: a real server on loopback, ``pushers`` synthetic workers pushing and
  pulling deltas (:func:`benchmarks.server.ingest`); its CPU (user and system) per update;
- **exchange floor**: a Python server that only answers the same request and reply sizes,
  from as many client processes (:func:`benchmarks.server.exchange_floor`): what the socket
  path alone costs per exchange;
- **in process**: the same calls a connection thread makes for a push and its delta reply
  (``push``, ``pull``, ``trace_update``), from ``pushers`` workers in turn, no sockets; each
  stage's CPU timed by wrapping the call the server makes for it, the rest of the update being
  the Python between them.

Run: ``python -m benchmarks.breakdown [--quick] [--json FILE]``; the committed result is
``docs/performance/server-breakdown.{json,md}``.
"""

from __future__ import annotations

import time

from benchmarks.common import cnn_layout, standalone

STAGES = (  # (name, what it is: the object and attribute the server calls for it)
    ("decode", "compression.decode_flat (numpy: decode): the push's message to flat indices and values"),
    ("apply", "the aggregator's receive_flat (numpy: receive): AdaComp's rule over the pushed coordinates"),
    ("change log", "ChangeLog.record: the versions and index set of the coordinates written"),
    ("delta coordinates", "ChangeLog.since: the union of the updates since the worker's pull"),
    ("delta values", "downlink.prepare less the union: the values read under the lock"),
    ("delta encode", "downlink.finish: the reply's codec message"),
    ("counters", "AdaComp.on_pull: the worker's copy of the touch counters"),
    ("trace", "trace_update: the update's trace row"),
)


class _Timer:
    """CPU seconds spent inside wrapped callables, by stage (nested stages are subtracted)."""

    def __init__(self):
        self.seconds = {name: 0.0 for name, _ in STAGES}
        self._stack: list[float] = []

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.process_time()
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                inner = self._stack.pop()
                spent = time.process_time() - start
                self.seconds[name] += spent - inner
                if self._stack:
                    self._stack[-1] += spent
        return timed


def in_process(messages: list[bytes], workers: int, updates: int) -> dict:
    """CPU per update of the server's own calls, and per stage, for ``workers`` delta-pulling workers in turn."""
    import compression
    from emulator.runtime import downlink, paramserver
    from emulator.runtime.config import LinkConfig, ServerConfig
    from emulator.runtime.telemetry import Telemetry

    class Kept(Telemetry):  # records kept as the real one keeps them (its thread encodes and sends them later)
        def record(self, stream, **fields):
            fields.setdefault("ts", round(self.now(), 4))
            fields["source"] = self.source
            with self._lock:
                self._pending.append((stream, fields))
                if len(self._pending) > 10_000:
                    self._pending.clear()

    layout = cnn_layout()
    cfg = ServerConfig(name="server", token="00" * 16, start_time=0.0, collector=None, seed=0, bind=("127.0.0.1", 0),
                       layout=layout.to_json(), rule="adacomp", learning_rate=0.01, max_updates=None,
                       transport=LinkConfig(), checkpoint=None)
    server = paramserver.ParameterServer(cfg, Kept(None, bytes(16), "server", time.time()))
    server.control({"cmd": "start"})
    holdings = [downlink.parse_hello({"mode": "delta"}) for _ in range(workers)]
    versions = [server.pull(w, holdings[w])[0].version for w in range(workers)]

    def update(i: int) -> None:  # what serve_connection does for a PUSH answered with the model
        w = i % workers
        body = memoryview(messages[i % len(messages)])
        _, row = server.push(w, versions[w], body, len(body) + 32)
        reply, _ = server.pull(w, holdings[w])
        server.trace_update(row, len(reply.body) + 32, reply)
        versions[w] = reply.version

    for i in range(min(300, updates)):  # the change log's ring filled, every worker past its first pull
        update(i)
    timer = _Timer()
    patched = [(compression, "decode_flat", "decode"), (compression, "decode", "decode"),
               (server.aggregator, "receive_flat", "apply"), (server.aggregator, "receive", "apply"),
               (server.changes, "record", "change log"), (server.changes, "since", "delta coordinates"),
               (downlink, "prepare", "delta values"), (downlink, "finish", "delta encode"),
               (server.rule, "on_pull", "counters"), (server, "trace_update", "trace")]
    originals = [(obj, attr, vars(obj).get(attr)) for obj, attr, _ in patched]  # None: the class's method
    for obj, attr, name in patched:
        setattr(obj, attr, timer.wrap(name, getattr(obj, attr)))
    try:
        start = time.process_time()
        for i in range(updates):
            update(i)
        total = time.process_time() - start
    finally:
        for obj, attr, fn in originals:
            if fn is None:
                delattr(obj, attr)  # the wrapper set over the class's method
            else:
                setattr(obj, attr, fn)
    stages = {name: 1e6 * s / updates for name, s in timer.seconds.items()}
    return {"workers": workers, "updates": updates, "us_per_update": 1e6 * total / updates,
            "stages_us": {k: round(v, 1) for k, v in stages.items()},
            "glue_us": round(1e6 * total / updates - sum(stages.values()), 1)}


def run(quick: bool = False) -> dict:
    from benchmarks.server import exchange_floor, ingest, update_pool
    from compression import compiled

    kernels = compiled.enable()
    pool, source = update_pool()
    pushers, seconds, updates = 8, (3.0 if quick else 8.0), (500 if quick else 4000)
    served = ingest(pool, "adacomp", pushers, seconds, {"mode": "delta"})
    floor = exchange_floor(round(served["request_bytes"]), round(served["reply_bytes"]), pushers, seconds)
    inside = in_process(pool, pushers, updates)
    served_us = 1000 * served["server_cpu_ms_per_update"]
    return {"kernels": kernels, "update_pool": source, "pushers": pushers,
            "server_process": {"updates_per_s": round(served["updates_per_s"], 1), "us_per_update": round(served_us, 1),
                               "request_bytes": round(served["request_bytes"]), "reply_bytes": round(served["reply_bytes"]),
                               "loops": served["loops"]},
            "exchange_floor": {"exchanges_per_s": round(floor["exchanges_per_s"], 1),
                               "us_per_exchange": round(1000 * floor["server_cpu_ms_per_exchange"], 1)},
            "in_process": inside,
            "socket_path_us": round(served_us - inside["us_per_update"], 1)}


def markdown(result: dict) -> list[str]:
    served, floor, inside = result["server_process"], result["exchange_floor"], result["in_process"]
    total = served["us_per_update"]
    lines = [f"AdaComp c = 1 % pushes ({result['update_pool']}), delta pulls, {result['pushers']} pushers; "
             f"server loops: {result['kernels']}.", "",
             "| where | µs per update | share of the server process's |", "|---|---:|---:|"]
    for name, what in STAGES:
        lines.append(f"| {name} ({what}) | {inside['stages_us'][name]} | {inside['stages_us'][name] / total:.0%} |")
    lines += [f"| Python between the stages (locks, counters, the reply's fields) | {inside['glue_us']} | {inside['glue_us'] / total:.0%} |",
              f"| **in process, all of it** ({inside['updates']:,} updates) | {inside['us_per_update']:.1f} | "
              f"{inside['us_per_update'] / total:.0%} |",
              f"| the socket path and what {result['pushers']} connection threads add (locks, the GIL, shared caches): server process less in process | {result['socket_path_us']} | {result['socket_path_us'] / total:.0%} |",
              f"| **server process** ({served['updates_per_s']:,} updates/s, {served['request_bytes']:,} B pushed, "
              f"{served['reply_bytes']:,} B replied) | {total} | 100% |",
              "",
              f"Exchange floor, the same sizes from {result['pushers']} client processes to a Python server that does "
              f"nothing else: {floor['us_per_exchange']} µs of server CPU per exchange ({floor['exchanges_per_s']:,.0f} exchanges/s)."]
    return lines


if __name__ == "__main__":
    standalone(run, markdown, __doc__)
