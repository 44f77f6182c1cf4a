"""The user's own files in a run: listed without being run, imported and checked before any device
starts (exit 2 naming the field, the file and the user's traceback), copied into the run directory
with their digests, and imported once in the zygote that forks the devices."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator import plugins
from emulator.cli import main

from conftest import read_json, read_jsonl, run_scenario

SCENARIO = """\
name: own
seed: 1
model: {model}
dataset: {{name: digits, partition: iid}}
training: {{batch_size: 16, learning_rate: 0.05, max_updates: {updates}, eval_every: {updates} updates}}
method: {method}
server: {{cpus: 1.0}}
evaluator: {{cpus: 0.5}}
workers:
  - {{count: 2, cpus: 0.5}}
backend: local
"""

GOOD_COMPRESSOR = """\
import numpy as np
from pydantic import Field
from compression import Compressor, Params, SparsePart


class HalfParams(Params):
    c: float = Field(0.5, gt=0, le=1)


class Half(Compressor):
    name = "half"
    Params = HalfParams

    def _compress(self, grads):
        return [SparsePart(np.arange(max(1, int(g.size * self.params.c)), dtype=np.int64), g[:max(1, int(g.size * self.params.c))].copy())
                for g in grads]
"""

KERAS_MODEL = """\
import keras

def build(input_shape, classes, hidden=32):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                             keras.layers.Dense(hidden, activation="relu"), keras.layers.Dense(classes)])

def too_narrow(input_shape):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(3)])

def not_a_model():
    return "a string"

def with_batch_norm(input_shape, classes):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.BatchNormalization(),
                             keras.layers.Dense(classes)])
"""


def write(tmp_path: Path, model: str = "mlp", method: str = "{name: adacomp, c: 0.1}", updates: int = 40, **files) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    scenario = tmp_path / "own.yaml"
    scenario.write_text(SCENARIO.format(model=model, method=method, updates=updates))
    return scenario


def cli(*args):
    return CliRunner().invoke(main, list(args))


# -- listed, never run, by emulate plan ----------------------------------------------------


def test_plan_lists_the_users_files_without_importing_them(tmp_path):
    scenario = write(tmp_path, model="{file: net.py, function: build}", method="{name: comp.py:Half, c: 0.25}",
                     **{"net.py": "raise SystemExit('imported!')\n", "comp.py": "raise SystemExit('imported!')\n"})
    result = cli("plan", str(scenario))
    assert result.exit_code == 0, result.output
    assert "your files (2):" in result.output
    assert f"model           model      {tmp_path}/net.py:build  (imported by the run and on devices)" in result.output
    assert f"method.name     compressor {tmp_path}/comp.py:Half" in result.output
    assert plugins.module_name(tmp_path / "net.py") not in sys.modules
    assert plugins.module_name(tmp_path / "comp.py") not in sys.modules


def test_a_scenario_without_user_files_says_it_runs_no_outside_code(tmp_path):
    result = cli("plan", str(write(tmp_path)))
    assert result.exit_code == 0 and "your files: none (the run imports no code from outside the package)" in result.output


@pytest.mark.parametrize("model,method,line", [
    ("{file: absent.py, function: build}", "{name: adacomp}", "model.name: absent.py: no such file"),
    ("absent.keras", "{name: adacomp}", "model.name: absent.keras: no such file"),
    ("{file: net.py}", "{name: adacomp}", "model: file net.py: name the function that returns the Keras model (function: build)"),
    ("mlp", "{name: absent.py:Mine}", "method.name: absent.py: no such file"),
    ("mlp", "{name: adacomp, rule: absent.py:Mine}", "method.rule: absent.py: no such file"),
    ("mlp", "{name: comp.py}", "method.name: 'comp.py': name what in the file to use: comp.py:NAME"),
    ("{name: mlp, args: {hidden: 3}}", "{name: adacomp}", "model.args: the built-in model mlp takes no arguments"),
])
def test_missing_files_are_refused_when_the_scenario_is_read(tmp_path, model, method, line):
    result = cli("plan", str(write(tmp_path, model=model, method=method, **{"net.py": "", "comp.py": ""})))
    assert result.exit_code == 2, result.output
    assert any(text.strip().startswith(line) for text in result.output.splitlines()), result.output
    if "no such file" in line:
        assert f"(looked for {tmp_path}/" in result.output  # where, since a relative path reads against the scenario


# -- imported and checked before anything runs (a built-in model: no TensorFlow needed) --------


@pytest.mark.parametrize("text,attribute,line", [
    ("class NotOne:\n    pass\n", "NotOne", "is <class"),
    ("from compression import Compressor\n\nclass Abstract(Compressor):\n    name = 'a'\n", "Abstract",
     "does not implement _compress of compression.Compressor"),
    ("import numpy\nnumpy.frobnicate()\n", "Half", "raised AttributeError"),
])
def test_a_compressor_that_is_not_one_is_refused_before_anything_starts(tmp_path, text, attribute, line):
    scenario = write(tmp_path, method=f"{{name: comp.py:{attribute}}}", **{"comp.py": text})
    result = cli("plan", str(scenario), "--import")
    assert result.exit_code == 2, result.output
    assert "method.name:" in result.output and line in result.output
    run = cli("run", str(scenario), "--out", str(tmp_path / "runs"))
    assert run.exit_code == 2 and line in run.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run directory, nothing started


def test_a_users_import_error_shows_their_traceback_marked_as_theirs(tmp_path):
    scenario = write(tmp_path, method="{name: comp.py:Half}", **{"comp.py": "def helper():\n    return 1 / 0\n\nhelper()\n"})
    result = cli("plan", str(scenario), "--import")
    assert result.exit_code == 2
    assert "raised ZeroDivisionError: division by zero" in result.output
    assert "your code's traceback (the emulator's frames left out):" in result.output
    assert "| " in result.output and "line 2, in helper" in result.output
    assert "emulator/control" not in result.output and "Traceback (most recent call last)" in result.output


def test_a_users_compressor_parameters_are_validated_like_a_built_ins(tmp_path):
    scenario = write(tmp_path, method="{name: comp.py:Half, c: 7}", **{"comp.py": GOOD_COMPRESSOR})
    result = cli("plan", str(scenario), "--import")
    assert result.exit_code == 2 and "method.c: must be <= 1" in result.output, result.output
    scenario = write(tmp_path, method="{name: comp.py:Half, k: 7}", **{"comp.py": GOOD_COMPRESSOR})
    result = cli("plan", str(scenario), "--import")
    assert result.exit_code == 2 and "method.k" in result.output, result.output
    ok = cli("plan", str(write(tmp_path, method="{name: comp.py:Half, c: 0.25}", **{"comp.py": GOOD_COMPRESSOR})), "--import")
    assert ok.exit_code == 0, ok.output


def test_a_users_rule_must_be_an_update_rule(tmp_path):
    scenario = write(tmp_path, method="{name: topk, rule: rule.py:Nope}", **{"rule.py": "Nope = 3\n"})
    result = cli("plan", str(scenario), "--import")
    assert result.exit_code == 2 and "method.rule:" in result.output and "not a subclass of emulator.runtime.rules.UpdateRule" in result.output


# -- with TensorFlow: the user's Keras model --------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("function,line", [
    ("biuld", "defines no 'biuld'; it defines: build, not_a_model, too_narrow, with_batch_norm"),
    ("not_a_model", "returned str, not a keras.Model"),
    ("too_narrow", "the model's output has shape (3,) per example; the data set has 10 classes, so it must be (10,)"),
    ("with_batch_norm", "non-trainable weights"),
])
def test_a_model_that_cannot_train_here_is_refused_naming_the_file(tmp_path, function, line):
    scenario = write(tmp_path, model=f"{{file: net.py, function: {function}}}", **{"net.py": KERAS_MODEL})
    result = cli("plan", str(scenario), "--import")
    assert result.exit_code == 2, result.output
    assert "model:" in result.output and "net.py" in result.output and line in result.output, result.output


@pytest.mark.slow
def test_a_users_model_and_compressor_train_on_the_local_backend_imported_once_in_the_zygote(tmp_path):
    marker = tmp_path / "imports.txt"
    net = KERAS_MODEL + f"\nimport os\nwith open({str(marker)!r}, 'a') as fh:\n    fh.write(str(os.getpid()) + '\\n')\n"
    scenario = write(tmp_path, model="{file: net.py, function: build, args: {hidden: 24}}", method="{name: comp.py:Half, c: 0.5}",
                     updates=200, **{"net.py": net, "comp.py": GOOD_COMPRESSOR})
    summary, run_dir = run_scenario(scenario, tmp_path / "runs")
    assert summary["status"] == "completed" and summary["outcome"] == "ok"
    assert summary["final_accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert summary["method"] == "comp.py:Half" and summary["compressor"] == f"{tmp_path}/comp.py:Half"
    manifest = read_json(run_dir / "workload.json")
    assert [(f["field"], f["copy"]) for f in manifest["files"]] == [("model", "workload/net.py"), ("method.name", "workload/comp.py")]
    assert manifest["files"][0]["sha256"] == plugins.file_digest(tmp_path / "net.py")
    assert (run_dir / "workload" / "net.py").read_text() == net
    pids = marker.read_text().split()
    # The controller imported it to check it, the zygote once for every device: no device imported it again.
    assert len(pids) == 2, pids
    events = read_jsonl(run_dir / "events.jsonl")
    assert sum(e["kind"] == "worker_ready" for e in events) == 2
