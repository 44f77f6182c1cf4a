"""Quantities as people write them in scenario files: ``2mbit``, ``30ms``, ``0.1%``, ``512m``.

Every parser returns a plain number in base units (bits per second, seconds, a fraction
in [0, 1], bytes) and raises ``ValueError`` with a message that quotes the input, so the
scenario loader can report ``workers[0].uplink: unknown rate unit 'mbps'...``.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z%/]*)\s*$")

# tc's conventions: bit = bits/s, bps = BYTES/s (tc-speed(8)); k/m/g are decimal.
_RATE_UNITS = {
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9,
    "kibit": 1024, "mibit": 1024**2, "gibit": 1024**3,
}
_DURATION_UNITS = {
    "us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
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
    """Bits per second from ``'2mbit'``, ``'1.5 gbit'``, ``'125kbps'`` (bytes/s, as tc) or a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(value, value, "rate")
    number, unit = _split(value, "rate")
    if unit not in _RATE_UNITS:
        raise ValueError(
            f"unknown rate unit {unit!r} in {value!r}; use one of bit, kbit, mbit, gbit "
            "(bits/s) or bps, kbps, mbps (bytes/s, as tc)"
        )
    return _finite(number * _RATE_UNITS[unit], value, "rate")


def parse_duration(value: str | int | float) -> float:
    """Seconds from ``'30ms'``, ``'90s'``, ``'2min'``, ``'1h'`` or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _finite(value, value, "duration")
    number, unit = _split(value, "duration")
    if unit not in _DURATION_UNITS:
        raise ValueError(f"unknown duration unit {unit!r} in {value!r}; use us, ms, s, min or h")
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
