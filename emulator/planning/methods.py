"""Training methods: which compressor the workers use and which rule the server applies.

The paper's four are presets (``asgd``, ``staleness_asgd``, ``comp_c``, ``adacomp``). Any
registered compressor is a method too (``method: {name: topk, c: 0.001, rule: staleness}``),
so every compressor combines with every server rule, and with every way of pulling the model
(``pull``: dense, delta, lossy delta, every m pushes). Keys other than ``name``, ``rule``,
``error_feedback``, ``wire`` and ``pull`` are the compressor's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ValidationError

import compression
from compression import COMPRESSORS

from emulator import plugins
from emulator.planning import federated
from emulator.planning.problems import Problem, problems_from
from emulator.runtime.config import LocalConfig, MethodConfig, PullConfig, WireConfig
from emulator.runtime.rules import RULES


class MethodSection(Protocol):
    """What this module reads of a scenario's ``method`` section (:class:`emulator.planning.scenario.MethodSpec`,
    which imports this module to check itself: so it is named here by its shape, not imported)."""

    name: str
    rule: str | None
    error_feedback: bool
    wire: BaseModel
    pull: BaseModel
    local: federated.LocalSpec | None
    aggregation: federated.AggregationSpec

    @property
    def params(self) -> dict: ...  # the compressor's parameters: the section's other keys


@dataclass(frozen=True)
class Preset:
    compressor: str
    rule: str
    description: str
    fixed: dict = field(default_factory=dict)  # compressor parameters the preset sets itself


PRESETS: dict[str, Preset] = {
    "asgd": Preset("dense", "plain", "asynchronous SGD: dense gradients, alpha (the paper's reference)"),
    "staleness_asgd": Preset("dense", "staleness", "dense gradients, alpha / max(1, d) (Zhang et al., IJCAI 2016)"),
    "comp_c": Preset("topk", "plain", "per-tensor top-c, alpha (the paper's Comp-c)"),
    "adacomp": Preset("topk", "adacomp", "per-tensor top-c, alpha / max(1, sigma) per coordinate (the paper's AdaComp)"),
}


@dataclass(frozen=True)
class ResolvedMethod:
    name: str
    compressor: str
    params: dict
    rule: str
    error_feedback: bool
    wire: dict
    pull: dict = field(default_factory=lambda: {"mode": "dense", "values": "f32", "every": 1})
    # federated methods (emulator/planning/federated.py): local steps (None: a gradient per push),
    # what the server does with arrivals, and the server rule's step size with local steps
    local: dict | None = None
    aggregation: dict = field(default_factory=lambda: {"name": "per_push", "params": {}})
    server_learning_rate: float | None = None

    @property
    def federated(self) -> bool:
        return self.local is not None or self.aggregation["name"] != "per_push"

    @property
    def label(self) -> str:
        """The method's name for people: a preset or compressor name, or a user's ``file.py:Class`` without its folder."""
        return short_reference(self.name)

    @property
    def pull_label(self) -> str:
        """How workers pull, for people (``delta f16, every 4 pushes``); empty for the default (dense after every push)."""
        mode, values, every = self.pull["mode"], self.pull["values"], self.pull["every"]
        words = [] if mode == "dense" else [f"delta {values}"]
        words += [] if every == 1 else [f"every {every} pushes"]
        return ", ".join(words)

    def worker_config(self, compressor: str | None = None, learning_rate: float = 0.1) -> MethodConfig:
        """The workers' side of this method, as a device's configuration carries it; ``compressor``: the
        compressor as devices name it (a user's file where they read it), default this method's;
        ``learning_rate``: the training's, the clients' own step size when they take local steps."""
        local = None if self.local is None else LocalConfig(**self.local, learning_rate=float(learning_rate))
        return MethodConfig(compressor=compressor or self.compressor, params=dict(self.params), error_feedback=self.error_feedback,
                            wire=WireConfig(**self.wire), pull=PullConfig(**self.pull), local=local)

    def server_step_size(self, learning_rate: float) -> float:
        """The server rule's step size: the training's, or with local steps ``local.server_learning_rate``."""
        return learning_rate if self.server_learning_rate is None else float(self.server_learning_rate)

    def to_json(self) -> dict:
        return {
            "name": self.name, "compressor": self.compressor, "params": dict(sorted(self.params.items())),
            "rule": self.rule, "error_feedback": self.error_feedback, "wire": dict(self.wire), "pull": dict(self.pull),
            # only when set: a plan without them keeps the digest it had before they existed
            **({"local": self.local, "aggregation": self.aggregation, "server_learning_rate": self.server_learning_rate}
               if self.federated else {}),
        }


def short_reference(name: str) -> str:
    """``/home/me/comp/sign.py:SignTopK`` -> ``sign.py:SignTopK``; a registry name as it is."""
    return name.rsplit("/", 1)[-1] if plugins.is_reference(name) else name


def known_methods() -> list[str]:
    return sorted(set(PRESETS) | set(COMPRESSORS))


def resolve(spec: MethodSection, workers: int | None = None) -> ResolvedMethod:
    """Preset or compressor name -> compressor, its validated parameters, and the server rule.

    A user's compressor (``file.py:Class``) keeps its parameters as written: planning imports no user
    code, so they are validated by its own ``Params`` when a run imports it (:mod:`emulator.control.workload`)."""
    preset = PRESETS.get(spec.name)
    compressor = preset.compressor if preset else spec.name
    if plugins.is_reference(compressor):
        params = dict(spec.params)
    elif compressor not in COMPRESSORS:
        raise ValueError(f"unknown method {spec.name!r}; known: {', '.join(known_methods())}")
    else:
        params = COMPRESSORS[compressor].Params(**spec.params).model_dump()
    rule = rule_of(spec)
    if rule not in RULES and not plugins.is_reference(rule):
        raise ValueError(f"unknown rule {rule!r}; known: {', '.join(sorted(RULES))}")
    fed = federated.resolve(spec.local, spec.aggregation, workers)
    return ResolvedMethod(spec.name, compressor, params, rule, spec.error_feedback, spec.wire.model_dump(), spec.pull.model_dump(),
                          local=fed.local, aggregation={"name": fed.aggregation, "params": fed.params},
                          server_learning_rate=fed.server_learning_rate)


def rule_of(spec: MethodSection) -> str:
    """The server's rule: the section's, else the preset's, else ``plain``."""
    preset = PRESETS.get(spec.name)
    return spec.rule or (preset.rule if preset else "plain")


def check_method(spec: MethodSection, workers: int | None = None, servers: int = 1) -> list[Problem]:
    """Every problem with the method section, with paths like ``method.c``; with ``workers``, its
    federated keys for a run of that many clients and ``servers`` servers too."""
    preset = PRESETS.get(spec.name)
    compressor = preset.compressor if preset else spec.name
    problems = []
    if workers is not None:
        problems += federated.check(spec.local, spec.aggregation, rule_of(spec), workers, spec.pull.every, servers)
    if spec.rule is not None and spec.rule not in RULES and not plugins.is_reference(spec.rule):
        problems.append(Problem("method.rule", f"unknown rule {spec.rule!r}; known: {', '.join(sorted(RULES))}, "
                                               "or your own: path/file.py:Class"))
    if plugins.is_reference(compressor):
        return problems  # a user's class: its parameters are checked when a run imports it
    if compressor not in COMPRESSORS:
        return [Problem("method.name", f"unknown method {spec.name!r}; known: {', '.join(known_methods())}, "
                                       "or your own compressor: path/file.py:Class")]
    if spec.error_feedback and COMPRESSORS[compressor].has_own_memory:
        problems.append(Problem("method.error_feedback", f"{compressor} keeps its own residual"))
    try:
        COMPRESSORS[compressor].Params(**spec.params)
    except ValidationError as exc:
        for problem in problems_from(exc, ("method",)):
            if problem.message.startswith("unknown key"):
                allowed = ", ".join(COMPRESSORS[compressor].Params.model_fields) or "none"
                problem = Problem(problem.path, f"unknown parameter for {spec.name} (parameters: {allowed}; also name, rule, error_feedback, wire, pull)")
            problems.append(problem)
    return problems


__all__ = ["PRESETS", "ResolvedMethod", "resolve", "check_method", "known_methods", "short_reference", "compression"]
