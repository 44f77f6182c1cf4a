"""Quantities as written in scenario files: parsers return base units, errors quote the input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.planning.units import (
    format_bytes,
    format_duration,
    format_rate,
    parse_duration,
    parse_fraction,
    parse_rate,
    parse_size,
)

# -- rates -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, bps",
    [
        ("1bit", 1),
        ("500bit", 500),
        ("1kbit", 1e3),
        ("2mbit", 2e6),
        ("1.5gbit", 1.5e9),
        ("1tbit", 1e12),
        ("2Mbit", 2e6),  # units are case-insensitive
        (" 2 mbit ", 2e6),  # blanks around and between
        (".5mbit", 5e5),
        ("1e3kbit", 1e6),
        ("1kibit", 1024),
        ("1mibit", 1024**2),
        ("1gibit", 1024**3),
        ("2mbit/s", 2e6),  # bits/s, written with /s
        ("2Mbit/s", 2e6),
        # bytes per second: a capital B and /s
        ("1B/s", 8),
        ("125kB/s", 1e6),
        ("125KB/s", 1e6),
        ("2MB/s", 16e6),
        ("1GB/s", 8e9),
    ],
)
def test_parse_rate_units(text, bps):
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("number", [0, 1, 2_000_000, 1.5, 1e9])
def test_parse_rate_numbers_are_bits_per_second(number):
    assert parse_rate(number) == float(number)
    assert isinstance(parse_rate(number), float)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("2mbps2", "not a rate: '2mbps2'"),
        ("fast", "not a rate: 'fast'"),
        ("", "not a rate: ''"),
        ("-2mbit", "not a rate: '-2mbit'"),
        ("2 parsecs", "unknown rate unit 'parsecs' in '2 parsecs'"),
        ("2mbit/h", "unknown rate unit 'mbit/h' in '2mbit/h'"),
        ("5", "'5' has no unit; write it with one: 5mbit (bits/s) or 5MB/s (bytes/s)"),  # a string needs a unit
        ("1e999mbit", "not a finite rate: '1e999mbit'"),
        ("1e300gbit", "not a finite rate: '1e300gbit'"),
    ],
)
def test_parse_rate_errors_quote_the_input(text, fragment):
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 10**400])
def test_parse_rate_refuses_non_finite_numbers(value):
    with pytest.raises(ValueError, match="not a finite rate"):
        parse_rate(value)


def test_parse_rate_unknown_unit_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        parse_rate("3 furlongs")
    message = str(info.value)
    for unit in ("kbit", "mbit", "gbit", "kB/s", "MB/s"):
        assert unit in message


@pytest.mark.parametrize("text", ["10mbps", "10Mbps", "10MBPS", "10mBps", "125kbps", "1Kbps", "1gbps", "1GBps", "8bps",
                                  "10mb/s", "10Mb/s", "10kb/s"])
def test_ambiguous_rate_spellings_are_refused_with_both_readings(text):
    """Most people (and Fogify's 10Mbps) read mbps as megabits/s, tc as megabytes/s: never guessed."""
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    message = str(info.value)
    number = text.rstrip("bpsBPS/kKmMgG")
    assert f"{text!r} is ambiguous" in message
    bits, byte = {"k": ("kbit", "kB/s"), "m": ("mbit", "MB/s"), "g": ("gbit", "GB/s")}.get(
        text[len(number)].lower(), ("bit", "B/s"))
    assert f"write {number}{bits} for" in message and f"or {number}{byte} for" in message


def test_a_bare_string_duration_is_seconds_as_a_bare_number_is():
    assert parse_duration("10") == parse_duration(10) == 10.0


def test_parse_rate_refuses_booleans():
    with pytest.raises(ValueError, match="True"):
        parse_rate(True)


# -- durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("250us", 250e-6),
        ("30ms", 0.030),
        ("1.5s", 1.5),
        ("90 s", 90),
        ("10sec", 10),
        ("2min", 120),
        ("2m", 120),
        ("1h", 3600),
        ("0.5h", 1800),
        ("0s", 0),
        ("30MS", 0.030),
    ],
)
def test_parse_duration_units(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("number", [0, 5, 0.25, 86400])
def test_parse_duration_numbers_are_seconds(number):
    assert parse_duration(number) == float(number)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("30 parsecs", "unknown duration unit 'parsecs' in '30 parsecs'"),
        ("soon", "not a duration: 'soon'"),
        ("-5s", "not a duration: '-5s'"),
        ("5s5", "not a duration: '5s5'"),
        ("1e999s", "not a finite duration: '1e999s'"),
        ("3 days", "unknown duration unit 'days' in '3 days'"),
    ],
)
def test_parse_duration_errors_quote_the_input(text, fragment):
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_parse_duration_refuses_non_finite_numbers(value):
    with pytest.raises(ValueError, match="not a finite duration"):
        parse_duration(value)


# -- fractions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, fraction",
    [
        ("0.1%", 0.001),
        ("100%", 1.0),
        ("0%", 0.0),
        ("50 %", 0.5),
        ("0.25", 0.25),
        (0.001, 0.001),
        (0, 0.0),
        (1, 1.0),
    ],
)
def test_parse_fraction(value, fraction):
    assert parse_fraction(value) == pytest.approx(fraction)


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("150%", "must be between 0 and 1 (or 0% and 100%), got '150%'"),
        (1.5, "must be between 0 and 1 (or 0% and 100%), got 1.5"),
        ("2", "got '2'"),
        ("-1%", "not a fraction: '-1%'"),
        ("0.1 permille", "unknown unit 'permille' in '0.1 permille'"),
        ("lots", "not a fraction: 'lots'"),
        (math.nan, "not a finite fraction: nan"),
    ],
)
def test_parse_fraction_errors_quote_the_input(value, fragment):
    with pytest.raises(ValueError) as info:
        parse_fraction(value)
    assert fragment in str(info.value)


# -- sizes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, size",
    [
        ("512m", 512 * 1024**2),  # as Docker: m is MiB
        ("2g", 2 * 1024**3),
        ("1k", 1024),
        ("100MB", 100 * 1000**2),
        ("1kb", 1000),
        ("1GiB", 1024**3),
        ("64", 64),
        ("64b", 64),
        ("1.5k", 1536),
        (4096, 4096),
        (10**20, 10**20),  # ints stay exact
    ],
)
def test_parse_size(value, size):
    assert parse_size(value) == size
    assert isinstance(parse_size(value), int)


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("2 parsecs", "unknown size unit 'parsecs' in '2 parsecs'"),
        ("big", "not a size: 'big'"),
        ("1e400", "not a finite size: '1e400'"),
        (math.inf, "not a finite size: inf"),
    ],
)
def test_parse_size_errors_quote_the_input(value, fragment):
    with pytest.raises(ValueError) as info:
        parse_size(value)
    assert fragment in str(info.value)


# -- formatting --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bps, text",
    [(0, "0bit"), (500, "500bit"), (1e3, "1kbit"), (2e6, "2mbit"), (1.5e9, "1.5gbit"), (2.5e5, "250kbit")],
)
def test_format_rate(bps, text):
    assert format_rate(bps) == text


@given(st.floats(min_value=0, max_value=1e15, allow_nan=False, allow_infinity=False))
def test_format_rate_round_trips_through_parse_rate(bps):
    # format_rate keeps six significant digits
    assert parse_rate(format_rate(bps)) == pytest.approx(bps, rel=1e-5, abs=1e-6)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["bit", "kbit", "mbit", "gbit"]))
def test_format_rate_of_a_parsed_round_rate_is_exact(number, unit):
    bps = parse_rate(f"{number}{unit}")
    assert parse_rate(format_rate(bps)) == pytest.approx(bps, rel=1e-12)


@pytest.mark.parametrize(
    "count, text",
    [
        (0, "0 B"),
        (512, "512 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (2 * 1024**2, "2.00 MiB"),
        (3 * 1024**3, "3.00 GiB"),
        (-2048, "-2.00 KiB"),
        (1023.9, "1.00 KiB"),  # not "1024 B"
        (1024**2 - 1, "1.00 MiB"),  # not "1024.00 KiB"
    ],
)
def test_format_bytes(count, text):
    assert format_bytes(count) == text


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0.030, "30ms"),
        (0, "0ms"),
        (12.5, "12.5s"),
        (1, "1.0s"),
        (185, "3m05s"),
        (3720, "1h02m"),
        (59.96, "1m00s"),  # not "60.0s"
        (0.9996, "1.0s"),  # not "1000ms"
        (3599.6, "1h00m"),
        (-3, "-3.0s"),
        (math.inf, "?"),
        (math.nan, "?"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_format_duration_never_prints_a_unit_past_its_range(seconds):
    text = format_duration(seconds)
    if text.endswith("ms"):
        assert int(text[:-2]) < 1000
    elif text.endswith("s") and "m" not in text:
        assert float(text[:-1]) < 60
    elif text.endswith("s"):  # XmYYs
        minutes, secs = text[:-1].split("m")
        assert int(minutes) < 60 and int(secs) < 60
    else:  # XhYYm
        assert int(text[:-1].split("h")[1]) < 60
