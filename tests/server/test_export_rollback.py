"""A failed ``orchestrator export --replace`` leaves a repository a real server loads whole.

The shipped repository (models in place) gets a 5-class model behind a router of its own
name (``--router-name sentiment``); then the demo ``classifier`` is replaced by a checkpoint
whose 48 tokens the shipped router's policy (128) cannot use: the export exits 1 naming the
router, the repository is byte for byte as before, and a real Triton loads every model of it
and answers through both routers."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from orchestrator.tooling.cli import main
from tests.byom import build_checkpoint, infer, start_server
from tests.helpers import REPO

pytest.importorskip("torch", reason="needs torch (the `train` extra: make test installs it, make demo does not)")


def tree(repo: Path) -> dict:
    return {str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(repo.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_a_failed_replace_leaves_every_model_loadable(tmp_path, capsys):
    repo = tmp_path / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "triton_python_backend_stub*",
                                                              "env.pbtxt"))
    stars = str(build_checkpoint("stars5", tmp_path / "stars5"))
    short = str(build_checkpoint("bert2", tmp_path / "bert2"))
    assert main(["export", stars, "--name", "stars", "--repo", str(repo), "--router-name", "sentiment", "--quiet"]) == 0
    capsys.readouterr()
    before = tree(repo)
    assert main(["export", short, "--name", "classifier", "--repo", str(repo), "--quiet", "--replace"]) == 1
    err = capsys.readouterr().err
    assert "error: after this export router router cannot load" in err and f"nothing was changed in {repo}" in err
    assert tree(repo) == before
    models = sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file())
    server = start_server(repo, models)
    try:
        import tritonclient.http as http

        client = http.InferenceServerClient(server.http_url)
        try:
            assert [m for m in models if not client.is_model_ready(m)] == []
        finally:
            client.close()
        texts = ["A gorgeous, witty film.", "A dull, lifeless film."]
        probs, _ = infer(server.http_url, "router", texts, np.full((2, 1), 0.5, np.float32))
        assert probs.shape == (2, 1)
        probs, verdicts = infer(server.http_url, "sentiment", texts, np.full((2, 1), 0.5, np.float32))
        assert probs.shape == (2, 5) and np.allclose(probs.sum(axis=1), 1, atol=1e-5)
    finally:
        server.stop()
