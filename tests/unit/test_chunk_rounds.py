"""The chunk node's rounds and early stopping, and what ``length_weighted_mean``
weighs, through the engine with fake models (``tests.helpers.FakeBLS``,
``tests.unit.test_engine_heads.KFake``). Expected answers and bounds are computed here from
the fake models' arithmetic, independently of ``nodes.chunk``.

Texts below use windows of 8 tokens at stride 6: 6 content tokens per window, so a text of
18 words (20 tokens) makes exactly 3 windows that do not overlap, the r-th covering words
6r .. 6r+5. Fake ``fast``: logit = #good - #bad + 0.1 per window.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.request import Work
from orchestrator.runtime.routing.heads import LEGACY, MULTICLASS, MULTILABEL, Head
from orchestrator.runtime.routing.nodes.chunk import settled_verdicts, token_windows, window_weights
from orchestrator.runtime.routing.policy import bind_heads, parse_policy
from tests.helpers import FakeBLS, ids_of
from tests.unit.test_engine_heads import HEADS, KFake, fake_logits, softmax
from tests.unit.test_shadow import RecordingMetrics

W = {"window": 8, "stride": 6}
SURE_POS = " ".join(["good"] * 6)   # one window: logit 6.1
SURE_NEG = " ".join(["bad"] * 6)    # logit -5.9
UNSURE = " ".join(["x"] * 6)        # logit 0.1: p 0.525
SHORT = "good film"


def p32(logit: float) -> float:
    """A window's probability as the engine gets it: the fake's float32 logit, sigmoid in float64."""
    return 1.0 / (1.0 + np.exp(-np.float64(np.float32(logit))))


def text(*windows: str) -> str:
    return " ".join(windows)


def run(chunk, texts, thresholds=0.5, metrics=None, root=None):
    doc = {"version": 1, "root": root or {"kind": "chunk", "name": "ch", **W, "node": {"kind": "model", "name": "fast", "model": "fast"}, **chunk}}
    fake = FakeBLS()
    engine = Engine(parse_policy(doc), fake, metrics)
    thr = np.asarray(thresholds, np.float32).reshape(-1) * np.ones(len(texts), np.float32)
    [result] = asyncio.run(engine.run([Work(list(texts), thr, {}, "r")]))
    return result, [c["rows"] for c in fake.calls if c["model"] != "tokenizer"]


def test_three_disjoint_windows_as_documented():
    wins = token_windows(np.array(ids_of(text(SURE_POS, UNSURE, SURE_NEG))), 8, 6)
    assert [w[1:-1].tolist() for w in wins] == [[2000] * 6, [1001] * 6, [3000] * 6]


def test_without_a_stopping_key_every_window_goes_in_one_call():
    long = text(SURE_POS, UNSURE, SURE_NEG)
    result, rows = run({"aggregation": "mean"}, [long, SHORT])
    assert rows == [4]  # three windows and the short text, one call, as before the rounds
    assert result.routes == ["chunked:fast", "fast"]
    assert result.probabilities[0, 0] == pytest.approx(np.mean([p32(6.1), p32(0.1), p32(-5.9)]), rel=1e-6)


def test_stop_margin_stops_a_sure_text_after_the_first_round_and_goes_on_with_the_others():
    sure, unsure = text(SURE_POS, UNSURE, SURE_NEG), text(UNSURE, UNSURE, SURE_POS)
    metrics = RecordingMetrics()
    result, rows = run({"aggregation": "mean", "stop_margin": 0.3}, [sure, unsure, SHORT], metrics=metrics)
    # round 0: the first window of both long texts and the short text in one call; then the
    # unsure text alone (|0.525 - 0.5| < 0.3 after one and two windows)
    assert rows == [3, 1, 1]
    assert result.routes == ["chunked:fast:windows=1/3", "chunked:fast", "fast"]
    assert result.probabilities[0, 0] == pytest.approx(p32(6.1), rel=1e-6)  # the windows used, not the text's
    assert result.probabilities[1, 0] == pytest.approx(np.mean([p32(0.1), p32(0.1), p32(6.1)]), rel=1e-6)
    counts = {k[0]: v for k, v in metrics.counts.items() if k[0].startswith("orchestrator_chunk")}
    assert counts == {"orchestrator_chunked_texts_total": 2, "orchestrator_chunks_total": 4,
                      "orchestrator_chunks_skipped_total": 2}
    assert metrics.counts[("orchestrator_chunks_skipped_total", (("node", "ch"), ("reason", "margin")))] == 2
    # the texts_total label drops the window count
    assert metrics.counts[("orchestrator_texts_total", (("route", "chunked:fast"),))] == 2


def test_stop_margin_boundary_is_unsure_below_the_margin_sure_at_it():
    p = p32(0.1)
    assert run({"aggregation": "mean", "stop_margin": p - 0.5 + 1e-9}, [text(UNSURE, UNSURE, UNSURE)])[1] == [1, 1, 1]
    assert run({"aggregation": "mean", "stop_margin": p - 0.5 - 1e-9}, [text(UNSURE, UNSURE, UNSURE)])[1] == [1]


def test_stop_when_decided_exact_bounds_for_a_binary_mean():
    long = text(SURE_POS, SURE_POS, SURE_NEG)
    a, b = p32(6.1), p32(6.1)
    low = np.float32((a + b + 0.0) / 3)       # after two windows: the third answers 0 ...
    high = np.float32((a + b + 1.0) / 3)      # ... or 1
    up = lambda x: np.nextafter(x, np.float32(1))  # noqa: E731
    # one window of three can never settle a mean at these thresholds, so the first round
    # sends two (one call) and the third goes alone when those two did not settle the text
    # positive once the lowest possible mean reaches the threshold (>=), not before
    assert run({"aggregation": "mean", "stop_when_decided": True}, [long], thresholds=low)[1] == [2]
    assert run({"aggregation": "mean", "stop_when_decided": True}, [long], thresholds=up(low))[1] == [2, 1]
    # negative once the highest possible mean is below the threshold (<), not at it; at a
    # threshold this high one window could settle a negative ((0 + 1 + 1) / 3 < t), so
    # every round is one window
    assert run({"aggregation": "mean", "stop_when_decided": True}, [long], thresholds=up(high))[1] == [1, 1]
    assert run({"aggregation": "mean", "stop_when_decided": True}, [long], thresholds=high)[1] == [1, 1, 1]
    result, _ = run({"aggregation": "mean", "stop_when_decided": True}, [long], thresholds=low)
    assert result.routes == ["chunked:fast:windows=2/3"] and result.verdicts.tolist() == [[True]]
    assert result.probabilities[0, 0] == pytest.approx((a + b) / 2, rel=1e-6)
    # one window of three can never decide a mean at 0.5: p/3 < 0.5 and (p + 2)/3 > 0.5
    assert run({"aggregation": "mean", "stop_when_decided": True}, [text(SURE_POS, SURE_NEG, SURE_NEG)])[1] == [2, 1]
    # ... but at a threshold of 0.3 it can (1/3 >= 0.3): then the first round is one window
    assert run({"aggregation": "mean", "stop_when_decided": True}, [long], thresholds=0.3)[1] == [1]


def test_stop_when_decided_with_max_stops_a_positive_and_never_a_negative():
    pos, neg = text(SURE_POS, SURE_NEG, SURE_NEG), text(SURE_NEG, SURE_NEG, SURE_NEG)
    metrics = RecordingMetrics()
    result, rows = run({"aggregation": "max", "stop_when_decided": True}, [pos, neg], metrics=metrics)
    assert rows == [2, 1, 1]  # the positive text stops after its first window
    assert result.routes == ["chunked:fast:windows=1/3", "chunked:fast"]
    assert result.probabilities[0, 0] == pytest.approx(p32(6.1), rel=1e-6)
    assert metrics.counts[("orchestrator_chunks_skipped_total", (("node", "ch"), ("reason", "decided")))] == 2


def test_max_windows_keeps_the_first_windows():
    long = text(UNSURE, SURE_POS, SURE_NEG)
    metrics = RecordingMetrics()
    result, rows = run({"aggregation": "mean", "max_windows": 2}, [long, SHORT], metrics=metrics)
    assert rows == [3]  # only max_windows can stop it, at two: both in the first round, with the short text
    assert result.routes == ["chunked:fast:windows=2/3", "fast"]
    assert result.probabilities[0, 0] == pytest.approx(np.mean([p32(0.1), p32(6.1)]), rel=1e-6)
    assert metrics.counts[("orchestrator_chunks_skipped_total", (("node", "ch"), ("reason", "max_windows")))] == 1
    # at the text's own window count nothing is skipped
    assert run({"aggregation": "mean", "max_windows": 3}, [long])[0].routes == ["chunked:fast"]


def test_length_weighted_mean_weighs_the_content_tokens_each_window_adds():
    long = " ".join(["good"] * 9 + ["bad"] * 12)  # 23 tokens: windows of 8 at stride 4 overlap
    ids = np.array(ids_of(long))
    wins = token_windows(ids, 8, 4)
    # independently: each content position counts for the first window that covers it
    starts = [0, 4, 8, 12, 15]  # the end-aligned last window starts at 21 - 6
    assert [w[1:-1].tolist() for w in wins] == [ids[1 + s:7 + s].tolist() for s in starts]
    covered, weights = set(), []
    for s in starts:
        new = set(range(s, s + 6)) - covered
        weights.append(len(new))
        covered |= new
    assert weights == [6, 4, 4, 4, 3] and window_weights(len(ids), 8, 4) == weights
    assert sum(weights) == len(ids) - 2 and window_weights(7, 8, 4) == [7]
    probs = [p32(float(w.tolist().count(2000) - w.tolist().count(3000)) + 0.1) for w in wins]
    doc = {"kind": "chunk", "window": 8, "stride": 4, "aggregation": "length_weighted_mean",
           "node": {"kind": "model", "name": "fast", "model": "fast"}}
    result, _ = run({}, [long], root=doc)
    assert result.probabilities[0, 0] == pytest.approx(np.dot(probs, weights) / sum(weights), rel=1e-6)
    assert result.probabilities[0, 0] != pytest.approx(np.mean(probs), rel=1e-3)  # no longer the plain mean


def test_a_cascade_does_not_escalate_a_text_stopped_for_being_sure():
    sure, unsure = text(SURE_POS, UNSURE, UNSURE), text(UNSURE, UNSURE, UNSURE)
    chunk = lambda name, model: {"kind": "chunk", "name": name, **W, "aggregation": "mean", "stop_margin": 0.2,  # noqa: E731
                                 "node": {"kind": "model", "name": model, "model": model}}
    root = {"kind": "cascade", "margin": 0.2, "stages": [chunk("c1", "fast"), chunk("c2", "accurate")]}
    result, rows = run({}, [sure, unsure], root=root)
    assert result.routes == ["chunked:fast:windows=1/3", "chunked:accurate"]
    assert rows == [2, 1, 1, 1, 1, 1]  # fast: round 0 both, then the unsure one; accurate: the unsure one


# ----------------------------------------------------------------------------- other heads


def engine_for(chunk, head_model):
    root = {"kind": "chunk", "name": "ch", "window": 10, "stride": 8,
            "node": {"kind": "model", "name": head_model, "model": head_model}, **chunk}
    policy = bind_heads(parse_policy({"version": 1, "root": root}), HEADS)
    fake = KFake()
    return Engine(policy, fake), fake


def run_k(engine, fake, texts, thresholds):
    thr = np.asarray(thresholds, np.float32).reshape(len(texts), -1)
    [result] = asyncio.run(engine.run([Work(list(texts), thr, {}, "r")]))
    return result, [c["rows"] for c in fake.calls if c["model"] not in ("tokenizer",)]


def k_windows(long):
    return [w for w in token_windows(np.array(ids_of(long)), 10, 8)]


def test_multiclass_stop_when_decided_needs_a_fixed_top_label_and_its_verdict():
    # windows of 10 tokens at stride 8: 24 words make 3 windows that do not overlap
    long = " ".join(["good"] * 16 + ["bad"] * 8)
    wins = k_windows(long)
    assert len(wins) == 3
    probs = [softmax(fake_logits("mc", w)) for w in wins]
    engine, fake = engine_for({"aggregation": "mean", "stop_when_decided": True}, "mc")
    result, rows = run_k(engine, fake, [long], [0.3])
    # after two 'good' windows the pos label has mean >= 2p/3 on every completion, and
    # every other label at most (q + q' + 1)/3 below it: settled
    low, high = (probs[0] + probs[1]) / 3, (probs[0] + probs[1] + 1) / 3
    assert low[2] > max(high[0], high[1]) and low[2] >= 0.3
    assert rows == [1, 1] and result.routes == ["chunked:mc:windows=2/3"]
    assert result.verdicts.tolist() == [[False, False, True]]
    # at threshold 0.7 the pos label's own verdict is open after two windows: all three
    engine, fake = engine_for({"aggregation": "mean", "stop_when_decided": True}, "mc")
    assert low[2] < 0.7 <= high[2]
    assert run_k(engine, fake, [long], [0.7])[1] == [1, 1, 1]


def test_multiclass_max_with_stop_when_decided_is_refused_at_load():
    with pytest.raises(PolicyError, match=r"ch.stop_when_decided: not available with aggregation 'max' and a multiclass head"):
        engine_for({"aggregation": "max", "stop_when_decided": True}, "mc")
    engine_for({"aggregation": "max", "stop_margin": 0.2}, "mc")  # the margin rule is defined for it


def test_multilabel_stops_only_when_every_label_is_settled():
    long = " ".join(["bad"] * 24)
    wins = k_windows(long)
    probs = [1 / (1 + np.exp(-np.asarray(fake_logits("ml", w), np.float64))) for w in wins]
    assert all(p[0] > 0.99 and p[1] > 0.95 and p[2] == 0.5 for p in probs)  # toxic and insult sure, threat not
    engine, fake = engine_for({"aggregation": "max", "stop_when_decided": True}, "ml")
    # threat's threshold low enough that its first window reaches it: every label settled at once
    result, rows = run_k(engine, fake, [long], [[0.5, 0.5, float(probs[0][2]) - 1e-3]])
    assert rows == [1] and result.routes == ["chunked:ml:windows=1/3"]
    # threat unsettled (a max below its threshold can still rise): all windows
    engine, fake = engine_for({"aggregation": "max", "stop_when_decided": True}, "ml")
    assert run_k(engine, fake, [long], [[0.5, 0.5, 0.99]])[1] == [1, 1, 1]
    # the margin rule: every label must be sure (threat at 0.5 is not at threshold 0.5, is at 0.3)
    engine, fake = engine_for({"aggregation": "mean", "stop_margin": 0.1}, "ml")
    assert run_k(engine, fake, [long], [[0.5, 0.5, 0.5]])[1] == [1, 1, 1]
    engine, fake = engine_for({"aggregation": "mean", "stop_margin": 0.1}, "ml")
    assert run_k(engine, fake, [long], [[0.5, 0.5, 0.3]])[1] == [1]


def test_settled_verdicts_per_head_kind():
    mc = Head(MULTICLASS, ("a", "b", "c"))
    t = np.array([0.4])
    assert settled_verdicts(mc, np.array([0.1, 0.1, 0.5]), np.array([0.3, 0.3, 0.6]), t).tolist() == [False, False, True]
    assert settled_verdicts(mc, np.array([0.1, 0.3, 0.5]), np.array([0.3, 0.5, 0.6]), t) is None  # top open (tie at 0.5)
    assert settled_verdicts(mc, np.array([0.0, 0.0, 0.0]), np.array([0.3, 0.39, 0.2]), t).tolist() == [False] * 3
    assert settled_verdicts(mc, np.array([0.0, 0.0, 0.35]), np.array([0.2, 0.2, 0.45]), t) is None  # top fixed, its verdict open
    ml = Head(MULTILABEL, ("a", "b"))
    assert settled_verdicts(ml, np.array([0.5, 0.0]), np.array([0.9, 0.3]), np.array([0.4, 0.4])).tolist() == [True, False]
    assert settled_verdicts(ml, np.array([0.5, 0.0]), np.array([0.9, 0.4]), np.array([0.4, 0.4])) is None
    assert settled_verdicts(LEGACY, np.array([0.4]), np.array([0.9]), np.array([0.4])).tolist() == [True]


def _box(head, answered, weights, how):
    """The lowest and highest weighted mean (or max) the rest of the windows allow, computed
    here: unanswered windows at 0 for the low bound and at 1 for the high one."""
    def agg(ps):
        p = np.stack(ps)
        if how == "max":
            return p.max(axis=0)
        w = np.asarray(weights if how == "length_weighted_mean" else np.ones(len(weights)), np.float64)
        return (p * w[:, None]).sum(axis=0) / w.sum()
    rest = len(weights) - len(answered)
    return agg(list(answered) + [np.zeros(head.columns)] * rest), agg(list(answered) + [np.ones(head.columns)] * rest)


@pytest.mark.parametrize("head", [LEGACY, HEADS["mc"], HEADS["ml"]], ids=["binary", "multiclass", "multilabel"])
def test_could_settle_never_says_no_where_some_answers_settle_and_binary_and_multilabel_are_exact(head):
    """Over random window weights, thresholds and answers so far: where ``could_settle``
    says no, none of a grid of answers of the next windows settles the text (so a round
    sending fewer windows could never have stopped it); for binary and multilabel heads,
    where it says yes, answers at 0 or 1 per column do."""
    from orchestrator.runtime.routing.nodes.chunk import could_settle

    rng = np.random.RandomState(0)
    cols = head.columns
    grid = [np.eye(cols)[j] for j in range(cols)] + [np.full(cols, 1 / cols)] if head.kind == MULTICLASS else \
        [np.array(v, np.float64) for v in np.array(np.meshgrid(*[[0.0, 0.5, 1.0]] * cols)).T.reshape(-1, cols)]
    checked = {True: 0, False: 0}
    for _ in range(300):
        made = int(rng.randint(2, 6))
        weights = [int(x) for x in rng.randint(1, 10, size=made)]
        used = int(rng.randint(0, made - 1))
        answered = [rng.dirichlet(np.ones(cols)) if head.kind == MULTICLASS else rng.rand(cols) for _ in range(used)]
        threshold = np.asarray([rng.uniform(0.05, 0.95)], np.float32)
        how = ["length_weighted_mean", "mean"][int(rng.randint(2))]
        for more in range(1, made - used):
            says = could_settle(head, how, answered, weights, more, threshold)
            checked[says] += 1
            settles = [settled_verdicts(head, *_box(head, answered + [g] * more, weights, how), threshold) is not None
                       for g in grid]
            if not says:
                assert not any(settles), (weights, used, more, threshold)
            elif head.kind != MULTICLASS:  # exact: the best answers per column are 0 or 1
                lo = _box(head, answered + [np.ones(cols)] * more, weights, how)[0].astype(np.float32)
                hi = _box(head, answered + [np.zeros(cols)] * more, weights, how)[1].astype(np.float32)
                t = np.float32(threshold[0])
                assert bool(((lo >= t) | (hi < t)).all())
    assert checked[True] > 20 and checked[False] > 20  # both answers were exercised


def test_a_four_window_text_sends_the_fewest_windows_that_could_stop_it_each_round():
    """Four disjoint windows, threshold 0.5: one window cannot settle a mean of four
    ((1 + 0 + 0 + 0) / 4 < 0.5 and (0 + 1 + 1 + 1) / 4 >= 0.5), two could (only at exactly
    1 each), so the first round sends two and then one at a time; the text stops where a
    window-per-round loop stops it (computed here: after the third)."""
    long = text(SURE_POS, SURE_POS, SURE_POS, SURE_NEG)
    result, rows = run({"aggregation": "mean", "stop_when_decided": True}, [long])
    a = p32(6.1)
    # after 3 windows the lowest mean is 3a/4 >= 0.5: settled positive at 3, not at 2 (2a/4 < 0.5)
    assert 2 * a / 4 < 0.5 <= 3 * a / 4
    assert rows == [2, 1]
    assert result.routes == ["chunked:fast:windows=3/4"]
    assert result.probabilities[0, 0] == pytest.approx(a, rel=1e-6)
