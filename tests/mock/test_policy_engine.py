"""Every policy node kind, run by the real router code on the in-process mock.

Expected values come from independent computations: direct calls to the tokenizer and
classifier models, the logistic function, and the node's documented rule.
"""

from __future__ import annotations

import contextvars
import functools
import math
import shutil
import time

import numpy as np
import pytest

from orchestrator.runtime.routing.heads import read_head, sigmoid
from orchestrator.runtime.routing.nodes.chunk import token_windows
from orchestrator.runtime.routing.nodes.split import split_fraction
from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.tooling.modeling import data
from tests import helpers
from tests.helpers import REPO, add_router_variant

FAST = {"kind": "model", "model": "classifier_fast"}
ACC = {"kind": "model", "model": "classifier"}


def root(node, **top):
    return {"version": 1, "root": node, **top}


def _default_with(**top):
    import yaml

    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    document.update(top)
    return {k: v for k, v in document.items() if v is not None}


POLICIES = {
    "p_default": _default_with(inline=None),  # the tokenizer through BLS
    "p_inline": _default_with(),  # the shipped policy: inline
    "p_constant": root({"kind": "constant", "name": "c", "probability": 0.3}),
    "p_tokens": root(
        {
            "kind": "switch",
            "cases": [{"when": {"tokens": {"max": 8}}, "then": {"kind": "constant", "name": "short", "probability": 0.9}}],
            "default": FAST,
        }
    ),
    "p_param": root(
        {
            "kind": "switch",
            "cases": [{"when": {"param": {"name": "tenant", "equals": "gold"}}, "then": {**ACC, "route": "gold"}}],
            "default": FAST,
        },
        request_parameters={"tenant": ["gold", "free"]},
    ),
    "p_margin": root(
        {
            "kind": "switch",
            "score": FAST,
            "cases": [{"when": {"margin_below": 0.2}, "then": {**ACC, "route": "escalated"}}],
        }
    ),
    "p_mean": root({"kind": "parallel", "combine": "mean", "nodes": [ACC, FAST]}),
    "p_max": root({"kind": "parallel", "combine": "max", "nodes": [ACC, FAST]}),
    "p_vote": root(
        {
            "kind": "parallel",
            "combine": "vote",
            "nodes": [ACC, FAST, {"kind": "constant", "name": "no", "probability": 0.0}],
        }
    ),
    "p_split": root(
        {
            "kind": "split",
            "name": "ab",
            "branches": [
                {"weight": 3, "node": {"kind": "constant", "name": "A", "probability": 0.1}},
                {"weight": 1, "node": {"kind": "constant", "name": "B", "probability": 0.9}},
            ],
        }
    ),
    "p_fallback": root({"kind": "fallback", "nodes": [{**FAST, "route": "primary"}, {**ACC, "route": "backup"}]}),
    "p_timeout": root(
        {
            "kind": "fallback",
            "nodes": [
                {**ACC, "name": "slow", "timeout_ms": 100},
                {"kind": "constant", "name": "gave_up", "probability": 0.5, "verdict": False},
            ],
        }
    ),
    "p_small_parts": root(FAST, bls_max_batch_size=4),
    "p_calibrated": root({**FAST, "calibration": {"reference_threshold": 0.5, "threshold": 0.4}}),
    "p_chunk_max": root({"kind": "chunk", "window": 24, "stride": 10, "aggregation": "max", "node": FAST}),
    "p_cascade3": root(
        {"kind": "cascade", "margin": 1.0, "stages": [FAST, ACC, {"kind": "constant", "name": "last", "probability": 0.42}]}
    ),
    "p_ondemand": root({"kind": "model", "model": "classifier_spare", "on_demand": {"idle_timeout_s": 0.2, "retry_after_s": 60}}),
    "p_ondemand_broken": root(
        {
            "kind": "fallback",
            "nodes": [
                {"kind": "model", "model": "classifier_broken", "on_demand": {"idle_timeout_s": 60, "retry_after_s": 60}},
                {**FAST, "route": "fallback"},
            ],
        }
    ),
}


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("policies") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "classifier_fast", repo / "classifier_spare")
    for cfg in (repo / "classifier_spare").rglob("*.pbtxt"):
        cfg.write_text(cfg.read_text().replace('name: "classifier_fast"', 'name: "classifier_spare"'))
    shutil.copytree(repo / "classifier_spare", repo / "classifier_broken")
    for cfg in (repo / "classifier_broken").rglob("*.pbtxt"):
        cfg.write_text(cfg.read_text().replace('name: "classifier_spare"', 'name: "classifier_broken"'))
    (repo / "classifier_broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    for name, document in POLICIES.items():
        add_router_variant(repo, name, document)
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "classifier_fast", "postprocess", *POLICIES):
            m.load(name)
        yield m


TEXTS = data.held_out_texts(n=10, seed=5)


# the mock's router flushes its metrics every 0.5 s, in this process: a shorter wait will do
eventually = functools.partial(helpers.eventually, timeout=5.0, interval=0.05)


def ask(mock, model, texts, threshold=0.5, parameters=None, request_id=""):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    out = mock.infer(model, {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), threshold, np.float32)}, parameters=parameters, request_id=request_id)
    return out["PROBABILITIES"].reshape(-1), out["VERDICTS"].reshape(-1), [r.decode() for r in out["ROUTE"].reshape(-1)]


def temperature(model):
    """The model's head.json calibration temperature (what its head divides the logit by)."""
    return float(read_head(REPO / model).temperature[0])


def direct(mock, model, texts):
    """Independent: tokenizer (truncating) then the classifier, one text at a time; the
    logit divided by the head's temperature, then the sigmoid."""
    probs = []
    for text in texts:
        tok = mock.infer("tokenizer", {"TEXT": np.array([[text.encode()]], dtype=np.object_)})
        z = mock.infer(model, tok)["logits"][0, 0] / temperature(model)
        probs.append(1.0 / (1.0 + math.exp(-float(z))))
    return np.array(probs)


def test_constant_answers_without_models_and_the_head_decides(mock):
    mock.reset_calls()
    p, v, r = ask(mock, "p_constant", TEXTS[:3], threshold=0.25)
    assert np.allclose(p, 0.3) and v.tolist() == [True] * 3 and r == ["c"] * 3
    assert {c.model for c in mock.calls} == {"p_constant"}
    p, v, r = ask(mock, "p_constant", TEXTS[:1], threshold=0.3)  # p >= threshold, at the boundary in float32
    assert v.tolist() == [True]


def test_switch_on_token_length(mock):
    p, v, r = ask(mock, "p_tokens", ["ok", TEXTS[0]])
    assert r == ["short", "classifier_fast"]
    assert p[0] == pytest.approx(0.9)
    assert p[1] == pytest.approx(direct(mock, "classifier_fast", [TEXTS[0]])[0], abs=1e-5)


def test_switch_on_a_request_parameter(mock):
    gold = ask(mock, "p_param", TEXTS[:2], parameters={"tenant": "gold"})
    free = ask(mock, "p_param", TEXTS[:2], parameters={"tenant": "free"})
    none = ask(mock, "p_param", TEXTS[:2])
    assert gold[2] == ["gold", "gold"] and free[2] == none[2] == ["classifier_fast"] * 2
    np.testing.assert_allclose(gold[0], direct(mock, "classifier", TEXTS[:2]), atol=1e-5)
    with pytest.raises(InferError, match="parameter tenant='classifier': not a route this policy exposes"):
        ask(mock, "p_param", TEXTS[:1], parameters={"tenant": "classifier"})


def test_switch_on_a_probability_margin(mock):
    fast = direct(mock, "classifier_fast", TEXTS)
    acc = direct(mock, "classifier", TEXTS)
    p, _, r = ask(mock, "p_margin", TEXTS)
    unsure = np.abs(fast - 0.5) < 0.2
    assert r == ["escalated" if u else "classifier_fast" for u in unsure]
    np.testing.assert_allclose(p, np.where(unsure, acc, fast), atol=1e-5)


@pytest.mark.parametrize("model,combine", [("p_mean", np.mean), ("p_max", np.max)])
def test_parallel_combines(mock, model, combine):
    expected = combine(np.stack([direct(mock, "classifier", TEXTS), direct(mock, "classifier_fast", TEXTS)]), axis=0)
    p, _, r = ask(mock, model, TEXTS)
    np.testing.assert_allclose(p, expected, atol=1e-5)
    assert r[0] == f"parallel:{model[2:]}(classifier,classifier_fast)"


def test_parallel_vote(mock):
    acc, fast = direct(mock, "classifier", TEXTS), direct(mock, "classifier_fast", TEXTS)
    p, v, _ = ask(mock, "p_vote", TEXTS, threshold=0.5)
    votes = (acc >= 0.5).astype(int) + (fast >= 0.5).astype(int)  # the constant 0.0 never votes yes
    np.testing.assert_allclose(p, votes / 3, atol=1e-6)
    assert v.tolist() == (votes >= 2).tolist()


def test_split_is_deterministic_per_request_id_and_weighted(mock):
    seen = {}
    for i in range(200):
        rid = f"req-{i}"
        _, _, r = ask(mock, "p_split", TEXTS[:2], request_id=rid)
        assert r[0] == r[1]  # a request's texts take one branch
        expected = "A" if split_fraction("ab", rid) < 0.75 else "B"
        assert r[0] == expected
        seen[rid] = r[0]
    assert 0.65 < sum(v == "A" for v in seen.values()) / len(seen) < 0.85
    assert ask(mock, "p_split", TEXTS[:1], request_id="req-7")[2] == [seen["req-7"]]


def test_fallback_answers_when_the_first_model_fails(mock):
    assert ask(mock, "p_fallback", TEXTS[:2])[2] == ["primary", "primary"]
    mock.set_failure("classifier_fast", "injected outage")
    try:
        p, _, r = ask(mock, "p_fallback", TEXTS[:2])
    finally:
        mock.clear_faults()
    assert r == ["backup", "backup"]
    np.testing.assert_allclose(p, direct(mock, "classifier", TEXTS[:2]), atol=1e-5)


def test_node_timeout_triggers_the_fallback(mock):
    mock.set_delay("classifier", 0.5)
    try:
        p, v, r = ask(mock, "p_timeout", TEXTS[:2])
    finally:
        mock.clear_faults()
    assert r == ["gave_up", "gave_up"] and v.tolist() == [False, False]
    time.sleep(0.6)  # the abandoned call still holds the classifier's only instance
    assert ask(mock, "p_timeout", TEXTS[:1])[2] == ["classifier"]


def test_calibration_shifts_the_variant_to_the_reference_threshold(mock):
    fast = direct(mock, "classifier_fast", TEXTS)
    p, v, _ = ask(mock, "p_calibrated", TEXTS, threshold=0.5)
    # comparing the shifted probability with 0.5 == comparing the raw one with 0.4
    assert v.tolist() == (fast >= 0.4).tolist()
    shift = math.log(0.5 / 0.5) - math.log(0.4 / 0.6)
    np.testing.assert_allclose(p, sigmoid(np.log(fast / (1 - fast)) + shift), atol=1e-5)


def test_chunk_with_max_aggregation(mock):
    long_text = " ".join(TEXTS)
    tok = mock.infer("tokenizer", {"TEXT": np.array([[long_text.encode()]], dtype=np.object_)}, parameters={"truncation": False})
    ids = tok["input_ids"][0][: int(tok["attention_mask"][0].sum())]
    probs, lengths = [], []
    for w in token_windows(ids, 24, 10):
        z = mock.infer("classifier_fast", {"input_ids": w.reshape(1, -1), "attention_mask": np.ones((1, len(w)), np.int64)})["logits"][0, 0]
        probs.append(float(sigmoid(z / temperature("classifier_fast"))))
        lengths.append(len(w))
    p, _, r = ask(mock, "p_chunk_max", [long_text, "short one"])
    assert r == ["chunked:classifier_fast", "classifier_fast"]
    assert p[0] == pytest.approx(max(probs), abs=1e-5)
    assert eventually(lambda: mock.metric("orchestrator_chunks_total", {"router": "p_chunk_max", "node": "root"}), len(probs)) == len(probs)


def test_a_model_node_without_chunk_truncates_like_the_ensemble(mock):
    long_text = " ".join(TEXTS)
    tok = mock.infer("tokenizer", {"TEXT": np.array([[long_text.encode()]], dtype=np.object_)}, parameters={"truncation": False})
    assert int(tok["attention_mask"][0].sum()) > 128  # long enough to be cut
    p, _, r = ask(mock, "p_small_parts", [long_text])
    assert r == ["classifier_fast"]
    np.testing.assert_allclose(p, direct(mock, "classifier_fast", [long_text]), atol=1e-5)  # first 128 tokens


def test_cascade_of_three_stages(mock):
    p, v, r = ask(mock, "p_cascade3", TEXTS[:2])
    assert r == ["last", "last"] and np.allclose(p, 0.42)  # margin 1.0 escalates to the end
    assert eventually(lambda: mock.metric("orchestrator_escalations_total", {"router": "p_cascade3", "node": "root"}), 4) == 4


def test_on_demand_model_is_loaded_once_and_unloaded_when_idle(mock):
    assert not mock.is_model_ready("classifier_spare")
    p, _, r = ask(mock, "p_ondemand", TEXTS[:2])
    assert r == ["classifier_spare"] * 2 and mock.is_model_ready("classifier_spare")
    np.testing.assert_allclose(p, direct(mock, "classifier_fast", TEXTS[:2]), atol=1e-5)
    ask(mock, "p_ondemand", TEXTS[2:4])
    loads = {"router": "p_ondemand", "model": "classifier_spare", "outcome": "success"}
    assert eventually(lambda: mock.metric("orchestrator_model_loads_total", loads), 1) == 1
    deadline = time.monotonic() + 10
    while mock.is_model_ready("classifier_spare") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not mock.is_model_ready("classifier_spare")
    unloads = {"router": "p_ondemand", "model": "classifier_spare"}
    assert eventually(lambda: mock.metric("orchestrator_model_unloads_total", unloads), 1) == 1


def test_failed_on_demand_load_falls_back_and_is_not_retried_at_once(mock):
    for _ in range(3):
        _, _, r = ask(mock, "p_ondemand_broken", TEXTS[:1])
        assert r == ["fallback"]
    labels = {"router": "p_ondemand_broken", "model": "classifier_broken", "outcome": "failure"}
    assert eventually(lambda: mock.metric("orchestrator_model_loads_total", labels), 1) == 1
    time.sleep(0.6)  # one more flush: still one failure, no retry before retry_after_s
    assert mock.metric("orchestrator_model_loads_total", labels) == 1


def test_inline_tokenizer_gives_the_same_answers_without_its_calls(mock):
    texts = TEXTS + ["", " ".join(TEXTS)]
    expected = ask(mock, "p_default", texts)
    mock.reset_calls()
    got = ask(mock, "p_inline", texts)
    np.testing.assert_allclose(got[0], expected[0], atol=1e-6)
    assert got[1].tolist() == expected[1].tolist() and got[2] == expected[2]
    called = {c.model for c in mock.calls}
    assert "tokenizer" not in called and "classifier_fast" in called


def test_request_ids_and_parameters_reach_the_downstream_calls(mock):
    seen = []

    def record(inputs, parameters):
        seen.append(dict(parameters))
        return None  # let it through

    mock.set_failure("classifier", record)
    try:
        ask(mock, "p_param", TEXTS[:2], parameters={"tenant": "gold"}, request_id="trace-42")
    finally:
        mock.clear_faults()
    assert seen and all(p.get("tenant") == "gold" for p in seen)


def test_a_lone_downstream_call_blocks_and_concurrent_ones_use_async_exec(mock, monkeypatch):
    """The router's BLS mode per call (router.TritonPythonModel): blocking ``exec`` when no
    other call of the execute can be in flight, ``async_exec`` for parallel branches, batches
    split at bls_max_batch_size and calls under a timeout."""
    from orchestrator.testing.mock import InferenceRequest

    used = []
    original_exec, original_async = InferenceRequest.exec, InferenceRequest.async_exec
    in_async = contextvars.ContextVar("in_async", default=False)  # the mock's async_exec runs exec

    def exec_(self, decoupled=False):
        if not in_async.get():
            used.append(("exec", self._model_name))
        return original_exec(self, decoupled)

    def async_exec(self, decoupled=False):
        used.append(("async_exec", self._model_name))
        token = in_async.set(True)
        try:
            return original_async(self, decoupled)
        finally:
            in_async.reset(token)

    monkeypatch.setattr(InferenceRequest, "exec", exec_)
    monkeypatch.setattr(InferenceRequest, "async_exec", async_exec)

    def modes(model, texts):
        used.clear()
        ask(mock, model, texts)
        return sorted(used)

    def classifiers(model, texts):
        return [u for u in modes(model, texts) if u[1].startswith("classifier")]

    # cascade, chunk and tokenizer calls one after another: all blocking
    one_by_one = modes("p_default", TEXTS[:3])
    assert one_by_one and {mode for mode, _ in one_by_one} == {"exec"}
    assert {m for _, m in one_by_one} >= {"tokenizer", "classifier_fast"}
    assert ("exec", "tokenizer") in modes("p_mean", TEXTS[:2])
    assert classifiers("p_mean", TEXTS[:2]) == [("async_exec", "classifier"), ("async_exec", "classifier_fast")]
    assert classifiers("p_timeout", TEXTS[:1]) == [("async_exec", "classifier")]
    # more texts than bls_max_batch_size (4): concurrent parts
    assert classifiers("p_small_parts", TEXTS[:6]) == [("async_exec", "classifier_fast")] * 2
    assert classifiers("p_small_parts", TEXTS[:4]) == [("exec", "classifier_fast")]
