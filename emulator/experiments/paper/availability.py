"""``make figures``' availability experiment: what devices that come and go cost, from traces.

Beyond the paper: six phones replay an availability trace (scenarios/traces/availability.yaml:
30 minutes of trace at 20x, offline is a pause) at three levels of availability, 100 %, 70 % and
40 % of the time online (the trace files of docs/TRACES.md), with ``emulate sweep``. The section
gives each level's accuracy and updates, and how much the workers were online as planned (the
plan's trace events), beside the accuracy over time. Sized like the profile's crash experiment
(its duration and worker count, as many levels as it has crash rates), so a profile stays as
long as it was plus one sweep of that size.
"""

from __future__ import annotations

from pathlib import Path

from analysis.runs import load_collection
from emulator.experiments.paper.plots import sweep_figures
from emulator.experiments.paper.profiles import ROOT
from emulator.experiments.paper.results import Section
from emulator.experiments.paper.runner import run_sweep_into
from emulator.experiments.paper.tables import sweep_section

SCENARIO = ROOT / "scenarios" / "traces" / "availability.yaml"
KEY = "workers[0].traces.availability"
LEVELS = {100: "availability-100.csv", 70: "availability-70.csv", 40: "availability-40.csv"}
CHOSEN = {1: (40,), 2: (100, 40)}  # levels by the profile's number of crash rates (3 or more: all)


def levels_for(profile) -> tuple[int, ...]:
    return CHOSEN.get(len(profile.crash_rates), tuple(LEVELS))


def online_share(plan: dict) -> float | None:
    """The share of worker-time online over training, as the plan's trace pauses and resumes say."""
    duration = (plan.get("training") or {}).get("duration")
    workers = [w["name"] for w in plan.get("workers", [])]
    if not duration or not workers:
        return None
    offline = 0.0
    for name in workers:
        down_since = None
        for event in sorted((e for e in plan.get("events", []) if e.get("target") == name and e.get("source") == "trace"),
                            key=lambda e: e["time_s"]):
            if event["action"] in ("pause", "crash") and down_since is None:
                down_since = event["time_s"]
            elif event["action"] in ("resume", "restart") and down_since is not None:
                offline += event["time_s"] - down_since
                down_since = None
        if down_since is not None:
            offline += duration - down_since
    return 1.0 - offline / (duration * len(workers))


def availability_experiment(profile, out: Path, backend: str, dataset: str, say) -> Section:
    overrides = [o for o in profile.overrides("crash", dataset) if not o.startswith("faults.")]  # the crash sweep's size
    files = [LEVELS[level] for level in levels_for(profile)]
    result = run_sweep_into("availability", SCENARIO, [f"{KEY}={','.join(files)}"], overrides, out, backend, say,
                                  profile.sweep_repeat)
    collection = load_collection(result["directory"])
    body, failures = sweep_section(collection, list(collection.grid), "availability")
    shares = {}
    for run in collection.runs:
        value = collection.values.get(run.path.name, {}).get(KEY)
        share = online_share(run.plan)
        if value is not None and share is not None:
            shares.setdefault(value, []).append(share)
    lines = ["| trace file | workers online, as planned (share of worker-time) |", "|---|---:|"]
    lines += [f"| {value} | {sum(s) / len(s):.0%} |" for value, s in shares.items()]
    intro = ["Beyond the paper: the phones of scenarios/traces/availability.yaml (six; the command says how many this "
             "profile runs) replay availability traces in which devices are online 100 %, 70 % or 40 % of the time on average "
             "(30 minutes of trace at 20x; offline is a pause, the worker's push waits), the same devices and offsets at each "
             "level. Each run's share online is its plan's.", "", *lines, ""]
    return Section("Device availability from traces", intro + body, sweep_figures("availability", collection, out, KEY),
                   result["command"], failures, runs=[result["runs"]])


__all__ = ["availability_experiment", "levels_for", "online_share"]
