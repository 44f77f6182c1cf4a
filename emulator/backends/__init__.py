"""Backends by name. ``local`` runs plain processes; ``docker`` one container per device; ``swarm``
one service per device over the nodes of a Docker swarm. Their names are
:data:`emulator.planning.backends.BACKENDS`, re-exported here."""

from __future__ import annotations

from emulator.backends.base import Backend, BackendUnavailable, Endpoints, RunContext
from emulator.planning.backends import AUTO, BACKENDS, CHOICES  # the one table of names (see there)


def backend_class(name: str) -> type[Backend]:
    """The class registered under ``name`` (imported on demand: docker needs its SDK)."""
    import importlib

    try:
        module, attr = BACKENDS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}") from None
    return getattr(importlib.import_module(module), attr)


def choose(requested: str, say=print) -> type[Backend]:
    """``auto``: docker when a daemon answers, else local, and say which and why."""
    if requested != AUTO:
        cls = backend_class(requested)
        ok, why = cls.available()
        if not ok:
            raise BackendUnavailable(f"backend {requested!r} is not usable here: {why}")
        return cls
    docker_cls = backend_class("docker")
    ok, why = docker_cls.available()
    if ok:
        say("backend: docker (a Docker daemon answers)")
        return docker_cls
    say(f"backend: local (docker not usable: {why})")
    return backend_class("local")


__all__ = ["AUTO", "BACKENDS", "CHOICES", "Backend", "BackendUnavailable", "Endpoints", "RunContext", "backend_class", "choose"]
