"""Issue 26's done-when: a 3-label checkpoint made here goes from `orchestrator export` to a
served router's answer with its labels, by the README's steps only ("Route your own model";
docs/guides/bring-your-own-model.md has them in more detail):

1. ``orchestrator export CKPT --name topics --repo REPO --router``
2. ``orchestrator policy check REPO/topics_router/policy.yaml --repo REPO``
3. a running server takes the new models through the repository API, in the README's
   order, with the admin key as the image requires it (``admin-key`` header); or a restart
   of the server (every model of the repository)
4. ``orchestrator classify TEXT --model topics_router --url ...``

and the answers are what ``transformers`` answers for the checkpoint (torch, here).
"""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest

from orchestrator.tooling.cli import main
from orchestrator.tooling.client import classify
from orchestrator.tooling.production import KEY_HEADER
from tests.byom import TEXTS, build_checkpoint, expected_probabilities

pytest.importorskip("torch", reason="needs torch (the `train` extra: make test installs it, make demo does not)")

LABELS = ("sports", "politics", "technology")
SPEC = ("bert", LABELS, "single_label_classification")
KEY = "test-admin-key-26"
README_LOAD_ORDER = ["topics_tokenizer", "topics", "topics_postprocess", "topics_ensemble", "topics_router"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = build_checkpoint("topics3", tmp_path_factory.mktemp("ckpt") / "topics3", spec=SPEC)
    return path, expected_probabilities(path)


def _readme_load_commands():
    """The model names of the README's load loop, in its order."""
    from orchestrator.tooling.paths import PROJECT_ROOT

    readme = (PROJECT_ROOT / "README.md").read_text()
    m = re.search(r"for m in ((?:mymodel\w*\s*)+); do", readme)
    assert m, "README: the repository-load loop of 'Route your own model' is missing"
    return [name.replace("mymodel", "topics") for name in m.group(1).split()]


def _load(url: str, name: str, key: str | None) -> int:
    req = urllib.request.Request(f"http://{url}/v2/repository/models/{name}/load", data=b"", method="POST",
                                 headers={KEY_HEADER: key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_three_label_checkpoint_by_the_readme(checkpoint, tmp_path, capsys):
    from orchestrator.tooling.production import restricted_args
    from orchestrator.tooling.server import TritonServer

    ckpt, expected = checkpoint
    repo = tmp_path / "model_repository"
    repo.mkdir()
    # A running server (the image's restricted repository API) before the model exists.
    server = TritonServer(repo, models=[], control_key=KEY).start()
    assert any(a.startswith("--http-restricted-api=") for a in restricted_args(KEY))
    try:
        # 1. export, with a router of its own
        assert main(["export", str(ckpt), "--name", "topics", "--repo", str(repo), "--router", "--quiet"]) == 0
        assert (repo / "topics_router" / "labels.txt").read_text().splitlines() == list(LABELS)
        # 2. the check the README gives
        assert main(["policy", "check", str(repo / "topics_router" / "policy.yaml"), "--repo", str(repo)]) == 0
        assert "every answer: multiclass (3 labels: sports, politics, technology)" in capsys.readouterr().out
        # 3. the README's load loop: without the key the image refuses, with it each loads
        assert _readme_load_commands() == README_LOAD_ORDER
        assert _load(server.http_url, "topics_tokenizer", None) == 403
        for name in README_LOAD_ORDER:
            assert _load(server.http_url, name, KEY) == 200, (name, server.log_path)
        # 4. classify through the router: the labels and transformers' probabilities
        _check_answers(server.http_url, expected, capsys)
    finally:
        server.stop()
    # Or a restart: every model of the repository at start, the same answers.
    server = TritonServer(repo).start()
    try:
        assert set(README_LOAD_ORDER) <= set(server.startup_models)
        _check_answers(server.http_url, expected, capsys)
    finally:
        server.stop()


def _check_answers(url, expected, capsys):
    preds = classify(TEXTS, model="topics_router", url=url, threshold=0.0)
    assert [p.labels for p in preds] == [LABELS] * len(TEXTS)
    # whole texts (within the model's 48 tokens): the checkpoint's own answer
    short = [0, 1, 2, 4]
    np.testing.assert_allclose([preds[i].probabilities for i in short], expected[short], rtol=0, atol=1e-5)
    assert [preds[i].route for i in short] == ["topics"] * 4
    assert preds[3].route == "empty" and preds[3].probabilities == pytest.approx([1 / 3] * 3, abs=1e-6)
    assert preds[5].route.startswith("chunked:topics")  # 120 words: windows of the model's max_length
    assert main(["classify", TEXTS[0], "--model", "topics_router", "--url", url, "--threshold", "0.0"]) == 0
    out = capsys.readouterr().out
    top = LABELS[int(np.argmax(expected[0]))]
    assert out.startswith(top) and f"{top}={expected[0].max():.4f}" in out
