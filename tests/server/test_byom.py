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
from orchestrator.tooling import repository
from orchestrator.tooling.client import classify, format_prediction
from tests.byom import TEXTS, byom_checkpoints, export_all, infer, served_models, start_server  # noqa: F401
from tests.helpers import make_test_repository

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def byom_repository(byom_checkpoints, tmp_path_factory):  # noqa: F811
    repo = make_test_repository(tmp_path_factory.mktemp("byom-repo") / "model_repository")
    export_all(byom_checkpoints, repo)
    # the same ensemble with no label file, in it or in its postprocess step (an ensemble
    # without its own answers with its step's labels): clients get column indices
    for source, name in (("stars5_ensemble", "stars5_unlabelled"), ("stars5_postprocess", "stars5_unlabelled_post")):
        repository.copy_model(repo / source, repo / name)
        config = repository.read_config(repo / name / "config.pbtxt")
        config.output[0].label_filename = ""
        repository.rename_steps(config, {"stars5_postprocess": "stars5_unlabelled_post"})
        repository.write_config(repo / name / "config.pbtxt", config)
    return repo


@pytest.fixture(scope="module")
def byom_server(byom_repository, byom_checkpoints):  # noqa: F811
    server = start_server(byom_repository, served_models(byom_checkpoints)
                          + ["tokenizer", "classifier", "postprocess", "ensemble", "stars5_unlabelled_post", "stars5_unlabelled"])
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


def test_an_ensemble_without_a_label_file_answers_with_its_steps_labels(byom_server, byom_repository):
    """Seen in Triton 2.51: the classification extension of an ensemble output without
    label_filename takes the labels of the step output it maps (the postprocess model's)."""
    config = repository.read_config(byom_repository / "stars5_ensemble" / "config.pbtxt")
    config.name = "stars5_step_labels"
    config.output[0].label_filename = ""
    (byom_repository / "stars5_step_labels" / "1").mkdir(parents=True)
    repository.write_config(byom_repository / "stars5_step_labels" / "config.pbtxt", config)
    byom_server.load_model("stars5_step_labels")
    labelled, _ = infer(byom_server.http_url, "stars5_step_labels", TEXTS[:1], np.array([[0.5]], np.float32), class_count=5)
    assert sorted(x.decode().split(":", 2)[2] for x in labelled[0]) == ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"]


def test_the_demo_ensemble_names_its_column(byom_server):
    labelled, verdicts = infer(byom_server.http_url, "ensemble", ["a wonderful, moving film"], np.array([[0.5]], np.float32),
                               class_count=1)
    score, index, label = labelled[0][0].decode().split(":")
    assert (index, label) == ("0", "positive") and 0.0 <= float(score) <= 1.0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classify_prints_the_models_own_labels(byom_server, byom_checkpoints, protocol, capsys):  # noqa: F811
    from orchestrator.tooling.cli import main

    url = byom_server.http_url if protocol == "http" else byom_server.grpc_url
    for name, labels in (("stars5_ensemble", ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")),
                         ("toxic6_ensemble", ("toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate")),
                         ("bert2_ensemble", ("POSITIVE",)), ("ensemble", ("positive",)),
                         ("stars5_unlabelled", ("0", "1", "2", "3", "4"))):
        preds = classify(TEXTS[:2], model=name, url=url, protocol=protocol, threshold=0.2)
        assert [p.labels for p in preds] == [labels, labels], name
        if name != "ensemble":
            expected = byom_checkpoints[name.split("_")[0]][1][:2]
            np.testing.assert_allclose([p.probabilities for p in preds], expected, rtol=0, atol=1e-5)
    assert main(["classify", TEXTS[0], "--model", "stars5_ensemble", "--url", url, "--protocol", protocol,
                 "--threshold", "0.2"]) == 0
    out = capsys.readouterr().out
    assert out == format_prediction(classify(TEXTS[:1], model="stars5_ensemble", url=url, protocol=protocol,
                                             threshold=0.2)[0]) + "\n"
    assert out.startswith("3 stars ") and "3 stars=0." in out
