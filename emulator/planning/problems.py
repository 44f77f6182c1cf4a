"""Problems with a path: what is wrong with an input and which field it concerns.

Below the scenario and the methods, both of which report their problems through it, so that
neither imports the other for that: a :class:`Problem` is ``workers[1].cpus: must be > 0``,
a :class:`ScenarioError` carries one or more, and :func:`problems_from` turns pydantic's
validation errors into problems, in words people use and with "did you mean" for unknown keys.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ScenarioError(ValueError):
    """One or more problems in a scenario, each with the path of the field it concerns."""

    def __init__(self, problems: list[Problem], source: str = ""):
        self.problems = problems
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + "; ".join(str(p) for p in problems))

    def render(self) -> str:
        where = f" in {self.source}" if self.source else ""
        lines = [f"invalid scenario{where}:"] + ["  " + str(p).replace("\n", "\n    ") for p in self.problems]
        return "\n".join(lines)


def format_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


_MESSAGES = {
    "greater_than": lambda e: f"must be > {e['ctx']['gt']:g}",
    "greater_than_equal": lambda e: f"must be >= {e['ctx']['ge']:g}",
    "less_than": lambda e: f"must be < {e['ctx']['lt']:g}",
    "less_than_equal": lambda e: f"must be <= {e['ctx']['le']:g}",
    "int_parsing": lambda e: "must be an integer",
    "int_from_float": lambda e: "must be a whole number",
    "int_type": lambda e: "must be an integer",
    "float_parsing": lambda e: "must be a number",
    "float_type": lambda e: "must be a number",
    "bool_parsing": lambda e: "must be true or false",
    "bool_type": lambda e: "must be true or false",
    "string_type": lambda e: "must be a string",
    "list_type": lambda e: "must be a list",
    "model_type": lambda e: "must be a mapping of keys to values",
    "dict_type": lambda e: "must be a mapping of keys to values",
    "missing": lambda e: "required",
    "literal_error": lambda e: f"must be one of {e['ctx']['expected']}",
    "too_short": lambda e: f"needs at least {e['ctx']['min_length']} item(s)",
    "string_too_short": lambda e: "must not be empty",
    "string_pattern_mismatch": lambda e: "use letters, digits, '.', '_' and '-' (starting with a letter or digit)",
    "finite_number": lambda e: "must be a finite number",
}


def field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def model_at(loc: tuple, root: type[BaseModel] | None) -> type[BaseModel] | None:
    """The model class that holds the field at ``loc``, walking down from ``root`` (for 'did you
    mean' on unknown keys); None where no model does, or without a root."""
    current: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part) or next((f for f in current.model_fields.values() if f.alias == part), None)
        if field is None:
            return None
        ann = field.annotation
        while True:
            origin = typing.get_origin(ann)
            if origin in (list, tuple, Union, types.UnionType):
                ann = next((a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)), None)
                if ann is None:
                    return None
            elif origin is Annotated:
                ann = typing.get_args(ann)[0]
            else:
                break
        current = ann
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _problem(error: dict, prefix: tuple, root: type[BaseModel] | None) -> Problem:
    loc = prefix + tuple(error["loc"])
    kind = error["type"]
    raw = error.get("input")
    if kind == "extra_forbidden":
        parent = model_at(loc[:-1], root)
        key = loc[-1]
        hint = ""
        if parent is not None:
            names = field_names(parent)
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; allowed: {', '.join(names)}"
        return Problem(format_path(loc), f"unknown key{hint}")
    if kind == "value_error":
        message = str(error.get("ctx", {}).get("error", error["msg"]))
    elif kind in _MESSAGES:
        message = _MESSAGES[kind](error)
    else:
        message = error["msg"]
    if kind not in ("missing", "value_error", "extra_forbidden") and not isinstance(raw, (dict, list)) and "got" not in message:
        message += f", got {raw!r}"
    # Errors inside a union report every branch; keep the path readable.
    loc = tuple(p for p in loc if not (isinstance(p, str) and (p.startswith("function-") or p in ("str", "tuple[int, ...]"))))
    return Problem(format_path(loc), message)


def problems_from(exc: ValidationError, prefix: tuple = (), root: type[BaseModel] | None = None) -> list[Problem]:
    """Each distinct error of ``exc`` as a problem; ``prefix`` is prepended to every path, and
    ``root`` (the model at the top of those paths) lets an unknown key say what was meant."""
    seen, out = set(), []
    for error in exc.errors(include_url=False):
        problem = _problem(error, prefix, root)
        if str(problem) not in seen:
            seen.add(str(problem))
            out.append(problem)
    return out


__all__ = ["Problem", "ScenarioError", "field_names", "format_path", "model_at", "problems_from"]
