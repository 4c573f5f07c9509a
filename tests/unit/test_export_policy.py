"""``orchestrator policy check PATH --repo R``: the models a policy names must be in the
repository and the policy must bind to their heads (``policy.bind_heads``); errors are
located; ``--write-labels`` writes the router's label file."""

from __future__ import annotations

import shutil

import pytest
import yaml

from orchestrator.runtime.routing.heads import Head
from orchestrator.tooling.cli import main
from orchestrator.tooling.modeling.configs import write_head
from orchestrator.tooling.repository import copy_model
from tests.helpers import REPO


@pytest.fixture
def repo(tmp_path):
    """classifier and classifier_fast (demo heads, no ONNX files), a 3-class model 'stars',
    a two-label model 'sst2' (positive label 'POSITIVE', 64 tokens), their tokenizer models
    and a router."""
    repo = tmp_path / "model_repository"
    for name in ("classifier", "classifier_fast", "router", "tokenizer"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))
    for name in ("stars_tokenizer", "sst2_tokenizer"):  # the heads' own tokenizer models
        copy_model(repo / "tokenizer", repo / name)
    for name, head in {"stars": Head("multiclass", ("1 star", "2 stars", "3 stars"), 0, "stars_tokenizer", 0, 512),
                       "sst2": Head("binary", ("NEGATIVE", "POSITIVE"), 1, "sst2_tokenizer", 0, 64)}.items():
        copy_model(REPO / "classifier", repo / name, ignore=["*.onnx"])  # named as its directory, as Triton requires
        write_head(repo / name, head)
    return repo


def policy(path, document):
    path.write_text(yaml.safe_dump(document))
    return str(path)


def cascade(*models, **top):
    return {"version": 1, **top, "root": {"kind": "cascade", "margin": 0.1,
                                          "stages": [{"kind": "model", "model": m} for m in models]}}


def test_a_model_not_in_the_repository_is_located(repo, tmp_path, capsys):
    path = policy(tmp_path / "p.yaml", cascade("classifier_fast", "nowhere"))
    assert main(["policy", "check", path, "--repo", str(repo)]) == 1
    assert f"invalid policy: {path}: root.stages[1].model: model 'nowhere' is not in {repo}" in capsys.readouterr().err


def test_mixed_heads_are_located(repo, tmp_path, capsys):
    path = policy(tmp_path / "p.yaml", cascade("classifier_fast", "stars"))
    assert main(["policy", "check", path, "--repo", str(repo)]) == 1
    err = capsys.readouterr().err
    assert ("root.stages[1].model: 'stars' has a multiclass (3 labels: 1 star, 2 stars, 3 stars) head, but "
            "'classifier_fast' (root.stages[0]) has a binary (1 logit, positive label 'positive') head") in err


def test_binary_heads_with_the_same_positive_label_agree(repo, tmp_path, capsys):
    path = policy(tmp_path / "p.yaml", cascade("classifier_fast", "sst2", max_sequence_length=64))
    assert main(["policy", "check", path, "--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert f"models classifier_fast, sst2 are in {repo}; every answer: binary (1 logit, positive label 'positive')" in out


def test_max_sequence_length_over_a_models_maximum(repo, tmp_path, capsys):
    path = policy(tmp_path / "p.yaml", cascade("classifier_fast", "sst2", max_sequence_length=100))
    assert main(["policy", "check", path, "--repo", str(repo)]) == 1
    assert ("root.stages[1].max_length: 100 tokens, over model 'sst2''s maximum of 64 (its head.json max_length)"
            in capsys.readouterr().err)


def test_write_labels_for_the_router(repo, capsys):
    path = policy(repo / "router" / "policy.yaml", {"version": 1, "root": {"kind": "model", "model": "stars"}})
    assert main(["policy", "check", path, "--repo", str(repo), "--write-labels"]) == 0
    assert (repo / "router" / "labels.txt").read_text() == "1 star\n2 stars\n3 stars\n"
    assert main(["policy", "check", path]) == 0  # beside the router: its repository, its labels agree
    (repo / "router" / "labels.txt").write_text("positive\n")
    capsys.readouterr()
    assert main(["policy", "check", path]) == 1
    err = capsys.readouterr().err
    assert ("labels.txt lists ['positive'], but the policy answers ['1 star', '2 stars', '3 stars']; run "
            f"`orchestrator policy check {path} --repo {repo} --write-labels`") in err


def test_an_invalid_head_json_is_located(repo, tmp_path, capsys):
    (repo / "stars" / "head.json").write_text('{"kind": "binary"}')
    path = policy(tmp_path / "p.yaml", cascade("classifier_fast", "stars"))
    assert main(["policy", "check", path, "--repo", str(repo)]) == 1
    assert f"root.stages[1].model: {repo / 'stars' / 'head.json'}: required key 'labels' is missing" in capsys.readouterr().err


def test_the_shipped_policy_binds_to_the_shipped_repository(capsys):
    assert main(["policy", "check", str(REPO / "router" / "policy.yaml"), "--repo", str(REPO)]) == 0
    assert "every answer: binary (1 logit, positive label 'positive')" in capsys.readouterr().out


def test_a_copied_router_that_keeps_its_old_name_is_refused_before_any_server_starts(repo, capsys):
    """Copying ``router/`` to add a route keeps ``name: "router"`` in its config: Triton
    refuses the whole repository at start, so ``policy check`` refuses it first (and the
    doctor: tests/unit/test_doctor.py)."""
    shutil.copytree(repo / "router", repo / "router_b")
    path = str(repo / "router_b" / "policy.yaml")
    assert main(["policy", "check", path]) == 1
    err = capsys.readouterr().err
    assert "name 'router' is not the directory's name 'router_b' (Triton refuses the repository" in err
    config = repo / "router_b" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "router"', 'name: "router_b"'))
    assert main(["policy", "check", path, "--repo", str(repo)]) == 0
    (repo / "router_b" / "labels.txt").unlink()
    assert main(["policy", "check", path, "--repo", str(repo)]) == 1
    assert "names the label file 'labels.txt', which is not in" in capsys.readouterr().err
