"""``summary.json``: what one run did, from its traces and the facts of its plan, in one pure function.

The controller counts as traces arrive (its ``LiveState``: applied updates and their bytes,
the server's ingress, rejections, the last evaluations); at the end it hands those counters,
the events and rejections the run recorded, and what only it knows (status, clocks, the
server's interface counters) to :func:`summarize`. No I/O, no clock, nothing beyond the
standard library: tests feed it recorded traces (``tests/data/traces/``).

``outcome`` is the one flag that tables read (compare, sweep):

- ``diverged``: the server stopped training on non-finite updates (``DIVERGED_AFTER`` in a
  row), or the last evaluation's loss or accuracy is not finite, or the model ended at chance
  (below) after updates were refused for NaN or Inf. ``diverged`` is true exactly then.
- ``dead``: the model ended at chance with no NaN seen: after :data:`WARMUP_UPDATES` pushes behind
  the evaluated model (its version; a federated run's aggregations hold several each), the last
  evaluation's accuracy is below :data:`CHANCE_FACTOR` / classes and its loss is not below
  ``ln(classes)`` by more than :data:`LOSS_MARGIN` (a model that predicts one distribution
  whatever the input has a loss of at least the labels' entropy, about ``ln(classes)``).
- ``ok``: neither; it says nothing about how well the model trained.
- ``unknown``: nothing to judge by (no evaluation, or none after the warm-up).

``non_finite_updates`` counts the updates refused for NaN or Inf whatever the outcome: a
worker's report of a non-finite gradient, non-finite values on the wire, or an update that
would have made the model overflow (the reasons the server counts toward divergence).

Both directions, as payload (whole frames, counted by the server) and on the server's interface:
``ingress_payload_bytes`` (pushes) beside ``ingress_wire_bytes``; ``egress_payload_bytes`` (every
frame the server sent: models, deltas, ACKs, rejections, the evaluator's models) beside
``egress_wire_bytes`` (a frame is counted once the kernel has it: one still in a socket buffer
when training ends crosses the interface after the end mark, so the egress wire count may fall
short of the payload by up to a frame per worker); ``downlink_payload_bytes``, the part of it
that went to workers. Per
applied update: ``up_bytes_per_update`` (ingress payload), ``down_bytes_per_update`` (downlink
payload) and ``two_way_bytes_per_update``, their sum.

With several servers and ``server.when_down: skip``, ``update_parts_skipped`` counts the parts of
updates that workers dropped because their server was down (from their ``reconnected`` and
``worker_finished`` events); a run whose workers wait has no such key.

A federated run (``method.aggregation`` other than ``per_push``) has a ``rounds`` section from its
server's ``rounds`` trace (:func:`summary_of_rounds`); ``updates_applied`` then counts aggregations.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

WARMUP_UPDATES = 100  # the model is judged at chance only once this many pushes are behind the evaluated model
CHANCE_FACTOR = 1.5  # accuracy below 1.5 / classes: no better than guessing
LOSS_MARGIN = 0.01  # loss above (1 - 1 %) ln(classes): no better than a uniform guess
NON_FINITE_REASONS = frozenset({"non_finite_gradient", "non_finite", "overflow"})  # paramserver._diverging's
FLAGGED = ("diverged", "dead")  # the outcomes a table marks


class Counters(Protocol):
    """What the controller counted from the traces as they arrived (``runstate.LiveState``)."""

    updates: int
    applied_bytes: int
    ingress_bytes: int
    egress_bytes: int  # every frame the server sent
    downlink_bytes: int  # ... of which to workers
    rejections: int
    late_updates: int
    lost_to_server: int
    done_reason: str
    accuracy: dict | None
    final_accuracy: dict | None


@dataclass(frozen=True)
class RunFacts:
    """What only the controller knows: the plan, the run's status and clocks, interface counters."""

    run_id: str
    name: str
    status: str
    backend: str
    method: str
    rule: str
    compressor: str
    workers: int
    seed: int
    plan_digest: str
    duration_s: float  # seconds of training
    error: str | None = None
    classes: int | None = None
    parameters: int | None = None
    dataset: str | None = None
    training_started_ts: float | None = None  # trace clock; also the boot time
    payload_at_end: int | None = None  # the server's payload count when training ended
    egress_at_end: tuple[int, int] | None = None  # the server's egress and downlink counts then
    net_marks: dict = field(default_factory=dict)  # "start"/"end" -> device -> interface counters


def summarize(counters: Counters, events: Iterable[dict], rejections: Iterable[dict], facts: RunFacts,
              rounds: Iterable[dict] = ()) -> dict:
    """The ``summary.json`` of a run; ``rounds``: the ``rounds`` trace of a federated server (none otherwise)."""
    s = counters
    final = s.final_accuracy or s.accuracy or {}
    faults: Counter = Counter()
    lost_updates = 0
    skipped = None  # parts of updates dropped because their server was down (skip); None: workers wait
    kernels = None  # the server's hot path, from its (latest) listening event: "numba x.y", or why numpy ran
    for record in events:
        if record.get("kind") == "listening" and record.get("kernels"):
            kernels = record["kernels"]
        if record.get("kind") == "fault":
            faults[record["action"]] += 1
        elif record.get("kind") == "disconnected" and record.get("pending"):
            lost_updates += 1
        if record.get("kind") in ("reconnected", "worker_finished") and "skipped" in record:
            skipped = (skipped or 0) + int(record["skipped"])  # server.when_down: skip
    non_finite = sum(1 for r in rejections if r.get("reason") in NON_FINITE_REASONS)
    rounds = list(rounds)
    outcome, detail = judge(final, facts.classes, non_finite, s.done_reason,
                            pushes_behind(rounds, final.get("version")) if rounds else None)
    duration = facts.duration_s
    servers = getattr(s, "servers", None) or {}  # several servers: name -> their own counts
    ingress = s.ingress_bytes if facts.payload_at_end is None else facts.payload_at_end
    egress, downlink = (s.egress_bytes, s.downlink_bytes) if facts.egress_at_end is None else facts.egress_at_end
    return {
        "run_id": facts.run_id, "name": facts.name, "status": facts.status, "error": facts.error,
        "backend": facts.backend, "method": facts.method, "rule": facts.rule,
        "compressor": facts.compressor, "workers": facts.workers, "seed": facts.seed,
        "final_accuracy": final.get("accuracy"), "final_loss": final.get("loss"), "final_version": final.get("version"),
        "final_is_end_of_training": bool(s.final_accuracy),
        "updates_applied": s.updates,
        "ingress_payload_bytes": ingress,
        "egress_payload_bytes": egress, "downlink_payload_bytes": downlink,
        **per_update(ingress, downlink, s.updates),
        "late_payload_bytes": 0 if facts.payload_at_end is None else s.ingress_bytes - facts.payload_at_end,
        "applied_update_bytes": s.applied_bytes,
        "rejected_frames": s.rejections, "late_updates": s.late_updates, "duration_s": round(duration, 3),
        "boot_s": None if facts.training_started_ts is None else round(facts.training_started_ts, 3),
        "training_started_ts": facts.training_started_ts,
        "updates_per_s": round(s.updates / duration, 3) if duration else None,
        "faults": dict(faults), "lost_updates": lost_updates, "updates_lost_to_server_crashes": s.lost_to_server,
        **({} if skipped is None else {"update_parts_skipped": skipped}),
        "done_reason": s.done_reason,
        "non_finite_updates": non_finite,
        "outcome": outcome, "outcome_detail": detail,
        "diverged": outcome == "diverged",
        "parameters": facts.parameters, "dataset": facts.dataset, "plan_digest": facts.plan_digest,
        "server_kernels": kernels,
        **wire_bytes(facts.net_marks, facts.payload_at_end, list(servers) or ["server"]),
        **({"servers": [per_server(name, counts, facts.net_marks) for name, counts in servers.items()]} if servers else {}),
        **({"rounds": summary_of_rounds(rounds)} if rounds else {}),
    }


def summary_of_rounds(rounds: Iterable[dict]) -> dict:
    """The aggregations a federated server closed: how many, how long, who took part, the
    stragglers dropped, and the bytes per round both ways (payload the server received and sent)."""
    rows = list(rounds)
    n = len(rows)
    applied = [r for r in rows if r.get("applied")]

    def mean(key: str, of=rows) -> float | None:
        return round(sum(r.get(key, 0) for r in of) / len(of), 3) if of else None

    return {
        "count": n, "applied": len(applied),
        "mean_duration_s": mean("duration_s"), "max_duration_s": max((r.get("duration_s", 0) for r in rows), default=None),
        "mean_sampled": mean("sampled"), "mean_participants": mean("participants"),
        "stragglers_dropped": sum(r.get("dropped", 0) for r in rows),
        # payload: pushes received; models and deltas sent to workers; everything sent (the evaluator's models too)
        "up_bytes_per_round": mean("ingress_bytes"), "down_bytes_per_round": mean("downlink_bytes"),
        "egress_bytes_per_round": mean("egress_bytes"),
    }


def per_server(name: str, counts: dict, marks: dict) -> dict:
    """One server's share with several servers: its updates, and its bytes both ways as payload and on its interface."""
    return {"name": name, "updates": int(counts.get("updates", 0)),
            "ingress_payload_bytes": int(counts.get("ingress_payload_bytes", 0)),
            "egress_payload_bytes": int(counts.get("egress_payload_bytes", 0)),
            "ingress_wire_bytes": _counter_delta(marks, name, "rx_bytes"),
            "egress_wire_bytes": _counter_delta(marks, name, "tx_bytes")}


def per_update(up: int, down: int, updates: int) -> dict:
    """Bytes per applied update: up (pushes), down (to workers) and both."""
    if not updates:
        return {"up_bytes_per_update": None, "down_bytes_per_update": None, "two_way_bytes_per_update": None}
    return {"up_bytes_per_update": round(up / updates, 1), "down_bytes_per_update": round(down / updates, 1),
            "two_way_bytes_per_update": round((up + down) / updates, 1)}


def pushes_applied(summary: dict, push_bytes: float | None) -> int | None:
    """The workers' pushes the server applied: its updates, or for a federated run (several pushes
    a server step) its ingress payload over the mean push."""
    if not summary.get("rounds"):
        return summary.get("updates_applied")
    up = summary.get("ingress_payload_bytes")
    return round(up / push_bytes) if up and push_bytes else None  # a whole number: push_bytes is a rounded mean


def traffic_per_push(summary: dict, push_bytes: float | None) -> dict:
    """Down and two-way payload per worker push the server applied: a federated server step
    applies a round's pushes, so its per-update counts (per step) are divided out; with one push a
    step (``per_push`` aggregation) they are the summary's own. ``push_bytes``: the mean push."""
    keys = ("down_bytes_per_update", "two_way_bytes_per_update")
    if not summary.get("rounds"):
        return {key: summary.get(key) for key in keys}
    up, down = summary.get("ingress_payload_bytes"), summary.get("downlink_payload_bytes")
    if not push_bytes or up is None or down is None:
        return dict.fromkeys(keys)
    pushes = pushes_applied(summary, push_bytes)
    if not pushes:
        return dict.fromkeys(keys)
    return {"down_bytes_per_update": round(down / pushes, 1), "two_way_bytes_per_update": round((up + down) / pushes, 1)}


def pushes_behind(rounds: list[dict], version: int | None) -> int | None:
    """The workers' pushes in a federated model at ``version``: the participants of the aggregations
    applied up to it (an aggregation is one version and holds several pushes)."""
    if version is None:
        return None
    return sum(int(r.get("participants", 0)) for r in rounds if r.get("applied") and (r.get("version") or 0) <= version)


def judge(final: dict, classes: int | None, non_finite: int, done_reason: str,
          pushes: int | None = None) -> tuple[str, str]:
    """``(outcome, why)`` from the last evaluation, the classes, the non-finite count and why training
    ended; ``pushes``: the pushes behind the evaluated model where a version holds several (federated
    aggregations, :func:`pushes_behind`), else its version is its pushes."""
    if done_reason.startswith("diverged"):
        return "diverged", f"the server stopped training: {done_reason}"
    accuracy, loss, version = final.get("accuracy"), final.get("loss"), final.get("version")
    if accuracy is None or loss is None:
        return "unknown", "no evaluation"
    if not (math.isfinite(accuracy) and math.isfinite(loss)):
        return "diverged", f"the last evaluation (update {version}) is not finite: accuracy {accuracy}, loss {loss}"
    behind = (version or 0) if pushes is None else pushes
    if not classes or behind < WARMUP_UPDATES:
        return "unknown", (f"the last evaluation has {behind} pushes behind it, fewer than the warm-up's {WARMUP_UPDATES}"
                           if classes else "classes unknown")
    chance = math.log(classes)
    if accuracy < CHANCE_FACTOR / classes and loss > (1 - LOSS_MARGIN) * chance:
        at_chance = (f"at chance at update {version}: accuracy {accuracy:.4f} (chance {1 / classes:.4f}), "
                     f"loss {loss:.4f} (ln {classes} = {chance:.4f})")
        if non_finite:
            return "diverged", f"{at_chance}, after {non_finite} updates refused for NaN or Inf"
        return "dead", at_chance
    return "ok", ""


def wire_bytes(marks: dict, payload_at_end: int | None, servers: list[str] = ("server",)) -> dict:
    """Bytes on the servers' interfaces during training (all of it: headers, ACKs, retransmissions), summed."""
    ingress, egress = (_sum([_counter_delta(marks, name, key) for name in servers]) for key in ("rx_bytes", "tx_bytes"))
    out = {"ingress_wire_bytes": ingress, "egress_wire_bytes": egress}
    if ingress and payload_at_end:
        out["wire_overhead_ratio"] = round(ingress / payload_at_end, 4)
    return out


def _sum(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(values)


def _counter_delta(marks: dict, device: str, key: str) -> int | None:
    try:
        return int(marks["end"][device][key]) - int(marks["start"][device][key])
    except KeyError:
        return None


def flag(summary: dict) -> str:
    """The outcome as a table marks it: ``" (diverged)"``, ``" (dead)"`` or ``""``."""
    outcome = summary.get("outcome") or ("diverged" if summary.get("diverged") else None)
    return f" ({outcome})" if outcome in FLAGGED else ""


__all__ = ["CHANCE_FACTOR", "FLAGGED", "LOSS_MARGIN", "NON_FINITE_REASONS", "WARMUP_UPDATES", "Counters", "RunFacts",
           "flag", "judge", "per_update", "pushes_behind", "summarize", "wire_bytes"]
