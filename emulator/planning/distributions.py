"""The values a scenario's device field may take: one value, a list per device, or a distribution.

``cpus: {uniform: [0.05, 0.25]}`` is a :class:`Uniform` here; the planner draws each device's
value from it with the scenario's seed. Quantities carry units as people write them (``2mbit``,
``30ms``, ``0.1%``); :data:`BOUNDS` says what every drawn value must meet, and the annotated types
(:data:`Cpus`, :data:`RateDist`, :data:`Rate`, ...) are what the schema's fields are declared with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Union

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from emulator.planning import units



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
DISTRIBUTIONS = (Fixed, Uniform, Normal, Choice, PerDevice)

_DIST_SCHEMA = {
    "anyOf": [
        {"type": ["number", "string"], "description": "one value for every device"},
        {"type": "array", "description": "one value per device of the group"},
        {"type": "object", "properties": {"uniform": {"type": "array", "minItems": 2, "maxItems": 2}}, "required": ["uniform"]},
        {"type": "object", "properties": {"normal": {}, "clip": {"type": "array"}}, "required": ["normal"]},
        {"type": "object", "properties": {"choice": {"type": "array"}, "weights": {"type": "array"}}, "required": ["choice"]},
    ]
}


def _bounded(parse: Callable[[Any], float], *, gt: float | None = None, ge: float | None = None,
             within: tuple[float | None, float | None] = (None, None), show: Callable[[float], str] = "{:g}".format,
             hint: str = "") -> Callable[[Any], float]:
    """``parse`` and check the bounds: ``gt``/``ge`` what the quantity can be, ``within`` (low,
    high) what it sensibly is, whose message shows the value as read (``show``) and ``hint``,
    what the user probably meant."""
    low, high = within

    def check(raw):
        value = parse(raw)
        if gt is not None and not value > gt:
            raise ValueError(f"must be > {gt:g}, got {raw!r}")
        if ge is not None and not value >= ge:
            raise ValueError(f"must be >= {ge:g}, got {raw!r}")
        if low is not None and not value >= low:
            raise ValueError(f"must be at least {show(low)}, got {raw!r} ({show(value)}){hint}")
        if high is not None and not value <= high:
            raise ValueError(f"must be at most {show(high)}, got {raw!r} ({show(value)}){hint}")
        return value

    return check


def _parse_distribution(parse: Callable[[Any], float], unit: Callable[[Any], float]) -> Callable[[Any], Distribution]:
    """``parse`` reads one value with the field's bounds; ``unit`` reads a spread (std) in the same unit."""

    def convert(raw):
        if isinstance(raw, DISTRIBUTIONS):
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


def dump_distribution(dist: Distribution):
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
        PlainSerializer(dump_distribution, when_used="json"),
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


# What a link or a device may be: beyond these, a unit mistake is likelier than the value meant
# (``delay: 10`` is 10 s, not 10 ms; ``uplink: 2`` is 2 bit/s).
MIN_RATE_BPS = 1e3
MAX_RATE_BPS = 100e9
MAX_DELAY_S = 5.0  # one way; a geostationary satellite hop is 0.27 s
MAX_CPUS = 1024.0
_RATE_HINT = "; a bare number is bits/s: write 2mbit, 500kbit or 1MB/s"
_DELAY_HINT = "; a bare number is seconds and m minutes: write 30ms for milliseconds"


def _rate_bounds() -> Callable[[Any], float]:
    return _bounded(units.parse_rate, gt=0, within=(MIN_RATE_BPS, MAX_RATE_BPS), show=units.format_rate, hint=_RATE_HINT)


def _delay_bounds() -> Callable[[Any], float]:
    return _bounded(units.parse_duration, ge=0, within=(None, MAX_DELAY_S), show=units.format_duration, hint=_DELAY_HINT)


# Bounds every sampled value must meet; the planner checks draws against them too.
BOUNDS: dict[str, Callable[[Any], float]] = {
    "cpus": _bounded(_number, gt=0, within=(None, MAX_CPUS)),
    "uplink": _rate_bounds(),
    "downlink": _rate_bounds(),
    "delay": _delay_bounds(),
    "jitter": _delay_bounds(),
    "loss": units.parse_fraction,
}
Cpus = distribution(BOUNDS["cpus"], _number, "CPU cores of quota per device, e.g. 0.25")
RateDist = distribution(BOUNDS["uplink"], units.parse_rate, "link rate, e.g. 2mbit (bits/s) or 125kB/s (bytes/s)")
DelayDist = distribution(BOUNDS["delay"], units.parse_duration, "one-way delay, e.g. 30ms")
LossDist = distribution(BOUNDS["loss"], units.parse_fraction, "packet loss, e.g. 0.1% or 0.001")
Rate = quantity(_rate_bounds(), "link rate, e.g. 100mbit")
LinkDelay = quantity(_delay_bounds(), "one-way delay, e.g. 30ms")
Duration = quantity(_bounded(units.parse_duration, ge=0), "duration, e.g. 30s, 250ms, 2min")
PositiveDuration = quantity(_bounded(units.parse_duration, gt=0), "duration, e.g. 30s, 2min")
Size = Annotated[int, BeforeValidator(_bounded(units.parse_size, gt=0)), WithJsonSchema({"type": ["integer", "string"], "description": "bytes, e.g. 512m, 2g"})]
Fraction = quantity(units.parse_fraction, "fraction, e.g. 0.1% or 0.001")
