"""A zygote: one process that has imported TensorFlow forks every local device.

Importing TensorFlow costs about 8 s of CPU and ~280 MB of private memory per process. The
local backend starts this process once per run; each device is then a ``fork`` of it, so
devices boot in a fraction of a second and share the imported libraries' pages copy-on-write
(PSS per device falls to roughly what it allocates itself). The zygote stays single-threaded
and never runs a TensorFlow op, so forking it is safe.

Protocol, over a Unix socket (``@name``: an abstract one): one JSON line per request ``{"module", "config", "log",
"cgroup"}`` answered by ``{"pid": ...}`` or ``{"error": ...}``. The child starts a new
session (so its process group can be signalled as a whole), joins its cgroup if one is given,
sends its output to its log file, and runs the device program's ``main``.
"""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback

PRELOAD = ("numpy", "tensorflow", "compression", "emulator.runtime.models", "emulator.runtime.worker",
           "emulator.runtime.evaluator", "emulator.runtime.paramserver")
MODULES = {"worker": "emulator.runtime.worker", "evaluator": "emulator.runtime.evaluator",
           "server": "emulator.runtime.paramserver"}


def preload() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in PRELOAD:
        importlib.import_module(name)


def _child(request: dict) -> None:
    """In the forked child: become the device program (never returns)."""
    code = 1
    try:
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
        sys.argv = [MODULES[request["module"]]]
        module = importlib.import_module(MODULES[request["module"]])
        code = module.main() or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must never return into the zygote's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap(signum, frame) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def socket_address(path: str) -> str:
    """``@name`` is a Linux abstract socket (no file, no path-length limit), else a path."""
    return "\0" + path[1:] if path.startswith("@") else path


def serve(path: str) -> None:
    preload()
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
            with conn, conn.makefile("rwb") as stream:
                for line in stream:
                    try:
                        request = json.loads(line)
                        if request.get("module") not in MODULES:
                            raise ValueError(f"unknown module {request.get('module')!r}")
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


class ZygoteClient:
    """The local backend's handle on its zygote: start it, ask it to fork devices, stop it."""

    def __init__(self, path: str, log: str, env: dict, cwd: str, timeout_s: float = 120.0):
        import subprocess
        import time

        self.path = path
        self._log = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "emulator.runtime.zygote", path], env=env, cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        line = self.proc.stdout.readline()
        if line.strip() != b"ready" or time.monotonic() > deadline:
            self.close()
            raise RuntimeError(f"the zygote did not start (see {log})")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(socket_address(path))
        self._stream = self._sock.makefile("rwb")

    def spawn(self, module: str, config: dict, log: str, cgroup: str | None = None) -> int:
        request = {"module": module, "config": config, "log": log, "cgroup": cgroup}
        self._stream.write((json.dumps(request) + "\n").encode())
        self._stream.flush()
        reply = json.loads(self._stream.readline())
        if "error" in reply:
            raise RuntimeError(f"zygote: {reply['error']}")
        return int(reply["pid"])

    def close(self) -> None:
        for closer in (getattr(self, "_stream", None), getattr(self, "_sock", None)):
            if closer is not None:
                try:
                    closer.close()
                except OSError:
                    pass
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
    serve(sys.argv[1])
