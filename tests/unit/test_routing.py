"""Routing on an answer (``switch`` ``label`` / ``probability``) and the quorum of a
``parallel`` node, on the pure parts and the engine with a fake BLS: no server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.runtime.errors import DownstreamError, PolicyError
from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.request import Work
from orchestrator.runtime.routing.heads import BINARY, LEGACY, MULTICLASS, MULTILABEL, Head
from orchestrator.runtime.routing.nodes.switch import label_probability, top_label
from orchestrator.runtime.routing.policy import bind_heads, parse_policy
from orchestrator.runtime.routing.policy import describe as describe_policy
from tests.helpers import FakeBLS, expected_logit, ids_of, sig

TWO = Head(BINARY, ("neg", "pos"), positive_index=1)
MC = Head(MULTICLASS, ("en", "de", "fr"))
ML = Head(MULTILABEL, ("x", "y", "z"))


def test_top_label_and_label_probability_per_head():
    assert top_label(TWO, [0.5]) == "pos" and top_label(TWO, [0.49]) == "neg"
    assert label_probability(TWO, [0.8], "pos") == 0.8 and label_probability(TWO, [0.8], "neg") == pytest.approx(0.2)
    assert top_label(LEGACY, [0.7]) == "positive" and top_label(LEGACY, [0.3]) is None
    assert top_label(MC, [0.2, 0.5, 0.3]) == "de" and label_probability(MC, [0.2, 0.5, 0.3], "fr") == 0.3
    assert top_label(MC, [0.4, 0.4, 0.2]) == "en"  # a tie: the first
    assert top_label(ML, [0.9, 0.95, 0.1]) == "y" and label_probability(ML, [0.9, 0.95, 0.1], "x") == 0.9


def model(name, **kw):
    return {"kind": "model", "name": kw.pop("node_name", name), "model": name, **kw}


def switch_doc(when, default=True, score="lang"):
    node = {"kind": "switch", "name": "sw", "score": model(score, node_name="score"), "cases": [{"when": when, "then": model("fast", route="spec")}]}
    if default:
        node["default"] = model("accurate", node_name="other")
    return {"version": 1, "root": node}


HEADS = {"lang": MC, "fast": LEGACY, "accurate": LEGACY}


@pytest.mark.parametrize("when, message", [
    ({"label": "en"}, None),
    ({"probability": {"label": "de", "min": 0.3}}, None),
    ({"label": "es"}, r"root.cases\[0\].when: label 'es' is not in the score's head \(multiclass \(3 labels: en, de, fr\)\); "
                      "expected one of: en, de, fr"),
    ({"probability": {"label": "positive"}}, r"label 'positive' is not in the score's head"),
    ({"margin_below": 0.1}, r"root.cases\[0\].when.margin_below: the score has a multiclass .* not the policy's binary"),
])
def test_labels_are_checked_against_the_score_models_head_at_bind(when, message):
    policy = parse_policy(switch_doc(when))
    if message is None:
        plan = bind_heads(policy, HEADS)
        assert plan.head == LEGACY  # the answering models' head, not the score's
        assert "when score" in describe_policy(plan)
    else:
        with pytest.raises(PolicyError, match=message):
            bind_heads(policy, HEADS)


def test_parse_refuses_a_band_upside_down_and_answer_conditions_without_a_score():
    with pytest.raises(PolicyError, match=r"root.cases\[0\].when.probability.min: 0.8 is above max 0.2"):
        parse_policy(switch_doc({"probability": {"label": "en", "min": 0.8, "max": 0.2}}))
    for key, value in (("label", "en"), ("probability", {"label": "en"})):
        doc = switch_doc({key: value})
        del doc["root"]["score"]
        with pytest.raises(PolicyError, match=rf"root.cases\[0\].when.{key}: needs a 'score' node on the switch"):
            parse_policy(doc)


def test_a_switch_routes_on_the_score_models_label_with_the_fake_bls():
    # the fake's models answer one logit: "fast" as the router (binary, legacy head), label "positive" at p >= 0.5
    policy = bind_heads(parse_policy(switch_doc({"label": "positive"}, score="fast")), {"fast": LEGACY, "accurate": LEGACY})
    texts = ["good good", "bad bad", "good", "bad"]
    [result] = asyncio.run(Engine(policy, FakeBLS()).run([Work(texts, np.full((4, 1), 0.5, np.float32), {}, "")]))
    pos = [sig(expected_logit("fast", ids_of(t))) >= 0.5 for t in texts]
    assert 0 < sum(pos) < 4
    assert result.routes == ["spec" if p else "accurate" for p in pos]


def parallel_doc(quorum=None, combine="mean"):
    node = {"kind": "parallel", "name": "par", "combine": combine, "nodes": [model("fast"), model("accurate"), model("third")]}
    if quorum is not None:
        node["quorum"] = quorum
    return {"version": 1, "root": node}


def run(doc, fail=()):
    fake = FakeBLS(fail=fail)
    [result] = asyncio.run(Engine(parse_policy(doc), fake).run([Work(["good", "bad bad"], np.full((2, 1), 0.5, np.float32), {}, "")]))
    return result


def test_quorum_leaves_out_a_failing_branch_and_says_which_answered():
    result = run(parallel_doc(2), fail={"third"})
    assert result.routes == ["parallel:mean(fast,accurate):answered=2/3"] * 2
    want = [(sig(expected_logit("fast", ids_of(t))) + sig(expected_logit("accurate", ids_of(t)))) / 2 for t in ("good", "bad bad")]
    np.testing.assert_allclose(result.probabilities.reshape(-1), want, rtol=1e-6)
    full = run(parallel_doc(2))
    assert full.routes == ["parallel:mean(fast,accurate,third)"] * 2  # all answered: the route as without quorum
    vote = run(parallel_doc(1, "vote"), fail={"fast", "accurate"})
    assert vote.routes == ["parallel:vote(third):answered=1/3"] * 2


def test_without_quorum_or_below_it_a_failing_branch_fails_the_node():
    with pytest.raises(DownstreamError, match="model 'third' failed"):
        run(parallel_doc(), fail={"third"})
    with pytest.raises(DownstreamError, match=r"parallel 'par': 2 of 3 nodes answered, quorum 3: model 'third' failed"):
        run(parallel_doc(3), fail={"third"})


def test_quorum_above_the_nodes_is_refused():
    with pytest.raises(PolicyError, match=r"root.quorum: 4 is more than the node's 3 nodes"):
        parse_policy(parallel_doc(4))


def test_the_hierarchical_example_binds_with_a_language_model_and_refuses_one_without_its_labels():
    from pathlib import Path

    from orchestrator.runtime.routing.policy import load_policy

    path = Path(__file__).resolve().parents[2] / "docs" / "policies" / "hierarchical.yaml"
    heads = {m: LEGACY for m in ("classifier_fast", "classifier", "sentiment_de", "sentiment_multi")}
    assert bind_heads(load_policy(path), {**heads, "lang_id": Head(MULTICLASS, ("en", "de", "fr"))}).head == LEGACY
    with pytest.raises(PolicyError, match=r"root.steps\[1\].cases\[1\].when: label 'de' is not in the score's head"):
        bind_heads(load_policy(path), {**heads, "lang_id": Head(MULTICLASS, ("en", "fr", "es"))})
