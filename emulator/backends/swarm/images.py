"""The Swarm backend's images: the agent image built on the runtime image, pushed to a registry,
or copied onto the nodes that lack them.

The agent image is the runtime image (the devices' code) plus pyroute2 and the Docker SDK, and
the ``iptables`` shim of :mod:`.agent`; it builds in seconds with no network in the build.
Images reach the nodes from a registry (``EMULATE_SWARM_REGISTRY``, filled by ``emulate images
push``) or are copied from the controller's daemon to each node's daemon (``docker save |
docker load`` through ``EMULATE_SWARM_NODE_DOCKER``); on one node nothing moves.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from emulator.host import images
from emulator.backends.base import BackendUnavailable
from emulator.backends.swarm import agent as agent_wire
from emulator.backends.swarm.options import SwarmOptions

AGENT_REPO = "edge-emulator/agent"
AGENT_PACKAGES = ("pyroute2", "docker")  # pure-Python wheels the agent adds to the runtime image
AGENT_DOCKERFILE = f"""\
# The swarm agent: the runtime image (same code as the devices) plus pyroute2 and the Docker SDK.
ARG BASE
FROM ${{BASE}}
LABEL edge-emulator="1" edge-emulator.role="agent"
USER root
COPY wheels/ /tmp/agent-wheels/
RUN /opt/venv/bin/python -m pip install --no-index --no-deps --no-cache-dir --disable-pip-version-check /tmp/agent-wheels/*.whl \\
 && rm -rf /tmp/agent-wheels
COPY bin/ {agent_wire.SHIM_DIR}/
RUN chmod 0755 {agent_wire.SHIM_DIR}/*
"""


def _agent_wheels(progress) -> Path:
    """The agent's extra wheels, the controller's own versions, downloaded once."""
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in AGENT_PACKAGES]
    target = images.cache_root() / "agent-wheels" / hashlib.sha256(" ".join(pins).encode()).hexdigest()[:16]
    if (target / "complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix="partial-", dir=target.parent))
    try:
        progress(f"[agent] downloading {', '.join(pins)}")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
                               "--only-binary=:all:", "-d", str(partial), *pins], capture_output=True, text=True)
        if done.returncode != 0:
            raise images.ImageBuildError(f"pip download {' '.join(pins)} failed: {done.stderr.strip()[-2000:]}")
        (partial / "complete").write_text(" ".join(pins) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        return target
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def ensure_agent_image(docker_client, runtime_tag: str, progress=lambda line: None) -> str:
    """The agent image for this runtime image (built in seconds, no network in the build)."""
    wheels = _agent_wheels(progress)
    runtime_id = docker_client.images.get(runtime_tag).id
    digest = hashlib.sha256(AGENT_DOCKERFILE.encode() + agent_wire.IPTABLES_SHIM.encode() + runtime_id.encode()
                            + " ".join(sorted(p.name for p in wheels.glob("*.whl"))).encode()).hexdigest()
    tag = f"{AGENT_REPO}:{digest[:12]}"
    try:
        docker_client.images.get(tag)
        return tag
    except Exception:  # noqa: BLE001 - not built yet
        pass
    context = Path(tempfile.mkdtemp(prefix="agent-build-", dir=images.cache_root()))
    try:
        (context / "Dockerfile").write_text(AGENT_DOCKERFILE)
        (context / "wheels").mkdir()
        (context / "bin").mkdir()
        (context / "bin" / "iptables").write_text(agent_wire.IPTABLES_SHIM)
        for wheel in wheels.glob("*.whl"):
            shutil.copy2(wheel, context / "wheels" / wheel.name)
        progress(f"[agent] building {tag} on {runtime_tag}")
        images._docker_build(docker_client, context, tag, runtime_tag, progress)
    finally:
        shutil.rmtree(context, ignore_errors=True)
    for image in docker_client.images.list(name=AGENT_REPO):
        for ref in image.tags:
            if ref != tag:
                try:
                    docker_client.images.remove(ref)
                except Exception:  # noqa: BLE001 - in use: keep it
                    pass
    images._remove_older_runtimes(docker_client, keep=runtime_tag, progress=progress)
    return tag


def push_images(docker_client, registry: str, progress=lambda line: None) -> list[str]:
    """Tag the runtime and agent images for ``registry`` and push them; returns the references."""
    from docker.errors import APIError

    runtime = images.ensure_runtime_image(docker_client, progress=progress)
    refs = []
    for ref in (runtime, ensure_agent_image(docker_client, runtime, progress)):
        repo, tag = ref.rsplit(":", 1)
        target = f"{registry.rstrip('/')}/{repo}"
        docker_client.images.get(ref).tag(target, tag)
        progress(f"[push] {target}:{tag}")
        try:
            for event in docker_client.api.push(target, tag, stream=True, decode=True):
                if "error" in event:
                    raise images.ImageBuildError(f"pushing {target}:{tag}: {event['error']}")
        except APIError as exc:
            raise images.ImageBuildError(f"pushing {target}:{tag}: {exc.explanation or exc}") from None
        refs.append(f"{target}:{tag}")
    return refs


def _has_image(docker_client, ref: str) -> bool:
    try:
        docker_client.images.get(ref)
        return True
    except Exception:  # noqa: BLE001 - not there
        return False


def distribute_images(manager, refs: list[str], nodes: list[dict], options: SwarmOptions, say=lambda line: None) -> dict[str, str]:
    """Make ``refs`` present on every node: nodes pull them from the registry when one is
    configured, else each node's daemon loads them from the controller's (``docker save``
    streamed into ``docker load``, only what it lacks). The controller's own node already has
    them: on one node this moves nothing. Returns node id -> what was done."""
    import docker

    local = manager.info()["Swarm"]["NodeID"]
    done = {}
    for node in nodes:
        node_id, hostname = node["ID"], node["Description"]["Hostname"]
        if node_id == local:
            done[node_id] = "local"
            continue
        if options.registry:
            done[node_id] = "registry"
            continue
        url = options.node_docker.get(hostname) or options.node_docker.get(node_id)
        if not url:
            raise BackendUnavailable(
                f"node {hostname} ({node_id}) cannot get the images: configure a registry (EMULATE_SWARM_REGISTRY, "
                f"then `emulate images push REGISTRY`) or give its Docker API in EMULATE_SWARM_NODE_DOCKER")
        remote = docker.DockerClient(base_url=url, timeout=1800)
        try:
            missing = [ref for ref in refs if not _has_image(remote, ref)]
            if missing:
                say(f"[images] loading {', '.join(missing)} onto {hostname}")
                started = time.monotonic()
                response = manager.api._get(manager.api._url("/images/get"), params={"names": missing}, stream=True)
                manager.api._raise_for_status(response)
                for event in remote.api.load_image(response.iter_content(1 << 20)):  # streams while it loads
                    if "error" in event:
                        raise BackendUnavailable(f"node {hostname}: docker load: {event['error']}")
                missing = [ref for ref in refs if not _has_image(remote, ref)]
                if missing:
                    raise BackendUnavailable(f"node {hostname}: docker load did not produce {', '.join(missing)}")
                done[node_id] = f"loaded in {time.monotonic() - started:.1f}s"
            else:
                done[node_id] = "present"
        finally:
            remote.close()
    return done
