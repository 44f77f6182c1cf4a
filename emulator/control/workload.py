"""A run's own workload: the user's files imported and checked on the host, then handed to the devices.

Before any device starts, :func:`check` imports each user file a scenario names (its model,
compressor, update rule) and checks it as the devices will use it: the model is built for the
data set's input shape and classes, the compressor's parameters are validated by its own
``Params`` and one is made for the model's layout, the rule is made for it too. What fails is a
:class:`~emulator.planning.problems.ScenarioError` naming the scenario's field and the file,
with the user's own traceback where their code raised (the CLI exits 2).

Then :func:`write` copies those files into the run directory's ``workload/`` folder with the
initial model (``initial.npy``, from the model's own initialisation under the run's seed) and
``workload.json`` (every user file: where it came from, its sha256, and for data its size).
Backends hand that folder to every device read-only (a bind mount on Docker, shipped to each
node on Swarm), and the zygote imports its Python files once before forking, as it does
TensorFlow; a changed file takes effect in the next run, with no image rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import ValidationError

import compression
from compression.layout import Layout

from emulator import plugins
from emulator.planning.plan import Plan, check_dataset
from emulator.planning.scenario import Scenario
from emulator.planning.problems import Problem, ScenarioError, problems_from
from emulator.planning.workload import UserFile, user_files
from emulator.runtime import aggregation, contract, models, partition, rules
from emulator.runtime.models import save_initial

FOLDER = "workload"  # in the run directory; devices see it read-only
INITIAL = "initial.npy"  # the initial model the server starts from
MANIFEST = "workload.json"  # in the run directory: every user file, where from, its digest


def model_of(plan: Plan) -> models.ModelDef:
    """The plan's model (built in, or the user's, built once per process)."""
    spec = plan.model
    return models.resolve(spec["name"], spec.get("args") or {}, spec.get("output", "auto"))


def check_scenario(scenario: Scenario, plan: Plan) -> Layout:
    """Everything a run checks before it starts anything: its data set (a loader of the user's imported and
    called), then :func:`check`. The model's layout; ScenarioError naming the field otherwise."""
    found = check_dataset(scenario, run_code=True)
    return check(plan, user_files(plan), found.input_shape, found.classes)


def check(plan: Plan, files: list[UserFile], input_shape: tuple[int, ...], classes: int) -> Layout:
    """Import and check the user's model, compressor and rule as devices will use them; the model's layout.

    :class:`ScenarioError` naming the field (and the file, and the user's traceback) for each that fails."""
    try:
        layout = model_of(plan).layout(tuple(input_shape), int(classes))
    except plugins.PluginError as error:
        raise ScenarioError([Problem("model", str(error))]) from None
    problems = []
    for file in files:
        if file.role == "compressor":
            problems += _check_compressor(file, plan, layout)
        elif file.role == "rule":
            problems += _check_rule(file, plan, layout)
        elif file.role == "aggregator":
            problems += _check_aggregator(file, plan, layout)
    problems += _check_servers(plan, layout)
    if problems:
        raise ScenarioError(problems)
    return layout


def _check_servers(plan: Plan, layout: Layout) -> list[Problem]:
    """With several servers: the split must fit the model, and the rule must act per coordinate (a
    coordinate's update may depend only on that coordinate's state), or it cannot be split exactly."""
    if plan.partition is None:
        return []
    problems = []
    try:
        partition.from_json(plan.partition, layout)
    except partition.PartitionError as error:
        problems.append(Problem("server.shards", str(error).split(": ", 1)[-1]))
    try:
        rule = rules.lookup(plan.method.rule)
    except plugins.PluginError:
        return problems  # reported as the rule's own problem
    if not getattr(rule, "per_coordinate", False):
        problems.append(Problem("server.shards", f"{plan.partition['shards']} servers, but the update rule {plan.method.rule} "
                                "does not declare per_coordinate = True: it cannot be split over servers exactly"))
    return problems


def _check_compressor(file: UserFile, plan: Plan, layout: Layout) -> list[Problem]:
    try:
        cls = compression.lookup(file.reference)
    except plugins.PluginError as error:
        return [Problem(file.field, str(error))]
    try:
        params = cls.Params(**plan.method.params)
    except ValidationError as error:
        return problems_from(error, ("method",))
    try:
        plugins.call(cls, params, layout, 0, what=f"{file.reference}(params, layout, seed)")
    except plugins.PluginError as error:
        return [Problem(file.field, str(error))]
    return []


def _check_rule(file: UserFile, plan: Plan, layout: Layout) -> list[Problem]:
    try:
        cls = rules.lookup(file.reference)
        plugins.call(cls, layout, plan.training["learning_rate"], what=f"{file.reference}(layout, learning_rate)")
    except plugins.PluginError as error:
        return [Problem(file.field, str(error))]
    return []


def _check_aggregator(file: UserFile, plan: Plan, layout: Layout) -> list[Problem]:
    """A user's aggregator: imported, made with the layout, the plan's rule and its parameters; a rule
    that cannot take a model delta refused when the aggregator needs one."""
    method = plan.method
    try:
        cls = aggregation.lookup(file.reference)
        rule = rules.lookup(method.rule) if not plugins.is_reference(method.rule) else None
        if rule is not None and cls.takes_model_delta and not rule.takes_model_delta:
            return [Problem("method.rule", f"{file.reference} aggregates model deltas, which the rule {method.rule!r} cannot take")]
        built = rules.build(method.rule, layout, 1.0) if rule is not None else None
        if built is not None:
            plugins.call(cls, layout, built, plan.seed, what=f"{file.reference}(layout, rule, seed, **params)",
                         **method.aggregation["params"])
    except aggregation.AggregatorError as error:
        return [Problem(f"method.aggregation.{error.field}", error.message)]
    except plugins.PluginError as error:
        return [Problem(file.field, str(error))]
    return []


def contract_check(ref: str, params: dict | None = None, layout: Layout | None = None) -> tuple[str, list[contract.Verdict]]:
    """Run the contract suite on the user's compressor, update rule or aggregator ``ref`` names: (its kind, the verdicts).

    ``params``: the compressor's parameters (default its own); ``layout``: the model it will compress
    (default a small convolution and dense layer). PluginError if ``ref`` names neither."""
    target = plugins.load(ref)
    if isinstance(target, type) and issubclass(target, compression.Compressor):
        cls = compression.lookup(ref)
        try:
            cls.Params(**(params or {}))
        except ValidationError as error:
            raise ScenarioError(problems_from(error, ("params",))) from None
        return "compressor", contract.check_compressor(cls, params, layout)
    if isinstance(target, type) and issubclass(target, rules.UpdateRule):
        if params:
            raise plugins.PluginError(f"{ref}: an update rule takes no parameters (got {sorted(params)})")
        return "rule", contract.check_rule(rules.lookup(ref), layout)
    if isinstance(target, type) and issubclass(target, aggregation.Aggregator):
        return "aggregator", contract.check_aggregator(aggregation.lookup(ref), params, layout)
    raise plugins.PluginError(f"{ref}: is {target!r}: neither a compression.Compressor, an UpdateRule nor an Aggregator subclass "
                              "(a model is checked with its data set: emulate check SCENARIO.yaml)")


def scenario_check(plan: Plan, files: list[UserFile], layout: Layout) -> list[tuple[UserFile, list[contract.Verdict]]]:
    """The contract suite on each user compressor and rule of a plan, on the plan's own model layout and parameters."""
    out = []
    for file in files:
        if file.role == "compressor":
            out.append((file, contract_check(file.reference, plan.method.params, layout)[1]))
        elif file.role == "rule":
            out.append((file, contract_check(file.reference, None, layout)[1]))
        elif file.role == "aggregator":
            out.append((file, contract_check(file.reference, plan.method.aggregation["params"], layout)[1]))
    return out


@dataclass(frozen=True)
class Bundle:
    """The run's ``workload/`` folder: what devices read, and how a reference on the host reads there."""

    host_dir: str
    names: dict[str, str] = field(default_factory=dict)  # a user file's path on the host -> its name in the folder
    preload: tuple[str, ...] = ()  # names of the Python files devices import (the zygote, once)

    def device_reference(self, ref: str, device_dir: str) -> str:
        """``ref`` (a built-in name, or a reference to a user's file on the host) as a device reads it."""
        if not plugins.is_reference(ref):
            return ref
        path, attribute = plugins.split(ref)
        located = f"{device_dir}/{self.names[path]}"
        return f"{located}:{attribute}" if attribute else located

    def device_preload(self, device_dir: str) -> list[str]:
        return [f"{device_dir}/{name}" for name in self.preload]


def _bundle_names(files: list[UserFile]) -> dict[str, str]:
    """A name in the folder for each distinct file: its own, or with -2, -3 ... where two share one."""
    names: dict[str, str] = {}
    for file in files:
        if file.path in names or not (file.on_devices or file.imported):
            continue
        stem, suffix = os.path.splitext(os.path.basename(file.path))
        name, n = stem + suffix, 1
        while name in names.values():
            n += 1
            name = f"{stem}-{n}{suffix}"
        names[file.path] = name
    return names


def write(run_dir: str | Path, files: list[UserFile], initial: np.ndarray) -> Bundle:
    """Copy the user's code and saved models into ``run_dir/workload/`` (read-only), with the initial model,
    and record every user file (data too, by digest) in ``run_dir/workload.json``."""
    folder = Path(run_dir) / FOLDER
    folder.mkdir(exist_ok=True)
    names = _bundle_names(files)
    for path, name in names.items():
        shutil.copyfile(path, folder / name)
    save_initial(folder / INITIAL, initial)
    for entry in folder.iterdir():
        os.chmod(entry, 0o444)
    os.chmod(folder, 0o755)  # devices read it as an unprivileged user
    records = []
    for file in files:
        record = {"field": file.field, "role": file.role, "source": file.path, "attribute": file.attribute,
                  "imported": file.imported, "sha256": plugins.file_digest(file.path)}
        if file.path in names:
            record["copy"] = f"{FOLDER}/{names[file.path]}"
        else:
            record["bytes"] = _size(file.path)
        records.append(record)
    manifest = {"files": records, "initial": {"file": f"{FOLDER}/{INITIAL}", "sha256": plugins.file_digest(folder / INITIAL)}}
    (Path(run_dir) / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    preload = tuple(names[f.path] for f in files if f.on_devices and f.imported)
    return Bundle(str(folder), names, tuple(dict.fromkeys(preload)))


def _size(path: str) -> int:
    p = Path(path)
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size


__all__ = ["Bundle", "FOLDER", "INITIAL", "MANIFEST", "check", "check_scenario", "contract_check", "model_of", "scenario_check", "write"]
