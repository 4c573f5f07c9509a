"""The same pipeline with its real downstream models, and what happens when they fail."""

import numpy as np
import pytest
from orchestrator.testing.mock import InferError

TEXT = {"TEXT": np.array([b"a fine day", b"rain"], dtype=object)}
pytestmark = pytest.mark.triton_repository("model_repository", load=["pipeline", "embedder", "classifier"])


def test_the_real_models_answer_one_label_and_score_per_text(triton_mock):
    out = triton_mock.infer("pipeline", TEXT)
    assert out["LABEL"].shape == (2,) and set(out["LABEL"].tolist()) <= {b"negative", b"positive", b"neutral"}
    assert out["SCORE"].dtype == np.float32 and np.all((out["SCORE"] > 1 / 3) & (out["SCORE"] <= 1))


def test_a_failing_downstream_model_fails_the_request_with_its_message(triton_mock):
    triton_mock.fail_next("classifier", "out of memory", code="UNAVAILABLE")
    with pytest.raises(InferError, match="classifier: out of memory"):
        triton_mock.infer("pipeline", TEXT)
    assert triton_mock.infer("pipeline", TEXT)["LABEL"].shape == (2,)  # one failure, then fine


def test_a_dead_stub_fails_every_request_until_the_model_is_loaded_again(triton_mock):
    triton_mock.kill_stub("embedder")
    assert triton_mock.is_model_ready("embedder")  # Triton keeps saying READY
    for _ in range(2):
        with pytest.raises(InferError, match="Stub process 'embedder_0_0' is not healthy"):
            triton_mock.infer("pipeline", TEXT)
    triton_mock.load("embedder")
    assert triton_mock.infer("pipeline", TEXT)["LABEL"].shape == (2,)
