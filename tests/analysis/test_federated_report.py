"""A federated run's report: its method line says local steps and aggregation, and a line gives its rounds."""

from __future__ import annotations

from analysis.report import _federated, _rounds


def test_the_method_line_and_the_rounds_line():
    method = {"local": {"steps": 10, "epochs": None}, "aggregation": {"name": "fedavg", "params": {"deadline_s": 3.0, "sample": 4}}}
    assert _federated(method) == ", local steps 10, aggregation fedavg (deadline_s=3.0, sample=4)"
    assert _federated({"local": {"steps": None, "epochs": 1}, "aggregation": {"name": "fedbuff", "params": {}}}) == \
        ", local epochs 1, aggregation fedbuff"
    assert _federated({"name": "adacomp"}) == ""
    line = _rounds({"count": 10, "mean_duration_s": 1.708, "mean_participants": 3.8, "stragglers_dropped": 2,
                    "up_bytes_per_round": 766127.7, "down_bytes_per_round": 6577763.4})
    assert line.startswith("10: mean 1.708 s, 3.8 participants, 2 stragglers dropped;") and "(766,127 B) up" in line
    assert _rounds(None) is None
