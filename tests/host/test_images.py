"""The runtime image: content-hashed tags (no Docker needed) and a real offline build (Docker)."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from emulator.host import images

ROOT = pathlib.Path(images.__file__).resolve().parents[2]  # emulator/host/images.py -> the project
FAKE_BASE_ID = "sha256:" + "ab" * 32


def _copy_inputs(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """Copy what the image is made of: Dockerfile, requirements, the code packages."""
    for rel in ["images/runtime.Dockerfile", "requirements/runtime.txt", *images.code_files(src)]:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dst / rel)
    return dst


@pytest.fixture()
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    return _copy_inputs(ROOT, tmp_path / "src")


def test_code_files_are_python_sources_of_the_runtime_packages():
    files = images.code_files(ROOT)
    assert pathlib.Path("emulator/host/images.py") in files
    assert pathlib.Path("compression/__init__.py") in files
    assert all(f.suffix == ".py" and f.parts[0] in images.CODE_PACKAGES for f in files)
    assert not any("__pycache__" in f.parts for f in files)


def test_hash_is_stable_for_unchanged_inputs(tree):
    assert images.runtime_hash(tree, FAKE_BASE_ID) == images.runtime_hash(tree, FAKE_BASE_ID)
    # Bytecode and non-code files are not inputs.
    (tree / "emulator" / "__pycache__").mkdir(exist_ok=True)
    before = images.runtime_hash(tree, FAKE_BASE_ID)
    (tree / "emulator" / "__pycache__" / "units.cpython-311.pyc").write_bytes(b"\0junk")
    (tree / "emulator" / "notes.txt").write_text("not shipped")
    assert images.runtime_hash(tree, FAKE_BASE_ID) == before


@pytest.mark.parametrize(
    "change",
    [
        lambda root: (root / "emulator" / "planning" / "units.py").write_text(
            (root / "emulator" / "planning" / "units.py").read_text() + "\n# changed\n"
        ),
        lambda root: (root / "compression" / "added.py").write_text("X = 1\n"),
        lambda root: (root / "compression" / "__init__.py").rename(root / "compression" / "i.py"),
        lambda root: (root / "requirements" / "runtime.txt").write_text(
            (root / "requirements" / "runtime.txt").read_text() + "six==1.16.0\n"
        ),
        lambda root: (root / "images" / "runtime.Dockerfile").write_text(
            (root / "images" / "runtime.Dockerfile").read_text() + "# changed\n"
        ),
    ],
    ids=["code-edit", "code-added", "code-renamed", "requirements", "dockerfile"],
)
def test_hash_changes_with_any_input(tree, change):
    before = images.runtime_hash(tree, FAKE_BASE_ID)
    change(tree)
    assert images.runtime_hash(tree, FAKE_BASE_ID) != before


def test_hash_changes_with_the_base(tree):
    other = "sha256:" + "cd" * 32
    assert images.runtime_hash(tree, FAKE_BASE_ID) != images.runtime_hash(tree, other)


def test_cache_root_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGE_EMULATOR_CACHE", str(tmp_path / "c"))
    assert images.cache_root() == tmp_path / "c"
    monkeypatch.delenv("EDGE_EMULATOR_CACHE")
    assert images.cache_root() == pathlib.Path.home() / ".cache" / "edge-emulator"


# --------------------------------------------------------------------------- with Docker


@pytest.fixture(scope="module")
def client():
    docker = pytest.importorskip("docker")
    try:
        c = docker.from_env()
        c.ping()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no Docker engine: {exc}")
    return c


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """Build from a frozen copy of the project, so that edits made to the working tree while the
    tests run cannot change the tag between two calls."""
    root = _copy_inputs(ROOT, tmp_path_factory.mktemp("snapshot"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(images, "_SOURCE_ROOT", root)
        yield root


@pytest.fixture(scope="module")
def runtime_image(client, snapshot):
    lines: list[str] = []
    tag = images.ensure_runtime_image(client, progress=lines.append)
    return tag, lines


def _run(client, tag, command):
    container = client.containers.create(tag, command, network_mode="none")
    try:
        container.start()
        result = container.wait(timeout=300)
        logs = container.logs(stdout=True, stderr=True).decode(errors="replace")
        return result["StatusCode"], logs
    finally:
        container.remove(force=True)


@pytest.mark.docker
def test_build_produces_a_labelled_content_tagged_image(client, runtime_image):
    tag, _ = runtime_image
    assert tag.startswith(images.RUNTIME_REPO + ":")
    assert tag == images.runtime_tag(client)
    image = client.images.get(tag)
    assert image.labels.get("edge-emulator") == "1"
    assert image.labels.get("edge-emulator.role") == "runtime"
    config = image.attrs["Config"]
    assert config["User"] == "10001"
    assert config["WorkingDir"] == "/tmp"
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PYTHONPATH"] == "/opt/edge-emulator"
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert env["PYTHONUNBUFFERED"] == env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    status = images.image_status(client)
    assert status["base"] in (images.SLIM_BASE, images.BOOKWORM_BASE)
    assert status["runtime"] == tag and status["up_to_date"] is True
    assert status["wheels_cached"] is True
    assert images.ensure_base(client, progress=lambda line: None) == status["base"]


@pytest.mark.docker
def test_container_runs_as_device_without_network(client, runtime_image):
    tag, _ = runtime_image
    code, out = _run(client, tag, ["id", "-u"])
    assert code == 0, out
    assert out.strip() == "10001"
    script = (
        "import sys, tensorflow, numpy, emulator.runtime.protocol, compression; "
        "assert sys.version_info[:2] == (3, 11), sys.version; "
        "assert sys.prefix == '/opt/venv', sys.prefix; print('ok')"
    )
    code, out = _run(client, tag, ["python", "-c", script])
    assert code == 0, out
    assert out.strip().splitlines()[-1] == "ok"


@pytest.mark.docker
def test_code_is_read_only_and_without_bytecode(client, runtime_image):
    tag, _ = runtime_image
    script = (
        "import os, pathlib; root = pathlib.Path('/opt/edge-emulator'); "
        "names = sorted(p.name for p in root.iterdir()); "
        "assert names == ['compression', 'emulator'], names; "
        "assert not list(root.rglob('__pycache__')); "
        "assert all(p.suffix == '.py' for p in root.rglob('*') if p.is_file()); "
        "assert not os.access(root / 'emulator', os.W_OK); print('ok')"
    )
    code, out = _run(client, tag, ["python", "-c", script])
    assert code == 0, out


@pytest.mark.docker
def test_second_call_builds_nothing(client, runtime_image, monkeypatch):
    tag, _ = runtime_image

    def no_build(*args, **kwargs):
        raise AssertionError("ensure_runtime_image rebuilt an up-to-date image")

    def no_download(*args, **kwargs):
        raise AssertionError("ensure_runtime_image downloaded wheels for an up-to-date image")

    monkeypatch.setattr(images, "_docker_build", no_build)
    monkeypatch.setattr(images, "ensure_wheels", no_download)
    lines: list[str] = []
    assert images.ensure_runtime_image(client, progress=lines.append) == tag
    assert images.last_build is not None and images.last_build["built"] is False
    assert images.last_build["tag"] == tag


@pytest.mark.docker
def test_code_change_rebuilds_only_the_code_layer(client, runtime_image, tree, monkeypatch):
    tag, _ = runtime_image
    init = tree / "compression" / "__init__.py"
    init.write_text(init.read_text() + "\n# edited by test_images\n")
    monkeypatch.setattr(images, "_SOURCE_ROOT", tree)
    pruned = []
    monkeypatch.setattr(images, "_remove_older_runtimes", lambda client, keep, progress: pruned.append(keep))
    new = None
    try:
        new = images.ensure_runtime_image(client, progress=lambda line: None)
        assert pruned == [new]  # a fresh build prunes older code images (kept here for the comparison)
        assert new != tag
        assert images.last_build is not None and images.last_build["built"] is True
        old_layers = client.images.get(tag).attrs["RootFS"]["Layers"]
        new_layers = client.images.get(new).attrs["RootFS"]["Layers"]
        # Base, user and venv layers are shared; only the code layer differs.
        assert new_layers[:-1] == old_layers[:-1]
        assert new_layers[-1] != old_layers[-1]
    finally:
        if new and new != tag:
            client.images.remove(new, force=True)


@pytest.mark.docker
def test_failed_build_raises_with_the_log_tail(client, tmp_path):
    base = images.ensure_base(client, progress=lambda line: None)
    (tmp_path / "Dockerfile").write_text(
        "ARG BASE\nFROM ${BASE}\nRUN echo about-to-fail && exit 3\n"
    )
    tag = "edge-emulator/test-broken:never"
    with pytest.raises(images.ImageBuildError) as info:
        images._docker_build(client, tmp_path, tag, base, progress=lambda line: None)
    message = str(info.value)
    assert "about-to-fail" in message and "3" in message


class _FakeImage:
    def __init__(self, ident, tags, role, created=""):
        self.id, self.tags, self.short_id = ident, tags, "short-" + ident[7:]
        self.labels = {"edge-emulator": "1", "edge-emulator.role": role}
        self.attrs = {"Created": created}


class _FakeImages:
    def __init__(self, images_, fail=(), ignore=()):
        self._images, self._fail, self._ignore, self.removed = images_, set(fail), set(ignore), []

    def list(self, filters=None, **kwargs):
        assert filters == {"label": "edge-emulator=1"}
        return [image for image in self._images if image.id not in self.removed]

    def remove(self, ident, force=False):
        from docker.errors import APIError

        if ident in self._fail:
            raise APIError("in use by a running container")
        if ident not in self._ignore:  # ignored: answered without error, and still there
            self.removed.append(ident)

    def prune(self, filters=None):
        return {}


class _FakeClient:
    def __init__(self, images_):
        self.images = images_


def test_remove_images_removes_children_before_the_base_and_says_which_stayed():
    pytest.importorskip("docker")
    fake = _FakeImages(
        [
            _FakeImage("sha256:base", ["edge-emulator/base:bookworm"], "base"),
            _FakeImage("sha256:builder", [], "builder"),
            _FakeImage("sha256:busy", ["edge-emulator/runtime:111111111111"], "runtime"),
            _FakeImage("sha256:rt", ["edge-emulator/runtime:222222222222"], "runtime"),
            _FakeImage("sha256:quiet", ["edge-emulator/runtime:333333333333"], "runtime"),
        ],
        fail={"sha256:busy"},
        ignore={"sha256:quiet"},
    )
    removed, kept = images.remove_images(_FakeClient(fake))
    assert fake.removed == ["sha256:rt", "sha256:builder", "sha256:base"]
    assert removed == ["edge-emulator/runtime:222222222222", "short-builder", "edge-emulator/base:bookworm"]
    # In use, or answered without error yet still listed: reported as still there, not as removed.
    assert sorted(kept) == ["edge-emulator/runtime:111111111111", "edge-emulator/runtime:333333333333"]


# --------------------------------------------------------------------------- base and wheels, faked


def _fake_lookup(present):
    return lambda client, ref: ("sha256:" + ref) if ref in present else None


@pytest.mark.parametrize(
    "present, pull_ok, expected, pulled, built",
    [
        ({images.SLIM_BASE, images.BOOKWORM_BASE}, False, images.SLIM_BASE, False, False),
        ({images.BOOKWORM_BASE}, True, images.BOOKWORM_BASE, False, False),
        (set(), True, images.SLIM_BASE, True, False),
        (set(), False, images.BOOKWORM_BASE, True, True),
    ],
    ids=["slim-present", "bookworm-cached", "pull-works", "offline-debootstrap"],
)
def test_ensure_base_order(monkeypatch, present, pull_ok, expected, pulled, built):
    calls = []
    monkeypatch.setattr(images, "_image_id", _fake_lookup(present))
    monkeypatch.setattr(images, "_try_pull", lambda c, ref, p: calls.append("pull") or pull_ok)
    monkeypatch.setattr(images, "_build_bookworm_base", lambda c, p: calls.append("build"))
    assert images.ensure_base(object(), progress=lambda line: None) == expected
    assert ("pull" in calls) == pulled
    assert ("build" in calls) == built


def test_pull_gives_up_when_the_daemon_stays_silent(monkeypatch):
    import threading

    release = threading.Event()

    class Api:
        def pull(self, *args, **kwargs):
            release.wait(10)
            return iter(())

    class Client:
        api = Api()

    monkeypatch.setattr(images, "PULL_STALL_S", 0.2)
    try:
        assert images._try_pull(Client(), images.SLIM_BASE, progress=lambda line: None) is False
    finally:
        release.set()


def test_wheels_are_cached_by_requirements_hash(monkeypatch, tmp_path):
    import hashlib

    monkeypatch.setenv("EDGE_EMULATOR_CACHE", str(tmp_path))
    digest = hashlib.sha256((ROOT / "requirements" / "runtime.txt").read_bytes()).hexdigest()
    target = tmp_path / "wheels" / digest[:16]
    target.mkdir(parents=True)
    (target / "complete").write_text("1\n")

    def no_pip(*args, **kwargs):
        raise AssertionError("downloaded although the cache is complete")

    monkeypatch.setattr(images, "_run_streaming", no_pip)
    assert images.ensure_wheels(progress=lambda line: None) == target


def test_failed_wheel_download_leaves_no_partial_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGE_EMULATOR_CACHE", str(tmp_path))
    monkeypatch.setattr(images, "_run_streaming", lambda argv, progress, prefix: (1, ["no route"]))
    with pytest.raises(images.ImageBuildError, match="no route"):
        images.ensure_wheels(progress=lambda line: None)
    assert list((tmp_path / "wheels").iterdir()) == []


def test_failed_debootstrap_removes_its_tree(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGE_EMULATOR_CACHE", str(tmp_path))
    fake = tmp_path / "fake-debootstrap"
    log = tmp_path / "target.log"
    # Arguments: --variant=minbase --include=... bookworm TARGET MIRROR
    fake.write_text(
        f'#!/bin/sh\necho "$4" > {log}\nmkdir -p "$4/etc" && echo half > "$4/etc/os-release"\n'
        'echo "E: Couldn\'t download packages"; exit 1\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(images, "_debootstrap_binary", lambda: str(fake))
    with pytest.raises(images.ImageBuildError, match="download packages"):
        images._build_bookworm_base(object(), progress=lambda line: None)
    target = pathlib.Path(log.read_text().strip())
    assert target.parent == tmp_path and target.name.startswith("rootfs-")
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake-debootstrap", "target.log"]


def test_a_new_build_keeps_the_newest_other_runtime_images_and_untags_the_rest_but_not_busy_ones():
    pytest.importorskip("docker")
    keep = images.KEEP_OTHER_RUNTIMES
    others = [_FakeImage(f"sha256:o{i}", [f"edge-emulator/runtime:{i:012d}"], "runtime", created=f"2026-12-{20 - i:02d}")
              for i in range(keep + 2)]  # o0 newest
    fake = _FakeImages([_FakeImage("sha256:new", ["edge-emulator/runtime:ffffffffffff"], "runtime", created="2026-12-01"),
                        *reversed(others)], fail={f"edge-emulator/runtime:{keep + 1:012d}"})
    said = []
    images._remove_older_runtimes(_FakeClient(fake), keep="edge-emulator/runtime:ffffffffffff", progress=said.append)
    # The current image stays whatever its date; of the others the newest KEEP_OTHER_RUNTIMES stay
    # (another checkout's), the next is untagged, and the oldest is in use by a container.
    assert fake.removed == [f"edge-emulator/runtime:{keep:012d}"]
    assert len(said) == 1 and f"{keep:012d}" in said[0]
