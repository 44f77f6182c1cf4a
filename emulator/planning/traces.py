"""Devices from traces: availability, link, compute and populations read from plain-text files.

A worker group's ``traces:`` block names files in the formats of docs/TRACES.md (CSV or JSON
Lines, units in the column names: ``time_s``, ``up_mbit``, ``delay_ms``) and says how to replay
them (``speedup``, per-device ``offset``, ``loop``, which trace devices become which workers,
what "offline" means). Files are read and checked when the scenario is validated, so a bad
trace is a :class:`~emulator.planning.problems.ScenarioError` naming file, line and field (exit
2); :mod:`emulator.planning.replay` turns them into the plan's timed events. It imports nothing
of the scenario or the plan: the scenario's schema holds a :class:`GroupTraces`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, ValidationInfo, WithJsonSchema, model_validator

from emulator.planning import units

MAX_TRACE_BYTES = 128 << 20  # a file larger than this is refused before it is read
MAX_TRACE_ROWS = 5_000_000
MAX_TRACE_SECONDS = 31 * 86400.0  # a time beyond a month is taken as a unit mistake (ms written as s)
MAX_RATE_BPS = 100e9
MIN_RATE_BPS = 1e3  # below 1 kbit/s: a unit mistake (Mbit/s written as bit/s) more likely than a link
MAX_DELAY_S = 60.0
MAX_CPUS = 1024.0
DEFAULT_CPU_RANGE = (0.05, 1.0)

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "min": 60.0, "h": 3600.0}
RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
# Byte or bit? tc (and this project's scenario files) read kbps as kilobytes/s, FedScale and most
# papers as kilobits/s: a column named so is refused rather than guessed.
AMBIGUOUS_RATE_UNITS = ("bps", "kbps", "mbps", "gbps", "bytes", "kb", "mb")


class TraceError(ValueError):
    """A problem in a trace file: which file, which line (0: the file as a whole), which field."""

    def __init__(self, path: str, line: int, field_name: str | None, message: str):
        self.path, self.line, self.field, self.message = path, line, field_name, message
        where = path + (f", line {line}" if line else "") + (f", field {field_name}" if field_name else "")
        super().__init__(f"{where}: {message}")


# -- columns: a name, and the unit its suffix gives --------------------------------------------------

# kind -> column quantity -> (required, unit table or None for a plain number)
QUANTITIES: dict[str, dict[str, tuple[bool, dict[str, float] | None]]] = {
    "availability": {"device": (True, None), "start": (True, TIME_UNITS), "end": (True, TIME_UNITS)},
    "link": {"device": (False, None), "time": (True, TIME_UNITS), "up": (False, RATE_UNITS), "down": (False, RATE_UNITS),
             "delay": (False, TIME_UNITS), "loss": (False, {"": 1.0, "pct": 0.01})},
    "compute": {"device": (False, None), "time": (True, TIME_UNITS), "cpus": (False, {"": 1.0}), "cpu_factor": (False, {"": 1.0})},
    "population": {"device": (False, None), "speed": (False, {"": 1.0}), "up": (False, RATE_UNITS), "down": (False, RATE_UNITS)},
}
# at least one of these per kind
VALUE_COLUMNS = {"availability": ("start",), "link": ("up", "down", "delay", "loss"), "compute": ("cpus", "cpu_factor"),
                 "population": ("speed", "up", "down")}


def _column(kind: str, name: str, path: str, line: int) -> tuple[str, float]:
    """(quantity, factor to base units) of a column name such as ``up_mbit`` or ``time_ms``."""
    known = QUANTITIES[kind]
    raw = name.strip()
    lowered = raw.lower()
    if lowered in known and known[lowered][1] is not None and "" not in known[lowered][1]:
        suffixes = ", ".join(f"{lowered}_{u}" for u in known[lowered][1])
        raise TraceError(path, line, raw, f"needs its unit in the name: {suffixes}")
    if lowered in known:
        return lowered, 1.0
    quantity, _, unit = lowered.rpartition("_")
    if quantity in known and known[quantity][1] is not None:
        table = known[quantity][1]
        if unit in table:
            return quantity, table[unit]
        if table is RATE_UNITS and unit in AMBIGUOUS_RATE_UNITS:
            bits = {"kbps": "kbit", "mbps": "mbit", "gbps": "gbit", "kb": "kbit", "mb": "mbit"}.get(unit, "bit")
            raise TraceError(path, line, raw, f"unit {unit!r} is ambiguous (bytes or bits per second?): if the values are "
                                              f"bits/s, name the column {quantity}_{bits}; if they are bytes/s, multiply them by 8 "
                                              f"and name it {quantity}_{bits} (columns are in bits/s: {quantity}_bit, "
                                              f"{quantity}_kbit, {quantity}_mbit or {quantity}_gbit)")
        raise TraceError(path, line, raw, f"unknown unit {unit!r}; use " + ", ".join(f"{quantity}_{u}" if u else quantity for u in table))
    allowed = ", ".join(f"{q}_<{'|'.join(t)}>" if t and "" not in t else q for q, (_, t) in known.items())
    raise TraceError(path, line, raw, f"unknown column for a {kind} trace; columns: {allowed}")


# -- reading ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One device's rows (or the whole file's, for a trace without a device column), in trace seconds."""

    times: tuple[float, ...]  # row times (link, compute) or interval starts (availability)
    values: tuple[Any, ...]  # a dict of base-unit values per row; the interval's end for availability
    lines: tuple[int, ...]


@dataclass(frozen=True)
class TraceFile:
    path: str  # as the scenario gives it
    kind: str
    columns: tuple[str, ...]  # quantities present
    series: dict[str, Series]  # device id -> its rows ("" when the file has no device column)
    digest: str

    @property
    def per_device(self) -> bool:
        return "device" in self.columns

    @property
    def devices(self) -> list[str]:
        return list(self.series)  # in the order of their first row

    @property
    def length(self) -> float:
        """The trace's duration: the last interval's end; for rows, the last time plus the step before it."""
        if self.kind == "availability":
            return max((max(s.values) for s in self.series.values() if s.values), default=0.0)
        ends = []
        for s in self.series.values():
            step = s.times[-1] - s.times[-2] if len(s.times) > 1 else 0.0
            ends.append(s.times[-1] + step)
        return max(ends, default=0.0)


def _rows(path: Path, shown: str):
    """(line number, {column: text}) of a CSV or JSON Lines file; '#' lines and blank lines skipped."""
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise TraceError(shown, 0, None, f"unknown trace format {suffix or '(no extension)'!r}: name it .csv or .jsonl (docs/TRACES.md)")
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(shown, 0, None, f"cannot read the file: {exc.strerror}") from None
    if size > MAX_TRACE_BYTES:
        raise TraceError(shown, 0, None, f"{size / 2**20:.0f} MiB, larger than {MAX_TRACE_BYTES >> 20} MiB: keep fewer devices "
                                          "(emulate traces convert --sample N does so for FedScale's files)")
    try:
        handle = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise TraceError(shown, 0, None, f"cannot read the file: {exc.strerror}") from None
    with handle:
        header: list[str] | None = None
        count = 0
        try:
            for number, text in enumerate(handle, 1):
                stripped = text.strip()
                if not stripped or stripped.startswith("#"):
                    continue
                count += 1
                if count > MAX_TRACE_ROWS + 1:
                    raise TraceError(shown, number, None, f"more than {MAX_TRACE_ROWS:,} rows")
                if suffix == ".jsonl":
                    try:
                        row = json.loads(stripped)
                    except ValueError as exc:
                        raise TraceError(shown, number, None, f"not a JSON object: {exc}") from None
                    if not isinstance(row, dict):
                        raise TraceError(shown, number, None, f"expected a JSON object, got {type(row).__name__}")
                    yield number, row
                    continue
                cells = next(csv.reader([stripped]))
                if header is None:
                    header = [c.strip() for c in cells]
                    yield number, header
                    continue
                if len(cells) != len(header):
                    raise TraceError(shown, number, None, f"{len(cells)} fields, the header has {len(header)}")
                yield number, dict(zip(header, cells))
        except UnicodeDecodeError as exc:
            raise TraceError(shown, 0, None, f"not UTF-8 text (byte {exc.start})") from None


def _number(raw, path: str, line: int, column: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise TraceError(path, line, column, f"expected a number, got {raw!r}")
    try:
        value = float(raw)
    except (ValueError, OverflowError):
        hint = " (the unit goes in the column's name, the cells hold numbers)" if isinstance(raw, str) and any(c.isalpha() for c in raw) else ""
        raise TraceError(path, line, column, f"expected a number, got {raw!r}{hint}") from None
    if not math.isfinite(value):
        raise TraceError(path, line, column, f"expected a finite number, got {raw!r}")
    return value


def _check_value(quantity: str, value: float, path: str, line: int, column: str) -> None:
    """Bounds each quantity must meet, and the magnitudes that betray a wrong unit."""
    if quantity in ("time", "start", "end"):
        if value < 0:
            raise TraceError(path, line, column, f"a time must be >= 0, got {value:g}")
        if value > MAX_TRACE_SECONDS:
            raise TraceError(path, line, column, f"{value:g} s is more than 31 days: a wrong unit? (milliseconds go in a column named "
                                                 f"{quantity}_ms)")
    elif quantity in ("up", "down"):
        if value <= 0:
            raise TraceError(path, line, column, f"a rate must be > 0 bits/s, got {value:g} (an outage is an availability trace)")
        if value > MAX_RATE_BPS:
            raise TraceError(path, line, column, f"{value:g} bits/s is more than 100 Gbit/s: a wrong unit?")
        if value < MIN_RATE_BPS:
            raise TraceError(path, line, column, f"{value:g} bits/s is less than 1 kbit/s: a wrong unit? (Mbit/s go in a column "
                                                 f"named {quantity}_mbit)")
    elif quantity == "delay":
        if not 0 <= value <= MAX_DELAY_S:
            raise TraceError(path, line, column, f"a delay must be between 0 and 60 s, got {value:g} s (milliseconds: delay_ms)")
    elif quantity == "loss":
        if not 0 <= value <= 1:
            raise TraceError(path, line, column, f"a loss must be a fraction between 0 and 1, got {value:g} (percent: loss_pct)")
    elif quantity in ("cpus", "cpu_factor", "speed"):
        if not 0 < value <= MAX_CPUS * (1 if quantity == "cpus" else 1e9):
            raise TraceError(path, line, column, f"must be > 0{' and at most 1024 cores' if quantity == 'cpus' else ''}, got {value:g}")


def read_trace(path: str | Path, kind: str, shown: str | None = None) -> TraceFile:
    """Read and check one trace file of ``kind`` (availability, link, compute, population)."""
    path = Path(path)
    shown = shown or str(path)
    columns: dict[str, tuple[str, float]] | None = None
    rows: dict[str, list[tuple[int, dict]]] = {}
    digest = hashlib.sha256()
    for number, row in _rows(path, shown):
        if columns is None or isinstance(row, dict) and path.suffix.lower() == ".jsonl" and set(row) != set(columns):
            names = row if isinstance(row, list) else list(row)
            if columns is not None:  # a JSON Lines row with other keys than the first
                extra = sorted(set(names) - set(columns))
                missing = sorted(set(columns) - set(names))
                raise TraceError(shown, number, (extra or missing)[0], "key not in the first row" if extra else "missing (every row has the first row's keys)")
            columns = {}
            for name in names:
                quantity, factor = _column(kind, name, shown, number)
                if any(q == quantity for q, _ in columns.values()):
                    raise TraceError(shown, number, name, f"a second {quantity} column")
                columns[name] = (quantity, factor)
            present = {q for q, _ in columns.values()}
            for quantity, (required, _) in QUANTITIES[kind].items():
                if required and quantity not in present:
                    raise TraceError(shown, number, quantity, f"missing: a {kind} trace needs a {quantity} column")
            if not present & set(VALUE_COLUMNS[kind]):
                raise TraceError(shown, number, None, f"no value column: give one of {', '.join(VALUE_COLUMNS[kind])}")
            if kind == "compute" and {"cpus", "cpu_factor"} <= present:
                raise TraceError(shown, number, "cpu_factor", "give cpus (cores) or cpu_factor (of the device's own quota), not both")
            if isinstance(row, list):
                continue
        values = {}
        device = ""
        for name, (quantity, factor) in columns.items():
            raw = row[name]
            if quantity == "device":
                device = str(raw).strip()
                if not device:
                    raise TraceError(shown, number, name, "empty device id")
                continue
            value = _number(raw, shown, number, name) * factor
            _check_value(quantity, value, shown, number, name)
            values[quantity] = value
        digest.update(json.dumps([device, values], sort_keys=True).encode())
        rows.setdefault(device, []).append((number, values))
    if columns is None or not rows:
        raise TraceError(shown, 0, None, "no rows: a header and at least one row are needed (docs/TRACES.md)")
    present = tuple(q for q, _ in columns.values())
    names = {quantity: name for name, (quantity, _) in columns.items()}
    series = {device: _series(kind, device, entries, shown, names) for device, entries in rows.items()}
    return TraceFile(shown, kind, present, series, digest.hexdigest()[:16])


def _series(kind: str, device: str, entries: list[tuple[int, dict]], shown: str, names: dict[str, str]) -> Series:
    """A device's rows, checked for order: times strictly increasing from 0; intervals sorted and apart."""
    who = f" (device {device})" if device else ""
    if kind == "population":
        return Series((), tuple(values for _, values in entries), tuple(n for n, _ in entries))
    if kind == "availability":
        previous_start, previous_end, previous_line = -1.0, -1.0, 0
        for number, values in entries:
            if values["end"] <= values["start"]:
                raise TraceError(shown, number, names["end"], f"an interval must end after it starts ({values['end']:g} <= {values['start']:g})")
            if values["start"] < previous_start:
                raise TraceError(shown, number, names["start"], f"unsorted: starts before the interval on line {previous_line}{who}")
            if values["start"] < previous_end:
                raise TraceError(shown, number, names["start"], f"overlaps the interval on line {previous_line}{who}, which ends at {previous_end:g} s")
            previous_start, previous_end, previous_line = values["start"], values["end"], number
        return Series(tuple(v["start"] for _, v in entries), tuple(v["end"] for _, v in entries), tuple(n for n, _ in entries))
    previous, previous_line = None, 0
    for number, values in entries:
        t = values["time"]
        if previous is None and t != 0:
            raise TraceError(shown, number, names["time"], f"the first row{who} must be at time 0 (what holds before it is undefined), got {t:g} s")
        if previous is not None and t <= previous:
            word = "repeats" if t == previous else "unsorted: goes back from"
            raise TraceError(shown, number, names["time"], f"{word} the time of line {previous_line}{who} ({previous:g} s)")
        previous, previous_line = t, number
    return Series(tuple(v["time"] for _, v in entries), tuple({k: x for k, x in v.items() if k != "time"} for _, v in entries),
                  tuple(n for n, _ in entries))


_CACHE: dict[tuple, TraceFile] = {}  # (path, size, mtime, kind) -> the file read: a sweep validates its scenario per point


def load(path: Path, kind: str, shown: str) -> TraceFile:
    try:
        stat = path.stat()
    except OSError as exc:
        raise TraceError(shown, 0, None, f"cannot read the file: {exc.strerror}") from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, kind, shown)
    if key not in _CACHE:
        if len(_CACHE) > 32:
            _CACHE.clear()
        _CACHE[key] = read_trace(path, kind, shown)
    return _CACHE[key]


# -- the scenario's block ---------------------------------------------------------------------------


def validation_context(source: str | Path | None) -> dict:
    """What :meth:`Scenario.model_validate` needs to find trace files: the scenario file's directory."""
    return {"trace_base": str(Path(source).resolve().parent) if source else os.getcwd()}


def _offset(raw):
    if raw == "random":
        return raw
    if isinstance(raw, list):
        if not raw:
            raise ValueError("a per-device list of offsets needs at least one value")
        return tuple(_nonnegative(v) for v in raw)
    if isinstance(raw, dict):
        if set(raw) != {"uniform"} or not isinstance(raw["uniform"], list) or len(raw["uniform"]) != 2:
            raise ValueError("expected {uniform: [low, high]}")
        low, high = (_nonnegative(v) for v in raw["uniform"])
        if low > high:
            raise ValueError(f"uniform: low {low:g} s is above high {high:g} s")
        return {"uniform": (low, high)}
    return _nonnegative(raw)


def _nonnegative(raw) -> float:
    value = units.parse_duration(raw)
    if value < 0:
        raise ValueError(f"an offset must be >= 0, got {raw!r}")
    return value


def _devices(raw):
    if isinstance(raw, list):
        if not raw or any(isinstance(v, (bool, dict, list)) or v is None for v in raw):
            raise ValueError("expected 'random', 'in_order' or a list of device ids")
        return tuple(str(v) for v in raw)
    return raw


def _cpu_range(raw):
    if raw == "machine":
        return raw
    if not isinstance(raw, (list, tuple)) or len(raw) != 2:
        raise ValueError("expected [low, high] cores or 'machine'")
    low, high = (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan for v in raw)
    if not (0 < low <= high):
        raise ValueError(f"expected 0 < low <= high, got {list(raw)}")
    return (low, high)


def _speedup(raw):
    value = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"must be a number > 0, got {raw!r}")
    return value


Offset = Annotated[Union[float, tuple[float, ...], dict, Literal["random"]], BeforeValidator(_offset), WithJsonSchema({
    "anyOf": [{"type": ["number", "string"]}, {"type": "array"}, {"type": "object", "properties": {"uniform": {"type": "array"}}}],
    "description": "where in the trace each device starts (trace time): a duration, one per device, {uniform: [0s, 1h]} or "
                   "random (uniform over the trace's length)"})]
Devices = Annotated[Union[Literal["random", "in_order"], tuple[str, ...]], BeforeValidator(_devices), WithJsonSchema({
    "anyOf": [{"enum": ["random", "in_order"]}, {"type": "array", "items": {"type": ["string", "integer"]}}],
    "description": "which trace devices become the group's workers: random (seeded), in_order, or their ids"})]
CpuRange = Annotated[Union[Literal["machine"], tuple[float, float]], BeforeValidator(_cpu_range), WithJsonSchema({
    "anyOf": [{"const": "machine"}, {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}],
    "description": "the CPU quotas a population's speeds are scaled onto: [low, high] cores, or machine"})]
Speedup = Annotated[float, BeforeValidator(_speedup), WithJsonSchema({"type": "number", "exclusiveMinimum": 0})]
Length = Annotated[float, BeforeValidator(units.parse_duration), WithJsonSchema({"type": ["number", "string"]})]

KINDS = ("availability", "link", "compute", "population")


class GroupTraces(BaseModel):
    """A worker group's traces (docs/TRACES.md). Files are read when the scenario is validated,
    relative to the scenario file's directory."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    availability: str | None = Field(None, description="CSV / JSON Lines: device, start_s, end_s: when each device is online")
    offline: Literal["pause", "crash"] = Field("pause", description="offline is pause (back: resume) or crash (back: restart)")
    link: str | None = Field(None, description="[device,] time_s, up_mbit, down_mbit, delay_ms, loss: the link over time")
    compute: str | None = Field(None, description="[device,] time_s, cpus (cores) or cpu_factor: the CPU quota over time")
    population: str | None = Field(None, description="[device,] speed, up_kbit, down_kbit: devices drawn with the seed")
    devices: Devices = "random"
    speedup: Speedup = Field(1.0, description="trace seconds per run second (60: an hour of trace in a minute)")
    offset: Offset = 0.0
    loop: bool = Field(True, description="replay the trace again from its start when a device reaches its end")
    length: Length | None = Field(None, description="the trace's length for loop (default: its last end, or last time + last step)")
    cpu_range: CpuRange = Field(DEFAULT_CPU_RANGE, description="population speeds are scaled onto these quotas, rank kept")
    scaling: Literal["log", "rank"] = Field("log", description="log: log-linear min-max of speed; rank: by quantile")
    _files: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _read_files(self, info: ValidationInfo):
        if not any(getattr(self, kind) for kind in KINDS):
            raise ValueError(f"name at least one trace file: {', '.join(KINDS)}")
        if self.length is not None and not self.length > 0:
            raise ValueError("length must be > 0")
        base = Path((info.context or {}).get("trace_base") or os.getcwd())
        problems = []
        for kind in KINDS:
            name = getattr(self, kind)
            if name is None:
                continue
            try:
                self._files[kind] = load(base / name, kind, name)
            except TraceError as exc:
                problems.append(f"{kind}: {exc}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def file(self, kind: str) -> TraceFile | None:
        return self._files.get(kind)


__all__ = ["GroupTraces", "KINDS", "Series", "TraceError", "TraceFile", "load", "read_trace", "validation_context"]
