"""The fault injector: the plan's timeline and its training-aware triggers, applied to running devices.

Each action is one small function, registered by name in :data:`ACTIONS` (the scenario's
actions: crash, restart, pause, resume, partition, heal, cpus, link). It acts through the
backend's setters, the same ones that set a device up (``kill``, ``start``, ``pause``,
``set_cpus``, ``set_link``, ``partition``), and through a device's in-process shaper for what
the backend cannot do in the kernel. To add a fault: write its function here, add it to
``ACTIONS``, and add its key to the scenario's schema.

Failures are data: every fault applied is a ``fault`` event in the traces with its planned time,
origin (schedule, random, trigger), parameters, and what it took (a restart's incarnation, a
partition's fallback mechanism). A crash of a device already down changes nothing and is not
recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from emulator.backends import Backend
from emulator.planning.plan import DevicePlan, EventPlan, LinkPlan, Plan
from emulator.runtime.config import DeviceConfig


@dataclass
class Devices:
    """What faults change on running devices, and the controller reads back: each device's link
    and CPU share now, how often it was restarted, and which devices are down."""

    links: dict[str, LinkPlan]
    cpus: dict[str, float]
    incarnation: dict[str, int] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, plan: Plan) -> "Devices":
        """As planned: every device up, with its planned link and CPU share."""
        return cls({d.name: d.link for d in plan.devices}, {d.name: d.cpus for d in plan.devices})


class FaultInjector:
    """Applies faults to one run's devices: the timeline as training time passes, and the triggers
    (``after_pushes`` applied updates of a worker) with their undo after a delay."""

    def __init__(self, plan: Plan, backend: Backend, devices: Devices, *, config: Callable[[DevicePlan], DeviceConfig],
                 send: Callable[[str, dict], None], record: Callable[..., None]):
        self.plan = plan
        self.backend = backend
        self.devices = devices
        self.config = config  # a device's start document (a restart starts it again)
        self.send = send  # a command to a device's program (its in-process shaper)
        self.record = record  # an event into the traces
        self.timeline = list(plan.events)
        self.pending: list[EventPlan] = []  # fired by triggers, in time order
        self._fired: set[int] = set()

    def apply(self, event: EventPlan) -> None:
        """Apply one fault now and record it (unless it changed nothing)."""
        try:
            action = ACTIONS[event.action]
        except KeyError:
            raise ValueError(f"unknown fault action {event.action!r}; known: {', '.join(ACTIONS)}") from None
        device = self.plan.device(event.target)
        detail = action(self, device, event.params)
        if detail is not None:
            self.record("fault", action=event.action, target=device.name, planned_s=event.time_s, origin=event.source,
                        **event.params, **detail)

    def advance(self, now_s: float, pushes: Callable[[str], int]) -> None:
        """Apply what is due at ``now_s`` seconds of training: the timeline, then the triggers that
        ``pushes`` (a worker's applied updates so far) fire, then what triggers scheduled."""
        while self.timeline and self.timeline[0].time_s <= now_s:
            self.apply(self.timeline.pop(0))
        self._fire_triggers(now_s, pushes)
        while self.pending and self.pending[0].time_s <= now_s:
            self.apply(self.pending.pop(0))

    @property
    def restart_ahead(self) -> bool:
        """Whether a restart is still to come (a run whose workers are all down may yet go on)."""
        return any(e.action == "restart" for e in self.timeline + self.pending)

    def _fire_triggers(self, now_s: float, pushes: Callable[[str], int]) -> None:
        for i, trigger in enumerate(self.plan.triggers):
            if i in self._fired or pushes(trigger["worker"]) < trigger["after_pushes"]:
                continue
            self._fired.add(i)
            self.pending.append(EventPlan(now_s, trigger["action"], trigger["worker"], {}, "trigger"))
            undo, after_s = UNDO[trigger["action"]], trigger.get(UNDO_AFTER[trigger["action"]])
            if after_s is not None:
                self.pending.append(EventPlan(now_s + after_s, undo, trigger["worker"], {}, "trigger"))
            self.pending.sort(key=lambda e: e.time_s)


# -- the actions: (injector, device, parameters) -> what to add to its fault event, or None ----


def crash(inj: FaultInjector, device: DevicePlan, params: dict) -> dict | None:
    if device.name in inj.devices.down:
        return None
    inj.backend.kill(device)
    inj.devices.down.add(device.name)
    return {}


def restart(inj: FaultInjector, device: DevicePlan, params: dict) -> dict:
    """Start the device again (its next incarnation: a new seed, a new start document)."""
    inj.devices.incarnation[device.name] = inj.devices.incarnation.get(device.name, 0) + 1
    inj.backend.start(device, inj.config(device))
    inj.backend.set_link(device, inj.devices.links[device.name])
    inj.devices.down.discard(device.name)
    return {"incarnation": inj.devices.incarnation[device.name]}


def pause(inj: FaultInjector, device: DevicePlan, params: dict) -> dict:
    inj.backend.pause(device)
    _availability(inj, device, False)
    return {}


def resume(inj: FaultInjector, device: DevicePlan, params: dict) -> dict:
    inj.backend.resume(device)
    _availability(inj, device, True)
    return {}


def _availability(inj: FaultInjector, device: DevicePlan, available: bool) -> None:
    """Tell the servers a worker went offline or came back (an availability trace's spells are
    pauses): a federated round samples only the clients that are there, as a real one samples
    those that checked in. A crashed worker needs no word: its connection closes."""
    if device.role == "worker":
        for server in inj.plan.servers:
            inj.send(server.name, {"cmd": "availability", "worker": device.index, "available": available})


def _cut(inj: FaultInjector, device: DevicePlan, cut: bool) -> dict:
    """Cut or restore the device's network; the device's own shaper blocks it where the backend cannot."""
    if inj.backend.partition(device, cut):
        return {}
    inj.send(device.name, {"cmd": "shape", "transport": {"blocked": cut}})
    return {"mechanism": "transport"}


def partition(inj: FaultInjector, device: DevicePlan, params: dict) -> dict:
    return _cut(inj, device, True)


def heal(inj: FaultInjector, device: DevicePlan, params: dict) -> dict:
    return _cut(inj, device, False)


def cpus(inj: FaultInjector, device: DevicePlan, params: dict) -> dict:
    inj.devices.cpus[device.name] = float(params["cpus"])
    inj.backend.set_cpus(device, inj.devices.cpus[device.name])
    return {}


def link(inj: FaultInjector, device: DevicePlan, params: dict) -> dict:
    """Change some link properties (the others stay); the kernel's part and the shaper's part both."""
    changed = replace(inj.devices.links[device.name], **params)
    inj.devices.links[device.name] = changed
    inj.backend.set_link(device, changed)
    inj.send(device.name, {"cmd": "shape", "transport": inj.backend.transport_link(device, changed)})
    return {}


Action = Callable[[FaultInjector, DevicePlan, dict], "dict | None"]
ACTIONS: dict[str, Action] = {
    "crash": crash, "restart": restart, "pause": pause, "resume": resume,
    "partition": partition, "heal": heal, "cpus": cpus, "link": link,
}
UNDO = {"crash": "restart", "pause": "resume", "partition": "heal"}  # what ends a triggered fault ...
UNDO_AFTER = {"crash": "restart_after_s", "pause": "for_s", "partition": "for_s"}  # ... and the trigger's key for when


__all__ = ["ACTIONS", "Devices", "FaultInjector"]
