"""The scenario file: YAML validated into typed, immutable models, with errors that name the field.

A scenario says what to emulate (devices, links, faults) and how to train (model, data,
method). Quantities carry units as people write them (``2mbit``, ``30ms``, ``0.1%``);
per-device values can be distributions. Unknown keys are errors everywhere. The
:mod:`emulator.planning.plan` module turns a scenario into a concrete, seeded plan.
"""

from __future__ import annotations

import difflib
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PositiveFloat,
    PlainSerializer,
    PositiveInt,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from compression.delta import DELTA_VALUES

from emulator import datasets
from emulator.planning import units
from emulator.planning.methods import check_method
from emulator.planning.problems import Problem, ScenarioError, field_names, format_path, model_at, problems_from
from emulator.planning.traces import GroupTraces, validation_context
from emulator.runtime import models
from emulator.runtime.downlink import PULL_MODES

MAX_FILE_BYTES = 1 << 20
MAX_EXPANDED_VALUES = 100_000
MAX_WORKERS = 10_000
MAX_DEPTH = 50
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


# -- distributions -----------------------------------------------------------------------


@dataclass(frozen=True)
class Fixed:
    value: float

    def sample(self, rng, count: int) -> list[float]:
        return [self.value] * count


@dataclass(frozen=True)
class Uniform:
    low: float
    high: float

    def sample(self, rng, count):
        return [float(v) for v in rng.uniform(self.low, self.high, count)]


@dataclass(frozen=True)
class Normal:
    mean: float
    std: float
    low: float | None = None
    high: float | None = None

    def sample(self, rng, count):
        values = rng.normal(self.mean, self.std, count)
        if self.low is not None or self.high is not None:
            values = values.clip(self.low, self.high)
        return [float(v) for v in values]


@dataclass(frozen=True)
class Choice:
    values: tuple[float, ...]
    weights: tuple[float, ...] | None = None

    def sample(self, rng, count):
        p = None
        if self.weights:
            total = sum(self.weights)
            p = [w / total for w in self.weights]
        picks = rng.choice(len(self.values), size=count, p=p)
        return [self.values[int(i)] for i in picks]


@dataclass(frozen=True)
class PerDevice:
    values: tuple[float, ...]

    def sample(self, rng, count):
        return list(self.values)


Distribution = Union[Fixed, Uniform, Normal, Choice, PerDevice]

_DIST_SCHEMA = {
    "anyOf": [
        {"type": ["number", "string"], "description": "one value for every device"},
        {"type": "array", "description": "one value per device of the group"},
        {"type": "object", "properties": {"uniform": {"type": "array", "minItems": 2, "maxItems": 2}}, "required": ["uniform"]},
        {"type": "object", "properties": {"normal": {}, "clip": {"type": "array"}}, "required": ["normal"]},
        {"type": "object", "properties": {"choice": {"type": "array"}, "weights": {"type": "array"}}, "required": ["choice"]},
    ]
}


def _bounded(parse: Callable[[Any], float], *, gt: float | None = None, ge: float | None = None) -> Callable[[Any], float]:
    def check(raw):
        value = parse(raw)
        if gt is not None and not value > gt:
            raise ValueError(f"must be > {gt:g}, got {raw!r}")
        if ge is not None and not value >= ge:
            raise ValueError(f"must be >= {ge:g}, got {raw!r}")
        return value

    return check


def _parse_distribution(parse: Callable[[Any], float], unit: Callable[[Any], float]) -> Callable[[Any], Distribution]:
    """``parse`` reads one value with the field's bounds; ``unit`` reads a spread (std) in the same unit."""

    def convert(raw):
        if isinstance(raw, (Fixed, Uniform, Normal, Choice, PerDevice)):
            return raw
        if isinstance(raw, list):
            if not raw:
                raise ValueError("a per-device list needs at least one value")
            return PerDevice(tuple(parse(v) for v in raw))
        if not isinstance(raw, dict):
            return Fixed(parse(raw))
        keys = set(raw)
        if "uniform" in keys:
            _only(keys, {"uniform"})
            low, high = (parse(v) for v in _pair(raw["uniform"], "uniform"))
            if low > high:
                raise ValueError(f"uniform: low {low:g} is above high {high:g}")
            return Uniform(low, high)
        if "normal" in keys:
            _only(keys, {"normal", "clip"})
            spec = raw["normal"]
            if isinstance(spec, dict):
                _only(set(spec), {"mean", "std"})
                spec = [spec.get("mean"), spec.get("std")]
            mean, std = _pair(spec, "normal")
            mean, std = parse(mean), unit(std)
            if std < 0:
                raise ValueError("normal: std must be >= 0")
            low = high = None
            if "clip" in raw:
                low, high = (parse(v) for v in _pair(raw["clip"], "clip"))
                if low > high:
                    raise ValueError(f"clip: low {low:g} is above high {high:g}")
            return Normal(mean, std, low, high)
        if "choice" in keys:
            _only(keys, {"choice", "weights"})
            values = raw["choice"]
            if not isinstance(values, list) or not values:
                raise ValueError("choice: needs a non-empty list of values")
            weights = raw.get("weights")
            if weights is not None:
                if not isinstance(weights, list) or len(weights) != len(values):
                    raise ValueError("choice: weights must be a list as long as the values")
                if (any(isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0 for w in weights)
                        or not 0 < sum(weights) < math.inf):
                    raise ValueError("choice: weights must be non-negative numbers with a positive sum")
                weights = tuple(float(w) for w in weights)
            return Choice(tuple(parse(v) for v in values), weights)
        raise ValueError(f"expected a value, a list, or one of uniform/normal/choice, got keys {sorted(keys)}")

    return convert


def _only(keys: set, allowed: set) -> None:
    extra = keys - allowed
    if extra:
        raise ValueError(f"unexpected key(s) {sorted(extra)}; allowed here: {sorted(allowed)}")


def _pair(value, what: str):
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"{what}: expected two values [a, b], got {value!r}")
    return value


def _dump_distribution(dist: Distribution):
    """The scenario-file form (in base units), so that a dumped scenario loads again."""
    if isinstance(dist, Fixed):
        return dist.value
    if isinstance(dist, PerDevice):
        return list(dist.values)
    if isinstance(dist, Uniform):
        return {"uniform": [dist.low, dist.high]}
    if isinstance(dist, Normal):
        out: dict = {"normal": [dist.mean, dist.std]}
        if dist.low is not None or dist.high is not None:
            out["clip"] = [dist.low, dist.high]
        return out
    out = {"choice": list(dist.values)}
    if dist.weights:
        out["weights"] = list(dist.weights)
    return out


def distribution(parse: Callable[[Any], float], unit: Callable[[Any], float], description: str):
    return Annotated[
        Distribution,
        BeforeValidator(_parse_distribution(parse, unit)),
        PlainSerializer(_dump_distribution, when_used="json"),
        WithJsonSchema({**_DIST_SCHEMA, "description": description}),
    ]


def quantity(parse: Callable[[Any], float], description: str, json_type=("number", "string")):
    return Annotated[float, BeforeValidator(parse), WithJsonSchema({"type": list(json_type), "description": description})]


def _number(raw) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(f"must be a number, got {raw!r}")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {raw!r}")
    return value


# Bounds every sampled value must meet; the planner checks draws against them too.
BOUNDS: dict[str, Callable[[Any], float]] = {
    "cpus": _bounded(_number, gt=0),
    "uplink": _bounded(units.parse_rate, gt=0),
    "downlink": _bounded(units.parse_rate, gt=0),
    "delay": _bounded(units.parse_duration, ge=0),
    "jitter": _bounded(units.parse_duration, ge=0),
    "loss": units.parse_fraction,
}
Cpus = distribution(BOUNDS["cpus"], _number, "CPU cores of quota per device, e.g. 0.25")
RateDist = distribution(BOUNDS["uplink"], units.parse_rate, "link rate, e.g. 2mbit (bits/s) or 125kbps (bytes/s)")
DelayDist = distribution(BOUNDS["delay"], units.parse_duration, "one-way delay, e.g. 30ms")
LossDist = distribution(BOUNDS["loss"], units.parse_fraction, "packet loss, e.g. 0.1% or 0.001")
Rate = quantity(_bounded(units.parse_rate, gt=0), "link rate, e.g. 100mbit")
Duration = quantity(_bounded(units.parse_duration, ge=0), "duration, e.g. 30s, 250ms, 2min")
PositiveDuration = quantity(_bounded(units.parse_duration, gt=0), "duration, e.g. 30s, 2min")
Size = Annotated[int, BeforeValidator(_bounded(units.parse_size, gt=0)), WithJsonSchema({"type": ["integer", "string"], "description": "bytes, e.g. 512m, 2g"})]
Fraction = quantity(units.parse_fraction, "fraction, e.g. 0.1% or 0.001")


def _subset_size(raw):
    """A count of examples (an integer), a share of what the dataset has (0.2 or 20%), or all."""
    if raw is None or raw == "all":
        return None
    if isinstance(raw, bool):
        raise ValueError(f"expected a number of examples, a fraction (20%) or 'all', got {raw!r}")
    if isinstance(raw, int):
        if raw < 1:
            raise ValueError(f"must be at least 1 example, got {raw!r}")
        return raw
    if isinstance(raw, float) and raw > 1:
        if raw.is_integer():
            return int(raw)
        raise ValueError(f"a number of examples must be whole, got {raw!r}")
    try:
        share = units.parse_fraction(raw)
    except ValueError as error:
        raise ValueError(f"expected a number of examples, a fraction (20%) or 'all': {error}") from None
    if share <= 0:
        raise ValueError(f"a fraction must be above 0, got {raw!r}")
    return float(share)


SubsetSize = Annotated[
    Union[int, float, None],
    BeforeValidator(_subset_size),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1}, {"type": "number"}, {"type": "string"}, {"type": "null"}],
                    "description": "examples to use: a count (2000, refused at plan time if the dataset has fewer), "
                                   "a fraction of what it has (0.2 or 20%), or all (the default)"}),
]


def _targets(raw):
    if isinstance(raw, bool):
        raise ValueError(f"expected worker indices, 'all' or a group name, got {raw!r}")
    if isinstance(raw, int):
        return (raw,)
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and raw and all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
        return tuple(raw)
    raise ValueError(f"expected a worker index, a list of indices, 'all' or a group name, got {raw!r}")


Targets = Annotated[
    Union[str, tuple[int, ...]],
    BeforeValidator(_targets),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}, {"type": "string"}],
                    "description": "worker index, list of indices, 'all', or a group name"}),
]


# -- the scenario ------------------------------------------------------------------------


def _numeric_kind(annotation) -> str | None:
    """'a number' or 'an integer' when a field takes numbers, else None."""
    if annotation is float:
        return "a number"
    if annotation is int:
        return "an integer"
    args = typing.get_args(annotation)
    if str in args:
        return None  # e.g. worker targets: their own validator explains the choices
    kinds = {_numeric_kind(arg) for arg in args} - {None}
    return "a number" if "a number" in kinds else next(iter(kinds), None)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value, info):
        # pydantic would read true as 1; YAML reads yes/no/on/off as booleans too ("count: on").
        kind = _numeric_kind(cls.model_fields[info.field_name].annotation) if isinstance(value, bool) else None
        if kind:
            raise ValueError(f"must be {kind}, got {value!r}")
        return value


class DatasetSpec(Strict):
    name: str = Field("mnist-5k", description="mnist | mnist-5k | fashion-mnist | digits")
    partition: Literal["shards", "iid", "non_iid"] = Field("shards", description="shards: the paper's contiguous split")
    classes_per_worker: PositiveInt | None = None
    dirichlet_alpha: PositiveFloat | None = None
    path: str | None = Field(None, description="explicit location of the files (IDX directory or mnist.npz)")
    train_size: SubsetSize = Field(None, description="the first N training examples, a fraction of them (20%), or all")
    test_size: SubsetSize = Field(None, description="the first N test examples, a fraction of them (20%), or all")

    @model_validator(mode="after")
    def _non_iid_needs_a_skew(self):
        if self.partition == "non_iid" and not (self.classes_per_worker or self.dirichlet_alpha):
            raise ValueError("partition non_iid needs classes_per_worker or dirichlet_alpha")
        return self


def _eval_every(raw):
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, int) and not isinstance(raw, bool):
        return {"updates": raw}
    if isinstance(raw, str):
        match = re.fullmatch(r"\s*(\d+)\s*(updates?|u)\s*", raw)
        if match:
            return {"updates": int(match.group(1))}
        return {"seconds": units.parse_duration(raw)}
    raise ValueError(f"expected a duration (30s) or a number of updates (500 updates), got {raw!r}")


class EvalSchedule(Strict):
    seconds: PositiveFloat | None = None
    updates: PositiveInt | None = None

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.seconds is None) == (self.updates is None):
            raise ValueError("give either a time (30s) or a number of updates (500 updates)")
        return self

    def to_json(self) -> dict:
        return {"seconds": self.seconds} if self.seconds is not None else {"updates": self.updates}


class TrainingSpec(Strict):
    batch_size: PositiveInt = 10
    learning_rate: PositiveFloat = 0.1
    max_updates: PositiveInt | None = Field(None, description="stop after this many updates applied by the server")
    duration: PositiveDuration | None = Field(None, description="stop after this much wall time")
    eval_every: Annotated[EvalSchedule, BeforeValidator(_eval_every), WithJsonSchema({"anyOf": [  # what _eval_every reads
        {"type": "string"}, {"type": "integer", "minimum": 1},
        {"type": "object", "properties": {"seconds": {"type": "number", "exclusiveMinimum": 0}, "updates": {"type": "integer", "minimum": 1}},
         "additionalProperties": False}]})] = Field(
        default_factory=lambda: EvalSchedule(seconds=30.0), description="30s or '500 updates'"
    )

    @model_validator(mode="after")
    def _has_an_end(self):
        if self.max_updates is None and self.duration is None:
            raise ValueError("give max_updates, duration, or both, so the run ends")
        return self


class WireSpec(Strict):
    values: Literal["f32", "f16"] = Field("f32", description="f32 is lossless; f16 halves value bytes")
    indices: Literal["elias_fano", "raw32"] = Field("elias_fano", description="index coding of sparse parts")


class PullSpec(Strict):
    """How workers take the model, the downlink (``emulator/runtime/downlink.py``); ``pull: delta``
    is short for ``pull: {mode: delta}``."""

    mode: Literal[PULL_MODES] = Field("dense", description=(
        "dense: the whole model answers every push; delta: the coordinates changed since the version "
        "the worker holds, Elias-Fano coded, or the whole model when that is smaller"))
    values: Literal[tuple(DELTA_VALUES)] = Field("f32", description=(
        "a delta's values: f32 exact; f16 rounded to half precision (the copy is the model rounded); "
        "q8 8-bit codes of model - copy with a per-tensor scale and error feedback"))
    every: PositiveInt = Field(1, description="pull after every this many pushes; between pulls, gradients of the model held")

    @model_validator(mode="after")
    def _lossy_values_are_a_deltas(self):
        if self.mode == "dense" and self.values != "f32":
            raise ValueError(f"values {self.values} are for mode delta (dense pulls send the float32 model)")
        return self


def _pull_shorthand(value):
    return {"mode": value} if isinstance(value, str) else value


_PULL_SCHEMA = {  # a mapping, or a mode alone (the pattern applies to strings only, the properties to mappings only)
    "type": ["object", "string"], "pattern": f"^({'|'.join(PULL_MODES)})$", "additionalProperties": False, "properties": {
        "mode": {"enum": list(PULL_MODES), "default": "dense"}, "values": {"enum": list(DELTA_VALUES), "default": "f32"},
        "every": {"type": "integer", "minimum": 1, "default": 1}}}


class MethodSpec(BaseModel):
    """A preset (asgd, staleness_asgd, comp_c, adacomp) or a compressor name; other keys are its parameters."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = "adacomp"
    rule: str | None = Field(None, description="plain | staleness | adacomp (default: the preset's)")
    error_feedback: bool = False
    wire: WireSpec = WireSpec()
    pull: Annotated[PullSpec, BeforeValidator(_pull_shorthand), WithJsonSchema(_PULL_SCHEMA)] = PullSpec()

    @property
    def params(self) -> dict:
        return dict(self.model_extra or {})


class CheckpointSpec(Strict):
    """How often the server saves its state, so a crashed server resumes where it was."""

    every_updates: PositiveInt | None = Field(1000, description="checkpoint after this many updates")
    every: PositiveDuration | None = Field(30.0, description="and at least this often (e.g. 30s)")
    enabled: bool = True


class ServerSpec(Strict):
    cpus: PositiveFloat = 1.0
    memory: Size = units.parse_size("2g")
    checkpoint: CheckpointSpec = CheckpointSpec()
    uplink: Rate | None = Field(None, description="server egress cap (models sent); none = unshaped")
    downlink: Rate | None = Field(None, description="server ingress cap (updates received); none = unshaped")
    delay: Duration = 0.0
    port: int = Field(7000, ge=1, le=65535)


class EvaluatorSpec(Strict):
    cpus: PositiveFloat = 1.0
    memory: Size = units.parse_size("2g")


class WorkerGroup(Strict):
    name: str | None = Field(None, pattern=NAME_PATTERN, description="a target for faults ('all' is taken)")
    count: int = Field(1, ge=1, le=MAX_WORKERS)
    cpus: Cpus = Fixed(1.0)
    memory: Size = units.parse_size("1g")
    uplink: RateDist | None = None
    downlink: RateDist | None = None
    delay: DelayDist = Fixed(0.0)
    jitter: DelayDist = Fixed(0.0)
    loss: LossDist = Fixed(0.0)
    traces: GroupTraces | None = Field(None, description="availability, link, compute, population from files (docs/TRACES.md)")

    @field_validator("name")
    @classmethod
    def _not_all(cls, name):
        if name in RESERVED_TARGETS:
            raise ValueError(f"{name!r} is a fault target of its own ({RESERVED_TARGETS[name]}); choose another group name")
        return name

    @field_validator("cpus", "uplink", "downlink", "delay", "jitter", "loss")
    @classmethod
    def _list_matches_count(cls, value, info):
        count = info.data.get("count")  # absent when the count itself was refused
        if isinstance(value, PerDevice) and count is not None and len(value.values) != count:
            raise ValueError(f"a per-device list of {len(value.values)} values for count {count}")
        return value


class CrashProcess(Strict):
    rate_per_hour: float = Field(ge=0, description="crashes per worker per hour (exponential inter-arrival)")
    restart_after: Duration | None = Field(None, description="restart delay; none = the worker stays down")
    workers: Targets = "all"


class LinkChange(Strict):
    uplink: Rate | None = None
    downlink: Rate | None = None
    delay: Duration | None = None
    jitter: Duration | None = None
    loss: Fraction | None = None


ACTIONS = ("crash", "restart", "pause", "resume", "partition", "heal", "cpus", "link")


class TimedEvent(Strict):
    time: Duration
    crash: Targets | None = None
    restart: Targets | None = None
    pause: Targets | None = None
    resume: Targets | None = None
    partition: Targets | None = None
    heal: Targets | None = None
    cpus: PositiveFloat | None = None
    link: LinkChange | None = None
    workers: Targets | None = Field(None, description="targets of a cpus or link change (default all)")
    duration: PositiveDuration | None = Field(None, alias="for", description="undo after this long (pause, partition, cpus, link)")
    restart_after: Duration | None = Field(None, description="with crash: restart after this long")

    @model_validator(mode="after")
    def _one_action(self):
        present = [a for a in ACTIONS if getattr(self, a) is not None]
        if len(present) != 1:
            raise ValueError(f"give exactly one action of {', '.join(ACTIONS)}; got {present or 'none'}")
        action = present[0]
        if self.workers is not None and action not in ("cpus", "link"):
            raise ValueError(f"'workers' goes with cpus or link; {action} names its targets itself")
        if self.restart_after is not None and action != "crash":
            raise ValueError("restart_after goes with crash")
        if self.duration is not None and action in ("crash", "restart", "resume", "heal"):
            raise ValueError(f"'for' does not apply to {action}")
        return self

    @property
    def action(self) -> str:
        return next(a for a in ACTIONS if getattr(self, a) is not None)

    @property
    def targets(self):
        if self.action in ("cpus", "link"):
            return self.workers if self.workers is not None else "all"
        return getattr(self, self.action)


class Trigger(Strict):
    worker: int = Field(ge=0)
    after_pushes: PositiveInt
    action: Literal["crash", "pause", "partition"] = "crash"
    restart_after: Duration | None = None
    duration: PositiveDuration | None = Field(None, alias="for")

    @model_validator(mode="after")
    def _options_fit_the_action(self):
        if self.restart_after is not None and self.action != "crash":
            raise ValueError("restart_after goes with crash")
        if self.duration is not None and self.action == "crash":
            raise ValueError("'for' does not apply to crash; use restart_after")
        return self


class FaultsSpec(Strict):
    horizon: PositiveDuration | None = Field(None, description="how far ahead random faults are drawn (default: duration, else 1h)")
    crash: CrashProcess | None = None
    at: list[TimedEvent] = Field(default_factory=list)
    triggers: list[Trigger] = Field(default_factory=list)


class Scenario(Strict):
    name: str = Field(min_length=1, pattern=NAME_PATTERN)
    description: str = ""
    seed: int = Field(0, ge=0, le=2**32 - 1, description="the plan's random draws (the planner uses 32 bits)")
    model: str = Field("mnist_cnn", description="mnist_cnn | mlp")
    dataset: DatasetSpec = DatasetSpec()
    training: TrainingSpec
    method: MethodSpec = MethodSpec()
    server: ServerSpec = ServerSpec()
    evaluator: EvaluatorSpec = EvaluatorSpec()
    workers: list[WorkerGroup] = Field(min_length=1)
    faults: FaultsSpec = FaultsSpec()
    backend: Literal["auto", "local", "docker", "swarm"] = "auto"

    @property
    def worker_count(self) -> int:
        return sum(g.count for g in self.workers)


# -- loading -----------------------------------------------------------------------------


def _expanded_size(value, budget: int) -> int:
    """Values after expanding YAML aliases, counting up to ``budget`` (defeats 'billion laughs')."""
    stack, count = [value], 0
    while stack:
        item = stack.pop()
        count += 1
        if count > budget:
            return count
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


class _Loader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping (plain YAML keeps the last, silently)
    and nesting deeper than :data:`MAX_DEPTH` (PyYAML's scanner slows down quadratically with depth,
    and its composer recurses: a file of a million '[' must be refused at once)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _mapping_without_duplicates(loader: _Loader, node: yaml.MappingNode):
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # '<<: *defaults' may be overridden by the keys next to it
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:
            continue  # unhashable: construct_mapping says so
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
    yield from loader.construct_yaml_map(node)


_Loader.add_constructor("tag:yaml.org,2002:map", _mapping_without_duplicates)


def parse_yaml(text: str, source: str = "") -> dict:
    if len(text.encode()) > MAX_FILE_BYTES:
        raise ScenarioError([Problem("", f"file larger than {MAX_FILE_BYTES // 1024} KiB")], source)
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([Problem("", f"not valid YAML: {where}{problem}")], source) from None
    except RecursionError:
        raise ScenarioError([Problem("", "not valid YAML: nested too deeply")], source) from None
    if data is None:
        raise ScenarioError([Problem("", "the file is empty")], source)
    if not isinstance(data, dict):
        raise ScenarioError([Problem("", f"the top level must be a mapping of keys, got {type(data).__name__}")], source)
    if _expanded_size(data, MAX_EXPANDED_VALUES) > MAX_EXPANDED_VALUES:
        raise ScenarioError([Problem("", f"more than {MAX_EXPANDED_VALUES:,} values once YAML aliases are expanded")], source)
    return data


def validate(data: dict, source: str = "") -> Scenario:
    """Raw mapping -> Scenario, every structural problem reported with its path."""
    try:
        scenario = Scenario.model_validate(data, context=validation_context(source))  # trace files: beside the scenario
    except ValidationError as exc:
        raise ScenarioError(problems_from(exc, root=Scenario), source) from None
    problems = check_method(scenario.method) + _check_names(scenario) + _check_targets(scenario)
    if scenario.worker_count > MAX_WORKERS:
        problems.append(Problem("workers", f"{scenario.worker_count} workers in all; at most {MAX_WORKERS:,}"))
    if problems:
        raise ScenarioError(problems, source)
    return scenario


def _check_names(s: Scenario) -> list[Problem]:
    out = []
    if s.model not in models.MODELS:
        out.append(Problem("model", f"unknown model {s.model!r}; known: {', '.join(sorted(models.MODELS))}"))
    if s.dataset.name not in datasets.DATASETS:
        out.append(Problem("dataset.name", f"unknown dataset {s.dataset.name!r}; known: {', '.join(sorted(datasets.DATASETS))}"))
    names = [g.name for g in s.workers if g.name]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        out.append(Problem("workers", f"group name {dup!r} used twice"))
    return out


def resolve_targets(targets, scenario: Scenario) -> list[int]:
    """Worker indices named by ``targets`` (indices, 'all', or a group name); ValueError if impossible."""
    total = scenario.worker_count
    if targets == "all":
        return list(range(total))
    if isinstance(targets, str):
        start = 0
        for group in scenario.workers:
            if group.name == targets:
                return list(range(start, start + group.count))
            start += group.count
        known = [g.name for g in scenario.workers if g.name]
        raise ValueError(f"no worker group named {targets!r}" + (f"; groups: {', '.join(known)}" if known else " (give groups a name)"))
    bad = [i for i in targets if not 0 <= i < total]
    if bad:
        raise ValueError(f"worker {bad[0]} does not exist (the scenario has {total} workers, 0..{total - 1})")
    return sorted(set(targets))


RESERVED_TARGETS = {"all": "every worker", "server": "the parameter server"}
SERVER_ACTIONS = ("crash", "restart")


def _check_targets(s: Scenario) -> list[Problem]:
    out = []
    for i, event in enumerate(s.faults.at):
        if event.targets == "server" and event.action not in SERVER_ACTIONS:
            out.append(Problem(f"faults.at[{i}].{event.action}", f"the server can only be targeted by {' or '.join(SERVER_ACTIONS)}"))
    checks: list[tuple[str, Any]] = []
    if s.faults.crash:
        checks.append(("faults.crash.workers", s.faults.crash.workers))
    for i, event in enumerate(s.faults.at):
        key = "workers" if event.action in ("cpus", "link") else event.action
        checks.append((f"faults.at[{i}].{key}", event.targets))
    for i, trigger in enumerate(s.faults.triggers):
        checks.append((f"faults.triggers[{i}].worker", (trigger.worker,)))
    for path, targets in checks:
        if targets == "server" and not path.startswith("faults.crash") and not path.startswith("faults.triggers"):
            continue
        try:
            resolve_targets(targets, s)
        except ValueError as exc:
            out.append(Problem(path, str(exc)))
    return out


_INDEX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def apply_override(data: dict, assignment: str) -> None:
    """Apply ``key.path[0].leaf=value`` (value parsed as YAML) to the raw mapping, in place."""
    if "=" not in assignment:
        raise ScenarioError([Problem("--set", f"expected key=value, got {assignment!r}")])
    path, raw_value = assignment.split("=", 1)
    try:
        value = yaml.load(raw_value, Loader=_Loader) if raw_value.strip() else ""  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, RecursionError):
        value = raw_value
    steps: list[str | int] = []
    for piece in path.strip().split("."):
        match = _INDEX.match(piece)
        if not match:
            raise ScenarioError([Problem("--set", f"cannot parse key path {path!r} at {piece!r}")])
        steps.append(match.group(1))
        steps.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))

    def fail(message: str):
        raise ScenarioError([Problem(f"--set {path}", message)])

    def check_key(i: int) -> None:
        model = model_at(tuple(steps[:i]), Scenario)
        if model is None or model is MethodSpec and i == len(steps) - 1:
            return  # free-form here (method parameters are checked by the compressor)
        names = field_names(model)
        if steps[i] not in names:
            close = difflib.get_close_matches(str(steps[i]), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; allowed: {', '.join(names)}"
            fail(f"unknown key {format_path(tuple(steps[: i + 1]))!r}{hint}")

    node: Any = data
    for i, step in enumerate(steps):
        parent = format_path(tuple(steps[:i]))
        last = i == len(steps) - 1
        if isinstance(step, int):
            if not isinstance(node, list):
                fail(f"{parent} is not a list")
            if step >= len(node):
                fail(f"index {step} is out of range: {parent} has {len(node)} item(s)")
        else:
            if not isinstance(node, dict):
                fail(f"{parent} is not a mapping")
            check_key(i)
            if not last and node.get(step) is None:
                # an optional section not in the file (or left empty)
                node[step] = [] if isinstance(steps[i + 1], int) else {}
        if last:
            node[step] = value
        else:
            node = node[step]


def _unshared(value):
    """A copy in which no two places share one object, so that ``--set`` on a node that a YAML
    alias repeats changes that place only. Iterative: the size was bounded by :func:`parse_yaml`."""
    root: list = [None]
    stack = [(value, root, 0)]
    while stack:
        item, parent, key = stack.pop()
        if isinstance(item, dict):
            parent[key] = copy = dict.fromkeys(item)  # keeps the order of the keys
            stack.extend((v, copy, k) for k, v in item.items())
        elif isinstance(item, list):
            parent[key] = copy = [None] * len(item)
            stack.extend((v, copy, i) for i, v in enumerate(item))
        else:
            parent[key] = item
    return root[0]


def load_scenario(path: str | Path, overrides: list[str] = ()) -> tuple[Scenario, dict]:
    """Read, override and validate a scenario file; returns the model and the raw mapping used."""
    source = str(path)
    try:
        with open(path, "rb") as handle:
            blob = handle.read(MAX_FILE_BYTES + 1)  # bounded: /dev/zero or a huge file must not hang
    except OSError as exc:
        raise ScenarioError([Problem("", f"cannot read the file: {exc.strerror}")], source) from None
    if len(blob) > MAX_FILE_BYTES:
        raise ScenarioError([Problem("", f"file larger than {MAX_FILE_BYTES // 1024} KiB")], source)
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError([Problem("", f"not UTF-8 text (byte {exc.start})")], source) from None
    data = parse_yaml(text, source)
    if overrides:
        data = _unshared(data)
    for assignment in overrides:
        try:
            apply_override(data, assignment)
        except ScenarioError as exc:
            raise ScenarioError(exc.problems, source) from None
    if overrides and _expanded_size(data, MAX_EXPANDED_VALUES) > MAX_EXPANDED_VALUES:
        raise ScenarioError([Problem("--set", f"more than {MAX_EXPANDED_VALUES:,} values once YAML aliases are expanded")], source)
    return validate(data, source), data


def json_schema() -> dict:
    """The scenario's JSON Schema; every default is written as a scenario file would write it
    (``cpus: 1.0``, not the :class:`Fixed` it becomes), so that it loads back."""
    from pydantic.json_schema import GenerateJsonSchema

    class FileDefaults(GenerateJsonSchema):
        def encode_default(self, dft):
            if isinstance(dft, typing.get_args(Distribution)):
                return _dump_distribution(dft)
            return super().encode_default(dft)

    return Scenario.model_json_schema(by_alias=True, schema_generator=FileDefaults)
