"""A sweep: one scenario run over a Cartesian grid of overrides, each grid point repeated with derived seeds.

The grid uses ``--set``'s dotted paths and YAML values (``faults.crash.rate_per_hour=0,6,30``,
``workers[0].cpus=0.2,{uniform: [0.1, 0.3]}``): values are split at top-level commas (not inside
brackets, braces or quotes) and each is applied with :func:`emulator.planning.overrides.apply_override`.

Contract, in the order :func:`run_sweep` keeps it:

* **Validate first.** Every grid point x repetition is loaded, validated and planned before
  anything runs; problems are raised together in one :class:`SweepError`, each naming its grid
  point (``grid point 2 (faults.crash.rate_per_hour=-1): faults.crash.rate_per_hour: must be >= 0``).
* **Seeds.** Repetition ``r`` of a point runs with ``seed_r = (seed + r * 2654435761) mod 2**32``,
  ``seed`` being the point's own seed (the scenario's, or the grid's when ``seed`` is a grid key).
  ``r = 0`` is the scenario as written; different ``r`` give different seeds (the stride is odd,
  so ``r -> seed_r`` is one-to-one below 2**32); the same ``r`` gives the same seed at every point,
  so points are compared on the same draws (common random numbers).
* **Run ids** are deterministic: ``<slug of the assignments>-<6 hex of their hash>-r<r>``; a run
  directory is ``<sweep dir>/<run id>``. A run whose ``summary.json`` says ``completed`` with the
  same plan digest is reused on a rerun; an unfinished one is moved to ``.attempts/`` and rerun.
* **Concurrency.** At most ``jobs`` runs at once. The default is what the machine can take:
  ``max(1, floor(cpu_count / max over grid points of the sum of the plan's device CPU quotas))``
  (server, evaluator and workers; a run needing more than ``cpu_count`` runs alone). Devices boot
  unthrottled (loading TensorFlow), so overlapping boots only slow each other down. Runs side by
  side never share a resource, on any backend: each has its own controller process, run
  directory, names, network and subnet, cgroups and ports (docs/RELIABILITY.md, section 5).
* **Failures are data.** A failed run is recorded (status, error, log in ``logs/<run id>.log``)
  and the sweep goes on. ``sweep.json`` (grid, points, run ids, seeds, statuses) is rewritten
  after every change.

The runner that executes one run is injectable (``runner=``); tests pass a fake. The default,
:class:`ForkRunner`, forks a child process per run that calls :func:`emulator.control.run.run_scenario`
with the scenario the sweep validated when it planned the run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import yaml

from emulator.control import workload
from emulator.planning.plan import make_plan
from emulator.control.run import RunFailed, run_scenario
from emulator.control.rundir import completed_summary, set_aside, write_json_atomic
from emulator.planning.loader import load_scenario
from emulator.planning.problems import ScenarioError
from emulator.planning.scenario import Scenario
from emulator.planning.units import format_duration

SEED_STRIDE = 2654435761  # odd (Knuth's multiplicative hash constant): r -> seed_r is one-to-one mod 2**32
SEED_MODULUS = 2**32
SEED_RULE = "seed_r = (seed + r * 2654435761) mod 2**32; r = 0 is the scenario's seed; same r, same seed at every grid point"
MAX_SLUG = 60


class SweepError(ValueError):
    """The sweep cannot start: a bad --grid option, or grid points whose scenario is invalid."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))

    def render(self) -> str:
        shown = self.problems[:20]
        more = len(self.problems) - len(shown)
        return "\n".join(["invalid sweep:", *(f"  {p}" for p in shown), *([f"  ... and {more} more"] if more else [])])


# -- the grid ----------------------------------------------------------------------------


def split_values(text: str) -> list[str]:
    """Split ``a,{b: [1, 2]},'c,d'`` at the commas outside brackets, braces and quotes."""
    parts, depth, quote, current = [], 0, "", []
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    if quote or depth:
        raise SweepError([f"--grid: unbalanced {'quote' if quote else 'brackets'} in {text!r}"])
    return parts


@dataclass(frozen=True)
class Axis:
    """One grid key and its values, as YAML texts (parsed when applied, like --set)."""

    key: str
    values: tuple[str, ...]

    @classmethod
    def parse(cls, option: str) -> "Axis":
        """``key=v1,v2,...`` (``--grid``'s syntax)."""
        key, sep, values = option.partition("=")
        if not sep or not key.strip():
            raise SweepError([f"--grid: expected key=value1,value2,..., got {option!r}"])
        parsed = split_values(values)
        if any(v == "" for v in parsed):
            raise SweepError([f"--grid {key.strip()}: empty value in {values!r}"])
        if len(set(parsed)) != len(parsed):
            raise SweepError([f"--grid {key.strip()}: a value is given twice in {values!r}"])
        return cls(key.strip(), tuple(parsed))


def parse_value(text: str):
    """A grid value as ``--set`` reads it (YAML; unparsable text stays a string)."""
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def grid_points(axes: tuple[Axis, ...]) -> list[tuple[tuple[str, str], ...]]:
    """The Cartesian product, first axis slowest: each point a tuple of ``(key, value text)``."""
    keys = [a.key for a in axes]
    if len(set(keys)) != len(keys):
        raise SweepError([f"--grid: key {k!r} given twice" for k in sorted({k for k in keys if keys.count(k) > 1})])
    return [tuple(zip(keys, combo)) for combo in itertools.product(*(a.values for a in axes))]


def repetition_seed(seed: int, repetition: int) -> int:
    """The seed of repetition ``r`` (see the module docstring)."""
    return (int(seed) + repetition * SEED_STRIDE) % SEED_MODULUS


def point_label(assignments) -> str:
    return ", ".join(f"{k}={v}" for k, v in assignments) or "(no grid)"


def _leaf(key: str) -> str:
    """``faults.crash.rate_per_hour`` -> ``rate_per_hour``; ``workers[0].cpus`` -> ``cpus``."""
    return re.sub(r"\[\d+\]", "", key).rsplit(".", 1)[-1]


def run_id(assignments: tuple[tuple[str, str], ...], repetition: int) -> str:
    """Deterministic run id of a grid point's repetition, readable and valid as a directory name."""
    canonical = json.dumps([[k, parse_value(v)] for k, v in assignments], sort_keys=True, default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:6]
    def clean(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_.")

    slug = "_".join(f"{clean(_leaf(k))}-{clean(v)}" for k, v in assignments)[:MAX_SLUG].strip("-_.")
    return f"{slug + '-' if slug else ''}{digest}-r{repetition}"


# -- the sweep ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedRun:
    """One grid point x repetition, validated: what to run and what it should produce."""

    point: int
    repetition: int
    assignments: tuple[tuple[str, str], ...]
    seed: int
    run_id: str
    overrides: tuple[str, ...]  # every --set for this run: the sweep's, the grid's, then the seed
    plan_digest: str
    cpus: float  # sum of the plan's device CPU quotas
    scenario: Scenario = field(compare=False, repr=False)  # validated, every override applied: what the runner runs

    @property
    def label(self) -> str:
        return f"{point_label(self.assignments)} r{self.repetition}"


@dataclass(frozen=True)
class Sweep:
    """What to run: a scenario file, a grid, repetitions, overrides for every run, a backend."""

    scenario: Path
    axes: tuple[Axis, ...] = ()
    repeat: int = 1
    overrides: tuple[str, ...] = ()
    backend: str | None = None  # None: the scenario's
    check_fidelity: bool = True
    strict: bool = False  # a fidelity check off by more than tolerance fails the run
    tolerance: float = 0.10

    @classmethod
    def from_options(cls, scenario, grid: list[str] | tuple[str, ...] = (), **kwargs) -> "Sweep":
        return cls(Path(scenario), tuple(Axis.parse(g) for g in grid), **kwargs)

    def points(self) -> list[tuple[tuple[str, str], ...]]:
        return grid_points(self.axes)

    def digest(self) -> str:
        """Identity of the sweep for its default directory: the scenario's bytes, overrides, grid, backend."""
        h = hashlib.sha256(Path(self.scenario).read_bytes())
        h.update(json.dumps([list(self.overrides), [[a.key, list(a.values)] for a in self.axes], self.backend]).encode())
        return h.hexdigest()[:8]

    def plan(self) -> list[PlannedRun]:
        """Validate and plan every grid point x repetition; :class:`SweepError` names each bad point."""
        if self.repeat < 1:
            raise SweepError([f"--repeat must be >= 1, got {self.repeat}"])
        planned, problems = [], []
        for index, assignments in enumerate(self.points()):
            grid_sets = [f"{k}={v}" for k, v in assignments]
            base = [*self.overrides, *grid_sets]
            try:
                scenario, raw = load_scenario(self.scenario, base)
                workload.check_scenario(scenario, make_plan(scenario))  # data and user files; the seed changes neither
                for r in range(self.repeat):
                    seed = repetition_seed(scenario.seed, r)
                    overrides = tuple(base + ([f"seed={seed}"] if r else []))
                    s = scenario if r == 0 else load_scenario(self.scenario, list(overrides))[0]
                    p = make_plan(s)
                    cpus = sum(d.cpus for d in p.devices)
                    planned.append(PlannedRun(index, r, assignments, seed, run_id(assignments, r), overrides, p.digest(), cpus, s))
            except ScenarioError as exc:
                problems += [f"grid point {index} ({point_label(assignments)}): {p}" for p in exc.problems]
            except ValueError as exc:
                problems.append(f"grid point {index} ({point_label(assignments)}): {exc}")
        if problems:
            raise SweepError(problems)
        ids = [p.run_id for p in planned]
        if len(set(ids)) != len(ids):  # only if two value texts parse to the same value, e.g. 1 and 1.0 as YAML
            raise SweepError(["two grid points have the same values once parsed: " + ", ".join(sorted({i for i in ids if ids.count(i) > 1}))])
        return planned


def default_jobs(planned: list[PlannedRun], cpu_count: int | None = None) -> int:
    """``max(1, floor(cpus / heaviest run))``: runs at once without oversubscribing the CPUs."""
    cpus = cpu_count or os.cpu_count() or 1
    heaviest = max((p.cpus for p in planned), default=1.0)
    return max(1, math.floor(cpus / max(min(heaviest, cpus), 1e-9) + 1e-9))


def default_directory(sweep: Sweep, root: str | Path = "runs/sweeps") -> Path:
    scenario, _ = load_scenario(sweep.scenario, list(sweep.overrides))
    return Path(root) / f"{scenario.name}-{sweep.digest()}"


# -- running -----------------------------------------------------------------------------


class Runner(Protocol):
    """Runs one planned run into ``<sweep dir>/<run id>``; what it leaves there is the result.

    It may raise: the run is then recorded as failed with that error. The sweep reads the
    status from ``<run id>/summary.json``.
    """

    def __call__(self, run: PlannedRun, sweep: Sweep, directory: Path) -> None: ...


class ForkRunner:
    """Each run in a child process forked from the sweep, calling :func:`~emulator.control.run.run_scenario`
    with the run's validated scenario; what it says goes to ``logs/<run id>.log``.

    A process per run, not a thread: a run installs its SIGTERM handler and tears down on SIGINT
    in its own main thread (signals reach only a process's main thread), and its devices and
    collector are its own. Forked, not started afresh: the child begins with the sweep's modules
    imported and the data set sizes known, instead of an interpreter that imports everything
    again and re-reads the scenario (about 1.5 s a run, measured). Forking a threaded process is
    safe here: the child runs no TensorFlow (devices load it in processes of their own), takes
    none of the sweep's locks, and leaves with ``os._exit``, never returning into the sweep's
    threads (nor running their exit hooks).
    """

    def __init__(self):
        self._live: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, run: PlannedRun, sweep: Sweep, directory: Path) -> None:
        self.launch(directory / "logs" / f"{run.run_id}.log", run.scenario, directory, overrides=run.overrides,
                    backend=sweep.backend, run_id=run.run_id, text=Path(sweep.scenario).read_text(),
                    check_fidelity=sweep.check_fidelity, strict=sweep.strict, tolerance=sweep.tolerance)

    def launch(self, log: Path, scenario, directory: Path, **options) -> None:
        """One :func:`~emulator.control.run.run_scenario` call (``options`` its keywords) in a forked
        child whose output goes to ``log``; RuntimeError with the log's last line if it did not complete."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:  # one fork at a time, and interrupt() sees every child
            pid = os.fork()
            if pid == 0:
                _child(log, scenario, directory, options)  # never returns
            self._live.add(pid)
        try:
            _, status = os.waitpid(pid, 0)
        finally:
            with self._lock:
                self._live.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise RuntimeError(f"exit status {code}: {(tail or [''])[0]} (log: {log})")

    def interrupt(self) -> None:
        """Ask every running run to stop, once (SIGINT: each tears down and writes its summary)."""
        with self._lock:
            for pid in self._live:
                try:
                    os.kill(pid, signal.SIGINT)
                except ProcessLookupError:
                    pass


def _child(log: Path, scenario, directory: Path, options: dict) -> None:
    """The forked child: one run, as ``emulate run --quiet`` does it; its exit status says how it
    ended (0 completed, 1 failed, 130 interrupted)."""
    code = 1
    try:
        # A session of its own: a Ctrl-C at the terminal reaches the sweep only, which then sends
        # each run exactly one SIGINT (a second one could cut its teardown short).
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the sweep's handler is not the run's: the Emulation installs its own
        out = open(log, "w", buffering=1)
        with open(os.devnull) as nothing:
            os.dup2(nothing.fileno(), 0)
        os.dup2(out.fileno(), 1)  # what the run's own subprocesses write goes to the log too
        os.dup2(out.fileno(), 2)
        sys.stdout = sys.stderr = out
        summary = run_scenario(scenario, directory, **options)
        print(f"{summary.status}: run directory {summary.path}")
        code = 130 if summary.status == "interrupted" else 0
    except RunFailed as exc:
        print(f"run directory: {exc.summary.path}\nrun failed: {exc}")
    except KeyboardInterrupt:  # before the run started (a run itself returns, interrupted)
        print("interrupted")
        code = 130
    except BaseException:  # noqa: BLE001 - said in the log; the exit status tells the sweep
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
        finally:
            os._exit(code)


@dataclass
class SweepResult:
    directory: Path
    runs: list[dict]  # the entries of sweep.json's points[*].runs, flattened
    jobs: int
    interrupted: bool = False

    def count(self, status: str) -> int:
        return sum(1 for r in self.runs if r["status"] == status)

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.runs if r["status"] != "completed"]


@dataclass
class _State:
    """The sweep's bookkeeping; every change is written to ``sweep.json`` at once, under the lock."""

    sweep: Sweep
    name: str
    directory: Path
    planned: list[PlannedRun]
    jobs: int
    entries: dict[str, dict] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def update(self, run_id: str, **fields) -> dict:
        with self.lock:
            self.entries[run_id].update(fields)
            self.write()
            return dict(self.entries[run_id])

    def write(self) -> None:
        name = self.name
        points = []
        for index, assignments in enumerate(self.sweep.points()):
            runs = [self.entries[p.run_id] for p in self.planned if p.point == index]
            points.append({"index": index, "values": {k: parse_value(v) for k, v in assignments},
                           "assignments": [f"{k}={v}" for k, v in assignments], "runs": runs})
        data = {
            "name": name, "scenario": str(self.sweep.scenario), "overrides": list(self.sweep.overrides),
            "backend": self.sweep.backend or "scenario", "repeat": self.sweep.repeat, "jobs": self.jobs,
            "seed_rule": SEED_RULE,
            "grid": [{"key": a.key, "values": [parse_value(v) for v in a.values], "texts": list(a.values)} for a in self.sweep.axes],
            "points": points, "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        with self.lock:
            write_json_atomic(self.directory / "sweep.json", data)


def run_sweep(sweep: Sweep, directory: str | Path, *, jobs: int | None = None, runner: Runner | None = None,
              say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> SweepResult:
    """Validate every grid point, then run what is not already done, ``jobs`` at a time."""
    planned = sweep.plan()  # raises before anything runs
    directory = Path(directory)
    jobs = jobs or default_jobs(planned)
    if jobs < 1:
        raise SweepError([f"--jobs must be >= 1, got {jobs}"])
    stale = []
    for run in planned:
        summary = completed_summary(directory / run.run_id)
        if summary is not None and summary.get("plan_digest") not in (None, run.plan_digest):
            stale.append(f"{directory / run.run_id} holds a completed run of another plan "
                         f"(digest {summary.get('plan_digest')}, expected {run.plan_digest}): the scenario changed; use another --out")
    if stale:
        raise SweepError(stale)
    directory.mkdir(parents=True, exist_ok=True)
    state = _State(sweep, load_scenario(sweep.scenario, list(sweep.overrides))[0].name, directory, planned, jobs)
    todo = []
    for run in planned:
        entry = {"run_id": run.run_id, "repetition": run.repetition, "seed": run.seed, "plan_digest": run.plan_digest,
                 "status": "pending", "error": None, "wall_s": None}
        if completed_summary(directory / run.run_id) is not None:
            entry.update(status="completed", reused=True)
        else:
            todo.append(run)
        state.entries[run.run_id] = entry
    state.write()
    total, reused = len(planned), len(planned) - len(todo)
    say(f"sweep {directory}: {len(sweep.points())} grid point(s) x {sweep.repeat} repetition(s) = {total} run(s)"
        + (f", {reused} already done" if reused else "") + f", {min(jobs, max(1, len(todo)))} at a time")
    runner = runner or ForkRunner()
    started = clock()
    walls: list[float] = []
    interrupted = False

    def execute(run: PlannedRun) -> None:
        set_aside(directory, run.run_id)
        state.update(run.run_id, status="running")
        t0 = clock()
        error = None
        try:
            runner(run, sweep, directory)
        except Exception as exc:  # noqa: BLE001 - recorded: one failed run does not stop the sweep
            error = f"{type(exc).__name__}: {exc}"
        try:
            summary = json.loads((directory / run.run_id / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {}
        status = summary.get("status") or "failed"
        if error and status == "completed":
            status = "failed"
        walls.append(clock() - t0)
        state.update(run.run_id, status=status, error=error or summary.get("error"), wall_s=round(clock() - t0, 3))

    on_main_thread = threading.current_thread() is threading.main_thread()
    previous_term = signal.signal(signal.SIGTERM, _raise_interrupt) if on_main_thread else None
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="sweep")
    futures: dict[Future, PlannedRun] = {}
    queue = list(todo)
    try:
        while queue or futures:
            while queue and len(futures) < jobs:
                run = queue.pop(0)
                futures[pool.submit(execute, run)] = run
            done, _ = wait(list(futures), timeout=1.0, return_when=FIRST_COMPLETED)
            for future in done:
                run = futures.pop(future)
                with state.lock:
                    entry = dict(state.entries[run.run_id])
                finished = total - len(queue) - len(futures)
                say(_progress(finished, total, entry, run, len(futures), len(queue), jobs, walls, clock() - started))
    except KeyboardInterrupt:
        interrupted = True
        say("sweep interrupted: stopping the running runs (each tears down and writes its summary)")
        queue.clear()
        if hasattr(runner, "interrupt"):
            runner.interrupt()
        wait(list(futures))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        # A Ctrl-C inside pool.submit, after its thread started but before the pool listed it, leaves
        # a run the shutdown does not wait for: wait for it too, so its status is its own.
        for thread in threading.enumerate():
            if thread.name.startswith("sweep") and thread is not threading.current_thread():
                thread.join()
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        with state.lock:
            for entry in state.entries.values():
                if interrupted and entry["status"] in ("pending", "running"):
                    entry["status"] = "interrupted"
            state.write()
    runs = [dict(state.entries[p.run_id]) for p in planned]
    return SweepResult(directory, runs, jobs, interrupted)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _progress(finished, total, entry, run, running, queued, jobs, walls, elapsed) -> str:
    parts = [f"[sweep {finished}/{total}] {run.label}: {entry['status']}"
             + (f" in {format_duration(entry['wall_s'])}" if entry.get("wall_s") is not None else "")]
    if entry["status"] != "completed" and entry.get("error"):
        parts[-1] += f" ({entry['error']})"
    parts.append(f"elapsed {format_duration(elapsed)}")
    if walls and (running or queued):
        mean = sum(walls) / len(walls)
        parts.append(f"ETA {format_duration(mean * math.ceil((running + queued) / jobs))}")
    return " | ".join(parts)


__all__ = [
    "Axis", "ForkRunner", "PlannedRun", "Runner", "SEED_RULE", "SEED_STRIDE", "Sweep", "SweepError", "SweepResult",
    "default_directory", "default_jobs", "grid_points", "parse_value", "repetition_seed", "run_id", "run_sweep", "split_values",
]
