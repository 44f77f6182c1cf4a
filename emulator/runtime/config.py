"""The device configuration: what the controller writes for each device, and its program reads at start.

One frozen dataclass per role (:class:`ServerConfig`, :class:`WorkerConfig`,
:class:`EvaluatorConfig`), written as one JSON document (``to_json``) and read back with
``DeviceConfig.from_json``, which refuses a missing key, an unknown key or a value of the wrong
type, naming the key and the role. The contract is the classes' fields, nothing else.

:class:`LinkConfig` is one device's link with units in its field names; it is also the plan's
``LinkPlan``, and its fields' ``property`` metadata is the one list of link properties (the
scenario's names: uplink, downlink, delay, jitter, loss). :data:`LINK_FIELDS` maps each to its field.

Standard library only: the runtime image and the Swarm node agent import this without numpy,
pydantic or the controller.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

VERSION = 1  # of the document; a reader refuses any other


class ConfigError(ValueError):
    """A configuration document that is not the contract; the message names the role and the key."""


@dataclass(frozen=True, kw_only=True)
class LinkConfig:
    """One device's link; ``None`` rates and zero delays are unshaped."""

    uplink_bps: float | None = field(default=None, metadata={"property": "uplink"})  # device -> server
    downlink_bps: float | None = field(default=None, metadata={"property": "downlink"})  # server -> device
    delay_s: float = field(default=0.0, metadata={"property": "delay"})  # one-way, each direction
    jitter_s: float = field(default=0.0, metadata={"property": "jitter"})
    loss: float = field(default=0.0, metadata={"property": "loss"})  # fraction of packets dropped, each direction

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "link") -> "LinkConfig":
        return _decode(cls, data, where)


LINK_FIELDS: dict[str, str] = {f.metadata["property"]: f.name for f in dataclasses.fields(LinkConfig)}  # uplink -> uplink_bps
LINK_PROPERTIES: tuple[str, ...] = tuple(LINK_FIELDS)


@dataclass(frozen=True, kw_only=True)
class WireConfig:
    """How a worker writes gradient values and indices (:class:`compression.WireFormat`)."""

    values: str = "f32"  # f32 | f16
    indices: str = "elias_fano"  # elias_fano | raw32


@dataclass(frozen=True, kw_only=True)
class PullConfig:
    """How a worker takes the model (the method's ``pull`` setting, :mod:`.downlink`)."""

    mode: str = "dense"  # dense | delta
    values: str = "f32"  # a delta's values: f32 (lossless) | f16 | q8
    every: int = 1  # pull once every this many pushes

    def hello(self) -> dict:
        """What the server needs to know, for the worker's HELLO (``every`` stays with the worker)."""
        return {"mode": self.mode, "values": self.values}


@dataclass(frozen=True, kw_only=True)
class LocalConfig:
    """Local steps (:mod:`.local`): train H steps, or E epochs, then push the model delta."""

    steps: int | None = None  # H; exactly one of steps and epochs is set
    epochs: int | None = None  # E passes over the worker's shard
    learning_rate: float = 0.1  # the client's step size (the server's is its rule's)


@dataclass(frozen=True, kw_only=True)
class MethodConfig:
    """A worker's side of the method: the compressor, validated at planning, and how it sends and pulls."""

    compressor: str
    params: dict  # the compressor's parameters (its ``Params``), as the plan resolved them
    error_feedback: bool
    wire: WireConfig
    pull: PullConfig
    local: LocalConfig | None = None  # None: one gradient per push


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    dir: str  # as the server sees it
    every_updates: int | None
    every_s: float | None


@dataclass(frozen=True, kw_only=True)
class DeviceConfig:
    """What every device program reads: who it is, the run's token and clock, where traces go."""

    ROLE: ClassVar[str] = ""
    name: str
    token: str  # the run's shared secret, hex
    start_time: float  # the trace clock's zero, seconds since the epoch
    collector: tuple[str, int] | None  # where traces go; None: nowhere

    @property
    def role(self) -> str:
        return self.ROLE

    def to_json(self) -> dict:
        return {"version": VERSION, "role": self.ROLE, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> "DeviceConfig":
        """The config of the document's role (of ``cls``'s role, when called on a role's class)."""
        if not isinstance(data, dict):
            raise ConfigError(f"device config: expected a JSON object, got {type(data).__name__}")
        role = data.get("role")
        target = ROLES.get(role) if isinstance(role, str) else None
        if target is None:
            raise ConfigError(f"device config: key 'role' is {role!r}; known: {', '.join(ROLES)}")
        if cls is not DeviceConfig and target is not cls:
            raise ConfigError(f"{role} config: expected a {cls.ROLE} config")
        if data.get("version") != VERSION:
            raise ConfigError(f"{role} config: key 'version' is {data.get('version')!r}; this program reads version {VERSION}")
        return _decode(target, {k: v for k, v in data.items() if k not in ("version", "role")}, f"{role} config")


@dataclass(frozen=True, kw_only=True)
class ServerConfig(DeviceConfig):
    ROLE: ClassVar[str] = "server"
    seed: int  # the initial model's
    bind: tuple[str, int]  # where to listen, inside the device
    layout: list  # the model's tensors, name and shape each (:meth:`compression.layout.Layout.to_json`)
    rule: str  # the update rule (:data:`emulator.runtime.rules.RULES`)
    learning_rate: float
    max_updates: int | None  # None: until the controller says stop
    transport: LinkConfig  # the part of the link the server's own shaper realises
    checkpoint: CheckpointConfig | None  # None: no checkpoints
    initial: str | None = None  # the initial model, a .npy of float32 the controller wrote; None: the built-in initialisation from seed
    partition: dict | None = None  # the model's split over the servers (:meth:`.partition.Partition.to_json`); None: one server holds it all
    shard: int = 0  # which of the partition's shards this server holds
    aggregation: str = "per_push"  # :data:`emulator.runtime.aggregation.AGGREGATORS` name, or a user's class as the server sees it
    aggregation_params: dict = field(default_factory=dict)  # its keyword arguments


@dataclass(frozen=True, kw_only=True)
class ClientConfig(DeviceConfig):
    """What the devices that connect to the server share."""

    ps: tuple[str, int]  # the parameter server's address as this device sees it
    cpus: float  # the device's CPU share: how many threads are worth using
    model: str  # :data:`emulator.runtime.models.MODELS` name, or a user's model as the device sees it (/workload/net.py:build)
    classes: int
    model_args: dict = field(default_factory=dict)  # the user's function's keyword arguments
    model_output: str = "auto"  # what a user's model returns: auto | logits | probabilities
    connect_timeout_s: float = 300.0  # how long to keep trying to reach the server
    servers: list | None = None  # with several servers: every server's [host, port] as this device sees it, in shard order; None: ``ps`` alone
    partition: dict | None = None  # ... and the model's split over them (:meth:`.partition.Partition.to_json`)


@dataclass(frozen=True, kw_only=True)
class WorkerConfig(ClientConfig):
    ROLE: ClassVar[str] = "worker"
    worker: int  # the worker's index
    incarnation: int  # how often it was restarted
    seed: int  # its batches', its compressor's and its shaper's (a restart draws another)
    shard: str  # its training data, as it sees the file
    batch_size: int
    method: MethodConfig
    transport: LinkConfig  # the part of the link the worker's own shaper realises


@dataclass(frozen=True, kw_only=True)
class EvaluatorConfig(ClientConfig):
    ROLE: ClassVar[str] = "evaluator"
    test_set: str  # as it sees the file
    eval_every_s: float | None  # evaluate every this many seconds of wall time,
    eval_every_updates: int | None  # or every this many updates applied (exactly one is set)


ROLES: dict[str, type[DeviceConfig]] = {c.ROLE: c for c in (ServerConfig, WorkerConfig, EvaluatorConfig)}


# -- reading: the fields' annotations are the schema ---------------------------------------


def _decode(cls: type, data: Any, where: str, prefix: str = ""):
    """``cls`` from a JSON object; ``where`` (whose config) and ``prefix`` (the key path so far) name what is wrong."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'the document'} must be a JSON object, got {data!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    for problem, keys in (("unknown", sorted(set(data) - set(names))), ("missing", [n for n in names if n not in data])):
        if keys:
            raise ConfigError(f"{where}: {problem} key{'s' if keys[1:] else ''} {', '.join(repr(prefix + k) for k in keys)}")
    hints = typing.get_type_hints(cls)
    return cls(**{n: _value(hints[n], data[n], where, prefix + n) for n in names})


def _value(kind, value, where: str, key: str):
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (kind,) = [a for a in args if a is not type(None)]
        origin, args = typing.get_origin(kind), typing.get_args(kind)
    if dataclasses.is_dataclass(kind):
        return _decode(kind, value, where, key + ".")
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: key {key!r} must be a list of {len(args)} values, got {value!r}")
        return tuple(_value(a, v, where, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
        raise ConfigError(f"{where}: key {key!r} must be {kind.__name__}, got {value!r}")
    return value


__all__ = [
    "VERSION", "ConfigError", "LinkConfig", "LINK_FIELDS", "LINK_PROPERTIES", "WireConfig", "PullConfig", "LocalConfig", "MethodConfig",
    "CheckpointConfig", "DeviceConfig", "ServerConfig", "ClientConfig", "WorkerConfig", "EvaluatorConfig", "ROLES",
]
