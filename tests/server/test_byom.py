"""Bring your own model, in the real server: the checkpoints of ``tests/byom.py`` (binary
with 1 and 2 logits from BERT, DistilBERT and RoBERTa, 5 classes, 6 labels) exported into
a test copy of the model repository; each ``NAME_ensemble`` and a router serving each model
load in the embedded Triton 2.51 and answer what ``transformers`` answers: PROBABILITIES
within 1e-5 of torch's sigmoid/softmax, VERDICTS by the head's rule, and each column's label
through Triton's classification extension (``class_count``, from ``labels.txt``). One
router serves a BERT and a RoBERTa side by side, each with its own tokenizer; a policy
mixing heads does not load."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.runtime.routing.heads import read_head
from orchestrator.tooling import repository
from orchestrator.tooling.client import classify, format_prediction
from tests.byom import TEXTS, byom_checkpoints, export_all, infer, served_models, start_server  # noqa: F401
from tests.helpers import add_router_variant, make_test_repository

pytest.importorskip("torch", reason="needs torch (the `train` extra: make test installs it, make demo does not)")


HEADS = ["bert1", "bert2", "distilbert2", "roberta2", "stars5", "toxic6"]


def _policy(root, inline=True):
    """A router policy for the test models: their tokenizers' maximum (48 tokens)."""
    return {"version": 1, "max_sequence_length": 48, "root": root, **({"inline": {"tokenizer": True}} if inline else {})}


def _model(name):
    return {"kind": "model", "name": f"m_{name}", "model": name}


#: router variant -> (policy, the model whose labels its labels.txt holds)
ROUTERS = {
    **{f"byom_router_{n}": (_policy(_model(n)), n) for n in HEADS},
    # the tokenizer models through BLS: RoBERTa's ids padded with its pad id 1
    "byom_router_roberta2_bls": (_policy(_model("roberta2"), inline=False), "roberta2"),
    "byom_router_stars5_bls": (_policy(_model("stars5"), inline=False), "stars5"),
    # a BERT and a RoBERTa side by side, each tokenized its own way
    "byom_side_by_side": (_policy({"kind": "parallel", "combine": "mean", "nodes": [_model("bert2"), _model("roberta_sst2")]}), "bert2"),
    "byom_ab": (_policy({"kind": "split", "name": "ab", "branches": [
        {"weight": 1, "node": _model("bert2")}, {"weight": 1, "node": _model("roberta_sst2")}]}), "bert2"),
    # a 2-label cascade escalating to a 5-class model: refused at load
    "byom_mixed": (_policy({"kind": "cascade", "margin": 0.1, "stages": [_model("bert2"), _model("stars5")]}), "bert2"),
}


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
    for name, (document, labels_of) in ROUTERS.items():
        add_router_variant(repo, name, document)
        (repo / name / "labels.txt").write_text("\n".join(read_head(repo / labels_of).output_labels()) + "\n")
    return repo


@pytest.fixture(scope="module")
def byom_server(byom_repository, byom_checkpoints):  # noqa: F811
    server = start_server(byom_repository, served_models(byom_checkpoints)
                          + ["tokenizer", "classifier", "postprocess", "ensemble", "stars5_unlabelled_post", "stars5_unlabelled"]
                          + [r for r in ROUTERS if r != "byom_mixed"])
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


@pytest.mark.parametrize("router", [f"byom_router_{n}" for n in HEADS] + ["byom_router_roberta2_bls", "byom_router_stars5_bls"])
def test_the_router_answers_what_transformers_answers(byom_server, byom_repository, byom_checkpoints, router):  # noqa: F811
    name = router[len("byom_router_"):].replace("_bls", "")
    _, expected = byom_checkpoints[name]
    head = read_head(byom_repository / name)
    thresholds = thresholds_around(expected)
    probs, verdicts = infer(byom_server.http_url, router, TEXTS, thresholds)
    assert probs.dtype == np.float32 and probs.shape == expected.shape == (len(TEXTS), head.columns)
    np.testing.assert_allclose(probs, expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(verdicts, head.verdicts(expected, thresholds))
    ensemble, ensemble_verdicts = infer(byom_server.http_url, f"{name}_ensemble", TEXTS, thresholds)
    np.testing.assert_allclose(probs, ensemble, rtol=0, atol=1e-6)  # router and ensemble: one answer
    np.testing.assert_array_equal(verdicts, ensemble_verdicts)
    labelled, _ = infer(byom_server.http_url, router, TEXTS, thresholds, class_count=head.columns)
    for row, want in zip(labelled, expected):
        fields = [x.decode().split(":", 2) for x in row]
        assert [label for _, _, label in sorted(fields, key=lambda f: int(f[1]))] == list(head.output_labels())
        assert [float(score) for score, _, _ in fields] == pytest.approx(sorted(want, reverse=True), abs=1e-5)


def test_the_router_takes_a_threshold_per_label(byom_server, byom_checkpoints):  # noqa: F811
    _, expected = byom_checkpoints["toxic6"]
    thresholds = (expected + np.where(np.arange(expected.shape[1]) % 2 == 0, -1e-3, 1e-3)).astype(np.float32)
    _, verdicts = infer(byom_server.http_url, "byom_router_toxic6", TEXTS, thresholds)
    np.testing.assert_array_equal(verdicts, np.tile(np.arange(6) % 2 == 0, (len(TEXTS), 1)))


def test_one_router_serves_a_bert_and_a_roberta_side_by_side(byom_server, byom_checkpoints):  # noqa: F811
    bert, roberta = byom_checkpoints["bert2"][1], byom_checkpoints["roberta_sst2"][1]
    probs, _ = infer(byom_server.http_url, "byom_side_by_side", TEXTS, np.full((len(TEXTS), 1), 0.5, np.float32))
    np.testing.assert_allclose(probs, (bert + roberta) / 2, rtol=0, atol=1e-5)
    assert np.abs(bert - roberta).max() > 1e-3  # the two models differ, so both answers count


def test_a_split_sends_each_request_to_its_arm_with_that_arms_tokenizer(byom_server, byom_checkpoints):  # noqa: F811
    import tritonclient.http as http

    from orchestrator.runtime.routing.nodes.split import split_fraction

    client = http.InferenceServerClient(byom_server.http_url)
    arms = set()
    try:
        for rid in ("r1", "r2", "r3", "r4", "r5", "r6"):
            data = np.array([t.encode() for t in TEXTS], dtype=np.object_).reshape(-1, 1)
            ins = [http.InferInput("TEXT", list(data.shape), "BYTES"), http.InferInput("THRESHOLD", [len(TEXTS), 1], "FP32")]
            ins[0].set_data_from_numpy(data)
            ins[1].set_data_from_numpy(np.full((len(TEXTS), 1), 0.5, np.float32))
            result = client.infer("byom_ab", ins, request_id=rid)
            arm = "bert2" if split_fraction("ab", rid) < 0.5 else "roberta_sst2"
            arms.add(arm)
            assert [r.decode() for r in result.as_numpy("ROUTE").reshape(-1)] == [arm] * len(TEXTS)
            np.testing.assert_allclose(result.as_numpy("PROBABILITIES"), byom_checkpoints[arm][1], rtol=0, atol=1e-5)
    finally:
        client.close()
    assert arms == {"bert2", "roberta_sst2"}


def test_a_policy_mixing_heads_is_refused_at_load(byom_server):
    from orchestrator.tooling.server import ServerError

    with pytest.raises(ServerError, match=r"root.stages\[1\].model: 'stars5' has a multiclass \(5 labels"):
        byom_server.load_model("byom_mixed")
    assert infer(byom_server.http_url, "byom_router_bert2", TEXTS[:1], np.array([[0.5]], np.float32))[0].shape == (1, 1)  # server fine
