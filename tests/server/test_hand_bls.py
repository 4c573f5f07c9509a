"""The benchmark's hand-written BLS floor (``lab/bench/hand_bls``) on the real server: it
answers what the ensemble answers (the same calibrated head over the same classifier) for
short texts, so the benchmark compares like with like."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from orchestrator.tooling.client import text_inputs
from orchestrator.tooling.server import TritonServer
from tests.helpers import REPO, ROOT

pytestmark = pytest.mark.server

TEXTS = ["A gorgeous, witty film.", "A dull, lifeless film.", "the staff were kind but the room was dirty",
         "I would not go back", "Best purchase this year!", "meh", "Crème brûlée was superb", "", "ok " * 40]


def test_hand_bls_answers_as_the_ensemble(tmp_path):
    import tritonclient.http as httpclient

    repo = tmp_path / "model_repository"
    for name in ("tokenizer", "classifier", "postprocess", "ensemble"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "lab" / "bench" / "hand_bls", repo / "hand_bls", ignore=shutil.ignore_patterns("__pycache__"))
    server = TritonServer(repo, models=["tokenizer", "classifier", "postprocess", "ensemble", "hand_bls"])
    server.start()
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        answers = {}
        for model in ("ensemble", "hand_bls"):
            r = client.infer(model, text_inputs(httpclient, TEXTS))
            answers[model] = (r.as_numpy("PROBABILITIES").reshape(-1), r.as_numpy("VERDICTS").reshape(-1))
        client.close()
    finally:
        server.stop()
    np.testing.assert_allclose(answers["hand_bls"][0], answers["ensemble"][0], rtol=0, atol=1.2e-7)
    assert (answers["hand_bls"][1] == answers["ensemble"][1]).all()
