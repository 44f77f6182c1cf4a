"""The rooms of docs/ARCHITECTURE.md against the code's imports: every import points down, no circle.

The table in the document is the rule: a room may import rooms on lower floors only. Every
import is read, function-local ones and those under ``TYPE_CHECKING`` included, so a new arrow
that runs back up fails here with the file and line that draws it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("emulator", "compression", "analysis", "benchmarks")


def floors() -> dict[str, int]:
    """Room -> floor, from the document's table (``| 6 | `emulator/control` | ... |``)."""
    rows = re.findall(r"^\| (\d+) \| `([\w/.]+)` \|", DOC.read_text(), flags=re.M)
    assert rows, f"no room table in {DOC}"
    return {room.removesuffix(".py"): int(floor) for floor, room in rows}


def room_of(module: str, rooms: dict[str, int]) -> str | None:
    """The room a dotted module name lives in: the longest room path that prefixes it."""
    path = module.replace(".", "/")
    best = None
    for room in rooms:
        if (path == room or path.startswith(room + "/")) and (best is None or len(room) > len(best)):
            best = room
    return best


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) for every import of a project module in ``path``; ``from pkg import
    mod`` counts as importing ``pkg.mod`` when ``mod`` is a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT / sub.replace(".", "/")).with_suffix(".py").exists() or (ROOT / sub.replace(".", "/")).is_dir()
                found.append((node.lineno, sub if is_module else node.module))
    return [(line, name) for line, name in found if name.split(".")[0] in PACKAGES]


def test_the_table_names_every_room_and_only_rooms_that_exist():
    rooms = floors()
    for room in rooms:
        assert (ROOT / room).is_dir() or (ROOT / f"{room}.py").is_file(), f"{DOC.name} names {room}, which is not in the tree"
    homeless = [str(p.relative_to(ROOT)) for p in sources()
                if room_of(module_name(p), rooms) is None and p.name != "__init__.py"]
    assert not homeless, f"modules in no room of {DOC.name}: {homeless}"


def test_every_import_points_down():
    rooms = floors()
    upward = []
    for path in sources():
        here = room_of(module_name(path), rooms)
        if here is None:
            continue
        for line, name in imports(path):
            there = room_of(name, rooms)
            if there is None or there == here:
                continue
            if rooms[there] >= rooms[here]:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {name} "
                              f"({here}, floor {rooms[here]} -> {there}, floor {rooms[there]})")
    assert not upward, "imports that do not point down:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    """A package's ``__init__`` importing its own modules (the package's face) is no circle; any other loop is."""
    known = {module_name(p) for p in sources()}
    graph: dict[str, set[str]] = {}
    for path in sources():
        me = module_name(path)
        own = f"{me}." if path.name == "__init__.py" else None
        graph[me] = {name for _, name in imports(path)
                     if name in known and name != me and not (own and name.startswith(own))}
    circles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "modules that import each other:\n" + "\n".join(circles)
