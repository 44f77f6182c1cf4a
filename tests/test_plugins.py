"""A user's file named by ``file.py:attribute``: split, imported once, their traceback reported as theirs."""

from __future__ import annotations

import sys

import pytest

from emulator import plugins


def test_split_and_is_reference():
    assert plugins.split("models/net.py:build") == ("models/net.py", "build")
    assert plugins.split("net.keras") == ("net.keras", None)
    assert plugins.split("net.py") == ("net.py", None)
    for name in ("mnist_cnn", "mnist-5k", "topk", "adacomp"):
        assert not plugins.is_reference(name)
    for ref in ("net.py:build", "a/b.keras", "./x.py:Y"):
        assert plugins.is_reference(ref)
    with pytest.raises(plugins.PluginError, match="not a Python name"):
        plugins.split("net.py:build-it")
    with pytest.raises(plugins.PluginError, match="expected file.py:name"):
        plugins.split("net.py:")


def test_imported_once_per_process_under_a_name_from_its_path(tmp_path):
    file = tmp_path / "counter.py"
    file.write_text("import os\nLOADS = []\nLOADS.append(os.getpid())\n")
    first = plugins.import_file(file)
    second = plugins.import_file(str(file))
    assert first is second and first.LOADS == [first.LOADS[0]]
    assert sys.modules[plugins.module_name(file)] is first
    assert plugins.load(f"{file}:LOADS") is first.LOADS
    other = tmp_path / "sub" / "counter.py"
    other.parent.mkdir()
    other.write_text("LOADS = 'another'\n")
    assert plugins.load(f"{other}:LOADS") == "another"  # same file name, another module


def test_relative_paths_are_taken_against_the_base(tmp_path):
    (tmp_path / "m.py").write_text("VALUE = 7\n")
    assert plugins.load("m.py:VALUE", base=tmp_path) == 7


def test_missing_file_and_missing_attribute_say_what_there_is(tmp_path):
    with pytest.raises(plugins.PluginError, match="no such file"):
        plugins.load(f"{tmp_path}/absent.py:build")
    (tmp_path / "defs.py").write_text("def build():\n    pass\n\ndef helper():\n    pass\n")
    with pytest.raises(plugins.PluginError) as info:
        plugins.load(f"{tmp_path}/defs.py:biuld")
    assert "defines no 'biuld'" in str(info.value) and "build, helper" in str(info.value)


def test_a_file_that_raises_on_import_shows_the_users_traceback_only(tmp_path):
    file = tmp_path / "broken.py"
    file.write_text("x = 1\n\ndef f():\n    return {}['missing']\n\nf()\n")
    with pytest.raises(plugins.UserCodeError) as info:
        plugins.import_file(file)
    message = str(info.value)
    assert f"importing {file} raised KeyError" in message
    assert "your code's traceback (the emulator's frames left out)" in message
    assert f'File "{file}", line 6' in message and f'File "{file}", line 4, in f' in message
    assert "plugins.py" not in message and "importlib" not in message
    assert all(line.startswith("  | ") for line in message.split("left out):\n", 1)[1].splitlines())
    assert plugins.module_name(file) not in sys.modules  # a failed import is not cached: the next run tries again


def test_a_syntax_error_names_its_line(tmp_path):
    file = tmp_path / "typo.py"
    file.write_text("def build(:\n    pass\n")
    with pytest.raises(plugins.UserCodeError) as info:
        plugins.import_file(file)
    assert "SyntaxError" in str(info.value) and "line 1" in str(info.value)


def test_call_reports_what_the_users_function_raises(tmp_path):
    (tmp_path / "fails.py").write_text("def build(n):\n    return 1 / n\n")
    build = plugins.load(f"{tmp_path}/fails.py:build")
    assert plugins.call(build, 2, what="build") == 0.5
    with pytest.raises(plugins.UserCodeError) as info:
        plugins.call(build, 0, what="build(0)")
    assert "build(0) raised ZeroDivisionError" in str(info.value) and "line 2, in build" in str(info.value)


def test_file_digest_changes_with_the_bytes(tmp_path):
    file = tmp_path / "d.py"
    file.write_text("A = 1\n")
    before = plugins.file_digest(file)
    file.write_text("A = 2\n")
    assert plugins.file_digest(file) != before and len(before) == 64
