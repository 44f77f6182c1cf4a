"""``emulate``: a thin command line over the library.

Each command builds the domain objects (scenario, plan, backend, run directory) and calls
them; everything here is callable from Python too. No traceback reaches the user for bad
input. Exit status, the same for every command:

    0    success
    1    the run or experiment failed (its run directory says why; doctor: a check failed)
    2    bad input, named with its field, file or line (a scenario value, an option, a run id
         that exists, a backend or Docker daemon this machine does not have)
    130  interrupted (Ctrl-C); a run tears down and writes its summary first
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import click

from emulator import backends, datasets
from emulator.control import cleanup  # used as backends.choose, cleanup.clean_all, checks.diagnose: the seams tests replace
from emulator.control import doctor as checks
from emulator.control import workload
from emulator.backends import BackendUnavailable
from emulator.backends.swarm import push_images
from emulator.host import images as image_lib
from emulator.planning.plan import check_dataset, make_plan
from emulator.control.rundir import RunIdError, check_run_id
from emulator.control.run import RunFailed, check_host, run_scenario
from emulator.control.summary import FLAGGED
from emulator.planning.loader import load_scenario
from emulator.planning.problems import ScenarioError
from emulator.planning.scenario import json_schema
from emulator.planning.workload import user_files
from emulator import plugins
from emulator.experiments.sweep import Sweep, SweepError, default_directory, run_sweep
from emulator.planning import tracegen
from emulator.planning.units import format_bytes, format_rate, parse_duration, parse_rate

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
REGISTRY = re.compile(rf"{_LABEL}(?:\.{_LABEL})*(?::\d{{1,5}})?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*")  # a Docker reference's domain
EXIT_CODES = """\b
Exit status:
  0    success
  1    the run or experiment failed (its run directory says why)
  2    bad input: the message names the field, file or line
  130  interrupted (Ctrl-C)"""


def _say(msg: str) -> None:
    click.echo(msg, err=True)


def _fail(message: str, code: int = EXIT_BAD_INPUT):
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _writable(path, option: str) -> None:
    """Exit 2 naming the option when ``path`` cannot hold what the command writes, so that a typo
    or a read-only folder is bad input, not a traceback after the first run. Nothing is made
    here: a refused command leaves no folder behind."""
    target = Path(path)
    existing = target
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        _fail(f"{option} {path}: cannot make the directory: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        _fail(f"{option} {path}: not writable by this user")


def _docker_client():
    """The Docker SDK's client, or exit 2 saying that no daemon answers."""
    try:  # here: the docker SDK, for the commands that talk to a daemon
        import docker

        from emulator.backends.docker import client
    except ImportError:
        _fail("the docker Python package is not installed (make setup installs it)")
    try:
        return client()
    except docker.errors.DockerException as exc:
        _fail(f"no Docker daemon answers ({exc}); start one (as root, make demo installs and starts it)")


def _load(path: str, overrides: tuple[str, ...], *, data: bool = True, run_code: bool = False):
    """The scenario, its raw mapping and its plan, or exit 2 naming the field; ``data``: its data set
    must be here too (a run needs it; without, a named data set that is not here is only noted, and
    one that is here is still checked); ``run_code``: also import and check the user's files (a
    loader, a model, a compressor, a rule), as a run does first."""
    try:
        scenario, raw = load_scenario(path, list(overrides))
        plan = make_plan(scenario)
        if run_code:
            workload.check_scenario(scenario, plan)  # as a run does first: the user's files imported and checked
        elif data or not _noted_missing(scenario):
            check_dataset(scenario)  # a missing or too small dataset is bad input, found before anything runs
    except ScenarioError as exc:
        if not exc.source:
            exc = ScenarioError(exc.problems, path)
        click.echo(_blamed(exc, overrides).render(), err=True)
        sys.exit(EXIT_BAD_INPUT)
    return scenario, raw, plan


def _noted_missing(scenario) -> bool:
    """Whether the scenario's named data set is not on this machine (said as a note: showing a plan
    needs no data, running it will); a malformed or user's data set is left to the check."""
    if datasets.source_kind(scenario.dataset) != "name":
        return False
    try:
        datasets.facts(scenario.dataset)
    except datasets.DatasetUnavailable as exc:
        _say(f"note: running this plan needs data set {scenario.dataset.name!r}, which is not here: {str(exc).splitlines()[0]}")
        return True
    except ValueError:
        return False  # a malformed data file: check_dataset names it with its field, exit 2
    return False


def _blamed(exc: ScenarioError, overrides) -> ScenarioError:
    """The problems, each one that a ``--set`` put there saying so: the user typed the option,
    not the file's line."""
    def blame(problem):
        for override in overrides:
            key = override.split("=", 1)[0].strip()
            if key and (problem.path == key or problem.path.startswith((key + ".", key + "["))):
                return type(problem)(problem.path, f"{problem.message} (from --set {override})")
        return problem

    return ScenarioError([blame(p) for p in exc.problems], exc.source)


set_option = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                          help="Override a scenario value, e.g. --set workers[0].count=8 (repeatable).")

# The options run, compare and sweep share: one declaration each, so that the same name means the
# same thing with the same default everywhere (tests/test_cli.py walks the commands to keep it so).
OPTIONS = {
    "backend": click.option("--backend", type=click.Choice(backends.CHOICES), default=None,
                            help="Overrides the scenario's backend: (default: the scenario's; auto: docker when a daemon answers, else local)."),
    "set": set_option,
    "out": click.option("--out", "out_root", default="runs", show_default=True, type=click.Path(file_okay=False),
                        help="Where results go: a run's directory, a comparison's or a sweep's folder is made in it."),
    "dir": click.option("--dir", "directory", default=None, type=click.Path(file_okay=False),
                        help="This experiment's own folder (default: a new one in --out); a rerun into it reuses its completed runs."),
    "repeat": click.option("--repeat", default=1, show_default=True, type=click.IntRange(1),
                           help="Repetitions with derived seeds (repetition 0: the scenario's seed; compare: each one seed for every method)."),
    "jobs": click.option("--jobs", default=None, type=click.IntRange(1),
                         help="Runs at once (default: CPU count / the heaviest run's summed device CPU quotas, at least 1)."),
    "strict": click.option("--strict", is_flag=True, help="Abort a run when the fidelity check finds a property off by more than --tolerance."),
    "tolerance": click.option("--tolerance", default=0.10, show_default=True, type=click.FloatRange(0, 1),
                              help="Relative tolerance of the fidelity check."),
    "no_fidelity": click.option("--no-fidelity", is_flag=True, help="Skip the fidelity check before training (saves a few seconds a run)."),
    "quiet": click.option("--quiet", is_flag=True, help="No live progress lines."),
    "no_report": click.option("--no-report", is_flag=True, help="Do not write the report (report.html, report.md, figures) at the end."),
}
RUNNING = ("backend", "set", "out", "strict", "tolerance", "no_fidelity", "quiet", "no_report")  # every command that runs


def options(*names: str):
    """Decorate a command with the shared options ``names``, in that order."""
    def decorate(command):
        for name in reversed(names):
            command = OPTIONS[name](command)
        return command
    return decorate


def _backend_of(requested: str | None, scenario, say=None) -> str:
    """The backend a command runs on: ``--backend``, else the scenario's ``backend:``; exit 2 when
    this machine lacks it, before any folder is made."""
    try:
        return backends.choose(requested or scenario.backend, say=say or _say).name
    except BackendUnavailable as exc:
        _fail(str(exc))


def _check_host(scenario, backend_name: str, say, source: str = "") -> None:
    """Exit 2 when a device asks for more cores than this machine has (backends that run here)."""
    try:
        check_host(scenario, make_plan(scenario), backends.backend_class(backend_name), say, source=source)
    except ScenarioError as exc:
        click.echo(exc.render(), err=True)
        sys.exit(EXIT_BAD_INPUT)


def _report(directory, no_report: bool) -> None:
    """Write the report of a run or an experiment, and say where; a report that cannot be drawn is
    said, and does not change the exit status (the results are in the directory)."""
    if no_report:
        return
    from analysis.report import build_report  # here: matplotlib and pandas, only when there is a report to draw

    problems: list[str] = []
    try:
        out = build_report(directory, problems=problems)
    except Exception as exc:  # noqa: BLE001 - the run's records are what matters; say why there is no report
        _say(f"report: not written ({type(exc).__name__}: {exc}); emulate report {directory} tries again")
        return
    for problem in problems:
        _say(f"warning: {problem}")
    click.echo(f"report: {out / 'report.html'} (and report.md, figures beside it)")


class _Commands(click.Group):
    """Ctrl-C outside a run (which handles it itself) exits 130 too, not click's 1."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@click.group(cls=_Commands, epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="edge-emulator")
def main():
    """Emulate many weak, WAN-connected devices training one model through a parameter server."""


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@options("backend", "set", "out")
@click.option("--run-id", default=None, help="Name of the run directory (default: time-name-random).")
@options("strict", "tolerance", "no_fidelity", "quiet", "no_report")
def run(scenario_file, backend, overrides, out_root, run_id, strict, tolerance, no_fidelity, quiet, no_report):
    """Run one scenario: devices up, train, record traces, tear down; then its report."""
    try:
        summary = run_scenario(scenario_file, out_root, overrides=overrides, backend=backend, run_id=run_id, strict=strict,
                               tolerance=tolerance, check_fidelity=not no_fidelity, progress_every_s=0 if quiet else 2.0, say=_say)
    except ScenarioError as exc:
        click.echo(_blamed(exc, overrides).render(), err=True)
        sys.exit(EXIT_BAD_INPUT)
    except RunIdError as exc:
        _fail(f"--run-id: {exc}")
    except BackendUnavailable as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"--out {out_root}: cannot make the run directory: {exc.strerror or exc}")
    except RunFailed as exc:  # the summary has been written; say where
        click.echo(f"failed: {exc.summary.data.get('name', '')} ({exc})\n  run directory    {exc.summary.path}", err=True)
        _report(exc.summary.path, no_report)
        sys.exit(EXIT_FAILED)
    _print_summary(summary.data, summary.path)
    _report(summary.path, no_report)
    if summary.status == "interrupted":
        sys.exit(EXIT_INTERRUPTED)


def headline(summary: dict) -> str:
    """The word a user reads first: the outcome where the model is not worth reading (``diverged``,
    ``dead``), else how the run ended (``completed``, ``interrupted``, ``failed``)."""
    outcome = summary.get("outcome")
    return outcome if outcome in FLAGGED else summary.get("status", "failed")


def _print_summary(summary: dict, path) -> None:
    acc = summary.get("final_accuracy")
    accuracy = f"{acc:.4f} at update {summary.get('final_version')}" if acc is not None else "(none recorded)"
    lines = [
        f"{headline(summary)}: {summary['name']} ({summary['method']}, {summary['workers']} workers, {summary['backend']})",
        f"  final accuracy   {accuracy}",
        f"  updates applied  {summary['updates_applied']} in {summary['duration_s']:.1f}s{' of virtual time' if summary.get('clock') == 'virtual' else ''}"
        f" ({summary['updates_per_s'] or 0:.1f}/s)",
        f"  ingress payload  {format_bytes(summary['ingress_payload_bytes'])} ({summary['ingress_payload_bytes']:,} bytes)",
    ]
    if summary.get("ingress_wire_bytes") is not None:
        lines.append(f"  ingress on wire  {format_bytes(summary['ingress_wire_bytes'])} ({summary['ingress_wire_bytes']:,} bytes)")
    lines.append(f"  run directory    {path}")
    click.echo("\n".join(lines))


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@set_option
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
              help="The calibration file to add to (default: $EDGE_EMULATOR_CALIBRATION or the cache's calibration.json).")
@click.option("--repeat", type=click.IntRange(5, 10_000), default=30, show_default=True, help="Measurements per quantity.")
@click.option("--from-run", "from_run", type=click.Path(exists=True, file_okay=False), default=None,
              help="A Docker run of this scenario: also take a worker's CPU per step beyond the measured parts from its "
                   "containers' CPU counters.")
def calibrate(scenario_file, overrides, out_file, repeat, from_run):
    """Measure on this machine what the virtual backend's clock needs for a scenario: CPU seconds of a
    gradient (model, batch), a compression, a server update and reply; with where and how measured."""
    from emulator.control.simulation import calibrate as measure

    _, _, resolved = _load(scenario_file, overrides)
    command = "emulate calibrate " + " ".join([scenario_file, *(f"--set {o}" for o in overrides), f"--repeat {repeat}",
                                               *([f"--from-run {from_run}"] if from_run else [])])
    try:
        from analysis.runs import container_usage

        path, entries = measure(resolved, out_file, repeat, command, container=container_usage(from_run) if from_run else None)
    except (ValueError, FileNotFoundError) as exc:  # not a container run, or not a run directory at all
        raise click.BadParameter(str(exc), param_hint="--from-run") from None
    for key, entry in entries.items():
        click.echo(f"{entry['cpu_s'] * 1000:9.3f} ms CPU (p10 {entry['p10_s'] * 1000:.3f}, p90 {entry['p90_s'] * 1000:.3f}, "
                   f"{entry['samples']} samples)  {key}")
    click.echo(f"calibration: {path}")


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@set_option
@click.option("--json", "as_json", is_flag=True, help="The whole plan as canonical JSON.")
@click.option("--import", "run_code", is_flag=True,
              help="Also import and check the user's files the scenario names, as a run does (plan alone never runs them).")
def plan(scenario_file, overrides, as_json, run_code):
    """Show the resolved plan: every device and every fault, without running anything (nor its data set)."""
    _, _, resolved = _load(scenario_file, overrides, data=False, run_code=run_code)
    if as_json:
        click.echo(resolved.dumps(), nl=False)
        return
    click.echo(render_plan(resolved))


def render_plan(p) -> str:
    def link(l):
        bits = []
        bits.append(f"up {format_rate(l.uplink_bps)}" if l.uplink_bps else "up unshaped")
        bits.append(f"down {format_rate(l.downlink_bps)}" if l.downlink_bps else "down unshaped")
        if l.delay_s:
            bits.append(f"delay {l.delay_s * 1000:g}ms")
        if l.jitter_s:
            bits.append(f"jitter {l.jitter_s * 1000:g}ms")
        if l.loss:
            bits.append(f"loss {l.loss * 100:g}%")
        return ", ".join(bits)

    t = p.training
    lines = [
        f"scenario {p.name} (seed {p.seed}, plan {p.digest()})",
        f"model {p.model['name']}; dataset {datasets.display_name(p.dataset)} ({p.dataset['partition']}); method {p.method.label} "
        f"= compressor {p.method.compressor} {p.method.params or ''} + rule {p.method.rule}"
        + (" + error feedback" if p.method.error_feedback else "") + (f" + pull {p.method.pull_label}" if p.method.pull_label else ""),
        f"training: batch {t['batch_size']}, alpha {t['learning_rate']}, until "
        + " or ".join(x for x in (f"{t['max_updates']} updates" if t["max_updates"] else "", f"{t['duration']:g}s" if t["duration"] else "") if x),
        "",
        f"{'device':<14} {'group':<12} {'cpus':>6} {'memory':>10}  link",
    ]
    for d in p.devices:
        lines.append(f"{d.name:<14} {d.group:<12} {d.cpus:>6.3g} {format_bytes(d.memory_bytes):>10}  {link(d.link)}")
    lines.append("")
    lines.append(f"timeline ({len(p.events)} events, random faults drawn to {p.horizon_s:g}s):")
    for e in p.events:
        params = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in e.params.items())
        lines.append(f"  {e.time_s:>9.3f}s  {e.action:<9} {e.target:<12} {params} [{e.source}]")
    for tr in p.triggers:
        lines.append(f"  trigger: {tr['action']} {tr['worker']} after its {tr['after_pushes']}th applied update")
    files = user_files(p)
    lines += ["", f"your files ({len(files)}):" if files else "your files: none (the run imports no code from outside the package)"]
    for f in files:
        how = "imported by the run" + (" and on devices" if f.on_devices else " on this machine") if f.imported else "read"
        lines.append(f"  {f.field:<15} {f.role:<10} {f.reference}  ({how})")
    return "\n".join(lines)


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("-m", "--method", "methods", multiple=True, required=True, metavar="SPEC",
              help="A method to run: NAME[:KEY=VALUE]..., e.g. adacomp, qsgd:s=4, topk:c=0.001:error_feedback=true, asgd:training.learning_rate=0.05 (repeatable).")
@options("backend", "set", "out", "dir", "repeat", "jobs")
@click.option("--target-accuracy", type=click.FloatRange(0, 1), default=None,
              help="Accuracy for the time-to-target column (default: 90% of the best mean final accuracy).")
@options("strict", "tolerance", "no_fidelity", "quiet", "no_report")
def compare(scenario_file, methods, backend, overrides, out_root, directory, repeat, jobs, target_accuracy, strict, tolerance,
            no_fidelity, quiet, no_report):
    """Run one scenario once per method and repetition (each repetition one seed for every method):
    one table with intervals, paired differences, one figure."""
    from emulator.experiments.compare import compare as run_compare, plan_comparison  # here: pandas, which the other commands do without

    scenario, _, _ = _load(scenario_file, overrides)  # refuse a bad scenario before anything runs
    try:
        plan_comparison(scenario_file, list(methods), overrides, repeat)  # and a bad -m, blamed on it
    except ScenarioError as exc:
        _refuse(exc)
    backend_name = _backend_of(backend, scenario, say=lambda _msg: None)  # and a backend this machine lacks
    _check_host(scenario, backend_name, lambda _msg: None, scenario_file)  # each run says its notes
    _writable(directory, "--dir") if directory else _writable(out_root, "--out")
    try:
        out = run_compare(scenario_file, list(methods), out_root, backend=backend_name, overrides=list(overrides),
                          say=(lambda msg: None) if quiet else _say, target_accuracy=target_accuracy,
                          check_fidelity=not no_fidelity, strict=strict, tolerance=tolerance, repeat=repeat,
                          directory=directory, jobs=jobs)
    except ScenarioError as exc:
        _refuse(exc)
    except BackendUnavailable as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo((Path(out) / "compare.md").read_text())
    click.echo(f"comparison: {out}")
    _report(out, no_report)


def _refuse(exc: ScenarioError):
    """Exit 2: a scenario's problems under its file's name, an option's as ``error: OPTION ...``."""
    if not exc.source and all(p.path.startswith("-") for p in exc.problems):
        for problem in exc.problems:
            click.echo(f"error: {problem}", err=True)
    else:
        click.echo(exc.render(), err=True)
    sys.exit(EXIT_BAD_INPUT)


@main.command()
@click.argument("target")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="A compressor parameter (repeatable), read as YAML.")
@set_option
def check(target, params, overrides):
    """Run the contract suite on your compressor or update rule (file.py:Class), or on every file a scenario names.

    \b
    emulate check my_compressor.py:MyCompressor -p c=0.01
    emulate check my_rule.py:MyRule
    emulate check scenario.yaml      # its data set, model, compressor and rule, on the model's own layout

    Exit 0 when every check passes, 1 when one fails (each is listed with what broke), 2 when the
    file cannot be imported or the parameters are refused (your traceback is shown, marked as yours)."""
    import yaml

    if target.endswith((".yaml", ".yml")):
        if params:
            _fail("--param: give a scenario's parameters in its method section (or with --set method.KEY=VALUE)")
        scenario, _, resolved = _load(target, overrides, run_code=True)
        layout = workload.check_scenario(scenario, resolved)  # done by _load: its results are cached
        try:
            results = workload.scenario_check(resolved, user_files(resolved), layout)
        except (plugins.PluginError, ScenarioError) as exc:
            _fail(f"{target}: {exc}")
        click.echo(f"{target}: data set and model checked ({layout.total:,} parameters in {len(layout)} tensors)")
        failed = sum(_print_verdicts(f"{f.field} {f.reference}", verdicts) for f, verdicts in results)
    else:
        if overrides:
            _fail("--set: goes with a scenario file; for a compressor use --param KEY=VALUE")
        values = {}
        for item in params:
            key, sep, raw = item.partition("=")
            if not sep or not key:
                _fail(f"--param {item!r}: expected KEY=VALUE")
            values[key] = yaml.safe_load(raw)
        try:
            kind, verdicts = workload.contract_check(target, values)
        except ScenarioError as exc:
            _fail(f"{target}: " + "; ".join(str(p) for p in exc.problems))
        except plugins.PluginError as exc:
            _fail(str(exc))
        failed = _print_verdicts(f"{kind} {target}", verdicts)
    if failed:
        sys.exit(EXIT_FAILED)


def _print_verdicts(title: str, verdicts) -> bool:
    """Print one plug-in's verdicts; True when any check failed."""
    bad = [v for v in verdicts if not v.ok]
    click.echo(f"{title}: {len(verdicts) - len(bad)} of {len(verdicts)} checks passed")
    for v in verdicts:
        click.echo(f"  {'ok  ' if v.ok else 'FAIL'} {v.check}" + (f": {v.detail}" if v.detail else ""))
    return bool(bad)


@main.command()
def schema():
    """Print the scenario file's JSON Schema (for editor completion)."""
    click.echo(json.dumps(json_schema(), indent=2))


@main.command()
@click.option("--run", "run_id", default=None, help="Only this run's resources, removed even while it runs (said first).")
@click.option("--all", "everything", is_flag=True,
              help="Every labelled resource: live runs', other hosts' and those without owner labels too.")
def clean(run_id, everything):
    """Remove what killed runs left: containers, networks, Swarm services, cgroups (with the
    qdiscs and iptables rules in them), probe links and chains, working files. A resource goes
    when its controller (host, boot, pid, start time) is gone; what stays is listed, with why."""
    if run_id is not None:
        try:
            check_run_id(run_id)  # it names a cgroup subtree: '..' would reach every process's
        except RunIdError as exc:
            _fail(f"--run: {exc}")
    done = cleanup.clean_all(run_id, say=_say, everything=everything)
    click.echo(f"removed {len(done.gone)} resource(s)")
    for item in done.gone:
        click.echo(f"  {item}")
    if done.kept:
        click.echo(f"kept {len(done.kept)} run(s)' resources:")
        for item in done.kept:
            click.echo(f"  {item}")
    if done.failed:
        click.echo(f"could not remove {len(done.failed)} resource(s):")
        for item in done.failed:
            click.echo(f"  {item}")
        _fail("some resources outlived their removal (above, with what to do)", EXIT_FAILED)


@main.group()
def images():
    """The runtime image every device runs (built with no registry and no network in the build)."""


@images.command("build")
@click.option("--force", is_flag=True, help="Rebuild even if the tag exists.")
def images_build(force):
    """Build the runtime image if it is missing (base, wheels, code layer)."""
    docker_client = _docker_client()
    try:
        tag = image_lib.ensure_runtime_image(docker_client, force=force, progress=_say)
    except image_lib.ImageBuildError as exc:
        _fail(str(exc), EXIT_FAILED)
    click.echo(tag)


@images.command("status")
def images_status():
    """Which base and runtime image exist, and whether the runtime image matches the code."""
    click.echo(json.dumps(image_lib.image_status(_docker_client()), indent=1))


@images.command("remove")
def images_remove():
    """Remove every image this project built (runtime images of any code, the build stage, the
    base), to reclaim the disk; the next Docker run builds them again. Images in use stay."""
    removed, kept = image_lib.remove_images(_docker_client())
    for ref in removed:
        click.echo(ref)
    if kept:
        _fail(f"still there (in use by a container, or the daemon refused): {', '.join(kept)}", EXIT_FAILED)


@images.command("push")
@click.argument("registry")
def images_push(registry):
    """Push the runtime and swarm agent images to REGISTRY (host:port), for the nodes of a swarm
    to pull (then run with EMULATE_SWARM_REGISTRY=REGISTRY)."""
    if not REGISTRY.fullmatch(registry):  # found now, not after building the image
        _fail(f"REGISTRY {registry!r}: expected HOST[:PORT][/PATH], e.g. registry.lab:5000")
    docker_client = _docker_client()
    try:
        refs = push_images(docker_client, registry, progress=_say)
    except image_lib.ImageBuildError as exc:
        _fail(str(exc), EXIT_FAILED)
    click.echo("\n".join(refs))


@main.command()
def doctor():
    """What this machine offers: Docker, kernel qdiscs, iptables, cgroups, image, data sets."""
    ok = True
    for name, status, detail in checks.diagnose():
        mark = {"ok": "ok  ", "warn": "warn", "fail": "FAIL", "info": "info"}[status]
        ok = ok and status != "fail"
        first, *more = detail.splitlines() or [""]
        click.echo("\n".join([f"[{mark}] {name}: {first}", *(f"       {line}" for line in more)]))
    sys.exit(0 if ok else EXIT_FAILED)



@main.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--runs", "per_run", is_flag=True, help="For a sweep or a folder of runs: also build each run's own report.")
def report(path, per_run):
    """Figures and tables of a run, a sweep or a folder of runs, written to PATH/report/."""
    from analysis.report import build_report  # here: matplotlib and pandas, for this command only

    problems: list[str] = []
    try:
        out = build_report(path, per_run=per_run, problems=problems)
    except FileNotFoundError as exc:
        _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - no traceback for a damaged directory: say what, and where to look
        _fail(f"{path}: the report could not be drawn ({type(exc).__name__}: {exc})", EXIT_FAILED)
    for problem in problems:  # damaged files and lines, skipped: named, and in the report's notes
        _say(f"warning: {problem}")
    click.echo(f"report: {out / 'report.html'} (and report.md, figures beside it)")


@main.group("traces")
def traces_group():
    """Trace files for a worker group's traces: block (docs/TRACES.md): convert published ones, generate synthetic ones."""


@traces_group.command("convert")
@click.option("--from", "source", required=True, type=click.Choice(tracegen.CONVERTERS), help="The published format of IN.")
@click.argument("infile", metavar="IN", type=click.Path(dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--downlink", type=click.Path(dir_okay=False), help="mahimahi: the downlink trace (IN is the uplink).")
@click.option("--window", default=None, help="mahimahi: the window each rate is taken over [default: 1s].")
@click.option("--min-rate", default=None, help="mahimahi: the rate of a window without deliveries [default: 10kbit].")
@click.option("--sample", type=click.IntRange(1), default=None, help="fedscale-*: keep this many clients, drawn with --seed.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--length", default=None, help="plato: when the last state ends [default: the latest time in IN].")
def traces_convert(source, infile, out, downlink, window, min_rate, sample, seed, length):
    """Convert IN, in a published format, to OUT (.csv or .jsonl) in this project's format."""
    given = {"--downlink": downlink, "--window": window, "--min-rate": min_rate, "--sample": sample, "--length": length}
    fits = {"mahimahi": ("--downlink", "--window", "--min-rate"), "plato": ("--length",)}.get(source, ("--sample",))
    wrong = [name for name, value in given.items() if value is not None and name not in fits]
    if wrong:
        _fail(f"{wrong[0]} does not apply to --from {source}")
    try:
        options = {"mahimahi": lambda: {"downlink": downlink, "window_s": _parsed(parse_duration, window or "1s", "--window"),
                                        "min_rate_bps": _parsed(parse_rate, min_rate or "10kbit", "--min-rate")},
                   "plato": lambda: {"length_s": _parsed(parse_duration, length, "--length") if length else None}}.get(
            source, lambda: {"sample": sample, "seed": seed})()
        result = tracegen.convert(source, infile, out, **options)
    except ValueError as exc:  # TraceError names the file, line and field
        _fail(str(exc))
    click.echo(f"{out}: " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))


def _parsed(parse, text: str, option: str) -> float:
    """``parse(text)``, or a ValueError that names the option as the user typed it."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{option} {text}: {exc}") from None


@traces_group.command("generate")
@click.argument("kind", type=click.Choice(tracegen.GENERATORS))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--devices", type=click.IntRange(1, 1_000_000), default=8, show_default=True)
@click.option("--duration", default="10min", show_default=True, help="Trace time covered (a bare number is seconds).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--window", default="2s", show_default=True, help="link, compute, mahimahi: one value per window.")
@click.option("--availability", type=click.FloatRange(0, 1, min_open=True), default=0.7, show_default=True,
              help="availability: the expected share of time online.")
@click.option("--mean-online", default="2min", show_default=True, help="availability: mean online spell.")
@click.option("--up", default="2mbit", show_default=True, help="link, population, mahimahi: median uplink rate.")
@click.option("--down", default="10mbit", show_default=True, help="link, population: median downlink rate.")
@click.option("--spread", type=click.FloatRange(0), default=0.4, show_default=True, help="std of log values.")
@click.option("--shared", is_flag=True, help="link, compute: one series for every device (no device column).")
def traces_generate(kind, out, devices, duration, seed, window, availability, mean_online, up, down, spread, shared):
    """Write a synthetic KIND trace to OUT from a seed (same arguments, same bytes)."""
    try:
        options = tracegen.parse_options(duration, window, up, down, mean_online)
        result = tracegen.generate(kind, out, devices=devices, seed=seed, availability=availability, spread=spread,
                                   shared=shared, **options)
    except ValueError as exc:
        _fail(str(exc))
    click.echo(f"{out}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--grid", multiple=True, metavar="KEY=V1,V2,...",
              help="A grid axis: a --set key and its values (YAML, split at top-level commas), e.g. "
                   "--grid faults.crash.rate_per_hour=0,30,120 (repeatable: the grid is the Cartesian product).")
@options("backend", "set", "out", "dir", "repeat", "jobs", *RUNNING[3:])
def sweep(scenario_file, grid, backend, overrides, out_root, directory, repeat, jobs, strict, tolerance, no_fidelity, quiet, no_report):
    """Run a scenario over a grid of values, each point repeated; finished runs are reused on a rerun.
    The sweep's folder is --dir, else <out>/sweeps/<name>-<digest of scenario, overrides, grid, backend>."""
    scenario, _, _ = _load(scenario_file, overrides)
    backend_name = _backend_of(backend, scenario, say=(lambda msg: None) if quiet else _say)
    say = (lambda msg: None) if quiet else _say
    try:
        spec = Sweep.from_options(scenario_file, grid, repeat=repeat, overrides=tuple(overrides), backend=backend_name,
                                  check_fidelity=not no_fidelity, strict=strict, tolerance=tolerance)
        planned = spec.plan()  # every grid point checked before the directory is made
        where = directory or default_directory(spec, Path(out_root) / "sweeps")
        _writable(where, "--dir" if directory else "--out")
        noted = False
        for point in planned:  # quotas this machine cannot give; a note about their sum once
            _check_host(point.scenario, backend_name, (lambda msg: None) if noted else say, scenario_file)
            noted = True
        result = run_sweep(spec, where, jobs=jobs, say=say)
    except SweepError as exc:
        click.echo(exc.render(), err=True)
        sys.exit(EXIT_BAD_INPUT)
    failed = result.failed
    click.echo(f"sweep: {result.count('completed')}/{len(result.runs)} runs completed in {result.directory}")
    for entry in failed:
        click.echo(f"  {entry['run_id']}: {entry['status']}" + (f" ({entry['error']})" if entry.get("error") else ""))
    if result.count("completed"):
        if no_report:  # the sweep's own tables are written all the same
            from analysis.runs import load_collection  # pandas: only for a sweep's tables
            from analysis.sweep import write_tables

            write_tables(load_collection(result.directory))
        click.echo(f"table: {result.directory / 'sweep.md'}")
        _report(result.directory, no_report)
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_FAILED if failed else 0)


if __name__ == "__main__":
    main()
