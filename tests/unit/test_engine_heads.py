"""Every node kind with K-column heads and a tokenizer per model, through the engine with a
fake BLS function. Expected answers are computed here with numpy from the fake models'
documented arithmetic, independently of the engine and of ``heads``' own code paths."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.runtime.errors import DownstreamError, PolicyError
from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.request import Work
from orchestrator.runtime.routing.heads import BINARY, LEGACY, MULTICLASS, MULTILABEL, Head
from orchestrator.runtime.routing.policy import bind_heads, parse_policy
from tests.helpers import FakeBLS, ids_of, word_id
from tests.unit.test_shadow import RecordingMetrics

LABELS3 = ("neg", "neutral", "pos")
HEADS = {
    "fast": LEGACY,
    "mc": Head(MULTICLASS, LABELS3),
    "mc2": Head(MULTICLASS, LABELS3),
    "ml": Head(MULTILABEL, ("toxic", "insult", "threat")),
    "ml2": Head(MULTILABEL, ("toxic", "insult", "threat")),
    # a RoBERTa-like model: its own tokenizer, pad id 1, the same binary head as "fast"
    "fast_b": Head(BINARY, ("POSITIVE",), tokenizer="tok_b", pad_token_id=1, max_length=514),
    "short": Head(BINARY, ("positive",), max_length=16),
}


def ids_b(text):
    """tok_b: ``<s>=0``, one id per word (``word_id + 7``), ``</s>=2``."""
    return [0] + [word_id(w) + 7 for w in text.split()] + [2]


def fake_logits(model, ids):
    """The fake models' logits from a row's ids (mask applied)."""
    ids = list(ids)
    good, bad = ids.count(2000) + ids.count(2007), ids.count(3000) + ids.count(3007)
    n = len(ids)
    if model in ("mc", "mc2"):
        z = [bad - good, 0.3 * (n % 3), good - bad]
        return z if model == "mc" else [z[2], z[1], z[0]]  # mc2: neg and pos swapped
    if model in ("ml", "ml2"):
        z = [bad - 0.5, 0.4 * bad - good, -1.0 + 0.1 * n]
        return z if model == "ml" else [z[0] - 1.5, z[1], z[2]]
    return [1.0 * (good - bad) + (0.1 if model != "fast_b" else -0.3)]


class KFake(FakeBLS):
    """FakeBLS plus tokenizer ``tok_b`` and models answering several logits."""

    async def __call__(self, model, inputs, parameters, request_id, alone, options=None):
        if model == "tok_b":
            self.calls.append({"model": model, "rows": inputs["TEXT"].shape[0], "inputs": inputs})
            seqs = [ids_b(t.decode()) for t in inputs["TEXT"].reshape(-1)]
            width = max(len(s) for s in seqs)
            ids, mask = np.ones((len(seqs), width), np.int64), np.zeros((len(seqs), width), np.int64)
            for r, s in enumerate(seqs):
                ids[r, : len(s)], mask[r, : len(s)] = s, 1
            return {"input_ids": ids, "attention_mask": mask}
        if model in ("tokenizer",) or "input_ids" not in inputs:
            return await super().__call__(model, inputs, parameters, request_id, alone, options)
        self.calls.append({"model": model, "rows": inputs["input_ids"].shape[0], "inputs": inputs, "request_id": request_id})
        rows = [fake_logits(model, r[m.astype(bool)]) for r, m in zip(inputs["input_ids"], inputs["attention_mask"])]
        return {"logits": np.array(rows, np.float32)}


def softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def sig(z):
    return 1.0 / (1.0 + np.exp(-np.asarray(z, np.float64)))


def engine_for(root, heads=HEADS, metrics=None, **top):
    policy = bind_heads(parse_policy({"version": 1, "root": root, **top}), heads)
    fake = KFake()
    return Engine(policy, fake, metrics), fake


def run(engine, texts, thresholds):
    thr = np.asarray(thresholds, np.float32).reshape(len(texts), -1)
    [result] = asyncio.run(engine.run([Work(list(texts), thr, {}, "r")]))
    return result


def model(name, **kw):
    return {"kind": "model", "name": kw.pop("node_name", name), "model": name, **kw}


TEXTS = ["good good film", "bad plot", "good bad", "a long tale of good things", "bad bad bad good", "plain words here"]


def test_multiclass_model_answers_softmax_and_the_top_label():
    engine, _ = engine_for(model("mc"))
    result = run(engine, TEXTS, np.full(len(TEXTS), 0.4))
    want = np.stack([softmax(fake_logits("mc", ids_of(t))) for t in TEXTS])
    np.testing.assert_allclose(result.probabilities, want, rtol=1e-6)
    top = want.argmax(axis=1)
    expect = np.zeros_like(want, dtype=bool)
    expect[np.arange(len(TEXTS)), top] = want[np.arange(len(TEXTS)), top] >= 0.4
    assert result.verdicts.tolist() == expect.tolist() and result.verdicts.shape == (len(TEXTS), 3)


def test_multilabel_model_with_a_threshold_per_label():
    engine, _ = engine_for(model("ml"))
    thr = np.tile([0.5, 0.3, 0.6], (len(TEXTS), 1))
    result = run(engine, TEXTS, thr)
    want = np.stack([sig(fake_logits("ml", ids_of(t))) for t in TEXTS])
    np.testing.assert_allclose(result.probabilities, want, rtol=1e-6)
    assert result.verdicts.tolist() == (want.astype(np.float32) >= thr.astype(np.float32)).tolist()


def test_multilabel_calibration_shifts_each_label():
    engine, _ = engine_for(model("ml", calibration={"reference_threshold": 0.5, "threshold": [0.4, 0.5, 0.6]}))
    result = run(engine, TEXTS[:2], np.full(2, 0.5))
    shift = np.log(1.0) - np.log([0.4 / 0.6, 1.0, 0.6 / 0.4])
    want = np.stack([sig(np.array(fake_logits("ml", ids_of(t))) + shift) for t in TEXTS[:2]])
    np.testing.assert_allclose(result.probabilities, want, rtol=1e-6)


@pytest.mark.parametrize("margin", [0.2, 0.6])
def test_multiclass_cascade_escalates_when_the_top_two_are_close(margin):
    engine, fake = engine_for({"kind": "cascade", "margin": margin, "stages": [model("mc"), model("mc2")]})
    result = run(engine, TEXTS, np.full(len(TEXTS), 0.5))
    first = [softmax(fake_logits("mc", ids_of(t))) for t in TEXTS]
    unsure = [np.sort(p)[-1] - np.sort(p)[-2] < margin for p in first]
    assert 0 < sum(unsure) < len(TEXTS)  # both outcomes are tested
    assert result.routes == ["mc2" if u else "mc" for u in unsure]
    assert [c["rows"] for c in fake.calls if c["model"] == "mc2"] == [sum(unsure)]


def test_multilabel_cascade_escalates_when_any_label_is_within_the_margin():
    engine, _ = engine_for({"kind": "cascade", "margin": 0.1, "stages": [model("ml"), model("ml2")]})
    thr = np.full(len(TEXTS), 0.5)
    result = run(engine, TEXTS, thr)
    first = [sig(fake_logits("ml", ids_of(t))) for t in TEXTS]
    unsure = [bool((np.abs(p - 0.5) < 0.1).any()) for p in first]
    assert 0 < sum(unsure) < len(TEXTS)
    assert result.routes == ["ml2" if u else "ml" for u in unsure]


def test_chunk_combines_each_column_and_keeps_a_multiclass_max_a_distribution():
    long = " ".join(["good"] * 9 + ["bad"] * 12 + ["plot"] * 5)
    for how in ("mean", "max"):
        engine, fake = engine_for({"kind": "chunk", "window": 10, "stride": 6, "aggregation": how, "node": model("mc")})
        result = run(engine, [long, "good film"], np.full(2, 0.5))
        windows = [c["inputs"]["input_ids"] for c in fake.calls if c["model"] == "mc"][0]
        masks = [c["inputs"]["attention_mask"] for c in fake.calls if c["model"] == "mc"][0]
        probs = [softmax(fake_logits("mc", r[m.astype(bool)])) for r, m in zip(windows, masks)]
        whole = [p for p, m in zip(probs, masks) if m.sum() == 10]  # the long text's windows (full width)
        want = np.mean(whole, axis=0) if how == "mean" else np.max(whole, axis=0) / np.max(whole, axis=0).sum()
        np.testing.assert_allclose(result.probabilities[0], want, rtol=1e-6)
        assert result.probabilities[0].sum() == pytest.approx(1.0, abs=1e-6)
        assert result.routes == ["chunked:mc", "mc"]


def test_parallel_vote_per_column_and_a_tie_is_false():
    root = {"kind": "parallel", "combine": "vote", "nodes": [model("ml"), model("ml2")]}
    engine, _ = engine_for(root)
    result = run(engine, TEXTS, np.full(len(TEXTS), 0.5))
    a = np.stack([sig(fake_logits("ml", ids_of(t))) >= 0.5 for t in TEXTS])
    b = np.stack([sig(fake_logits("ml2", ids_of(t))) >= 0.5 for t in TEXTS])
    share = (a.astype(float) + b) / 2
    assert (share == 0.5).any()  # a tie happens: one voter of two is not a majority
    np.testing.assert_allclose(result.probabilities, share)
    assert result.verdicts.tolist() == (share > 0.5).tolist()
    engine, _ = engine_for({"kind": "parallel", "combine": "mean", "nodes": [model("ml"), model("ml2")]})
    mean = run(engine, TEXTS, np.full(len(TEXTS), 0.5))
    want = np.stack([(sig(fake_logits("ml", ids_of(t))) + sig(fake_logits("ml2", ids_of(t)))) / 2 for t in TEXTS])
    np.testing.assert_allclose(mean.probabilities, want, rtol=1e-6)


def test_each_model_gets_its_own_tokenizers_ids_and_pad_id():
    root = {"kind": "split", "name": "ab", "branches": [{"weight": 1, "node": model("fast")}, {"weight": 1, "node": model("fast_b")}]}
    engine, fake = engine_for({"kind": "parallel", "combine": "mean", "nodes": [model("fast"), model("fast_b")]})
    texts = ["good good film", "bad"]
    result = run(engine, texts, np.full(2, 0.5))
    want = [(sig(fake_logits("fast", ids_of(t))) + sig(fake_logits("fast_b", ids_b(t)))) / 2 for t in texts]
    np.testing.assert_allclose(result.probabilities.reshape(-1), np.reshape(want, -1), rtol=1e-6)
    [b_call] = [c for c in fake.calls if c["model"] == "fast_b"]
    ids, mask = b_call["inputs"]["input_ids"], b_call["inputs"]["attention_mask"]
    assert ids[0, 0] == 0 and (ids[mask == 0] == 1).all() and (mask == 0).any()  # tok_b's ids, padded with 1
    [a_call] = [c for c in fake.calls if c["model"] == "fast"]
    assert (a_call["inputs"]["input_ids"][a_call["inputs"]["attention_mask"] == 0] == 0).all()
    assert {c["model"] for c in fake.calls} >= {"tokenizer", "tok_b"}
    engine_for(root)  # a split over the two tokenizers binds too


def test_a_model_answering_more_logits_than_its_head_is_an_error_not_an_answer():
    engine, _ = engine_for(model("mc"), heads={"mc": LEGACY})
    with pytest.raises(DownstreamError, match=r"model 'mc' answered 3 logit columns, but its head has 1"):
        run(engine, TEXTS[:1], [0.5])


def test_shadow_counts_a_multiclass_flip_when_the_top_label_changes():
    metrics = RecordingMetrics()
    engine, _ = engine_for({"kind": "shadow", "name": "sh", "primary": model("mc"), "candidate": model("mc2")}, metrics=metrics)
    run(engine, TEXTS, np.full(len(TEXTS), 0.9))  # no verdict at 0.9: flips still count top labels
    assert engine.mirror_runner.wait(5.0)
    engine.close()
    tops = [(softmax(fake_logits("mc", ids_of(t))).argmax(), softmax(fake_logits("mc2", ids_of(t))).argmax()) for t in TEXTS]
    flips = sum(a != b for a, b in tops)
    assert 0 < flips < len(TEXTS)
    assert metrics.count("orchestrator_shadow_flips_total", node="sh", candidate="mc2") == flips


@pytest.mark.parametrize(
    "root, message",
    [
        ({"kind": "cascade", "margin": 0.1, "stages": [model("fast"), model("mc")]},
         r"root.stages\[1\].model: 'mc' has a multiclass \(3 labels: neg, neutral, pos\) head, but 'fast' \(root.stages\[0\]\)"),
        ({"kind": "fallback", "nodes": [model("ml"), model("mc")]}, r"root.nodes\[1\].model: 'mc' has a multiclass"),
        ({"kind": "chunk", "window": 32, "node": {"kind": "fallback", "nodes": [model("fast"), model("fast_b")]}},
         r"root: its models use different tokenizers \(tok_b, tokenizer\)"),
        (model("short", max_length=32), r"root.max_length: 32 tokens, over model 'short''s maximum of 16"),
        ({"kind": "chunk", "window": 32, "node": model("short", max_length=16)}, r"root.window: 32 tokens, over model 'short''s maximum of 16"),
        (model("mc", calibration={"reference_threshold": 0.5, "threshold": 0.4}), r"root.calibration: a multiclass head"),
        (model("ml", calibration={"reference_threshold": 0.5, "threshold": [0.4, 0.5]}), r"root.calibration: 2 values for the 3 label"),
        ({"kind": "sequence", "steps": [{"kind": "switch", "cases": [
            {"when": {"empty": True}, "then": {"kind": "constant", "name": "e", "probability": [0.5, 0.5]}}]}, model("mc")]},
         r"e.probability: 2 values, but the policy's head .* answers 3 column"),
        (model("nowhere"), r"root.model: model 'nowhere' is not in the model repository"),
    ],
)
def test_binding_refuses_policies_the_heads_cannot_answer(root, message):
    with pytest.raises(PolicyError, match=message):
        engine_for(root)


def test_heads_that_agree_bind_with_label_case_ignored():
    policy = parse_policy({"version": 1, "root": {"kind": "fallback", "nodes": [model("fast"), model("fast_b")]}})
    plan = bind_heads(policy, HEADS)
    assert plan.head == LEGACY and plan.tokenizers() == ["tokenizer", "tok_b"]


def test_sigmoid_is_the_two_stable_formulas_bit_for_bit():
    """The head's sigmoid: 1 / (1 + exp(-x)) for x >= 0 and exp(x) / (1 + exp(x)) below, the
    very same float64 operations, finite at +-800 and 1/0 at +-inf."""
    from orchestrator.runtime.routing.heads import sigmoid

    x = np.concatenate([np.random.default_rng(0).normal(0.0, 12.0, 5000), [0.0, -0.0, 1e-300, -1e-300, 800.0, -800.0]])
    want = np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.maximum(x, 0))), np.exp(np.minimum(x, 0)) / (1.0 + np.exp(np.minimum(x, 0))))
    got = sigmoid(x)
    assert got.dtype == np.float64 and got.shape == x.shape and got.tobytes() == want.tobytes()
    assert sigmoid(np.array([[np.inf, -np.inf]])).tolist() == [[1.0, 0.0]]
    assert sigmoid(np.array([-3.0]))[0] == pytest.approx(1 / (1 + np.exp(3.0)), rel=1e-15)


def test_request_parameters_empty_object_and_json():
    from orchestrator.runtime.errors import InputError
    from orchestrator.runtime.request import request_parameters

    assert request_parameters("{}") == {} and request_parameters("") == {} and request_parameters(None) == {}
    assert request_parameters('{"route": "fast", "n": 2}') == {"route": "fast", "n": 2}
    assert request_parameters(' {} ') == {}
    with pytest.raises(InputError, match="expected a JSON object"):
        request_parameters("[]")
