import numpy as np
import pytest
from orchestrator.testing.mock import InferError


@pytest.mark.triton_repository("model_repository", load=["pipeline"])
def test_pipeline_labels_text_and_rejects_empty_text(triton_mock):
    triton_mock.fake("embedder", lambda x: {"EMBEDDING": np.ones((len(x["TEXT"]), 8), np.float32)},
                     inputs={"TEXT": "BYTES"}, outputs={"EMBEDDING": ("FP32", [-1, 8])})
    triton_mock.fake("classifier", lambda x: {"LOGITS": np.tile(np.float32([0, 5, 1]), (len(x["EMBEDDING"]), 1))},
                     inputs={"EMBEDDING": ("FP32", [-1, 8])}, outputs={"LOGITS": ("FP32", [-1, 3])})
    out = triton_mock.infer("pipeline", {"TEXT": np.array([b"great", b"fine"], dtype=object)})
    assert out["LABEL"].tolist() == [b"positive", b"positive"]
    assert np.all(out["SCORE"] > 0.9)
    assert triton_mock.calls_to("embedder") == [(1,)] and triton_mock.calls_to("classifier") == [(1,)]
    with pytest.raises(InferError, match="input 'TEXT': element 1 is empty"):
        triton_mock.infer("pipeline", {"TEXT": np.array([b"ok", b""], dtype=object)})
    assert triton_mock.calls_to("embedder") == [(1,)]  # the bad request never reached it
