"""The device configuration is a contract: what the controller writes is what the programs read.

The controller's own ``_config`` builds each role's configuration for the planned quickstart
scenario (real shards, real local endpoints, a real collector); each must survive JSON and come
back equal. The programs' reads are checked against the classes from their source: every
``cfg.<field>`` a program reads is a field, and every field is read by some program.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from emulator.backends.base import Backend
from emulator.backends.local import LocalBackend
from emulator.control.controller import Emulation
from emulator.control.rundir import RunDirectory
from emulator.planning.loader import load_scenario
from emulator.planning.plan import LinkPlan, make_plan
from emulator.runtime import bootstrap
from emulator.runtime.config import (LINK_FIELDS, LINK_PROPERTIES, ROLES, ConfigError, DeviceConfig, EvaluatorConfig, LinkConfig,
                                     MethodConfig, ServerConfig, WorkerConfig)

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "emulator" / "runtime"
PROGRAMS = ("bootstrap.py", "paramserver.py", "worker.py", "evaluator.py")


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, DeviceConfig]:
    """Every device's configuration as the controller writes it for the planned quickstart."""
    plan = make_plan(load_scenario(ROOT / "scenarios" / "quickstart.yaml")[0])
    root = tmp_path_factory.mktemp("runs")
    emulation = Emulation(plan, LocalBackend(use_zygote=False), RunDirectory.create(root, plan.name), say=lambda _: None)
    try:
        emulation._prepare()
        out = {d.name: emulation._config(d) for d in plan.devices}
        emulation.devices.incarnation["worker-1"] = 1  # a restarted worker: its next start document
        out["worker-1 restarted"] = emulation._config(plan.device("worker-1"))
    finally:
        emulation.backend.teardown()
        emulation.collector.close()
        emulation.rundir.close()
    return out


def test_each_role_s_config_survives_json(configs):
    assert {type(c) for c in configs.values()} == {ServerConfig, WorkerConfig, EvaluatorConfig}
    for name, config in configs.items():
        document = json.loads(json.dumps(config.to_json()))
        assert document["role"] == config.role and document["version"] == 1
        back = DeviceConfig.from_json(document)
        assert back == config and type(back) is type(config), name
        assert type(config).from_json(document) == config
    restarted, first = configs["worker-1 restarted"], configs["worker-1"]
    assert (restarted.incarnation, first.incarnation) == (1, 0) and restarted.seed != first.seed


def test_the_configs_carry_the_plan(configs):
    worker, server, evaluator = configs["worker-0"], configs["server"], configs["evaluator"]
    assert worker.method.compressor == "topk" and worker.method.params["c"] == 0.01 and worker.method.pull.every == 1
    assert worker.transport.delay_s == 0.01 and worker.transport.uplink_bps == 10e6  # local: all in the transport
    assert worker.ps == server.bind and server.rule == "adacomp" and server.checkpoint is not None
    assert (evaluator.eval_every_updates, evaluator.eval_every_s) == (100, None)
    assert {c.token for c in configs.values()} == {server.token} and all(c.collector == server.collector for c in configs.values())


def test_a_backend_s_transport_part_is_a_link_config():
    """The kernel's properties stay out of the device's shaper: the rest of its link is unshaped."""

    class Netem(Backend):
        name = "netem"
        prepare = start = kill = pause = resume = set_cpus = set_link = partition = alive = teardown = None

        def mechanisms(self, device):
            return {"uplink": "tc-htb", "downlink": "transport-token-bucket", "delay": "tc-netem", "jitter": "unshaped", "loss": "tc-netem"}

    link = LinkPlan(uplink_bps=1e6, downlink_bps=2e6, delay_s=0.05, jitter_s=0.0, loss=0.01)
    part = Netem().transport_link(None, link)
    assert part == {"downlink_bps": 2e6}
    assert LinkConfig(**part) == LinkConfig(downlink_bps=2e6)


def _fields(cls) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _dataclass_of(kind):
    for arg in (kind, *typing.get_args(kind)):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


CLASSES = {c.__name__: c for c in (DeviceConfig, *ROLES.values(), MethodConfig)}


def _typed_args(function: ast.FunctionDef) -> dict[str, type]:
    return {a.arg: CLASSES[a.annotation.id] for a in function.args.args
            if isinstance(a.annotation, ast.Name) and a.annotation.id in CLASSES}


def _reads() -> dict[type, set[str]]:
    """Class -> the fields the programs read from it (``cfg.x``, ``cfg.x.y``, and ``self.cfg.x`` in
    a class whose ``__init__`` takes a typed ``cfg``)."""
    reads: dict[type, set[str]] = {}
    for program in PROGRAMS:
        tree = ast.parse((RUNTIME / program).read_text())
        functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]
        kept = {cls for f in functions if f.name == "__init__" for name, cls in _typed_args(f).items() if name == "cfg"}
        for function in functions:
            typed = _typed_args(function)
            for node in ast.walk(function):
                chain = []
                while isinstance(node, ast.Attribute):
                    chain.insert(0, node.attr)
                    node = node.value
                if not chain or not isinstance(node, ast.Name):
                    continue
                if node.id == "self" and chain[0] == "cfg" and kept:
                    (cls,), chain = kept, chain[1:]
                else:
                    cls = typed.get(node.id)
                for attr in chain:
                    if cls is None or attr in ("role", "to_json"):
                        break
                    known = _fields(cls)
                    assert attr in known, f"{program}: reads {attr!r} of a {cls.__name__}, which has no such field"
                    reads.setdefault(cls, set()).add(attr)
                    cls = _dataclass_of(known[attr])
    return reads


def test_every_field_a_program_reads_is_written_and_every_field_written_is_read():
    reads = _reads()
    # The paramserver's ``self.cfg`` is read in its methods, typed in __init__; make sure it was seen.
    assert {"bind", "layout", "checkpoint"} <= reads.get(ServerConfig, set())
    common = reads.get(DeviceConfig, set())
    assert common == set(_fields(DeviceConfig))  # bootstrap.start reads the common part, for every role
    for cls in (*ROLES.values(), MethodConfig):
        unread = set(_fields(cls)) - reads.get(cls, set()) - common
        assert not unread, f"{cls.__name__} fields no program reads: {sorted(unread)}"


def _worker_document(configs) -> dict:
    return json.loads(json.dumps(configs["worker-0"].to_json()))


@pytest.mark.parametrize("change, message", [
    (lambda d: d.pop("batch_size"), "worker config: missing key 'batch_size'"),
    (lambda d: d.update(colour="blue"), "worker config: unknown key 'colour'"),
    (lambda d: d["method"]["pull"].pop("every"), "worker config: missing key 'method.pull.every'"),
    (lambda d: d["transport"].update(rate=1), "worker config: unknown key 'transport.rate'"),
    (lambda d: d.update(batch_size="10"), "worker config: key 'batch_size' must be int, got '10'"),
    (lambda d: d.update(ps=["server"]), "worker config: key 'ps' must be a list of 2 values"),
    (lambda d: d.update(version=0), "worker config: key 'version' is 0"),
    (lambda d: d.update(role="router"), "device config: key 'role' is 'router'"),
])
def test_a_document_off_the_contract_is_refused_naming_the_key(configs, change, message):
    document = _worker_document(configs)
    change(document)
    with pytest.raises(ConfigError) as caught:
        DeviceConfig.from_json(document)
    assert str(caught.value).startswith(message)


def test_a_role_s_class_reads_only_its_role(configs):
    with pytest.raises(ConfigError, match="expected a server config"):
        ServerConfig.from_json(_worker_document(configs))


def test_a_program_given_a_bad_document_exits_naming_the_key(configs, tmp_path):
    document = _worker_document(configs)
    del document["shard"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document))
    with pytest.raises(SystemExit) as exited:
        bootstrap.load_config(WorkerConfig, [str(path)])
    assert str(exited.value) == f"{path}: worker config: missing key 'shard'"
    path.write_text(json.dumps(_worker_document(configs)))
    assert bootstrap.load_config(WorkerConfig, [str(path)]) == configs["worker-0"]


def test_the_link_properties_are_the_link_config_s_fields():
    assert LINK_PROPERTIES == ("uplink", "downlink", "delay", "jitter", "loss")
    assert list(LINK_FIELDS.values()) == [f.name for f in dataclasses.fields(LinkConfig)]
    assert LinkPlan is LinkConfig
    link = LinkConfig(uplink_bps=2e6, delay_s=0.03)
    assert LinkConfig.from_json(json.loads(json.dumps(link.to_json()))) == link
    with pytest.raises(ConfigError, match="link: missing key 'loss'"):
        LinkConfig.from_json({k: v for k, v in link.to_json().items() if k != "loss"})
    with pytest.raises(TypeError):
        LinkConfig(2e6)  # by keyword only


def test_the_config_module_needs_only_the_standard_library():
    """The Swarm agent and the runtime image import it without the controller's dependencies."""
    code = ("import sys, emulator.runtime.config; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'pydantic', 'compression', 'yaml', 'docker'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_scenario_declares_every_link_property_for_groups_and_link_changes():
    """The scenario's schema spells each property out with its own type; this keeps it in step with the config."""
    from emulator.planning.scenario import LinkChange, WorkerGroup

    for model in (WorkerGroup, LinkChange):
        assert set(LINK_PROPERTIES) <= set(model.model_fields), model.__name__
