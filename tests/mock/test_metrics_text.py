"""``MockTriton.metrics_text()``: the models' metric families as Triton 2.51's /metrics writes
them (the same fixture model on the real server: tests/server/test_mock_agrees_metrics_text.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from orchestrator.testing.mock import MockTriton

REPO = Path(__file__).resolve().parents[1] / "fixtures" / "mock" / "metrics_text"
VALUES = (0.5, 1234567.125, 3.0)

EXPECTED = '''\
# HELP mx_counter a counter: with "quotes" and \\ backslash
newline
# TYPE mx_counter counter
mx_counter{a="x\\"y\\\\z",b="2"} 1234570.625
mx_counter{model="mx"} 1234570.625
mx_counter 1234570.625
# HELP mx_gauge a gauge
# TYPE mx_gauge gauge
mx_gauge{k="v"} -1
# HELP mx_hist a histogram
# TYPE mx_hist histogram
mx_hist_count{k="v"} 6
mx_hist_sum{k="v"} 1410937.857142857
mx_hist_bucket{k="v",le="0.1"} 1
mx_hist_bucket{k="v",le="1"} 3
mx_hist_bucket{k="v",le="2.5"} 3
mx_hist_bucket{k="v",le="+Inf"} 6
mx_hist_count{k="w"} 0
mx_hist_sum{k="w"} 0
mx_hist_bucket{k="w",le="0.3333333333333333"} 0
mx_hist_bucket{k="w",le="1e+20"} 0
mx_hist_bucket{k="w",le="+Inf"} 0
# HELP mx_zero zero
# TYPE mx_zero counter
mx_zero{z="1"} 0
'''


def run(mock: MockTriton) -> None:
    for x in VALUES:
        mock.infer("mx", {"X": np.array([x])})


def test_the_exposition_of_every_metric_kind():
    with MockTriton(REPO, model_config_name=None, models=["mx"]) as mock:
        run(mock)
        assert mock.metrics_text() == EXPECTED
