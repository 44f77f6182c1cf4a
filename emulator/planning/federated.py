"""The scenario's federated keys, ``method.local`` and ``method.aggregation``, and their checks.

``local: {steps: H}`` (or ``{epochs: E}``) makes each push a model delta after H local SGD steps
at ``training.learning_rate`` (the clients' step size); the server's rule then steps with
``local.server_learning_rate`` (1 by default: FedAvg's plain average). ``aggregation`` names what
the server does with arrivals (:mod:`emulator.runtime.aggregation`): ``per_push`` (the default),
``fedbuff``, ``fedasync``, ``fedavg``, or a user's ``agg.py:Class``; its other keys are the
aggregator's parameters. A federated aggregation without ``local`` trains one local epoch.

Checked before any device starts, each problem naming its field: a sample above the population,
a zero deadline, a buffer larger than the number of clients, local steps with a rule that cannot
take a model delta (AdaComp's per-coordinate staleness is defined for gradients), and an
aggregation other than ``per_push`` on several servers (``server.shards``: each would close its
own rounds). Local steps with ``per_push`` split over shards as gradients do.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, model_validator

from emulator import plugins
from emulator.planning import units
from emulator.planning.problems import Problem
from emulator.runtime.aggregation import AGGREGATORS
from emulator.runtime.rules import RULES


class LocalSpec(BaseModel):
    """Local steps before each push: ``steps`` (H) or ``epochs`` (E over the worker's shard)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    steps: PositiveInt | None = Field(None, description="H local SGD steps per push")
    epochs: PositiveInt | None = Field(None, description="or E passes over the worker's shard per push")
    server_learning_rate: PositiveFloat = Field(1.0, description="the server rule's step size on the mean delta")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value):
        return {"steps": value} if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _one_of(self):
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("give exactly one of steps and epochs")
        return self


class AggregationSpec(BaseModel):
    """What the server does with arrivals; keys other than ``name`` are the aggregator's parameters."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = Field("per_push", description="per_push | fedbuff | fedasync | fedavg, or your own: agg.py:Class")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value):
        return {"name": value} if isinstance(value, str) else value

    @property
    def params(self) -> dict:
        """The aggregator's keyword arguments; ``deadline`` (a duration: ``30s``) becomes ``deadline_s``."""
        out = dict(self.model_extra or {})
        if "deadline" in out:
            deadline = out.pop("deadline")
            try:
                out["deadline_s"] = units.parse_duration(deadline) if deadline is not None else None
            except (TypeError, ValueError):
                out["deadline_s"] = deadline  # left as given: the check names it
        return out


@dataclass(frozen=True)
class Federated:
    """The resolved keys: what workers and the server are told."""

    local: dict | None  # LocalConfig's fields, or None: one gradient per push
    aggregation: str
    params: dict
    server_learning_rate: float | None  # None: training.learning_rate, as without local steps

    def to_json(self) -> dict:
        return {"local": self.local, "aggregation": self.aggregation, "params": dict(sorted(self.params.items())),
                "server_learning_rate": self.server_learning_rate}


def resolve(local: LocalSpec | None, aggregation: AggregationSpec, clients: int | None = None) -> Federated:
    """The keys as the plan keeps them: a federated aggregation without ``local`` trains one epoch per
    push; with ``clients``, a built-in's defaults that depend on them are filled in (FedBuff's buffer,
    FedAvg's sample: 10, or every client when fewer)."""
    cls = AGGREGATORS.get(aggregation.name)
    params = aggregation.params if cls is None or clients is None else cls.defaults(aggregation.params, clients)
    if local is None and cls is not None and cls.takes_model_delta:
        local = LocalSpec(epochs=1)
    if local is None:
        return Federated(None, aggregation.name, params, None)
    return Federated({"steps": local.steps, "epochs": local.epochs}, aggregation.name, params, local.server_learning_rate)


def check(local: LocalSpec | None, aggregation: AggregationSpec, rule: str, clients: int, pull_every: int,
          servers: int = 1) -> list[Problem]:
    """Every problem with ``method.local`` and ``method.aggregation`` for a run of ``clients`` workers,
    ``servers`` servers and ``rule``."""
    problems = []
    if aggregation.name != "per_push" and servers > 1:
        # each server would sample, buffer and close rounds on its own: not one method any more
        problems.append(Problem("method.aggregation.name", f"{aggregation.name} runs on one server; server.shards is {servers}"))
    cls = AGGREGATORS.get(aggregation.name)
    if cls is None and not plugins.is_reference(aggregation.name):
        return [Problem("method.aggregation.name", f"unknown aggregation {aggregation.name!r}; known: "
                                                   f"{', '.join(AGGREGATORS)}, or your own: path/file.py:Class")]
    if cls is not None:
        for problem in cls.problems(aggregation.params, clients):
            problems.append(Problem(f"method.aggregation.{problem.field}", problem.message))
        unknown = sorted(set(aggregation.params) - set(cls.PARAMS))
        for key in unknown:
            shown = "deadline" if key == "deadline_s" else key
            problems.append(Problem(f"method.aggregation.{shown}", f"unknown parameter for {cls.name} (parameters: "
                                    f"{', '.join(k.removesuffix('_s') for k in cls.PARAMS) or 'none'})"))
    deltas = local is not None or (cls is not None and cls.takes_model_delta)
    if deltas and rule in RULES and not RULES[rule].takes_model_delta:
        field = "method.rule" if local is None else "method.local"
        problems.append(Problem(field, f"local steps push a model delta, which the rule {rule!r} cannot take "
                                       f"(rules that can: {', '.join(n for n, r in RULES.items() if r.takes_model_delta)})"))
    if deltas and pull_every != 1:
        problems.append(Problem("method.pull.every", "with local steps every push pulls the model (every: 1)"))
    return problems


__all__ = ["LocalSpec", "AggregationSpec", "Federated", "resolve", "check"]
