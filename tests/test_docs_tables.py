"""README.md's method and compressor tables against the registries they describe, so neither drifts.

Every column that states a fact of the code is checked: the presets' compressor and rule, each
compressor's parameters with default, range and meaning, whether it takes ``error_feedback``,
and every key of the method section (``rule``, ``error_feedback``, ``wire.*``, and any added
later) with its default and values. Only the free-text columns ("sends", the keys' meaning) are
the README's own.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import annotated_types
import pytest
from pydantic import BaseModel

from compression import COMPRESSORS
from emulator.planning.methods import PRESETS
from emulator.runtime.rules import RULES
from emulator.planning.scenario import MethodSpec

README = Path(__file__).resolve().parents[1] / "README.md"
NONE = "-"


def table(header: str) -> list[list[str]]:
    """The body rows of the README table whose header row starts with ``header``, cells stripped."""
    lines = README.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header)]
    assert len(starts) == 1, f"README.md has {len(starts)} tables starting {header!r}"
    rows = []
    for line in lines[starts[0] + 2:]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip()[1:-1])  # a cell's own "|" is written "\|"
        rows.append([cell.strip().replace("\\|", "|") for cell in cells])
    return rows


def code(value) -> str:
    return f"`{json.dumps(value)}`" if not isinstance(value, str) else f"`{value}`"


def bounds(metadata) -> str:
    """``> 0, <= 1`` from a field's annotated-types constraints."""
    words = {annotated_types.Gt: ("> ", "gt"), annotated_types.Ge: (">= ", "ge"),
             annotated_types.Lt: ("< ", "lt"), annotated_types.Le: ("<= ", "le")}
    parts = [words[type(m)][0] + json.dumps(getattr(m, words[type(m)][1])) for m in metadata if type(m) in words]
    return ", ".join(parts) or NONE


def compressor_rows() -> list[tuple]:
    """(compressor, error_feedback, parameter, default, range, meaning) as the README must say them."""
    rows = []
    for name, cls in sorted(COMPRESSORS.items()):
        feedback = "refused: keeps its own residual" if cls.has_own_memory else "yes"
        fields = cls.Params.model_fields
        for field, info in fields.items():
            rows.append((f"`{name}`", feedback, f"`{field}`", code(info.default), bounds(info.metadata), info.description))
        if not fields:
            rows.append((f"`{name}`", feedback, NONE, NONE, NONE, NONE))
    return rows


def test_compressor_table_lists_every_compressor_and_parameter_as_the_registry_has_them():
    rows, said = [], None
    for compressor, _sends, feedback, parameter, default, bound, meaning in table("| compressor | sends |"):
        said = (compressor, feedback) if compressor else said  # a compressor's later rows leave both blank
        rows.append((*said, parameter, default, bound, meaning))
    assert rows == compressor_rows()


def test_method_table_has_every_preset_with_its_compressor_and_rule():
    rows = [tuple(row) for row in table("| method | compressor | server rule |")]
    assert rows == [(f"`{name}`", f"`{p.compressor}`", f"`{p.rule}`", p.description) for name, p in PRESETS.items()]


def method_keys() -> dict[str, tuple]:
    """Every key of the method section but ``name``, nested ones dotted (``wire.values``): its
    default and its values as the README writes them (None where the values are not a list)."""
    keys = {}
    for key, info in MethodSpec.model_fields.items():
        nested = info.default if isinstance(info.default, BaseModel) else None
        fields = type(nested).model_fields.items() if nested else [(None, info)]
        for sub, field in fields:
            values = typing.get_args(field.annotation) if typing.get_origin(field.annotation) is typing.Literal else None
            values = (True, False) if field.annotation is bool else values
            default = getattr(nested, sub) if nested else field.default
            keys[f"{key}.{sub}" if sub else key] = (code(default), values and ", ".join(code(v) for v in values))
    del keys["name"]
    keys["rule"] = ("the preset's; `plain` for a compressor", ", ".join(f"`{r}`" for r in RULES))
    return keys


def test_keys_every_method_takes_are_all_there_with_their_defaults_and_values():
    rows = {row[0].strip("`"): row[1:3] for row in table("| key | default | values |")}
    expected = method_keys()
    assert set(rows) == set(expected), "README's method keys differ from MethodSpec's"
    for key, (default, values) in expected.items():
        assert rows[key][0] == default, key
        assert values is None or rows[key][1] == values, key


@pytest.mark.parametrize("name", sorted(COMPRESSORS))
def test_every_compressor_has_a_description_for_each_parameter(name):
    """The table's meaning column comes from these: a parameter without one would be a blank cell."""
    assert all(info.description for info in COMPRESSORS[name].Params.model_fields.values())
