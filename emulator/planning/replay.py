"""Replaying traces: a scenario's trace files as the plan's timed events, seeded and capped.

:func:`expand` turns each worker group's traces (:mod:`emulator.planning.traces` reads and
checks the files) into the same timed events as the scenario's faults (pause, resume, crash,
restart, link, cpus) over the training time, capped at :data:`MAX_TRACE_EVENTS`, and gives each
worker the values the traces hold at time zero (a population's draw included): a traced run is
as reproducible as any other, and ``emulate plan`` shows every event. It takes the scenario and
the drawn workers as they are and returns plain records the planner wraps, so that it imports
neither the scenario nor the plan.
"""

from __future__ import annotations

import bisect
import math
import os
from dataclasses import dataclass, field, replace

import numpy as np

from emulator.planning.problems import Problem
from emulator.planning.traces import KINDS, GroupTraces, Series, TraceFile

MAX_TRACE_EVENTS = 100_000  # events all traces of a scenario may expand into
MACHINE_CPU_FLOOR = 0.05


@dataclass
class Expansion:
    """What the traces give the plan: workers with their values at time zero, events, problems."""

    workers: list
    events: list[tuple[float, str, str, dict, str]] = field(default_factory=list)  # time, action, target, params, path
    problems: list[Problem] = field(default_factory=list)


class _TooMany(Exception):
    pass


class _GroupProblem(ValueError):
    """A problem of one group's traces found at planning time, with the path of the field."""

    def __init__(self, path: str, message: str):
        self.path, self.message = path, message
        super().__init__(f"{path}: {message}")


def _rng(seed: int, group: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFF, 17, group, purpose]))


def expand(scenario, workers: list, horizon_s: float, resolve) -> Expansion:
    """Every group's traces as timed events over ``[0, horizon_s)`` of training time.

    ``workers``: the drawn :class:`~emulator.planning.plan.DevicePlan` objects (returned with the
    values the traces give them at time zero); ``resolve``: targets -> worker indices, for the
    check that no timed ``cpus``/``link`` fault fights a trace over the same worker."""
    out = Expansion(list(workers))
    budget = [MAX_TRACE_EVENTS]
    start = 0
    for g, group in enumerate(scenario.workers):
        spec = getattr(group, "traces", None)
        indices = list(range(start, start + group.count))
        start += group.count
        if spec is None:
            continue
        path = f"workers[{g}].traces"
        try:
            _expand_group(scenario, g, spec, indices, horizon_s, out, budget, path)
        except _TooMany as exc:
            out.problems.append(Problem(path, str(exc)))
            return out
        except _GroupProblem as exc:
            out.problems.append(Problem(exc.path, exc.message))
            continue
        out.problems += _conflicts(scenario, spec, set(indices), path, resolve)
    return out


def _conflicts(scenario, spec: GroupTraces, indices: set[int], path: str, resolve) -> list[Problem]:
    traced = {"link": spec.link is not None,
              "cpus": spec.compute is not None}
    problems = []
    for i, event in enumerate(scenario.faults.at):
        if event.action in traced and traced[event.action]:
            try:
                hit = sorted(indices & set(resolve(event.targets)))
            except ValueError:
                continue  # reported by the scenario's own target check
            if hit:
                kind = "link" if event.action == "link" else "compute"
                problems.append(Problem(f"faults.at[{i}]", f"a timed {event.action} change of worker {hit[0]}, whose {kind} comes from "
                                                         f"a trace ({path}.{kind}): one or the other"))
    return problems


def _expand_group(scenario, g: int, spec: GroupTraces, indices: list[int], horizon_s: float, out: Expansion,
                  budget: list[int], path: str) -> None:
    count = len(indices)
    ids = _choose_devices(scenario.seed, g, spec, count, path)
    offsets = _offsets(scenario.seed, g, spec, count, path)
    end = min(horizon_s, scenario.training.duration or math.inf)
    population = spec.file("population")
    drawn = _draw_population(scenario, g, spec, population, count) if population else [{}] * count
    for k, index in enumerate(indices):
        worker = out.workers[index]
        device_id = ids[k] if ids else None
        base = {"cpus": drawn[k].get("cpus", worker.cpus),
                "uplink_bps": drawn[k].get("uplink_bps", worker.link.uplink_bps),
                "downlink_bps": drawn[k].get("downlink_bps", worker.link.downlink_bps)}
        initial = dict(base)
        for kind, action in (("link", "link"), ("compute", "cpus")):
            trace = spec.file(kind)
            if trace is None:
                continue
            series = trace.series[device_id if trace.per_device else ""]
            length = spec.length or trace.length
            try:
                first, changes = _steps(series, length, offsets[k], spec.speedup, spec.loop, end)
            except _TooMany:
                raise _too_many(trace, spec, end) from None
            first_params = _params(kind, first, base)
            initial.update(first_params)
            last = first_params
            for t, values in changes:
                params = _params(kind, values, base)
                params = {key: v for key, v in params.items() if last.get(key) != v}
                last = {**last, **params}
                if params:
                    _emit(out, budget, (t, action, worker.name, params, f"{path}.{kind}"), trace, spec, end)
        availability = spec.file("availability")
        if availability is not None:
            series = availability.series[device_id]
            length = spec.length or availability.length
            down, up = ("pause", "resume") if spec.offline == "pause" else ("crash", "restart")
            try:
                toggles = _toggles(series, length, offsets[k], spec.speedup, spec.loop, end)
            except _TooMany:
                raise _too_many(availability, spec, end) from None
            for t, online in toggles:
                _emit(out, budget, (t, up if online else down, worker.name, {}, f"{path}.availability"), availability, spec, end)
        link = replace(worker.link, uplink_bps=initial["uplink_bps"], downlink_bps=initial["downlink_bps"],
                       **{key: initial[key] for key in ("delay_s", "loss") if key in initial})
        out.workers[index] = replace(worker, cpus=round(initial["cpus"], 6), link=link)


def _too_many(trace: TraceFile, spec: GroupTraces, end: float) -> _TooMany:
    return _TooMany(f"{trace.path} (with the scenario's other traces) expands into more than {MAX_TRACE_EVENTS:,} events over "
                    f"{end:g} s of training at speedup {spec.speedup:g}: lower the speedup, coarsen the trace "
                    "(a longer --window of emulate traces convert or generate), or shorten training.duration")


def _emit(out: Expansion, budget: list[int], event: tuple, trace: TraceFile, spec: GroupTraces, end: float) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise _too_many(trace, spec, end)
    out.events.append(event)


def _params(kind: str, values: dict, base: dict) -> dict:
    """A row's values as the plan's link / cpus fields (rates rounded to whole bits/s)."""
    if kind == "compute":
        cpus = values["cpus"] if "cpus" in values else values["cpu_factor"] * base["cpus"]
        return {"cpus": round(cpus, 6)}
    out = {}
    for quantity, key in (("up", "uplink_bps"), ("down", "downlink_bps"), ("delay", "delay_s"), ("loss", "loss")):
        if quantity in values:
            out[key] = float(round(values[quantity])) if quantity in ("up", "down") else round(values[quantity], 6)
    return out


def _cycles(offset: float, stop: float, length: float, looping: bool):
    """The trace time at which each replay of the trace starts, from the one holding ``offset`` to ``stop``."""
    if not looping:
        yield 0.0
        return
    k = math.floor(offset / length)
    while k * length < stop:
        yield k * length
        k += 1


def _steps(series: Series, length: float, offset: float, speedup: float, loop: bool, end: float):
    """(values at run time 0, [(run time, values)]) of a piecewise-constant series read from trace
    time ``offset`` on, ``speedup`` trace seconds per run second, looped every ``length``; a value
    equal to the one before is no change. Raises _TooMany past MAX_TRACE_EVENTS changes."""
    times = series.times
    looping = loop and length > 0 and len(times) > 1
    def at(tau: float):
        return series.values[bisect.bisect_right(times, tau % length if looping else tau) - 1]
    first = current = at(offset)
    changes = []
    stop = offset + end * speedup
    for base in _cycles(offset, stop, length, looping):
        before = len(changes)
        for tau, values in zip(times, series.values):
            tau += base
            if offset < tau < stop and values != current:
                changes.append((round((tau - offset) / speedup, 3), values))
                current = values
                if len(changes) > MAX_TRACE_EVENTS:
                    raise _TooMany()
        if base > offset and len(changes) == before:
            break  # a whole replay without a change: the trace is constant from here on
    return first, changes


def _toggles(series: Series, length: float, offset: float, speedup: float, loop: bool, end: float):
    """[(run time, online)] where a device's availability changes; the first at 0 when it starts offline."""
    intervals = _merged(list(zip(series.times, series.values)))
    looping = loop and length > 0
    def online(tau: float) -> bool:
        if looping:
            tau = tau % length
        i = bisect.bisect_right(intervals, (tau, math.inf)) - 1
        return i >= 0 and intervals[i][0] <= tau < intervals[i][1]
    bounds = sorted({b % length if looping else b for interval in intervals for b in interval})
    state = online(offset)
    out = [] if state else [(0.0, False)]
    stop = offset + end * speedup
    for base in _cycles(offset, stop, length, looping):
        before = len(out)
        for bound in bounds:
            tau = bound + base
            if offset < tau < stop and online(tau) != state:
                state = not state
                out.append((round((tau - offset) / speedup, 3), state))
                if len(out) > MAX_TRACE_EVENTS:
                    raise _TooMany()
        if base > offset and len(out) == before:
            break  # a whole replay without a change: always online (or never) from here on
    return out


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in intervals:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _choose_devices(seed: int, g: int, spec: GroupTraces, count: int, path: str) -> list[str] | None:
    """The trace device id each worker of the group replays (None: no per-device trace)."""
    files = [spec.file(kind) for kind in ("availability", "link", "compute") if spec.file(kind) is not None and spec.file(kind).per_device]
    if not files:
        if isinstance(spec.devices, tuple):
            raise _GroupProblem(f"{path}.devices", "names device ids, but no availability, link or compute file has a device column")
        return None
    known = files[0].devices
    if isinstance(spec.devices, tuple):
        if len(spec.devices) != count:
            raise _GroupProblem(f"{path}.devices", f"{len(spec.devices)} device ids for a group of {count}")
        chosen = list(spec.devices)
    else:
        if len(known) < count:
            raise _GroupProblem(f"{path}.{next(k for k in KINDS if spec.file(k) is files[0])}",
                             f"{files[0].path} has {len(known)} devices, the group needs {count}")
        if spec.devices == "in_order":
            chosen = known[:count]
        else:
            picks = _rng(seed, g, 0).choice(len(known), size=count, replace=False)
            chosen = [known[int(i)] for i in picks]
    for trace in files:
        for i, device in enumerate(chosen):
            if device not in trace.series:
                sample = ", ".join(trace.devices[:5]) + (" ..." if len(trace.devices) > 5 else "")
                where = f"{path}.devices[{i}]" if isinstance(spec.devices, tuple) else f"{path}.{trace.kind}"
                raise _GroupProblem(where, f"unknown device id {device!r}: {trace.path} has no rows for it (its {len(trace.devices)} "
                                        f"devices: {sample})")
    return chosen


def _offsets(seed: int, g: int, spec: GroupTraces, count: int, path: str) -> list[float]:
    offset = spec.offset
    if isinstance(offset, tuple):
        if len(offset) != count:
            raise _GroupProblem(f"{path}.offset", f"{len(offset)} offsets for a group of {count}")
        return list(offset)
    if isinstance(offset, dict) or offset == "random":
        if offset == "random":
            lengths = [spec.length or spec.file(k).length for k in ("availability", "link", "compute") if spec.file(k)]
            if not lengths:
                raise _GroupProblem(f"{path}.offset", "random needs an availability, link or compute trace (a length to draw in)")
            low, high = 0.0, max(lengths)
        else:
            low, high = offset["uniform"]
        return [round(float(v), 3) for v in _rng(seed, g, 1).uniform(low, high, count)]
    return [float(offset)] * count


def machine_cpu_range(workers: int) -> tuple[float, float]:
    """``cpu_range: machine``: from 0.05 core to this machine's cores shared by every worker (at most 1)."""
    high = min(1.0, (os.cpu_count() or 1) / max(1, workers))
    return (MACHINE_CPU_FLOOR, max(MACHINE_CPU_FLOOR, round(high, 3)))


def scale_speeds(speeds: np.ndarray, low: float, high: float, scaling: str) -> np.ndarray:
    """Speeds onto CPU quotas in [low, high], order kept: ``log`` maps log(speed) linearly from the
    population's [min, max] (ratios shrink or stretch alike); ``rank`` maps each speed's quantile
    onto a log-uniform [low, high] (outliers cannot squeeze the rest)."""
    if scaling == "rank":
        order = np.argsort(np.argsort(speeds, kind="stable"), kind="stable")
        position = order / max(1, len(speeds) - 1)
    else:
        logs = np.log(speeds)
        span = logs.max() - logs.min()
        position = (logs - logs.min()) / span if span > 0 else np.ones_like(logs)
    return low * (high / low) ** position


def _draw_population(scenario, g: int, spec: GroupTraces, population: TraceFile, count: int) -> list[dict]:
    """``count`` devices drawn from the population with the scenario's seed (without replacement
    when it has enough): their CPU quota (speed scaled onto ``cpu_range``) and rates."""
    rows = [values for s in population.series.values() for values in s.values]
    picks = _rng(scenario.seed, g, 2).choice(len(rows), size=count, replace=count > len(rows))
    cpus = None
    if "speed" in population.columns:
        low, high = machine_cpu_range(scenario.worker_count) if spec.cpu_range == "machine" else spec.cpu_range
        cpus = scale_speeds(np.array([r["speed"] for r in rows], dtype=float), low, high, spec.scaling)
    out = []
    for i in picks:
        row = rows[int(i)]
        device = {}
        if cpus is not None:
            device["cpus"] = round(float(cpus[int(i)]), 6)
        if "up" in row:
            device["uplink_bps"] = float(round(row["up"]))
        if "down" in row:
            device["downlink_bps"] = float(round(row["down"]))
        out.append(device)
    return out


__all__ = ["Expansion", "MAX_TRACE_EVENTS", "expand", "machine_cpu_range", "scale_speeds"]
