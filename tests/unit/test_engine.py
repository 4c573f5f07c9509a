"""The policy engine driven by a fake BLS function (``tests.helpers.FakeBLS``): every node
kind, no server, no ONNX. The fake models are arithmetic on the text, so every expected
answer is computed here independently of the engine (``ids_of``, ``expected_logit``)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.runtime.errors import DownstreamError, LimitError
from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.request import Work
from orchestrator.runtime.routing.heads import logit
from orchestrator.runtime.routing.nodes import KINDS
from orchestrator.runtime.routing.nodes.chunk import token_windows
from orchestrator.runtime.routing.nodes.split import split_fraction
from orchestrator.runtime.routing.policy import parse_policy
from tests.helpers import FakeBLS, expected_logit, ids_of, sig


def run(policy_doc, texts, thresholds=0.5, params=None, request_id="", fake=None):
    doc = {"version": 1, **policy_doc}
    fake = fake or FakeBLS()
    engine = Engine(parse_policy(doc), fake)
    thr = np.full(len(texts), thresholds, np.float32)
    [result] = asyncio.run(engine.run([Work(list(texts), thr, params or {}, request_id)]))
    return result, fake


def model(name, **kw):
    return {"kind": "model", "name": kw.pop("node_name", name), "model": name, **kw}


TEXTS = ["good good film", "bad plot", "good bad", "a long tale of good things"]


def test_every_node_kind_is_covered_here():
    """The tests below drive each kind in KINDS through the engine (update both together)."""
    assert set(KINDS) == {"model", "constant", "sequence", "switch", "cascade", "chunk", "split", "parallel", "fallback",
                          "shadow"}  # shadow: tests/unit/test_shadow.py


def test_model_node_answers_with_the_models_logit_and_route():
    result, fake = run({"root": model("fast", route="quick")}, TEXTS)
    want = [sig(expected_logit("fast", ids_of(t))) for t in TEXTS]
    np.testing.assert_allclose(result.probabilities.reshape(-1), want, rtol=1e-6)
    assert result.routes == ["quick"] * 4
    assert result.verdicts.reshape(-1).tolist() == [p >= 0.5 for p in want]
    assert fake.models_called() == ["tokenizer", "fast"]  # one tokenizer call, one classifier call
    assert fake.calls[1]["alone"] is True  # a lone call may block the loop (BLS exec)


def test_model_node_truncates_to_max_length_and_applies_calibration():
    text = "good " * 10 + "bad bad"
    result, fake = run({"root": model("fast", max_length=6, calibration={"reference_threshold": 0.5, "threshold": 0.4})}, [text])
    sent = fake.calls[1]["inputs"]["input_ids"][0]
    assert sent.tolist() == ids_of(text)[:5] + [102]  # first max_length-1 tokens and the last one
    shift = logit(0.5) - logit(0.4)
    assert result.probabilities[0, 0] == pytest.approx(sig(expected_logit("fast", sent) + shift), rel=1e-6)


def test_constant_node_calls_nothing_and_can_fix_the_verdict():
    result, fake = run({"root": {"kind": "constant", "name": "c", "probability": 0.9, "verdict": False}}, TEXTS)
    assert fake.calls == []
    assert result.probabilities.reshape(-1).tolist() == pytest.approx([0.9] * 4)
    assert result.verdicts.reshape(-1).tolist() == [False] * 4 and result.routes == ["c"] * 4


def test_sequence_and_switch_route_empty_texts_params_and_lengths():
    doc = {
        "request_parameters": {"route": ["fast", "accurate"]},
        "root": {"kind": "sequence", "steps": [
            {"kind": "switch", "cases": [{"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5}}]},
            {"kind": "switch", "cases": [
                {"when": {"param": {"name": "route", "equals": "accurate"}}, "then": model("accurate")},
                {"when": {"tokens": {"min": 5}}, "then": model("third")},
            ], "default": model("fast")},
        ]},
    }
    texts = ["", "good film", "a long tale of good things", "  "]
    result, fake = run(doc, texts)
    assert result.routes == ["empty", "fast", "third", "empty"]
    assert fake.calls[0]["rows"] == 2  # empty texts are never tokenized
    result, _ = run(doc, texts, params={"route": "accurate"})
    assert result.routes == ["empty", "accurate", "accurate", "empty"]
    assert result.probabilities[1, 0] == pytest.approx(sig(expected_logit("accurate", ids_of("good film"))), rel=1e-6)


def test_switch_with_score_and_margin_below():
    doc = {"root": {"kind": "switch", "score": model("fast"),
                    "cases": [{"when": {"margin_below": 0.2}, "then": model("accurate")}]}}
    result, _ = run(doc, TEXTS)
    for t, route in zip(TEXTS, result.routes):
        unsure = abs(sig(expected_logit("fast", ids_of(t))) - 0.5) < 0.2
        assert route == ("accurate" if unsure else "fast"), t


def test_cascade_escalates_only_unsure_texts():
    doc = {"root": {"kind": "cascade", "margin": 0.3, "stages": [model("fast"), model("accurate")]}}
    result, fake = run(doc, TEXTS)
    unsure = [abs(sig(expected_logit("fast", ids_of(t))) - 0.5) < 0.3 for t in TEXTS]
    assert result.routes == ["accurate" if u else "fast" for u in unsure]
    assert [c["rows"] for c in fake.calls if c["model"] == "accurate"] == [sum(unsure)]


@pytest.mark.parametrize("first", [
    # a constant at the threshold with its own verdict: unsure by probability, but settled
    {"kind": "constant", "name": "fixed", "probability": 0.5, "verdict": False},
    # a vote of two models and a constant: 1/3 or 2/3, within the margin of 0.5, yet a verdict
    {"kind": "parallel", "name": "fixed", "combine": "vote",
     "nodes": [model("fast"), model("third"), {"kind": "constant", "name": "half", "probability": 0.5}]},
])
def test_cascade_never_escalates_a_text_whose_verdict_its_first_stage_fixed(first):
    doc = {"root": {"kind": "cascade", "margin": 0.49, "stages": [first, model("accurate")]}}
    result, fake = run(doc, TEXTS)
    assert "accurate" not in fake.models_called()
    assert all(r == "fixed" or r.startswith("parallel:vote") for r in result.routes), result.routes
    # the same cascade without a fixed verdict escalates them: the margin alone would have
    assert run({"root": {"kind": "cascade", "margin": 0.49, "stages": [
        {"kind": "constant", "name": "open", "probability": 0.5}, model("accurate")]}}, TEXTS)[1].models_called()[-1] == "accurate"


def test_chunk_node_windows_and_aggregates():
    long = " ".join(["good"] * 9 + ["bad"] * 12)  # 23 tokens
    doc = {"root": {"kind": "chunk", "window": 8, "stride": 4, "aggregation": "length_weighted_mean", "node": model("fast")}}
    result, fake = run(doc, [long, "good film"])
    wins = token_windows(np.array(ids_of(long)), 8, 4)
    new_tokens = [6, 4, 4, 4, 3]  # content tokens no earlier window covered (tests/unit/test_chunk_rounds.py)
    want = sum(sig(expected_logit("fast", w)) * n for w, n in zip(wins, new_tokens)) / sum(new_tokens)
    assert result.probabilities[0, 0] == pytest.approx(want, rel=1e-6)
    assert result.routes == ["chunked:fast", "fast"]
    assert fake.calls[1]["rows"] == len(wins) + 1  # every window and the short text in one call


def test_split_node_is_deterministic_per_request_id():
    doc = {"root": {"kind": "split", "name": "ab", "branches": [{"weight": 1, "node": model("fast")},
                                                                  {"weight": 1, "node": model("accurate")}]}}
    for rid in ["r1", "r2", "r3", "r4", "r5"]:
        result, _ = run(doc, TEXTS, request_id=rid)
        arm = "fast" if split_fraction("ab", rid) < 0.5 else "accurate"
        assert result.routes == [arm] * 4, rid


@pytest.mark.parametrize("combine", ["mean", "max", "vote"])
def test_parallel_node_combines(combine):
    doc = {"root": {"kind": "parallel", "combine": combine, "nodes": [model("fast"), model("accurate"), model("third")]}}
    result, fake = run(doc, TEXTS, thresholds=0.55)
    assert all(c["alone"] is False for c in fake.calls if c["model"] != "tokenizer")  # concurrent branches
    for k, t in enumerate(TEXTS):
        probs = [sig(expected_logit(m, ids_of(t))) for m in ("fast", "accurate", "third")]
        if combine == "vote":
            share = sum(p >= 0.55 for p in probs) / 3
            assert result.probabilities[k, 0] == pytest.approx(share) and result.verdicts[k, 0] == (share > 0.5)
        else:
            want = np.mean(probs) if combine == "mean" else max(probs)
            assert result.probabilities[k, 0] == pytest.approx(want, rel=1e-6)
        assert result.routes[k] == f"parallel:{combine}(fast,accurate,third)"


def test_fallback_node_answers_from_the_next_option():
    doc = {"root": {"kind": "fallback", "name": "fb", "nodes": [model("fast"), model("accurate")]}}
    result, _ = run(doc, TEXTS, fake=FakeBLS(fail={"fast"}))
    assert result.routes == ["accurate"] * 4
    with pytest.raises(DownstreamError, match=r"all options of fallback 'fb' failed: model 'fast' failed: injected; model 'accurate'"):
        run(doc, TEXTS, fake=FakeBLS(fail={"fast", "accurate"}))


def test_node_timeout_fails_the_node():
    doc = {"root": {"kind": "fallback", "nodes": [model("fast", timeout_ms=50), model("accurate")]}}
    result, _ = run(doc, TEXTS, fake=FakeBLS(delay={"fast": 1.0}))
    assert result.routes == ["accurate"] * 4
    with pytest.raises(DownstreamError, match=r"node 'fast' timed out after 50 ms"):
        run({"root": model("fast", timeout_ms=50)}, TEXTS, fake=FakeBLS(delay={"fast": 1.0}))


def test_calls_are_split_at_bls_max_batch_size_and_answers_stay_in_order():
    texts = [f"good {'bad ' * (i % 3)}x{i}" for i in range(10)]
    result, fake = run({"bls_max_batch_size": 4, "root": model("fast")}, texts, thresholds=0.6)
    want = [sig(expected_logit("fast", ids_of(t))) for t in texts]
    assert result.probabilities.reshape(-1).tolist() == pytest.approx(want, rel=1e-6)
    assert result.verdicts.reshape(-1).tolist() == [np.float32(p) >= np.float32(0.6) for p in want]
    assert [c["rows"] for c in fake.calls] == [4, 4, 2] * 2  # tokenizer, classifier


def test_a_text_over_the_window_limit_refuses_only_its_request():
    doc = {"version": 1, "limits": {"max_windows_per_text": 3},
           "root": {"kind": "chunk", "window": 8, "stride": 4, "node": model("fast")}}
    long = " ".join(["good"] * 30)  # 32 tokens: 7 windows of 8 at stride 4
    bls = FakeBLS()
    engine = Engine(parse_policy(doc), bls)
    thr = np.full(1, 0.5, np.float32)
    ok, refused = asyncio.run(engine.run([Work(["good film"], thr, {}), Work([long], thr, {})]))
    assert ok.routes == ["fast"]
    # the refused text is never classified: one call, of the other text's one row
    assert [(c["model"], c["rows"]) for c in bls.calls if c["model"] != "tokenizer"] == [("fast", 1)]
    assert isinstance(refused, LimitError) and refused.limit == "max_windows_per_text"
    assert str(refused) == ("TEXT[0]: 32 tokens make 7 windows, over the limit of 3 windows per text "
                            "(policy limits.max_windows_per_text)")
    at_cap = " ".join(["good"] * 14)  # 16 tokens: exactly 3 windows of 8 at stride 4, the limit itself
    [answered] = asyncio.run(engine.run([Work([at_cap], thr, {})]))
    assert answered.routes == ["chunked:fast"]


class Trace:
    """A ``pb_utils.InferenceTrace`` stand-in: ``get_context()`` is the OpenTelemetry
    context of a sampled request (opentelemetry mode), None otherwise (and in triton mode)."""

    def __init__(self, name, context=None):
        self.name, self.context = name, context

    def get_context(self):
        return self.context

    def __repr__(self):
        return self.name


def test_a_request_trace_goes_with_every_call_made_for_it_and_a_mixed_call_carries_one():
    """A BLS request carries one trace (request.call_trace): calls whose rows all come
    from one request carry its trace; a call batching rows of several requests carries
    the first one's in row order, or the first that has a context (a sampled request
    in opentelemetry mode); no trace at all: none."""
    from orchestrator.runtime.request import RequestContext

    fake = FakeBLS()
    engine = Engine(parse_policy({"version": 1, "root": model("fast")}), fake)
    thr = np.full(1, 0.5, np.float32)
    t1, t2 = Trace("t1"), Trace("t2")
    one = Work(["good film"], thr, {}, "r1", context=RequestContext(trace=t1))
    asyncio.run(engine.run([one]))
    assert [c["options"].trace for c in fake.calls] == [t1, t1]  # tokenizer and classifier
    fake.calls.clear()
    two = Work(["bad plot"], thr, {}, "r2", context=RequestContext(trace=t2))
    asyncio.run(engine.run([one, two]))
    assert [c["rows"] for c in fake.calls] == [2, 2]  # one batched call per model
    assert [c["options"].trace for c in fake.calls] == [t1, t1]
    fake.calls.clear()
    asyncio.run(engine.run([two, one]))
    assert [c["options"].trace for c in fake.calls] == [t2, t2]
    fake.calls.clear()
    sampled = Trace("t3", context='{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}')
    three = Work(["fine acting"], thr, {}, "r3", context=RequestContext(trace=sampled))
    asyncio.run(engine.run([one, three]))
    assert [c["options"].trace for c in fake.calls] == [sampled, sampled]
    fake.calls.clear()
    asyncio.run(engine.run([Work(["good"], thr, {}), Work(["bad"], thr, {})]))
    assert [c["options"].trace for c in fake.calls] == [None, None]


@pytest.mark.parametrize("timing", [True, False])
def test_timing_off_skips_the_timing_observations_and_keeps_every_count(timing):
    """``metrics_timing_sample: off`` (``Metrics.timing`` False): a run takes no stage or
    node-latency observation at all, and counts every text as before."""
    from tests.unit.test_shadow import RecordingMetrics

    metrics = RecordingMetrics()
    metrics.timing = timing
    doc = {"version": 1, "root": {"kind": "cascade", "name": "cas", "margin": 0.4, "stages": [model("fast"), model("accurate")]}}
    engine = Engine(parse_policy(doc), FakeBLS(), metrics)
    [result] = asyncio.run(engine.run([Work(list(TEXTS), np.full(len(TEXTS), 0.5, np.float32), {}, "")]))
    timed = {k[0] for k in metrics.observations}
    assert timed == ({"orchestrator_stage_seconds", "orchestrator_node_latency_seconds"} if timing else set())
    assert sum(v for (family, _), v in metrics.counts.items() if family == "orchestrator_texts_total") == len(TEXTS)
    assert len(result.routes) == len(TEXTS)
