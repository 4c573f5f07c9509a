"""python_backend's own examples load and answer through the pytest plugin unmodified
(``ORCHESTRATOR_PYTHON_BACKEND_SRC``; tests/server/test_mock_agrees_upstream_examples.py
compares them with the embedded Triton 2.51)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.testing.mock import InferError
from tests.upstream_examples import needs_upstream, upstream_repository

pytestmark = needs_upstream
A = np.float32([1.5, 2, 3, 4])
B = np.float32([0.5, 1, 1, -1])


@pytest.fixture
def examples(tmp_path, triton_mock_factory):
    return triton_mock_factory(upstream_repository(tmp_path / "repo"))


def test_add_sub(examples):
    examples.load("add_sub")
    out = examples.infer("add_sub", {"INPUT0": A, "INPUT1": B})
    assert out["OUTPUT0"].tolist() == (A + B).tolist() and out["OUTPUT1"].tolist() == (A - B).tolist()
    # the core names the last input sent (tests/server/test_mock_agrees_upstream_examples.py)
    with pytest.raises(InferError, match=r"unexpected shape for input 'INPUT1' for model 'add_sub'"):
        examples.infer("add_sub", {"INPUT0": A[:3], "INPUT1": B[:3]})


def test_auto_complete_fills_in_a_model_without_config_pbtxt(examples):
    for name, batch in (("nobatch_auto_complete", 0), ("batch_auto_complete", 4)):
        examples.load(name)
        config = examples.model_config(name)
        assert config["max_batch_size"] == batch and config["backend"] == "python"
        assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
        a, b = (A[None], B[None]) if batch else (A, B)
        out = examples.infer(name, {"INPUT0": a, "INPUT1": b})
        assert out["OUTPUT0"].tolist() == (a + b).tolist()


@pytest.mark.parametrize("model", ["bls_sync", "bls_async"])
def test_bls_picks_add_sub_or_pytorch(examples, model):
    examples.load("add_sub")
    examples.fake("pytorch", lambda x: {"OUTPUT0": x["INPUT0"] * 10, "OUTPUT1": x["INPUT1"] * 10},
                  inputs={"INPUT0": ("FP32", [4]), "INPUT1": ("FP32", [4])},
                  outputs={"OUTPUT0": ("FP32", [4]), "OUTPUT1": ("FP32", [4])})
    examples.load(model)
    for target, expected in (("add_sub", (A + B, A - B)), ("pytorch", (A * 10, B * 10))):
        inputs = {"INPUT0": A, "INPUT1": B, "MODEL_NAME": np.array([target.encode()], dtype=object)}
        if model == "bls_async":
            inputs = {"INPUT0": A, "INPUT1": B}
            expected = (A * 10, A - B)  # async: OUTPUT0 from pytorch, OUTPUT1 from add_sub
        out = examples.infer(model, inputs)
        assert out["OUTPUT0"].tolist() == expected[0].tolist() and out["OUTPUT1"].tolist() == expected[1].tolist()
    if model == "bls_sync":
        with pytest.raises(InferError, match="Failed for execute the inference request. Model 'nope' is not ready"):
            examples.infer(model, {"INPUT0": A, "INPUT1": B, "MODEL_NAME": np.array([b"nope"], dtype=object)})


def test_custom_metrics_counts_the_latency(examples):
    examples.load("custom_metrics")
    out = examples.infer("custom_metrics", {"INPUT0": A, "INPUT1": B})
    assert out["OUTPUT0"].tolist() == (A + B).tolist()
    value = examples.metric("requests_process_latency_ns", {"model": "custom_metrics", "version": "1"})
    assert value > 0
    assert not [r for r in examples.logs if r.level == "ERROR"]


def test_decoupled_repeat_and_square_and_bls_decoupled(examples):
    examples.load("repeat_int32")
    examples.load("square_int32")
    responses = examples.infer_stream("repeat_int32", {"IN": np.int32([4, 2, 0, 1]), "DELAY": np.uint32([1, 2, 3, 4]),
                                                       "WAIT": np.uint32([5])})
    assert [r.outputs["OUT"].tolist() for r in responses if r.outputs] == [[4], [2], [0], [1]]
    responses = examples.infer_stream("square_int32", {"IN": np.int32([3])})
    assert [r.outputs["OUT"].tolist() for r in responses if r.outputs] == [[3]] * 3
    examples.strict_outputs = False  # upstream's models return INT64 for a TYPE_INT32 output (Triton passes it)
    for model, calls in (("bls_decoupled_sync", 1), ("bls_decoupled_async", 2)):
        examples.load(model)
        assert examples.infer(model, {"IN": np.int32([3])})["SUM"].tolist() == [calls * 9]

