"""The model's split over server shards on the paper's CNN: bytes and server CPU per shard.

For each split of :data:`emulator.runtime.partition.PARTITIONS` and 2 and 4 shards: what each
shard holds (parameters, so dense push and pull bytes), what an AdaComp push (top 1 % per tensor
of a heavy-tailed gradient, the codec's message) costs it on the wire, and the server CPU one
such push costs it (decode and AdaComp's rule, on the real server object, in process). The
imbalance (the largest shard over the mean) is what bounds a sharded server: the busiest shard
sets the update rate. Run: ``python -m benchmarks.split [--quick]``.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.common import cnn_layout, realistic_gradient, standalone

SHARDS = (1, 2, 4)


def _server(layout, part, shard, rule="adacomp"):
    from emulator.runtime.config import LinkConfig, ServerConfig
    from emulator.runtime.paramserver import ParameterServer
    from emulator.runtime.telemetry import Telemetry

    class Quiet(Telemetry):
        def record(self, stream, **fields):
            pass

        def event(self, name, **fields):
            pass

    cfg = ServerConfig(name="server", token="00" * 16, start_time=0.0, collector=None, seed=1, bind=("127.0.0.1", 0),
                       layout=layout.to_json(), rule=rule, learning_rate=0.01, max_updates=None,
                       transport=LinkConfig(), checkpoint=None, partition=part.to_json(), shard=shard)
    ps = ParameterServer(cfg, Quiet(None, bytes(16), "ps", time.time()))
    ps.control({"cmd": "start"})
    return ps


def measure_split(split: str, shards: int, pushes: int) -> dict:
    import compression
    from emulator.runtime import partition

    layout = cnn_layout()
    part = partition.build(layout, shards, split)
    compressor = compression.build("topk", {"c": 0.01}, layout, 0)
    messages = [[] for _ in range(shards)]
    for seed in range(pushes):
        flat = realistic_gradient(layout, seed)
        grads = [flat[o:o + n] for o, n in zip(layout.offsets, layout.sizes)]
        for i, mine in enumerate(part.split(compressor.compress(grads))):
            messages[i].append(compression.encode(mine, part.layouts[i]))
    rows = []
    for i in range(shards):
        ps = _server(layout, part, i)
        ps.pull(0)
        start = time.process_time()
        for body in messages[i]:
            ps.push(0, ps.version, memoryview(body), len(body))
            ps.rule.on_pull(0, ps.version)
        cpu_us = (time.process_time() - start) / pushes * 1e6
        lo, hi = part.range(i)
        rows.append({"shard": i, "parameters": hi - lo, "dense_bytes": 4 * (hi - lo),
                     "adacomp_bytes": round(float(np.mean([len(m) for m in messages[i]]))), "adacomp_cpu_us": round(cpu_us, 1),
                     "tensors": [t.name for t in part.layouts[i].tensors]})
    def imbalance(key):
        values = [r[key] for r in rows]
        return round(max(values) / (sum(values) / len(values)), 3)
    return {"split": split, "shards": shards, "rows": rows,
            "imbalance": {k: imbalance(k) for k in ("dense_bytes", "adacomp_bytes", "adacomp_cpu_us")}}


def run(quick: bool = False) -> dict:
    from compression import compiled

    kernels = compiled.enable()
    from emulator.runtime import partition

    pushes = 20 if quick else 200
    return {"kernels": kernels, "pushes": pushes,
            "splits": [measure_split(s, n, pushes) for s in partition.PARTITIONS for n in SHARDS]}


def markdown(result: dict) -> list[str]:
    lines = [f"AdaComp pushes: top 1 % per tensor, {result['pushes']} per shard; server loops: {result['kernels']}", "",
             "| split | shards | shard | parameters | dense push B | AdaComp push B | AdaComp server CPU µs | tensors |",
             "|---|---|---|---|---|---|---|---|"]
    for s in result["splits"]:
        for r in s["rows"]:
            lines.append(f"| {s['split']} | {s['shards']} | {r['shard']} | {r['parameters']:,} | {r['dense_bytes']:,} | "
                         f"{r['adacomp_bytes']:,} | {r['adacomp_cpu_us']} | {', '.join(r['tensors'])} |")
    lines += ["", "| split | shards | max/mean dense B | max/mean AdaComp B | max/mean AdaComp CPU |", "|---|---|---|---|---|"]
    for s in result["splits"]:
        i = s["imbalance"]
        lines.append(f"| {s['split']} | {s['shards']} | {i['dense_bytes']} | {i['adacomp_bytes']} | {i['adacomp_cpu_us']} |")
    return lines


if __name__ == "__main__":
    standalone(run, markdown, __doc__)
