"""Backends are named in one place: the scenario's schema, the command line's choices, ``emulate
clean`` and ``emulate doctor`` all read :data:`emulator.planning.backends.BACKENDS`."""

from __future__ import annotations

import ast
import secrets

import click
import pytest

from conftest import ROOT
from emulator import backends
from emulator.cli import main
from emulator.control import cleanup, doctor
from emulator.planning import backends as names
from emulator.planning.scenario import json_schema


def test_the_command_line_offers_the_registry_and_auto():
    for command in ("run", "compare", "sweep"):
        option = next(p for p in main.commands[command].params if p.name == "backend")
        assert isinstance(option.type, click.Choice)
        assert tuple(option.type.choices) == ("auto", *names.BACKENDS), command


def test_the_scenario_schema_offers_the_registry_and_auto():
    assert json_schema()["properties"]["backend"]["enum"] == ["auto", *names.BACKENDS]


def test_the_backends_package_re_exports_the_one_table():
    assert backends.BACKENDS is names.BACKENDS


@pytest.mark.parametrize("module", [cleanup, doctor])
def test_clean_and_doctor_import_no_backend_directly(module):
    tree = ast.parse((ROOT / module.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("emulator.backends.")], imported


def test_a_new_backend_is_asked_by_clean_and_doctor(monkeypatch):
    """One registry entry is enough for clean and doctor to ask it."""
    calls = []

    class Extra(backends.Backend):
        name = "extra"
        clean_rank = -1  # asked first

        @classmethod
        def diagnose(cls):
            return [("extra", "ok", "here")]

        @classmethod
        def remove_leftovers(cls, run_id, removes, say):
            calls.append(run_id)
            return (["thing t1"] if removes("thing t1", run_id, None) else []), {}

    # only the new backend in the table: the test touches no daemon and no other run's resources
    monkeypatch.setattr(backends, "BACKENDS", {"extra": "x:Extra"})
    monkeypatch.setattr(backends, "backend_class", lambda name: Extra)
    assert ("extra", "ok", "here") in doctor.diagnose()
    run_id = f"registry-test-{secrets.token_hex(4)}"
    done = cleanup.clean_all(run_id, say=lambda line: None)
    assert calls == [run_id] and "thing t1" in done.removed


def test_clean_says_which_backend_it_skipped_and_goes_on(monkeypatch):
    said = []

    class Broken(backends.Backend):
        name = "broken"

        @classmethod
        def remove_leftovers(cls, run_id, removes, say):
            raise RuntimeError("no daemon")

    monkeypatch.setattr(backends, "BACKENDS", {"broken": "x:Broken"})
    monkeypatch.setattr(backends, "backend_class", lambda name: Broken)
    cleanup.clean_all(f"registry-test-{secrets.token_hex(4)}", say=said.append)
    assert "broken: skipped (no daemon)" in said
