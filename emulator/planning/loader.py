"""A scenario file from disk to a validated :class:`Scenario`: read, override, validate.

The one place a scenario file is opened (``emulate run/plan/sweep/compare``, the paper driver,
the tests): the read is bounded (``/dev/zero`` must not hang), every problem names the file,
and a YAML error its line and column (:mod:`emulator.planning.safe_yaml`).
"""

from __future__ import annotations

from pathlib import Path

from emulator.planning.overrides import apply_overrides
from emulator.planning.problems import Problem, ScenarioError
from emulator.planning.safe_yaml import MAX_FILE_BYTES, parse_yaml
from emulator.planning.scenario import Scenario, validate


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
        data = apply_overrides(data, overrides, source)
    return validate(data, source), data
