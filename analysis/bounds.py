"""What bounded each worker: the share of its CPU quota, its uplink and its downlink that it used
over training, measured, and the largest of them.

A worker trains, pushes and pulls in turn; the resource it used most of is what held its rate
down. Shares come from the run's own records: CPU seconds (``stats.jsonl``) over the training
time times the quota, and the bytes the server received from it and sent it (``traffic.jsonl``:
payload with the protocol's headers, below what the link carries by TCP/IP's) over the
training time times the configured rate. When none reaches :data:`BUSY` the worker mostly
waited: on the server (its queue, its own link), which is then named.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.runs import Run

BUSY = 0.5  # a share at or above this is what bounded the worker; below for all, it waited on the server
RESOURCES = (("cpu_share", "CPU"), ("up_share", "uplink"), ("down_share", "downlink"))


def _training_s(run: Run) -> float | None:
    duration = run.summary.get("duration_s")
    if isinstance(duration, (int, float)) and duration > 0:
        return float(duration)
    updates = run.updates["time_s"].dropna()
    return float(updates.max()) if len(updates) and updates.max() > 0 else None


def _cpu_used(stats: pd.DataFrame, device: str, end_s: float) -> float | None:
    """CPU seconds the device used between the start of training and ``end_s``."""
    rows = stats[(stats["device"] == device)].dropna(subset=["cpu_s"]).sort_values("time_s")
    inside = rows[(rows["time_s"] >= 0) & (rows["time_s"] <= end_s + 1.0)]
    before = rows[rows["time_s"] < 0]
    if len(inside) < 1:
        return None
    first = before["cpu_s"].iloc[-1] if len(before) else inside["cpu_s"].iloc[0]
    return max(0.0, float(inside["cpu_s"].iloc[-1] - first))


def worker_bounds(run: Run) -> pd.DataFrame:
    """One row per worker of the plan: its quota and link as planned, the share of each it used
    (None: not measured, or unshaped), and ``bound``: ``CPU``, ``uplink``, ``downlink`` or ``server``."""
    columns = ["worker", "device", "group", "cpus", "cpu_share", "uplink_bps", "up_share", "downlink_bps", "down_share", "bound"]
    seconds = _training_s(run)
    workers = run.plan.get("workers", [])
    if not workers or not seconds:
        return pd.DataFrame(columns=columns)
    traffic = run.traffic[(run.traffic["time_s"] >= 0) & (run.traffic["time_s"] <= seconds + 1.0)]
    sent = traffic.groupby("worker")["ingress_bytes"].sum() if len(traffic) else pd.Series(dtype=float)
    received = traffic.groupby("worker")["egress_bytes"].sum() if len(traffic) else pd.Series(dtype=float)
    rows = []
    for w in workers:
        link = w.get("link") or {}
        cpu = _cpu_used(run.stats, w["name"], seconds) if len(run.stats) else None
        up, down = link.get("uplink_bps"), link.get("downlink_bps")
        row = {"worker": w["index"], "device": w["name"], "group": w.get("group"), "cpus": w.get("cpus"),
               "cpu_share": cpu / (seconds * w["cpus"]) if cpu is not None and w.get("cpus") else None,
               "uplink_bps": up, "up_share": sent.get(w["index"], 0.0) * 8 / (seconds * up) if up else None,
               "downlink_bps": down, "down_share": received.get(w["index"], 0.0) * 8 / (seconds * down) if down else None}
        row["bound"] = bound(row)
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def bound(row: dict) -> str:
    """The resource with the largest measured share, if it reaches :data:`BUSY`; else ``server``."""
    shares = [(row.get(key), name) for key, name in RESOURCES
              if isinstance(row.get(key), (int, float)) and not math.isnan(row.get(key))]
    if not shares:
        return "unknown"
    share, name = max(shares)
    return name if share >= BUSY else "server"


def short_label(row: dict) -> str:
    """``downlink 95%``, ``CPU 88%`` or ``server``: for a figure's tick."""
    key = {name: key for key, name in RESOURCES}.get(row["bound"])
    return f"{row['bound']} {row[key]:.0%}" if key and row.get(key) is not None else row["bound"]


__all__ = ["BUSY", "bound", "short_label", "worker_bounds"]
