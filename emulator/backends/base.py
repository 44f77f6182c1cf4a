"""The backend contract: how a plan's devices become running things, and how faults reach them.

A backend starts, stops, pauses, throttles and shapes devices; the controller decides when.
Link properties are realised by the best mechanism the backend has (``mechanisms``); what it
cannot realise in the kernel it hands to the device's in-process shaper (``transport_link``),
and what nothing realises is recorded as ``none``, never silently ignored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar

from emulator.runtime.config import LINK_FIELDS, DeviceConfig

if TYPE_CHECKING:  # annotations only: the Swarm node agent imports this package without the controller's dependencies
    from emulator.host.owner import Owner
    from emulator.planning.plan import DevicePlan, LinkPlan


@dataclass(frozen=True)
class Endpoints:
    """Addresses as each side sees them."""

    collector_bind: str  # where the controller's collector listens
    collector_host: str  # how devices reach the collector
    server_bind: tuple[str, int]  # where the parameter server listens, inside its device
    server_address: tuple[str, int]  # how devices reach the parameter server
    data_dir: str  # the shard directory as devices see it
    checkpoint_dir: str  # where the parameter server keeps its checkpoint, as it sees it
    workload_dir: str  # the run's workload/ folder (the user's files, the initial model) as devices see it
    servers: dict = field(default_factory=dict)  # with several servers: name -> (bind, address); empty: server_bind/server_address

    def bind_of(self, server: str) -> tuple[str, int]:
        """Where the server called ``server`` listens, inside its device."""
        return tuple(self.servers[server][0]) if self.servers else tuple(self.server_bind)

    def address_of(self, server: str) -> tuple[str, int]:
        """How devices reach the server called ``server``."""
        return tuple(self.servers[server][1]) if self.servers else tuple(self.server_address)


@dataclass(frozen=True)
class RunContext:
    run_id: str
    run_dir: str
    data_dir: str  # the shard directory on the controller's machine
    start_time: float
    workload_dir: str = ""  # the run's workload/ folder on the controller's machine (emulator/control/workload.py)
    preload: tuple[str, ...] = ()  # names in it of the Python files devices import: a zygote imports them before forking


class BackendUnavailable(RuntimeError):
    """This backend cannot run here; the message says why and what to do."""


# ``removes(what, run, owner)``: whether ``emulate clean`` removes one resource (its kind and
# name, its run id, the controller that owns it: :class:`emulator.host.owner.Owner`, None when
# unlabelled); it also records what stays and why.
Removes = Callable[[str, str, "Owner | None"], bool]


class Backend(ABC):
    name: ClassVar[str]
    clean_rank: ClassVar[int] = 0  # ``emulate clean`` asks backends in this order (swarm's services own docker objects)
    cpu_limited_by_host: ClassVar[bool] = True  # devices share this machine's cores (a swarm spreads them over nodes)
    clock: ClassVar[str] = "wall"  # "virtual": devices live on a simulated clock, run by emulator.control.simulation

    @classmethod
    def refuses(cls, plan) -> list[tuple[str, str]]:
        """(scenario field, why) for each property of ``plan`` this backend cannot realise at all:
        the run is refused before it starts (exit 2). Default: nothing."""
        return []

    def __init__(self, say=None):
        self.say = say or (lambda msg: None)

    @classmethod
    def available(cls) -> tuple[bool, str]:
        """(usable here, why not)."""
        return True, ""

    @classmethod
    def diagnose(cls) -> list[tuple[str, str, str]]:
        """``emulate doctor``'s rows for this backend: (check, ok|warn|fail|info, detail)."""
        return []

    @classmethod
    def remove_leftovers(cls, run_id: str | None, removes: Removes, say: Callable[[str], None]) -> tuple[list[str], dict[str, str]]:
        """``emulate clean``: remove the labelled resources of killed runs (``run_id``: that run's
        only) for which ``removes`` says so. Returns a line per resource removed, and the run
        directories (path -> run id) whose working files may go with them."""
        return [], {}

    @abstractmethod
    def prepare(self, ctx: RunContext, devices: tuple[DevicePlan, ...]) -> Endpoints:
        """Create what the run needs before any device starts (network, image, cgroups)."""

    @abstractmethod
    def mechanisms(self, device: DevicePlan) -> dict[str, str]:
        """Property -> mechanism realising it for this device: cpus and each link property."""

    def transport_link(self, device: DevicePlan, link: LinkPlan) -> dict:
        """The link settings the device's own shaper must apply (those no kernel mechanism took),
        keyed by :class:`~emulator.runtime.config.LinkConfig` field: a shape command's ``transport``."""
        mech = self.mechanisms(device)
        return {name: getattr(link, name) for prop, name in LINK_FIELDS.items() if mech.get(prop, "").startswith("transport")}

    @abstractmethod
    def start(self, device: DevicePlan, config: DeviceConfig) -> None:
        """Start (or restart) the device's program, unthrottled: the controller applies the
        device's CPU quota with :meth:`set_cpus` once the program reports ready, so loading
        TensorFlow is not part of what is emulated."""

    def start_many(self, items: list[tuple[DevicePlan, DeviceConfig]]) -> None:
        """Start several devices (backends that can, do it in parallel)."""
        for device, config in items:
            self.start(device, config)

    @abstractmethod
    def kill(self, device: DevicePlan) -> None:
        """SIGKILL: a crash, no chance to clean up."""

    @abstractmethod
    def pause(self, device: DevicePlan) -> None: ...

    @abstractmethod
    def resume(self, device: DevicePlan) -> None: ...

    @abstractmethod
    def set_cpus(self, device: DevicePlan, cpus: float) -> None: ...

    @abstractmethod
    def set_link(self, device: DevicePlan, link: LinkPlan) -> None:
        """Apply the kernel-realised part of a link (the controller sends the rest to the device)."""

    @abstractmethod
    def partition(self, device: DevicePlan, cut: bool) -> bool:
        """Cut (or restore) the device's link; False if the backend leaves it to the transport."""

    @abstractmethod
    def alive(self, device: DevicePlan) -> bool: ...

    def cpu_quota(self, device: DevicePlan) -> float | None:
        """The CPU quota in force for the device, read back from the system (None: not enforced)."""
        return None

    def sample(self) -> list[dict]:
        """Per-device counters now (cpu, memory, interface bytes) for the stats and net streams."""
        return []

    @abstractmethod
    def teardown(self) -> None:
        """Remove everything this backend created for the run; safe to call twice."""
