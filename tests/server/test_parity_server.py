"""The fp16 variant in a real server: it loads and matches the in-process scores."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.tooling.modeling import parity as P
from tests.helpers import FIXTURES, REPO

FP16_TOLERANCE = 0.05  # orchestrator.tooling.modeling.export.FP16_TOLERANCE


@pytest.fixture(scope="module")
def fixture_data():
    return P.read_labeled(FIXTURES / "parity" / "labeled.tsv")


def test_fp16_loads_in_the_embedded_server_and_matches(triton, fixture_data):
    """``triton`` (tests/conftest.py) serves a copy of model_repository, classifier_fp16 included."""
    index = {m["name"]: m.get("state") for m in triton.repository_index()}
    assert "classifier_fp16" in index, index
    if index["classifier_fp16"] != "READY":  # not among the models the session server loads at start
        triton.load_model("classifier_fp16")
    index = {m["name"]: m.get("state") for m in triton.repository_index()}
    assert index["classifier_fp16"] == "READY" and index["classifier"] == "READY", index
    backend = P.TritonBackend(triton.http_url, ["classifier", "classifier_fp16"])
    try:
        logits, latency, batches = P.score_all(backend, ["classifier", "classifier_fp16"], fixture_data.texts, 16)
    finally:
        backend.close()
    assert logits["classifier_fp16"].dtype == np.float32 and logits["classifier_fp16"].shape == (40, 1)
    assert np.abs(logits["classifier_fp16"] - logits["classifier"]).max() <= FP16_TOLERANCE
    local = P.InProcessBackend(REPO, ["classifier", "classifier_fp16"])
    try:
        mine, _, _ = P.score_all(local, ["classifier", "classifier_fp16"], fixture_data.texts, 16)
    finally:
        local.close()
    for m in mine:  # same tokenizer, same batches, same onnxruntime
        np.testing.assert_allclose(logits[m], mine[m], rtol=0, atol=1e-5)
