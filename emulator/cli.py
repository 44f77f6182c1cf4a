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

from emulator import backends
from emulator.control import cleanup  # used as backends.choose, cleanup.clean_all, checks.diagnose: the seams tests replace
from emulator.control import doctor as checks
from emulator.backends import BackendUnavailable
from emulator.backends.swarm import push_images
from emulator.host import images as image_lib
from emulator.planning.plan import check_dataset, make_plan
from emulator.control.rundir import RunIdError, check_run_id
from emulator.control.run import RunFailed, run_scenario
from emulator.planning.loader import load_scenario
from emulator.planning.problems import ScenarioError
from emulator.planning.scenario import json_schema
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
    """Exit 2 naming the option when ``path`` cannot hold run directories (made here if missing),
    so that a typo or a read-only folder is bad input, not a traceback after the first run."""
    target = Path(path)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"{option} {path}: cannot make the directory: {exc.strerror or exc}")
    if not os.access(target, os.W_OK | os.X_OK):
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


def _load(path: str, overrides: tuple[str, ...]):
    try:
        scenario, raw = load_scenario(path, list(overrides))
        plan = make_plan(scenario)
        check_dataset(scenario)  # a missing or too small dataset is bad input, found before anything runs
    except ScenarioError as exc:
        if not exc.source:
            exc = ScenarioError(exc.problems, path)
        click.echo(exc.render(), err=True)
        sys.exit(EXIT_BAD_INPUT)
    return scenario, raw, plan


set_option = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                          help="Override a scenario value, e.g. --set workers[0].count=8 (repeatable).")


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
@click.option("--backend", type=click.Choice(backends.CHOICES), default=None, help="Overrides the scenario's backend.")
@set_option
@click.option("--out", "out_root", default="runs", show_default=True, type=click.Path(file_okay=False), help="Where run directories go.")
@click.option("--run-id", default=None, help="Name of the run directory (default: time-name-random).")
@click.option("--strict", is_flag=True, help="Abort when the fidelity check finds a property off by more than its tolerance.")
@click.option("--tolerance", default=0.10, show_default=True, type=click.FloatRange(0, 1), help="Relative tolerance of the fidelity check.")
@click.option("--no-fidelity", is_flag=True, help="Skip the fidelity check before training (saves a few seconds).")
@click.option("--quiet", is_flag=True, help="No live progress lines.")
def run(scenario_file, backend, overrides, out_root, run_id, strict, tolerance, no_fidelity, quiet):
    """Run one scenario: devices up, train, record traces, tear down."""
    try:
        summary = run_scenario(scenario_file, out_root, overrides=overrides, backend=backend, run_id=run_id, strict=strict,
                               tolerance=tolerance, check_fidelity=not no_fidelity, progress_every_s=0 if quiet else 2.0, say=_say)
    except ScenarioError as exc:
        click.echo(exc.render(), err=True)
        sys.exit(EXIT_BAD_INPUT)
    except RunIdError as exc:
        _fail(f"--run-id: {exc}")
    except BackendUnavailable as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"--out {out_root}: cannot make the run directory: {exc.strerror or exc}")
    except RunFailed as exc:  # the summary has been written; say where
        click.echo(f"run failed: {exc}\nrun directory: {exc.summary.path}", err=True)
        sys.exit(EXIT_FAILED)
    _print_summary(summary.data, summary.path)
    if summary.status == "interrupted":
        sys.exit(EXIT_INTERRUPTED)


def _print_summary(summary: dict, path) -> None:
    acc = summary.get("final_accuracy")
    accuracy = f"{acc:.4f} at update {summary.get('final_version')}" if acc is not None else "(none recorded)"
    lines = [
        f"{summary['status']}: {summary['name']} ({summary['method']}, {summary['workers']} workers, {summary['backend']})",
        f"  final accuracy   {accuracy}",
        f"  updates applied  {summary['updates_applied']} in {summary['duration_s']:.1f}s ({summary['updates_per_s'] or 0:.1f}/s)",
        f"  ingress payload  {format_bytes(summary['ingress_payload_bytes'])} ({summary['ingress_payload_bytes']:,} bytes)",
    ]
    if summary.get("ingress_wire_bytes") is not None:
        lines.append(f"  ingress on wire  {format_bytes(summary['ingress_wire_bytes'])} ({summary['ingress_wire_bytes']:,} bytes)")
    lines.append(f"  run directory    {path}")
    click.echo("\n".join(lines))


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@set_option
@click.option("--json", "as_json", is_flag=True, help="The whole plan as canonical JSON.")
def plan(scenario_file, overrides, as_json):
    """Show the resolved plan: every device and every fault, without running anything."""
    _, _, resolved = _load(scenario_file, overrides)
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
        f"model {p.model}; dataset {p.dataset['name']} ({p.dataset['partition']}); method {p.method.name} "
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
    return "\n".join(lines)


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("-m", "--method", "methods", multiple=True, required=True, metavar="SPEC",
              help="A method to run: NAME[:KEY=VALUE]..., e.g. adacomp, qsgd:s=4, topk:c=0.001:error_feedback=true, asgd:training.learning_rate=0.05 (repeatable).")
@click.option("--backend", type=click.Choice(backends.CHOICES), default="auto", show_default=True)
@set_option
@click.option("--out", "out_root", default="runs", show_default=True, type=click.Path(file_okay=False))
@click.option("--dir", "directory", default=None, type=click.Path(file_okay=False),
              help="The comparison's directory (default: a new <out>/compare-<name>-<time>); a rerun into it reuses its completed runs.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1),
              help="Paired repetitions: repetition r runs every method with the same derived seed (r = 0: the scenario's).")
@click.option("--target-accuracy", type=click.FloatRange(0, 1), default=None,
              help="Accuracy for the time-to-target column (default: 90% of the best mean final accuracy).")
@click.option("--no-fidelity", is_flag=True, help="Skip each run's fidelity check.")
@click.option("--quiet", is_flag=True, help="No live progress lines.")
def compare(scenario_file, methods, backend, overrides, out_root, directory, repeat, target_accuracy, no_fidelity, quiet):
    """Run one scenario once per method and repetition (each repetition one seed for every method):
    one table with intervals, paired differences, one figure."""
    from emulator.experiments.compare import compare as run_compare  # here: it brings pandas, which the other commands do without

    _load(scenario_file, overrides)  # refuse a bad scenario before anything runs
    try:
        backends.choose(backend, say=lambda _msg: None)  # and a backend this machine lacks, before any folder is made
    except BackendUnavailable as exc:
        _fail(str(exc))
    if directory:
        _writable(directory, "--dir")
    else:
        _writable(out_root, "--out")
    try:
        out = run_compare(scenario_file, list(methods), out_root, backend=backend, overrides=list(overrides),
                          say=(lambda msg: None) if quiet else _say, target_accuracy=target_accuracy,
                          check_fidelity=not no_fidelity, repeat=repeat, directory=directory)
    except ScenarioError as exc:
        click.echo(exc.render(), err=True)
        sys.exit(EXIT_BAD_INPUT)
    except BackendUnavailable as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    click.echo((Path(out) / "compare.md").read_text())
    click.echo(f"comparison: {out}")


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
    click.echo(f"removed {len(done.removed)} resource(s)")
    for item in done.removed:
        click.echo(f"  {item}")
    if done.kept:
        click.echo(f"kept {len(done.kept)} run(s)' resources:")
        for item in done.kept:
            click.echo(f"  {item}")


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

    try:
        out = build_report(path, per_run=per_run)
    except FileNotFoundError as exc:
        _fail(str(exc))
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
        options = {"mahimahi": lambda: {"downlink": downlink, "window_s": parse_duration(window or "1s"),
                                        "min_rate_bps": parse_rate(min_rate or "10kbit")},
                   "plato": lambda: {"length_s": parse_duration(length) if length else None}}.get(
            source, lambda: {"sample": sample, "seed": seed})()
        result = tracegen.convert(source, infile, out, **options)
    except ValueError as exc:  # TraceError names the file, line and field
        _fail(str(exc))
    click.echo(f"{out}: " + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))


@traces_group.command("generate")
@click.argument("kind", type=click.Choice(tracegen.GENERATORS))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--devices", type=click.IntRange(1), default=8, show_default=True)
@click.option("--duration", default="10min", show_default=True, help="Trace time covered.")
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
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1), help="Repetitions of each grid point (derived seeds).")
@click.option("--jobs", default=None, type=click.IntRange(1),
              help="Runs at once (default: CPU count / the heaviest run's summed device CPU quotas, at least 1).")
@click.option("--out", "directory", default=None, type=click.Path(file_okay=False),
              help="The sweep directory (default: runs/sweeps/<name>-<digest of scenario, overrides, grid, backend>).")
@click.option("--backend", type=click.Choice(backends.CHOICES), default=None, help="Overrides the scenario's backend.")
@set_option
@click.option("--no-fidelity", is_flag=True, help="Skip each run's fidelity check.")
@click.option("--no-report", is_flag=True, help="Do not write sweep.md, sweep.csv and the report at the end.")
def sweep(scenario_file, grid, repeat, jobs, directory, backend, overrides, no_fidelity, no_report):
    """Run a scenario over a grid of values, each point repeated; finished runs are reused on a rerun."""
    scenario, _, _ = _load(scenario_file, overrides)
    try:
        backend_name = backends.choose(backend or scenario.backend, say=_say).name
    except BackendUnavailable as exc:
        _fail(str(exc))
    try:
        spec = Sweep.from_options(scenario_file, grid, repeat=repeat, overrides=tuple(overrides), backend=backend_name,
                                  check_fidelity=not no_fidelity)
        spec.plan()  # every grid point checked before the directory is made
        _writable(directory or default_directory(spec), "--out")
        result = run_sweep(spec, directory or default_directory(spec), jobs=jobs, say=_say)
    except SweepError as exc:
        click.echo(exc.render(), err=True)
        sys.exit(EXIT_BAD_INPUT)
    failed = result.failed
    click.echo(f"sweep: {result.count('completed')}/{len(result.runs)} runs completed in {result.directory}")
    for entry in failed:
        click.echo(f"  {entry['run_id']}: {entry['status']}" + (f" ({entry['error']})" if entry.get("error") else ""))
    if not no_report and result.count("completed"):
        from analysis.report import build_report  # matplotlib and pandas: only when there is a report to draw

        click.echo(f"report: {build_report(result.directory) / 'report.html'} (table: {result.directory / 'sweep.md'})")
    if result.interrupted:
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_FAILED if failed else 0)


if __name__ == "__main__":
    main()
