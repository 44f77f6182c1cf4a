"""From a scenario to a plan: every device with concrete values, and every fault on a timeline.

Planning is pure and seeded: the same scenario and seed give the same plan, byte for byte
(``Plan.dumps``). Distributions are drawn per worker group, random crashes per worker, each
from its own seeded stream so that adding a group or a fault does not reshuffle the others.
Explicit events are checked against the state each worker is in at that time, so an
impossible schedule (resume a worker that is not paused) is refused before anything runs.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from dataclasses import asdict, dataclass, field

import numpy as np

from emulator import datasets, plugins
from emulator.planning import methods, replay
from emulator.planning.scenario import (BOUNDS, Problem, Scenario, ScenarioError, TimedEvent, is_server_target, resolve_servers,
                                        resolve_targets, server_names)
from emulator.runtime.config import LINK_FIELDS, LINK_PROPERTIES, LinkConfig

DEFAULT_HORIZON_S = 3600.0
MAX_RANDOM_CRASHES = 100_000


LinkPlan = LinkConfig  # a device's planned link is the link its program is configured with (emulator/runtime/config.py)


@dataclass(frozen=True)
class DevicePlan:
    name: str
    role: str  # "server" | "evaluator" | "worker"
    index: int  # worker index; a server's shard where there are several; -1 for a lone server and the evaluator
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
    source: str = "schedule"  # schedule | random | trace


@dataclass(frozen=True)
class Plan:
    name: str
    seed: int
    model: dict  # name (a built-in, or the absolute reference to a user's model), args, output
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
    checkpoint: dict = field(default_factory=dict)
    servers: tuple[DevicePlan, ...] = ()  # every server process, in shard order; () : the one ``server``
    partition: dict | None = None  # the model's split over ``servers`` (:mod:`emulator.runtime.partition`) and ``when_down``; None: one server

    def __post_init__(self):
        if not self.servers:
            object.__setattr__(self, "servers", (self.server,))

    @property
    def devices(self) -> tuple[DevicePlan, ...]:
        return self.servers + (self.evaluator,) + self.workers

    def is_server(self, name: str) -> bool:
        """Whether ``name`` is one of the servers."""
        return any(s.name == name for s in self.servers)

    def device(self, name: str) -> DevicePlan:
        for device in self.devices:
            if device.name == name:
                return device
        raise KeyError(name)

    def to_json(self) -> dict:
        return {
            "name": self.name, "seed": self.seed, "model": self.model, "dataset": self.dataset,
            "training": self.training, "method": self.method.to_json(), "backend": self.backend,
            "horizon_s": self.horizon_s, "checkpoint": self.checkpoint,
            "server": asdict(self.server), "evaluator": asdict(self.evaluator),
            "workers": [asdict(w) for w in self.workers],
            "events": [asdict(e) for e in self.events],
            "triggers": list(self.triggers),
            **({} if len(self.servers) == 1 else {"servers": [asdict(s) for s in self.servers], "partition": self.partition}),
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
        for field_name in ("cpus", *LINK_PROPERTIES):
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
            link = LinkPlan(**{LINK_FIELDS[prop]: drawn[prop][i] for prop in LINK_PROPERTIES})
            out.append(DevicePlan(
                name=worker_name(index), role="worker", index=index, group=group.name or f"group-{g}",
                cpus=round(drawn["cpus"][i], 6), memory_bytes=group.memory, link=link, seed=_device_seed(s.seed, 2, index),
            ))
    return out


def _random_crashes(s: Scenario, horizon: float, problems: list[Problem]) -> list[tuple[EventPlan, EventPlan | None]]:
    """Per worker, (crash, restart or None) pairs; None: the worker stays down to the horizon."""
    crash = s.faults.crash
    if crash is None or crash.rate_per_hour <= 0:
        return []
    targets = resolve_targets(crash.workers, s)
    expected = crash.rate_per_hour * horizon / 3600.0 * len(targets)
    if expected > MAX_RANDOM_CRASHES:
        problems.append(Problem("faults.crash.rate_per_hour", (
            f"about {expected:,.0f} random crashes over the {horizon:g}s horizon; at most {MAX_RANDOM_CRASHES:,} "
            "(lower the rate or faults.horizon)")))
        return []
    pairs = []
    mean_gap = 3600.0 / crash.rate_per_hour
    for index in targets:
        rng = _stream(s.seed, 1, index)
        t = 0.0
        while True:
            t += float(rng.exponential(mean_gap))
            if t >= horizon:
                break
            down = EventPlan(round(t, 3), "crash", worker_name(index), {}, "random")
            if crash.restart_after is None:
                pairs.append((down, None))
                break
            t += crash.restart_after
            up = EventPlan(round(t, 3), "restart", worker_name(index), {}, "random") if t < horizon else None
            pairs.append((down, up))
    return pairs


_UNDO = {"pause": "resume", "partition": "heal"}


def _scheduled(s: Scenario, workers: list[DevicePlan]) -> list[tuple[EventPlan, str]]:
    """Explicit events, expanded ('for' adds the undo), each with the path it came from."""
    before = _values_before(s, workers)
    out = []
    for i, event in enumerate(s.faults.at):
        path = f"faults.at[{i}]"
        if is_server_target(event.targets):  # every server process, or one
            for name in resolve_servers(event.targets, s):
                out.extend((e, path) for e in _expand(event, name, {}))
            continue
        for index in resolve_targets(event.targets, s):
            name = worker_name(index)
            out.extend((e, path) for e in _expand(event, name, before.get((i, index), {})))
    return out


def _change(event: TimedEvent) -> dict:
    """What a cpus or link event sets, keyed as the plan's fields (``cpus``, ``uplink_bps``...)."""
    if event.action == "cpus":
        return {"cpus": event.cpus}
    return {LINK_FIELDS[prop]: v for prop, v in event.link.model_dump().items() if v is not None}


def _values_before(s: Scenario, workers: list[DevicePlan]) -> dict[tuple[int, int], dict]:
    """For each cpus/link event and target worker, the values in effect just before it: what its
    'for' restores (earlier changes and their undos included, in time order)."""
    current = {w.index: {"cpus": w.cpus, **asdict(w.link)} for w in workers}
    queue: list[tuple[float, int, int, int, dict]] = []  # time, event, 0 change / 1 undo, worker, values
    for i, event in enumerate(s.faults.at):
        if event.action in ("cpus", "link"):
            for index in resolve_targets(event.targets, s):
                queue.append((event.time, i, 0, index, _change(event)))
    heapq.heapify(queue)
    before: dict[tuple[int, int], dict] = {}
    while queue:
        t, i, undo, index, values = heapq.heappop(queue)
        if not undo:
            before[(i, index)] = {k: current[index][k] for k in values}
            duration = s.faults.at[i].duration
            if duration:
                heapq.heappush(queue, (t + duration, i, 1, index, before[(i, index)]))
        current[index].update(values)
    return before


def _expand(event: TimedEvent, name: str, before: dict) -> list[EventPlan]:
    action, t = event.action, event.time
    if action in ("cpus", "link"):
        events = [EventPlan(t, action, name, _change(event))]
        if event.duration:
            events.append(EventPlan(t + event.duration, action, name, dict(before)))
        return events
    events = [EventPlan(t, action, name)]
    if action == "crash" and event.restart_after is not None:
        events.append(EventPlan(t + event.restart_after, "restart", name))
    if event.duration and action in _UNDO:
        events.append(EventPlan(t + event.duration, _UNDO[action], name))
    return events


# Which state an action needs, and the state it leaves: the process (up/down/paused) and,
# independently, the network (connected/partitioned).
_TRANSITIONS = {
    "crash": ({"up", "paused"}, "down"),
    "restart": ({"down"}, "up"),
    "pause": ({"up"}, "paused"),
    "resume": ({"paused"}, "up"),
}
_NETWORK = {
    "partition": ({"connected"}, "partitioned"),
    "heal": ({"partitioned"}, "connected"),
}


def _check_and_merge(
    scheduled: list[tuple[EventPlan, str]], random_pairs: list[tuple[EventPlan, EventPlan | None]], problems: list[Problem]
) -> list[EventPlan]:
    """Refuse impossible explicit events; keep a random crash (and its restart) only where it clashes with none.

    Explicit events are checked against explicit events alone, so random draws never make a valid
    schedule fail. A random crash is kept when its worker is up (by the schedule) at the crash and
    no explicit crash/restart/pause/resume of that worker falls while it is down.
    """
    scheduled = sorted(scheduled, key=lambda ep: ep[0].time_s)  # stable: file order at equal times
    state: dict[str, str] = {}
    network: dict[str, str] = {}
    changes: dict[str, list[tuple[float, str]]] = {}  # worker -> explicit (time, state after), in time order
    kept: list[EventPlan] = []
    for event, path in scheduled:
        if event.action in _TRANSITIONS:
            table, states, default = _TRANSITIONS, state, "up"
        elif event.action in _NETWORK:
            table, states, default = _NETWORK, network, "connected"
        else:
            kept.append(event)
            continue
        current = states.get(event.target, default)
        needs, leaves = table[event.action]
        if current not in needs:
            problems.append(Problem(path, f"{event.action} {event.target} at {event.time_s:g}s, but it is {current} then"))
            continue
        states[event.target] = leaves
        if table is _TRANSITIONS:
            changes.setdefault(event.target, []).append((event.time_s, leaves))
        kept.append(event)
    for down, up in random_pairs:
        timeline = changes.get(down.target, [])
        before = [st for t, st in timeline if t < down.time_s]
        end = up.time_s if up is not None else float("inf")
        if (before[-1] if before else "up") != "up" or any(down.time_s <= t <= end for t, _ in timeline):
            continue
        kept.append(down)
        if up is not None:
            kept.append(up)
    order = {"schedule": 0, "trace": 0, "random": 1}
    return sorted(kept, key=lambda e: (e.time_s, order[e.source]))


def make_plan(s: Scenario) -> Plan:
    """The concrete, seeded plan of a validated scenario (ScenarioError on impossible draws or schedules)."""
    problems: list[Problem] = []
    method = methods.resolve(s.method, s.worker_count)
    workers = _workers(s, problems)
    horizon = s.faults.horizon or s.training.duration or DEFAULT_HORIZON_S
    traced = replay.expand(s, workers, horizon, lambda targets: resolve_targets(targets, s))  # the same events as faults
    workers, problems = traced.workers, problems + traced.problems
    scheduled = _scheduled(s, workers) + [(EventPlan(t, a, name, p, "trace"), path) for t, a, name, p, path in traced.events]
    for event, path in scheduled:
        if s.training.duration and event.time_s > s.training.duration:
            problems.append(Problem(path, f"{event.action} at {event.time_s:g}s, after the run ends ({s.training.duration:g}s)"))
    events = _check_and_merge(scheduled, _random_crashes(s, horizon, problems), problems)
    if problems:
        raise ScenarioError(list(dict.fromkeys(problems)))  # one line for an event on many workers
    servers = tuple(DevicePlan(
        name=name, role="server", index=-1 if s.server.shards == 1 else i, group="server", cpus=s.server.cpus,
        memory_bytes=s.server.memory,
        link=LinkPlan(uplink_bps=s.server.uplink, downlink_bps=s.server.downlink, delay_s=s.server.delay),
        seed=_device_seed(s.seed, 0, i),
    ) for i, name in enumerate(server_names(s.server.shards)))
    evaluator = DevicePlan(name="evaluator", role="evaluator", index=-1, group="evaluator", cpus=s.evaluator.cpus,
                           memory_bytes=s.evaluator.memory, link=LinkPlan(), seed=_device_seed(s.seed, 1, 0))
    triggers = tuple(
        {"worker": worker_name(t.worker), "after_pushes": t.after_pushes, "action": t.action,
         "restart_after_s": t.restart_after, "for_s": t.duration}
        for t in s.faults.triggers
    )
    training = s.training.model_dump(exclude={"eval_every"})
    training["eval_every"] = s.training.eval_every.to_json()
    return Plan(
        name=s.name, seed=s.seed, model=s.model.model_dump(), dataset=s.dataset.model_dump(), training=training,
        method=method, server=servers[0], evaluator=evaluator, workers=tuple(workers),
        events=tuple(events), triggers=triggers, horizon_s=horizon, backend=s.backend,
        checkpoint=s.server.checkpoint.model_dump(), servers=servers,
        partition=None if s.server.shards == 1 else {"split": s.server.split, "shards": s.server.shards, "when_down": s.server.when_down},
    )


def check_dataset(s: Scenario, *, run_code: bool = False) -> datasets.DatasetFacts | None:
    """Whether the data the scenario asks for exist on this machine, in the sizes it asks for, and pass
    every check (shapes, dtypes, labels, NaN/inf, train/test agreement: :func:`emulator.datasets.make`).

    Kept apart from :func:`make_plan`, which stays pure: this one reads files. The CLI, compare and
    sweep call it before anything starts, so a dataset that is missing, malformed, or smaller than a
    ``train_size`` / ``test_size`` asks for, is a ScenarioError naming the field (``dataset.file``,
    ``dataset.label``...), the file, and the array or line. A user's data files are read (data, not
    code); a ``loader`` is imported and called only with ``run_code`` (a run): without it, only its
    file's existence is checked and the answer is None (``emulate plan`` lists the file instead)."""
    d = s.dataset
    kind = datasets.source_kind(d)
    try:
        if kind == "loader" and not run_code:
            datasets.exists_without_running(d)
            return None
        found = datasets.facts(d)
    except plugins.PluginError as error:  # the loader's file or function is missing, or the user's code raised
        raise ScenarioError([Problem("dataset.loader", str(error))]) from None
    except datasets.DataError as error:
        field = error.field if kind != "name" else ("name" if d.path is None else "path")
        raise ScenarioError([Problem(f"dataset.{field}", str(error))]) from None
    except ValueError as error:  # DatasetUnavailable, or a malformed file named in the message
        raise ScenarioError([Problem("dataset.name" if d.path is None else "dataset.path", str(error))]) from None
    name = found.name
    problems = []
    train = test = None
    for field_name, requested, available in (("train_size", d.train_size, found.train_examples),
                                             ("test_size", d.test_size, found.test_examples)):
        try:
            count = datasets.resolve_size(requested, available, f"dataset.{field_name}", name)
        except ValueError as error:
            problems.append(Problem(f"dataset.{field_name}", str(error).split(": ", 1)[1]))
            continue
        train, test = (count, test) if field_name == "train_size" else (train, count)
    examples = train if train is not None else found.train_examples
    if not problems and s.worker_count > examples:
        problems.append(Problem("workers", f"{s.worker_count} workers but {name!r} gives {examples:,} training examples "
                                           "here: every worker needs at least one"))
    if d.classes_per_worker and d.classes_per_worker > found.classes:
        problems.append(Problem("dataset.classes_per_worker", f"{d.classes_per_worker} classes per worker but {name!r} has {found.classes}"))
    if problems:
        raise ScenarioError(problems)
    return found
