"""Trace loading, derived tables, figures and reports, on run directories written by the tests themselves.

:func:`support.runs.write_synthetic_run` writes the run directories these tests read.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import figures
from support.runs import START_TS, write_synthetic_run
from analysis.report import build_report, render_html, render_markdown, Block
from analysis.runs import (
    accuracy_with_ingress, counter_rates, faults, ingress_per_second, load_accuracy, load_collection, load_events,
    load_net, load_run, load_stream, load_updates, summary_row, training_start_ts, worker_shares,
)

@pytest.fixture
def run_dir(tmp_path) -> Path:
    return write_synthetic_run(tmp_path / "20261202-120000-synthetic-abcd")


# -- loaders -----------------------------------------------------------------------------


def test_times_are_relative_to_the_start_of_training(run_dir):
    updates = load_updates(run_dir)
    assert training_start_ts(run_dir) == START_TS
    assert np.allclose(updates["time_s"], updates["ts"] - START_TS)
    assert updates["time_s"].iloc[0] == pytest.approx(0.1)
    assert list(updates["t"]) == list(range(1, 61))
    assert updates["cum_bytes"].iloc[-1] == 60 * 2_000
    accuracy = load_accuracy(run_dir)
    assert np.allclose(accuracy["model_time_s"], accuracy["model_ts"] - START_TS)


def test_a_missing_stream_is_an_empty_table_with_its_columns(run_dir):
    (run_dir / "net.jsonl").unlink()
    net = load_net(run_dir)
    assert net.empty and {"ts", "time_s", "device", "rx_bytes", "tx_bytes"} <= set(net.columns)
    with pytest.raises(ValueError, match="unknown stream"):
        load_stream(run_dir, "nonsense")


def test_a_cut_off_last_line_is_skipped_with_a_warning(run_dir):
    complete = len(load_updates(run_dir))
    with open(run_dir / "updates.jsonl", "a") as fh:
        fh.write('{"t":61,"worker":0,"t0":')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        updates = load_updates(run_dir)
    assert len(updates) == complete
    assert any("incomplete" in str(w.message) for w in caught)


def test_a_run_killed_before_its_summary_is_rebuilt_from_its_traces(tmp_path):
    run = load_run(write_synthetic_run(tmp_path / "killed", with_summary=False))
    assert run.start_ts == START_TS  # from the controller's training_started event
    row = summary_row(run)
    assert row["status"] == "incomplete"
    assert row["method"] == "adacomp" and row["workers"] == 3 and row["updates"] == 60
    assert row["ingress_payload_bytes"] == run.traffic["ingress_bytes"].sum()
    assert row["final_accuracy"] == run.accuracy["accuracy"].iloc[-1]
    assert row["faults"] == {"crash": 1, "restart": 1}


def test_a_directory_that_is_not_a_run_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_collection(tmp_path)


def test_faults_are_the_fault_events(run_dir):
    rows = faults(load_events(run_dir))
    assert list(rows["action"]) == ["crash", "restart"]
    assert list(rows["target"]) == ["worker-1", "worker-1"]
    assert rows["time_s"].tolist() == pytest.approx([2.0, 3.5])


def test_a_folder_of_runs_is_a_collection(tmp_path):
    for i, method in enumerate(("asgd", "adacomp")):
        write_synthetic_run(tmp_path / f"run-{method}", method=method, seed=i)
    (tmp_path / "notes").mkdir()  # not a run: ignored
    c = load_collection(tmp_path)
    assert not c.is_sweep and [r.method for r in c.runs] == ["adacomp", "asgd"]
    assert list(c.table()["method"]) == ["adacomp", "asgd"]


# -- derived tables: properties ----------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=50), st.data())
def test_ingress_at_a_version_is_the_bytes_of_the_updates_up_to_it(sizes, data):
    updates = pd.DataFrame({"t": range(1, len(sizes) + 1), "bytes": sizes})
    versions = sorted(data.draw(st.lists(st.integers(0, len(sizes)), min_size=1, max_size=10)))
    accuracy = pd.DataFrame({"version": versions, "accuracy": 0.5})
    out = accuracy_with_ingress(accuracy, updates.sample(frac=1, random_state=0))  # order of rows does not matter
    assert out["ingress_bytes"].tolist() == [sum(sizes[:v]) for v in versions]
    assert out["ingress_bytes"].is_monotonic_increasing


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(0, 30), st.integers(0, 10**6)), max_size=60))
def test_ingress_per_second_keeps_every_byte_and_fills_silent_seconds(records):
    traffic = pd.DataFrame(records, columns=["worker", "time_s", "ingress_bytes"])
    table = ingress_per_second(traffic, workers=[0, 1, 2, 3, 4])
    assert table.to_numpy().sum() == traffic["ingress_bytes"].sum()
    assert list(table.columns) == [0, 1, 2, 3, 4]
    if len(table):
        assert list(table.index) == list(range(table.index.min(), table.index.max() + 1))


def test_ingress_per_second_ignores_the_evaluator_connection(run_dir):
    run = load_run(run_dir)
    table = ingress_per_second(run.traffic, run.worker_names)
    assert list(table.columns) == [0, 1, 2]
    assert table.to_numpy().sum() == run.updates["bytes"].sum()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 100), min_size=2, max_size=30))
def test_counter_rates_are_the_slopes_and_skip_resets(increments):
    cumulative = np.cumsum(increments)
    frame = pd.DataFrame({"ts": np.arange(len(increments), dtype=float) * 2.0, "device": "d", "cpu_s": cumulative})
    frame["time_s"] = frame["ts"]
    rates = counter_rates(frame, "device", ("cpu_s",))
    assert rates["cpu_s_rate"].to_numpy() == pytest.approx(np.asarray(increments[1:]) / 2.0)
    reset = frame.copy()
    reset.loc[len(reset) // 2:, "cpu_s"] -= cumulative[len(reset) // 2] + 1  # a restarted process
    rates = counter_rates(reset, "device", ("cpu_s",))
    assert rates["cpu_s_rate"].dropna().ge(0).all() and rates["cpu_s_rate"].isna().sum() == 1


def test_counter_rates_skip_samples_too_close_to_the_previous_one():
    frame = pd.DataFrame({"ts": [0.0, 0.04, 1.0, 2.0], "device": "server", "rx_bytes": [0, 1_000_000, 1_500_000, 2_500_000]})
    frame["time_s"] = frame["ts"] - 0.5
    rates = counter_rates(frame, "device", ("rx_bytes",))
    assert rates["rx_bytes_rate"].tolist() == [1_500_000, 1_000_000]  # not 25 MB/s over the 40 ms interval
    assert rates["since_s"].tolist() == [-0.5, 0.5] and rates["time_s"].tolist() == [0.5, 1.5]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=100))
def test_worker_shares_sum_to_one_and_include_idle_workers(workers):
    shares = worker_shares(pd.DataFrame({"worker": workers}), workers=list(range(8)))
    assert list(shares.index) == list(range(8))
    assert shares.sum() == pytest.approx(1.0)
    assert shares[7] == 0.0


# -- figures -----------------------------------------------------------------------------


def test_every_figure_draws_from_a_run_and_returns_none_without_data(run_dir, tmp_path):
    run = load_run(run_dir)
    acc = accuracy_with_ingress(run.accuracy, run.updates)
    quotas = {d["name"]: d["cpus"] for d in [run.plan["server"], run.plan["evaluator"], *run.plan["workers"]]}
    drawn = {
        "accuracy_time": figures.accuracy_vs_time({"adacomp": acc}),
        "accuracy_updates": figures.accuracy_vs_updates({"adacomp": acc}),
        "accuracy_ingress": figures.accuracy_vs_ingress({"adacomp": acc}),
        "ingress": figures.ingress_rate(ingress_per_second(run.traffic, run.worker_names), run.faults),
        "staleness": figures.staleness_histogram({"adacomp": run.updates}),
        "share": figures.worker_share(worker_shares(run.updates, run.worker_names), {0: "slow", 1: "fast", 2: "fast"}),
        "cpu": figures.cpu_utilisation(run.stats, quotas, run.faults),
        "link": figures.link_utilisation(run.net, run.faults),
    }
    for name, fig in drawn.items():
        assert fig is not None, name
        for ax in fig.axes:
            if ax.get_visible() and ax.has_data():
                assert ax.get_xlabel() or ax.get_ylabel(), f"{name}: unlabelled axes"
        path = figures.save(fig, tmp_path / f"{name}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000
    ax = drawn["ingress"].axes[0]
    assert {"crash w1", "restart w1"} <= {t.get_text().strip() for t in ax.texts}
    assert drawn["accuracy_ingress"].axes[0].get_xscale() == "log"
    empty = pd.DataFrame(columns=["time_s", "version", "accuracy", "ingress_bytes", "staleness", "device", "cpu_s", "rx_bytes", "tx_bytes"])
    assert figures.accuracy_vs_time({"x": empty}) is None
    assert figures.accuracy_vs_ingress({}) is None
    assert figures.staleness_histogram({"x": empty}) is None
    assert figures.cpu_utilisation(empty) is None
    assert figures.link_utilisation(empty) is None
    assert figures.ingress_rate(pd.DataFrame()) is None
    assert figures.worker_share(pd.Series(dtype=float)) is None


def test_staleness_histograms_of_several_methods_are_fractions(tmp_path):
    tables = {m: load_updates(write_synthetic_run(tmp_path / m, method=m, seed=i)) for i, m in enumerate(("asgd", "adacomp"))}
    fig = figures.staleness_histogram(tables)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert [l.split(" (")[0] for l in labels] == ["asgd", "adacomp"]
    assert fig.axes[0].get_ylabel() == "fraction of updates"


def test_many_workers_are_drawn_as_a_band(tmp_path):
    run = load_run(write_synthetic_run(tmp_path / "many", workers=14))
    fig = figures.cpu_utilisation(run.stats)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "workers, median" in labels and not any(l.startswith("worker-") for l in labels)


# -- reports -----------------------------------------------------------------------------


def test_the_report_of_a_run_has_its_table_and_every_figure(run_dir):
    out = build_report(run_dir)
    assert out == run_dir / "report"
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(["accuracy_ingress.png", "accuracy_time.png", "accuracy_updates.png", "ingress_rate.png",
                           "traffic_both_ways.png", "staleness.png", "worker_share.png", "cpu.png", "link.png"])
    md = (out / "report.md").read_text()
    assert ("| run | status | method | workers | final accuracy | updates | ingress payload | ingress on wire | egress payload | "
            "egress on wire | two-way / update | duration | faults |") in md
    assert "| completed | adacomp | 3 | 0.8602 | 60 | 117.19 KiB (120,000 B) |" in md and "crash 1, restart 1" in md
    html = (out / "report.html").read_text()
    for png in pngs:
        assert f"]({png})" in md and f'src="{png}"' in html
    assert "<table>" in html and "adacomp" in html


def test_a_local_run_report_says_why_link_utilisation_is_missing(tmp_path):
    out = build_report(write_synthetic_run(tmp_path / "local-run", backend="local"))
    assert not (out / "link.png").exists()
    assert "net.jsonl is written by the docker backend only" in (out / "report.md").read_text()


def test_a_rebuilt_report_drops_figures_it_no_longer_draws(run_dir):
    out = build_report(run_dir)
    assert (out / "link.png").exists()
    (run_dir / "net.jsonl").unlink()
    build_report(run_dir)
    assert not (out / "link.png").exists()


def test_a_folder_report_overlays_its_runs(tmp_path):
    for i, method in enumerate(("asgd", "adacomp")):
        write_synthetic_run(tmp_path / f"run-{method}", method=method, seed=i)
    out = build_report(tmp_path)
    md = (out / "report.md").read_text()
    assert "run-asgd" in md and "run-adacomp" in md
    assert {"accuracy_ingress.png", "staleness.png"} <= {p.name for p in out.glob("*.png")}


def test_the_report_command_writes_the_report_and_refuses_other_folders(run_dir, tmp_path):
    from click.testing import CliRunner

    from emulator.cli import main

    result = CliRunner().invoke(main, ["report", str(run_dir)])
    assert result.exit_code == 0 and str(run_dir / "report" / "report.html") in result.output
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["report", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "neither a run directory, a sweep directory, nor a folder of runs" in result.output


def test_html_escapes_what_it_shows():
    page = render_html([Block("p", "a <b> & `code` [link](x.html)"), Block("table", headers=("<h>",), rows=(("<c>",),))], "t<")
    assert "a &lt;b&gt; &amp; <code>code</code> <a href=\"x.html\">link</a>" in page
    assert "<th>&lt;h&gt;</th>" in page and "<td>&lt;c&gt;</td>" in page and "<title>t&lt;</title>" in page
    assert render_markdown([Block("table", headers=("a|b",), rows=(("1",),))]).startswith("| a\\|b |")


# -- the notebook ------------------------------------------------------------------------

NOTEBOOK = Path(__file__).resolve().parents[2] / "analysis" / "notebooks" / "sweep.ipynb"


@pytest.mark.slow
def test_the_sweep_notebook_runs_headless_and_draws_its_figures(tmp_path, monkeypatch):
    """Executes ``analysis/notebooks/sweep.ipynb`` in a real Jupyter kernel (nbclient + ipykernel) on a sweep."""
    try:
        import nbclient
        import nbformat
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("nbclient/ipykernel not installed (pip install -e '.[test]')")
    from conftest import TEST_SCENARIOS
    from support.runs import FakeRunner

    from emulator.experiments.sweep import Sweep, run_sweep

    sweep = Sweep.from_options(TEST_SCENARIOS / "tiny-sweep.yaml", ["faults.crash.rate_per_hour=0,60", "method.name=comp_c,adacomp"], repeat=2)
    run_sweep(sweep, tmp_path / "sweep", runner=FakeRunner(), say=lambda m: None)
    monkeypatch.setenv("SWEEP_DIR", str(tmp_path / "sweep"))  # the kernel inherits the environment
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "commit the notebook without outputs"
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3 + 3  # three sweep metrics against the crash rate; accuracy x2 and staleness over runs
    assert "8 runs" in "".join(o.get("text", "") for o in outputs if o.output_type == "stream")


def test_byte_tick_labels_keep_close_ticks_apart():
    from analysis.figures import BYTES

    mib = 1024**2  # figures speak the tables' units: KiB, MiB, GiB, 1,024-based
    assert BYTES.format_ticks([8.4 * mib, 8.6 * mib, 8.8 * mib, 9.0 * mib]) == ["8.4 MiB", "8.6 MiB", "8.8 MiB", "9.0 MiB"]
    assert BYTES.format_ticks([1 * mib, 2 * mib, 3 * mib]) == ["1 MiB", "2 MiB", "3 MiB"]
    assert BYTES.format_ticks([0, 512 * 1024, 1 * mib]) == ["0.0 MiB", "0.5 MiB", "1.0 MiB"]  # one prefix along a linear axis
    assert BYTES.format_ticks([1024, 1 * mib, 1024 * mib]) == ["1 KiB", "1 MiB", "1 GiB"]  # a log axis: each its own
    assert BYTES(8.6 * mib) == "9 MiB"  # a lone label keeps the formatter's own precision


def test_a_categorical_sweep_axis_has_points_not_lines():
    from analysis.figures import sweep_metric

    agg = pd.DataFrame({"workers[0].cpus": ["0.15", "{uniform: [0.05, 0.25]}"], "n": [3, 3],
                        "final_accuracy_mean": [0.7, 0.6], "final_accuracy_ci95": [0.02, 0.05]})
    fig = sweep_metric(agg, "workers[0].cpus", "final_accuracy")
    means = [line for line in fig.axes[0].get_lines() if line.get_marker() == "o"]
    assert means and all(line.get_linestyle() == "None" for line in means)


def test_repetitions_under_one_label_are_a_mean_line_and_a_band():
    from matplotlib.collections import PolyCollection

    from analysis.figures import accuracy_vs_updates

    runs = [pd.DataFrame({"version": [0, 50, 100], "accuracy": [0.1, 0.5 + d, 0.7 + d]}) for d in (0.0, 0.02, 0.05)]
    fig = accuracy_vs_updates({"adacomp": runs, "asgd": [runs[0]]})
    ax = fig.axes[0]
    assert len([c for c in ax.collections if isinstance(c, PolyCollection)]) == 1  # one band, for the repeated method
    labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert sorted(labels) == ["adacomp (mean of 3)", "asgd"]


def test_traffic_both_ways_and_server_cpu_per_update():
    from analysis.figures import traffic_both_ways as figure
    from analysis.runs import NO_WORKER, server_cpu_per_update, traffic_both_ways

    traffic = pd.DataFrame({"worker": [0, 1, NO_WORKER, 0], "time_s": [0.2, 0.7, 0.5, 2.1],
                            "ingress_bytes": [100, 200, 0, 50], "egress_bytes": [1000, 2000, 9999, 500]})
    both = traffic_both_ways(traffic)
    assert both.to_dict("index") == {0: {"up": 300.0, "down": 3000.0}, 1: {"up": 0.0, "down": 0.0}, 2: {"up": 50.0, "down": 500.0}}
    stats = pd.DataFrame({"device": ["server", "server", "server", "worker-0"], "time_s": [-1.0, 0.5, 10.5, 5.0],
                          "cpu_s": [3.0, 4.0, 6.0, 99.0]})
    assert server_cpu_per_update(stats, 1000) == pytest.approx(0.002)  # 2 CPU seconds over 1,000 updates, boot left out
    assert server_cpu_per_update(stats, 0) is None
    fig = figure({"adacomp": both})
    assert [line.get_linestyle() for line in fig.axes[0].get_lines()] == ["-", "--"]


# -- what a report tells about the devices ----------------------------------------------------


def test_the_report_of_a_run_has_its_configuration_fidelity_and_bounds(run_dir):
    md = (build_report(run_dir) / "report.md").read_text()
    assert "## Devices as configured" in md
    assert "| worker-0 | slow | 0.2 | 1.00 GiB | 1mbit | 10mbit | 20ms | - | - | cpus: cgroup-cfs; uplink: tc-htb; downlink: tc-htb |" in md
    assert "## Fidelity: configured against measured" in md and "1 property off by more" in md
    assert "| worker-0 | uplink (TCP goodput) | 950kbit | 700kbit | -26.3% | **no** |" in md
    assert "| worker-1 | uplink (TCP goodput) | 950kbit | 940kbit | -1.0% | yes |" in md
    assert "## What bounded each worker" in md
    assert "| worker | group | CPU used | uplink used | downlink used | bounded by |" in md
    assert md.count("| worker-") >= 3 * 3  # three workers in each of the three tables


def test_a_run_without_a_fidelity_check_says_so(run_dir):
    (run_dir / "fidelity.json").unlink()
    md = (build_report(run_dir) / "report.md").read_text()
    assert "Not measured (`--no-fidelity`, or the run ended before its check)." in md


def _bounds_run(tmp_path, cpu_rate: dict, pushed: dict, pulled: dict):
    """A run of two workers over 10 s of training: CPU seconds per second, bytes pushed and pulled per second."""
    from analysis.runs import Run

    workers = [{"name": f"worker-{i}", "index": i, "group": "g", "cpus": 0.5,
                "link": {"uplink_bps": 1e6, "downlink_bps": 8e6}} for i in range(2)]
    stats = pd.DataFrame([{"device": f"worker-{i}", "cpu_s": cpu_rate[i] * t, "time_s": float(t), "ts": float(t)}
                          for i in range(2) for t in range(0, 11)])
    traffic = pd.DataFrame([{"worker": i, "ingress_bytes": pushed[i], "egress_bytes": pulled[i], "time_s": float(t), "ts": float(t)}
                            for i in range(2) for t in range(1, 11)])
    empty = pd.DataFrame(columns=["time_s"])
    return Run(tmp_path, {"duration_s": 10.0}, {"workers": workers}, 0.0,
               {"updates": empty, "accuracy": empty, "traffic": traffic, "steps": empty, "events": empty, "net": empty, "stats": stats})


def test_what_bounded_a_worker_is_the_resource_it_used_most_of(tmp_path):
    from analysis.bounds import short_label, worker_bounds

    # worker 0: 0.03 core of 0.5, 10 kB/s up of 125 kB/s, 950 kB/s down of 1 MB/s: its downlink, as the quickstart's dense pulls
    # worker 1: 0.45 core of 0.5, little traffic: its CPU
    run = _bounds_run(tmp_path, {0: 0.03, 1: 0.45}, {0: 10_000, 1: 1_000}, {0: 950_000, 1: 10_000})
    rows = {r["device"]: r for r in worker_bounds(run).to_dict("records")}
    assert rows["worker-0"]["bound"] == "downlink" and rows["worker-0"]["down_share"] == pytest.approx(0.95)
    assert rows["worker-0"]["cpu_share"] == pytest.approx(0.06)
    assert rows["worker-1"]["bound"] == "CPU" and rows["worker-1"]["cpu_share"] == pytest.approx(0.9)
    assert short_label(rows["worker-0"]) == "downlink 95%"


def test_a_worker_that_used_little_of_everything_waited_on_the_server(tmp_path):
    from analysis.bounds import worker_bounds

    run = _bounds_run(tmp_path, {0: 0.1, 1: 0.1}, {0: 20_000, 1: 20_000}, {0: 100_000, 1: 100_000})
    assert list(worker_bounds(run)["bound"]) == ["server", "server"]


def test_the_link_figure_draws_the_configured_rates(run_dir):
    run = load_run(run_dir)
    configured = {"worker-0": {"uplink_bps": 1e6, "downlink_bps": 10e6}, "server": {"uplink_bps": None, "downlink_bps": 80e6}}
    fig = figures.link_utilisation(run.net, None, configured)
    top, bottom = fig.axes[:2]
    dotted = lambda ax: sorted(round(l.get_ydata()[0]) for l in ax.get_lines() if l.get_linestyle() == ":")  # noqa: E731
    assert dotted(top) == [1_250_000, 10_000_000]  # downlinks, in bytes/s: worker-0's 10 Mbit/s, the server's 80
    assert dotted(bottom) == [125_000]  # worker-0's uplink; the server's is unshaped
    labels = _tick_labels(fig)
    assert labels and all(label.endswith(("KiB/s", "MiB/s", " B/s")) for label in labels), labels  # the tables' units


def _tick_labels(fig) -> list[str]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return [t.get_text() for ax in fig.axes[:2] for t in ax.get_yticklabels() if t.get_text()]


def test_a_damaged_run_directory_is_reported_with_file_and_line(run_dir):
    from click.testing import CliRunner

    from emulator.cli import main

    text = (run_dir / "summary.json").read_text()
    (run_dir / "summary.json").write_text(text[: len(text) // 2])  # cut off while written
    lines = (run_dir / "accuracy.jsonl").read_text().splitlines()
    lines[1] = '{"version": "ten", "accuracy": 0.5}'
    lines[2] = "[1, 2]"
    lines[3] = '{"version": 30, "accur'
    (run_dir / "accuracy.jsonl").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(main, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    warned = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert any(f"{run_dir / 'summary.json'}: line " in w and "cut off?" in w for w in warned), warned
    assert f"warning: {run_dir / 'accuracy.jsonl'}:2: field 'version' is 'ten', not a number; record skipped" in warned
    assert f"warning: {run_dir / 'accuracy.jsonl'}:3: not a record (a JSON object), list; skipped" in warned
    assert f"warning: {run_dir / 'accuracy.jsonl'}:4: not valid JSON; skipped" in warned
    md = (run_dir / "report" / "report.md").read_text()
    assert "`summary.json` is damaged" in md and "## Damaged records (skipped)" in md
    assert (run_dir / "report" / "accuracy_time.png").exists()  # what could be read is still drawn


def test_no_two_variants_of_one_method_are_drawn_alike_and_the_method_keeps_its_colour():
    """The paper profile's records hold 8 settings of ASGD (its step grid, sharded servers): each
    variant needs its own line style, and every variant the method's colour."""
    labels = [f"asgd:training.learning_rate={a}" for a in (0.1, 0.01, 0.005, 0.002, 0.001, 0.0005, 0.0002)]
    labels += ["asgd:training.learning_rate=0.001:server.shards=2", "asgd:training.learning_rate=0.001:server.shards=4",
               "asgd:workers[0].cpus=0.5", "asgd:training.batch_size=20", "asgd:faults.crash_rate=0.1"]
    styles = figures.Styles(["adacomp:c=0.01", *labels])
    drawn = [styles(label) for label in labels]
    assert len({repr(d["linestyle"]) for d in drawn}) == len(labels)
    assert {d["color"] for d in drawn} == {figures.PALETTE[figures.METHOD_COLOURS["asgd"]]}
    assert styles("adacomp:c=0.01")["color"] != drawn[0]["color"]


FEDAVG_TOPK = ("topk:c=0.01:error_feedback=true:rule=plain:pull=delta:training.learning_rate=0.02:local=10:"
               "aggregation.name=fedavg:aggregation.sample=16:aggregation.deadline=60s")  # a paper-profile label, 120 characters


def test_a_label_wider_than_the_figure_is_wrapped_at_its_colons_and_nothing_is_lost():
    wrapped = figures.wrap_label(FEDAVG_TOPK, 48)
    assert wrapped.replace("\n", "") == FEDAVG_TOPK
    assert all(len(line) <= 48 for line in wrapped.splitlines()) and len(wrapped.splitlines()) == 4
    assert figures.wrap_label("asgd", 48) == "asgd"
    assert figures.wrap_label("x" * 60, 48) == "x" * 60  # a part longer than the width stays whole
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], label=FEDAVG_TOPK)
    figures.legend_below(fig, ax)
    shown, = [t.get_text() for t in fig.legends[0].get_texts()]  # one column across the figure: two lines
    assert shown == figures.wrap_label(FEDAVG_TOPK, 2 * figures.LEGEND_COLUMN_CHARS) and len(shown.splitlines()) == 2
