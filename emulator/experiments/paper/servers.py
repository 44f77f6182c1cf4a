"""Compression or more servers (issue 30): dense ASGD with its model split over 1, 2 and 4 server
processes against AdaComp on one, on the same devices.

:func:`servers_table` reads the experiment's run records (one per run, :mod:`emulator.experiments.records`)
and answers the question from them: per method and number of servers, the update rate, the
ingress of the busiest server link and of all of them, the servers' CPU, and, paired by seed, each
dense configuration's update rate against AdaComp's with a Holm-adjusted verdict. The same
function renders the section of ``make figures`` (from the records the runs just wrote) and of
``make reproduction`` (from the committed ones).
"""

from __future__ import annotations

import math

from analysis.outcomes import adjust_family, mean_ci, paired_difference


def _servers(record: dict) -> int:
    return len(record["summary"].get("servers") or []) or 1


def _cell(values: list[float], spec: str) -> str:
    n, mean, half = mean_ci(values)
    if not n:
        return "-"
    return format(mean, spec) + ("" if math.isnan(half) else f" ± {half:{spec}}") + f" ({n})"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _per_run(record: dict) -> dict:
    """One completed run's rates: updates/s, ingress per second on the busiest server link and on all
    of them (payload), the servers' CPU (cores during training, and per update)."""
    s = record["summary"]
    duration = s.get("duration_s") or math.nan
    servers = s.get("servers") or [{"name": "server", "ingress_payload_bytes": s.get("ingress_payload_bytes") or 0}]
    ingress = [int(x.get("ingress_payload_bytes") or 0) for x in servers]
    cpu = record.get("server_cpu_s") or {}
    used = sum(cpu.values()) if len(cpu) == len(servers) else None  # every server sampled, or not told
    updates = s.get("updates_applied") or 0
    phases = record.get("step_phases") or {}
    return {"rate": s.get("updates_per_s"), "busiest": max(ingress) / duration / 1e6, "all": sum(ingress) / duration / 1e6,
            "cores": None if used is None else used / duration,
            "cpu_ms": None if used is None or not updates else 1000 * used / updates,
            **{key: phases.get(f"{key}_ms") for key in ("compute", "compress", "network")}}


def servers_table(records: list[dict]) -> list[str]:
    """The section's table and verdict (markdown lines) from the experiment's records."""
    done = [r for r in records if r["row"].get("status") == "completed"]
    labels = list(dict.fromkeys(r["label"] for r in records))
    lines = ["Per method and number of server processes, over its completed runs (mean ± 95 % Student-t half-width, "
             "n): server updates per second; payload the servers received per second of training, on the busiest "
             "server's link and on all of them; the server processes' CPU during training (cores, all servers; and "
             "milliseconds per update), from the containers' CPU counters; and a worker's step, wall milliseconds of "
             "its gradient, its compression and its exchange (push sent to the reply taken), averaged over every step.", "",
             "| method | servers | updates/s | busiest server link in (MB/s) | all server links in (MB/s) | "
             "server CPU (cores) | server CPU / update (ms) | worker step: gradient / compression / exchange (ms) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label in labels:
        runs = [_per_run(r) for r in done if r["label"] == label]
        servers = {_servers(r) for r in records if r["label"] == label}
        cells = [_cell([x[k] for x in runs if x[k] is not None], spec)
                 for k, spec in (("rate", ",.1f"), ("busiest", ".3f"), ("all", ".3f"), ("cores", ".2f"), ("cpu_ms", ".2f"))]
        step = [_mean([x[k] for x in runs if x[k] is not None]) for k in ("compute", "compress", "network")]
        cells.append(" / ".join("-" if v is None else f"{v:,.0f}" for v in step))
        lines.append(f"| `{label}` | {'/'.join(str(n) for n in sorted(servers))} | " + " | ".join(cells) + " |")
    return lines + ["", *_verdict(done)]


def server_load_table(records: list[dict]) -> list[str]:
    """Per method, what its runs asked of the server process (one server): the loops it ran (compiled
    or numpy, from its ``listening`` event), updates per second, its CPU during training against its
    quota, and per update; markdown lines, none when no record sampled the server's CPU."""
    done = [r for r in records if r["row"].get("status") == "completed" and _servers(r) == 1]
    if not any(r.get("server_cpu_s") for r in done):
        return []
    lines = ["The server process during training, per method over its completed runs (mean ± 95 % Student-t half-width, "
             "n): the loops it ran, updates per second, its CPU (cores, from the container's CPU counters) and the "
             "share of its CPU quota that is, and its CPU per applied update.", "",
             "| method | server loops | updates/s | server CPU (cores) | of its quota | server CPU / update (ms) |",
             "|---|---|---:|---:|---:|---:|"]
    for label in dict.fromkeys(r["label"] for r in done):
        mine = [r for r in done if r["label"] == label]
        runs = [_per_run(r) for r in mine]
        quota = [(r.get("plan") or {}).get("server", {}).get("cpus") for r in mine]
        share = [x["cores"] / q for x, q in zip(runs, quota) if x["cores"] is not None and q]
        loops = ", ".join(sorted({str(r["summary"].get("server_kernels") or "not recorded") for r in mine}))
        cells = [_cell([x[k] for x in runs if x[k] is not None], spec) for k, spec in (("rate", ",.1f"), ("cores", ".3f"))]
        cells += [_cell([100 * v for v in share], ".1f").replace(" (", " % (", 1) if share else "-",
                  _cell([x["cpu_ms"] for x in runs if x["cpu_ms"] is not None], ".3f")]
        lines.append(f"| `{label}` | {loops} | " + " | ".join(cells) + " |")
    return lines


def _count(servers: int) -> str:
    return f"{servers} server{'' if servers == 1 else 's'}"


def _verdict(done: list[dict]) -> list[str]:
    """Each dense configuration's update rate minus AdaComp's, paired by seed, Holm over the configurations."""
    adacomp = [r for r in done if r["summary"].get("compressor") == "adacomp" or r["label"].startswith("adacomp")]
    if not adacomp:
        return ["Verdict: no completed AdaComp run to compare with."]
    reference = adacomp[0]["label"]
    base = {r["seed"]: r["summary"].get("updates_per_s") for r in adacomp if r["label"] == reference}
    dense = sorted({(_servers(r), r["label"]) for r in done if r["label"] != reference})
    tests = []
    for servers, label in dense:
        pairs = [(r["summary"].get("updates_per_s"), base.get(r["seed"])) for r in done if r["label"] == label]
        tests.append({"servers": servers, "label": label, **paired_difference(pairs)})
    adjust_family(tests)
    lines = [f"Updates per second minus `{reference}`'s, paired by seed (Holm over the {len(tests)} configurations):", ""]
    for t in tests:
        if t["mean"] is None:
            lines.append(f"- `{t['label']}` ({t['servers']} server(s)): no paired runs")
            continue
        spread = "" if t["half_width"] is None else f" ± {t['half_width']:,.1f}"
        said = {"A better": "faster", "B better": "slower", "can't tell": "can't tell"}[t["verdict"]]
        p = "-" if t["p_holm"] is None else f"{t['p_holm']:.3g}"
        lines.append(f"- `{t['label']}` ({t['servers']} server(s)): {t['mean']:+,.1f}{spread} updates/s (n = {t['n']}), "
                     f"Holm p {p}: {said}")
    tested = [t for t in tests if t["p_holm"] is not None]  # two or more paired seeds
    untested = [t for t in tests if t["mean"] is not None and t["p_holm"] is None]
    enough = next((t for t in tested if t["verdict"] != "B better"), None)
    slower = [_count(t["servers"]) for t in tested if t["verdict"] == "B better" and enough and t["servers"] < enough["servers"]]
    if not tested:
        seeds = max((t["n"] or 0 for t in tests), default=0)
        answer = (f"can't tell: {seeds} paired seed(s) a configuration, too few for a paired test (the paper profile runs 3); "
                  "the differences above are not tested, and no number of servers is named.")
    elif enough is None:
        most = max((t["servers"] for t in tested), default=0)
        answer = (f"dense ASGD with up to {most} servers updated the model more slowly than AdaComp on one (every "
                  f"configuration slower at the family's level): no number of servers up to {most} matched it; whether more "
                  "would, these runs do not say (where each added server bought, the table above shows).")
    elif enough["verdict"] == "A better":
        fewer = f", and more slowly with {', '.join(slower)}" if slower else ""
        answer = (f"dense ASGD updated the model faster than AdaComp on one with {enough['servers']} servers "
                  f"(`{enough['label']}`){fewer}: {enough['servers']} server links and CPU quotas "
                  "against AdaComp's one, at the ingress and CPU above.")
    else:
        fewer = f"; with {', '.join(slower)} it was slower" if slower else ""
        answer = (f"with {_count(enough['servers'])} (`{enough['label']}`) dense ASGD was not shown slower than AdaComp on "
                  f"one, nor faster (can't tell at this number of seeds){fewer}. The fewest servers "
                  f"that may match AdaComp: {enough['servers']}, each a link and a CPU quota of its own.")
    if tested and untested:
        answer += (" Not tested, fewer than two paired seeds: " + ", ".join(f"`{t['label']}` (n = {t['n']})" for t in untested)
                   + "; the verdict leaves them out.")
    return lines + ["", "Verdict: " + answer]


__all__ = ["server_load_table", "servers_table"]
