"""The runs the paper's claims need beyond the 2026-12-03 ones, planned before they run, and the
budget of every experiment of a profile.

- ``claim6``: Comp-c against AdaComp where staleness is large (64 devices): first each one's step
  grid at the comparison's length with paired seeds (``claim6-steps``), then the comparison
  (``claim6``) of both at the shared step and each at its own chosen step, with many paired
  seeds (:attr:`Profile.claim6_repeat`, 10 in the paper profile): divergence is a yes/no
  outcome, and 3 seeds cannot tell 2 of 3 from 0 of 3 (Fisher p = 0.4);
- ``c191``: AdaComp and Comp-c at the c where 191x falls per update on each byte basis, each at
  the chosen step of the nearest c of the step grids, so that 191x has an accuracy beside it;
- ``equal_step``: AdaComp against staleness-aware ASGD at the same step (the paper's 0.1 and
  AdaComp's chosen step).

Each experiment is planned by a pure function (:func:`plan_claim6_grid`, :func:`plan_claim6`,
:func:`plan_c191`, :func:`plan_equal_step`) that a test checks without running anything, and
run through ``emulate compare`` (resumable, one record per run). :func:`budget` estimates each
experiment's runs and minutes from the run times measured on this machine, so a long profile
can be run in parts (``make figures PROFILE=paper ONLY="claim6"``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from emulator.experiments.paper import steps
from emulator.experiments.paper.profiles import Profile
from emulator.experiments.paper.results import Section
from emulator.experiments.paper.runner import comparison_failures, run_comparison
from emulator.experiments.paper.steps import settled_steps, waiting_section, with_alpha


@dataclass(frozen=True)
class Planned:
    """One comparison an experiment will run: its directory name, method specs, overrides, repetitions."""

    name: str
    methods: tuple[str, ...]
    overrides: tuple[str, ...]
    repeat: int

    @property
    def runs(self) -> int:
        return len(self.methods) * self.repeat


def _unique(specs) -> tuple[str, ...]:
    return tuple(dict.fromkeys(specs))


def plan_claim6_grid(profile: Profile, dataset: str) -> Planned | None:
    if profile.claim6_alpha is None or not profile.claim6_grid:
        return None
    grids = {method: profile.claim6_grid for method in profile.claim6_methods}
    return Planned("claim6-steps", tuple(steps.grid_specs(grids)), tuple(profile.overrides("claim6", dataset)),
                   profile.claim6_grid_repeat)


def plan_claim6(profile: Profile, dataset: str, best: dict[str, float]) -> Planned | None:
    """Both methods at the shared step, then each at its chosen step (``best``; left out until known)."""
    if profile.claim6_alpha is None:
        return None
    specs = [with_alpha(m, profile.claim6_alpha) for m in profile.claim6_methods]
    specs += [with_alpha(m, best[m]) for m in profile.claim6_methods if best.get(m) is not None]
    return Planned("claim6", _unique(specs), tuple(profile.overrides("claim6", dataset)), profile.claim6_repeat)


def _c_of(spec: str) -> float | None:
    found = re.search(r"(?:^|:)c=([0-9.eE+-]+)", spec)
    return float(found.group(1)) if found else None


def nearest_step(method: str, best: dict[str, float]) -> float | None:
    """The chosen step of the grid method of the same name nearest in log c (``adacomp:c=0.0016`` ->
    ``adacomp:c=0.001``'s); None when no grid method of that name has one."""
    name, c = method.split(":")[0], _c_of(method)
    candidates = [(abs(math.log(_c_of(m) / c)) if c and _c_of(m) else math.inf, m) for m in best if m.split(":")[0] == name]
    return best[min(candidates)[1]] if candidates else None


def plan_c191(profile: Profile, dataset: str, best: dict[str, float]) -> Planned | None:
    if not profile.c191_methods:
        return None
    specs = [with_alpha(m, alpha) if (alpha := nearest_step(m, best)) is not None else m for m in profile.c191_methods]
    return Planned("c191", tuple(specs), tuple(profile.overrides("c191", dataset)), profile.c191_repeat)


def plan_equal_step(profile: Profile, dataset: str, best: dict[str, float]) -> Planned | None:
    """Each method of ``equal_step_methods`` at each of the profile's steps and at AdaComp's chosen one."""
    if not profile.equal_step_alphas:
        return None
    adacomp = next((m for m in profile.equal_step_methods if m.startswith("adacomp")), None)
    alphas = list(profile.equal_step_alphas) + ([best[adacomp]] if adacomp and best.get(adacomp) is not None else [])
    specs = [with_alpha(m, a) for a in dict.fromkeys(alphas) for m in profile.equal_step_methods]
    return Planned("equal-step", _unique(specs), tuple(profile.overrides("equal_step", dataset)), profile.equal_step_repeat)


def _run(planned: Planned, out: Path, backend: str, say) -> dict:
    return run_comparison(planned.name, list(planned.methods), list(planned.overrides), planned.repeat, out, backend, say,
                          from_records=True)


def _section(title: str, intro: str, results: list[dict]) -> Section:
    from emulator.experiments.paper.tables import compare_tables

    body = [intro, ""]
    for result in results:
        body += [f"### `{result['name']}`", "", *compare_tables(Path(result["directory"])), ""]
    failures = [f for result in results for f in comparison_failures(result, result["name"])]
    return Section(title, body, [], " ; ".join(r["command"] for r in results), failures, runs=[r["runs"] for r in results])


def claim6_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    grid = plan_claim6_grid(profile, dataset)
    if profile.claim6_alpha is None:
        return Section("Claim 6: AdaComp against Comp-c where staleness is large", ["Not in this profile."], [], "-")
    results, best = [], {}
    if grid is not None:
        results.append(_run(grid, out, backend, say))
        rows = results[-1]["table"]["methods"]
        choices = steps.choose(rows, {m: profile.claim6_grid for m in profile.claim6_methods}, repeat=profile.claim6_grid_repeat)
        best = {m: c.alpha for m, c in choices.items() if c.alpha is not None}
        say("claim 6 steps: " + ", ".join(f"{m} {c.verdict}" for m, c in choices.items()))
    results.append(_run(plan_claim6(profile, dataset, best), out, backend, say))
    intro = (f"Comp-c against AdaComp at 64 devices: at the shared step {profile.claim6_alpha:g} and each at its own chosen "
             f"step of the grid {', '.join(f'{a:g}' for a in profile.claim6_grid)} ({profile.claim6_grid_repeat} paired seeds "
             f"a step, the comparison's length), {profile.claim6_repeat} paired seeds. The claim is about divergence: its "
             "rates and Fisher's exact test come first; accuracy is compared over the seeds where both trained.")
    return _section("Claim 6: AdaComp against Comp-c where staleness is large", intro, results)


def c191_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    best, waiting = settled_steps(profile, out)
    if waiting:
        return waiting_section("Where 191x falls: accuracy at c = 0.16 % and 0.39 %", "c191", waiting)
    planned = plan_c191(profile, dataset, best)
    if planned is None:
        return Section("Where 191x falls: accuracy at c = 0.16 % and 0.39 %", ["Not in this profile."], [], "-")
    intro = ("AdaComp and Comp-c at the c where 191x per update falls on each byte basis (the bytes section: about 0.16 % "
             "in the authors' format, 0.39 % on the compact wire), each at the chosen step of the nearest c of the step "
             "grids (the paper's 0.1 where no step of its grid trained).")
    return _section("Where 191x falls: accuracy at c = 0.16 % and 0.39 %", intro, [_run(planned, out, backend, say)])


def equal_step_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    best, waiting = settled_steps(profile, out)
    if waiting:
        return waiting_section("AdaComp against staleness-aware ASGD at equal steps", "equal_step", waiting)
    planned = plan_equal_step(profile, dataset, best)
    if planned is None:
        return Section("AdaComp against staleness-aware ASGD at equal steps", ["Not in this profile."], [], "-")
    intro = ("Staleness-aware ASGD (alpha / d, dense) against AdaComp (alpha / sigma per coordinate, c = 1 %) at the same "
             "alpha: the paper's 0.1 and AdaComp's chosen step.")
    return _section("AdaComp against staleness-aware ASGD at equal steps", intro, [_run(planned, out, backend, say)])


# -- the budget ----------------------------------------------------------------------------

# Minutes per run on this machine (2 cores, Docker, Fashion-MNIST), from the wall time of whole
# invocations (docs/REPRODUCTION.md states each). 64 devices for 20,000 updates: the 2026-12-03/04
# budget of 92 min for 27 runs fell short by half; the committed records sum 4.5-5.6 min of boot and
# training a run (alphas 200 min / 42, methods 120 / 27, c191 61 / 12), c191's invocation took 64 min
# for 12 runs, equal_step's 4,255 s for 12, federated's records sum 179 min for 36 (teardown adds
# about 10 %). 64 devices for 2,000 updates: 21 min for 16 runs; staleness 1,684 s / 18; ingress
# 2,277 s / 18, heterogeneity 1,433 s / 9, crashes 1,434 s / 9, availability 1,498 s / 9 (2026-12-07); two-way 7,777 s / 48;
# two-way time 1,661 s / 6; servers 61 min / 12.
MINUTES_PER_RUN = {"bytes": 0.0, "alphas": 64 / 12, "methods": 64 / 12, "claim6": 21 / 16, "c191": 64 / 12,
                   "equal_step": 4255 / 12 / 60, "staleness": 1684 / 18 / 60, "ingress": 2277 / 18 / 60,
                   "heterogeneity": 1433 / 9 / 60, "crash": 1434 / 9 / 60, "availability": 1498 / 9 / 60,
                   "two_way": 7777 / 48 / 60,
                   "two_way_time": 1661 / 6 / 60, "servers": 61 / 12, "federated": 179 * 1.1 / 36}


def budget(profile: Profile, dataset: str = "fashion-mnist") -> list[tuple[str, int, float]]:
    """(experiment, runs, estimated minutes) for every experiment of ``profile``, the step-dependent
    comparisons at their largest (every method's chosen step differs from the shared one)."""
    from emulator.experiments.paper.availability import levels_for

    grids = profile.step_grids()
    everything = {m: 0.0 for m in grids}  # placeholder steps: the largest plans
    counts = {
        "bytes": 0,
        "alphas": sum(len(g) for g in grids.values()) * profile.alpha_repeat,
        "methods": (len(profile.methods) + len(grids)) * profile.repeat,
        "ingress": len(profile.ingress_workers) * (1 if any(o.startswith("method") for o in profile.ingress_overrides) else 2)
        * profile.sweep_repeat,
        "heterogeneity": len(profile.heterogeneity) * profile.sweep_repeat,
        "crash": len(profile.crash_rates) * profile.sweep_repeat,
        "staleness": len(profile.staleness_workers) * len(profile.staleness_methods) * profile.staleness_repeat,
        "two_way": len(profile.two_way_links) * len(profile.two_way_workers) * len(profile.two_way_methods) * profile.two_way_repeat,
        "two_way_time": len(profile.two_way_time_workers) * len(profile.two_way_time_methods) * profile.two_way_time_repeat,
        "availability": len(levels_for(profile)) * profile.sweep_repeat,
        "claim6": sum(p.runs for p in (plan_claim6_grid(profile, dataset),
                                      plan_claim6(profile, dataset, {m: -1.0 for m in profile.claim6_methods})) if p),
        "c191": (p.runs if (p := plan_c191(profile, dataset, everything)) else 0),
        "equal_step": (p.runs if (p := plan_equal_step(profile, dataset, {m: -1.0 for m in profile.equal_step_methods}))
                       else 0),
        "servers": len(profile.servers_methods) * profile.servers_repeat * len(profile.servers_links),
        "federated": len(profile.federated_links) * len(profile.federated_methods) * profile.federated_repeat,
    }
    return [(name, runs, runs * MINUTES_PER_RUN.get(name, 0.0)) for name, runs in counts.items()]


def budget_text(profile: Profile, only=None) -> str:
    rows = [(n, r, m) for n, r, m in budget(profile) if not only or n in only]
    lines = ["| experiment | runs | estimated minutes |", "|---|---:|---:|"]
    lines += [f"| {name} | {runs} | {minutes:.0f} |" for name, runs, minutes in rows]
    lines.append(f"| all | {sum(r for _, r, _ in rows)} | {sum(m for _, _, m in rows):.0f} |")
    return "\n".join(lines)


__all__ = ["MINUTES_PER_RUN", "Planned", "budget", "budget_text", "c191_experiment", "claim6_experiment",
           "equal_step_experiment", "nearest_step", "plan_c191", "plan_claim6", "plan_claim6_grid", "plan_equal_step"]
