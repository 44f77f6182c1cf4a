"""Trace files in this project's formats: converted from the published ones, or generated with a seed.

``emulate traces convert --from FORMAT IN OUT`` reads Mahimahi delivery traces, FedScale's
client behaviour and device capacity pickles and Plato-style availability lines and writes the
plain-text formats of docs/TRACES.md (:mod:`emulator.planning.traces` reads them);
``emulate traces generate KIND OUT`` makes small synthetic ones from a seed, so that examples and
tests need no download. Every file written is read back through the scenario's own reader
before the command says it is done: what this module writes, a scenario accepts.
"""

from __future__ import annotations

import csv
import io
import json
import math
import pickle
import re
from pathlib import Path

import numpy as np

from emulator.planning import traces, units
from emulator.planning.traces import TraceError

MTU_BYTES = 1500  # a Mahimahi line is one delivery opportunity of one MTU-sized packet
DEFAULT_MIN_RATE_BPS = 10e3  # a window with no delivery (an outage) becomes this rate: tc cannot shape to 0
CONVERTERS = ("mahimahi", "fedscale-behavior", "fedscale-capacity", "plato")
GENERATORS = ("availability", "link", "compute", "population", "mahimahi")


# -- writing ---------------------------------------------------------------------------------------


def write_rows(out: str | Path, columns: list[str], rows: list[list], kind: str | None, note: str = "") -> Path:
    """Write ``rows`` as CSV or JSON Lines (by ``out``'s extension), then read the file back as a
    ``kind`` trace, so a file this module writes is one a scenario accepts."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise TraceError(str(out), 0, None, "name the output .csv or .jsonl (docs/TRACES.md)")
    buffer = io.StringIO()
    if suffix == ".csv":
        for line in note.splitlines():
            buffer.write(f"# {line}\n")
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        for row in rows:
            buffer.write(json.dumps(dict(zip(columns, row))) + "\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(buffer.getvalue())
    if kind is not None:
        traces.read_trace(out, kind)
    return out


def _num(value: float, digits: int = 3):
    rounded = round(float(value), digits)
    return int(rounded) if rounded == int(rounded) else rounded


# -- converters ------------------------------------------------------------------------------------


def mahimahi(uplink: str | Path, out: str | Path, *, downlink: str | Path | None = None, window_s: float = 1.0,
             min_rate_bps: float = DEFAULT_MIN_RATE_BPS) -> dict:
    """A Mahimahi trace (one delivery time in ms per line; each line one 1500-byte packet) as a
    link trace: the rate of each ``window_s`` window. ``downlink``: a second trace for the other
    direction (the shorter one repeats, as Mahimahi loops it). Windows with no delivery become
    ``min_rate_bps``, the tc floor, and are counted in the result."""
    if not window_s > 0:
        raise TraceError("--window", 0, None, f"must be > 0, got {window_s:g}")
    directions = {"up": _mahimahi_rates(uplink, window_s)}
    if downlink is not None:
        directions["down"] = _mahimahi_rates(downlink, window_s)
    windows = max(len(r) for r in directions.values())
    floored = 0
    rows = []
    for w in range(windows):
        row = [_num(w * window_s)]
        for rates in directions.values():
            rate = rates[w % len(rates)]
            if rate < min_rate_bps:
                floored += 1
                rate = min_rate_bps
            row.append(_num(rate / 1e3))
        rows.append(row)
    columns = ["time_s", *(f"{d}_kbit" for d in directions)]
    note = (f"converted from Mahimahi {Path(uplink).name}" + (f" and {Path(downlink).name}" if downlink else "") +
            f": rate per {window_s:g} s window, 1500-byte packets")
    write_rows(out, columns, rows, "link", note)
    return {"rows": len(rows), "windows_floored": floored, "window_s": window_s}


def _mahimahi_rates(path: str | Path, window_s: float) -> list[float]:
    shown = str(path)
    counts: dict[int, int] = {}
    last_ms, last_line = -1, 0
    for number, text in _lines(path):
        if not text:
            continue
        if not re.fullmatch(r"\d+", text):
            raise TraceError(shown, number, "timestamp", f"expected a whole number of milliseconds, got {text!r}")
        ms = int(text)
        if ms < last_ms:
            raise TraceError(shown, number, "timestamp", f"unsorted: {ms} ms comes after {last_ms} ms (line {last_line})")
        if ms / 1000 > traces.MAX_TRACE_SECONDS:
            raise TraceError(shown, number, "timestamp", f"{ms} ms is more than 31 days: not milliseconds?")
        last_ms, last_line = ms, number
        w = int(ms / 1000 // window_s)
        counts[w] = counts.get(w, 0) + 1
    if last_ms < 0:
        raise TraceError(shown, 0, None, "no timestamps")
    windows = max(1, math.ceil(last_ms / 1000 / window_s))  # Mahimahi repeats the trace after its last timestamp
    length_s = max(last_ms / 1000, window_s)
    rates = []
    for w in range(windows):
        span = min(window_s, length_s - w * window_s) if w == windows - 1 else window_s
        rates.append(counts.get(w, 0) * MTU_BYTES * 8 / span)
    rates[-1] += counts.get(windows, 0) * MTU_BYTES * 8 / window_s  # deliveries at the very last millisecond
    return rates


def _bounded(path: str | Path) -> Path:
    """``path``, once it is known to exist and to be no larger than a trace may be."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TraceError(str(path), 0, None, f"cannot read the file: {exc.strerror}") from None
    if size > traces.MAX_TRACE_BYTES:
        raise TraceError(str(path), 0, None, f"{size >> 20} MiB, larger than {traces.MAX_TRACE_BYTES >> 20} MiB")
    return path


def _lines(path: str | Path):
    path = _bounded(path)
    try:
        with open(path, encoding="utf-8") as handle:
            for number, text in enumerate(handle, 1):
                yield number, text.strip()
    except UnicodeDecodeError as exc:
        raise TraceError(str(path), 0, None, f"not UTF-8 text (byte {exc.start})") from None


class _PlainData(pickle.Unpickler):
    """Unpickles containers and numbers only: a pickle can run any code it names, and these come
    from other people's servers."""

    ALLOWED = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str")} | {
        ("collections", "OrderedDict"), ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy", "dtype")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused: the pickle names {module}.{name}; only plain containers and numbers are read")


def _load_pickle(path: str | Path) -> dict:
    path = _bounded(path)
    try:
        with open(path, "rb") as handle:
            data = _PlainData(handle).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as exc:
        raise TraceError(str(path), 0, None, f"not a readable pickle: {exc}") from None
    if not isinstance(data, dict):
        raise TraceError(str(path), 0, None, f"expected a dict of clients, got {type(data).__name__}")
    return data


def _sample(keys: list, sample: int | None, seed: int) -> list:
    if sample is None or sample >= len(keys):
        return keys
    picks = np.random.default_rng(seed).choice(len(keys), size=sample, replace=False)
    return [keys[int(i)] for i in sorted(picks)]


def fedscale_behavior(path: str | Path, out: str | Path, *, sample: int | None = None, seed: int = 0) -> dict:
    """FedScale's client behaviour trace ``{client: {"active": [s...], "inactive": [e...], ...}}``
    (seconds; the client is online from each active time to the inactive time paired with it) as
    an availability trace. Empty intervals are dropped and overlapping ones merged (counted)."""
    data = _load_pickle(path)
    rows, dropped, merged = [], 0, 0
    for client in _sample(list(data), sample, seed):
        entry = data[client]
        if not isinstance(entry, dict) or "active" not in entry or "inactive" not in entry:
            raise TraceError(str(path), 0, f"{client}", "expected {'active': [...], 'inactive': [...]}")
        try:
            pairs = sorted((float(s), float(e)) for s, e in zip(entry["active"], entry["inactive"]))
        except (TypeError, ValueError):
            raise TraceError(str(path), 0, f"{client}", "active and inactive must be lists of seconds") from None
        kept: list[list[float]] = []
        for s, e in pairs:
            if not (math.isfinite(s) and math.isfinite(e)) or e <= s or s < 0:
                dropped += 1
            elif kept and s <= kept[-1][1]:
                kept[-1][1] = max(kept[-1][1], e)
                merged += 1
            else:
                kept.append([s, e])
        rows += [[client, _num(s), _num(e)] for s, e in kept]
    if not rows:
        raise TraceError(str(path), 0, None, "no client has an online interval")
    write_rows(out, ["device", "start_s", "end_s"], rows, "availability", f"converted from FedScale's behaviour trace {Path(path).name}")
    return {"devices": len({r[0] for r in rows}), "intervals": len(rows), "dropped_empty": dropped, "merged_overlapping": merged}


def fedscale_capacity(path: str | Path, out: str | Path, *, sample: int | None = None, seed: int = 0) -> dict:
    """FedScale's device capacity ``{client: {"computation": ms per sample, "communication": kbit/s}}``
    as a population: ``speed`` = 1000 / computation (samples per second, higher is faster) and
    the communication rate both ways. Entries with a value <= 0 are dropped (counted)."""
    data = _load_pickle(path)
    rows, dropped = [], 0
    for client in _sample(list(data), sample, seed):
        entry = data[client]
        try:
            computation, communication = float(entry["computation"]), float(entry["communication"])
        except (TypeError, KeyError, ValueError):
            raise TraceError(str(path), 0, f"{client}", "expected {'computation': ms, 'communication': kbit/s}") from None
        if not (computation > 0 and communication > 0 and math.isfinite(computation) and math.isfinite(communication)):
            dropped += 1
            continue
        kbit = max(communication, traces.MIN_RATE_BPS / 1e3)
        rows.append([client, _num(1000.0 / computation, 6), _num(kbit), _num(kbit)])
    if not rows:
        raise TraceError(str(path), 0, None, "no client with positive computation and communication")
    write_rows(out, ["device", "speed", "up_kbit", "down_kbit"], rows, "population",
               f"converted from FedScale's device capacity {Path(path).name}: speed = 1000 / computation (samples/s)")
    return {"devices": len(rows), "dropped": dropped}


PLATO_LINE = re.compile(r"^\s*([^:#\s][^:]*?)\s*:\s*([A-Za-z0-9]+)\s*,\s*\[(.*)\]\s*$")
ONLINE = {"1": True, "true": True, "online": True, "available": True, "0": False, "false": False, "offline": False,
          "unavailable": False}


def plato(path: str | Path, out: str | Path, *, length_s: float | None = None) -> dict:
    """Plato-style availability, one device per line: ``id: start_state, [t1, t2, ...]`` (state 1 or
    0, online or offline, at time 0; it flips at each time, in seconds) as an availability trace.
    The last state holds until ``length_s`` (default: the file's latest time)."""
    devices: dict[str, tuple[bool, list[float], int]] = {}
    for number, text in _lines(path):
        if not text or text.startswith("#"):
            continue
        match = PLATO_LINE.match(text)
        if not match:
            raise TraceError(str(path), number, None, f"expected 'id: start_state, [t1, t2, ...]', got {text[:60]!r}")
        device, state, times = match.group(1), match.group(2).lower(), match.group(3)
        if state not in ONLINE:
            raise TraceError(str(path), number, "start_state", f"expected 1/0, online/offline or true/false, got {state!r}")
        if device in devices:
            raise TraceError(str(path), number, "id", f"device {device!r} already given on line {devices[device][2]}")
        try:
            flips = [float(t) for t in times.split(",") if t.strip()]
        except ValueError:
            raise TraceError(str(path), number, "transition times", f"expected numbers of seconds, got [{times[:60]}]") from None
        for a, b in zip(flips, flips[1:]):
            if b <= a:
                raise TraceError(str(path), number, "transition times", f"unsorted: {b:g} s after {a:g} s")
        if flips and flips[0] < 0:
            raise TraceError(str(path), number, "transition times", f"a time must be >= 0, got {flips[0]:g}")
        devices[device] = (ONLINE[state], flips, number)
    if not devices:
        raise TraceError(str(path), 0, None, "no device lines")
    end = length_s if length_s is not None else max((f[-1] for _, f, _ in devices.values() if f), default=0.0)
    rows = []
    for device, (online, flips, number) in devices.items():
        bounds = [0.0, *flips, max(end, flips[-1] if flips else 0.0)]
        for i, (s, e) in enumerate(zip(bounds, bounds[1:])):
            if (online if i % 2 == 0 else not online) and e > s:
                rows.append([device, _num(s), _num(e)])
    if not rows:
        raise TraceError(str(path), 0, None, f"no device is ever online before {end:g} s (give --length)")
    write_rows(out, ["device", "start_s", "end_s"], rows, "availability", f"converted from Plato-style availability {Path(path).name}")
    return {"devices": len(devices), "intervals": len(rows), "length_s": end}


def convert(source: str, infile: str | Path, out: str | Path, **options) -> dict:
    """Dispatch on the published format's name (:data:`CONVERTERS`)."""
    table = {"mahimahi": mahimahi, "fedscale-behavior": fedscale_behavior, "fedscale-capacity": fedscale_capacity, "plato": plato}
    return table[source](infile, out, **options)


# -- the generator ---------------------------------------------------------------------------------


def _walk(rng: np.random.Generator, steps: int, spread: float, correlation: float = 0.8) -> np.ndarray:
    """A stationary log-normal AR(1) around 1 (median): exp of a Gaussian walk of std ``spread``."""
    out = np.empty(steps)
    x = rng.normal(0.0, spread)
    for i in range(steps):
        out[i] = x
        x = correlation * x + math.sqrt(1 - correlation**2) * rng.normal(0.0, spread)
    return np.exp(out)


def generate(kind: str, out: str | Path, *, devices: int = 8, duration_s: float = 600.0, seed: int = 0, window_s: float = 2.0,
             availability: float = 0.7, mean_online_s: float = 120.0, up_bps: float = 2e6, down_bps: float = 10e6,
             spread: float = 0.4, shared: bool = False) -> dict:
    """A synthetic trace of ``kind`` (:data:`GENERATORS`), the same bytes for the same arguments.

    availability: per device, online and offline spells alternate, exponential, online
    ``mean_online_s`` on average, offline as long as makes ``availability`` the expected online
    share; link and compute: a log-normal AR(1) per ``window_s`` window around ``up_bps`` /
    ``down_bps`` (compute: a CPU factor <= 1, background load), per device unless ``shared``;
    population: ``devices`` log-normal speeds (median 1) and rates; mahimahi: a Mahimahi delivery
    file (ms timestamps) of a varying rate around ``up_bps``, for the converter."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 23]))
    if devices < 1 or not duration_s > 0 or not window_s > 0:
        raise TraceError("generate", 0, None, "need --devices >= 1, --duration > 0 and --window > 0")
    ids = [f"d{i}" for i in range(devices)]
    windows = max(1, int(math.ceil(duration_s / window_s)))
    if kind == "availability":
        if not 0 < availability <= 1:
            raise TraceError("generate", 0, "--availability", f"must be in (0, 1], got {availability:g}")
        mean_off = mean_online_s * (1 - availability) / availability
        rows = []
        for device in ids:
            t, online = 0.0, bool(rng.random() < availability)
            while t < duration_s:
                spell = float(rng.exponential(mean_online_s if online else max(mean_off, 1e-9)))
                end = min(duration_s, t + max(spell, 1.0))
                if online:
                    rows.append([device, _num(t), _num(end)])
                t, online = end, not online
            if availability == 1:
                rows = [r for r in rows if r[0] != device] + [[device, 0, _num(duration_s)]]
        write_rows(out, ["device", "start_s", "end_s"], rows, "availability",
                   f"emulate traces generate availability (seed {seed}): {devices} devices, {availability:g} online, "
                   f"{mean_online_s:g} s online on average")
        return {"rows": len(rows), "online_share": sum(r[2] - r[1] for r in rows) / (devices * duration_s)}
    if kind in ("link", "compute"):
        who = [""] if shared else ids
        rows = []
        for device in who:
            if kind == "link":
                up, down = _walk(rng, windows, spread) * up_bps, _walk(rng, windows, spread) * down_bps
                for w in range(windows):
                    values = [_num(w * window_s), _num(max(up[w], 1e3) / 1e3), _num(max(down[w], 1e3) / 1e3)]
                    rows.append(([device] if device else []) + values)
            else:
                load = np.clip(1.0 - 1.0 / _walk(rng, windows, spread), 0.0, 0.9)
                for w in range(windows):
                    rows.append(([device] if device else []) + [_num(w * window_s), _num(1.0 - load[w], 3)])
        columns = ["time_s", "up_kbit", "down_kbit"] if kind == "link" else ["time_s", "cpu_factor"]
        write_rows(out, ([] if shared else ["device"]) + columns, rows, kind,
                   f"emulate traces generate {kind} (seed {seed}): {windows} windows of {window_s:g} s")
        return {"rows": len(rows)}
    if kind == "population":
        speed = _walk(rng, devices, spread * 2, correlation=0.0)
        up, down = _walk(rng, devices, spread, 0.0) * up_bps, _walk(rng, devices, spread, 0.0) * down_bps
        rows = [[d, _num(s, 4), _num(max(u, 1e3) / 1e3), _num(max(v, 1e3) / 1e3)] for d, s, u, v in zip(ids, speed, up, down)]
        write_rows(out, ["device", "speed", "up_kbit", "down_kbit"], rows, "population",
                   f"emulate traces generate population (seed {seed}): {devices} devices")
        return {"rows": len(rows)}
    if kind == "mahimahi":
        rates = _walk(rng, windows, spread) * up_bps
        lines = []
        for w in range(windows):
            packets = int(round(rates[w] * window_s / (MTU_BYTES * 8)))
            start_ms = w * window_s * 1000
            lines += [str(int(start_ms + (i + 0.5) * window_s * 1000 / packets)) for i in range(packets)]
        Path(out).write_text("\n".join(lines) + "\n")
        return {"rows": len(lines)}
    raise TraceError("generate", 0, None, f"unknown kind {kind!r}; one of {', '.join(GENERATORS)}")


def parse_options(duration: str, window: str, up: str, down: str, mean_online: str) -> dict:
    """The generator's options as written on the command line (``10min``, ``2s``, ``2mbit``; a bare
    number of seconds); a ValueError names the option (``--up '10mbps': ... is ambiguous``)."""
    given = {"--duration": (duration, units.parse_duration, "duration_s"), "--window": (window, units.parse_duration, "window_s"),
             "--up": (up, units.parse_rate, "up_bps"), "--down": (down, units.parse_rate, "down_bps"),
             "--mean-online": (mean_online, units.parse_duration, "mean_online_s")}
    options = {}
    for option, (text, parse, key) in given.items():
        try:
            options[key] = parse(text)
        except ValueError as exc:
            raise ValueError(f"{option} {text}: {exc}") from None
        if options[key] <= 0:
            raise ValueError(f"{option} {text}: must be above zero")
    return options


__all__ = ["CONVERTERS", "GENERATORS", "convert", "generate", "write_rows"]
