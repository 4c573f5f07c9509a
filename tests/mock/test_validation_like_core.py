"""Request checks as the embedded Triton 2.51 answers them, found by the generated
differential test (tests/server/test_mock_agrees_generated.py) and pinned here: the core
checks inputs last-sent first, prints an empty missing-input list as "]", and checks a
batch-0 request's data against the shape without its batch dimension."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.testing.mock import InferError

PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([t.name().encode() for t in r.inputs()], dtype=object))])
                for r in requests]
'''
PAIR = '''
name: "pair" backend: "python" max_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
'''
BATCHED = '''
name: "batched" backend: "python" max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "S" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]
'''


@pytest.fixture
def mock(triton_mock):
    triton_mock.add_model("pair", PAIR, PY)
    triton_mock.add_model("batched", BATCHED, PY)
    return triton_mock


def test_the_last_sent_bad_input_is_named_and_the_model_sees_the_sent_order(mock):
    with pytest.raises(InferError, match="inference input 'B' data-type is 'FP64'"):
        mock.infer("pair", {"A": np.zeros(2), "B": np.zeros(2)})
    with pytest.raises(InferError, match=r"unexpected shape for input 'A'"):
        mock.infer("pair", {"B": np.zeros(3, np.float32), "A": np.zeros(3, np.float32)})
    out = mock.infer("pair", {"B": np.zeros(2, np.float32), "A": np.zeros(2, np.float32)})
    assert out["OUT"].tolist() == [b"B", b"A"]


def test_the_input_lists_of_a_count_error(mock):
    with pytest.raises(InferError) as error:
        mock.infer("pair", {"A": np.zeros(2, np.float32), "B": np.zeros(2, np.float32), "C": np.zeros(1, np.float32)})
    assert "Got input(s) ['C','B','A'], but missing required input(s) ]. Please" in error.value.message
    with pytest.raises(InferError) as error:
        mock.infer("pair", {"A": np.zeros(2, np.float32)})
    assert "Got input(s) ['A'], but missing required input(s) ['B']. Please" in error.value.message


def test_a_batch_of_zero_is_checked_against_the_shape_without_the_batch_dimension(mock):
    empty = {"X": np.zeros((0, 3), np.float32), "S": np.zeros((0, 2), dtype=object)}
    with pytest.raises(InferError, match=r"expected 2 string elements for inference input 'S' for model 'batched', got 0"):
        mock.infer("batched", empty)
    with pytest.raises(InferError, match=r"input byte size mismatch for input 'X' for model 'batched'. Expected 12, got 0"):
        mock.infer("batched", {"S": empty["S"], "X": empty["X"]})
