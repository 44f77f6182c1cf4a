"""The plug-in contracts a user's class is checked against (``emulate check``), run on every built-in
first: each registered compressor and rule passes, and each deliberately broken one fails the check
that names its defect (and only that one)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import compression
from compression import Compressor, DensePart, Params, SparsePart
from compression.topk import TopK
from emulator.cli import main
from emulator.runtime import contract, rules
from emulator.runtime.rules import Applied, Plain, UpdateRule

from compression_support import registry_params


def failed(verdicts) -> dict[str, str]:
    return {v.check: v.detail for v in verdicts if not v.ok}


@pytest.mark.parametrize("name", sorted(compression.COMPRESSORS))
def test_every_registered_compressor_keeps_the_contract(name):
    verdicts = contract.check_compressor(compression.COMPRESSORS[name], registry_params(name))
    assert [v.check for v in verdicts] == list(contract.CHECKS)
    assert failed(verdicts) == {}


@pytest.mark.parametrize("name", sorted(rules.RULES))
def test_every_built_in_rule_keeps_the_contract(name):
    verdicts = contract.check_rule(rules.RULES[name])
    assert [v.check for v in verdicts] == list(contract.RULE_CHECKS)
    assert failed(verdicts) == {}


# -- broken compressors: each breaks one clause -------------------------------------------


class Unseeded(TopK):
    """Draws from numpy's global generator, not self.rng: two equal seeds send different bytes."""

    def _compress(self, grads):
        return [SparsePart(np.sort(np.random.choice(g.size, 1, replace=False)).astype(np.int64), g[:1].copy()) for g in grads]


class TrimsNaN(TopK):
    """Overrides compress itself, so a NaN gradient is compressed (top-k silently skips NaN)."""

    def compress(self, grads):
        return self._compress([np.nan_to_num(g) for g in grads])


class Float64(TopK):
    """Sends float64 dense parts: not the layout's float32."""

    def _compress(self, grads):
        return [DensePart(g.astype(np.float64)) for g in grads]


class MissesATensor(TopK):
    def _compress(self, grads):
        return super()._compress(grads)[:-1]


class LooseParams(Params):
    model_config = {"extra": "allow", "frozen": True}


class AcceptsAnything(TopK):
    Params = LooseParams

    def __init__(self, params, layout, seed=0):
        Compressor.__init__(self, params, layout, seed)
        self.keep = [1] * len(layout)


@pytest.mark.parametrize("cls,check", [
    (Unseeded, "seeded"), (TrimsNaN, "non_finite"), (Float64, "parts"), (MissesATensor, "parts"), (AcceptsAnything, "builds"),
])
def test_a_broken_compressor_fails_the_check_of_its_defect(cls, check):
    problems = failed(contract.check_compressor(cls))
    assert check in problems, problems
    assert problems[check]  # says what broke


def test_a_compressor_that_raises_fails_with_its_exception():
    class Raises(TopK):
        def _compress(self, grads):
            raise RuntimeError("my bug")

    problems = failed(contract.check_compressor(Raises))
    assert problems["parts"] == "raised RuntimeError: my bug" and "builds" not in problems


# -- broken rules ----------------------------------------------------------------------------


class WritesBeforeChecking(Plain):
    """Writes each step as it goes: an overflow leaves the model half updated."""

    def apply(self, params, parts, worker, staleness):
        coordinates = self._coordinates(parts)
        for target, values in coordinates:
            with np.errstate(over="ignore"):
                params[target] -= self.learning_rate * values
        if not np.isfinite(params).all():
            raise rules.RuleError("overflow")
        return Applied(sum(v.size for _, v in coordinates), 1.0)


class ForgetsInCheckpoints(Plain):
    """Keeps a step counter that decays the rate but leaves it out of state()."""

    def __init__(self, layout, learning_rate):
        super().__init__(layout, learning_rate)
        self.steps_seen = 0

    def steps(self, coordinates, worker, staleness):
        self.steps_seen += 1
        rate = self.learning_rate / self.steps_seen
        out = [(target, rate * values) for target, values in coordinates]
        return out, Applied(sum(s.size for _, s in out), rate / self.learning_rate)

    def _flat_arguments(self, worker, staleness):
        return self.learning_rate / (self.steps_seen + 1), None, None


@pytest.mark.parametrize("cls,check", [(WritesBeforeChecking, "all_or_nothing"), (ForgetsInCheckpoints, "checkpoint")])
def test_a_broken_rule_fails_the_check_of_its_defect(cls, check):
    problems = failed(contract.check_rule(cls))
    assert check in problems, problems


def test_a_users_rule_without_a_compiled_form_is_applied_by_its_steps():
    class Halved(UpdateRule):
        name = "halved"

        def steps(self, coordinates, worker, staleness):
            out = [(target, self.learning_rate * 0.5 * values) for target, values in coordinates]
            return out, Applied(sum(s.size for _, s in out), 0.5)

    assert failed(contract.check_rule(Halved)) == {}


# -- the command ------------------------------------------------------------------------------

BROKEN = '''
import numpy as np
from compression import SparsePart
from compression.topk import TopK


class Broken(TopK):
    def _compress(self, grads):
        return [SparsePart(np.array([0]), np.random.normal(size=1).astype(np.float32)) for g in grads]
'''


def test_emulate_check_catches_a_deliberately_broken_compressor(tmp_path):
    (tmp_path / "broken.py").write_text(BROKEN)
    result = CliRunner().invoke(main, ["check", f"{tmp_path}/broken.py:Broken", "-p", "c=0.1"])
    assert result.exit_code == 1, result.output
    assert "FAIL seeded" in result.output and "ok   builds" in result.output
    good = CliRunner().invoke(main, ["check", f"{tmp_path}/broken.py:TopK"])
    assert good.exit_code == 0 and "8 of 8 checks passed" in good.output


def test_emulate_check_refuses_bad_parameters_and_non_plugins_with_exit_2(tmp_path):
    (tmp_path / "broken.py").write_text(BROKEN)
    result = CliRunner().invoke(main, ["check", f"{tmp_path}/broken.py:Broken", "-p", "c=7"])
    assert result.exit_code == 2 and "params.c" in result.output
    result = CliRunner().invoke(main, ["check", f"{tmp_path}/broken.py:np"])
    assert result.exit_code == 2 and "neither a compression.Compressor, an UpdateRule nor an Aggregator" in result.output
    result = CliRunner().invoke(main, ["check", f"{tmp_path}/nope.py:X"])
    assert result.exit_code == 2 and "no such file" in result.output
