"""lab/bench/own_split.py on the real server: the timed copies of router_single and hand_bls
load and answer, and the split of each request's time adds up to what the server counts."""

from __future__ import annotations

import pytest

from lab.bench import own_split as S

pytestmark = pytest.mark.server


def test_one_round_splits_both_models_execute():
    report = S.measure(rounds=1, requests=S.DUMP_EVERY, log=lambda line: None)
    (row,) = report["splits"]
    for model in S.MODELS:
        got = row[model]
        assert got["python_us"] > 0 and got["classifier_us"] > 0 and got["outside_python_us"] > 0
        assert abs(sum(got[f] for f in S.FIGURES[1:]) - got["execute_us"]) < 1.0  # the parts make the whole
    assert report["summary"]["rounds"] == 1 and set(report["summary"]["models"]) == set(S.MODELS)
