"""A calibrated head (``head.json`` ``calibration``) on the in-process mock: the router and
the ensemble (tokenizer -> classifier -> postprocess, the head in the postprocess config)
answer the same calibrated probabilities, for the shipped demo repository (binary, one
logit) and for stand-in multiclass and multilabel classifiers (``tests/fixtures/heads/arith``).
Expected answers are computed here from the classifier's own logits."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from orchestrator.runtime.routing.heads import MULTICLASS, MULTILABEL, Head, read_head
from orchestrator.testing.mock import MockTriton
from orchestrator.tooling import repository
from orchestrator.tooling.modeling import data
from orchestrator.tooling.modeling.configs import ensemble_config, postprocess_config
from orchestrator.tooling.repository import write_label_file
from tests.helpers import FIXTURES, REPO, add_router_variant

CALIBRATED = {  # name -> (labels, kind, arith seed, temperature)
    "mc_cal": (("a", "b", "c"), MULTICLASS, 1, 2.5),
    "ml_cal": (("toxic", "insult", "threat"), MULTILABEL, 2, [0.5, 2.0, 3.0]),
}
TEXTS = data.held_out_texts(n=6, seed=5)


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cal") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    for name, (labels, kind, seed, t) in CALIBRATED.items():
        shutil.copytree(FIXTURES / "heads" / "arith", repo / name)
        cfg = (repo / name / "config.pbtxt").read_text().replace('name: "arith"', f'name: "{name}"')
        cfg = cfg.replace('string_value: "3"', f'string_value: "{len(labels)}"').replace('string_value: "1"', f'string_value: "{seed}"')
        (repo / name / "config.pbtxt").write_text(cfg)
        head = Head(kind, labels, max_length=128, calibration={"method": "temperature", "temperature": t})
        (repo / name / "head.json").write_text(head.to_json())
        pp = repo / f"{name}_postprocess"
        (pp / "1").mkdir(parents=True)
        shutil.copy(REPO / "postprocess" / "1" / "model.py", pp / "1" / "model.py")
        config = postprocess_config(pp.name, head)
        config.ClearField("model_warmup")
        repository.write_config(pp / "config.pbtxt", config)
        write_label_file(pp, head)
        ens = repo / f"{name}_ensemble"
        (ens / "1").mkdir(parents=True)
        repository.write_config(ens / "config.pbtxt", ensemble_config(ens.name, "tokenizer", name, pp.name, head))
        write_label_file(ens, head)
        router = add_router_variant(repo, f"{name}_router", {"version": 1, "inline": {"tokenizer": True},
                                                              "root": {"kind": "model", "model": name}})
        write_label_file(router, head)
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "postprocess", "ensemble", "router"):
            m.load(name)
        for name in CALIBRATED:
            for model in (name, f"{name}_postprocess", f"{name}_ensemble", f"{name}_router"):
                m.load(model)
        yield m


def ask(mock, model, texts, parameters=None):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    out = mock.infer(model, {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), 0.5, np.float32)}, parameters=parameters or {})
    return out["PROBABILITIES"], out["VERDICTS"]


def logits(mock, model, text):
    tok = mock.infer("tokenizer", {"TEXT": np.array([[text.encode()]], dtype=np.object_)})
    n = int(tok["attention_mask"][0].sum())
    row = tok["input_ids"][0][:n].reshape(1, -1)
    return mock.infer(model, {"input_ids": row, "attention_mask": np.ones_like(row)})["logits"][0].astype(np.float64)


def test_the_shipped_heads_are_calibrated_and_the_postprocess_config_carries_the_classifiers_head():
    for model in ("classifier", "classifier_fast"):
        head = read_head(REPO / model)
        assert head is not None and head.calibration["method"] == "temperature" and head.temperature[0] > 1.0
    config = repository.read_config(REPO / "postprocess" / "config.pbtxt")
    assert Head.from_json(repository.get_parameter(config, "head")).calibration == read_head(REPO / "classifier").calibration


def test_the_shipped_router_and_ensemble_answer_the_same_calibrated_probabilities(mock):
    router, rv = ask(mock, "router", TEXTS, {"route": "accurate"})
    ensemble, ev = ask(mock, "ensemble", TEXTS)
    np.testing.assert_allclose(router, ensemble, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(rv, ev)
    t = read_head(REPO / "classifier").temperature[0]
    z = np.array([logits(mock, "classifier", s)[0] for s in TEXTS])
    np.testing.assert_allclose(router[:, 0], 1 / (1 + np.exp(-z / t)), atol=1e-6)
    assert np.abs(router[:, 0] - 1 / (1 + np.exp(-z))).max() > 0.01  # the temperature changed the answer


@pytest.mark.parametrize("name", sorted(CALIBRATED))
def test_router_and_ensemble_answer_the_same_with_a_calibrated_multiclass_or_multilabel_head(mock, name):
    labels, kind, _, t = CALIBRATED[name]
    router, rv = ask(mock, f"{name}_router", TEXTS)
    ensemble, ev = ask(mock, f"{name}_ensemble", TEXTS)
    np.testing.assert_allclose(router, ensemble, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(rv, ev)
    z = np.stack([logits(mock, name, s) for s in TEXTS]) / np.asarray(t, dtype=np.float64)
    if kind == MULTICLASS:
        e = np.exp(z - z.max(axis=1, keepdims=True))
        want = e / e.sum(axis=1, keepdims=True)
    else:
        want = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(router, want, atol=1e-6)
