"""Cleaning up a swarm by label: the services (devices, agents), overlay networks and anchors of
one run or of every run, and, through a global job (the janitor), the runs' files on every node.

``emulate clean`` calls :func:`remove_swarm_labelled` after any crash, with ``keep`` saying which
objects belong to runs still going (their owner labels, :mod:`emulator.host.owner`); a run's own
teardown calls it too, without the janitor (its agents have removed its files already).
"""

from __future__ import annotations

import secrets
import time

from emulator.backends.docker import LABEL, RUN_LABEL, client
from emulator.backends.swarm import agent as agent_wire
from emulator.host.owner import Owner
from emulator.backends.swarm.manager import FAILED_STATES, ROLE_LABEL, is_manager
from emulator.backends.swarm.options import SwarmOptions


def remove_swarm_labelled(run_id: str | None = None, docker_client=None, *, janitor: bool = True, say=lambda line: None,
                          keep=None) -> list[str]:
    """Remove the services (devices, agents), overlay networks and anchors of one run or of
    every run; with ``janitor``, also the run's files on every node (a global job). ``keep``:
    called with each object's kind, name and labels, True for one to leave alone."""
    keep = keep or (lambda kind, name, labels: False)
    docker_client = docker_client or client(timeout=60)
    try:
        ok, _ = is_manager(docker_client)
    except Exception:  # noqa: BLE001 - no daemon
        return []
    label = f"{RUN_LABEL}={run_id}" if run_id else LABEL
    removed = []
    if ok:
        services = [s for s in docker_client.api.services(filters={"label": label})
                    if s["Spec"].get("Labels", {}).get(ROLE_LABEL) == "janitor"
                    or not keep("service", s["Spec"]["Name"], s["Spec"].get("Labels", {}))]
        agent_images = [s["Spec"]["TaskTemplate"]["ContainerSpec"]["Image"] for s in services
                        if s["Spec"].get("Labels", {}).get(ROLE_LABEL) == "agent"]
        runs = sorted({s["Spec"].get("Labels", {}).get(RUN_LABEL, "") for s in services} - {""})
        for service in services:
            if service["Spec"].get("Labels", {}).get(ROLE_LABEL) == "janitor":
                continue
            try:
                docker_client.api.remove_service(service["ID"])
                removed.append(f"service {service['Spec']['Name']}")
            except Exception as exc:  # noqa: BLE001 - report, keep cleaning
                removed.append(f"service {service['Spec']['Name']} NOT removed: {exc}")
        if janitor and agent_images and runs:
            removed += _run_janitor(docker_client, agent_images[0], runs if run_id or services_kept(docker_client, label) else ["*"], say)
    for container in docker_client.api.containers(all=True, filters={"label": [label, f"{ROLE_LABEL}=anchor"]}):
        name = container["Names"][0].lstrip("/")
        if keep("container", name, container.get("Labels") or {}):
            continue
        try:
            docker_client.api.remove_container(container["Id"], force=True)
            removed.append(f"container {name}")
        except Exception as exc:  # noqa: BLE001
            removed.append(f"container {name} NOT removed: {exc}")
    if ok:
        deadline = time.monotonic() + 60
        for network in docker_client.networks.list(filters={"label": label, "driver": "overlay"}):
            if keep("network", network.name, network.attrs.get("Labels") or {}):
                continue
            while True:
                try:
                    network.remove()
                    removed.append(f"network {network.name}")
                    break
                except Exception as exc:  # noqa: BLE001 - tasks still detaching
                    if time.monotonic() > deadline:
                        removed.append(f"network {network.name} NOT removed: {exc}")
                        break
                    time.sleep(0.5)
        # Swarm removes a network once the last task has left it, and a task's container once
        # the task is gone: wait for both (on this node), so that nothing labelled is left.
        while time.monotonic() < deadline:
            networks = [n for n in docker_client.api.networks(filters={"label": label, "driver": "overlay"})
                        if not keep("network", n["Name"], n.get("Labels") or {})]
            tasks = [c for c in docker_client.api.containers(all=True, filters={"label": label})
                     if "com.docker.swarm.service.id" in (c.get("Labels") or {})
                     and not keep("container", c["Names"][0].lstrip("/"), c.get("Labels") or {})]
            if not networks and not tasks:
                break
            time.sleep(0.5)
    return removed


def services_kept(docker_client, label: str) -> bool:
    """Whether services of some run are left (so the janitor must not delete every run's files)."""
    return any(s["Spec"].get("Labels", {}).get(ROLE_LABEL) != "janitor" for s in docker_client.api.services(filters={"label": label}))


def _run_janitor(docker_client, image: str, runs: list[str], say) -> list[str]:
    """A global job that deletes the runs' directories on every node, then goes."""
    import docker.types as T

    options = SwarmOptions.from_env()
    name = f"emu-janitor-{secrets.token_hex(4)}"
    labels = {LABEL: "1", ROLE_LABEL: "janitor", **Owner.current().labels(),  # a clean killed halfway leaves an orphan like any run
              **({RUN_LABEL: runs[0]} if len(runs) == 1 and runs != ["*"] else {})}
    spec = T.ContainerSpec(image, command=["python", "-m", agent_wire.MODULE, "--clean", options.node_root, *runs], user="0:0",
                           cap_add=["SYS_PTRACE"], read_only=True, labels=labels,
                           mounts=[T.Mount(agent_wire.HOST_PROC, "/proc", type="bind", read_only=True)])
    try:
        service = docker_client.api.create_service(T.TaskTemplate(spec, restart_policy=T.RestartPolicy("none")), name=name,
                                                   labels=labels, mode=T.ServiceMode("global-job"))["ID"]
    except Exception as exc:  # noqa: BLE001 - no job support: the files stay, say so
        say(f"swarm: the runs' files on the nodes were not removed ({exc})")
        return []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            tasks = docker_client.api.tasks(filters={"service": service})
            if tasks and all(t["Status"]["State"] in FAILED_STATES for t in tasks):
                break
            time.sleep(0.5)
        return [f"files of {'every run' if runs == ['*'] else ', '.join(runs)} on {len(tasks)} node(s)"]
    finally:
        try:
            docker_client.api.remove_service(service)
        except Exception:  # noqa: BLE001
            pass
