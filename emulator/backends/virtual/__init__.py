"""The virtual backend: every device lives on a discrete-event clock in this process.

It realises a plan like the other backends, through the same methods (``start``, ``kill``,
``pause``, ``resume``, ``set_cpus``, ``set_link``, ``partition``) that the real fault injector
calls, but its devices are :class:`~.sim.Simulator` objects and its time is virtual: the
``clock`` is ``"virtual"``, so the control floor runs it with its virtual-time runner
(:mod:`emulator.control.simulation`) instead of the wall-clock controller. What it cannot model
it refuses before the run (:meth:`VirtualBackend.refuses`), naming the scenario's field.
"""

from __future__ import annotations

from emulator.backends.base import Backend, Endpoints
from emulator.backends.virtual.timing import CFS_PERIOD_S

MODELLED_ACTIONS = ("crash", "restart", "pause", "resume", "cpus", "link", "partition", "heal")


class VirtualBackend(Backend):
    name = "virtual"
    clock = "virtual"
    cpu_limited_by_host = False  # simulated devices take no core of this machine's while they wait

    def __init__(self, say=None):
        super().__init__(say)
        self.sim = None  # the Simulator, once the runner built it
        self.incarnation: dict[str, int] = {}

    @classmethod
    def available(cls) -> tuple[bool, str]:
        return True, ""

    @classmethod
    def refuses(cls, plan) -> list[tuple[str, str]]:
        """(field, why) for every property of ``plan`` this backend does not model."""
        out = []
        if len(plan.servers) > 1:
            out.append(("server.shards", f"{len(plan.servers)} servers: the virtual backend simulates one parameter server"))
        where = {"schedule": "faults.at", "random": "faults.crash", "trigger": "faults.triggers"}
        for event in plan.events:
            path = where.get(event.source, f"{event.source} (traces)")
            if event.action not in MODELLED_ACTIONS:
                out.append((path, f"the {event.action!r} event ({event.target} at {event.time_s:g} s) is not modelled by the virtual backend"))
            elif plan.is_server(event.target) or event.target == plan.evaluator.name:
                out.append((path, f"a {event.action} of the {event.target} ({event.time_s:g} s) is not modelled by the virtual backend "
                                  "(a server's checkpoint, restore and reconnections are not simulated); run it on docker or local"))
        for trigger in plan.triggers:
            if plan.is_server(trigger.get("worker", "")):
                out.append(("faults.triggers", f"a trigger on the {trigger['worker']} is not modelled by the virtual backend"))
        groups = {}
        for device in plan.workers:
            if device.cpus > 1.0 and device.group not in groups:
                groups[device.group] = device
                out.append((f"workers ({device.group or device.name}).cpus", f"{device.cpus:g} cores for {device.name}: the virtual "
                            "backend models one thread per device (calibrated on one thread); give at most 1"))
        return out

    @staticmethod
    def warnings(plan) -> list[str]:
        """What the virtual clock runs without, said on the console before the run."""
        out = []
        limited = [d.name for d in plan.devices if d.memory_bytes]
        if limited:
            out.append(f"warning: the virtual backend does not model memory limits: {', '.join(limited[:4])}"
                       f"{f' and {len(limited) - 4} more' if len(limited) > 4 else ''} run without them (no swapping, no OOM kill)")
        if plan.checkpoint.get("enabled"):
            out.append("note: the virtual backend takes no checkpoints (no server fault is simulated that would need one)")
        return out

    def prepare(self, ctx, devices):
        return Endpoints("virtual", "virtual", ("virtual", 0), ("virtual", 0), ctx.data_dir, "", ctx.workload_dir)

    def mechanisms(self, device):
        link = device.link
        shaped = lambda value, how: how if value else "unshaped"  # noqa: E731
        return {
            "cpus": f"virtual: CFS quota model, {CFS_PERIOD_S * 1000:g} ms period, calibrated CPU seconds",
            "uplink": shaped(link.uplink_bps, "virtual: shaped rate less TCP/IP headers after the shaper's burst, server link shared max-min"),
            "downlink": shaped(link.downlink_bps, "virtual: shaped rate less TCP/IP headers after the shaper's burst, server link shared max-min"),
            "delay": shaped(link.delay_s, "virtual: one-way delay each direction"),
            "jitter": shaped(link.jitter_s, "virtual: normal jitter, seeded per device"),
            "loss": shaped(link.loss, "virtual: TCP throughput cap (Mathis), no retransmission timeouts"),
        }

    def transport_link(self, device, link):
        return {}

    def attach(self, sim) -> None:
        self.sim = sim

    def _worker(self, device) -> int:
        if device.role != "worker":
            raise ValueError(f"the virtual backend cannot act on the {device.name}")
        return device.index

    def start(self, device, config):
        count = self.incarnation.get(device.name)
        self.incarnation[device.name] = 0 if count is None else count + 1
        if self.sim is not None and count is not None:
            self.sim.restart(self._worker(device), self.incarnation[device.name])

    def kill(self, device):
        self.sim.kill(self._worker(device))

    def pause(self, device):
        self.sim.pause(self._worker(device))

    def resume(self, device):
        self.sim.resume(self._worker(device))

    def set_cpus(self, device, cpus):
        if device.role == "worker" and self.sim is not None:
            self.sim.set_cpus(device.index, cpus)

    def set_link(self, device, link):
        if device.role == "worker" and self.sim is not None:
            self.sim.set_link(device.index, link)

    def partition(self, device, cut):
        self.sim.partition(self._worker(device), cut)
        return True

    def alive(self, device):
        if self.sim is None or device.role != "worker":
            return self.sim is not None
        return self.sim.workers[device.index].alive

    def teardown(self):
        self.sim = None


__all__ = ["VirtualBackend"]
