"""One run as one library call: a scenario in, a run directory and its summary out.

:func:`run_scenario` is the pipeline that ``emulate run``, ``emulate compare``, ``emulate sweep``,
the benchmarks and the tests share, so that a scenario runs the same way whoever asks: load and
validate it (``--set`` overrides applied), plan it, check its data set, choose the backend, make
the run directory, and run the :class:`~emulator.control.controller.Emulation`.

Bad input raises before anything is made: :class:`~emulator.planning.problems.ScenarioError` (the
scenario, its plan or its data set), :class:`~emulator.backends.BackendUnavailable`,
:class:`~emulator.control.rundir.RunIdError` (a run id that is invalid or taken) or ``OSError`` (an
output root that cannot hold the run). A run that fails once started raises :class:`RunFailed`,
which carries what the run left; an interrupted run (Ctrl-C, SIGTERM) returns normally, its
status ``interrupted``, as it wrote everything up to the interruption.

It sits beside the controller rather than in it: the controller runs a plan on a backend; this
module turns what a user gives (a file, overrides, a backend name) into those.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from emulator import backends
from emulator.control import controller, simulation, workload  # used as backends.choose and controller.Emulation: the seams tests replace
from emulator.backends import Backend
from emulator.planning.plan import make_plan
from emulator.planning.problems import Problem, ScenarioError
from emulator.control.rundir import RunDirectory, check_new
from emulator.planning.loader import load_scenario
from emulator.planning.scenario import Scenario


@dataclass(frozen=True)
class Summary:
    """What a run leaves: ``summary.json``'s contents (``data``, see :mod:`emulator.control.summary`) and
    where its run directory is (``path``)."""

    data: dict
    path: Path

    @property
    def status(self) -> str:
        """``completed``, ``interrupted`` or ``failed``."""
        return self.data.get("status", "failed")


class RunFailed(RuntimeError):
    """The run started and failed; ``summary`` is what it left (``summary.json`` says why too),
    ``error`` the exception that ended it. The message is the summary's ``error`` field."""

    def __init__(self, summary: Summary, error: Exception):
        self.summary = summary
        self.error = error
        super().__init__(f"{type(error).__name__}: {error}")


def run_scenario(scenario: str | Path | Scenario, out_root: str | Path = "runs", *, overrides: Sequence[str] = (),
                 backend: str | Backend | None = None, run_id: str | None = None, text: str | None = None,
                 check_fidelity: bool = True, strict: bool = False, tolerance: float = 0.10,
                 progress_every_s: float = 0.0, say: Callable[[str], None] | None = None) -> Summary:
    """Run one scenario to the end into ``out_root/<run id>``; returns its :class:`Summary`.

    ``scenario``: a file, loaded here with ``overrides`` applied; or a :class:`Scenario` already
    validated (a sweep or a comparison loads every run before any runs), to which ``overrides``
    were applied already: they are only recorded then. ``text``: the scenario as written, kept as
    ``scenario.yaml`` (default: the file's text; for a Scenario, its YAML). ``backend``: a name
    (``auto``, ``local``, ``docker``, ``swarm``), a backend object built with options a name
    cannot give (a Docker image), or None for the scenario's own. ``run_id``: the directory's
    name (default: time, name, random). ``strict``: a fidelity check that finds a property off by
    more than ``tolerance`` fails the run. ``progress_every_s``: 0 for no progress lines.
    ``say``: where messages go (default: standard error).
    """
    say = say or _stderr
    if run_id is not None:
        check_new(out_root, run_id)  # a bad or taken id is refused before anything runs
    source = None if isinstance(scenario, Scenario) else str(scenario)
    try:
        if source is not None:
            scenario = load_scenario(source, list(overrides))[0]
        plan = make_plan(scenario)
        workload.check_scenario(scenario, plan)  # the data set and the user's code, imported and checked here first
    except ScenarioError as exc:
        if exc.source or source is None:
            raise
        raise ScenarioError(exc.problems, source) from None
    if text is None:
        text = Path(source).read_text() if source is not None else yaml.safe_dump(scenario.model_dump(mode="json", by_alias=True), sort_keys=False)
    backend_cls = None if isinstance(backend, Backend) else backends.choose(backend or scenario.backend, say=say)
    check_host(scenario, plan, type(backend) if backend_cls is None else backend_cls, say, source=source)
    refused = (backend_cls or type(backend)).refuses(plan)
    if refused:
        raise ScenarioError([Problem(path, why) for path, why in refused], source or "")
    clock = (backend_cls or type(backend)).clock
    runner = {"wall": controller.Emulation, "virtual": simulation.Simulation}[clock]  # looked up now: tests replace Emulation
    rundir = RunDirectory.create(out_root, plan.name, run_id)
    emulation = runner(
        plan, backend if backend_cls is None else backend_cls(say=say), rundir, scenario_text=text,
        resolved={"scenario": scenario.model_dump(mode="json", by_alias=True), "overrides": list(overrides)},
        say=say, progress_every_s=progress_every_s, strict=strict, check_fidelity=check_fidelity, tolerance=tolerance,
    )
    try:
        data = emulation.run()
    except Exception as exc:  # noqa: BLE001 - summary.json is written; the caller learns where
        raise RunFailed(Summary(_written_summary(rundir.path), rundir.path), exc) from exc
    return Summary(data, rundir.path)


def check_host(scenario: Scenario, plan, backend_cls: type[Backend], say: Callable[[str], None], *, cores: int | None = None,
               source: str | None = None) -> None:
    """What this machine can give the plan, on a backend whose devices share its cores (local,
    docker): a device whose CPU quota is above the machine's cores is refused (ScenarioError naming
    the field: that quota could never be met); quotas that add up to more are said (they cannot all
    be met at once, only when some devices wait)."""
    if not backend_cls.cpu_limited_by_host:
        return
    cores = cores or os.cpu_count() or 1
    groups = {group.name or f"group-{g}": g for g, group in enumerate(scenario.workers)}
    problems, seen = [], set()
    for device in plan.devices:
        field = f"{device.role}.cpus" if device.role != "worker" else f"workers[{groups.get(device.group, 0)}].cpus"
        if device.cpus > cores and field not in seen:
            seen.add(field)
            problems.append(Problem(field, f"{device.cpus:g} cores for {device.name}, but this machine has {cores} "
                                           f"and the {backend_cls.name} backend runs every device on it"))
    for i, event in enumerate(scenario.faults.at):
        if event.cpus is not None and event.cpus > cores:
            problems.append(Problem(f"faults.at[{i}].cpus", f"{event.cpus:g} cores, but this machine has {cores}"))
    if problems:
        raise ScenarioError(problems, source or "")
    total = sum(d.cpus for d in plan.devices)
    if total > cores + 1e-9:
        say(f"note: the devices' CPU quotas add up to {total:g} cores on this {cores}-core machine: "
            "they cannot all get their quota at once, only while some wait (on the network, or for the server)")


def _written_summary(path: Path) -> dict:
    try:
        return json.loads((path / "summary.json").read_text())
    except (OSError, ValueError):
        return {"status": "failed"}


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


__all__ = ["RunFailed", "Summary", "check_host", "run_scenario"]
