"""Figures of runs and sweeps: one function per figure, tables in, a matplotlib Figure out.

Every function takes the tables of :mod:`analysis.runs` (or of :mod:`analysis.sweep`) and
returns a :class:`matplotlib.figure.Figure`, or ``None`` when its data is absent (no ``net``
stream on the local backend, no accuracy yet): callers skip what is ``None``. Figures are
built with the object API and rendered by Agg when saved (:func:`save`): no pyplot state, no
display needed, safe in threads and notebooks. Axes say their units; byte axes use the
tables' binary prefixes (KiB, MiB: 1,024-based), link rates bits/s as scenarios write them;
times are seconds since training started.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import (EngFormatter, Formatter, FuncFormatter, Locator, LogLocator, MaxNLocator, NullFormatter, NullLocator,
                               PercentFormatter)

SIZE = (8.0, 4.6)
DPI = 120
BOOT_MARGIN_S = 0.5  # rates over intervals that start earlier than this before training are boot, not training
MANY_DEVICES = 10  # above this many workers, workers are drawn as a median and a band
MAX_FAULT_LABELS = 24  # above this many faults, markers get a legend instead of labels
FAULT_COLORS = {
    "crash": "#d62728", "restart": "#2ca02c", "pause": "#ff7f0e", "resume": "#bcbd22",
    "partition": "#9467bd", "heal": "#17becf", "cpus": "#8c564b", "link": "#7f7f7f",
}
_BINARY = (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024))


class BinaryBytes(Formatter):
    """Byte tick labels in the tables' units (KiB, MiB, GiB: powers of 1,024, as
    :func:`emulator.planning.units.format_bytes` writes them), with as few decimals as keep
    neighbouring ticks apart: 8.5 MiB and 9.0 MiB, never "9 MiB, 9 MiB" for ticks that differ."""

    MAX_PLACES = 4

    def __init__(self, unit: str = "B", places: int = 0):
        self.unit, self.places = unit, places  # unit: B or B/s

    def _label(self, value: float, places: int, scale: tuple[str, int] | None = None) -> str:
        prefix, size = scale or next(((p, s) for p, s in _BINARY if abs(value) >= s), ("", 1))
        return f"{value / size:.{places}f} {prefix}{self.unit}"

    def __call__(self, value, pos=None):
        return self._label(value, self.places)

    def format_ticks(self, values):
        values = list(values)
        top = max((abs(v) for v in values), default=0)
        scale = next(((p, s) for p, s in _BINARY if top >= s), ("", 1))  # one prefix along a linear axis
        if any(v > 0 for v in values) and min(v for v in values if v > 0) * 1024 < top:
            scale = None  # a log axis spans prefixes: each label its own
        size = scale[1] if scale else None
        for places in range(self.places, self.MAX_PLACES + 1):
            labels = [self._label(v, places, scale) for v in values]
            exact = size is None or all(abs(round(v / size, places) - v / size) < 1e-6 for v in values)  # 0.25 is not "0.2"
            if len(set(labels)) == len(labels) and exact:
                return labels
        return labels


class BinaryTicks(Locator):
    """Linear-axis ticks at round multiples of the 1,024-based unit the axis spans (0, 256 KiB,
    512 KiB, ...; 0, 2 MiB, 4 MiB, ...), so that binary labels come out round."""

    def __call__(self):
        low, high = self.axis.get_view_interval()
        return self.tick_values(low, high)

    def tick_values(self, vmin, vmax):
        top = max(abs(vmin), abs(vmax))
        size = next((s for _, s in _BINARY if top >= s), 1)
        return MaxNLocator(nbins=6, steps=[1, 2, 4, 5, 10]).tick_values(vmin / size, vmax / size) * size


BYTES = BinaryBytes("B")
BYTE_RATE = BinaryBytes("B/s")


def bytes_axis(axis, formatter: BinaryBytes = BYTE_RATE, log_ticks: int = 10) -> None:
    """Label a byte (or byte-rate) axis in KiB/MiB/GiB, ticks at round binary multiples; a log
    axis gets at most ``log_ticks`` ticks at powers of 2 (1 KiB, 4 KiB, 16 KiB, ...)."""
    if axis.get_scale() == "log":
        axis.set_major_locator(LogLocator(base=2.0, numticks=log_ticks))
        axis.set_minor_locator(NullLocator())
        axis.set_minor_formatter(NullFormatter())
    else:
        axis.set_major_locator(BinaryTicks())
    axis.set_major_formatter(formatter)


# -- one style per method, in every figure ------------------------------------------------

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
           "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
# Distinct dash patterns: a method's step-size grid and its other run settings reach 8 variants in
# the paper profile's records, so 4 named styles had two of one method's lines drawn alike.
LINESTYLES = ("-", "--", ":", "-.", (0, (8, 2, 1, 2, 1, 2)), (0, (1, 3)), (0, (6, 1)), (0, (3, 1, 1, 1)),
              (0, (10, 4)), (0, (4, 2, 4, 6)), (0, (2, 1)), (0, (8, 2, 2, 2)))
MARKERS = ("o", "s", "^", "D", "v", "P")
# The paper's methods keep their colour in every figure; a setting of the run (``training.*``,
# e.g. the step size) is the line style. Methods not listed take the next free colour.
METHOD_COLOURS = {"asgd": 0, "comp_c:c=0.01": 1, "adacomp:c=0.01": 2, "adacomp:c=0.001": 3, "staleness_asgd": 4,
                  "comp_c:c=0.001": 5, "adacomp:c=0.0016": 6, "comp_c:c=0.0016": 7, "adacomp:c=0.0039": 8,
                  "comp_c:c=0.0039": 9}
DEFAULT_PARAMETERS = {"adacomp": "c=0.01", "comp_c": "c=0.01"}  # the presets' c, so a plain name shares its colour
RUN_SETTINGS = ("training", "dataset", "server", "evaluator", "workers", "faults")  # a method spec's keys that set the run
STOPPED_MARKER = "X"  # where a run that diverged or died was last evaluated


class Styles:
    """One colour, line style and marker per label (a method spec such as
    ``adacomp:c=0.01:training.learning_rate=0.005``), the same in every figure drawn with one
    instance, and different for different labels: the method (name and its own parameters) picks
    the colour, the run settings (keys with a dot) the line style."""

    def __init__(self, labels=()):
        self._styles: dict[str, dict] = {}
        self._colours: dict[str, int] = {}
        self._variants: dict[str, list[str]] = {}
        for label in labels:
            self(label)

    @staticmethod
    def split(label: str) -> tuple[str, str]:
        """(the method: name and its own parameters, the run's settings: ``training.*``, ``workers[0].*``, ...)."""
        def is_setting(part: str) -> bool:
            key = part.partition("=")[0]
            return "=" in part and key.split(".")[0].split("[")[0] in RUN_SETTINGS and key != key.split(".")[0]

        parts = str(label).split(":")
        method = [p for p in parts if not is_setting(p)]
        default = DEFAULT_PARAMETERS.get(method[0])
        if default and not any(p.startswith(default.split("=")[0] + "=") for p in method[1:]):
            method.insert(1, default)  # "adacomp" is "adacomp:c=0.01": one method, one colour
        return ":".join(method), ":".join(p for p in parts if is_setting(p))

    def __call__(self, label: str) -> dict:
        if label not in self._styles:
            method, settings = self.split(label)
            if method not in self._colours:
                taken = set(self._colours.values())
                pinned = METHOD_COLOURS.get(method)
                free = [i for i in range(len(PALETTE)) if i not in taken and i not in METHOD_COLOURS.values()]
                free = free or [i for i in range(len(PALETTE)) if i not in taken] or [len(self._colours) % len(PALETTE)]
                self._colours[method] = pinned if pinned is not None and pinned not in taken else free[0]
            variants = self._variants.setdefault(method, [])
            variants.append(settings)
            i = len(variants) - 1
            self._styles[label] = {"color": PALETTE[self._colours[method] % len(PALETTE)],
                                   "linestyle": LINESTYLES[i % len(LINESTYLES)], "marker": MARKERS[i % len(MARKERS)]}
        return dict(self._styles[label])


LEGEND_COLUMN_CHARS = 96 // 2  # a column of the legend below an 8-inch figure holds about this many characters ("small")


def wrap_label(label: str, width: int) -> str:
    """A method spec broken into lines of at most ``width`` characters at its ``:`` (a part longer
    than that stays whole on its own line): a federated spec is 120 characters, wider than a figure."""
    lines: list[str] = []
    for part in label.split(":"):
        if lines and len(lines[-1]) + 1 + len(part) <= width:
            lines[-1] += ":" + part
        else:
            lines.append(part if not lines else ":" + part)
    return "\n".join(lines)


def legend_columns(labels: Sequence[str], columns: int = 2) -> int:
    """As many columns as the longest line of a label lets fit across the figure (at least one): a
    label wider than its column would run off the figure's edge."""
    longest = max((len(line) for label in labels for line in label.splitlines()), default=0)
    return max(1, min(columns, len(labels), (2 * LEGEND_COLUMN_CHARS) // max(1, longest)))


def legend_below(fig: Figure, ax, columns: int = 2) -> None:
    """The legend under the plot, in at most ``columns`` columns, so it never covers a curve; a
    label wider than the figure is wrapped at its ``:``."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        labels = [wrap_label(label, 2 * LEGEND_COLUMN_CHARS) for label in labels]
        fig.legend(handles, labels, loc="outside lower center", ncols=legend_columns(labels, columns), fontsize="small",
                   frameon=False)


def _figure(title: str, size=SIZE) -> tuple[Figure, object]:
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    return fig, ax


def save(fig: Figure, path: str | Path) -> Path:
    """Write a figure as PNG (Agg) and return the path: the same figure gives the same bytes (no
    software version or date in the file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def _short(device: str) -> str:
    return device.replace("worker-", "w") if isinstance(device, str) else str(device)


def _curves(curves: Mapping[str, pd.DataFrame | Sequence[pd.DataFrame]]) -> list[tuple[str, list[pd.DataFrame]]]:
    """Normalise ``label -> table or tables`` (repetitions share a colour and one legend entry)."""
    out = []
    for label, value in curves.items():
        tables = [value] if isinstance(value, pd.DataFrame) else list(value)
        tables = [t for t in tables if t is not None and len(t)]
        if tables:
            out.append((label, tables))
    return out


def _legend(ax, count: int, outside: bool = False) -> None:
    """A legend inside for a few entries; outside on the right for many, or when ``outside``
    (figures whose fault labels run along the top)."""
    if count == 0:
        return
    if count > 8 or outside:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    else:
        ax.legend(fontsize="small", loc="best")


def _accuracy(curves, x: str, title: str, xlabel: str, log_x: bool = False, styles: Styles | None = None) -> Figure | None:
    """Accuracy against ``x``, one style per label (:class:`Styles`). A label's runs that trained are
    drawn as one line (one run) or their mean and 95 % band (several); a run whose table says
    ``attrs["outcome"]`` is diverged or dead is drawn on its own, thin, up to its last evaluation,
    which carries a cross. The figure says what the band is and over how many runs."""
    from emulator.control.summary import FLAGGED

    drawn = _curves(curves)
    if log_x:  # a log axis has no place for zero: curves without a positive x are not drawn
        drawn = [(label, tables) for label, tables in drawn if any((t[x] > 0).any() for t in tables)]
    if not drawn:
        return None
    styles = styles or Styles([label for label, _ in drawn])
    # room for the legend below; its labels gain a count such as " (mean of 10; 6 stopped)"
    rows = math.ceil(len(drawn) / legend_columns([label + " " * 24 for label, _ in drawn]))
    size = (SIZE[0], SIZE[1] + 0.25 * rows)
    fig, ax = _figure(title, size)
    banded = stopped = False
    counts = []
    for label, tables in drawn:
        style = styles(label)
        good = [t for t in tables if t.attrs.get("outcome") not in FLAGGED]
        bad = [t for t in tables if t.attrs.get("outcome") in FLAGGED]
        if len(good) > 1:  # repetitions: their mean and its 95 % band, not one line each
            counts.append(len(good))
            tag = f"{label} (mean of {len(good)}" + (f"; {len(bad)} stopped" if bad else "") + ")"
            banded = mean_band(ax, good, x, "accuracy", label=tag, color=style["color"], linestyle=style["linestyle"],
                               log_x=log_x, clip=(0.0, 1.0), tag_n=False) or banded
        elif good:
            rows = _rows(good[0], x, log_x)
            tag = label + (f" ({len(bad)} stopped)" if bad else "")
            ax.plot(rows[x], rows["accuracy"], marker=style["marker"], markersize=3, linewidth=1.4, color=style["color"],
                    linestyle=style["linestyle"], label=tag)
        for i, table in enumerate(bad):
            rows = _rows(table, x, log_x)
            if not len(rows):
                continue
            stopped = True
            tag = f"{label}: {len(bad)} diverged or dead" if not good and i == 0 else None
            ax.plot(rows[x], rows["accuracy"], linewidth=0.9, color=style["color"], linestyle=style["linestyle"], alpha=0.8,
                    label=tag)
            ax.plot(rows[x].iloc[-1:], rows["accuracy"].iloc[-1:], marker=STOPPED_MARKER, markersize=8, linestyle="none",
                    color=style["color"], markeredgecolor="black", markeredgewidth=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_ylim(0, 1)
    if log_x:
        _log_bytes(ax.xaxis, ax.set_xscale)
    else:  # at most six ticks, with thousands separators: 20,000 updates stay legible
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, pos: f"{v:,.0f}"))
    notes = []
    if banded:
        notes.append("line: mean of the runs that trained (n in the legend; past the shortest run, of those still "
                     "running); band: 95 % Student-t interval of that mean where 2 or more runs reach it, clipped to 0-100 %")
    if stopped:
        notes.append(f"thin line ending in {STOPPED_MARKER}: a run that diverged or died, drawn to its last evaluation")
    if notes:
        import textwrap

        ax.set_title(title, fontsize="medium", loc="center", pad=4 + 11 * len(textwrap.wrap(" ".join(notes), 120)))
        ax.text(0.5, 1.01, "\n".join(textwrap.wrap(". ".join(notes) + ".", 120)), transform=ax.transAxes, ha="center",
                va="bottom", fontsize="x-small", color="#333333")
    legend_below(fig, ax)
    return fig


def _rows(table: pd.DataFrame, x: str, log_x: bool) -> pd.DataFrame:
    rows = table.dropna(subset=[x, "accuracy"]).sort_values(x)
    return rows[rows[x] > 0] if log_x else rows


def _log_bytes(axis, set_scale) -> None:
    """A log byte axis labelled in KiB, MiB, GiB, at powers of 2."""
    set_scale("log")
    axis.axes.autoscale_view()  # the limits are computed lazily: settle them before the locator reads them
    bytes_axis(axis, BYTES)
    axis.set_tick_params(which="both", labelsize="small")


def accuracy_vs_time(curves: Mapping[str, pd.DataFrame | Sequence[pd.DataFrame]], styles: Styles | None = None,
                     title: str = "Test accuracy over time") -> Figure | None:
    """Test accuracy against training time; ``curves`` maps a label to accuracy table(s).

    Several tables under one label (repetitions) share its colour, in line styles solid, dashed,
    dotted, dash-dot; the same holds for the other accuracy figures. Name the experiment in
    ``title``: a title set afterwards would cover the note on what the band is.
    """
    return _accuracy(curves, "model_time_s", title, "training time of the evaluated snapshot (s)", styles=styles)


def accuracy_vs_updates(curves: Mapping[str, pd.DataFrame | Sequence[pd.DataFrame]], styles: Styles | None = None,
                        title: str = "Test accuracy over updates") -> Figure | None:
    """Test accuracy against the number of updates the server applied (model version)."""
    return _accuracy(curves, "version", title, "updates applied by the server", styles=styles)


def accuracy_vs_ingress(curves: Mapping[str, pd.DataFrame | Sequence[pd.DataFrame]], styles: Styles | None = None,
                        title: str = "Test accuracy against traffic received by the server") -> Figure | None:
    """Test accuracy against cumulative ingress at the server (log x): the paper's trade-off.

    Tables need ``ingress_bytes`` (see :func:`analysis.runs.accuracy_with_ingress`).
    """
    return _accuracy(curves, "ingress_bytes", title, "cumulative ingress payload at the server (bytes, log scale)", log_x=True,
                     styles=styles)


def _fault_markers(ax, faults: pd.DataFrame | None, x_range: tuple[float, float] | None = None) -> None:
    """Vertical lines at each fault, coloured by action; labelled ``crash w3`` when few."""
    if faults is None or faults.empty:
        return
    rows = faults.dropna(subset=["time_s"])
    if x_range is not None:
        rows = rows[(rows["time_s"] >= x_range[0]) & (rows["time_s"] <= x_range[1])]
    labelled = len(rows) <= MAX_FAULT_LABELS
    seen: set[str] = set()
    transform = ax.get_xaxis_transform()
    for _, row in rows.iterrows():
        action = str(row["action"])
        color = FAULT_COLORS.get(action, "black")
        legend = None if labelled or action in seen else f"fault: {action}"
        seen.add(action)
        ax.axvline(row["time_s"], color=color, linestyle="--", linewidth=1.0, alpha=0.85, label=legend)
        if labelled:
            ax.text(row["time_s"], 0.98, f" {action} {_short(row['target'])}", transform=transform, rotation=90,
                    va="top", ha="right", fontsize="x-small", color=color)


def ingress_rate(per_second: pd.DataFrame, faults: pd.DataFrame | None = None) -> Figure | None:
    """Server ingress per worker over time (stacked, bytes/s), fault events as labelled vertical lines.

    ``per_second`` is :func:`analysis.runs.ingress_per_second`: index seconds, one column per worker.
    """
    if per_second is None or per_second.empty or per_second.to_numpy().sum() == 0:
        return None
    fig, ax = _figure("Ingress at the server per worker")
    x = per_second.index.to_numpy(dtype=float) + 0.5  # the middle of each one-second bin
    columns = list(per_second.columns)
    many = len(columns) > 12
    ax.stackplot(x, per_second.to_numpy(dtype=float).T, labels=() if many else [f"worker {c}" for c in columns],
                 colors=[f"C{i % 10}" for i in range(len(columns))], alpha=0.85, linewidth=0)
    ax.plot(x, per_second.sum(axis=1), color="black", linewidth=1.0, label=f"total ({len(columns)} workers)")
    ax.set_xlim(min(0.0, x.min()), x.max())
    ax.set_ylim(0, per_second.sum(axis=1).max() * (1.25 if faults is not None and len(faults) else 1.05))
    _fault_markers(ax, faults, (x.min() - 1, x.max() + 1))
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("ingress rate (bytes/s, stacked)")
    bytes_axis(ax.yaxis)
    handles = ax.get_legend_handles_labels()[0]
    _legend(ax, len(handles), outside=faults is not None and len(faults) > 0)
    return fig


def traffic_both_ways(per_second: Mapping[str, pd.DataFrame]) -> Figure | None:
    """The server's ingress (pushes, solid) and egress (replies and pulls, dashed) per second of
    training, one colour per label (a method); tables from :func:`analysis.runs.traffic_both_ways`."""
    drawn = [(label, table) for label, table in per_second.items() if table is not None and len(table)]
    if not drawn:
        return None
    fig, ax = _figure("Traffic at the server, both directions")
    # Pulls come in bursts of whole models: a 5-second moving average shows the rate a link carries.
    drawn = [(label, table[["up", "down"]].rolling(5, min_periods=1, center=True).mean()) for label, table in drawn]
    for i, (label, table) in enumerate(drawn):
        color = f"C{i % 10}"
        ax.plot(table.index, table["up"], color=color, linewidth=1.4, label=f"{label}: workers to server")
        ax.plot(table.index, table["down"], color=color, linewidth=1.4, linestyle="--", label=f"{label}: server to workers")
    values = pd.concat([t[["up", "down"]] for _, t in drawn]).to_numpy().ravel()
    values = values[values > 0]
    if len(values) and values.max() / values.min() > 20:
        ax.set_yscale("log")  # a compressed push beside a dense pull: orders of magnitude apart
    bytes_axis(ax.yaxis)
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("bytes per second (5 s moving average)")
    _legend(ax, 2 * len(drawn), outside=len(drawn) > 2)
    return fig


def staleness_histogram(updates: Mapping[str, pd.DataFrame | Sequence[pd.DataFrame]]) -> Figure | None:
    """Distribution of update staleness (``t - t0``); one histogram per label (e.g. per method).

    One label: counts. Several: each label's fraction of its updates, as outlined steps.
    """
    drawn = [(label, pd.concat(tables)["staleness"].dropna().to_numpy()) for label, tables in _curves(updates)]
    drawn = [(label, values) for label, values in drawn if len(values)]
    if not drawn:
        return None
    fig, ax = _figure("Staleness of applied updates")
    everything = np.concatenate([values for _, values in drawn])
    top = int(max(np.ceil(np.percentile(everything, 99.5)), 1))  # a few very stale updates must not squash the rest
    if everything.max() <= max(1.5 * top, top + 10):
        top = int(everything.max())  # nothing far out: show it all
    beyond = int((everything > top).sum())
    bins = np.arange(-0.5, top + 1.5, max(1, math.ceil((top + 1) / 60)))
    if len(drawn) == 1:
        label, values = drawn[0]
        ax.hist(values, bins=bins, color="C0", edgecolor="white", linewidth=0.5)
        ax.set_ylabel("updates")
        ax.axvline(values.mean(), color="black", linestyle="--", linewidth=1, label=f"mean {values.mean():.1f}")
        ax.axvline(np.median(values), color="C3", linestyle=":", linewidth=1.5, label=f"median {np.median(values):g}")
        ax.legend(fontsize="small")
    else:
        for i, (label, values) in enumerate(drawn):
            weights = np.full(len(values), 1.0 / len(values))
            ax.hist(values, bins=bins, weights=weights, histtype="step", linewidth=1.6, color=f"C{i % 10}",
                    label=f"{label} (mean {values.mean():.1f})")
        ax.set_ylabel("fraction of updates")
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        _legend(ax, len(drawn))
    ax.set_xlabel("staleness (updates applied between a worker's pull and its push)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(-0.5, top + 0.5)
    if beyond:
        ax.text(0.99, 0.70, f"{beyond} update{'s' if beyond > 1 else ''} with staleness > {top}\nnot shown (max {int(everything.max())})",
                transform=ax.transAxes, ha="right", va="top", fontsize="x-small", color="gray")
    return fig


def worker_share(shares: pd.Series, groups: Mapping[int, str] | None = None, cpus: Mapping[int, float] | None = None,
                 bounds: Mapping[int, str] | None = None, title: str = "Share of applied updates per worker") -> Figure | None:
    """Each worker's share of the applied updates (bars, coloured by worker group), equal share dashed.

    ``groups`` colours the bars by worker group; under each worker's number (up to 20 workers),
    ``bounds`` says what bounded it (``downlink 95%``: :func:`analysis.bounds.short_label`), which
    is what explains unequal shares, else ``cpus`` its planned CPU quota. Workers in index order;
    a long ``title`` (one that names the run) is wrapped.
    """
    import textwrap

    if shares is None or shares.empty or shares.sum() == 0:
        return None
    shares = shares.sort_index()
    fig, ax = _figure("\n".join(textwrap.wrap(title, 100)))
    ax.title.set_fontsize("small")
    workers = list(shares.index)
    names = [(groups or {}).get(w, "workers") for w in workers]
    palette = {name: f"C{i % 10}" for i, name in enumerate(dict.fromkeys(names))}
    ax.bar(range(len(workers)), shares.to_numpy(), color=[palette[n] for n in names], width=0.8)
    if len(palette) > 1:
        for name, color in palette.items():
            ax.bar([np.nan], [np.nan], color=color, label=f"group {name}")  # one legend entry per group
    ax.axhline(1.0 / len(workers), color="black", linestyle="--", linewidth=1, label=f"equal share (1/{len(workers)})")
    under = (bounds, "what bounded it: the most used of CPU quota, uplink, downlink") if bounds else (
        {w: f"{c:.2g} cpu" for w, c in (cpus or {}).items()}, "planned CPU quota")
    labelled = bool(under[0]) and len(workers) <= 20
    ticks = [f"{w}\n" + under[0][w].replace(" ", "\n", 1) if labelled and w in under[0] else str(w) for w in workers]
    ax.set_xticks(range(len(workers)), ticks, fontsize="small" if len(workers) <= 30 else "xx-small",
                  rotation=0 if len(workers) <= 30 else 90)
    ax.set_xlabel("worker" + (f" ({under[1]})" if labelled else ""))
    ax.set_ylabel("share of applied updates")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0 if shares.max() >= 0.1 else 1))  # 64 workers: 1.6 %
    ax.legend(fontsize="small")
    return fig


def _device_lines(ax, rates: pd.DataFrame, column: str, quotas: Mapping[str, float] | None = None) -> None:
    """One line per device; many workers become their median and 10-90 % band."""
    devices = sorted(rates["device"].unique(), key=lambda d: (not str(d) == "server", not str(d) == "evaluator", _order(d)))
    workers = [d for d in devices if str(d).startswith("worker-")]
    others = [d for d in devices if d not in workers]
    banded = len(workers) > MANY_DEVICES
    for i, device in enumerate(others + ([] if banded else workers)):
        rows = rates[rates["device"] == device]
        color = f"C{i % 10}"
        ax.plot(rows["time_s"], rows[column], color=color, linewidth=1.3, label=str(device))
        if quotas and device in quotas and len(devices) <= 8:
            ax.axhline(quotas[device], color=color, linestyle=":", linewidth=1)
    if banded:
        table = rates[rates["device"].isin(workers)].assign(second=lambda f: f["time_s"].round())
        grouped = table.groupby("second")[column]
        ax.fill_between(grouped.quantile(0.1).index, grouped.quantile(0.1), grouped.quantile(0.9), color="C7", alpha=0.3,
                        label=f"workers, 10-90 % ({len(workers)})")
        ax.plot(grouped.median().index, grouped.median(), color="C7", linewidth=1.5, label="workers, median")
        limits = [quotas[w] for w in workers if quotas and w in quotas]
        if limits:
            ax.axhline(float(np.median(limits)), color="C7", linestyle=":", linewidth=1, label="workers' configured, median")


def _order(device) -> tuple:
    text = str(device)
    head, _, tail = text.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (text, -1)


def cpu_utilisation(stats: pd.DataFrame, quotas: Mapping[str, float] | None = None, faults: pd.DataFrame | None = None) -> Figure | None:
    """CPU used per device over time (cores: CPU-seconds per second), planned quotas dotted."""
    from analysis.runs import counter_rates

    if stats is None or stats.empty or stats["cpu_s"].notna().sum() == 0:
        return None
    rates = counter_rates(stats.dropna(subset=["cpu_s"]), "device", ("cpu_s",))
    rates = rates[rates["since_s"] >= -BOOT_MARGIN_S]  # boot (loading TensorFlow, unthrottled) is not the subject
    if rates.empty:
        return None
    fig, ax = _figure("CPU utilisation per device")
    _device_lines(ax, rates, "cpu_s_rate", quotas)
    _fault_markers(ax, faults, (rates["time_s"].min(), rates["time_s"].max()))
    ax.set_xlabel("training time (s)")
    ax.set_ylabel("CPU used (cores)" + (", quota dotted" if quotas and rates["device"].nunique() <= 8 else ""))
    ax.set_ylim(bottom=0)
    _legend(ax, len(ax.get_legend_handles_labels()[0]), outside=faults is not None and len(faults) > 0)
    return fig


def link_utilisation(net: pd.DataFrame, faults: pd.DataFrame | None = None,
                     configured: Mapping[str, Mapping[str, float | None]] | None = None) -> Figure | None:
    """Bytes per second on each device's interface, received (top) and sent (bottom); docker only.
    ``configured``: device -> ``{"uplink_bps", "downlink_bps"}`` (the plan's), drawn dotted as the
    byte rate each link allows (downlink on the received panel, uplink on the sent one)."""
    from analysis.runs import counter_rates

    if net is None or net.empty or net["rx_bytes"].notna().sum() == 0:
        return None
    rates = counter_rates(net.dropna(subset=["rx_bytes", "tx_bytes"]), "device", ("rx_bytes", "tx_bytes"))
    rates = rates[rates["since_s"] >= -BOOT_MARGIN_S]  # not the boot and the fidelity probes' bulk transfers
    if rates.empty:
        return None
    fig = Figure(figsize=(SIZE[0], SIZE[1] * 1.5), dpi=DPI, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax, column, what, key in ((top, "rx_bytes_rate", "received", "downlink_bps"), (bottom, "tx_bytes_rate", "sent", "uplink_bps")):
        ax.grid(True, alpha=0.3)
        limits = {device: link[key] / 8 for device, link in (configured or {}).items() if link.get(key)}
        _device_lines(ax, rates, column, limits)
        _fault_markers(ax, faults, (rates["time_s"].min(), rates["time_s"].max()))
        medians = rates[rates[column] > 0].groupby("device")[column].median()
        if len(medians) > 1 and medians.max() / medians.min() > 30:  # the server's dense models beside compressed updates
            ax.set_yscale("log")
            ax.set_ylabel(f"{what} (bytes/s, log scale)" + (", configured dotted" if limits else ""))
        else:
            ax.set_ylim(bottom=0)
            ax.set_ylabel(f"{what} (bytes/s)" + (", configured dotted" if limits else ""))
        bytes_axis(ax.yaxis)
    top.set_title("Link utilisation per device (network interface counters)")
    bottom.set_xlabel("training time (s)")
    _legend(top, len(top.get_legend_handles_labels()[0]), outside=faults is not None and len(faults) > 0)
    return fig


MAX_TRACED_LINKS = 4  # workers drawn in the traced-links figure (the first ones)


def traced_link_steps(plan: Mapping) -> dict[str, pd.DataFrame]:
    """Per worker whose link a trace drives (``link`` events of source ``trace`` in ``plan.json``),
    its configured rates over training time: ``time_s``, ``uplink_bps``, ``downlink_bps`` at time
    zero and at each change."""
    events = [e for e in plan.get("events", []) if e.get("source") == "trace" and e.get("action") == "link"]
    out = {}
    for worker in plan.get("workers", []):
        mine = [e for e in events if e["target"] == worker["name"]]
        if not mine:
            continue
        current = {"uplink_bps": worker["link"].get("uplink_bps"), "downlink_bps": worker["link"].get("downlink_bps")}
        rows = [{"time_s": 0.0, **current}]
        for event in sorted(mine, key=lambda e: e["time_s"]):
            current = {**current, **{k: v for k, v in event["params"].items() if k in current}}
            rows.append({"time_s": event["time_s"], **current})
        out[worker["name"]] = pd.DataFrame(rows)
    return out


def traced_links(plan: Mapping, net: pd.DataFrame | None) -> Figure | None:
    """Configured rate (the trace's steps, dashed) against the rate measured on the interface
    (solid), uplink (top) and downlink (bottom), for the first traced workers; docker only."""
    from analysis.runs import counter_rates

    steps = traced_link_steps(plan)
    if not steps or net is None or net.empty or net["rx_bytes"].notna().sum() == 0:
        return None
    rates = counter_rates(net.dropna(subset=["rx_bytes", "tx_bytes"]), "device", ("rx_bytes", "tx_bytes"))
    rates = rates[rates["since_s"] >= -BOOT_MARGIN_S]
    names = list(steps)[:MAX_TRACED_LINKS]
    if rates[rates["device"].isin(names)].empty:
        return None
    end = max(rates["time_s"].max(), max(float(steps[n]["time_s"].max()) for n in names))
    fig = Figure(figsize=(SIZE[0], SIZE[1] * 1.5), dpi=DPI, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax, key, column, what in ((top, "uplink_bps", "tx_bytes_rate", "uplink"), (bottom, "downlink_bps", "rx_bytes_rate", "downlink")):
        ax.grid(True, alpha=0.3)
        for i, name in enumerate(names):
            step = steps[name].dropna(subset=[key])
            if not step.empty:
                ax.step([*step["time_s"], end], [*step[key], step[key].iloc[-1]], where="post", linestyle="--", color=f"C{i}",
                        label=f"{name} configured")
            mine = rates[rates["device"] == name]
            ax.plot(mine["time_s"], mine[column] * 8, color=f"C{i}", label=f"{name} measured")
        ax.set_ylim(bottom=0)
        ax.set_ylabel(f"{what} (bits/s)")
        ax.yaxis.set_major_formatter(EngFormatter(unit="bit/s", places=1, sep=" "))
    top.set_title("Traced links: configured rate against the rate measured on the interface")
    bottom.set_xlabel("training time (s)")
    _legend(top, len(top.get_legend_handles_labels()[0]))
    return fig


# -- repetitions -------------------------------------------------------------------------


def mean_band(ax, runs: Sequence[pd.DataFrame], x: str, y: str, *, label: str | None = None, color: str | None = None,
              log_x: bool = False, confidence: float = 0.95, points: int = 100, linestyle: str = "-",
              clip: tuple[float, float] | None = None, tag_n: bool = True) -> bool:
    """Draw on ``ax`` the mean of ``y`` over ``runs`` (repetitions of one configuration) against
    ``x``, with its Student-t ``confidence`` interval shaded; returns whether anything was drawn.

    Repetitions evaluate at different ``x`` (bytes, seconds), so each run is interpolated linearly
    (in log x when ``log_x``, where ``x <= 0`` is left out) onto ``points`` common x values
    spanning all runs; at each of them the statistics use the runs whose own x range covers it.
    The mean is drawn where at least half of the runs do (a run that stopped early, e.g. diverged,
    does not end the line, but the mean past it is over fewer runs); the band where two or more
    do. A single run is drawn as its own line.
    """
    from analysis.sweep import mean_ci

    curves = []
    for table in runs:
        if table is None or x not in table or y not in table:
            continue
        rows = table.dropna(subset=[x, y])
        rows = rows[rows[x] > 0] if log_x else rows
        rows = rows.groupby(x, sort=True)[y].mean()  # one value per x: np.interp needs increasing x
        if len(rows):
            xs = rows.index.to_numpy(dtype=float)
            curves.append((np.log10(xs) if log_x else xs, rows.to_numpy(dtype=float)))
    if not curves:
        return False
    low, high = min(c[0][0] for c in curves), max(c[0][-1] for c in curves)
    grid = np.linspace(low, high, points) if high > low else np.array([low])
    values = np.full((len(curves), len(grid)), np.nan)
    for i, (xs, ys) in enumerate(curves):
        covered = (grid >= xs[0]) & (grid <= xs[-1])
        values[i, covered] = np.interp(grid[covered], xs, ys)
    stats = np.array([mean_ci(column, confidence) for column in values.T], dtype=float)  # n, mean, half-width
    drawn = stats[:, 0] >= max(1, math.ceil(len(curves) / 2))
    xs = 10 ** grid if log_x else grid
    line = ax.plot(np.where(drawn, xs, np.nan), np.where(drawn, stats[:, 1], np.nan), color=color, linewidth=1.6,
                   linestyle=linestyle,
                   label=label if len(curves) == 1 or not tag_n else f"{label} (mean of {len(curves)})" if label else None)[0]
    band = drawn & (stats[:, 0] >= 2)
    if band.any():
        low, high = stats[:, 1] - stats[:, 2], stats[:, 1] + stats[:, 2]
        if clip is not None:  # an interval of a bounded quantity stays inside its bounds
            low, high = np.clip(low, *clip), np.clip(high, *clip)
        ax.fill_between(xs, low, high, where=band, color=line.get_color(), alpha=0.2, linewidth=0)
    if log_x:
        ax.set_xscale("log")
    return True


# -- sweeps ------------------------------------------------------------------------------

METRIC_LABELS = {
    "final_accuracy": "final test accuracy",
    "ingress_payload_bytes": "ingress payload at the server (bytes)",
    "egress_payload_bytes": "egress payload from the server (bytes)",
    "two_way_bytes_per_update": "two-way bytes per update",
    "updates": "updates applied",
    "duration_s": "training time (s)",
}


def _is_numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def sweep_metric(aggregate: pd.DataFrame, x_key: str, metric: str, series_keys: Sequence[str] = ()) -> Figure | None:
    """Mean of ``metric`` against grid key ``x_key`` with 95 % confidence intervals as error bars.

    ``aggregate`` is :func:`analysis.sweep.aggregate`'s table (columns ``<metric>_mean`` and
    ``<metric>_ci95``). One line per combination of ``series_keys`` (e.g. ``method.name``).
    A numeric key gets a numeric axis; others (a CPU distribution, shown as its YAML text) one
    tick per value, in grid order.
    """
    mean, ci = f"{metric}_mean", f"{metric}_ci95"
    if aggregate is None or aggregate.empty or mean not in aggregate or aggregate[mean].notna().sum() == 0:
        return None
    name = METRIC_LABELS.get(metric, metric)
    fig, ax = _figure(f"{name[0].upper()}{name[1:]} against {x_key}")
    x_values = list(dict.fromkeys(aggregate[x_key].tolist()))
    numeric = _is_numeric(x_values)
    position = {v: (v if numeric else i) for i, v in enumerate(x_values)}
    groups = aggregate.groupby(list(series_keys), sort=False, dropna=False) if series_keys else [((), aggregate)]
    groups = list(groups)
    width = 0.0 if numeric else min(0.08, 0.4 / max(1, len(groups)))  # side by side, so that error bars do not hide each other
    for i, (key, rows) in enumerate(groups):
        key = key if isinstance(key, tuple) else (key,)
        text = ", ".join(f"{k}={v}" for k, v in zip(series_keys, key)) or metric
        offset = (i - (len(groups) - 1) / 2) * width
        xs = np.array([position[v] for v in rows[x_key]], dtype=float) + offset
        order = np.argsort(xs)
        yerr = rows[ci].fillna(0).to_numpy() if ci in rows else None
        # Categories (CPU distributions, method names) are points: a line between them would claim an order.
        ax.errorbar(xs[order], rows[mean].to_numpy()[order], yerr=None if yerr is None else yerr[order], marker="o",
                    capsize=4, linewidth=1.5, linestyle="-" if numeric else "none", color=f"C{i % 10}", label=text)
    if not numeric:
        ax.set_xticks(range(len(x_values)), [str(v) for v in x_values], fontsize="small")
    ax.set_xlabel(x_key)
    ax.set_ylabel(f"{name}, mean and 95 % CI")
    if metric == "final_accuracy":
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        low, high = ax.get_ylim()
        ax.set_ylim(max(0.0, low), min(1.0, high))  # an interval past 0 % or 100 % runs off the chart
    if metric.endswith("_bytes"):
        values = aggregate[mean].dropna()
        if len(values) and values.min() > 0 and values.max() / values.min() > 20:
            _log_bytes(ax.yaxis, ax.set_yscale)
        else:
            bytes_axis(ax.yaxis, BYTES)
    n = aggregate["n"] if "n" in aggregate else pd.Series(dtype=float)
    if len(n) and n.max() < 2:
        ax.text(0.99, 0.02, "one repetition per point: no interval", transform=ax.transAxes, ha="right",
                va="bottom", fontsize="x-small", color="gray")
    if series_keys:
        _legend(ax, len(groups))
    return fig


__all__ = [
    "accuracy_vs_ingress", "accuracy_vs_time", "accuracy_vs_updates", "bytes_axis", "cpu_utilisation", "ingress_rate",
    "link_utilisation", "mean_band", "Styles", "legend_below", "legend_columns", "save", "wrap_label", "staleness_histogram", "sweep_metric", "traffic_both_ways", "worker_share",
]
