"""The shipped ensemble (tokenizer -> classifier -> postprocess) written as a pipeline policy
and served by the router: every output byte-identical to the ensemble's (dtype, shape,
bytes), one text and 64 texts per request, on the mock."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml

from orchestrator.testing.mock import MockTriton
from orchestrator.tooling.modeling import data
from tests.helpers import REPO
from tests.mock.test_pipeline_mock import same
from tests.pipeline_repo import ROUTER_PY

#: The ensemble's steps as a pipeline policy (what `orchestrator migrate` writes for it).
POLICY = {"version": 1, "ignored_parameters": ["*"], "pipeline": {"outputs": ["VERDICTS", "PROBABILITIES"], "steps": [
    {"kind": "step", "model": "tokenizer", "inputs": {"TEXT": "TEXT"},
     "outputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"}},
    {"kind": "step", "model": "classifier", "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask"},
     "outputs": {"logits": "logits"}},
    {"kind": "step", "model": "postprocess", "inputs": {"logits": "logits", "THRESHOLD": "THRESHOLD"},
     "outputs": {"PROBABILITIES": "PROBABILITIES", "VERDICTS": "VERDICTS"}},
]}}


def add_pipeline_router(repo, name="ensemble_router"):
    """``repo/name``: the ensemble's config as a Python-backend model, the router's model.py, the policy."""
    text = (repo / "ensemble" / "config.pbtxt").read_text()
    config = text[: text.index("ensemble_scheduling")].replace('name: "ensemble"', f'name: "{name}"')
    config = config.replace('platform: "ensemble"', 'backend: "python"') + "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config + "dynamic_batching { }\n")
    (repo / name / "1" / "model.py").write_text(ROUTER_PY)
    (repo / name / "policy.yaml").write_text(yaml.safe_dump(POLICY, sort_keys=False))
    shutil.copy(repo / "ensemble" / "labels.txt", repo / name / "labels.txt")
    return repo


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("shipped") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    add_pipeline_router(repo)
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "postprocess", "ensemble", "ensemble_router"):
            m.load(name)
        yield m


@pytest.mark.parametrize("batch", [1, 64])
def test_the_shipped_ensemble_as_a_pipeline_answers_byte_identically(mock, batch):
    texts = data.held_out_texts(n=batch, seed=7)
    inputs = {"TEXT": np.array([t.encode() for t in texts], dtype=object).reshape(-1, 1),
              "THRESHOLD": np.full((batch, 1), 0.5, np.float32)}
    same(mock.infer("ensemble_router", inputs), mock.infer("ensemble", inputs))
