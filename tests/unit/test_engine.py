"""The policy engine driven by a fake BLS function: every node kind, no server, no ONNX.

The fake downstream models are arithmetic on the text, so every expected answer is
computed here independently of the engine:
- ``tokenizer``: ``[101] + one id per word + [102]``; ``good`` is 2000, ``bad`` 3000,
  other words ``1000 + len(word)``; the ``truncation`` parameter is honoured.
- classifier ``m``: logit = ``GAIN[m] * (#good - #bad) + BIAS[m]`` over the row's ids.
- ``postprocess``: sigmoid and ``>= THRESHOLD``.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from orchestrator.runtime.engine import Engine
from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.nodes import KINDS
from orchestrator.runtime.nodes.chunk import aggregate, token_windows
from orchestrator.runtime.nodes.split import split_fraction
from orchestrator.runtime.policy import parse_policy
from orchestrator.runtime.request import Work
from orchestrator.runtime.scores import logit

GAIN = {"fast": 1.0, "accurate": 2.0, "third": 0.5}
BIAS = {"fast": 0.1, "accurate": -0.2, "third": 0.3}


def word_id(word: str) -> int:
    return {"good": 2000, "bad": 3000}.get(word, 1000 + len(word))


def ids_of(text: str) -> list:
    return [101] + [word_id(w) for w in text.split()] + [102]


def expected_logit(model: str, ids) -> float:
    ids = list(ids)
    return GAIN[model] * (ids.count(2000) - ids.count(3000)) + BIAS[model]


def sig(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


class FakeBLS:
    """The ``infer`` function the engine calls; records every call."""

    def __init__(self, fail=(), delay=None):
        self.calls = []
        self.fail = set(fail)
        self.delay = delay or {}

    async def __call__(self, model, inputs, parameters, request_id, alone):
        self.calls.append({"model": model, "rows": next(iter(inputs.values())).shape[0], "parameters": dict(parameters or {}),
                           "request_id": request_id, "alone": alone, "inputs": inputs})
        if model in self.delay:
            await asyncio.sleep(self.delay[model])
        if model in self.fail:
            raise DownstreamError(f"model '{model}' failed: injected")
        if model == "tokenizer":
            seqs = [ids_of(t.decode()) for t in inputs["TEXT"].reshape(-1)]
            width = max(len(s) for s in seqs)
            ids = np.zeros((len(seqs), width), np.int64)
            mask = np.zeros((len(seqs), width), np.int64)
            for r, s in enumerate(seqs):
                ids[r, : len(s)], mask[r, : len(s)] = s, 1
            assert parameters.get("truncation") is False
            return {"input_ids": ids, "attention_mask": mask}
        if model == "postprocess":
            p = 1.0 / (1.0 + np.exp(-inputs["logits"].astype(np.float64)))
            return {"PROBABILITIES": p.astype(np.float32), "VERDICTS": p.astype(np.float32) >= inputs["THRESHOLD"]}
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        logits = [expected_logit(model, row[m.astype(bool)]) for row, m in zip(ids, mask)]
        return {"logits": np.array(logits, np.float32).reshape(-1, 1)}

    def models_called(self):
        return [c["model"] for c in self.calls]


def run(policy_doc, texts, thresholds=0.5, params=None, request_id="", fake=None, inline_post=True):
    doc = {"version": 1, "inline": {"postprocess": inline_post}, **policy_doc}
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
    assert set(KINDS) == {"model", "constant", "sequence", "switch", "cascade", "chunk", "split", "parallel", "fallback"}


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


def test_chunk_node_windows_and_aggregates():
    long = " ".join(["good"] * 9 + ["bad"] * 12)  # 23 tokens
    doc = {"root": {"kind": "chunk", "window": 8, "stride": 4, "aggregation": "length_weighted_mean", "node": model("fast")}}
    result, fake = run(doc, [long, "good film"])
    wins = token_windows(np.array(ids_of(long)), 8, 4)
    want = aggregate([sig(expected_logit("fast", w)) for w in wins], [len(w) for w in wins], "length_weighted_mean")
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


def test_bls_postprocess_equals_inline_and_calls_are_split_at_bls_max_batch_size():
    texts = [f"good {'bad ' * (i % 3)}x{i}" for i in range(10)]
    doc = {"bls_max_batch_size": 4, "root": model("fast")}
    inline, _ = run(doc, texts, thresholds=0.6)
    bls, fake = run(doc, texts, thresholds=0.6, inline_post=False)
    np.testing.assert_allclose(bls.probabilities, inline.probabilities, rtol=1e-6)
    assert (bls.verdicts == inline.verdicts).all()
    assert [c["rows"] for c in fake.calls] == [4, 4, 2] * 3  # tokenizer, classifier, postprocess
