"""The evaluator: test accuracy and loss of model snapshots, on its own CPU budget.

It long-polls the server for the model (every ``seconds`` of wall time, or every ``updates``
applied), evaluates the whole test set, and reports ``(version, time, accuracy, loss)``.
When the server says training is done it evaluates that final model, marks it final, exits.

Run as ``python -m emulator.runtime.evaluator`` with its :class:`~.config.EvaluatorConfig` in ``$EMU_CONFIG``.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

from emulator.runtime import partition, protocol
from emulator.runtime.bootstrap import limit_threads, run_device
from emulator.runtime.config import EvaluatorConfig
from emulator.runtime.data import load_shard
from emulator.runtime.protocol import Flag, MsgType
from emulator.runtime.transport import Channel, open_session

NEVER = 2**62


def run(cfg: EvaluatorConfig, tel) -> int:
    from emulator.runtime.models import TFModel, resolve

    threads = limit_threads(cfg.cpus)
    x, y = load_shard(cfg.test_set)
    model = TFModel(resolve(cfg.model, cfg.model_args, cfg.model_output, checked=True), x.shape[1:], cfg.classes, threads)
    every_updates, every_s = cfg.eval_every_updates, cfg.eval_every_s

    split = partition.from_json(cfg.partition, model.layout)
    addresses = [tuple(a) for a in cfg.servers] if cfg.servers else [cfg.ps]

    def join(shard: int) -> Channel:
        channel, _ = open_session(addresses[shard], bytes.fromhex(cfg.token), {"role": "evaluator"},
                                  max_body=model.layout.total * 4 + 4096, timeout_s=cfg.connect_timeout_s)
        return channel

    channels = [join(i) for i in range(split.shards)]
    model.warm_up(np.zeros(model.layout.total, np.float32), x, y, evaluate_batch=min(len(x), 1000))
    tel.event("evaluator_ready", test_size=len(x))

    target, next_tick = 0, None
    while True:
        if every_updates is not None:
            wait_ms, min_version = 600_000, target
        else:
            wait_ms = 0 if next_tick is None else max(0, int((next_tick - time.monotonic()) * 1000))
            min_version = NEVER if wait_ms else 0
        try:
            for channel in channels:  # every server waits for the version on its own
                channel.send(MsgType.PULL, wait_ms.to_bytes(4, "little"), t0=min_version)
            replies = [channel.recv(keep_buffer=True) for channel in channels]
        except (OSError, protocol.PeerClosed) as exc:
            tel.event("server_lost", detail=str(exc))
            for channel in channels:
                channel.close()
            channels = [join(i) for i in range(split.shards)]
            continue
        header, body = replies[0]
        pulled_at = tel.now()
        if next_tick is None:
            next_tick = time.monotonic()  # the clock of evaluations starts with training
        if split.shards == 1:
            params = np.frombuffer(body, dtype="<f4")
        else:  # the whole model from every server's part; its version the oldest of theirs, and done when any is
            params = split.assemble([np.frombuffer(b, dtype="<f4") for _, b in replies])
            header = dataclasses.replace(min((h for h, _ in replies), key=lambda h: h.t0),
                                         flags=Flag.DONE if any(h.flags & Flag.DONE for h, _ in replies) else 0)
        start_eval = time.perf_counter()
        accuracy, loss = model.evaluate(params, x, y)
        final = bool(header.flags & Flag.DONE)
        tel.record(
            "accuracy", version=header.t0, model_ts=round(pulled_at, 4), accuracy=accuracy, loss=loss,
            final=final, eval_s=round(time.perf_counter() - start_eval, 3), test_size=len(x),
        )
        if final:
            break
        if every_updates is not None:
            target = (header.t0 // every_updates + 1) * every_updates
        else:
            next_tick = max(next_tick + every_s, time.monotonic())
    for channel in channels:
        channel.close()
    return 0


def main() -> int:
    return run_device(run, EvaluatorConfig)


if __name__ == "__main__":
    sys.exit(main())
