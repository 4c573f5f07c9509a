"""``orchestrator export`` for every head: the six checkpoints of ``tests/byom.py`` exported
into a copy of the model repository, each with its own tokenizer, postprocess and ensemble
models; refusals (no tokenizer files, regression); the shipped ensemble re-pointed and the
router's policy checked when ``classifier`` is replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from orchestrator.runtime.routing.heads import LEGACY, Head, head_of_parameters, read_head
from orchestrator.tooling import repository
from orchestrator.tooling.modeling import export as E
from orchestrator.tooling.warmup import SAMPLE_TEXT
from tests.byom import MAX_LENGTH, STAR_LABELS, TEXTS, TOXIC_LABELS, build_checkpoint, byom_checkpoints  # noqa: F401
from tests.helpers import REPO

pytest.importorskip("torch", reason="needs torch (the `train` extra: make test installs it, make demo does not)")

#: name -> (kind, labels, positive_index, pad id)
EXPECTED = {
    "bert1": ("binary", ["LABEL_0"], 0, 0),
    "bert2": ("binary", ["NEGATIVE", "POSITIVE"], 1, 0),
    "distilbert2": ("binary", ["LABEL_0", "LABEL_1"], 1, 0),
    "roberta2": ("binary", ["LABEL_0", "LABEL_1"], 1, 1),
    "stars5": ("multiclass", list(STAR_LABELS), 0, 0),
    "toxic6": ("multilabel", list(TOXIC_LABELS), 0, 0),
}


def copy_repository(dest: Path) -> Path:
    """model_repository without its large model files (the export writes its own)."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns("__pycache__", "*.onnx", "*.plan"))
    return dest


@pytest.fixture(scope="module")
def exported(byom_checkpoints, tmp_path_factory):  # noqa: F811
    repo = copy_repository(tmp_path_factory.mktemp("heads") / "model_repository")
    results = {name: E.export_checkpoint(str(ckpt), repo, name, quiet=True, tensorrt=False)
               for name, (ckpt, _) in byom_checkpoints.items()}
    return repo, results


def in_process_ensemble(repo: Path, name: str, texts, thresholds):
    """What NAME_ensemble computes, file by file: NAME_tokenizer's files (truncation to their
    model_max_length, padding to the longest text), NAME's ONNX file, NAME_postprocess's head."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    head = read_head(repo / name)
    tok = AutoTokenizer.from_pretrained(str(repo / head.tokenizer / "1"))
    enc = tok(list(texts), truncation=True, padding="longest", return_tensors="np")
    sess = ort.InferenceSession(str(repo / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = sess.run(["logits"], {k: enc[k].astype(np.int64) for k in ("input_ids", "attention_mask")})[0]
    config = repository.read_config(repo / f"{name}_postprocess" / "config.pbtxt")
    post = head_of_parameters({k: v.string_value for k, v in config.parameters.items()})
    p = post.probabilities(logits)
    return p, post.verdicts(p, thresholds)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_head_gets_its_tokenizer_postprocess_and_ensemble(exported, name):
    repo, results = exported
    kind, labels, positive, pad = EXPECTED[name]
    head = read_head(repo / name)
    assert (head.kind, list(head.labels), head.positive_index, head.pad_token_id) == (kind, labels, positive, pad)
    assert (head.tokenizer, head.max_length) == (f"{name}_tokenizer", MAX_LENGTH)
    assert results[name].head == json.loads(head.to_json())
    assert results[name].models == [f"{name}_tokenizer", name, f"{name}_postprocess", f"{name}_ensemble"]
    cols = 1 if kind == "binary" else len(labels)
    # tokenizer model: the checkpoint's files, truncation at max_length
    tok = repository.read_config(repo / f"{name}_tokenizer" / "config.pbtxt")
    assert tok.name == f"{name}_tokenizer" and repository.get_parameter(tok, "max_length") == str(MAX_LENGTH)
    saved = json.loads((repo / f"{name}_tokenizer" / "1" / "tokenizer_config.json").read_text())
    assert saved["model_max_length"] == MAX_LENGTH
    # postprocess: its head is the model's head; labels in output column order
    post = repository.read_config(repo / f"{name}_postprocess" / "config.pbtxt")
    assert head_of_parameters({k: v.string_value for k, v in post.parameters.items()}) == head
    assert [(i.name, list(i.dims)) for i in post.input] == [("logits", [len(labels)]), ("THRESHOLD", [1 if kind == "binary" else -1])]
    assert [(o.name, list(o.dims), o.label_filename) for o in post.output] == [
        ("PROBABILITIES", [cols], "labels.txt"), ("VERDICTS", [cols], "")]
    want_labels = [labels[positive]] if kind == "binary" else labels
    assert (repo / f"{name}_postprocess" / "labels.txt").read_text().splitlines() == want_labels
    assert len((repo / f"{name}_postprocess" / "warmup" / "logits").read_bytes()) == 4 * len(labels)
    # ensemble: tokenizer -> model -> postprocess, the shipped ensemble's tensors
    ens = repository.read_config(repo / f"{name}_ensemble" / "config.pbtxt")
    assert [s.model_name for s in ens.ensemble_scheduling.step] == [f"{name}_tokenizer", name, f"{name}_postprocess"]
    shipped = repository.read_config(REPO / "ensemble" / "config.pbtxt")
    assert [(t.name, t.data_type) for t in ens.input] == [(t.name, t.data_type) for t in shipped.input]
    assert [(t.name, t.data_type) for t in ens.output] == [(t.name, t.data_type) for t in shipped.output]
    assert (repo / f"{name}_ensemble" / "labels.txt").read_text().splitlines() == want_labels


def test_the_repository_stays_consistent(exported):
    """Triton's load-time cross-file rules (names, model.py, ensemble steps and tensors)."""
    repo, _ = exported
    checked = repository.check_repository(repo)
    assert {p.parent.name for p in checked if p.name == "config.pbtxt"} >= {f"{n}_ensemble" for n in EXPECTED}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_exported_pipeline_answers_what_transformers_answers(exported, byom_checkpoints, name):  # noqa: F811
    repo, _ = exported
    _, expected = byom_checkpoints[name]
    thresholds = np.full((len(TEXTS), 1), 0.5, np.float32)
    p, v = in_process_ensemble(repo, name, TEXTS, thresholds)
    np.testing.assert_allclose(p, expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(v, read_head(repo / name).verdicts(expected, thresholds))


@pytest.mark.parametrize("name", list(EXPECTED))
def test_warmup_ids_come_from_the_models_own_tokenizer(exported, name):
    """The bug: warmup ids from the demo tokenizer's vocabulary (thousands of ids) fed to a
    model with a vocabulary of a few hundred failed the load."""
    from transformers import AutoTokenizer

    repo, _ = exported
    tok = AutoTokenizer.from_pretrained(str(repo / f"{name}_tokenizer" / "1"))
    ids = np.frombuffer((repo / name / "warmup" / "input_ids").read_bytes(), "<i8")
    assert ids.tolist() == tok(SAMPLE_TEXT, truncation=True)["input_ids"]
    assert ids.max() < len(tok) <= 300
    config = repository.read_config(repo / name / "configs" / "embedded.pbtxt")
    assert list(config.model_warmup[0].inputs["input_ids"].dims) == [len(ids)]
    demo = np.frombuffer((REPO / "classifier" / "warmup" / "input_ids").read_bytes(), "<i8")
    assert demo.max() >= len(tok)  # the old sample would have been out of range


def test_the_shared_tokenizer_and_demo_models_are_untouched(exported):
    repo, _ = exported
    for rel in ("tokenizer/1/tokenizer.json", "tokenizer/config.pbtxt", "postprocess/config.pbtxt",
                "ensemble/config.pbtxt", "classifier/head.json", "router/policy.yaml"):
        assert (repo / rel).read_bytes() == (REPO / rel).read_bytes(), rel


def test_a_checkpoint_without_tokenizer_files_is_refused(byom_checkpoints, tmp_path):  # noqa: F811
    ckpt = tmp_path / "no_tokenizer"
    ckpt.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(byom_checkpoints["bert2"][0] / f, ckpt / f)
    repo = copy_repository(tmp_path / "model_repository")
    before = sorted(p.relative_to(repo) for p in repo.rglob("*"))
    with pytest.raises(E.SourceError, match=r"no tokenizer files: none of tokenizer.json, vocab.txt, .*"
                                            r"\(it holds config.json, model.safetensors\)"):
        E.export_checkpoint(str(ckpt), repo, "classifier", quiet=True, tensorrt=False)
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == before


def test_a_regression_head_is_refused(tmp_path):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from tests.byom import wordpiece_tokenizer

    tok = wordpiece_tokenizer()
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, num_labels=1, problem_type="regression"))
    model.save_pretrained(tmp_path / "reg")
    tok.save_pretrained(tmp_path / "reg")
    repo = copy_repository(tmp_path / "model_repository")
    with pytest.raises(E.ExportError, match="problem_type 'regression'.*serve classifiers only"):
        E.export_checkpoint(str(tmp_path / "reg"), repo, "scores", quiet=True, tensorrt=False)
    assert not (repo / "scores").exists() and not (repo / "scores_tokenizer").exists()


def test_positive_label(byom_checkpoints, tmp_path):  # noqa: F811
    repo = copy_repository(tmp_path / "model_repository")
    ckpt = str(byom_checkpoints["bert2"][0])
    E.export_checkpoint(ckpt, repo, "neg", positive_label="NEGATIVE", quiet=True, tensorrt=False)
    assert read_head(repo / "neg").positive_index == 0
    assert (repo / "neg_postprocess" / "labels.txt").read_text() == "NEGATIVE\n"
    with pytest.raises(E.ExportError, match=r"positive label 'neutral' is not one of .*\['NEGATIVE', 'POSITIVE'\]"):
        E.export_checkpoint(ckpt, repo, "neg", positive_label="neutral", quiet=True, tensorrt=False)
    with pytest.raises(E.ExportError, match="--positive-label '1 star': only for binary checkpoints"):
        E.export_checkpoint(str(byom_checkpoints["stars5"][0]), repo, "stars", positive_label="1 star",
                            quiet=True, tensorrt=False)
    assert not (repo / "stars").exists()


def test_replacing_classifier_repoints_the_ensemble_and_checks_the_routers(byom_checkpoints, tmp_path):  # noqa: F811
    """The README's `orchestrator export CKPT --name classifier`: the shipped ensemble keeps
    working with the new model's tokenizer and head; the router, whose policy names
    classifier, is told whether its policy still binds."""
    import yaml

    repo = copy_repository(tmp_path / "model_repository")
    # a second router whose policy fits the new model's 48 tokens
    shutil.copytree(repo / "router", repo / "router_short")
    config = repository.read_config(repo / "router_short" / "config.pbtxt")
    config.name = "router_short"
    repository.write_config(repo / "router_short" / "config.pbtxt", config)
    (repo / "router_short" / "policy.yaml").write_text(yaml.safe_dump({"version": 1, "max_sequence_length": 32, "root": {
        "kind": "cascade", "margin": 0.1, "stages": [{"kind": "model", "model": "classifier_fast"},
                                                     {"kind": "model", "model": "classifier"}]}}))
    res = E.export_checkpoint(str(byom_checkpoints["bert2"][0]), repo, "classifier", quiet=True, tensorrt=False)
    ens = repository.read_config(repo / "ensemble" / "config.pbtxt")
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["classifier_tokenizer", "classifier", "classifier_postprocess"]
    assert (repo / "ensemble" / "labels.txt").read_text() == "POSITIVE\n"
    assert (repo / "ensemble" / "config.pbtxt").read_text().startswith(
        "# The baseline: the seeds' static DAG tokenizer -> classifier -> postprocess.\n"
        "# Steps re-pointed by `orchestrator export`: tokenizer -> classifier_tokenizer; postprocess -> classifier_postprocess.")
    repository.check_repository(repo)
    notes = "\n".join(res.notes)
    assert "ensemble/config.pbtxt: steps re-pointed: tokenizer -> classifier_tokenizer; postprocess -> classifier_postprocess" in notes
    assert ("warning: router (router/policy.yaml) names classifier; its models' heads: classifier: binary (2 logits, "
            "positive label 'POSITIVE'); classifier_fast: binary (1 logit, positive label 'positive'). The policy no "
            "longer binds: root.steps[1].default.default.nodes[1].node.max_length: 128 tokens, over model "
            "'classifier''s maximum of 48") in notes
    assert (repo / "router" / "labels.txt").read_text() == "positive\n"  # as shipped: that policy no longer binds
    assert "router_short (router_short/policy.yaml) names classifier" in notes and "They agree" in notes
    assert (repo / "router_short" / "labels.txt").read_text() == "positive\n"


def test_legacy_and_committed_heads():
    """The demo classifiers' head.json: binary, one logit 'positive', the shared tokenizer."""
    for name in ("classifier", "classifier_fast", "classifier_fp16"):
        head = read_head(REPO / name)
        assert head == Head("binary", ("positive",), 0, "tokenizer", 0, 128)
        assert head.output_labels() == LEGACY.output_labels()
    assert (REPO / "postprocess" / "labels.txt").read_text() == "positive\n"
    assert (REPO / "ensemble" / "labels.txt").read_text() == "positive\n"
    for model in ("postprocess", "ensemble"):
        config = repository.read_config(REPO / model / "config.pbtxt")
        assert [o.label_filename for o in config.output] == ["labels.txt", ""]


def test_the_command_line(byom_checkpoints, tmp_path, capsys):  # noqa: F811
    """`orchestrator export CKPT --name NAME --positive-label LABEL`, and its errors on stderr."""
    from orchestrator.tooling.cli import main

    repo = copy_repository(tmp_path / "model_repository")
    ckpt = str(byom_checkpoints["distilbert2"][0])
    assert main(["export", ckpt, "--name", "sst", "--repo", str(repo), "--positive-label", "LABEL_0", "--quiet"]) == 0
    assert read_head(repo / "sst").positive_index == 0
    assert main(["export", ckpt, "--name", "tokenizer", "--repo", str(repo), "--quiet"]) == 1
    assert "bad model name 'tokenizer'" in capsys.readouterr().err
    assert main(["export", str(tmp_path), "--name", "x", "--repo", str(repo), "--quiet"]) == 1
    assert "without config.json: not a Hugging Face checkpoint" in capsys.readouterr().err
