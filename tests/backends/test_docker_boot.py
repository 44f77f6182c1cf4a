"""How Docker devices boot: forked from the zygote container (default) or exec'd, and the fallback between them."""

from __future__ import annotations

import secrets
import time

import pytest

from emulator.backends import RunContext
from emulator.backends import docker_zygote
from emulator.backends.docker import RUN_LABEL, DockerBackend
from emulator.planning.plan import DevicePlan, LinkPlan

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def _backend(tmp_path, runtime_image, boot=None):
    (tmp_path / "logs").mkdir()
    (tmp_path / "data").mkdir()
    backend = DockerBackend(image=runtime_image, boot=boot)
    ctx = RunContext(f"boot-{secrets.token_hex(3)}", str(tmp_path), str(tmp_path / "data"), time.time())
    device = DevicePlan("worker-0", "worker", 0, "g", 0.5, 512 << 20, LinkPlan(), 1)
    backend.prepare(ctx, (device,))
    return backend, device


class RefusedConfig:
    """A configuration document the device program refuses at once (no role, no keys): it exits 1
    naming what is wrong, as it would if exec'd, without needing a server."""

    def to_json(self) -> dict:
        return {}


REFUSED = "config.json: device config: key 'role' is None"


def _ended(backend, device, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while backend.alive(device):
        assert time.monotonic() < deadline, "the device's container is still running"
        time.sleep(0.2)
    container = backend.containers[device.name]
    container.reload()
    return container.attrs["State"]["ExitCode"], container.logs().decode(errors="replace")


def test_a_device_forked_in_ends_its_container_with_its_code_and_its_output(tmp_path, docker_client, runtime_image):
    backend, device = _backend(tmp_path, runtime_image)
    try:
        assert backend.boot == "zygote" and backend.mechanisms(device)["boot"].startswith("zygote ("), backend.boot_why
        backend.start(device, RefusedConfig())
        code, logs = _ended(backend, device)
        assert code == 1 and REFUSED in logs, logs  # the container's own stdout: `docker logs`
        backend.start(device, RefusedConfig())  # a restart enters the new incarnation of the same container
        assert _ended(backend, device)[0] == 1
    finally:
        backend.teardown()
    assert not docker_client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={backend.ctx.run_id}"})
    assert (tmp_path / "logs" / "zygote.log").read_text().strip().endswith("ready")


def test_a_zygote_that_cannot_work_here_falls_back_to_exec_and_says_why(tmp_path, docker_client, runtime_image, monkeypatch):
    monkeypatch.setattr(docker_zygote, "CAPABILITIES", [])  # as on a host whose policy refuses them: no setns
    backend, device = _backend(tmp_path, runtime_image)
    try:
        assert backend.boot == "exec" and "Permission denied" in backend.boot_why, backend.boot_why
        assert backend.mechanisms(device)["boot"].startswith("exec (") and "the zygote failed" in backend.mechanisms(device)["boot"]
        backend.start(device, RefusedConfig())
        code, logs = _ended(backend, device)
        assert code == 1 and REFUSED in logs, logs
    finally:
        backend.teardown()
    assert not docker_client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={backend.ctx.run_id}"})


def test_an_unknown_boot_mode_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("EDGE_EMULATOR_DOCKER_BOOT", "fork")
    with pytest.raises(ValueError, match="EDGE_EMULATOR_DOCKER_BOOT.*zygote, exec"):
        DockerBackend()
