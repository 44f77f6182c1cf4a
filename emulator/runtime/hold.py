"""The init of a device container whose device is forked from the zygote (``boot: zygote``).

It holds the container open (its namespaces, cgroups and stdio) until the zygote has moved the
device in, then lives exactly as long as the device: the zygote's helper writes ``exit <code>``
to this process's stdin when the device ends, and it exits with that code, so the container
stops as it would had the device been its command. ``docker kill`` kills this process, and with
it (the init of the container's pid namespace) the device. Run as ``python -I -S hold.py``: it
imports nothing of the project and costs a few MB.

Should its stdin ever close, leaving would kill the device with the namespace; it then watches
``/proc`` instead and leaves (code 1: the device's own is unknown) once the device, seen there,
is gone.
"""

import os
import signal
import sys
import time

POLL_S = 0.5


def _forward(signum, frame):
    try:
        os.kill(-1, signum)  # from a namespace's init: every other process in it, i.e. the device
    except OSError:
        pass


def main() -> int:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _forward)
    print("hold: waiting for the device", flush=True)
    for line in sys.stdin:
        word, _, value = line.strip().partition(" ")
        if word == "exit":
            try:
                return int(value)
            except ValueError:
                return 1
    print("hold: stdin closed; watching /proc for the device instead", flush=True)
    return watch_proc()


def others() -> set[int]:
    """The other processes of this pid namespace (this process is its init, PID 1)."""
    return {int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()}


def watch_proc() -> int:
    seen = False
    while True:
        alive = bool(others())
        if seen and not alive:
            return 1
        seen = seen or alive
        try:
            os.waitpid(-1, os.WNOHANG)  # orphans of the device land here
        except ChildProcessError:
            pass
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
