"""Which of a user's files a scenario will run or read: its model, compressor, update rule, data.

Pure: the files are named, never imported (``emulate plan`` lists them; a run imports them in
:mod:`emulator.control.workload`). A scenario that names none runs no code from outside the package.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator import datasets, plugins
from emulator.planning.plan import Plan


@dataclass(frozen=True)
class UserFile:
    """One file of the user's that a run uses."""

    field: str  # where the scenario names it: model, method.name, method.rule, method.aggregation.name, dataset.loader, dataset.file
    role: str  # model | compressor | rule | aggregator | loader | data
    path: str  # absolute, on this machine
    attribute: str | None  # what in it is used (file.py:attribute); None for a file used whole
    imported: bool  # Python the run imports (on the host, and on devices for model, compressor and rule)

    @property
    def reference(self) -> str:
        return f"{self.path}:{self.attribute}" if self.attribute else self.path

    @property
    def on_devices(self) -> bool:
        """Whether devices need it (a data set's files and loader are read once, on the host)."""
        return self.role in DEVICE_ROLES


DEVICE_ROLES = ("model", "compressor", "rule", "aggregator")


def _code(field: str, role: str, ref: str) -> UserFile:
    path, attribute = plugins.split(ref)
    return UserFile(field, role, path, attribute, imported=path.endswith(plugins.PYTHON_SUFFIX))


def _data_file(spec: dict, role: str, path: str) -> UserFile:
    """A file the data set section names: its loader (imported on the host), or data it reads."""
    if role == "loader":
        return UserFile("dataset.loader", role, path, plugins.split(spec["loader"])[1], imported=True)
    field = next((key for key in ("file", "test_file", "path") if spec.get(key)
                  and str(plugins.resolve_path(spec[key])) == path), "file")
    return UserFile(f"dataset.{field}", role, path, None, imported=False)


def user_files(plan: Plan) -> list[UserFile]:
    """Every user file a plan names, in the order a run meets them: data first, then model and method."""
    out = [_data_file(plan.dataset, role, path) for role, path in datasets.user_files(plan.dataset)]
    if plugins.is_reference(plan.model["name"]):
        out.append(_code("model", "model", plan.model["name"]))
    if plugins.is_reference(plan.method.compressor):
        out.append(_code("method.name", "compressor", plan.method.compressor))
    if plugins.is_reference(plan.method.rule):
        out.append(_code("method.rule", "rule", plan.method.rule))
    if plugins.is_reference(plan.method.aggregation["name"]):
        out.append(_code("method.aggregation.name", "aggregator", plan.method.aggregation["name"]))
    return out


__all__ = ["DEVICE_ROLES", "UserFile", "user_files"]
