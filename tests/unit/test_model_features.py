"""The model-configuration features in the model repository, offline: every model's warmup sample and its data
files, which models enable Triton's response cache, the server flags for the cache, and
``orchestrator policy check`` against the repository's model versions.
(Against a real server: ``tests/server/test_model_features.py``.)"""

from __future__ import annotations

import shutil
import struct

import numpy as np
import pytest
import yaml

from orchestrator.tooling.cli import main
from orchestrator.tooling.repository import config_path, read_config
from orchestrator.tooling.warmup import (
    SAMPLE_NAME,
    SAMPLE_TEXT,
    add_model_features,
    model_kind,
    string_bytes,
    warmup_data,
    warmup_sample,
)
from tests.helpers import REPO

TOKENIZER = REPO / "tokenizer" / "1"
MODELS = {"tokenizer": "tokenizer", "postprocess": "postprocess", "router": "router",
          "classifier": "classifier", "classifier_fast": "classifier", "classifier_fp16": "classifier"}


def configs(model):
    paths = [REPO / model / "config.pbtxt", *sorted((REPO / model / "configs").glob("*.pbtxt"))]
    return [p for p in paths if p.is_file() and p.name != "env.pbtxt"]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_model_warms_up_with_one_review_in_the_shape_of_a_first_request(model):
    kind = MODELS[model]
    want = warmup_sample(kind, TOKENIZER)
    for path in configs(model):
        config = read_config(path)
        assert model_kind(config) == kind, path
        assert list(config.model_warmup) == [want], path
        assert config.model_warmup[0].name == SAMPLE_NAME and config.model_warmup[0].batch_size == 1
    # the data files are what the generator writes today (orchestrator warmup)
    for name, (_, _, content) in warmup_data(kind, TOKENIZER).items():
        assert (REPO / model / "warmup" / name).read_bytes() == content, f"{model}/warmup/{name}: regenerate"


def test_classifier_warmup_ids_are_the_tokenized_sample_and_a_mask_of_ones():
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(TOKENIZER))(SAMPLE_TEXT)["input_ids"]
    data = warmup_data("classifier", TOKENIZER)
    assert np.frombuffer(data["input_ids"][2], "<i8").tolist() == ids
    assert np.frombuffer(data["attention_mask"][2], "<i8").tolist() == [1] * len(ids)
    assert data["input_ids"][1] == [len(ids)] and 20 <= len(ids) <= 40  # a typical review, not a 512-token pad
    assert string_bytes(["ab", "é"]) == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 2) + "é".encode()


def test_only_the_classifiers_enable_the_response_cache():
    """Triton's cache key leaves out request parameters: the router (``route``) and the
    tokenizer (``truncation``) must not be cached; postprocess is cheaper than a lookup."""
    for model in sorted(p.name for p in REPO.iterdir() if (p / "config.pbtxt").is_file()):
        for path in configs(model):
            enabled = read_config(path).response_cache.enable
            assert enabled == (MODELS.get(model) == "classifier"), path


def test_add_model_features_reproduces_the_shipped_configs():
    """What a config generator applies equals what the shipped files declare."""
    for model in ("classifier", "router", "tokenizer"):
        shipped = read_config(config_path(REPO / model, "embedded"))
        bare = read_config(config_path(REPO / model, "embedded"))
        bare.ClearField("model_warmup")
        bare.ClearField("response_cache")
        assert add_model_features(bare, TOKENIZER) == shipped, model


def test_server_command_enables_the_local_cache_from_the_wheel(tmp_path):
    from orchestrator.tooling.embedded import find_embedded_server
    from orchestrator.tooling.server import TritonServer

    embedded = find_embedded_server()
    srv = TritonServer(tmp_path, models=[], http_port=1, grpc_port=2, metrics_port=3, response_cache_bytes=1 << 20)
    srv._ports = {"http": 1, "grpc": 2, "metrics": 3}
    cmd = srv.build_command(embedded, tmp_path)
    assert "--cache-config=local,size=1048576" in cmd and f"--cache-dir={embedded.caches}" in cmd
    assert (embedded.caches / "local" / "libtritoncache_local.so").is_file()
    plain = TritonServer(tmp_path, models=[])
    plain._ports = {"http": 1, "grpc": 2, "metrics": 3}
    assert not any(a.startswith("--cache") for a in plain.build_command(embedded, tmp_path))


# ----------------------------------------------------------------------------- policy check and versions


def versioned_repository(tmp_path, policy_line):
    repo = tmp_path / "model_repository"
    repo.mkdir()
    shutil.copytree(REPO / "classifier", repo / "classifier", ignore=shutil.ignore_patterns("*.onnx"))
    shutil.copytree(REPO / "tokenizer", repo / "tokenizer", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "classifier" / "1", repo / "classifier" / "2")  # a second version, model.py and all
    for path in configs("classifier"):
        target = repo / "classifier" / path.relative_to(REPO / "classifier")
        target.write_text(path.read_text() + policy_line)
    return repo


def pinned(version, name="v"):
    return {"version": 1, "root": {"kind": "model", "name": name, "model": "classifier", "version": version}}


def test_policy_check_accepts_a_version_the_repository_serves(tmp_path, capsys):
    repo = versioned_repository(tmp_path, "version_policy: { specific: { versions: [1, 2] } }\n")
    path = tmp_path / "p.yaml"
    for version in (1, 2):
        path.write_text(yaml.safe_dump(pinned(version)))
        assert main(["policy", "check", str(path), "--repo", str(repo)]) == 0
        out = capsys.readouterr().out
        assert f"model classifier@{version}" in out and f"pinned model versions are served from {repo}" in out


def test_policy_check_names_the_node_of_a_version_not_served(tmp_path, capsys):
    repo = versioned_repository(tmp_path, "")  # default version_policy: the latest only (2)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "root": {"kind": "split", "branches": [
        {"weight": 1, "node": {"kind": "model", "name": "a", "model": "classifier", "version": 1}},
        {"weight": 1, "node": {"kind": "model", "name": "b", "model": "classifier", "version": 3}}]}}))
    assert main(["policy", "check", str(path), "--repo", str(repo)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: root.branches[0].node.version: version 1 of 'classifier' is not served" in err
    assert "version directories: 1, 2; served by its version_policy: 2" in err
    assert "root.branches[1].node.version: version 3 of 'classifier' is not served" in err
    path.write_text(yaml.safe_dump({"version": 1, "root": {"kind": "model", "model": "nowhere", "version": 1}}))
    assert main(["policy", "check", str(path), "--repo", str(repo)]) == 1
    assert f"root.version: model 'nowhere' is not in {repo}" in capsys.readouterr().err


def test_policy_check_finds_the_repository_of_a_policy_beside_a_model(tmp_path, capsys):
    repo = versioned_repository(tmp_path, "version_policy: { all: { } }\n")
    (repo / "router").mkdir()
    shutil.copy(REPO / "router" / "config.pbtxt", repo / "router" / "config.pbtxt")
    shutil.copy(REPO / "router" / "labels.txt", repo / "router" / "labels.txt")
    shutil.copytree(REPO / "router" / "1", repo / "router" / "1", ignore=shutil.ignore_patterns("__pycache__"))
    path = repo / "router" / "policy.yaml"
    path.write_text(yaml.safe_dump(pinned(2)))
    assert main(["policy", "check", str(path)]) == 0
    assert f"served from {repo}" in capsys.readouterr().out
