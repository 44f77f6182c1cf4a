"""From a scenario to a plan: every device with concrete values, and every fault on a timeline.

Planning is pure and seeded: the same scenario and seed give the same plan, byte for byte
(``Plan.dumps``). Distributions are drawn per worker group, random crashes per worker, each
from its own seeded stream so that adding a group or a fault does not reshuffle the others.
Explicit events are checked against the state each worker is in at that time, so an
impossible schedule (resume a worker that is not paused) is refused before anything runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import numpy as np

from . import methods
from .scenario import BOUNDS, Problem, Scenario, ScenarioError, TimedEvent, resolve_targets

DEFAULT_HORIZON_S = 3600.0


@dataclass(frozen=True)
class LinkPlan:
    uplink_bps: float | None = None  # device -> server; None: unshaped
    downlink_bps: float | None = None  # server -> device
    delay_s: float = 0.0  # one-way, each direction
    jitter_s: float = 0.0
    loss: float = 0.0  # fraction of packets dropped, each direction


@dataclass(frozen=True)
class DevicePlan:
    name: str
    role: str  # "server" | "evaluator" | "worker"
    index: int  # worker index; -1 for the server and the evaluator
    group: str
    cpus: float
    memory_bytes: int
    link: LinkPlan
    seed: int


@dataclass(frozen=True)
class EventPlan:
    time_s: float
    action: str  # crash | restart | pause | resume | partition | heal | cpus | link | stop
    target: str  # device name
    params: dict = field(default_factory=dict)
    source: str = "schedule"  # schedule | random


@dataclass(frozen=True)
class Plan:
    name: str
    seed: int
    model: str
    dataset: dict
    training: dict
    method: methods.ResolvedMethod
    server: DevicePlan
    evaluator: DevicePlan
    workers: tuple[DevicePlan, ...]
    events: tuple[EventPlan, ...]
    triggers: tuple[dict, ...]
    horizon_s: float
    backend: str

    @property
    def devices(self) -> tuple[DevicePlan, ...]:
        return (self.server, self.evaluator) + self.workers

    def device(self, name: str) -> DevicePlan:
        for device in self.devices:
            if device.name == name:
                return device
        raise KeyError(name)

    def to_json(self) -> dict:
        return {
            "name": self.name, "seed": self.seed, "model": self.model, "dataset": self.dataset,
            "training": self.training, "method": self.method.to_json(), "backend": self.backend,
            "horizon_s": self.horizon_s,
            "server": asdict(self.server), "evaluator": asdict(self.evaluator),
            "workers": [asdict(w) for w in self.workers],
            "events": [asdict(e) for e in self.events],
            "triggers": list(self.triggers),
        }

    def dumps(self) -> str:
        """Canonical JSON: sorted keys, fixed separators; same plan, same bytes."""
        return json.dumps(self.to_json(), sort_keys=True, indent=1) + "\n"

    def digest(self) -> str:
        return hashlib.sha256(self.dumps().encode()).hexdigest()[:16]


def worker_name(index: int) -> str:
    return f"worker-{index}"


def _stream(seed: int, *key: int) -> np.random.Generator:
    """An independent random stream per purpose and index."""
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, *key]))


def _device_seed(seed: int, kind: int, index: int) -> int:
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, 99, kind, index]).generate_state(1)[0])


def _workers(s: Scenario, problems: list[Problem]) -> list[DevicePlan]:
    out: list[DevicePlan] = []
    for g, group in enumerate(s.workers):
        rng = _stream(s.seed, 0, g)
        drawn = {}
        for field_name in ("cpus", "uplink", "downlink", "delay", "jitter", "loss"):
            dist = getattr(group, field_name)
            values = dist.sample(rng, group.count) if dist is not None else [None] * group.count
            check = BOUNDS[field_name]
            for value in values:
                if value is None:
                    continue
                try:
                    check(value)
                except ValueError as exc:
                    problems.append(Problem(f"workers[{g}].{field_name}", f"a draw gave {value:g}: {exc}; add or tighten 'clip'"))
                    break
            drawn[field_name] = values
        for i in range(group.count):
            index = len(out)
            link = LinkPlan(drawn["uplink"][i], drawn["downlink"][i], drawn["delay"][i], drawn["jitter"][i], drawn["loss"][i])
            out.append(DevicePlan(
                worker_name(index), "worker", index, group.name or f"group-{g}", round(drawn["cpus"][i], 6),
                group.memory, link, _device_seed(s.seed, 2, index),
            ))
    return out


def _random_crashes(s: Scenario, horizon: float) -> list[EventPlan]:
    crash = s.faults.crash
    if crash is None or crash.rate_per_hour <= 0:
        return []
    events = []
    mean_gap = 3600.0 / crash.rate_per_hour
    for index in resolve_targets(crash.workers, s):
        rng = _stream(s.seed, 1, index)
        t = 0.0
        while True:
            t += float(rng.exponential(mean_gap))
            if t >= horizon:
                break
            events.append(EventPlan(round(t, 3), "crash", worker_name(index), {}, "random"))
            if crash.restart_after is None:
                break
            t += crash.restart_after
            if t < horizon:
                events.append(EventPlan(round(t, 3), "restart", worker_name(index), {}, "random"))
    return events


_UNDO = {"pause": "resume", "partition": "heal"}


def _scheduled(s: Scenario, workers: list[DevicePlan]) -> list[tuple[EventPlan, str]]:
    """Explicit events, expanded ('for' adds the undo), each with the path it came from."""
    out = []
    for i, event in enumerate(s.faults.at):
        path = f"faults.at[{i}]"
        for index in resolve_targets(event.targets, s):
            name = worker_name(index)
            out.extend((e, path) for e in _expand(event, name, workers[index]))
    return out


def _expand(event: TimedEvent, name: str, device: DevicePlan) -> list[EventPlan]:
    action, t = event.action, event.time
    if action == "cpus":
        events = [EventPlan(t, "cpus", name, {"cpus": event.cpus})]
        if event.duration:
            events.append(EventPlan(t + event.duration, "cpus", name, {"cpus": device.cpus}))
        return events
    if action == "link":
        change = {f"{k}{_unit(k)}": v for k, v in event.link.model_dump().items() if v is not None}
        events = [EventPlan(t, "link", name, change)]
        if event.duration:
            before = asdict(device.link)
            events.append(EventPlan(t + event.duration, "link", name, {k: before[k] for k in change}))
        return events
    events = [EventPlan(t, action, name)]
    if action == "crash" and event.restart_after is not None:
        events.append(EventPlan(t + event.restart_after, "restart", name))
    if event.duration and action in _UNDO:
        events.append(EventPlan(t + event.duration, _UNDO[action], name))
    return events


def _unit(key: str) -> str:
    return {"uplink": "_bps", "downlink": "_bps", "delay": "_s", "jitter": "_s", "loss": ""}[key]


# Which state an action needs, and the state it leaves.
_TRANSITIONS = {
    "crash": ({"up", "paused"}, "down"),
    "restart": ({"down"}, "up"),
    "pause": ({"up"}, "paused"),
    "resume": ({"paused"}, "up"),
}


def _check_and_merge(scheduled: list[tuple[EventPlan, str]], random_events: list[EventPlan], problems: list[Problem]) -> list[EventPlan]:
    """Walk the timeline per worker; refuse impossible explicit events, drop random ones that clash."""
    order = {"schedule": 0, "random": 1}
    tagged = [(e, p) for e, p in scheduled] + [(e, None) for e in random_events]
    tagged.sort(key=lambda ep: (ep[0].time_s, order[ep[0].source]))
    state: dict[str, str] = {}
    random_down: set[str] = set()
    kept: list[EventPlan] = []
    for event, path in tagged:
        if event.action not in _TRANSITIONS:
            kept.append(event)
            continue
        current = state.get(event.target, "up")
        needs, leaves = _TRANSITIONS[event.action]
        if event.source == "random":
            if event.action == "restart" and event.target not in random_down:
                continue  # its crash was dropped
            if current not in needs or (event.action == "crash" and current == "paused"):
                continue
            if event.action == "crash":
                random_down.add(event.target)
            else:
                random_down.discard(event.target)
        elif current not in needs:
            problems.append(Problem(path, f"{event.action} {event.target} at {event.time_s:g}s, but it is {current} then"))
            continue
        state[event.target] = leaves
        kept.append(event)
    return kept


def make_plan(s: Scenario) -> Plan:
    """The concrete, seeded plan of a validated scenario (ScenarioError on impossible draws or schedules)."""
    problems: list[Problem] = []
    method = methods.resolve(s.method)
    workers = _workers(s, problems)
    horizon = s.faults.horizon or s.training.duration or DEFAULT_HORIZON_S
    scheduled = _scheduled(s, workers)
    for event, path in scheduled:
        if s.training.duration and event.time_s > s.training.duration:
            problems.append(Problem(path, f"at {event.time_s:g}s, after the run ends ({s.training.duration:g}s)"))
    events = _check_and_merge(scheduled, _random_crashes(s, horizon), problems)
    if problems:
        raise ScenarioError(problems)
    server = DevicePlan(
        "server", "server", -1, "server", s.server.cpus, s.server.memory,
        LinkPlan(s.server.uplink, s.server.downlink, s.server.delay, 0.0, 0.0), _device_seed(s.seed, 0, 0),
    )
    evaluator = DevicePlan("evaluator", "evaluator", -1, "evaluator", s.evaluator.cpus, s.evaluator.memory, LinkPlan(), _device_seed(s.seed, 1, 0))
    triggers = tuple(
        {"worker": worker_name(t.worker), "after_pushes": t.after_pushes, "action": t.action,
         "restart_after_s": t.restart_after, "for_s": t.duration}
        for t in s.faults.triggers
    )
    training = s.training.model_dump(exclude={"eval_every"})
    training["eval_every"] = s.training.eval_every.to_json()
    return Plan(
        name=s.name, seed=s.seed, model=s.model, dataset=s.dataset.model_dump(), training=training,
        method=method, server=server, evaluator=evaluator, workers=tuple(workers),
        events=tuple(events), triggers=triggers, horizon_s=horizon, backend=s.backend,
    )
