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
        took = "" if section.seconds is None else f" Wall time this invocation: {section.seconds:,.0f} s."
        lines += [f"## {section.title}", "", f"Command: `{section.command}`.{took}", "", *section.body, ""]
        lines += [f"![{name}]({name})" for name in section.images] + [""]
    path = out / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path
