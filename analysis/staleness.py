"""Where staleness lives: the delay d of applied updates and the share sigma / d that AdaComp sees.

AdaComp divides each coordinate's step by ``sigma``, the number of updates that touched that
coordinate since the worker pulled, where staleness-aware ASGD divides by the whole delay ``d``.
With sparse updates sigma is usually far below d, so AdaComp's rule only differs from Comp-c's
(no division) when d, and so the number of workers, is large. This module reduces the server's
``updates`` records (``staleness`` = d, ``sigma`` = the mean sigma over the pushed coordinates,
AdaComp runs only) to per-run figures, and draws d and sigma / d against the number of workers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis.figures import _legend


def staleness_figures(updates: pd.DataFrame) -> dict[str, float | int | None]:
    """Median, 95th percentile and maximum of d; for AdaComp the median and mean of sigma / d over
    the updates with d > 0, and the share of those whose pushed coordinates saw no other update."""
    d = pd.to_numeric(updates.get("staleness", pd.Series(dtype=float)), errors="coerce").dropna()
    out: dict[str, float | int | None] = {
        "updates": int(len(d)),
        "d_median": float(d.median()) if len(d) else None,
        "d_p95": float(np.percentile(d, 95)) if len(d) else None,
        "d_max": int(d.max()) if len(d) else None,
        "sigma_over_d_median": None, "sigma_over_d_mean": None, "sigma_zero_share": None,
    }
    if "sigma" in updates and len(d):
        both = updates[["staleness", "sigma"]].apply(pd.to_numeric, errors="coerce").dropna()
        both = both[both["staleness"] > 0]
        if len(both):
            share = both["sigma"] / both["staleness"]
            out.update(sigma_over_d_median=float(share.median()), sigma_over_d_mean=float(share.mean()),
                       sigma_zero_share=float((both["sigma"] == 0).mean()))
    return out


def staleness_by_workers(groups: Mapping[tuple[str, int], Mapping[str, np.ndarray]], styles=None) -> Figure | None:
    """d (left) and sigma / d (right) per method against the number of workers: the median of a
    point's values (its runs pooled: :func:`pooled_values` from update tables, or the records'
    histograms) and their 25th-75th percentile range as a bar; ``styles`` (label -> its
    :class:`analysis.figures.Styles` entry) keeps each method's colour from the other figures."""
    if not groups:
        return None
    fig = Figure(figsize=(10, 4.4), dpi=120, layout="constrained")
    left, right = fig.subplots(1, 2)
    methods = list(dict.fromkeys(method for method, _ in groups))
    workers = sorted({w for _, w in groups})
    for i, method in enumerate(methods):
        for ax, column in ((left, "staleness"), (right, "sigma_over_d")):
            xs, mid, low, high = [], [], [], []
            for w in workers:
                values = np.asarray(groups.get((method, w), {}).get(column, ()), float)
                if values.size == 0:
                    continue
                xs.append(w * (1 + 0.06 * (i - (len(methods) - 1) / 2)))  # side by side on the log axis
                q25, q50, q75 = np.percentile(values, [25, 50, 75])
                mid.append(q50)
                low.append(q50 - q25)
                high.append(q75 - q50)
            if xs:
                colour = styles(method)["color"] if styles else f"C{i % 10}"
                ax.errorbar(xs, mid, yerr=[low, high], marker="o", linestyle="-", capsize=4, color=colour, label=method)
    for ax, label in ((left, "staleness d (updates), median and IQR"), (right, "sigma / d (AdaComp), median and IQR")):
        ax.set_xscale("log", base=2)
        ax.set_xlim(min(workers) / 1.5, max(workers) * 1.5)  # room for the side-by-side offsets, even at one count
        ax.set_xticks(workers, [str(w) for w in workers])
        ax.set_xlabel("workers")
        ax.set_ylabel(label)
    left.set_title("Delay of applied updates")
    right.set_title("Share of the delay a sparse update sees")
    _legend(left, len(methods))
    return fig


def pooled_values(tables: Sequence[pd.DataFrame]) -> dict[str, np.ndarray]:
    """d and, where the tables have sigma, sigma / d (over d > 0) of the updates of several runs."""
    delays, shares = [], []
    for table in tables:
        if "staleness" in table:
            delays.append(pd.to_numeric(table["staleness"], errors="coerce").dropna().to_numpy())
        if "sigma" in table:
            both = table[["staleness", "sigma"]].apply(pd.to_numeric, errors="coerce").dropna()
            both = both[both["staleness"] > 0]
            shares.append((both["sigma"] / both["staleness"]).to_numpy())
    return {"staleness": np.concatenate(delays) if delays else np.array([]),
            "sigma_over_d": np.concatenate(shares) if shares else np.array([])}


__all__ = ["pooled_values", "staleness_by_workers", "staleness_figures"]
