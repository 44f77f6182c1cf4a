"""Staleness figures from the server's update records."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.staleness import pooled_values, staleness_by_workers, staleness_figures


def test_staleness_figures_of_an_adacomp_run():
    updates = pd.DataFrame({"staleness": [0, 2, 4, 4, 10], "sigma": [0.0, 0.0, 1.0, 2.0, 1.0]})
    got = staleness_figures(updates)
    assert (got["updates"], got["d_median"], got["d_max"]) == (5, 4.0, 10)
    # d > 0: sigma / d = 0, 0.25, 0.5, 0.1
    assert got["sigma_over_d_median"] == pytest.approx(0.175) and got["sigma_over_d_mean"] == pytest.approx(0.2125)
    assert got["sigma_zero_share"] == pytest.approx(0.25)


def test_a_run_without_sigma_has_only_delays():
    got = staleness_figures(pd.DataFrame({"staleness": [1, 3]}))
    assert got["d_median"] == 2.0 and got["sigma_over_d_mean"] is None


def test_the_figure_has_a_point_per_method_and_worker_count():
    runs = {("adacomp", 4): [pd.DataFrame({"staleness": [1, 3, 5], "sigma": [0.0, 1.0, 1.0]})],
            ("adacomp", 16): [pd.DataFrame({"staleness": [10, 15, 20], "sigma": [1.0, 2.0, 1.0]})],
            ("comp_c", 4): [pd.DataFrame({"staleness": [2, 3, 4]})]}
    fig = staleness_by_workers({point: pooled_values(tables) for point, tables in runs.items()})
    left, right = fig.axes[:2]
    assert sorted(len(line.get_xdata()) for line in left.get_lines() if line.get_marker() == "o") == [1, 2]
    assert [len(line.get_xdata()) for line in right.get_lines() if line.get_marker() == "o"] == [2]
    assert staleness_by_workers({}) is None


def test_pooled_values_join_runs_and_keep_sigma_over_positive_delays():
    got = pooled_values([pd.DataFrame({"staleness": [0, 4], "sigma": [0.0, 1.0]}), pd.DataFrame({"staleness": [2]})])
    assert list(got["staleness"]) == [0, 4, 2] and list(got["sigma_over_d"]) == [0.25]
