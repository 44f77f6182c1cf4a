"""A zygote: one process that has imported TensorFlow forks every local device.

Importing TensorFlow costs about 8 s of CPU and ~280 MB of private memory per process. The
local backend starts this process once per run; each device is then a ``fork`` of it, so
devices boot in a fraction of a second and share the imported libraries' pages copy-on-write
(PSS per device falls to roughly what it allocates itself). The zygote stays single-threaded
and never runs a TensorFlow op, so forking it is safe.

Protocol, over a Unix socket (``@name``: an abstract one, so only peers with the zygote's own uid
are served): one JSON line per request ``{"module", "config", "log", "cgroup"}`` answered by
``{"pid": ...}`` or ``{"error": ...}``. The child starts a new session (so its process group can
be signalled as a whole), joins its cgroup if one is given, sends its output to its log file, and
runs the device program's ``main``.

The Docker backend runs this zygote in a container of the runtime image and asks instead
``{"module", "container": {"pid", "cgroup_root", "uid", "gid", "argv"}}``: the child moves into
the container whose init is ``pid`` (:mod:`emulator.runtime.enter`), and the reply's ``pid`` is
the device's, as the zygote sees it. Module ``probe`` enters and exits at once (a self-test).
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback

from emulator import plugins
from emulator.runtime import enter

PRELOAD = ("numpy", "tensorflow", "compression", "emulator.runtime.models", "emulator.runtime.worker",
           "emulator.runtime.evaluator", "emulator.runtime.paramserver")
MODULES = {"worker": "emulator.runtime.worker", "evaluator": "emulator.runtime.evaluator",
           "server": "emulator.runtime.paramserver"}
PROBE = "probe"  # a container request that enters, says so and exits 0


def preload(user_files: list[str] = ()) -> None:
    """Import what every device imports: TensorFlow and the device programs, then the user's files
    of the run (their model, compressor, rule), each once, so forked devices share them too."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in PRELOAD:
        importlib.import_module(name)
    for path in user_files:
        plugins.import_file(path)
    gc.collect()
    gc.freeze()  # what is imported now is never traversed by a child's collector: its pages stay shared


def _child(request: dict) -> None:
    """In the forked child: become the device program (never returns)."""

    def run() -> int:
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if request.get("cgroup"):
            with open(request["cgroup"], "w") as fh:
                fh.write(str(os.getpid()))
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.environ["EMU_CONFIG"] = json.dumps(request["config"])
        return _run_main(MODULES[request["module"]], [])

    _exit_as_python_would(run)


def _exit_as_python_would(run) -> None:
    """Run ``run`` (it returns the exit code) and end the process as the interpreter would end a
    program: ``sys.exit("message")`` prints the message on stderr and exits 1, an uncaught
    exception prints its traceback and exits 1. Never returns into the zygote's code."""
    code = 1
    try:
        code = run()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the device must never return into the zygote's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_main(module_name: str, argv: list[str]) -> int:
    sys.argv = [module_name, *argv]
    module = importlib.import_module(module_name)
    return module.main() or 0


def _container_child(request: dict, reply_fd: int) -> None:
    """In the forked child: enter the container, fork the device into its pid namespace, report
    the device's pid through ``reply_fd``, then wait for it and pass its exit code to the
    container's init (never returns)."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        spec = request["container"]
        handles = enter.open_handles(int(spec["pid"]), spec["cgroup_root"])
        enter.join_namespaces(handles)
        device = os.fork()
    except BaseException as exc:  # noqa: BLE001 - reported to the asker
        os.write(reply_fd, (json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n").encode())
        os._exit(1)
    if device == 0:
        os.close(reply_fd)

        def run() -> int:
            enter.become_device(handles, int(spec["uid"]), int(spec["gid"]))
            if request["module"] == PROBE:
                print("probe: a device forked from the zygote runs in this container", flush=True)
                return 0
            return _run_main(MODULES[request["module"]], list(spec.get("argv", [])))

        _exit_as_python_would(run)
    os.write(reply_fd, (json.dumps({"pid": device}) + "\n").encode())
    os.close(reply_fd)
    for fd in (handles.stdout, handles.stderr, *handles.cgroups):
        os.close(fd)
    _, status = os.waitpid(device, 0)
    enter.report_exit(handles, status)
    os._exit(0)


def _spawn_into_container(request: dict, inherited: list) -> dict:
    """Fork a child that enters the container; its first line is the answer. ``inherited``:
    the zygote's sockets and selector, which the child closes."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        for item in inherited:
            item.close()
        _container_child(request, write_fd)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        line = pipe.readline()
    if not line:
        return {"error": f"the zygote's child {pid} ended without an answer"}
    return json.loads(line)


def _peer_uid(conn: socket.socket) -> int:
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[2]


def _reap(signum, frame) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def abstract_address(prefix: str, run_id: str) -> str:
    """``@<prefix>-<run id>``, a Linux abstract socket's name: like a path it holds at most 107 bytes,
    so a long run id (a comparison's method label) is cut and kept unique by its digest."""
    if len(run_id) > 48:
        run_id = f"{run_id[:32]}-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}"
    return f"@{prefix}-{run_id}"


def socket_address(path: str) -> str:
    """``@name`` is a Linux abstract socket (no file, no path-length limit), else a path."""
    return "\0" + path[1:] if path.startswith("@") else path


def serve(path: str, user_files: list[str] = ()) -> None:
    preload(user_files)
    signal.signal(signal.SIGCHLD, _reap)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_address(path))
    listener.listen(64)
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while True:
        for _ in selector.select(timeout=1.0):
            conn, _ = listener.accept()
            if _peer_uid(conn) != os.getuid():  # an abstract socket has no file permissions
                conn.close()
                continue
            with conn, conn.makefile("rwb") as stream:
                for line in stream:
                    try:
                        request = json.loads(line)
                        container = request.get("container")
                        if request.get("module") not in MODULES and not (container and request.get("module") == PROBE):
                            raise ValueError(f"unknown module {request.get('module')!r}")
                        if container:
                            reply = _spawn_into_container(request, [stream, conn, selector, listener])
                            stream.write((json.dumps(reply) + "\n").encode())
                            stream.flush()
                            continue
                        pid = os.fork()
                    except Exception as exc:  # noqa: BLE001 - reported to the asker
                        stream.write((json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n").encode())
                        stream.flush()
                        continue
                    if pid == 0:
                        selector.close()
                        listener.close()
                        _child(request)
                    stream.write((json.dumps({"pid": pid}) + "\n").encode())
                    stream.flush()


class ZygoteConnection:
    """A connection to a running zygote: one request at a time, from any thread."""

    def __init__(self, path: str):
        import threading

        self.path = path
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(socket_address(path))
        self._stream = self._sock.makefile("rwb")

    @classmethod
    def wait(cls, path: str, timeout_s: float, alive=lambda: True) -> "ZygoteConnection":
        """Connect once the zygote listens (it binds after preloading); ``alive()`` False: give up."""
        import time

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return cls(path)
            except (ConnectionRefusedError, FileNotFoundError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the zygote at {path} did not listen within {timeout_s:g}s") from None
                if not alive():
                    raise RuntimeError(f"the zygote at {path} ended before it listened") from None
                time.sleep(0.2)

    def request(self, request: dict) -> dict:
        with self._lock:
            self._stream.write((json.dumps(request) + "\n").encode())
            self._stream.flush()
            line = self._stream.readline()
        if not line:
            raise RuntimeError("zygote: the connection closed (did the zygote end?)")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"zygote: {reply['error']}")
        return reply

    def close(self) -> None:
        for closer in (self._stream, self._sock):
            try:
                closer.close()
            except OSError:
                pass


class ZygoteClient:
    """The local backend's handle on its zygote: start it, ask it to fork devices, stop it."""

    def __init__(self, path: str, log: str, env: dict, cwd: str, timeout_s: float = 120.0, user_files: list[str] = ()):
        import subprocess
        import time

        self.path = path
        self._conn = None
        self._log = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "emulator.runtime.zygote", path, *user_files], env=env, cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        line = self.proc.stdout.readline()
        if line.strip() != b"ready" or time.monotonic() > deadline:
            self.close()
            raise RuntimeError(f"the zygote did not start (see {log})")
        self._conn = ZygoteConnection(path)

    def spawn(self, module: str, config: dict, log: str, cgroup: str | None = None) -> int:
        reply = self._conn.request({"module": module, "config": config, "log": log, "cgroup": cgroup})
        return int(reply["pid"])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()
        if not self.path.startswith("@"):  # a filesystem socket (abstract ones vanish with the zygote)
            try:
                os.unlink(self.path)
            except OSError:
                pass


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])  # the address, then the user's files to import
