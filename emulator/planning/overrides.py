"""``--set key.path[0].leaf=value``: strict edits of a scenario's raw mapping before validation.

An unknown key is an error with a "did you mean", never silently added; the value is read as
YAML (``--set 'workers[0].cpus={uniform: [0.1, 0.3]}'``). Used by ``emulate run/plan --set``,
compare's method specs and sweep grids.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

import yaml

from emulator.planning.problems import Problem, ScenarioError, field_names, format_path, model_at
from emulator.planning.safe_yaml import MAX_EXPANDED_VALUES, StrictLoader, expanded_size
from emulator.planning.scenario import MethodSpec, Scenario


_INDEX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def apply_override(data: dict, assignment: str) -> None:
    """Apply ``key.path[0].leaf=value`` (value parsed as YAML) to the raw mapping, in place."""
    if "=" not in assignment:
        raise ScenarioError([Problem("--set", f"expected key=value, got {assignment!r}")])
    path, raw_value = assignment.split("=", 1)
    try:
        value = yaml.load(raw_value, Loader=StrictLoader) if raw_value.strip() else ""  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, RecursionError):
        value = raw_value
    steps: list[str | int] = []
    for piece in path.strip().split("."):
        match = _INDEX.match(piece)
        if not match:
            raise ScenarioError([Problem("--set", f"cannot parse key path {path!r} at {piece!r}")])
        steps.append(match.group(1))
        steps.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))

    def fail(message: str):
        raise ScenarioError([Problem(f"--set {path}", message)])

    def check_key(i: int) -> None:
        model = model_at(tuple(steps[:i]), Scenario)
        if model is None or i == len(steps) - 1 and (model is MethodSpec or model.model_config.get("extra") == "allow"):
            return  # free-form here (a compressor's or an aggregator's parameters are checked by their own checks)
        names = field_names(model)
        if steps[i] not in names:
            close = difflib.get_close_matches(str(steps[i]), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; allowed: {', '.join(names)}"
            fail(f"unknown key {format_path(tuple(steps[: i + 1]))!r}{hint}")

    node: Any = data
    for i, step in enumerate(steps):
        parent = format_path(tuple(steps[:i]))
        last = i == len(steps) - 1
        if isinstance(step, int):
            if not isinstance(node, list):
                fail(f"{parent} is not a list")
            if step >= len(node):
                fail(f"index {step} is out of range: {parent} has {len(node)} item(s)")
        else:
            if not isinstance(node, dict):
                fail(f"{parent} is not a mapping")
            check_key(i)
            if not last and node.get(step) is None:
                # an optional section not in the file (or left empty)
                node[step] = [] if isinstance(steps[i + 1], int) else {}
        if last:
            node[step] = value
        else:
            node = node[step]


def _unshared(value):
    """A copy in which no two places share one object, so that ``--set`` on a node that a YAML
    alias repeats changes that place only. Iterative: the size was bounded by :func:`parse_yaml`."""
    root: list = [None]
    stack = [(value, root, 0)]
    while stack:
        item, parent, key = stack.pop()
        if isinstance(item, dict):
            parent[key] = copy = dict.fromkeys(item)  # keeps the order of the keys
            stack.extend((v, copy, k) for k, v in item.items())
        elif isinstance(item, list):
            parent[key] = copy = [None] * len(item)
            stack.extend((v, copy, i) for i, v in enumerate(item))
        else:
            parent[key] = item
    return root[0]



def apply_overrides(data: dict, assignments, source: str = "") -> dict:
    """A copy of ``data`` with every assignment applied in order; problems name ``source``."""
    data = _unshared(data)
    for assignment in assignments:
        try:
            apply_override(data, assignment)
        except ScenarioError as exc:
            raise ScenarioError(exc.problems, source) from None
    if expanded_size(data, MAX_EXPANDED_VALUES) > MAX_EXPANDED_VALUES:
        raise ScenarioError([Problem("--set", f"more than {MAX_EXPANDED_VALUES:,} values once YAML aliases are expanded")], source)
    return data
