"""A user's own code, named by a file and an attribute: ``models/sensor.py:build``.

Every pluggable thing (model, data set loader, compressor, update rule) is looked up by name in
its room's registry; a name that is a *reference* to a user's file instead is resolved here, so
the built-ins and a user's plug-ins go through the same lookup. A reference is
``path/to/file.py:attribute`` (a Python file) or a data or model file on its own (``net.keras``).

A file is imported once per process under a name made from its real path, so a zygote that
imports it before forking and a device that looks it up later share one module. What the user's
code raises (on import or when called) becomes :class:`UserCodeError`, whose message holds the
user's own traceback, marked as theirs, without the emulator's frames.

Standard library only: the runtime image's devices, the zygote and the controller all use it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

PYTHON_SUFFIX = ".py"
MODULE_PREFIX = "emulate_user_"  # sys.modules names of users' files: emulate_user_<stem>_<hash of the path>


class PluginError(ValueError):
    """A reference that cannot be resolved: the file or the attribute is missing, or is not what is needed."""


class UserCodeError(PluginError):
    """The user's code raised; ``user_traceback`` is their part of the traceback, already in the message."""

    def __init__(self, what: str, error: BaseException, user_traceback: str):
        self.what = what
        self.error = error
        self.user_traceback = user_traceback
        marked = "\n".join(f"  | {line}" for line in user_traceback.rstrip().splitlines())
        super().__init__(f"{what} raised {type(error).__name__}: {error}\n"
                         f"  your code's traceback (the emulator's frames left out):\n{marked}")


def is_reference(text: str) -> bool:
    """Whether ``text`` names a user's file (``file.py:attr``, ``file.py``, or a path with a suffix) rather
    than a registry name (registry names have no ``/``, ``:`` or ``.``)."""
    return any(ch in text for ch in "/:.")


def split(ref: str) -> tuple[str, str | None]:
    """``"dir/file.py:attr"`` -> ``("dir/file.py", "attr")``; ``"net.keras"`` -> ``("net.keras", None)``.

    The attribute is what follows the last ``:`` when the path before it ends in ``.py``."""
    path, sep, attr = ref.rpartition(":")
    if sep and path.endswith(PYTHON_SUFFIX) and attr:
        if not attr.isidentifier():
            raise PluginError(f"{ref!r}: {attr!r} is not a Python name")
        return path, attr
    if not sep or ref.endswith(PYTHON_SUFFIX):
        return ref, None
    if not path.endswith(PYTHON_SUFFIX) and not ref.endswith(":"):
        return ref, None  # a path with a colon in it (rare), not a reference to an attribute
    raise PluginError(f"{ref!r}: expected file.py:name (a Python file and what in it to use) or a file path")


def resolve_path(path: str, base: str | os.PathLike | None = None) -> Path:
    """``path`` made absolute against ``base`` (the scenario's folder), ``~`` expanded; not checked."""
    p = Path(path).expanduser()
    if not p.is_absolute() and base is not None:
        p = Path(base) / p
    return p.absolute()


def module_name(path: str | os.PathLike) -> str:
    """The ``sys.modules`` name of a user's file: stable per real path, so imports are shared."""
    real = os.path.realpath(path)
    stem = "".join(ch if ch.isalnum() else "_" for ch in Path(real).stem)
    return f"{MODULE_PREFIX}{stem}_{hashlib.sha256(real.encode()).hexdigest()[:10]}"


def user_frames(error: BaseException, files: set[str]) -> str:
    """The traceback of ``error`` from the first frame in one of ``files`` on (the user's own code and
    what it called), or the whole exception line when no frame is theirs (a syntax error shows its line)."""
    tb = error.__traceback__
    while tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename) not in files:
        tb = tb.tb_next
    if tb is None:
        return "".join(traceback.format_exception_only(type(error), error))
    return "".join(traceback.format_exception(type(error), error, tb))


def import_file(path: str | os.PathLike) -> ModuleType:
    """Import a user's Python file once per process (later calls return the same module).

    :class:`PluginError` if it is missing or not a ``.py`` file; :class:`UserCodeError` if importing it raises."""
    file = Path(path)
    name = module_name(file)
    if name in sys.modules:
        return sys.modules[name]
    if file.suffix != PYTHON_SUFFIX:
        raise PluginError(f"{file}: not a Python file (.py)")
    if not file.is_file():
        raise PluginError(f"{file}: no such file")
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as error:
        del sys.modules[name]
        if isinstance(error, KeyboardInterrupt):
            raise
        raise UserCodeError(f"importing {file}", error, user_frames(error, {os.path.realpath(file)})) from None
    return module


def load(ref: str, base: str | os.PathLike | None = None) -> Any:
    """What ``file.py:attr`` names (the file imported once, relative paths taken against ``base``)."""
    path, attr = split(ref)
    if attr is None:
        raise PluginError(f"{ref!r}: name what in the file to use: {path}:NAME")
    module = import_file(resolve_path(path, base))
    try:
        return getattr(module, attr)
    except AttributeError:
        defined = sorted(n for n, v in vars(module).items() if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        raise PluginError(f"{path}: defines no {attr!r}" + (f"; it defines: {', '.join(defined)}" if defined else "")) from None


def lookup(name: str, registry: dict, base: type, kind: str, base_name: str) -> type:
    """A class by name: ``registry[name]`` for a built-in, else the user's subclass of ``base`` that the
    reference ``name`` names (``file.py:Class``), checked to be one and to implement its abstract methods.

    ValueError listing the known names for an unknown name; PluginError naming the file otherwise."""
    if not is_reference(name):
        try:
            return registry[name]
        except KeyError:
            raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(registry))}") from None
    cls = load(name)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PluginError(f"{name}: is {cls!r}, not a subclass of {base_name} (see docs/OWN_WORKLOAD.md)")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise PluginError(f"{name}: does not implement {', '.join(missing)} of {base_name}")
    return cls


def call(fn: Callable, *args, what: str, **kwargs) -> Any:
    """``fn(*args, **kwargs)``, what it raises turned into :class:`UserCodeError` with the user's frames.

    ``fn`` is a user's function or class; the frames kept start at the first one in its file."""
    try:
        return fn(*args, **kwargs)
    except (PluginError, KeyboardInterrupt):
        raise
    except Exception as error:  # noqa: BLE001 - anything the user's code raises is reported as theirs
        code = getattr(fn, "__code__", None) or getattr(getattr(fn, "__init__", None), "__code__", None)
        files = {os.path.realpath(code.co_filename)} if code is not None else set()
        module = sys.modules.get(getattr(fn, "__module__", "") or "")
        if module is not None and getattr(module, "__file__", None):
            files.add(os.path.realpath(module.__file__))
        raise UserCodeError(what, error, user_frames(error, files)) from None


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (of every file under it, in order, for a folder), hex."""
    digest = hashlib.sha256()
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    for f in files:
        if p.is_dir():
            digest.update(str(f.relative_to(p)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


__all__ = ["PluginError", "UserCodeError", "call", "file_digest", "import_file", "is_reference", "load", "lookup", "module_name",
           "resolve_path", "split", "user_frames"]
