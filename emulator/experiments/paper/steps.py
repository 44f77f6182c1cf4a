"""Step-size grids: each method at each step of its own grid, paired seeds, and the step chosen.

A method's best step is only known when the grid brackets it: the chosen step must lie strictly
inside the grid (a larger and a smaller step were tried and did worse), else the section says
"at the edge" and the grid must grow. The choice, per method (:func:`choose`):

- a step qualifies when every repetition at it completed and trained (none diverged or died):
  a step that diverges once in two seeds is not a step to recommend;
- among those, the best mean final accuracy (the mean of each run's last evaluations,
  :data:`analysis.outcomes.LAST_K`), ties to the larger step.

Grids run at the length of the comparison they feed (the same updates, devices and evaluation
interval), with at least two seeds: a 2,000-update grid favours steps that learn fast early.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from analysis.outcomes import trained
from emulator.experiments.paper.runner import row_failure
from emulator.experiments.paper.results import Section
from emulator.experiments.records import experiment_records


STEP = ":training.learning_rate="


def with_alpha(method: str, alpha: float) -> str:
    """A method spec at step size ``alpha`` (``adacomp:c=0.01`` -> ``adacomp:c=0.01:training.learning_rate=0.02``)."""
    return f"{method}{STEP}{alpha:g}"


def grids_of(specs) -> dict[str, tuple[float, ...]]:
    """The grids that method specs at their steps (:func:`with_alpha`) cover: per method, its steps,
    largest first; a spec without a step is none of them."""
    grids: dict[str, set[float]] = {}
    for spec in specs:
        method, _, alpha = spec.partition(STEP)
        if alpha:
            grids.setdefault(method, set()).add(float(alpha))
    return {method: tuple(sorted(alphas, reverse=True)) for method, alphas in grids.items()}


def grid_specs(grids: dict[str, tuple[float, ...]]) -> list[str]:
    """Every method at every step of its grid, in grid order."""
    return [with_alpha(method, alpha) for method, steps in grids.items() for alpha in steps]


@dataclass(frozen=True)
class Choice:
    """A method's chosen step, whether the grid brackets it, and what each step scored."""

    method: str
    alpha: float | None  # None: no step trained in every repetition, or the grid is not all run yet
    inside: bool  # strictly inside the grid: a larger and a smaller step were tried
    scores: dict = field(default_factory=dict)  # alpha -> {"trained": k, "runs": n, "accuracy": mean last-k or None}
    missing: int = 0  # runs of the grid not made yet: no step is chosen from part of a grid

    @property
    def verdict(self) -> str:
        if self.missing:
            return f"not chosen yet: {self.missing} run(s) of the grid still to make"
        if self.alpha is None:
            return "none trained in every repetition"
        return f"{self.alpha:g}" + ("" if self.inside else " (at the edge of the grid: extend it)")


def choose(rows: list[dict], grids: dict[str, tuple[float, ...]], failed=lambda row: False, repeat: int = 1) -> dict[str, Choice]:
    """Per method of ``grids``, its :class:`Choice` from a comparison's rows (``failed(row)``: the run
    did not complete; ``repeat``: the runs each step needs). A grid with a step short of its runs (an
    interrupted grid, or part of its records) chooses nothing: a step picked from one seed of two, or
    before a better step was tried, is not the grid's choice."""
    out = {}
    for method, steps in grids.items():
        scores, candidates, missing = {}, [], 0
        for alpha in steps:
            mine = [r for r in rows if r["method"] == with_alpha(method, alpha)]
            missing += max(0, repeat - len(mine))
            done = [r for r in mine if not failed(r)]
            good = [r for r in done if trained(r) and _accuracy(r) is not None]
            accuracy = sum(_accuracy(r) for r in good) / len(good) if good else None
            scores[alpha] = {"trained": len(good), "runs": len(mine), "accuracy": accuracy}
            if mine and len(good) == len(mine):
                candidates.append((accuracy, alpha))
        if missing or not candidates:
            out[method] = Choice(method, None, False, scores, missing)
            continue
        alpha = max(candidates)[1]
        out[method] = Choice(method, alpha, min(steps) < alpha < max(steps), scores)
    return out


def _accuracy(row: dict) -> float | None:
    """A run's final accuracy: the mean of its last evaluations (its last one for older rows)."""
    value = row.get("final_accuracy_last_k")
    return row.get("final_accuracy") if value is None else value


def step_choices(profile, out) -> dict[str, Choice]:
    """Per method of the profile's step grids, its :class:`Choice` (:func:`choose`: every
    repetition trained, best mean final accuracy, ties to the larger step; nothing while the grid
    lacks runs). From the grid's runs under ``out`` when they are there and whole, else from its
    records (``<out>/records/alphas``: the committed ones, which the driver copies in from
    ``--records``), so a later session's experiments build on a grid run in an earlier one on
    another machine."""
    grids = profile.step_grids()
    if not grids:
        return {}
    path = out / "runs" / "alphas" / "compare.json"
    picked = choices(profile, json.loads(path.read_text())["methods"], path.parent) if path.exists() else {}
    if not picked or any(c.missing for c in picked.values()):  # no grid run here, or an interrupted one: the records may hold it all
        records = experiment_records(out / "records", "alphas")
        picked = choose([r["row"] for r in records], grids, failed=lambda row: row.get("status") != "completed",
                        repeat=profile.alpha_repeat)
    return picked


def settled_steps(profile, out) -> tuple[dict[str, float], str | None]:
    """The chosen step per method (a method none of whose steps trained in every repetition, or
    whose grid is not all run yet, left out) and what the grids still lack (``asgd: 2 run(s)``,
    ...; None once every step is settled), from one reading of the grid's runs or records: the
    experiments that run at the chosen steps wait for the whole grid, not run at a guess."""
    picked = step_choices(profile, out)
    waiting = "; ".join(f"{method}: {c.missing} run(s)" for method, c in picked.items() if c.missing)
    return {m: c.alpha for m, c in picked.items() if c.alpha is not None}, waiting or None


def waiting_section(title: str, name: str, waiting: str) -> Section:
    """The section of an experiment that runs at the chosen steps while the grid lacks runs: a failure, with what to run."""
    why = (f"{name}: not run, since the step-size grid is not complete ({waiting}); run `make figures PROFILE=paper "
           f"ONLY=alphas RECORDS=docs/reproduction/records` first")
    return Section(title, [f"**FAILED** {why}."], [], "-", [why])


def choices(profile, rows: list[dict], directory: Path) -> dict[str, Choice]:
    return choose(rows, profile.step_grids(), failed=lambda row: row_failure(directory, row) is not None, repeat=profile.alpha_repeat)


def choice_table(grids: dict[str, tuple[float, ...]], picked: dict[str, Choice]) -> list[str]:
    """Per method, what each step of its grid scored and the step chosen (markdown)."""
    lines = ["| method | step: final accuracy (runs that trained) | chosen |", "|---|---|---|"]
    for method, grid in grids.items():
        cells = "; ".join(f"{alpha:g}: {score_cell(picked[method].scores[alpha])}" for alpha in grid)
        lines.append(f"| `{method}` | {cells} | {picked[method].verdict} |")
    return lines


def score_cell(score: dict) -> str:
    """``0.812 (2 of 2 trained)``, ``- (0 of 2 trained)``."""
    accuracy = "-" if score["accuracy"] is None else f"{score['accuracy']:.3f}"
    return f"{accuracy} ({score['trained']} of {score['runs']} trained)"


__all__ = ["Choice", "choice_table", "choices", "choose", "grid_specs", "grids_of", "score_cell", "settled_steps", "step_choices",
           "waiting_section", "with_alpha"]
