"""Build the one runtime image the emulated devices run from, without network inside the build.

The host downloads the pinned wheels once (cached by the hash of requirements/runtime.txt), a
base with Python 3.11 is found, pulled or made with debootstrap, and the image is tagged by a hash
of everything that goes into it: an unchanged project never rebuilds, a code change costs seconds.
"""

from __future__ import annotations

import collections
import hashlib
import os
import pathlib
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from emulator.host.owner import Owner

RUNTIME_REPO = "edge-emulator/runtime"
BASE_REPO = "edge-emulator/base"
BASE_TAG = "bookworm"
BOOKWORM_BASE = f"{BASE_REPO}:{BASE_TAG}"
SLIM_BASE = "python:3.11-slim"
LABEL = "edge-emulator"
ROLE_LABEL = "edge-emulator.role"
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
PULL_STALL_S = 20.0  # give up on a pull when the daemon reports nothing for this long
CODE_PACKAGES = ("emulator", "compression")
TARGET_PYTHON = "3.11"  # the Python of both bases; the wheels are downloaded for it

# Bump when the way an image is assembled changes without the Dockerfile changing.
_HASH_SCHEMA = b"edge-emulator-runtime/1\n"
_SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[2]  # emulator/host/images.py -> the project
_DOCKERFILE = pathlib.Path("images") / "runtime.Dockerfile"
_REQUIREMENTS = pathlib.Path("requirements") / "runtime.txt"
_LOG_TAIL = 40

Progress = Callable[[str], None]

# What the last ensure_runtime_image() call did: {"tag", "base", "built", "seconds"}.
last_build: dict[str, Any] | None = None


class ImageBuildError(RuntimeError):
    """The base, the wheels or the runtime image could not be made; the message says why."""


BUILD_PREFIX = "build-"  # build contexts: cache_root()/build-<pid>-<start>-<random>


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- hashing, paths


def cache_root() -> pathlib.Path:
    """Where wheels and build scratch space live: $EDGE_EMULATOR_CACHE or ~/.cache/edge-emulator."""
    env = os.environ.get("EDGE_EMULATOR_CACHE")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "edge-emulator"


def _sha256_file(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _requirements_path(source_root: pathlib.Path | None = None) -> pathlib.Path:
    path = (source_root or _SOURCE_ROOT) / _REQUIREMENTS
    if not path.is_file():
        raise ImageBuildError(
            f"{path} not found: building the runtime image needs the project's source tree "
            "(install it with `pip install -e .`)"
        )
    return path


def _wheel_dir() -> pathlib.Path:
    return cache_root() / "wheels" / _sha256_file(_requirements_path())[:16]


def code_files(source_root: pathlib.Path) -> list[pathlib.Path]:
    """The project files copied into the image, relative to source_root, sorted: *.py of the
    packages in CODE_PACKAGES, without __pycache__ or hidden directories."""
    files = []
    for package in CODE_PACKAGES:
        top = source_root / package
        for path in top.rglob("*.py"):
            rel = path.relative_to(source_root)
            if any(part == "__pycache__" or part.startswith(".") for part in rel.parts[:-1]):
                continue
            if path.is_file():
                files.append(rel)
    return sorted(files, key=lambda p: p.as_posix())


def runtime_hash(source_root: pathlib.Path, base_id: str) -> str:
    """Hex sha256 over the Dockerfile, requirements/runtime.txt, the base image id and every
    code file (path and content) under source_root. Same inputs, same hash."""
    h = hashlib.sha256(_HASH_SCHEMA)

    def feed(name: str, data: bytes) -> None:
        encoded = name.encode()
        h.update(len(encoded).to_bytes(4, "big") + encoded)
        h.update(len(data).to_bytes(8, "big") + data)

    feed("dockerfile", (source_root / _DOCKERFILE).read_bytes())
    feed("requirements", _requirements_path(source_root).read_bytes())
    feed("base", base_id.encode())
    for rel in code_files(source_root):
        feed("code:" + rel.as_posix(), (source_root / rel).read_bytes())
    return h.hexdigest()


def _tag_for(base_id: str, source_root: pathlib.Path | None = None) -> str:
    return f"{RUNTIME_REPO}:{runtime_hash(source_root or _SOURCE_ROOT, base_id)[:12]}"


# ----------------------------------------------------------------------------- docker helpers


def _client(client):
    if client is not None:
        return client
    import docker  # lazy: importing this module must not need the SDK or a daemon

    return docker.from_env()


def _image_id(client, ref: str) -> str | None:
    from docker.errors import ImageNotFound

    try:
        return client.images.get(ref).id
    except ImageNotFound:
        return None


def _local_base(client) -> str | None:
    """The base ensure_base() would choose without pulling or building anything, or None."""
    for ref in (SLIM_BASE, BOOKWORM_BASE):
        if _image_id(client, ref):
            return ref
    return None


def _try_pull(client, ref: str, progress: Progress) -> bool:
    """Pull ref; give up when the daemon stays silent for PULL_STALL_S (no registry, say)."""
    repo, tag = ref.rsplit(":", 1)
    events: queue.Queue = queue.Queue()

    def pull() -> None:
        try:
            for event in client.api.pull(repo, tag, stream=True, decode=True):
                events.put(("event", event))
            events.put(("done", None))
        except Exception as exc:  # noqa: BLE001 - any failure means "no pull"
            events.put(("error", str(exc)))

    progress(f"[base] trying `docker pull {ref}` (gives up after {PULL_STALL_S:.0f} s of silence)")
    threading.Thread(target=pull, name="edge-emulator-pull", daemon=True).start()
    last_status = None
    while True:
        try:
            kind, payload = events.get(timeout=PULL_STALL_S)
        except queue.Empty:
            progress(f"[base] no answer from the registry for {PULL_STALL_S:.0f} s; not pulling")
            return False
        if kind == "error":
            progress(f"[base] pull failed: {payload.strip()}")
            return False
        if kind == "done":
            return _image_id(client, ref) is not None
        if "error" in payload:
            progress(f"[base] pull failed: {payload['error']}")
            return False
        status = payload.get("status")
        if status and status != last_status and "id" not in payload:
            progress(f"[base] {status}")
        last_status = status


def _debootstrap_binary() -> str:
    found = shutil.which("debootstrap") or shutil.which(
        "debootstrap", path="/usr/sbin:/sbin:/usr/local/sbin"
    )
    if not found:
        raise ImageBuildError(
            f"no base image: {SLIM_BASE} is not present and could not be pulled, and debootstrap "
            f"is not installed to build {BOOKWORM_BASE}. Install debootstrap, or bring "
            f"{SLIM_BASE} onto this machine (`docker pull` or `docker load`)."
        )
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        raise ImageBuildError(
            f"no base image: {SLIM_BASE} is not present and could not be pulled, and building "
            f"{BOOKWORM_BASE} with debootstrap needs root. Run once as root (e.g. `sudo emulate "
            f"build`), or bring {SLIM_BASE} onto this machine (`docker pull` or `docker load`)."
        )
    return found


def _mounts_under(root: pathlib.Path) -> list[str]:
    try:
        lines = pathlib.Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in lines:
        fields = line.split()
        if len(fields) > 1:
            point = fields[1].replace("\\040", " ")
            if point.startswith(prefix) or point == str(root):
                points.append(point)
    return sorted(points, key=len, reverse=True)


def _remove_rootfs(root: pathlib.Path, progress: Progress) -> None:
    """Remove a debootstrap target, first unmounting whatever a failed run left mounted in it
    (proc, sys): rmtree must never walk into the host's /proc or /sys."""
    for point in _mounts_under(root):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    left = _mounts_under(root)
    if left:
        progress(f"[base] NOT removing {root}: still mounted there: {', '.join(left)}")
        return
    shutil.rmtree(root, ignore_errors=True)


def _run_streaming(argv: list[str], progress: Progress, prefix: str) -> tuple[int, list[str]]:
    tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line:
            tail.append(line)
            progress(f"{prefix} {line}")
    return proc.wait(), list(tail)


def _tar_chunks(proc: subprocess.Popen) -> Iterator[bytes]:
    assert proc.stdout is not None
    while True:
        chunk = proc.stdout.read(1 << 20)
        if not chunk:
            return
        yield chunk


def _build_bookworm_base(client, progress: Progress) -> None:
    debootstrap = _debootstrap_binary()
    mirror = os.environ.get("EDGE_EMULATOR_DEBIAN_MIRROR") or DEFAULT_DEBIAN_MIRROR
    scratch = cache_root()
    scratch.mkdir(parents=True, exist_ok=True)
    # Under the cache, not /tmp: /tmp is often a tmpfs mounted nodev or noexec.
    root = pathlib.Path(tempfile.mkdtemp(prefix="rootfs-", dir=scratch))
    started = time.monotonic()
    try:
        progress(f"[base] building {BOOKWORM_BASE} with debootstrap from {mirror} (1-2 minutes)")
        argv = [
            debootstrap,
            "--variant=minbase",
            "--include=python3,python3-venv,ca-certificates",
            "bookworm",
            str(root),
            mirror,
        ]
        rc, tail = _run_streaming(argv, progress, "[base]")
        if rc != 0:
            raise ImageBuildError(
                f"debootstrap failed (exit {rc}); last lines:\n" + "\n".join(tail)
            )
        # Slim the tree a little and drop what belongs to this host.
        for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin",
                        "var/cache/apt/archives/*.deb"):
            for path in root.glob(pattern):
                if path.is_file():
                    path.unlink()
        for name in ("etc/hostname", "etc/resolv.conf"):
            path = root / name
            if path.is_file() or path.is_symlink():
                path.unlink()
                path.write_text("")
        progress(f"[base] importing the root file system as {BOOKWORM_BASE}")
        tar = subprocess.Popen(
            ["tar", "-C", str(root), "--numeric-owner",
             "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*", "-c", "."],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        changes = [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            f"LABEL {LABEL}=1",
            f"LABEL {ROLE_LABEL}=base",
            'CMD ["/bin/bash"]',
        ]
        try:
            result = client.api.import_image_from_stream(
                _tar_chunks(tar), repository=BASE_REPO, tag=BASE_TAG, changes=changes
            )
        except BaseException:
            tar.kill()
            tar.wait()
            raise
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
        assert tar.stderr is not None
        tar_err = tar.stderr.read().decode(errors="replace")
        if tar.wait() != 0:
            raise ImageBuildError(f"tar of the debootstrap tree failed: {tar_err}")
        if _image_id(client, BOOKWORM_BASE) is None:
            raise ImageBuildError(f"docker import did not produce {BOOKWORM_BASE}: {result}")
        progress(f"[base] {BOOKWORM_BASE} ready in {time.monotonic() - started:.0f} s")
    finally:
        _remove_rootfs(root, progress)


# ----------------------------------------------------------------------------- public API


def runtime_tag(client=None) -> str:
    """The tag the current code, requirements and base would get.

    The base is the one ensure_base() would pick without pulling or building (python:3.11-slim
    if present, else edge-emulator/base:bookworm). When no base exists yet, its image id cannot
    be known: the hash then uses the reference python:3.11-slim in its place, and the tag is
    provisional (ensure_runtime_image() will produce a different one once it has a base)."""
    client = _client(client)
    base = _local_base(client)
    base_id = _image_id(client, base) if base else None
    return _tag_for(base_id or SLIM_BASE)


def ensure_base(client, progress: Progress = _stderr) -> str:
    """The image reference of the base to build on, obtaining it if needed. In order:
    python:3.11-slim if present; edge-emulator/base:bookworm if present (made earlier);
    python:3.11-slim if a pull succeeds (registry answers within ~20 s); else build
    edge-emulator/base:bookworm with debootstrap and `docker import` (needs root)."""
    client = _client(client)
    local = _local_base(client)
    if local:
        return local
    if _try_pull(client, SLIM_BASE, progress):
        progress(f"[base] pulled {SLIM_BASE}")
        return SLIM_BASE
    _build_bookworm_base(client, progress)
    return BOOKWORM_BASE


def _target_platforms() -> list[str]:
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}.get(
        machine, machine
    )
    # Both bases are Debian bookworm (glibc 2.36): any manylinux wheel up to 2_36 runs there.
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(36, 16, -1)]
    return tags + [f"manylinux2014_{arch}"]


def ensure_wheels(progress: Progress = _stderr) -> pathlib.Path:
    """The directory holding the wheels of requirements/runtime.txt for CPython 3.11 on Linux,
    downloaded once with pip on the host: cache_root()/wheels/<sha256(runtime.txt)[:16]>,
    complete when it has the marker file `complete`."""
    requirements = _requirements_path()
    target = _wheel_dir()
    if (target / "complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = pathlib.Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=target.parent))
    try:
        progress(f"[wheels] downloading the wheels of {requirements.name} into {target}")
        argv = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                "--progress-bar", "off", "--only-binary=:all:", "-r", str(requirements),
                "-d", str(partial), "--implementation", "cp", "--python-version", TARGET_PYTHON,
                "--abi", "cp" + TARGET_PYTHON.replace(".", "")]
        for tag in _target_platforms():
            argv += ["--platform", tag]
        started = time.monotonic()
        rc, tail = _run_streaming(argv, progress, "[wheels]")
        if rc != 0:
            raise ImageBuildError(
                f"pip download of {requirements} failed (exit {rc}); last lines:\n"
                + "\n".join(tail)
            )
        shutil.copy2(requirements, partial / "requirements.txt")
        (partial / "complete").write_text(f"{time.time():.0f}\n")
        try:
            partial.rename(target)
        except OSError:  # someone else finished first (or a stale incomplete dir is in the way)
            if (target / "complete").is_file():
                return target
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
        progress(f"[wheels] done in {time.monotonic() - started:.0f} s")
        return target
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def _link_or_copy(src: pathlib.Path, dst: pathlib.Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _assemble_context(
    context: pathlib.Path, wheels: pathlib.Path, source_root: pathlib.Path
) -> None:
    shutil.copyfile(source_root / _DOCKERFILE, context / "Dockerfile")
    shutil.copyfile(_requirements_path(source_root), context / "requirements.txt")
    (context / "wheels").mkdir()
    for wheel in sorted(wheels.glob("*.whl")):
        _link_or_copy(wheel, context / "wheels" / wheel.name)
    src = context / "src"
    for rel in code_files(source_root):
        dst = src / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_root / rel, dst)
        os.chmod(dst, 0o644)
    for directory in [context, *(p for p in context.rglob("*") if p.is_dir())]:
        os.chmod(directory, 0o755)


def _docker_build(client, context: pathlib.Path, tag: str, base: str, progress: Progress) -> None:
    """Run the classic builder on context with no network, streaming its output to progress."""
    tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL)
    error = None
    stream: Iterable[dict] = client.api.build(
        path=str(context),
        dockerfile="Dockerfile",
        tag=tag,
        buildargs={"BASE": base},
        network_mode="none",  # the labels are in the Dockerfile: its last step stays the code COPY
        rm=True,
        forcerm=True,
        pull=False,
        decode=True,
        timeout=None,
    )
    for event in stream:
        if "stream" in event:
            for line in event["stream"].splitlines():
                if line.strip():
                    tail.append(line)
                    progress(f"[build] {line}")
        elif "error" in event:
            error = event["error"].strip()
            tail.append(error)
        elif "status" in event:
            tail.append(event["status"])
    if error or _image_id(client, tag) is None:
        raise ImageBuildError(
            f"building {tag} failed: {error or 'no image was produced'}\n"
            "last lines of the build log:\n" + "\n".join(tail)
        )


def ensure_runtime_image(client=None, *, force: bool = False, progress: Progress = _stderr) -> str:
    """Return the tag of the runtime image for the current code, requirements and base,
    obtaining the base, downloading the wheels and building only what is missing.
    force=True rebuilds the runtime image (with the builder cache) even if the tag exists.
    Records what happened in the module attribute last_build."""
    global last_build
    client = _client(client)
    started = time.monotonic()
    base = ensure_base(client, progress)
    base_id = _image_id(client, base)
    if base_id is None:
        raise ImageBuildError(f"base image {base} vanished")
    tag = _tag_for(base_id)
    if not force and _image_id(client, tag):
        last_build = {"tag": tag, "base": base, "built": False,
                      "seconds": time.monotonic() - started}
        return tag
    wheels = ensure_wheels(progress)
    scratch = cache_root()
    scratch.mkdir(parents=True, exist_ok=True)
    # Next to the wheel cache, so the wheels can be hard-linked in rather than copied; named by its
    # owner (pid and start time), so that `emulate clean` removes it if this process is killed.
    context = pathlib.Path(tempfile.mkdtemp(prefix=f"{BUILD_PREFIX}{Owner.current().token}-", dir=scratch))
    try:
        _assemble_context(context, wheels, _SOURCE_ROOT)
        progress(f"[build] building {tag} on {base} (network: none)")
        build_started = time.monotonic()
        _docker_build(client, context, tag, base, progress)
        progress(f"[build] {tag} built in {time.monotonic() - build_started:.1f} s")
    finally:
        shutil.rmtree(context, ignore_errors=True)
    _remove_older_runtimes(client, keep=tag, progress=progress)
    last_build = {"tag": tag, "base": base, "built": True, "seconds": time.monotonic() - started}
    return tag


# Runtime images of other code kept at each build: another checkout on the same daemon (a clone
# for CI, a second branch) has its own code hash, and untagging its image at every build here
# made the two rebuild each other's in turn. Each costs only its code layer (under 1 MB).
KEEP_OTHER_RUNTIMES = 3


def _remove_older_runtimes(client, keep: str, progress: Progress) -> None:
    """Untag the runtime images of other code but the newest few; skip those in use."""
    others = [image for image in client.images.list(name=RUNTIME_REPO, filters={"label": f"{LABEL}=1"})
              if keep not in image.tags]
    others.sort(key=lambda image: image.attrs.get("Created", ""), reverse=True)
    for image in others[KEEP_OTHER_RUNTIMES:]:
        for ref in image.tags:
            if ref.startswith(RUNTIME_REPO + ":"):
                try:
                    client.images.remove(ref)
                except Exception:  # noqa: BLE001 - in use by a container: keep it
                    continue
                progress(f"[build] removed the older {ref}")


def image_status(client=None) -> dict:
    """{"base": the base ref present locally or None, "runtime": the current tag if it exists,
    else the newest existing runtime image's tag (stale) or None, "up_to_date": whether the
    current tag exists, "wheels_cached": whether the wheels of runtime.txt are downloaded}."""
    client = _client(client)
    base = _local_base(client)
    current = _tag_for(_image_id(client, base)) if base else None
    up_to_date = bool(current and _image_id(client, current))
    runtime = current if up_to_date else None
    if runtime is None:
        images = client.images.list(name=RUNTIME_REPO, filters={"label": f"{LABEL}=1"})
        images.sort(key=lambda image: image.attrs.get("Created", ""), reverse=True)
        for image in images:
            tags = [t for t in image.tags if t.startswith(RUNTIME_REPO + ":")]
            if tags:
                runtime = tags[0]
                break
    try:
        wheels_cached = (_wheel_dir() / "complete").is_file()
    except ImageBuildError:
        wheels_cached = False
    return {"base": base, "runtime": runtime, "up_to_date": up_to_date,
            "wheels_cached": wheels_cached}


def remove_images(client=None) -> tuple[list[str], list[str]]:
    """Remove every image labelled edge-emulator=1 (runtime images, the builder stage left by
    the build, the debootstrap base). Returns (the references removed, those still there), as
    the daemon lists them afterwards: once, removals answered without error left two images in
    place. A pulled python:3.11-slim is not ours and stays; images in use stay too."""
    from docker.errors import APIError, ImageNotFound

    client = _client(client)
    order = {"runtime": 0, "base": 2}
    images = client.images.list(filters={"label": f"{LABEL}=1"})
    images.sort(key=lambda image: order.get((image.labels or {}).get(ROLE_LABEL, ""), 1))
    for image in images:
        try:
            client.images.remove(image.id, force=True)
        except (ImageNotFound, APIError):
            continue
    try:
        client.images.prune(filters={"label": f"{LABEL}=1", "dangling": True})
    except APIError:
        pass
    left = {image.id for image in client.images.list(filters={"label": f"{LABEL}=1"})}
    removed, kept = [], []
    for image in images:
        (kept if image.id in left else removed).extend(image.tags or [image.short_id])
    return removed, kept
