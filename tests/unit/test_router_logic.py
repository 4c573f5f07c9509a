"""Pure routing logic: windows, aggregation, settings validation, request parsing."""

import math

import numpy as np
import pytest

from orchestrator.runtime.errors import LimitError
from orchestrator.runtime.execution.tokenize import truncate
from orchestrator.runtime.request import InputError, Limits, parse_request
from orchestrator.runtime.routing.heads import LEGACY, logit, sigmoid
from orchestrator.runtime.routing.nodes.chunk import token_windows, window_count
from orchestrator.runtime.routing.nodes.split import split_fraction


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
    assert LEGACY.combine([[0.2], [0.8]], "mean", [10, 30])[0] == pytest.approx((0.2 * 10 + 0.8 * 30) / 40)
    assert LEGACY.combine([[0.2], [0.8]], "mean")[0] == pytest.approx(0.5)
    assert LEGACY.combine([[0.2], [0.8]], "max")[0] == pytest.approx(0.8)


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
    assert ok.texts == ["good", ""] and ok.thresholds.reshape(-1).tolist() == pytest.approx([0.5, 0.2]) and ok.thresholds.shape == (2, 1)
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


# ----------------------------------------------------------------------------- input limits, parameters, outputs


def _texts(*texts):
    return np.array([t.encode() if isinstance(t, str) else t for t in texts], dtype=object).reshape(-1, 1)


def _thr(n):
    return np.full((n, 1), 0.5, np.float32)


def test_byte_limits_name_the_text_its_size_and_the_limit():
    limits = Limits(max_text_bytes=10, max_request_bytes=25)
    parse_request(_texts("x" * 10, "y" * 10), _thr(2), limits=limits)  # at the limits: fine
    with pytest.raises(LimitError, match=r"^TEXT\[1\]: 11 bytes, over the limit of 10 bytes per text \(policy limits.max_text_bytes\)$") as info:
        parse_request(_texts("ok", "z" * 11), _thr(2), limits=limits)
    assert info.value.limit == "max_text_bytes"
    with pytest.raises(LimitError, match=r"^TEXT: 30 bytes in all texts, over the limit of 25 bytes per request"):
        parse_request(_texts("a" * 10, "b" * 10, "c" * 10), _thr(3), limits=limits)
    # checked before decoding: an oversized text with invalid UTF-8 is refused for its size
    with pytest.raises(LimitError, match=r"TEXT\[0\]: 12 bytes"):
        parse_request(_texts(b"\xff" * 12), _thr(1), limits=limits)


def test_default_limits():
    d = Limits()
    assert (d.max_text_bytes, d.max_request_bytes, d.max_windows_per_text) == (65536, 4 << 20, 256)
    with pytest.raises(LimitError, match=r"TEXT\[0\]: 8388608 bytes, over the limit of 65536 bytes per text"):
        parse_request(_texts(b"a" * (8 << 20)), _thr(1))


def test_unknown_parameters_are_refused_and_ignored_patterns_accepted():
    exposed = {"route": ("fast", "accurate")}
    with pytest.raises(InputError, match=r"^parameter 'rout': not a parameter of this router \(it accepts: describe_policy, route\)$"):
        parse_request(_texts("a"), _thr(1), {"rout": "fast"}, exposed)
    work = parse_request(_texts("a"), _thr(1), {"route": "fast", "x-request-id": "abc", "describe_policy": "true"}, exposed,
                         ignored=("x-*",))
    assert work.parameters == {"route": "fast"} and work.describe  # ignored and describe_policy are not forwarded


def test_policy_output_needs_describe_policy():
    with pytest.raises(InputError, match=r"^POLICY: this output is only produced for requests with the parameter describe_policy=true$"):
        parse_request(_texts("a"), _thr(1), {}, explicit_outputs={"POLICY"})
    assert parse_request(_texts("a"), _thr(1), {"describe_policy": True}, explicit_outputs={"POLICY"}).describe
    parse_request(_texts("a"), _thr(1), {}, explicit_outputs={"ROUTE"})


@pytest.mark.parametrize("tokens", [3, 128, 129, 200, 226, 227, 1000, 5001])
def test_window_count_matches_token_windows(tokens):
    ids = np.arange(tokens, dtype=np.int64)
    assert window_count(tokens, 128, 96) == len(token_windows(ids, 128, 96))


def test_ignored_parameters_star_accepts_what_an_ensemble_would_ignore():
    """Drop-in for an ensemble's clients: ``ignored_parameters: ["*"]`` accepts any undeclared
    parameter, while a declared one is still checked."""
    texts, thresholds = np.array([[b"x"]], dtype=object), np.full((1, 1), 0.5, np.float32)
    with pytest.raises(InputError, match="parameter 'foo': not a parameter of this router"):
        parse_request(texts, thresholds, {"foo": 1}, {"route": ["fast"]})
    work = parse_request(texts, thresholds, {"foo": 1, "x-trace": "a", "route": "fast"}, {"route": ["fast"]}, ignored=["*"])
    assert work.parameters == {"route": "fast"}
    with pytest.raises(InputError, match="route='nope': not a route"):
        parse_request(texts, thresholds, {"route": "nope"}, {"route": ["fast"]}, ignored=["*"])
