"""Pure routing logic: windows, aggregation, settings validation, request parsing."""

import math

import numpy as np
import pytest

from orchestrator.runtime.nodes.chunk import aggregate, token_windows
from orchestrator.runtime.nodes.model import truncate
from orchestrator.runtime.nodes.split import split_fraction
from orchestrator.runtime.request import parse_request
from orchestrator.runtime.scores import logit, sigmoid
from orchestrator.runtime.validation import InputError


def _text(n_content):
    # 101 = [CLS]-like first token, 102 = [SEP]-like last token, content 1000..
    return np.array([101] + list(range(1000, 1000 + n_content)) + [102], dtype=np.int64)


def test_short_text_is_one_window_itself():
    ids = _text(10)
    (only,) = token_windows(ids, 128, 96)
    assert np.array_equal(only, ids)


@pytest.mark.parametrize("n_content", [127, 200, 317, 1000])
def test_windows_cover_every_token_and_keep_special_tokens(n_content):
    ids = _text(n_content)
    wins = token_windows(ids, 128, 96)
    assert len(wins) >= 2
    covered = set()
    for w in wins:
        assert len(w) == 128
        assert w[0] == 101 and w[-1] == 102
        covered.update(w[1:-1].tolist())
    assert covered == set(range(1000, 1000 + n_content))
    # consecutive windows start stride tokens apart, except the end-aligned last one
    starts = [int(w[1]) - 1000 for w in wins]
    assert all(b - a == 96 for a, b in zip(starts[:-2], starts[1:-1]))
    assert wins[-1][-2] == 1000 + n_content - 1


def test_aggregation_rules():
    assert aggregate([0.2, 0.8], [10, 30], "length_weighted_mean") == pytest.approx((0.2 * 10 + 0.8 * 30) / 40)
    assert aggregate([0.2, 0.8], [10, 30], "mean") == pytest.approx(0.5)
    assert aggregate([0.2, 0.8], [10, 30], "max") == pytest.approx(0.8)


def test_logit_inverts_sigmoid():
    for p in (0.01, 0.3, 0.5, 0.97):
        assert float(sigmoid(logit(p))) == pytest.approx(p, abs=1e-12)
    assert math.isfinite(logit(1.0)) and math.isfinite(logit(0.0))


def test_truncate_keeps_the_last_special_token():
    ids = _text(200)
    t = truncate(ids, 128)
    assert len(t) == 128 and t[0] == 101 and t[-1] == 102 and t[-2] == 1000 + 125
    assert truncate(_text(5), 128) is not None and len(truncate(_text(5), 128)) == 7


def test_split_fraction_is_deterministic_and_spread():
    xs = [split_fraction("ab", f"req-{i}") for i in range(2000)]
    assert xs == [split_fraction("ab", f"req-{i}") for i in range(2000)]
    assert all(0.0 <= x < 1.0 for x in xs)
    assert 0.45 < sum(x < 0.5 for x in xs) / len(xs) < 0.55


def _texts(*items):
    return np.array(items, dtype=np.object_).reshape(-1, 1)


def test_parse_request_errors_name_the_input():
    ok = parse_request(_texts(b"good", b""), np.array([[0.5], [0.2]], dtype=np.float32), {"route": "fast"}, {"route": ("fast",)})
    assert ok.texts == ["good", ""] and ok.thresholds.tolist() == pytest.approx([0.5, 0.2])
    cases = [
        ((None, np.ones((1, 1), np.float32)), "TEXT: required"),
        ((_texts(b"a"), None), "THRESHOLD: required"),
        ((np.zeros((0, 1), dtype=np.object_), np.zeros((0, 1), np.float32)), "TEXT: empty batch"),
        ((_texts(b"ok", b"bad \xff here"), np.full((2, 1), 0.5, np.float32)), r"TEXT\[1\]: invalid UTF-8"),
        ((_texts(b"a"), np.array([[-0.1]], np.float32)), r"THRESHOLD\[0\] = -0.1"),
        ((_texts(b"a"), np.array([[np.nan]], np.float32)), r"THRESHOLD\[0\] = nan"),
        ((_texts(b"a", b"b"), np.array([[0.5]], np.float32)), r"THRESHOLD: expected shape \[2, 1\]"),
    ]
    for (texts, thr), message in cases:
        with pytest.raises(InputError, match=message):
            parse_request(texts, thr)
    with pytest.raises(InputError, match="parameter route='classifier': not a route this policy exposes"):
        parse_request(_texts(b"a"), np.array([[0.5]], np.float32), {"route": "classifier"}, {"route": ("fast", "accurate")})
