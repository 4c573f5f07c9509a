"""The real router code on the in-process mock with multiclass and multilabel heads: cascade,
chunk, split and shadow over K columns, and a policy mixing heads refused at load.

The classifiers are stand-ins computing K logits from the token ids
(``tests/fixtures/heads/arith``); expected answers come from direct calls to the tokenizer
and those models, with softmax/sigmoid and each node's documented rule applied here.
"""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

from orchestrator.runtime.routing.heads import MULTICLASS, MULTILABEL, Head
from orchestrator.runtime.routing.nodes.chunk import token_windows
from orchestrator.runtime.routing.nodes.split import split_fraction
from orchestrator.testing.mock import LoadError, MockTriton
from orchestrator.tooling.modeling import data
from tests.helpers import FIXTURES, REPO, add_router_variant

MC = ("a", "b", "c")
ML = ("toxic", "insult", "threat", "obscene")
ARITH = {"mc_a": (MC, MULTICLASS, 1), "mc_b": (MC, MULTICLASS, 4), "ml_a": (ML, MULTILABEL, 2), "ml_b": (ML, MULTILABEL, 5)}


def node(name, **kw):
    return {"kind": "model", "name": kw.pop("node_name", name), "model": name, **kw}


ROUTERS = {
    "r_mc_cascade": ({"kind": "cascade", "margin": 0.05, "stages": [node("mc_a"), node("mc_b")]}, MC),
    "r_mc_chunk": ({"kind": "chunk", "window": 16, "stride": 8, "aggregation": "mean", "node": node("mc_a")}, MC),
    "r_ml_split": ({"kind": "split", "name": "ab", "branches": [{"weight": 1, "node": node("ml_a")}, {"weight": 1, "node": node("ml_b")}]}, ML),
    "r_ml_shadow": ({"kind": "shadow", "name": "sh", "primary": node("ml_a"), "candidate": node("ml_b")}, ML),
}


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("heads") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    for name, (labels, kind, seed) in ARITH.items():
        shutil.copytree(FIXTURES / "heads" / "arith", repo / name)
        cfg = (repo / name / "config.pbtxt").read_text().replace('name: "arith"', f'name: "{name}"')
        cfg = cfg.replace('string_value: "3"', f'string_value: "{len(labels)}"').replace('string_value: "1"', f'string_value: "{seed}"')
        (repo / name / "config.pbtxt").write_text(cfg)
        (repo / name / "head.json").write_text(Head(kind, labels, max_length=128).to_json())
    for name, (root, labels) in ROUTERS.items():
        add_router_variant(repo, name, {"version": 1, "inline": {"tokenizer": True}, "root": root})
        (repo / name / "labels.txt").write_text("\n".join(labels) + "\n")
    add_router_variant(repo, "r_mixed", {"version": 1, "root": {"kind": "cascade", "margin": 0.1, "stages": [
        node("classifier_fast"), node("mc_a")]}})
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier_fast", *ARITH, *ROUTERS):
            m.load(name)
        yield m


TEXTS = data.held_out_texts(n=8, seed=3)


def ask(mock, model, texts, thresholds, request_id=""):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    out = mock.infer(model, {"TEXT": t, "THRESHOLD": np.asarray(thresholds, np.float32).reshape(len(texts), -1)}, request_id=request_id)
    return out["PROBABILITIES"], out["VERDICTS"], [r.decode() for r in out["ROUTE"].reshape(-1)]


def ids(mock, text, truncate=True):
    tok = mock.infer("tokenizer", {"TEXT": np.array([[text.encode()]], dtype=np.object_)}, parameters={"truncation": truncate})
    return tok["input_ids"][0][: int(tok["attention_mask"][0].sum())]


def direct(mock, model, row):
    """The stand-in's probabilities for one row of ids: softmax or sigmoid, here."""
    z = mock.infer(model, {"input_ids": row.reshape(1, -1), "attention_mask": np.ones((1, len(row)), np.int64)})["logits"][0]
    z = z.astype(np.float64)
    if ARITH[model][1] == MULTICLASS:
        e = np.exp(z - z.max())
        return e / e.sum()
    return 1.0 / (1.0 + np.exp(-z))


def test_multiclass_cascade_answers_k_columns_and_escalates_close_top_labels(mock):
    p, v, routes = ask(mock, "r_mc_cascade", TEXTS, np.full(len(TEXTS), 0.4))
    first = [direct(mock, "mc_a", ids(mock, t)) for t in TEXTS]
    unsure = [np.sort(q)[-1] - np.sort(q)[-2] < 0.05 for q in first]
    assert 0 < sum(unsure) < len(TEXTS)
    assert routes == ["mc_b" if u else "mc_a" for u in unsure]
    want = np.stack([direct(mock, r, ids(mock, t)) for r, t in zip(routes, TEXTS)])
    np.testing.assert_allclose(p, want, atol=1e-6)
    top = want.argmax(axis=1)
    assert v.tolist() == [[k == top[i] and want[i, k] >= np.float32(0.4) for k in range(3)] for i in range(len(TEXTS))]


def test_multiclass_chunk_averages_each_column_of_the_windows(mock):
    long = " ".join(TEXTS)
    p, _, routes = ask(mock, "r_mc_chunk", [long, TEXTS[0]], np.full(2, 0.5))
    wins = token_windows(ids(mock, long, truncate=False), 16, 8)
    assert len(wins) > 2 and routes[0] == "chunked:mc_a"
    np.testing.assert_allclose(p[0], np.mean([direct(mock, "mc_a", w) for w in wins], axis=0), atol=1e-6)


def test_multilabel_split_by_request_id_with_thresholds_per_label(mock):
    thr = np.tile([0.5, 0.45, 0.55, 0.6], (3, 1))
    seen = set()
    for rid in ("u-1", "u-2", "u-3", "u-4", "u-5", "u-6"):
        p, v, routes = ask(mock, "r_ml_split", TEXTS[:3], thr, request_id=rid)
        arm = "ml_a" if split_fraction("ab", rid) < 0.5 else "ml_b"
        seen.add(arm)
        assert routes == [arm] * 3
        want = np.stack([direct(mock, arm, ids(mock, t)) for t in TEXTS[:3]])
        np.testing.assert_allclose(p, want, atol=1e-6)
        assert v.tolist() == (want.astype(np.float32) >= thr).tolist()
    assert seen == {"ml_a", "ml_b"}


def test_multilabel_shadow_counts_texts_whose_verdicts_differ_in_any_label(mock):
    labels = {"router": "r_ml_shadow", "node": "sh", "candidate": "ml_b"}
    before = mock.metric("orchestrator_shadow_flips_total", labels) or 0.0
    _, v, routes = ask(mock, "r_ml_shadow", TEXTS, np.full(len(TEXTS), 0.5), request_id="s1")
    assert routes == ["ml_a"] * len(TEXTS)
    flips = sum(bool(((direct(mock, "ml_a", ids(mock, t)) >= 0.5) != (direct(mock, "ml_b", ids(mock, t)) >= 0.5)).any()) for t in TEXTS)
    assert 0 < flips
    deadline = time.monotonic() + 5.0
    while (mock.metric("orchestrator_shadow_flips_total", labels) or 0.0) - before != flips and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (mock.metric("orchestrator_shadow_flips_total", labels) or 0.0) - before == flips


def test_a_policy_mixing_heads_does_not_load(mock):
    with pytest.raises(LoadError, match=r"root.stages\[1\].model: 'mc_a' has a multiclass \(3 labels: a, b, c\) head, but 'classifier_fast'"):
        mock.load("r_mixed")


def test_a_wrong_label_file_does_not_load(mock):
    (mock.model_repository / "r_mc_chunk" / "labels.txt").write_text("positive\n")
    try:
        mock.unload("r_mc_chunk")
        with pytest.raises(LoadError, match=r"label file .* says \['positive'\], but the policy's models answer \['a', 'b', 'c'\]"):
            mock.load("r_mc_chunk")
    finally:
        (mock.model_repository / "r_mc_chunk" / "labels.txt").write_text("a\nb\nc\n")
        mock.load("r_mc_chunk")
