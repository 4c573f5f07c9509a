"""Bring your own model, every head: the example policies in docs/policies/ and the starter
router of ``orchestrator export --router`` bind to models with those heads, as
``orchestrator policy check --repo`` checks them (no torch: heads written directly)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from orchestrator.runtime.routing import policy as P
from orchestrator.runtime.routing.heads import Head, read_head
from orchestrator.tooling.cli import main
from orchestrator.tooling.modeling.configs import write_head
from orchestrator.tooling.modeling.export.starter import STARTER_BESIDE, router_name, starter_policy, write_starter_router
from orchestrator.tooling.paths import PROJECT_ROOT
from orchestrator.tooling.repository import copy_model
from tests.helpers import REPO

POLICIES = sorted((PROJECT_ROOT / "docs" / "policies").glob("*.yaml"))
STARS = ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")
TOXIC = ("toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate")
#: the models the BYOM examples name -> their heads (each with its own tokenizer model)
EXAMPLE_HEADS = {
    "sst2": Head("binary", ("NEGATIVE", "POSITIVE"), 1, "sst2_tokenizer", 0, 512),
    "sst2_small": Head("binary", ("NEGATIVE", "POSITIVE"), 1, "sst2_small_tokenizer", 0, 512),
    "stars": Head("multiclass", STARS, 0, "stars_tokenizer", 0, 512),
    "stars_fp16": Head("multiclass", STARS, 0, "stars_tokenizer", 0, 512),
    "toxicity": Head("multilabel", TOXIC, 0, "toxicity_tokenizer", 0, 512),
    "labels3": Head("multilabel", ("a", "b", "c"), 0, "labels3_tokenizer", 0, 48),
    # hierarchical.yaml: a language model routing to sentiment specialists with the demo's head
    "lang_id": Head("multiclass", ("en", "de", "fr"), 0, "tokenizer", 0, 128),
    "sentiment_de": Head("binary", ("positive",), 0, "tokenizer", 0, 128),
    "sentiment_multi": Head("binary", ("positive",), 0, "tokenizer", 0, 128),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The shipped repository (no ONNX files) plus models with the examples' heads."""
    repo = tmp_path_factory.mktemp("starter") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("*.onnx", "__pycache__", "triton_env*", "*stub*", "env.pbtxt"))
    for name, head in EXAMPLE_HEADS.items():
        if not (repo / head.tokenizer).exists():
            copy_model(REPO / "tokenizer", repo / head.tokenizer)  # named as its directory, as Triton requires
        copy_model(REPO / "classifier", repo / name, ignore=["*.onnx"])
        write_head(repo / name, head)
    return repo


def test_there_is_an_example_policy_for_every_head():
    names = {p.stem for p in POLICIES}
    assert {"binary", "multiclass", "multilabel"} <= names, names


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_every_example_policy_binds_to_models_with_its_heads(repo, path, capsys):
    assert main(["policy", "check", str(path), "--repo", str(repo)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    kind = {"binary": "binary", "multiclass": "multiclass (5 labels", "multilabel": "multilabel (6 labels"}.get(path.stem)
    if kind:
        assert f"every answer: {kind}" in out


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_example_windows_fit_the_models(path):
    """The README's rule: max_sequence_length and the chunk window = the model's max_length."""
    document = yaml.safe_load(path.read_text())
    policy = P.parse_policy(document)
    default = document.get("defaults", {}).get("chunk", {}).get("window")
    windows = [n.get("window", default) for n in _nodes(document["root"]) if n.get("kind") == "chunk"]
    if path.stem in ("binary", "multiclass", "multilabel"):  # the BYOM examples chunk long texts
        assert windows, f"{path.name}: no chunk node"
    assert set(windows) <= {policy.max_sequence_length}, (windows, policy.max_sequence_length)


def _nodes(node):
    if isinstance(node, dict):
        if "kind" in node:
            yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


@pytest.mark.parametrize("model", ["sst2", "stars", "toxicity", "labels3"])
def test_the_starter_router_passes_policy_check(repo, model, capsys):
    head = read_head(repo / model)
    router = write_starter_router(repo, model, head)
    assert router.name == router_name(model) == f"{model}_router"
    policy_path = router / "policy.yaml"
    assert main(["policy", "check", str(policy_path), "--repo", str(repo)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"models {model} are in {repo}; every answer: {head.describe()}" in out
    assert (router / "labels.txt").read_text().splitlines() == list(head.output_labels())
    document = yaml.safe_load(policy_path.read_text())
    assert document["max_sequence_length"] == head.max_length
    guard = document["root"]["steps"][0]["cases"][0]
    assert guard["when"] == {"empty": True}
    assert guard["then"]["probability"] == (pytest.approx(1 / len(head.labels)) if head.kind == "multiclass" else 0.5)
    chunk = document["root"]["steps"][1]
    assert chunk["window"] == head.max_length and 0 < chunk["stride"] < chunk["window"]
    config = (router / "config.pbtxt").read_text()
    assert f'name: "{router.name}"' in config and 'string_value: "policy.yaml"' in config
    assert (router / "1" / "model.py").read_text() == (REPO / "router" / "1" / "model.py").read_text()
    assert not (router / "configs").exists()


def test_the_starter_router_replaces_an_older_one_and_never_touches_the_shipped_router(repo):
    shipped = (repo / "router" / "policy.yaml").read_text()
    write_starter_router(repo, "stars", read_head(repo / "stars"))
    (repo / "stars_router" / "stale.txt").write_text("x")
    write_starter_router(repo, "stars", read_head(repo / "stars"))
    assert not (repo / "stars_router" / "stale.txt").exists()
    assert not (repo / "stars_router" / STARTER_BESIDE).exists()  # an unedited starter is simply rewritten
    assert (repo / "router" / "policy.yaml").read_text() == shipped
    assert not list(repo.glob(".*"))  # the old router, set aside meanwhile, is gone


def test_an_edited_policy_is_kept_and_the_starter_written_beside_it(repo, capsys):
    """The README tells users to edit NAME_router/policy.yaml: a re-export keeps their file."""
    head = read_head(repo / "labels3")
    router = write_starter_router(repo, "labels3", head)
    edited = (router / "policy.yaml").read_text().replace("stride: 36", "stride: 24") + "# mine\n"
    (router / "policy.yaml").write_text(edited)
    write_starter_router(repo, "labels3", head)
    assert (router / "policy.yaml").read_text() == edited
    assert (router / STARTER_BESIDE).read_text() == starter_policy("labels3", head)
    assert (router / "labels.txt").read_text() == "a\nb\nc\n"
    assert main(["policy", "check", str(router / "policy.yaml"), "--repo", str(repo)]) == 0, capsys.readouterr().err
    # the starter of the head the model had before is no edit: replaced by the new one
    old = Head("multilabel", ("a", "b", "c"), 0, "labels3_tokenizer", 0, 32)
    (router / "policy.yaml").write_text(starter_policy("labels3", old))
    write_starter_router(repo, "labels3", head, previous=[old])
    assert (router / "policy.yaml").read_text() == starter_policy("labels3", head)
    assert not (router / STARTER_BESIDE).exists()


def test_starter_policy_text_names_the_model_and_its_limits():
    text = starter_policy("labels3", EXAMPLE_HEADS["labels3"])
    assert "max_sequence_length: 48" in text and "window: 48" in text and "stride: 36" in text
    assert "when: {empty: true}" in text and "Output labels: a, b, c" in text
    P.parse_policy(yaml.safe_load(text))


def test_export_cli_has_the_router_option():
    import argparse

    from orchestrator.tooling.modeling.export.cli import add_export_arguments

    args = add_export_arguments(argparse.ArgumentParser()).parse_args(["ckpt", "--name", "m", "--router"])
    assert args.router is True
