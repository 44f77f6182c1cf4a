"""The init of a device container whose device is forked from the zygote (``boot: zygote``).

It holds the container open (its namespaces, cgroups and stdio) until the zygote has moved the
device in, then lives exactly as long as the device: the zygote's helper writes ``exit <code>``
to this process's stdin when the device ends, and it exits with that code, so the container
stops as it would had the device been its command. ``docker kill`` kills this process, and with
it (the init of the container's pid namespace) the device. Run as ``python -I -S hold.py``: it
imports nothing of the project and costs a few MB.
"""

import os
import signal
import sys


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
    return 0  # stdin closed: nobody will tell (Docker keeps it open for the container's life)


if __name__ == "__main__":
    sys.exit(main())
