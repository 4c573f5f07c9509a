"""Bring your own model, in the real server: the six checkpoints of ``tests/byom.py``
(binary with 1 and 2 logits from BERT, DistilBERT and RoBERTa, 5 classes, 6 labels)
exported into a test copy of the model repository; each ``NAME_ensemble`` loads in the
embedded Triton 2.51 and answers what ``transformers`` answers: PROBABILITIES within 1e-5
of torch's sigmoid/softmax, VERDICTS by the head's rule, and each column's label through
Triton's classification extension (``class_count``, from the ensemble's ``labels.txt``)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.runtime.heads import read_head
from tests.byom import TEXTS, byom_checkpoints, export_all, infer, served_models, start_server  # noqa: F401
from tests.helpers import make_test_repository

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def byom_repository(byom_checkpoints, tmp_path_factory):  # noqa: F811
    repo = make_test_repository(tmp_path_factory.mktemp("byom-repo") / "model_repository")
    export_all(byom_checkpoints, repo)
    return repo


@pytest.fixture(scope="module")
def byom_server(byom_repository, byom_checkpoints):  # noqa: F811
    server = start_server(byom_repository, served_models(byom_checkpoints) + ["tokenizer", "classifier", "postprocess", "ensemble"])
    yield server
    server.stop()


def thresholds_around(expected: np.ndarray) -> np.ndarray:
    """[N, 1] thresholds 1e-3 below the first text's top probability, above the next one's,
    and so on: both verdicts occur, none within float error of its probability."""
    top = expected.max(axis=1)
    return (top + np.where(np.arange(len(top)) % 2 == 0, -1e-3, 1e-3)).reshape(-1, 1).astype(np.float32)


@pytest.mark.parametrize("name", ["bert1", "bert2", "distilbert2", "roberta2", "stars5", "toxic6"])
def test_ensemble_answers_what_transformers_answers(byom_server, byom_repository, byom_checkpoints, name):  # noqa: F811
    _, expected = byom_checkpoints[name]
    head = read_head(byom_repository / name)
    thresholds = thresholds_around(expected)
    probs, verdicts = infer(byom_server.http_url, f"{name}_ensemble", TEXTS, thresholds)
    assert probs.dtype == np.float32 and probs.shape == expected.shape == (len(TEXTS), head.columns)
    np.testing.assert_allclose(probs, expected, rtol=0, atol=1e-5)
    assert verdicts.dtype == np.bool_
    np.testing.assert_array_equal(verdicts, head.verdicts(expected, thresholds))
    assert verdicts.any() and not verdicts.all() if head.kind == "binary" else verdicts.any()
    # the classification extension: score:index:label per column, from the ensemble's labels.txt
    labelled, _ = infer(byom_server.http_url, f"{name}_ensemble", TEXTS, thresholds, class_count=head.columns)
    for row, want in zip(labelled, expected):
        fields = [x.decode().split(":", 2) for x in row]
        assert [label for _, _, label in sorted(fields, key=lambda f: int(f[1]))] == list(head.output_labels())
        assert [float(score) for score, _, _ in fields] == pytest.approx(sorted(want, reverse=True), abs=1e-5)


def test_multilabel_thresholds_per_label(byom_server, byom_repository, byom_checkpoints):  # noqa: F811
    _, expected = byom_checkpoints["toxic6"]
    head = read_head(byom_repository / "toxic6")
    thresholds = (expected + np.where(np.arange(expected.shape[1]) % 2 == 0, -1e-3, 1e-3)).astype(np.float32)
    _, verdicts = infer(byom_server.http_url, "toxic6_ensemble", TEXTS, thresholds)
    np.testing.assert_array_equal(verdicts, np.tile(np.arange(6) % 2 == 0, (len(TEXTS), 1)))
    np.testing.assert_array_equal(verdicts, head.verdicts(expected, thresholds))


def test_the_demo_ensemble_names_its_column(byom_server):
    labelled, verdicts = infer(byom_server.http_url, "ensemble", ["a wonderful, moving film"], np.array([[0.5]], np.float32),
                               class_count=1)
    score, index, label = labelled[0][0].decode().split(":")
    assert (index, label) == ("0", "positive") and 0.0 <= float(score) <= 1.0
