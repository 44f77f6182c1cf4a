"""Every scenario and ``emulate`` command the documentation shows works as written.

Read from README.md and docs/*.md (fenced code blocks) and from the comments of scenarios/**/*.yaml:

* a ```yaml block whose top level has ``name:`` and ``workers:`` is a scenario: it must load and
  plan. Other yaml blocks are fragments (a proposed field, a section) and are only parsed as YAML;
* in any other block, a line starting with ``$ `` is a transcript: its command is checked and the
  lines without ``$ `` are output. In a ```sh (bash, shell, console) block without ``$ `` lines
  every line is a command (``\\`` continues a line, ``#`` starts a comment, ``&&``, ``;`` and
  ``|`` separate commands); blocks of other kinds without ``$ `` (a layout, output) hold none;
* in a scenario file, a comment line whose text starts with ``emulate`` (or has it after a
  colon: ``Then: emulate report ...``) is a command; ``\\`` at its end continues it on the next
  comment line.

An ``emulate`` command (also as ``.venv/bin/emulate`` or ``python -m emulator.cli``, after any
``VAR=value`` words) is parsed by the real command line, then checked without training anything:
``plan`` and ``schema`` run; ``run``, ``compare`` and ``sweep`` load and plan every scenario they
would run (each method, each grid point); other commands (``doctor``, ``clean``, ``images``,
``report``) are parsed only. A ``<placeholder>`` argument stands for a directory the reader has
and is parsed as an empty one. Where the data set a scenario names is not on this machine, the
checks that need it are skipped after everything else passed. Other commands (``make``,
``docker``, ``python -m pytest``) are not run; the repository paths they name must exist.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from emulator.cli import main
from emulator.planning.plan import make_plan
from emulator.planning.loader import load_scenario

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCENARIO_FILES = sorted((ROOT / "scenarios").rglob("*.yaml"))
PLACEHOLDER = "@placeholder@"
REPO_PATH = re.compile(r"^(analysis|benchmarks|compression|docs|emulator|images|scenarios|scripts|tests)/[\w./-]*$")
SEPARATORS = {"&&", "||", ";", "|"}
SHELLS = {"sh", "bash", "shell", "console", "zsh"}
UNPARSABLE = "(not a shell command)"


@dataclass(frozen=True)
class Block:
    where: str  # file:line of the opening fence
    lang: str
    text: str
    first_line: int  # line number of the block's first line of text


@dataclass(frozen=True)
class Command:
    where: str  # file:line where the command starts
    words: tuple[str, ...]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def fenced_blocks(path: Path) -> list[Block]:
    blocks, opened, lang, body = [], None, "", []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = re.match(r"^\s*```\s*([\w-]*)", line)
        if fence and opened is None:
            opened, lang, body = number, fence.group(1).lower(), []
        elif fence:
            blocks.append(Block(f"{_shown(path)}:{opened}", lang, "\n".join(body), opened + 1))
            opened = None
        elif opened is not None:
            body.append(line)
    assert opened is None, f"{_shown(path)}:{opened}: a code block is never closed"
    return blocks


def _joined(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Lines with a trailing backslash joined to the next, each kept with its first line's number."""
    out, start, parts = [], None, []
    for number, text in lines:
        start = number if start is None else start
        if text.rstrip().endswith("\\"):
            parts.append(text.rstrip()[:-1])
            continue
        out.append((start, " ".join([*parts, text])))
        start, parts = None, []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def _commands(where_file: str, lines: list[tuple[int, str]]) -> list[Command]:
    commands = []
    for number, text in _joined(lines):
        text = re.sub(r"<[^<>]*>", PLACEHOLDER, text)
        try:
            split = shlex.split(text, comments=True)
        except ValueError as error:  # reported by a test, with its place
            commands.append(Command(f"{where_file}:{number}", (UNPARSABLE, f"{error}: {text}")))
            continue
        words: list[str] = []
        for word in [*split, ";"]:
            if word not in SEPARATORS:
                words.append(word)
                continue
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]) or words[:1] == ["sudo"]:
                words.pop(0)
            if words:
                commands.append(Command(f"{where_file}:{number}", tuple(words)))
            words = []
    return commands


def doc_commands() -> list[Command]:
    commands = []
    for path in DOCS:
        for block in fenced_blocks(path):
            lines = list(enumerate(block.text.splitlines(), block.first_line))
            if block.lang not in ("yaml", "yml"):
                commands += _commands(_shown(path), _prompted(lines) or (lines if block.lang in SHELLS else []))
    return commands


def _prompted(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The commands of a transcript: lines after a ``$ `` prompt, and the lines they continue onto."""
    out, continuing = [], False
    for number, line in lines:
        if continuing or line.strip().startswith("$ "):
            out.append((number, line if continuing else line.strip()[2:]))
            continuing = line.rstrip().endswith("\\")
    return out


def comment_commands() -> list[Command]:
    commands = []
    for path in SCENARIO_FILES:
        comments = [(n, line.strip()[1:].strip()) for n, line in enumerate(path.read_text().splitlines(), 1)
                    if line.strip().startswith("#")]
        found, continuing = [], False
        for number, text in comments:
            if not continuing:
                match = re.search(r"(?:^|:\s)(emulate\s.*)$", text)
                if not match:
                    continue
                text = match.group(1)
            found.append((number, text))
            continuing = text.endswith("\\")
        commands += _commands(_shown(path), found)
    return commands


def yaml_blocks() -> list[Block]:
    return [block for path in DOCS for block in fenced_blocks(path) if block.lang in ("yaml", "yml")]


def _emulate_args(words: tuple[str, ...]) -> list[str] | None:
    """The arguments after ``emulate``, or None for a command that is not one."""
    head = words[0].rsplit("/", 1)[-1]
    if head == "emulate":
        return list(words[1:])
    if head.startswith("python") and list(words[1:3]) == ["-m", "emulator.cli"]:
        return list(words[3:])
    return None


def _ids(items) -> list[str]:
    return [item.where for item in items]


ALL_COMMANDS = doc_commands() + comment_commands()
EMULATE_COMMANDS = [c for c in ALL_COMMANDS if _emulate_args(c.words) is not None]
OTHER_COMMANDS = [c for c in ALL_COMMANDS if _emulate_args(c.words) is None]
YAML_BLOCKS = yaml_blocks()


# -- the checks ----------------------------------------------------------------------------


class _Data:
    """Data sets that the checked scenarios name but this machine lacks (skip, not fail)."""

    def __init__(self):
        self.missing: dict[str, str] = {}

    def check(self, path, overrides=()) -> None:
        """Load, plan, and check the data set's sizes when it is here."""
        from emulator import datasets
        from emulator.planning.plan import check_dataset

        scenario, _ = load_scenario(path, list(overrides))
        make_plan(scenario)
        if datasets.source_kind(scenario.dataset) == "loader":
            check_dataset(scenario)  # plans as emulate plan does: the loader's file exists, and is not imported
            return
        try:
            datasets.facts(scenario.dataset)
        except datasets.DatasetUnavailable:
            name = datasets.display_name(scenario.dataset)
            self.missing[name] = f"data set {name!r} is not on this machine (emulate doctor)"
            return
        check_dataset(scenario)

    def skip_if_any(self) -> None:
        if self.missing:
            pytest.skip("loads and plans; not checked against the data: " + "; ".join(self.missing.values()))


def _parsed(args: list[str]):
    """The subcommand and its parameters, as click parses them (a usage error fails the test)."""
    import click

    command, name = main, "emulate"
    while isinstance(command, click.Group):  # emulate images build: a group in the group
        assert args, f"{name}: no subcommand"
        name, args = args[0], args[1:]
        command = command.get_command(None, name)
        assert command is not None, f"no command {name!r}"
    return name, command.make_context(name, args).params


def _check_plan(args, params, scenario, overrides, data) -> None:
    data.check(scenario, overrides)
    data.skip_if_any()
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output


def _check_schema(args, params, scenario, overrides, data) -> None:
    assert CliRunner().invoke(main, args).exit_code == 0


def _check_run(args, params, scenario, overrides, data) -> None:
    from emulator.control.rundir import check_run_id

    if params["run_id"] is not None:
        check_run_id(params["run_id"])
    data.check(scenario, overrides)


def _check_compare(args, params, scenario, overrides, data) -> None:
    from emulator.experiments.compare import _parse_all

    for spec in _parse_all(list(params["methods"]), overrides):
        data.check(scenario, [*overrides, *spec.overrides])


def _check_sweep(args, params, scenario, overrides, data) -> None:
    from emulator.experiments.sweep import Sweep

    sweep = Sweep.from_options(scenario, params["grid"], repeat=params["repeat"], overrides=tuple(overrides))
    for assignments in sweep.points():
        data.check(scenario, [*overrides, *(f"{k}={v}" for k, v in assignments)])


CHECKS = {"plan": _check_plan, "schema": _check_schema, "run": _check_run, "compare": _check_compare, "sweep": _check_sweep}


def _check_emulate(args: list[str], tmp_path: Path) -> None:
    """Parse ``emulate ARGS``, then check what the subcommand would do (see the module docstring)."""
    args = [str(tmp_path) if PLACEHOLDER in a else a for a in args]
    name, params = _parsed(args)
    scenario = params.get("scenario_file")
    if scenario is not None:
        assert (ROOT / scenario).is_file(), f"{scenario}: no such scenario file"
        scenario = ROOT / scenario
    data = _Data()
    check = CHECKS.get(name)
    if check is not None:
        check(args, params, scenario, list(params.get("overrides", ())), data)
    data.skip_if_any()


def test_the_docs_show_commands_and_scenarios():
    """The extraction finds what the docs hold (a parser that found nothing would pass everything)."""
    assert any({"name", "workers"} <= set(yaml.safe_load(block.text)) for block in YAML_BLOCKS)
    shown = {c.words[1] if c.words[0].endswith("emulate") else c.words[3] for c in EMULATE_COMMANDS}
    assert {"run", "compare", "sweep"} <= shown, shown
    assert any(c.where.startswith("scenarios/") for c in EMULATE_COMMANDS)
    assert any(c.where.startswith("README.md") for c in EMULATE_COMMANDS)


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=_ids(YAML_BLOCKS))
def test_a_scenario_shown_in_the_docs_plans(block, tmp_path):
    data = yaml.safe_load(block.text)
    if not (isinstance(data, dict) and {"name", "workers"} <= set(data)):
        return  # a fragment: it parses as YAML, which is all it claims
    path = tmp_path / "scenario.yaml"
    path.write_text(block.text + "\n")
    data = _Data()
    data.check(path)
    data.skip_if_any()


@pytest.mark.parametrize("command", EMULATE_COMMANDS, ids=_ids(EMULATE_COMMANDS))
def test_an_emulate_command_shown_works(command, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # commands are shown from the repository's root
    _check_emulate(_emulate_args(command.words), tmp_path)


@pytest.mark.parametrize("command", OTHER_COMMANDS, ids=_ids(OTHER_COMMANDS))
def test_the_paths_another_command_names_exist(command):
    assert command.words[0] != UNPARSABLE, f"{command.where}: {command.words[1]}"
    named = [word for word in command.words if REPO_PATH.match(word)]
    missing = [word for word in named if not (ROOT / word.split("::")[0]).exists()]
    assert missing == [], f"{command.where}: {' '.join(command.words)}"


def test_a_transcript_is_read_after_its_prompt(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text\n```\n$ emulate plan a.yaml \\\n    --json\noutput line\n$ make demo  # comment\n```\n")
    blocks = fenced_blocks(doc)
    assert [(b.lang, b.first_line) for b in blocks] == [("", 3)]
    lines = list(enumerate(blocks[0].text.splitlines(), blocks[0].first_line))
    assert _commands("x.md", _prompted(lines)) == [Command("x.md:3", ("emulate", "plan", "a.yaml", "--json")),
                                                   Command("x.md:6", ("make", "demo"))]
    assert _commands("x.md", [(1, "A=1 sudo emulate run s.yaml --set 'a=b c' && emulate report runs/<the id>")]) == [
        Command("x.md:1", ("emulate", "run", "s.yaml", "--set", "a=b c")),
        Command("x.md:1", ("emulate", "report", f"runs/{PLACEHOLDER}")),
    ]


@pytest.mark.parametrize("args, problem", [
    (["run", "scenarios/quickstart.yaml", "--set", "method.name=asgd"], "method.c: unknown parameter for asgd"),
    (["run", "scenarios/missing.yaml"], "no such scenario file"),
    (["compare", "scenarios/quickstart.yaml", "-m", "qsgd:bits=4"], "method.bits"),
    (["sweep", "scenarios/quickstart.yaml", "--grid", "workers[0].cpus=0.3,0"], "workers[0].cpus: must be > 0"),
    (["plan", "scenarios/quickstart.yaml", "--frobnicate"], "No such option"),
    (["run", "scenarios/quickstart.yaml", "--run-id", "../x"], "invalid run id"),
])
def test_a_broken_command_is_caught(args, problem, tmp_path, monkeypatch):
    """The checker refuses what the command line would refuse, without running anything."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(Exception) as caught:
        _check_emulate(args, tmp_path)
    assert problem in str(caught.value)
