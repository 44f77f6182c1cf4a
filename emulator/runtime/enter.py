"""Move a process forked from the zygote into a running container, as that container's device.

Importing TensorFlow in every container costs ~8 s of CPU and ~235 MB each; the Docker backend
can instead fork each device from one zygote container that imported it once (same image, so
every path a lazy import resolves is the same inside each device container). A forked process
becomes the container's device in two steps:

* in the zygote's child (still in the zygote's namespaces): open the container's namespaces,
  its stdio and its cgroup files, read its environment (:func:`open_handles`), then join the
  namespaces (:func:`join_namespaces`); joining a pid namespace takes effect for children only,
  so the child forks once more;
* in that grandchild, now inside the container's pid namespace: join every cgroup of the
  container (CPU quota, freezer for ``docker pause``, memory and pids limits apply), take the
  container's stdout and stderr (``docker logs``), drop to the device's uid and gid with no way
  back (:func:`become_device`).

The grandchild dies with the container: ``docker kill`` kills the container's init, and the
kernel kills every process of a pid namespace whose init dies. Python 3.11 has no ``os.setns``:
libc's is called through ctypes.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

# The kernel's CLONE_NEW* flags, which setns(2) takes as the namespace's type.
NAMESPACES = {"net": 0x40000000, "ipc": 0x08000000, "uts": 0x04000000, "pid": 0x20000000, "mnt": 0x00020000}
ORDER = ("net", "ipc", "uts", "pid", "mnt")  # mnt last: after it, /proc and the host's paths are the container's
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
CAPABILITY_VERSION_3 = 0x20080522

_libc = None


def _call(name: str, *args) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args}: {os.strerror(err)}")


@dataclass
class Handles:
    """What the grandchild needs from the container, opened while its paths are still reachable."""

    namespaces: dict[str, int] = field(default_factory=dict)
    cgroups: list[int] = field(default_factory=list)
    stdout: int = -1
    stderr: int = -1
    stdin: int = -1  # the write end of the container init's stdin: the device's exit code goes there
    env: dict[str, str] = field(default_factory=dict)


def cgroup_files(pid: int, cgroup_root: str) -> list[str]:
    """The ``cgroup.procs`` file of every hierarchy ``pid`` belongs to, under ``cgroup_root``.

    Read from ``/proc/<pid>/cgroup`` (``id:controllers:path``), so it holds for any cgroup
    driver's layout; the cgroup v2 line of a hybrid host (empty controllers) is ``unified``."""
    files = []
    with open(f"/proc/{pid}/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if not controllers:
                mount = "unified" if os.path.isdir(os.path.join(cgroup_root, "unified")) else ""
            else:
                names = controllers.replace("name=", "").split(",")
                joined = ",".join(names)
                mount = joined if os.path.isdir(os.path.join(cgroup_root, joined)) else names[0]
            procs = os.path.join(cgroup_root, mount, path.lstrip("/"), "cgroup.procs")
            if os.path.exists(procs):
                files.append(procs)
    if not files:
        raise OSError(f"no cgroup of process {pid} found under {cgroup_root}")
    return files


def open_handles(pid: int, cgroup_root: str) -> Handles:
    """Open the container's namespaces, stdio and cgroups through its init process ``pid``."""
    handles = Handles()
    for kind in ORDER:
        handles.namespaces[kind] = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
    handles.stdout = os.open(f"/proc/{pid}/fd/1", os.O_WRONLY | os.O_CLOEXEC)
    handles.stderr = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_CLOEXEC)
    handles.stdin = os.open(f"/proc/{pid}/fd/0", os.O_WRONLY | os.O_CLOEXEC)
    handles.cgroups = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in cgroup_files(pid, cgroup_root)]
    with open(f"/proc/{pid}/environ", "rb") as fh:
        for item in fh.read().split(b"\0"):
            key, sep, value = item.decode(errors="replace").partition("=")
            if sep:
                handles.env[key] = value
    return handles


def join_namespaces(handles: Handles) -> None:
    """setns into each namespace (the pid one applies to the children forked after this)."""
    for kind in ORDER:
        _call("setns", handles.namespaces[kind], NAMESPACES[kind])
        os.close(handles.namespaces[kind])
    handles.namespaces.clear()


def become_device(handles: Handles, uid: int, gid: int, cwd: str = "/tmp") -> None:
    """In the grandchild: join the cgroups, take the container's stdio and environment, drop privileges."""
    for fd in handles.cgroups:
        os.write(fd, b"0")  # 0: the writing process itself
        os.close(fd)
    handles.cgroups.clear()
    os.setsid()
    os.dup2(handles.stdout, 1)
    os.dup2(handles.stderr, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd in (devnull, handles.stdout, handles.stderr, handles.stdin):
        os.close(fd)
    _drop_bounding_set()  # while it still may (CAP_SETPCAP): no capability can come back, as in the container
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)  # from root to a non-zero uid: the permitted, effective and ambient sets are cleared
    _call("capset", (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0), (ctypes.c_uint32 * 6)())  # and the inheritable one
    _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError(f"still uid {os.geteuid()} after dropping to {uid}")
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(handles.env)


def _drop_bounding_set() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        _call("prctl", PR_CAPBSET_DROP, cap, 0, 0, 0)


def report_exit(handles: Handles, status: int) -> None:
    """Tell the container's init how the device ended (it exits with that code, as exec would)."""
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code
    try:
        os.write(handles.stdin, f"exit {code}\n".encode())
    except OSError:
        pass  # the container is gone already (killed): nobody to tell
