"""YAML read safely, for scenario files and ``--set`` values: errors with line and column.

PyYAML's safe loader with the limits a hostile or mistaken file needs: a bounded size, bounded
nesting, bounded expansion of aliases ("billion laughs"), and a key given twice in one mapping
refused (plain YAML keeps the last, silently). Every refusal is a :class:`ScenarioError`.
"""

from __future__ import annotations

import yaml

from emulator.planning.problems import Problem, ScenarioError

MAX_FILE_BYTES = 1 << 20
MAX_EXPANDED_VALUES = 100_000
MAX_DEPTH = 50


def expanded_size(value, budget: int) -> int:
    """Values after expanding YAML aliases, counting up to ``budget`` (defeats 'billion laughs')."""
    stack, count = [value], 0
    while stack:
        item = stack.pop()
        count += 1
        if count > budget:
            return count
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


class StrictLoader(yaml.SafeLoader):
    """Safe YAML that refuses a key given twice in one mapping (plain YAML keeps the last, silently)
    and nesting deeper than :data:`MAX_DEPTH` (PyYAML's scanner slows down quadratically with depth,
    and its composer recurses: a file of a million '[' must be refused at once)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _mapping_without_duplicates(loader: StrictLoader, node: yaml.MappingNode):
    seen = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # '<<: *defaults' may be overridden by the keys next to it
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:
            continue  # unhashable: construct_mapping says so
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
    yield from loader.construct_yaml_map(node)


StrictLoader.add_constructor("tag:yaml.org,2002:map", _mapping_without_duplicates)


def parse_yaml(text: str, source: str = "") -> dict:
    if len(text.encode()) > MAX_FILE_BYTES:
        raise ScenarioError([Problem("", f"file larger than {MAX_FILE_BYTES // 1024} KiB")], source)
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([Problem("", f"not valid YAML: {where}{problem}")], source) from None
    except RecursionError:
        raise ScenarioError([Problem("", "not valid YAML: nested too deeply")], source) from None
    if data is None:
        raise ScenarioError([Problem("", "the file is empty")], source)
    if not isinstance(data, dict):
        raise ScenarioError([Problem("", f"the top level must be a mapping of keys, got {type(data).__name__}")], source)
    if expanded_size(data, MAX_EXPANDED_VALUES) > MAX_EXPANDED_VALUES:
        raise ScenarioError([Problem("", f"more than {MAX_EXPANDED_VALUES:,} values once YAML aliases are expanded")], source)
    return data
