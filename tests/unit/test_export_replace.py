"""``orchestrator export`` destroys nothing a user made: SOURCE needs ``--name``; existing
model directories are replaced only with ``--replace`` (the refusal names them, before
anything is read or written); a re-export keeps an edited ``NAME_router/policy.yaml`` and
writes the new starter beside it; an export that leaves a router unable to load fails,
naming the router and why; a re-export names the other routers that use the model."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from orchestrator.tooling.cli import main
from orchestrator.tooling.modeling.export import guard
from orchestrator.tooling.modeling.export.starter import STARTER_BESIDE, starter_policy
from orchestrator.tooling.repository import copy_model
from tests.helpers import REPO


def copy_repository(dest: Path) -> Path:
    """model_repository without its large model files."""
    shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns("__pycache__", "*.onnx", "*.plan"))
    return dest


def tree(repo: Path) -> dict:
    """Every file of ``repo`` -> its sha256."""
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(repo.rglob("*"))
            if p.is_file()}


@pytest.fixture
def repo(tmp_path):
    return copy_repository(tmp_path / "model_repository")


def test_source_without_name_is_refused(repo, tmp_path, capsys):
    before = tree(repo)
    assert main(["export", str(tmp_path / "ckpt"), "--repo", str(repo)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --name NAME is required with SOURCE") and err.count("\n") == 1
    assert tree(repo) == before


def test_an_existing_model_is_not_replaced_without_replace(repo, tmp_path, capsys):
    """The shipped classifier, as a user's export without --name used to replace it."""
    before = tree(repo)
    assert main(["export", str(tmp_path / "ckpt"), "--name", "classifier", "--repo", str(repo)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: export would replace classifier in {repo}; it would also re-point the ensemble ensemble. "
                   "Choose another --name, or pass --replace to replace them (an edited NAME_router/policy.yaml is "
                   "kept)\n")
    assert tree(repo) == before


def test_the_refusal_names_every_directory_it_would_replace(repo, tmp_path, capsys):
    for name in ("new_fp16_ensemble", "new_router"):
        (repo / name).mkdir()
    assert main(["export", str(tmp_path / "ckpt"), "--name", "new", "--fp16", "--router", "--repo", str(repo)]) == 2
    assert "error: export would replace new_fp16_ensemble, new_router in" in capsys.readouterr().err
    assert guard.planned_models("new", fp16=True, router=True) == [
        "new", "new_tokenizer", "new_postprocess", "new_fp16", "new_ensemble", "new_fp16_ensemble", "new_router"]


def test_fp16_from_onnx_keeps_its_default_name_but_never_replaces_silently(repo, capsys):
    before = tree(repo)
    assert main(["export", "--fp16-from-onnx", "classifier", "--repo", str(repo)]) == 2
    assert f"error: export would replace classifier_fp16 in {repo}" in capsys.readouterr().err
    assert tree(repo) == before


def test_a_bad_name_is_named_before_the_directories(repo, tmp_path, capsys):
    assert main(["export", str(tmp_path / "ckpt"), "--name", "router", "--repo", str(repo)]) == 1
    assert "bad model name 'router'" in capsys.readouterr().err


def test_newly_broken_counts_only_what_loaded_before():
    before = {"a": [], "b": ["b: old"], guard.REPOSITORY: ["r1"]}
    after = {"a": ["a: new"], "b": ["b: still"], "c": ["c: new router"], "d": [], guard.REPOSITORY: ["r1", "r2"]}
    assert guard.newly_broken(before, after) == {"a": ["a: new"], "c": ["c: new router"], guard.REPOSITORY: ["r2"]}


@pytest.mark.slow  # torch: a checkpoint and four exports
def test_replace_keeps_the_edited_policy_and_fails_on_a_router_it_breaks(tmp_path, repo, capsys):
    pytest.importorskip("torch", reason="needs torch (the `train` extra)")
    from tests.byom import build_checkpoint

    ckpt = str(build_checkpoint("bert2", tmp_path / "bert2"))
    export = ["export", ckpt, "--name", "sst", "--repo", str(repo), "--router", "--quiet"]
    assert main(export) == 0, capsys.readouterr().err
    # another router using sst, and the user's edit of the starter
    copy_model(repo / "sst_router", repo / "sst_ab")
    policy = repo / "sst_router" / "policy.yaml"
    edited = policy.read_text().replace("stride: 36", "stride: 24") + "# my edit\n"
    policy.write_text(edited)
    capsys.readouterr()

    before = tree(repo)
    assert main(export) == 2
    assert (f"error: export would replace sst, sst_tokenizer, sst_postprocess, sst_ensemble, sst_router in {repo}. "
            in capsys.readouterr().err)
    assert tree(repo) == before

    assert main(export + ["--replace"]) == 0
    err = capsys.readouterr().err
    assert policy.read_text() == edited
    starter = (repo / "sst_router" / STARTER_BESIDE).read_text()
    assert starter == starter_policy("sst", guard_head(repo, "sst"))
    assert f"kept your edited {policy}; the starter policy for the new model is beside it" in err
    assert ("note: router sst_ab uses sst: a running server serves it with the old tokenizer and head until loaded "
            "again (unload and load after the new models), or restart the server") in err
    assert "sst_router use" not in err

    # without --router its own router is one of those a running server must load again
    assert main(export[:-2] + ["--quiet", "--replace"]) == 0
    assert "note: routers sst_ab, sst_router use sst: a running server serves them" in capsys.readouterr().err

    # a shorter max_length: the kept policy (48 tokens) no longer binds, and the command says so;
    # all or nothing: the repository is byte for byte as it was, no staging directory is left
    before = tree(repo)
    siblings = sorted(p.name for p in repo.parent.iterdir())
    assert main(export + ["--replace", "--max-length", "32"]) == 1
    err = capsys.readouterr().err
    assert tree(repo) == before
    assert sorted(p.name for p in repo.parent.iterdir()) == siblings
    assert err.rstrip().endswith(f"nothing was changed in {repo}: the export was written beside it, checked, and removed")
    assert policy.read_text() == edited
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert [ln.split(" cannot load:")[0] for ln in lines] == [
        "error: after this export router sst_ab", "error: after this export router sst_router"]
    assert "over model 'sst''s maximum of 32" in lines[1]
    assert lines[1].endswith(f"check it: orchestrator policy check {policy} --repo {repo}")

    # the demo classifier replaced: the shipped router's 128 tokens no longer fit (it used to be a warning, status 0)
    assert main(["export", ckpt, "--name", "classifier", "--repo", str(repo), "--quiet", "--replace"]) == 1
    err = capsys.readouterr().err
    assert ("error: after this export router router cannot load: root.steps[1].default.default.nodes[1].node.max_length: "
            "128 tokens, over model 'classifier''s maximum of 48") in err
    assert "sst_ab" not in err  # the failed export before changed nothing: sst_ab still loads
    assert "note: router" not in err  # the broken router is not told to reload
    assert tree(repo) == before


def guard_head(repo: Path, name: str):
    from orchestrator.runtime.routing.heads import read_head

    return read_head(repo / name)


def test_router_name_names_the_router_and_a_clash_is_refused(tmp_path, repo, capsys):
    pytest.importorskip("torch", reason="needs torch (the `train` extra)")
    from tests.byom import build_checkpoint

    ckpt = str(build_checkpoint("stars5", tmp_path / "stars5"))
    before = tree(repo)
    assert main(["export", ckpt, "--name", "stars", "--repo", str(repo), "--router-name", "stars_tokenizer", "--quiet"]) == 2
    assert "error: --router-name stars_tokenizer is one of the models the export writes" in capsys.readouterr().err
    assert main(["export", ckpt, "--name", "stars", "--repo", str(repo), "--router-name", "bad name", "--quiet"]) == 1
    assert tree(repo) == before
    capsys.readouterr()
    assert main(["export", ckpt, "--name", "stars", "--repo", str(repo), "--router-name", "sentiment", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"router: sentiment (policy {repo / 'sentiment' / 'policy.yaml'})" in err
    assert not (repo / "stars_router").exists()
    config = (repo / "sentiment" / "config.pbtxt").read_text()
    assert 'name: "sentiment"' in config
    assert tuple((repo / "sentiment" / "labels.txt").read_text().splitlines()) == tuple(guard_head(repo, "stars").labels)
    assert guard.router_states(repo)["sentiment"] == []
    assert [p.name for p in repo.parent.iterdir() if p.name.startswith(f".{repo.name}.")] == []  # nothing left beside
    # --replace of the same export with the same router name: the router is replaced, its policy kept
    assert main(["export", ckpt, "--name", "stars", "--repo", str(repo), "--router-name", "sentiment", "--quiet"]) == 2
    assert "sentiment in" in capsys.readouterr().err
    assert main(["export", ckpt, "--name", "stars", "--repo", str(repo), "--router-name", "sentiment", "--quiet", "--replace"]) == 0
