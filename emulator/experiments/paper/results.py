"""results.md: one section per experiment, and at the top, when anything failed, that this is no
reproduction (each failure with its cause)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MAKE_TARGETS = {"full": "`make figures` or ", "fast": "`make figures FAST=1` or ", "paper": "`make figures PROFILE=paper` or "}


@dataclass
class Section:
    """One experiment's part of results.md; ``failures`` name each run (or the experiment) that failed."""

    title: str
    body: list[str]
    images: list[str]
    command: str
    failures: list[str] = field(default_factory=list)
    seconds: float | None = None  # wall time of this invocation (runs reused from an earlier one cost ~0)
    runs: list[dict] = field(default_factory=list)  # per comparison or sweep: runs, reused, run_seconds (runner.run_counts)


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min" if minutes else f"{seconds:.0f} s"


def timing(section: Section) -> str:
    """What the section's runs cost: how many, how many were reused from an earlier invocation, their
    own run time, and the wall time of this invocation (which a reuse makes short)."""
    took = "" if section.seconds is None else f"wall time of this invocation {_duration(section.seconds)}"
    if not section.runs:
        return f" {took[0].upper()}{took[1:]}." if took else ""
    runs = sum(r["runs"] for r in section.runs)
    reused = sum(r["reused"] for r in section.runs)
    run_time = sum(r["run_seconds"] for r in section.runs)
    parts = [f"{runs} runs ({reused} reused from an earlier invocation, {runs - reused} run by this one)",
             f"their run time {_duration(run_time)} (boot and training, summed from their summaries)"]
    return " " + "; ".join(parts + ([took] if took else [])) + "."


def write_results(out: Path, meta: dict, sections: list[Section]) -> Path:
    """results.md: every section, and at the top, when anything failed, that this is no reproduction."""
    failures = [f for section in sections for f in section.failures]
    lines = ["# Reproducing Hardy, Le Merrer and Sericola (NCA 2017): measured results", ""]
    if failures:
        lines += [f"**INCOMPLETE: {len(failures)} experiment(s) or run(s) failed; the figures below are not a "
                  "reproduction.** Each failed row says why; fix the cause and rerun.", "",
                  *(f"- {f}" for f in failures), ""]
    lines += [f"Profile `{meta['profile']}`, backend `{meta['backend']}`, {meta['when']}, {meta['seconds']:.0f} s in all.",
              f"Dataset: **{meta['dataset']}** ({meta['dataset_source']}). Model: the paper's CNN (421,642 parameters "
              "on 28x28 images), batch 10, alpha 0.1; a method at another step size names it (`training.learning_rate=...`).", "",
              f"Reproduce with {MAKE_TARGETS.get(meta['profile'], '')}`python -m emulator.experiments.paper --profile {meta['profile']} "
              f"--backend {meta['backend']}`; each experiment's own command is below.", ""]
    for section in sections:
        lines += [f"## {section.title}", "", f"Command: `{section.command}`.{timing(section)}", "", *section.body, ""]
        lines += [f"![{name}]({name})" for name in section.images] + [""]
    path = out / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path
