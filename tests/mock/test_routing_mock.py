"""Routing on an answer, a quorum parallel and an escalation budget, run by the real router
code on the in-process mock.

Hierarchical classification: a multiclass stand-in model (``mc_a``, labels a, b, c; the
``tests/fixtures/heads/arith`` model) is the switch's ``score``, and the demo's binary
classifiers are the specialists per label. Expected answers come from direct calls to the
tokenizer and the models, with softmax/sigmoid and each node's documented rule applied here.
"""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from orchestrator.runtime.routing.heads import MULTICLASS, Head
from orchestrator.testing.mock import InferError, LoadError, MockTriton
from orchestrator.tooling.modeling import data
from tests.helpers import FIXTURES, REPO, add_router_variant

FAST = {"kind": "model", "model": "classifier_fast"}
ACC = {"kind": "model", "model": "classifier"}
SCORE = {"kind": "model", "name": "domain", "model": "mc_a"}
BAND_MIN = 0.4  # set from the texts below: some, not all, have p(c) at least this
BUDGET_MARGIN, RATE, WINDOW = 0.3, 0.1, 100


def switch(cases, default=True):
    node = {"kind": "switch", "name": "by_domain", "score": SCORE, "cases": cases}
    if default:
        node["default"] = {**FAST, "route": "generalist"}
    return node


ROUTERS = {
    "r_by_label": switch([
        {"when": {"label": "a"}, "then": {**FAST, "route": "specialist_a"}},
        {"when": {"label": "b"}, "then": {**ACC, "route": "specialist_b"}},
    ]),
    "r_by_band": switch([
        {"when": {"probability": {"label": "c", "min": BAND_MIN}}, "then": {**ACC, "route": "sure_c"}},
    ]),
    "r_bad_label": switch([{"when": {"label": "sports"}, "then": FAST}]),
    "r_score_stands": switch([{"when": {"label": "a"}, "then": FAST}], default=False),
    "r_quorum": {"kind": "parallel", "name": "par", "quorum": 2, "nodes": [FAST, ACC, {"kind": "model", "model": "classifier_spare"}]},
    "r_no_quorum": {"kind": "parallel", "name": "par", "nodes": [FAST, ACC, {"kind": "model", "model": "classifier_spare"}]},
    "r_quorum_short": {"kind": "parallel", "name": "par", "quorum": 3, "nodes": [FAST, ACC, {"kind": "model", "model": "classifier_spare"}]},
    "r_budget": {"kind": "cascade", "name": "cas", "margin": BUDGET_MARGIN, "stages": [FAST, ACC],
                 "budget": {"max_escalation_rate": RATE, "window": WINDOW}},
}
BROKEN = ("r_bad_label", "r_score_stands")


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("routing") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(FIXTURES / "heads" / "arith", repo / "mc_a")
    cfg = (repo / "mc_a" / "config.pbtxt").read_text().replace('name: "arith"', 'name: "mc_a"')
    (repo / "mc_a" / "config.pbtxt").write_text(cfg)  # the fixture's defaults: 3 labels, seed 1
    (repo / "mc_a" / "head.json").write_text(Head(MULTICLASS, ("a", "b", "c"), max_length=128).to_json())
    shutil.copytree(repo / "classifier_fast", repo / "classifier_spare")  # never loaded: its calls fail
    for c in (repo / "classifier_spare").rglob("*.pbtxt"):
        c.write_text(c.read_text().replace('name: "classifier_fast"', 'name: "classifier_spare"'))
    for name, node in ROUTERS.items():
        add_router_variant(repo, name, {"version": 1, "inline": {"tokenizer": True}, "root": node})
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "classifier_fast", "mc_a", *(r for r in ROUTERS if r not in BROKEN)):
            m.load(name)
        yield m


TEXTS = data.held_out_texts(n=24, seed=7)


def ask(mock, model, texts, threshold=0.5):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    out = mock.infer(model, {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), threshold, np.float32)})
    return out["PROBABILITIES"].reshape(-1), out["VERDICTS"].reshape(-1), [r.decode() for r in out["ROUTE"].reshape(-1)]


def ids(mock, text):
    tok = mock.infer("tokenizer", {"TEXT": np.array([[text.encode()]], dtype=np.object_)})
    return tok["input_ids"][0][: int(tok["attention_mask"][0].sum())]


def domain(mock, text):
    """mc_a's softmax for ``text``, computed here."""
    row = ids(mock, text)
    z = mock.infer("mc_a", {"input_ids": row.reshape(1, -1), "attention_mask": np.ones((1, len(row)), np.int64)})["logits"][0]
    e = np.exp(z.astype(np.float64) - z.max())
    return e / e.sum()


def binary(mock, model, text):
    """A demo classifier's sigmoid for ``text``, computed here: its logit divided by the
    temperature its head.json declares (calibration), then the sigmoid."""
    tok = mock.infer("tokenizer", {"TEXT": np.array([[text.encode()]], dtype=np.object_)})
    temperature = json.loads((REPO / model / "head.json").read_text()).get("calibration", {}).get("temperature", 1.0)
    return 1.0 / (1.0 + math.exp(-float(mock.infer(model, tok)["logits"][0, 0]) / temperature))


# ----------------------------------------------------------------------------- routing on an answer


def test_a_label_switch_sends_each_text_to_its_labels_specialist(mock):
    tops = ["abc"[int(np.argmax(domain(mock, t)))] for t in TEXTS]
    assert {"a", "b", "c"} <= set(tops)  # the texts reach every case and the default
    p, _, routes = ask(mock, "r_by_label", TEXTS)
    assert routes == [{"a": "specialist_a", "b": "specialist_b", "c": "generalist"}[x] for x in tops]
    want = [binary(mock, "classifier" if x == "b" else "classifier_fast", t) for x, t in zip(tops, TEXTS)]
    np.testing.assert_allclose(p, want, atol=1e-6)  # the specialist's answer, in the policy's (binary) head


def test_a_probability_band_case_takes_the_texts_in_the_band(mock):
    pc = np.array([domain(mock, t)[2] for t in TEXTS])
    in_band = pc >= BAND_MIN
    assert 0 < in_band.sum() < len(TEXTS)
    p, _, routes = ask(mock, "r_by_band", TEXTS)
    assert routes == ["sure_c" if b else "generalist" for b in in_band]
    want = [binary(mock, "classifier" if b else "classifier_fast", t) for b, t in zip(in_band, TEXTS)]
    np.testing.assert_allclose(p, want, atol=1e-6)


def test_a_label_the_score_model_lacks_is_refused_at_load(mock):
    with pytest.raises(LoadError, match=r"root.cases\[0\].when: label 'sports' is not in the score's head "
                                        r"\(multiclass \(3 labels: a, b, c\)\); expected one of: a, b, c"):
        mock.load("r_bad_label")


def test_a_score_whose_answers_may_stand_must_have_the_policys_head(mock):
    # without a default, texts no case takes get the score's answer: it must be in the policy's head
    with pytest.raises(LoadError, match=r"root.cases\[0\].then.model: 'classifier_fast' has a binary .* head, "
                                        r"but 'mc_a' \(root.score\) has a multiclass \(3 labels: a, b, c\) head"):
        mock.load("r_score_stands")


# ----------------------------------------------------------------------------- quorum


def test_a_quorum_parallel_answers_when_one_branch_fails(mock):
    labels = {"router": "r_quorum", "node": "par"}
    before = mock.metric("orchestrator_parallel_partial_total", labels) or 0.0
    p, _, routes = ask(mock, "r_quorum", TEXTS[:4])
    assert routes == ["parallel:mean(classifier_fast,classifier):answered=2/3"] * 4
    want = [(binary(mock, "classifier_fast", t) + binary(mock, "classifier", t)) / 2 for t in TEXTS[:4]]
    np.testing.assert_allclose(p, want, atol=1e-6)
    mock.loaded("r_quorum").instance.metrics.flush()
    assert mock.metric("orchestrator_parallel_partial_total", labels) - before == 4


def test_without_a_quorum_or_below_it_the_parallel_node_fails(mock):
    with pytest.raises(InferError, match="classifier_spare"):
        ask(mock, "r_no_quorum", TEXTS[:2])
    with pytest.raises(InferError, match=r"parallel 'par': 2 of 3 nodes answered, quorum 3"):
        ask(mock, "r_quorum_short", TEXTS[:2])


# ----------------------------------------------------------------------------- escalation budget


def test_the_budget_holds_through_the_router_while_the_unsure_fraction_doubles(mock):
    pool = data.held_out_texts(n=300, seed=11)
    p = {t: binary(mock, "classifier_fast", t) for t in pool}
    unsure = [t for t in pool if abs(p[t] - 0.5) < BUDGET_MARGIN]
    sure = [t for t in pool if abs(p[t] - 0.5) >= BUDGET_MARGIN]
    assert len(unsure) >= 20 and len(sure) >= 100
    rng = np.random.default_rng(0)
    stream = []
    for per_25 in (2, 4):  # 8% unsure at the cascade's margin, then 16%: over the 10% budget
        for b in range(16):
            block = [unsure[(b * 7 + i) % len(unsure)] for i in range(per_25)] + [sure[(b * 25 + i) % len(sure)] for i in range(25 - per_25)]
            stream += [block[i] for i in rng.permutation(25)]
    routes = []
    for i in range(0, len(stream), 5):
        routes += ask(mock, "r_budget", stream[i:i + 5])[2]
    was_unsure = np.array([abs(p[t] - 0.5) < BUDGET_MARGIN for t in stream])
    escalated = np.array([r == "classifier" for r in routes])
    kept = np.array([r == "classifier_fast:budget" for r in routes])
    assert was_unsure[400:].mean() == 2 * was_unsure[:400].mean() == 0.16
    np.testing.assert_array_equal(escalated | kept, was_unsure)  # the budget only keeps unsure texts
    shares = [escalated[max(0, e - WINDOW):e].mean() for e in range(WINDOW, len(stream) + 1, 5)]
    assert max(shares) <= RATE  # every window: within the budget
    assert escalated[400 + WINDOW:].mean() >= RATE - 0.02  # and it is used once the traffic is over it
    router = mock.loaded("r_budget").instance
    router.metrics.flush()
    labels = {"router": "r_budget", "node": "cas"}
    assert mock.metric("orchestrator_budget_kept_total", labels) == kept.sum()
    assert mock.metric("orchestrator_escalation_rate", labels) == pytest.approx(escalated[-WINDOW:].mean())
    assert 0.0 <= mock.metric("orchestrator_cascade_margin", labels) <= BUDGET_MARGIN
