"""Quantities as people write them in scenario files: ``2mbit``, ``30ms``, ``0.1%``, ``512m``.

Every parser returns a plain number in base units (bits per second, seconds, a fraction
in [0, 1], bytes) and raises ``ValueError`` with a message that quotes the input, so the
scenario loader can report ``workers[0].uplink: '10mbps' is ambiguous: ...``.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z%/]*)\s*$")

# Bits per second: bit, kbit, mbit, gbit, tbit (decimal prefixes, any case; also written kbit/s),
# kibit, mibit, gibit (binary). k/m/g are decimal.
_RATE_UNITS = {
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "kibit": 1024, "mibit": 1024**2, "gibit": 1024**3,
}
# Bytes per second, with a capital B and /s: B/s, kB/s (or KB/s), MB/s, GB/s (decimal).
_BYTE_RATE_UNITS = {"B/s": 8, "kB/s": 8e3, "KB/s": 8e3, "MB/s": 8e6, "GB/s": 8e9}
# tc reads kbps as kilobytes/s, most people (and Fogify's 10Mbps) as kilobits/s: refused, both readings offered.
_AMBIGUOUS_RATE = {"bps": ("bit", "B/s", 1), "kbps": ("kbit", "kB/s", 1e3), "mbps": ("mbit", "MB/s", 1e6),
                   "gbps": ("gbit", "GB/s", 1e9), "b/s": ("bit", "B/s", 1), "kb/s": ("kbit", "kB/s", 1e3),
                   "mb/s": ("mbit", "MB/s", 1e6), "gb/s": ("gbit", "GB/s", 1e9)}
_DURATION_UNITS = {
    "": 1.0, "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
}
_SIZE_UNITS = {
    "": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1024**2, "mb": 1000**2,
    "mib": 1024**2, "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
}


def _split(text: str, kind: str) -> tuple[float, str]:
    match = _QUANTITY.match(str(text))
    if not match:
        raise ValueError(f"not a {kind}: {text!r}")
    return float(match.group(1)), match.group(2).lower()


def _finite(number: float, value, kind: str) -> float:
    """Refuse inf/nan (``.inf`` in YAML, ``1e999mbit``): they would hang or break the planner."""
    try:
        number = float(number)
    except OverflowError:  # an int beyond float range
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"not a finite {kind}: {value!r}")
    return number


def parse_rate(value: str | int | float) -> float:
    """Bits per second from ``'2mbit'``, ``'1.5 gbit'``, ``'2mbit/s'``, ``'1.25MB/s'`` (bytes/s) or
    a number (bits/s). ``kbps``, ``mbps``, ``gbps`` (any case) are refused as ambiguous: tc reads
    them as bytes/s, most people as bits/s; the message offers both readings."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(value, value, "rate")
    match = _QUANTITY.match(str(value))
    if not match:
        raise ValueError(f"not a rate: {value!r}")
    number, written = float(match.group(1)), match.group(2)
    unit = written.lower().removesuffix("/s") if written.lower() in {f"{u}/s" for u in _RATE_UNITS} else written.lower()
    if written in _BYTE_RATE_UNITS:
        return _finite(number * _BYTE_RATE_UNITS[written], value, "rate")
    if unit in _RATE_UNITS:
        return _finite(number * _RATE_UNITS[unit], value, "rate")
    if unit in _AMBIGUOUS_RATE:
        bits, byte_unit, scale = _AMBIGUOUS_RATE[unit]
        text, word = match.group(1), _PREFIX_WORD[bits]
        raise ValueError(f"{value!r} is ambiguous ({word}bits or {word}bytes per second? tc reads {written} as bytes): write "
                         f"{text}{bits} for {text} {word}bits/s, or {text}{byte_unit} for {text} {word}bytes/s "
                         f"(= {format_rate(number * scale * 8)})")
    if not unit:
        raise ValueError(f"{value!r} has no unit; write it with one: {match.group(1)}mbit (bits/s) or {match.group(1)}MB/s (bytes/s)")
    raise ValueError(
        f"unknown rate unit {written!r} in {value!r}; use bit, kbit, mbit, gbit (bits/s, also kbit/s) "
        "or B/s, kB/s, MB/s, GB/s (bytes/s)"
    )


_PREFIX_WORD = {"bit": "", "kbit": "kilo", "mbit": "mega", "gbit": "giga"}


def parse_duration(value: str | int | float) -> float:
    """Seconds from ``'30ms'``, ``'90s'``, ``'2min'``, ``'1h'`` or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(value, value, "duration")
    number, unit = _split(value, "duration")
    if unit not in _DURATION_UNITS:
        raise ValueError(f"unknown duration unit {unit!r} in {value!r}; use us, ms, s, min or h (a bare number is seconds)")
    return _finite(number * _DURATION_UNITS[unit], value, "duration")


def parse_fraction(value: str | int | float) -> float:
    """A fraction in [0, 1] from ``'0.1%'`` or a plain number (``0.001``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number, unit = _finite(value, value, "fraction"), ""
    else:
        number, unit = _split(value, "fraction")
    if unit == "%":
        number /= 100.0
    elif unit:
        raise ValueError(f"unknown unit {unit!r} in {value!r}; write a fraction (0.001) or a percentage (0.1%)")
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"must be between 0 and 1 (or 0% and 100%), got {value!r}")
    return number


def parse_size(value: str | int | float) -> int:
    """Bytes from ``'512m'`` (MiB, as Docker), ``'2g'``, ``'100MB'`` or a number of bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _finite(value, value, "size")
        return int(value)
    number, unit = _split(value, "size")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"unknown size unit {unit!r} in {value!r}; use k, m, g (binary) or kb, mb, gb")
    return int(_finite(number * _SIZE_UNITS[unit], value, "size"))


def format_rate(bps: float) -> str:
    """Short human form of a bit rate, the inverse of :func:`parse_rate` for display."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def format_bytes(count: float) -> str:
    """Human form of a byte count with binary prefixes."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if round(abs(count) / scale, 2) >= 1:  # 1023.9 bytes is "1.00 KiB", not "1024 B"
            return f"{count / scale:.2f} {unit}"
    return f"{count:.0f} B"


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``12.5s`` or ``30ms``: short and unambiguous."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    # Compare what will be printed, so that 59.96 s is "1m00s", not "60.0s".
    if round(seconds * 1000) < 1000:
        return f"{seconds * 1000:.0f}ms"
    if round(seconds, 1) < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
