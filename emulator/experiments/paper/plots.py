"""The driver's own figures (bytes per method, ingress against workers, a sweep's curves and shares);
the shared figure kinds are :mod:`analysis.figures`'."""

from __future__ import annotations

from pathlib import Path

from analysis import figures
from analysis.runs import accuracy_with_ingress, load_run, worker_shares

from emulator.experiments.paper.tables import dense_reference
from emulator.experiments.records import accuracy_table, staleness_rows


def method_figures(methods: dict, out: Path, records: list[dict] = ()) -> list[str]:
    """The methods comparison's figures, each run drawn from its directory, or from its record
    (``records``) where it was read from one (a run made in an earlier sitting)."""
    directory = Path(methods["directory"])
    recorded = {r["run_id"]: r for r in records}
    acc: dict[str, list] = {}  # method -> its runs' curves (repetitions: drawn as a mean and a band)
    ingress: dict[str, list] = {}
    updates: dict[str, list] = {}
    for row in methods["table"]["methods"]:
        label = row["method"]
        if (directory / row["run_id"] / "summary.json").exists():
            run = load_run(directory / row["run_id"])
            outcome = run.summary.get("outcome") or ("diverged" if run.summary.get("diverged") else None)
            curves = (run.accuracy.copy(), accuracy_with_ingress(run.accuracy, run.updates), run.updates)
        elif row["run_id"] in recorded:
            record = recorded[row["run_id"]]
            outcome, table = record["row"].get("outcome"), accuracy_table(record)
            curves = (table, table, staleness_rows(record))
        else:
            continue
        for into, curve in zip((acc, ingress, updates), curves):
            if into is not updates:
                curve.attrs["outcome"] = outcome  # the figures draw a diverged or dead run apart, to its last evaluation
            into.setdefault(label, []).append(curve)
    styles = figures.Styles(list(acc))
    made = []
    for name, fig in (("accuracy_vs_updates", figures.accuracy_vs_updates(acc, styles)),
                      ("accuracy_vs_time", figures.accuracy_vs_time(acc, styles)),
                      ("accuracy_vs_ingress", figures.accuracy_vs_ingress(ingress, styles)),
                      ("staleness", figures.staleness_histogram(updates)),
                      ("bytes_per_method", bytes_figure(methods["table"]["methods"]))):
        if fig is not None:
            figures.save(fig, out / f"{name}.png")
            made.append(f"{name}.png")
    return made


def bytes_figure(rows: list[dict]):
    from matplotlib.figure import Figure

    rows = list({r["method"]: r for r in rows if r.get("ingress_payload_bytes") and r.get("bytes_per_update")}.values())
    if not rows:  # one bar per method: a push's size does not change across repetitions
        return None
    fig = Figure(figsize=(8, 4.5), dpi=110)
    ax = fig.add_subplot()
    per_update = [r.get("bytes_per_update") or 0 for r in rows]
    bars = ax.bar([r["method"] for r in rows], per_update, color=[f"C{i % 10}" for i in range(len(rows))])
    ax.set_yscale("log")
    ax.set_ylabel("bytes per update received by the server (log)")
    ax.set_title("Worker-to-server bytes per update, measured")
    dense = dense_reference(rows)
    for bar, row in zip(bars, rows):
        label = f"{row['bytes_per_update']:,.0f} B"
        if dense and dense.get("bytes_per_update") and row is not dense:
            label += f"\n{dense['bytes_per_update'] / row['bytes_per_update']:.0f}x less"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize="small")
    ax.tick_params(axis="x", labelrotation=20)
    ax.margins(y=0.25)
    fig.tight_layout()
    return fig


def ingress_figure(collection):
    from matplotlib.figure import Figure

    table = collection.table()
    if table.empty:
        return None
    table = table[table["status"] == "completed"].copy()
    count_key = next(k for k in collection.grid if k.endswith("count"))
    method_key = next((k for k in collection.grid if k.startswith("method")), None)
    table["workers"] = table[count_key].astype(int)
    table["payload_rate"] = table["ingress_payload_bytes"] / table["duration_s"]
    table["wire_rate"] = table["ingress_wire_bytes"] / table["duration_s"]
    fig = Figure(figsize=(8, 4.5), dpi=110)
    ax = fig.add_subplot()
    groups = table.groupby(table["method"]) if method_key else [("asgd", table)]
    for i, (label, rows) in enumerate(groups):
        rows = rows.sort_values("workers")
        ax.plot(rows["workers"], rows["payload_rate"] * 8 / 1e6, marker="o", color=f"C{i}", label=f"{label}: payload")
        if rows["wire_rate"].notna().any():
            ax.plot(rows["workers"], rows["wire_rate"] * 8 / 1e6, marker="x", linestyle="--", color=f"C{i}", label=f"{label}: on the wire")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(table["workers"].unique()))
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(NullFormatter())
    rates = table["payload_rate"].dropna()
    log_y = len(rates) > 1 and rates.max() / max(rates.min(), 1e-9) > 20
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
    capacity = {((run.plan.get("server") or {}).get("link") or {}).get("downlink_bps") for run in collection.runs} - {None}
    for bps in sorted(capacity):  # what saturates dense ASGD's ingress
        ax.axhline(bps / 1e6, color="black", linewidth=1, linestyle="--", label=f"server link capacity ({bps / 1e6:g} Mbit/s)")
    ax.set_xlabel("workers")
    ax.set_ylabel("server ingress (Mbit/s" + (", log)" if log_y else ")"))
    ax.set_title("Ingress at the parameter server against the number of workers")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def sweep_figures(name: str, collection, out: Path, label_key: str) -> list[str]:
    """Accuracy over time per grid point, and the share of updates per worker of the last point."""
    curves, made = {}, []
    values = collection.values
    for run in collection.runs:
        if run.summary.get("status") != "completed":
            continue
        value = values.get(run.path.name, {}).get(label_key)
        curves.setdefault(f"{label_key.split('.')[-1]} = {value}", []).append(run.accuracy)
    fig = figures.accuracy_vs_time(curves, title=f"Test accuracy over time: {name}")
    if fig is not None:
        figures.save(fig, out / f"{name}_accuracy_vs_time.png")
        made.append(f"{name}_accuracy_vs_time.png")
    if collection.runs:
        last = collection.runs[-1]
        shares = worker_shares(last.updates, last.worker_names)
        cpus = {w["index"]: w["cpus"] for w in last.plan.get("workers", [])}
        value = values.get(last.path.name, {}).get(label_key)
        fig = figures.worker_share(shares, cpus=cpus, title=f"Share of applied updates per worker: run {last.run_id} "
                                   f"({label_key} = {value}, seed {last.plan.get('seed', last.summary.get('seed'))})")
        if fig is not None:
            figures.save(fig, out / f"{name}_worker_share.png")
            made.append(f"{name}_worker_share.png")
    return made
