"""The scenario's schema: typed, immutable pydantic models, and the checks across fields.

A scenario says what to emulate (devices, links, faults) and how to train (model, data,
method). Unknown keys are errors everywhere; a problem names its field
(:mod:`emulator.planning.problems`). Per-device values are distributions
(:mod:`emulator.planning.distributions`); reading a file with line numbers in its errors is
:mod:`emulator.planning.loader`'s, ``--set`` is :mod:`emulator.planning.overrides`'. The
:mod:`emulator.planning.plan` module turns a scenario into a concrete, seeded plan.
"""

from __future__ import annotations

import json
import os
import re
import typing
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from compression.delta import DELTA_VALUES

from emulator import datasets, plugins
from emulator.planning import units
from emulator.planning.backends import CHOICES as BACKEND_CHOICES
from emulator.planning.distributions import (
    BOUNDS,  # noqa: F401 - emulator/planning/plan.py reads it from here (see __all__)
    DISTRIBUTIONS,
    Cpus,
    DelayDist,
    Duration,
    Fixed,
    Fraction,
    LinkDelay,
    LossDist,
    PerDevice,
    PositiveDuration,
    Rate,
    RateDist,
    Size,
    dump_distribution,
)
from emulator.planning.federated import AggregationSpec, LocalSpec
from emulator.planning.methods import check_method
from emulator.planning.problems import Problem, ScenarioError, problems_from
from emulator.planning.traces import GroupTraces, validation_context
from emulator.runtime import models
from emulator.runtime.config import LINK_PROPERTIES
from emulator.runtime.downlink import PULL_MODES
from emulator.runtime.partition import DEFAULT_SPLIT, PARTITIONS

MAX_WORKERS = 10_000
MAX_UPDATES = 10**9  # a billion updates: beyond, a typo (1e21) rather than a run
MAX_SHARDS = 64  # server processes of one run
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
RESERVED_TARGETS = {"all": "every worker", "server": "the parameter server"}
SERVER_ACTIONS = ("crash", "restart")


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


def absolute_reference(value: str, info: ValidationInfo | None, kinds: tuple[str, ...] = (".py",)) -> str:
    """A reference to a user's file (``models/net.py:build``, ``net.keras``) with its path made absolute against
    the scenario file's folder; ValueError if the file is missing or of another kind. Registry names pass as they are.

    Nothing is imported here: planning stays pure (:mod:`emulator.control.workload` imports, when a run asks)."""
    if not isinstance(value, str) or not plugins.is_reference(value):
        return value
    try:
        path, attr = plugins.split(value)
    except plugins.PluginError as error:
        raise ValueError(str(error)) from None
    if not any(path.endswith(kind) for kind in kinds):
        raise ValueError(f"{value!r}: expected a {' or '.join(kinds)} file" + (" and what in it to use (file.py:name)" if ".py" in kinds else ""))
    if path.endswith(".py") and attr is None:
        raise ValueError(f"{value!r}: name what in the file to use: {path}:NAME")
    absolute = plugins.resolve_path(path, _scenario_folder(info) if info is not None else None)
    if not absolute.is_file():
        raise ValueError(f"{path}: no such file" + (f" (looked for {absolute})" if str(absolute) != path else ""))
    return f"{absolute}:{attr}" if attr else str(absolute)


def _model_shorthand(raw):
    """``model: mlp`` / ``model: models/net.py:build`` / ``model: {file: models/net.py, function: build, args: ..}``."""
    if isinstance(raw, str):
        return {"name": raw}
    if isinstance(raw, dict) and "file" in raw:
        rest = {k: v for k, v in raw.items() if k not in ("file", "function")}
        if "name" in raw:
            raise ValueError("give either name or file (with function), not both")
        if not isinstance(raw["file"], str):
            raise ValueError(f"file must be a path, got {raw['file']!r}")
        function = raw.get("function")
        if function is None and str(raw["file"]).endswith(".py"):
            raise ValueError(f"file {raw['file']}: name the function that returns the Keras model (function: build)")
        return {"name": f"{raw['file']}:{function}" if function else raw["file"], **rest}
    if isinstance(raw, dict) and "function" in raw:
        raise ValueError("function goes with file (the Python file that defines it)")
    return raw


class ModelSpec(Strict):
    """A built-in model, or a user's Keras model: a function in a Python file, or a saved ``.keras`` file."""

    name: str = Field("mnist_cnn", description="mnist_cnn | mlp | path/file.py:function | path/model.keras (relative to the scenario)")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the user's function")
    output: Literal["auto", "logits", "probabilities"] = Field(
        "auto", description="what a user's model returns per class (auto: probabilities after a softmax layer, else logits)")

    @field_validator("name")
    @classmethod
    def _reference(cls, value, info):
        return absolute_reference(value, info, kinds=(".py", ".keras"))

    @property
    def is_user(self) -> bool:
        return plugins.is_reference(self.name)


_MODEL_SCHEMA = {"anyOf": [
    {"type": "string", "description": "mnist_cnn | mlp | path/file.py:function | path/model.keras"},
    {"type": "object", "additionalProperties": False, "properties": {
        "name": {"type": "string"}, "file": {"type": "string"}, "function": {"type": "string"},
        "args": {"type": "object"}, "output": {"enum": ["auto", "logits", "probabilities"]}}}]}
DEFAULT_DATASET = datasets.DEFAULT_DATASET
SOURCES = ("name", "file", "loader")


def _share(raw):
    """A fraction as 0.2 or 20%."""
    return units.parse_fraction(raw) if isinstance(raw, str) else raw


def _scenario_folder(info: ValidationInfo) -> str:
    """Where relative paths point: the scenario file's folder (the current one for a scenario without a file)."""
    return (info.context or {}).get("trace_base") or os.getcwd()


class DatasetSpec(Strict):
    """Where the examples come from: one of a built-in (``name``), a user's ``file`` or a user's
    ``loader``; the options that fit it; how the training set is split among workers and how a device
    standardises what it reads (docs/OWN_WORKLOAD.md). Paths are kept absolute, taken against the
    scenario file's folder."""

    name: str | None = Field(None, description=f"a built-in: mnist | mnist-5k | fashion-mnist | digits (default {DEFAULT_DATASET} "
                                                "when neither file nor loader is given)")
    file: str | None = Field(None, description="your data: a .npz (x_train, y_train, x_test, y_test), a .csv, or a folder of "
                                               "images by class; relative to the scenario's folder")
    loader: str | None = Field(None, description="your function, path/to/file.py:function, returning (x_train, y_train, x_test, "
                                                 "y_test) or a mapping of them; imported only by a run")
    args: dict[str, Any] | None = Field(None, description="loader: its keyword arguments")
    label: str | None = Field(None, description="csv: the label column (default label)")
    test_file: str | None = Field(None, description="csv: a second CSV with the test set, same columns")
    test_fraction: Annotated[float | None, BeforeValidator(_share)] = Field(
        None, gt=0, lt=1, description="csv without test_file, image folder without train/ and test/: the share held out "
                                      "for testing, stratified with a fixed seed (default 0.2)")
    image_size: tuple[PositiveInt, PositiveInt] | None = Field(None, description="image folder: resize every image to [height, width]")
    color: Literal["rgb", "grayscale"] | None = Field(None, description="image folder: default grayscale when every image has "
                                                                        "one channel, else rgb")
    standardize: Literal[datasets.STANDARDIZE_MODES] = Field(
        "auto", description="auto: uint8 images per_example, other features per_feature; per_example: each example to mean 0, "
                            "std 1; per_feature: z-scores with the training set's mean and std; none: as given")
    partition: Literal["shards", "iid", "non_iid"] = Field("shards", description="shards: the paper's contiguous split")
    classes_per_worker: PositiveInt | None = None
    dirichlet_alpha: PositiveFloat | None = None
    path: str | None = Field(None, description="a built-in's files (IDX directory or mnist.npz)")
    train_size: SubsetSize = Field(None, description="the first N training examples, a fraction of them (20%), or all")
    test_size: SubsetSize = Field(None, description="the first N test examples, a fraction of them (20%), or all")

    @model_validator(mode="before")
    @classmethod
    def _built_in_by_default(cls, data):
        if isinstance(data, dict) and all(data.get(key) is None for key in SOURCES):
            return {**data, "name": DEFAULT_DATASET}
        return data

    @field_validator("file", "test_file")
    @classmethod
    def _beside_the_scenario(cls, value, info: ValidationInfo):
        return None if value is None else str(plugins.resolve_path(value, _scenario_folder(info)))

    @field_validator("loader")
    @classmethod
    def _a_function_in_a_file(cls, value, info: ValidationInfo):
        if value is None:
            return None
        path, attr = plugins.split(value)
        if attr is None or not path.endswith(plugins.PYTHON_SUFFIX):
            raise ValueError(f"expected path/to/file.py:function (a Python file and the function in it), got {value!r}")
        return f"{plugins.resolve_path(path, _scenario_folder(info))}:{attr}"

    @field_validator("args")
    @classmethod
    def _plain_values(cls, value):
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise ValueError(f"the loader's arguments are numbers, strings, booleans, lists and mappings ({error})") from None
        return value

    @field_validator(*sorted(set().union(*datasets.SOURCE_OPTIONS.values())))
    @classmethod
    def _fits_the_source(cls, value, info: ValidationInfo):
        if value is None:
            return None
        kind = datasets.source_kind({key: info.data.get(key) for key in SOURCES})
        if info.field_name not in datasets.SOURCE_OPTIONS[kind]:
            takers = [datasets.SOURCE_WORDS[k] for k, options in datasets.SOURCE_OPTIONS.items() if info.field_name in options]
            raise ValueError(f"goes with {' or '.join(takers)}, not with {datasets.SOURCE_WORDS[kind]}")
        if info.field_name == "test_fraction" and info.data.get("test_file") is not None:
            raise ValueError("the test set is test_file's; give test_file or test_fraction, not both")
        return value

    @model_validator(mode="after")
    def _one_source(self):
        given = [key for key in SOURCES if getattr(self, key) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of name (a built-in data set), file or loader; got {' and '.join(given)}")
        return self

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
    updates: PositiveInt | None = Field(None, le=MAX_UPDATES)

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
    max_updates: PositiveInt | None = Field(None, le=MAX_UPDATES, description="stop after this many updates applied by the server")
    duration: PositiveDuration | None = Field(None, description="stop after this much wall time")
    eval_every: Annotated[EvalSchedule, BeforeValidator(_eval_every), WithJsonSchema({"anyOf": [  # what _eval_every reads
        {"type": "string"}, {"type": "integer", "minimum": 1},
        {"type": "object", "properties": {"seconds": {"type": "number", "exclusiveMinimum": 0}, "updates": {"type": "integer", "minimum": 1}},
         "additionalProperties": False}]})] = Field(
        default_factory=lambda: EvalSchedule(seconds=30.0), description="30s or '500 updates'"
    )

    @field_validator("max_updates", mode="before")
    @classmethod
    def _at_most_a_billion(cls, value):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_UPDATES:
            raise ValueError(f"must be at most {MAX_UPDATES:,} updates, got {value:g}")
        return value

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
    local: LocalSpec | None = Field(None, description="local steps before each push, which then carries the model delta "
                                                      "(docs/FEDERATED.md): {steps: H} or {epochs: E}")
    aggregation: AggregationSpec = Field(AggregationSpec(), description=(
        "what the server does with arrivals: per_push (default) | fedbuff | fedasync | fedavg, with their parameters"))

    @property
    def params(self) -> dict:
        return dict(self.model_extra or {})

    @field_validator("name", "rule")
    @classmethod
    def _reference(cls, value, info):
        return absolute_reference(value, info)

    @field_validator("aggregation")
    @classmethod
    def _aggregator_reference(cls, value, info):
        name = absolute_reference(value.name, info)  # a user's aggregator, its path against the scenario's folder
        return value if name == value.name else value.model_copy(update={"name": name})


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
    delay: LinkDelay = 0.0
    port: int = Field(7000, ge=1, le=65535)
    shards: int = Field(1, ge=1, le=MAX_SHARDS, description=(
        "server processes holding parts of the model, each a device with these cpus, memory and link"))
    split: Literal[tuple(PARTITIONS)] = Field(DEFAULT_SPLIT, description=(
        "ranges: balanced key ranges of the flat model, cut inside tensors; tensors: whole tensors per shard"))
    when_down: Literal["wait", "skip"] = Field("wait", description=(
        "while one of several servers is down (crashed, restarting): wait = workers reconnect and push nothing "
        "until it is back; skip = they go on with the others, that server's part of each update dropped (counted)"))

    @field_validator("when_down")
    @classmethod
    def _skip_needs_servers(cls, value, info):
        if value == "skip" and info.data.get("shards") == 1:
            raise ValueError("skip goes on with the other servers, and shards: 1 has none (set shards >= 2)")
        return value


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

    @field_validator("cpus", *LINK_PROPERTIES)
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
    delay: LinkDelay | None = None
    jitter: LinkDelay | None = None
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
    model: Annotated[ModelSpec, BeforeValidator(_model_shorthand), WithJsonSchema(_MODEL_SCHEMA)] = Field(
        default_factory=ModelSpec, description="mnist_cnn | mlp | models/net.py:build | {file, function, args, output}")
    dataset: DatasetSpec = DatasetSpec()
    training: TrainingSpec
    method: MethodSpec = MethodSpec()
    server: ServerSpec = ServerSpec()
    evaluator: EvaluatorSpec = EvaluatorSpec()
    workers: list[WorkerGroup] = Field(min_length=1)
    faults: FaultsSpec = FaultsSpec()
    backend: Literal[BACKEND_CHOICES] = Field("auto", description="auto (docker when a daemon answers, else local) or a backend's name")

    @property
    def worker_count(self) -> int:
        return sum(g.count for g in self.workers)


# -- checks across fields ----------------------------------------------------------------


def validate(data: dict, source: str = "") -> Scenario:
    """Raw mapping -> Scenario, every structural problem reported with its path."""
    try:
        scenario = Scenario.model_validate(data, context=validation_context(source))  # trace files: beside the scenario
    except ValidationError as exc:
        raise ScenarioError(problems_from(exc, root=Scenario), source) from None
    problems = check_method(scenario.method, scenario.worker_count, scenario.server.shards) + _check_names(scenario) + _check_targets(scenario)
    if scenario.worker_count > MAX_WORKERS:
        problems.append(Problem("workers", f"{scenario.worker_count} workers in all; at most {MAX_WORKERS:,}"))
    if problems:
        raise ScenarioError(problems, source)
    return scenario


def _check_names(s: Scenario) -> list[Problem]:
    out = []
    if not s.model.is_user and s.model.name not in models.MODELS:
        out.append(Problem("model", f"unknown model {s.model.name!r}; known: {', '.join(sorted(models.MODELS))}, "
                                    "or your own: path/file.py:function"))
    elif not s.model.is_user and s.model.args:
        out.append(Problem("model.args", f"the built-in model {s.model.name} takes no arguments"))
    if s.dataset.name is not None and s.dataset.name not in datasets.DATASETS:
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


def server_names(shards: int) -> tuple[str, ...]:
    """The servers' device names: ``server`` alone, or ``server-0 .. server-(N-1)``."""
    return ("server",) if shards == 1 else tuple(f"server-{i}" for i in range(shards))


def is_server_target(targets) -> bool:
    """``server`` (every server) or ``server-<i>`` (one shard)."""
    return isinstance(targets, str) and (targets == "server" or (targets.startswith("server-") and targets[7:].isdigit()))


def resolve_servers(targets: str, scenario: Scenario) -> tuple[str, ...]:
    """The server names a target means; ValueError for a shard the scenario does not have."""
    names = server_names(scenario.server.shards)
    if targets == "server":
        return names
    if targets not in names:
        raise ValueError(f"no server named {targets!r}: the scenario's servers are {', '.join(names)}")
    return (targets,)


def _check_targets(s: Scenario) -> list[Problem]:
    out = []
    for i, event in enumerate(s.faults.at):
        if is_server_target(event.targets):
            try:
                resolve_servers(event.targets, s)
            except ValueError as exc:
                out.append(Problem(f"faults.at[{i}].{event.action}", str(exc)))
        if is_server_target(event.targets) and event.action not in SERVER_ACTIONS:
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
        if is_server_target(targets) and not path.startswith("faults.crash") and not path.startswith("faults.triggers"):
            continue
        try:
            resolve_targets(targets, s)
        except ValueError as exc:
            out.append(Problem(path, str(exc)))
    return out


def json_schema() -> dict:
    """The scenario's JSON Schema; every default is written as a scenario file would write it
    (``cpus: 1.0``, not the :class:`Fixed` it becomes), so that it loads back."""
    from pydantic.json_schema import GenerateJsonSchema

    class FileDefaults(GenerateJsonSchema):
        def encode_default(self, dft):
            if isinstance(dft, DISTRIBUTIONS):
                return dump_distribution(dft)
            return super().encode_default(dft)

    return Scenario.model_json_schema(by_alias=True, schema_generator=FileDefaults)


# BOUNDS belongs to distributions; the plan still imports it with the schema.
__all__ = ["ACTIONS", "BOUNDS", "MAX_WORKERS", "NAME_PATTERN", "RESERVED_TARGETS", "SERVER_ACTIONS", "CheckpointSpec",
           "CrashProcess", "DatasetSpec", "ModelSpec", "absolute_reference", "EvalSchedule", "EvaluatorSpec", "FaultsSpec", "LinkChange", "MethodSpec",
           "PullSpec", "Scenario", "ServerSpec", "SubsetSize", "Targets", "TimedEvent", "TrainingSpec", "Trigger",
           "WireSpec", "WorkerGroup", "json_schema", "resolve_targets", "validate"]
