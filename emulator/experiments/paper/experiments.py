"""The experiments of `make figures`, one function each, listed in :data:`EXPERIMENTS` in the order
they run. Each takes (profile, out, backend, dataset, say) and returns its :class:`Section`; the
driver turns an exception into a failed section, so one broken experiment never hides the
others' results nor passes for a result. A new experiment: a function here and its line in
:data:`EXPERIMENTS`.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis import figures
from analysis.runs import load_collection, load_run

from emulator.experiments.paper.availability import availability_experiment
from emulator.experiments.paper.plots import ingress_figure, method_figures, sweep_figures
from emulator.experiments.paper import steps
from emulator.experiments.paper.profiles import LINKS, PAPER, Profile
from emulator.experiments.paper.claims import c191_experiment, claim6_experiment, equal_step_experiment
from emulator.experiments.paper.steps import with_alpha
from emulator.experiments.paper.results import Section
from emulator.experiments.records import experiment_records
from emulator.experiments.paper.servers import servers_table
from emulator.experiments.paper.runner import (
    comparison_failures,
    run_comparison,
    run_failure,
    run_sweep_into,
)
from emulator.experiments.paper.tables import (
    authors_bytes,
    fmt,
    interval_cell,
    methods_section,
    negate,
    repeated_methods_section,
    sweep_section,
)


def alphas_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """The step-size grids: each method at each step of its own grid, paired seeds, at the length of
    the comparison it feeds. The methods comparison adds every method at the step chosen here."""
    grids = profile.step_grids()
    if not grids:
        return Section("Step size per method", ["Not in this profile."], [], "-")
    result = run_comparison("alphas", steps.grid_specs(grids), profile.overrides("alpha", dataset), profile.alpha_repeat,
                            out, backend, say, from_records=True)
    directory = Path(result["directory"])
    rows = result["table"]["methods"]
    choices = steps.choices(profile, rows, directory)
    failures = comparison_failures(result, "alpha grid")
    lines = steps.choice_table(grids, choices)
    body = [f"Each method at each step of its own grid, {profile.alpha_repeat} paired seed(s), on the devices and for the "
            "length of the methods comparison: final accuracy is the mean of each run's last evaluations, over the runs "
            "that trained. A step is chosen only if every repetition at it trained; the best such step, ties to the "
            "larger. A choice at either end of its grid is marked: the grid does not bracket it.", "", *lines]
    return Section("Step size per method", body, [], result["command"], failures, runs=[result["runs"]])


def methods_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    from analysis.byte_bases import real_gradient

    best, waiting = steps.settled_steps(profile, out)
    if waiting:
        return steps.waiting_section("Accuracy and bytes per method", "methods", waiting)
    specs = list(profile.methods)
    specs += [with_alpha(m, a) for m, a in best.items() if a != 0.1 and with_alpha(m, a) not in specs]
    layout, grads = real_gradient(dataset)

    def authors_of(run_dir: Path) -> dict:  # each run's record carries its push's size in the authors' format
        plan = run_dir / "plan.json"
        size = authors_bytes(json.loads(plan.read_text()).get("method", {}), layout, grads) if plan.exists() else None
        return {"authors_bytes_per_update": size} if size else {}

    # Each run is recorded as it ends and a run with a record is not made again: the 27 runs may take several sittings.
    methods = run_comparison("methods", specs, profile.overrides("methods", dataset), profile.repeat, out, backend, say,
                             from_records=True, record_extra=authors_of)
    labels, records = {row["method"] for row in methods["table"]["methods"]}, experiment_records(out / "records", "methods")
    authors: dict[str, int | None] = {}  # per method: as its records say, else from the plan a record keeps
    for record in records:
        if record["label"] in labels and not authors.get(record["label"]):
            authors[record["label"]] = (record.get("authors_bytes_per_update")
                                        or authors_bytes(record.get("plan", {}).get("method", {}), layout, grads))
    if methods["repeat"] > 1:
        body, failures = repeated_methods_section(methods, authors)
    else:
        body, failures = methods_section(methods, authors)
    body += ["", "The authors' format is their released code's message, a Python 2 pickle, for one push of the same "
             "method on a real batch-10 gradient (section below); its totals count each run's applied updates at that size."]
    return Section("Accuracy and bytes per method", body, method_figures(methods, out, records), methods["command"], failures,
                   runs=[methods["runs"]])


def staleness_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """Comp-c against AdaComp at each worker count: the delay d of applied updates, the share
    sigma / d AdaComp's rule divides by, and AdaComp's accuracy minus Comp-c's (paired)."""
    import pandas as pd

    from analysis.staleness import pooled_values, staleness_by_workers, staleness_figures

    if not profile.staleness_workers:
        return Section("Staleness against the number of workers", ["Not in this profile."], [], "-")
    base = profile.overrides("staleness", dataset)
    lines = ["| workers | method | runs | d: median | d: 95th pct | d: max | sigma / d: median | sigma = 0 (share of updates) |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    differences = ["", "AdaComp minus Comp-c, final accuracy, paired by seed (mean and 95 % Student-t interval):", "",
                   "| workers | difference | verdict |", "|---:|---|---|"]
    groups: dict[tuple[str, int], list] = {}
    failures, commands, counted = [], [], []
    for workers in profile.staleness_workers:
        devices = [f"workers[0].count={workers}"]
        if profile.staleness_total_cpus:
            devices.append(f"workers[0].cpus={profile.staleness_total_cpus / workers:g}")
        result = run_comparison(f"staleness-{workers}", list(profile.staleness_methods), [*base, *devices],
                                profile.staleness_repeat, out, backend, say)
        commands.append(result["command"])
        counted.append(result["runs"])
        directory = Path(result["directory"])
        for row in result["table"]["methods"]:
            why = run_failure(directory / row["run_id"])
            if why:
                failures.append(f"staleness ({workers} workers): {row['method']} ({row['run_id']}): {why}")
                continue
            groups.setdefault((row["method"], workers), []).append(load_run(directory / row["run_id"]).updates)
        for method in profile.staleness_methods:
            tables = groups.get((method, workers), [])
            if not tables:
                continue
            got = staleness_figures(pd.concat(tables, ignore_index=True))
            lines.append(f"| {workers} | {method} | {len(tables)} | {fmt(got['d_median'], '.0f')} | {fmt(got['d_p95'], '.0f')} | "
                         f"{got['d_max'] if got['d_max'] is not None else '-'} | {fmt(got['sigma_over_d_median'], '.3f')} | "
                         f"{fmt(got['sigma_zero_share'], '.2f')} |")
        for pair in result["table"].get("pairs", []):
            accuracy = pair["final_accuracy"]
            cell = (f"{accuracy['mean']:+.4f} ± {accuracy['half_width']:.4f} ({accuracy['n']})" if accuracy.get("half_width") is not None
                    else (f"{accuracy['mean']:+.4f} ({accuracy['n']})" if accuracy.get("mean") is not None else "-"))
            verdict = {"A better": f"{pair['a']} better", "B better": f"{pair['b']} better"}.get(accuracy["verdict"], accuracy["verdict"])
            differences.append(f"| {workers} | {pair['b']} - {pair['a']}: {negate(cell)} | {verdict} |")
    images = []
    fig = staleness_by_workers({point: pooled_values(tables) for point, tables in groups.items()})
    if fig is not None:
        figures.save(fig, out / "staleness_vs_workers.png")
        images.append("staleness_vs_workers.png")
    body = ["d: updates applied between a worker's pull and its push; sigma: per pushed coordinate, the updates that "
            "touched it in that window (AdaComp's divisor; recorded for AdaComp only); sigma / d near 0 means AdaComp's "
            "step is almost Comp-c's.", "", *lines, *differences]
    return Section("Staleness against the number of workers", body, images, " ; ".join(commands), failures, runs=counted)


def two_way_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """Beyond the paper: the model pull measured and compressed like the push. Per link profile and
    worker count, the methods with paired repeats: final accuracy and time to target (intervals),
    up / down / two-way bytes per update, and the server's CPU per update."""
    from analysis.runs import server_cpu_per_update, traffic_both_ways
    from analysis.sweep import mean_ci

    if not profile.two_way_workers:
        return Section("Both directions of traffic", ["Not in this profile."], [], "-")
    base = profile.overrides("two_way", dataset)
    body = ["The paper compressed the push only; after every push each worker pulled the whole model. Here the pull is "
            "dense (as the paper), a lossless delta (the coordinates changed since the worker's copy), or a delta with "
            "8-bit values and error compensation (`pull.values=q8`).", ""]
    failures, commands, images, counted = [], [], [], []
    for link in profile.two_way_links:
        title, link_sets = LINKS[link]
        for workers in profile.two_way_workers:
            result = run_comparison(f"two-way-{link}-{workers}", list(profile.two_way_methods),
                                    [*base, *link_sets, f"workers[0].count={workers}"], profile.two_way_repeat, out, backend, say)
            commands.append(result["command"])
            counted.append(result["runs"])
            directory = Path(result["directory"])
            body += [f"### {title}, {workers} workers", "",
                     "| method | final accuracy | time to target (s) | up B / update | down B / update | two-way B / update | "
                     "server CPU / update (ms) |", "|---|---|---|---:|---:|---:|---|"]
            per_second, cpu = {}, {}
            for row in result["table"]["methods"]:
                why = run_failure(directory / row["run_id"])
                if why:
                    failures.append(f"two-way ({title}, {workers} workers): {row['method']} ({row['run_id']}): {why}")
                    continue
                run = load_run(directory / row["run_id"])
                used = server_cpu_per_update(run.stats, run.summary.get("updates_applied"))
                cpu.setdefault(row["method"], []).append(None if used is None else used * 1000)
                per_second.setdefault(row["method"], traffic_both_ways(run.traffic))  # the first repetition's
            for entry in result["table"]["aggregate"]:
                n, mean, half = mean_ci(v for v in cpu.get(entry["method"], []) if v is not None)
                body.append(f"| {entry['method']}{(' (' + entry['flagged'] + ')') if entry.get('flagged') else ''} | "
                            f"{interval_cell(entry['final_accuracy'], '.4f')} | {interval_cell(entry['time_to_target'], '.1f')} | "
                            f"{interval_cell(entry['bytes_per_update'], ',.0f')} | "
                            f"{interval_cell(entry['down_bytes_per_update'], ',.0f')} | "
                            f"{interval_cell(entry['two_way_bytes_per_update'], ',.0f')} | "
                            f"{interval_cell({'n': n, 'mean': None if n == 0 else mean, 'half_width': None if half != half else half}, '.2f')} |")
            body.append("")
            fig = figures.traffic_both_ways(per_second)
            if fig is not None:
                name = f"two_way_{link}_{workers}.png"
                fig.axes[0].set_title(f"Traffic at the server, both directions: {title}, {workers} workers")
                figures.save(fig, out / name)
                images.append(name)
    body.append("Intervals: mean ± 95 % Student-t half-width over the paired repetitions (n); time to target over the runs that "
                "reached it (the target is 90 % of the best method's mean final accuracy in the same comparison). Paired "
                "differences with verdicts: each comparison's compare.md.")
    return Section("Both directions of traffic", body, images, " ; ".join(commands), failures, runs=counted)


def two_way_time_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """Beyond the paper: how much sooner AdaComp reaches the target with delta pulls than with dense
    ones on symmetric links, in runs long enough for both to get there; per repetition the ratio of
    the times (a bound where a run did not reach the target by its end)."""
    from emulator.experiments.compare import time_ratio_note

    if not profile.two_way_time_workers:
        return Section("Time to target with delta pulls", ["Not in this profile."], [], "-")
    title, link_sets = LINKS["symmetric"]
    base = profile.overrides("two_way_time", dataset)
    body, failures, commands, counted = [], [], [], []
    for workers in profile.two_way_time_workers:
        result = run_comparison(f"two-way-time-{workers}", list(profile.two_way_time_methods),
                                [*base, *link_sets, f"workers[0].count={workers}"], profile.two_way_time_repeat, out, backend, say)
        commands.append(result["command"])
        counted.append(result["runs"])
        table = result["table"]
        failures += comparison_failures(result, f"time to target ({workers} workers)")
        body += [f"### {title}, {workers} workers", "",
                 f"Target accuracy {table['target_accuracy']:.4f} ({table.get('target_rule') or 'given'}).", "",
                 "| method | final accuracy | time to target (s) | reached the target |", "|---|---|---|---|"]
        for entry in table["aggregate"]:
            body.append(f"| {entry['method']} | {interval_cell(entry['final_accuracy'], '.4f')} | "
                        f"{interval_cell(entry['time_to_target'], '.1f')} | {entry['reached_target']} of {entry['completed']} |")
        body.append("")
        for pair in table["pairs"]:
            time = pair["time_to_target"]
            body.append(f"- `{pair['a']}` - `{pair['b']}`, time to target: {interval_cell(time, '.1f')} s, {time['verdict']}")
            note = time_ratio_note(pair["a"], pair["b"], time.get("ratio") or [], always=True)
            if note:
                body.append(note)
        body.append("")
    body.append("Time to target: the first evaluation at or above the target (evaluations every few seconds, as the "
                "command says), so each time is an upper bound on the true one by up to one evaluation interval.")
    return Section("Time to target with delta pulls", body, [], " ; ".join(commands), failures, runs=counted)


def bytes_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """One push measured on both bases across c: no run, one real gradient of the paper's CNN."""
    from analysis.byte_bases import markdown, measure, real_gradient

    layout, grads = real_gradient(dataset)
    rows = measure(layout, grads)
    command = f"python -m analysis.byte_bases --dataset {dataset}"
    write_bytes_record(out, dataset, rows, command)
    body = [f"One batch-10 gradient of the paper's CNN on {dataset} at its initial weights, pushed dense and as "
            "top-k at each c, measured on the compact wire this emulator sends (the real codec and frame) and in the "
            "authors' own format (their 5-byte frame and Python 2 cPickle protocol 2 message, rebuilt byte for "
            "byte by analysis/byte_bases.py).", "", *markdown(rows)]
    return Section("Bytes per update on both bases", body, [], command)


def write_bytes_record(out: Path, dataset: str, rows: list, command: str) -> Path:
    """The bytes experiment's measurement as a record (``<out>/records/bytes/bytes.json.gz``): no run, one table."""
    from dataclasses import asdict

    from emulator.experiments.paper.runner import keep_commit, commit
    from emulator.experiments.records import record_path, write_record

    path = record_path(out / "records", "bytes", "bytes")
    return write_record(path, {"format": 1, "kind": "bytes", "experiment": "bytes", "label": None, "repeat": 0, "run_id": "bytes",
                               "seed": None, "dataset": dataset, "rows": [asdict(r) for r in rows], "row": {}, "summary": {},
                               "provenance": {"command": command, "commit": keep_commit(path, commit()), "grid": {}}})


def ingress_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    grid = ["workers[0].count=" + ",".join(map(str, profile.ingress_workers))]
    if not any(o.startswith("method") for o in profile.ingress_overrides):
        grid.append("method={name: asgd},{name: adacomp, c: 0.01}")
    overrides = profile.overrides("ingress", dataset)
    ingress = run_sweep_into("ingress", PAPER / "ingress.yaml", grid, overrides, out, backend, say, profile.sweep_repeat)
    collection = load_collection(ingress["directory"])
    images = []
    fig = ingress_figure(collection)
    if fig is not None:
        figures.save(fig, out / "ingress_vs_workers.png")
        images.append("ingress_vs_workers.png")
    body, failures = sweep_section(collection, list(collection.grid), "ingress")
    return Section("Server ingress against the number of workers", body, images, ingress["command"], failures,
                   runs=[ingress["runs"]])


def servers_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """Beyond the paper: compression or more servers. Dense ASGD with the model split over 1, 2 and 4
    server processes (each with the scenario's server CPU and link) against AdaComp on one, once per
    server link of ``profile.servers_links`` (uncapped; 200 Mbit/s in): ingress per server link,
    updates/s, servers' CPU, accuracy and time to target, paired seeds. The verdict: how many
    servers dense ASGD needs to match AdaComp's update rate, and what that costs in server links
    and server CPU."""
    if not profile.servers_methods:
        return Section("Compression or more servers", ["Not in this profile."], [], "-")
    body = ["Where the devices' dense pushes load one server, does splitting the model over more server processes "
            "(`server.shards`, balanced key ranges, each server with the scenario's server CPU and link) do what "
            "AdaComp's compression does?", ""]
    failures, commands, counted = [], [], []
    for suffix, link_sets in profile.servers_links:
        name = "servers" + (f"-{suffix}" if suffix else "")
        result = run_comparison(name, list(profile.servers_methods), [*profile.overrides("servers", dataset), *link_sets],
                                profile.servers_repeat, out, backend, say, from_records=True)
        commands.append(result["command"])
        counted.append(result["runs"])
        failures += comparison_failures(result, name)
        body += [f"### `{name}`: each server's link {'capped by ' + ', '.join(link_sets) if link_sets else 'as the scenario has it (uncapped)'}",
                 "", *servers_table(experiment_records(out / "records", name)), ""]
    return Section("Compression or more servers", body, [], " ; ".join(commands), failures, runs=counted)


def federated_specs(methods: tuple[str, ...], best: dict[str, float]) -> list[str]:
    """The federated comparison's method specs: a method the step grid covers runs at its chosen step,
    every other spec (the federated ones, with their own client step) as written."""
    return [with_alpha(method, best[method]) if method in best else method for method in methods]


def federated_experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
    """Beyond the paper: federated learning's methods on the same devices (docs/FEDERATED.md). FedAvg
    and FedBuff, dense and with top-k + error feedback and delta pulls, against AdaComp and ASGD, per
    link profile, paired seeds: final accuracy and time to target (intervals), bytes both ways per
    push and per round, and the accuracy against ingress bytes (each comparison's figure)."""
    if not profile.federated_methods:
        return Section("Federated methods", ["Not in this profile."], [], "-")
    best, waiting = steps.settled_steps(profile, out)
    if waiting:
        return steps.waiting_section("Federated methods", "federated", waiting)
    specs = federated_specs(profile.federated_methods, best)
    baselines = [spec for spec, method in zip(specs, profile.federated_methods) if method in best]
    base = profile.overrides("federated", dataset)
    body = ["FedAvg (synchronous rounds of sampled clients, a deadline for stragglers) and FedBuff (buffered "
            "asynchronous aggregation), each with H local steps a push, dense or with top-k + error feedback and delta "
            "pulls, against AdaComp and ASGD on the same devices. Bytes both ways are per worker push the server applied, for every "
            "method (a federated server step applies a round's pushes; bytes per round: the comparison's rounds table). ASGD and AdaComp run at the steps the "
            "`alphas` grid chose for them (" + ", ".join(f"`{spec}`" for spec in baselines) + "); the "
            "federated methods' client step is the one their specs name, not tuned.", ""]
    failures, commands, counted = [], [], []
    for link in profile.federated_links:
        title, link_sets = LINKS[link]
        result = run_comparison(f"federated-{link}", specs, [*base, *link_sets],
                                profile.federated_repeat, out, backend, say, from_records=True)
        commands.append(result["command"])
        counted.append(result["runs"])
        failures += comparison_failures(result, f"federated ({title})")
        body += [f"### {title}", "", "| method | final accuracy | time to target (s) | up B / push | "
                 "down B / push | two-way B / push |", "|---|---|---|---:|---:|---:|"]
        for entry in result["table"]["aggregate"]:
            body.append(f"| {entry['method']}{(' (' + entry['flagged'] + ')') if entry.get('flagged') else ''} | "
                        f"{interval_cell(entry['final_accuracy'], '.4f')} | {interval_cell(entry['time_to_target'], '.1f')} | "
                        f"{interval_cell(entry['bytes_per_update'], ',.0f')} | {interval_cell(entry['down_bytes_per_update'], ',.0f')} | "
                        f"{interval_cell(entry['two_way_bytes_per_update'], ',.0f')} |")
        body += ["", f"Rounds, accuracy against ingress bytes and the paired verdicts: {result['directory']}/compare.md.", ""]
    body.append("Intervals: mean ± 95 % Student-t half-width over the paired repetitions (n).")
    return Section("Federated methods", body, [], " ; ".join(commands), failures, runs=counted)


def _device_sweep(name: str, title: str, scenario: str, key: str, values: str):
    """One device setting swept over the profile's ``values`` (an attribute name), with its overrides."""

    def experiment(profile: Profile, out: Path, backend: str, dataset: str, say) -> Section:
        result = run_sweep_into(name, PAPER / scenario, [f"{key}={','.join(getattr(profile, values))}"],
                                profile.overrides(name, dataset), out, backend, say, profile.sweep_repeat)
        collection = load_collection(result["directory"])
        body, failures = sweep_section(collection, list(collection.grid), name)
        return Section(title, body, sweep_figures(name, collection, out, key), result["command"], failures,
                       runs=[result["runs"]])

    return experiment


EXPERIMENTS = {
    "bytes": bytes_experiment,
    "alphas": alphas_experiment,
    "methods": methods_experiment,
    "ingress": ingress_experiment,
    "heterogeneity": _device_sweep("heterogeneity", "Device CPU heterogeneity", "heterogeneity.yaml", "workers[0].cpus",
                                   "heterogeneity"),
    "crash": _device_sweep("crash", "Device crashes", "crash.yaml", "faults.crash.rate_per_hour", "crash_rates"),
    "staleness": staleness_experiment,
    "two_way": two_way_experiment,
    "two_way_time": two_way_time_experiment,
    "availability": availability_experiment,
    "claim6": claim6_experiment,
    "c191": c191_experiment,
    "equal_step": equal_step_experiment,
    "servers": servers_experiment,
    "federated": federated_experiment,
}
