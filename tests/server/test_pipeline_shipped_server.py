"""The shipped ensemble written as a pipeline policy (tests/mock/test_pipeline_shipped_mock.py)
in a real tritonserver: every output byte-identical to the ensemble's on the held-out texts,
in requests of 64 texts and of one, over HTTP and gRPC."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from orchestrator.tooling.modeling import data
from tests.helpers import REPO
from tests.mock.test_pipeline_mock import same
from tests.mock.test_pipeline_shipped_mock import add_pipeline_router
from tests.server.test_tensor_pipeline_server import infer

pytestmark = pytest.mark.server
MODELS = ["tokenizer", "classifier", "postprocess", "ensemble", "ensemble_router"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from orchestrator.tooling.server import TritonServer

    repo = tmp_path_factory.mktemp("shipped") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    add_pipeline_router(repo)
    with TritonServer(repo, models=MODELS) as srv:
        yield srv


def request(texts):
    return {"TEXT": np.array([t.encode() for t in texts], dtype=object).reshape(-1, 1),
            "THRESHOLD": np.full((len(texts), 1), 0.5, np.float32)}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_held_out_text_answers_byte_identically_to_the_ensemble(server, protocol):
    texts = data.held_out_texts()
    assert len(texts) >= 1900
    for start in range(0, len(texts), 64):
        batch = request(texts[start: start + 64])
        same(infer(server, "ensemble_router", batch, protocol=protocol), infer(server, "ensemble", batch, protocol=protocol))
    for text in texts[:100]:
        one = request([text])
        same(infer(server, "ensemble_router", one, protocol=protocol), infer(server, "ensemble", one, protocol=protocol))
