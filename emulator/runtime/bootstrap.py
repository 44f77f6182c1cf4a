"""What every device program does first: read its configuration (:mod:`.config`), open telemetry, handle SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from typing import Callable

from emulator.runtime.config import DeviceConfig
from emulator.runtime.protocol import ProtocolError
from emulator.runtime.telemetry import Telemetry

CONFIG_ENV = "EMU_CONFIG"


def load_config(kind: type[DeviceConfig] = DeviceConfig, argv: list[str] | None = None) -> DeviceConfig:
    """The config (of ``kind``'s role) from a JSON file named on the command line, else from
    ``$EMU_CONFIG``; a document that is not the contract ends the program with a message naming the key."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        source = argv[0]
        with open(source) as fh:
            raw = fh.read()
    else:
        source, raw = f"${CONFIG_ENV}", os.environ.get(CONFIG_ENV)
        if not raw:
            sys.exit(f"no configuration: pass a JSON file or set {CONFIG_ENV}")
    try:
        return kind.from_json(json.loads(raw))
    except ValueError as exc:  # a ConfigError, or not JSON at all
        sys.exit(f"{source}: {exc}")


def start(cfg: DeviceConfig) -> Telemetry:
    """Telemetry for this device, and SIGTERM turned into a clean exit (flushes traces)."""

    def _terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    return Telemetry(cfg.collector, bytes.fromhex(cfg.token), cfg.name, cfg.start_time)


def limit_threads(cpus: float) -> int:
    """Threads worth using on ``cpus`` cores of quota (at least one); set for BLAS/OpenMP too."""
    threads = max(1, int(cpus + 0.999))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ.setdefault(var, str(threads))
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return threads


def run_device(run: Callable[[DeviceConfig, Telemetry], int], kind: type[DeviceConfig]) -> int:
    """Run a device program to its exit status; a network failure is an event, not a traceback."""
    cfg = load_config(kind)
    tel = start(cfg)
    code = 1
    try:
        code = run(cfg, tel)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except (ConnectionError, OSError, ProtocolError) as exc:
        tel.event("error", reason=type(exc).__name__, detail=str(exc))
        code = 2
    except Exception as exc:
        tel.event("error", reason=type(exc).__name__, detail=str(exc)[:500])
        traceback.print_exc()
        code = 1
    finally:
        tel.close()
    return code
