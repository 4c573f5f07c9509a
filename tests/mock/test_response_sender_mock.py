"""A non-decoupled model answering through its response sender, on the mock (fixture
model tests/fixtures/mock/response_sender/sender_unary). The expected values are what the
embedded Triton 2.51 answered; tests/server/test_mock_agrees_response_sender.py runs the
same cases on both and compares."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.testing.mock import InferError, MockTriton
from tests.helpers import FIXTURES

REPO = FIXTURES / "mock" / "response_sender"
TWO = "expected a single response, got 2"


@pytest.fixture(scope="module")
def mock():
    with MockTriton(REPO, model_config_name=None, models=["sender_unary", "sender_caller"], response_timeout=1.0) as server:
        yield server


def _case(case):
    return {"CASE": np.array([case.encode()], dtype=np.object_)}


def stream(mock, case):
    return [(item.outputs["OUT"].tolist() if item.outputs else None,
             item.error.message.splitlines()[0] if item.error else None, item.final)
            for item in mock.infer_stream("sender_unary", _case(case))]


def unary(mock, case):
    try:
        outputs = mock.infer("sender_unary", _case(case))
        return outputs["OUT"].tolist() if outputs else {}
    except InferError as exc:
        return exc.message.splitlines()[0]


@pytest.mark.parametrize("case,answer,shown", [
    ("with_final", [1], [([1], None, True)]),
    # the final flag alone: the stream shows the response as not final, and nothing after it
    ("final_alone", [2], [([2], None, False)]),
    ("final_from_thread", [3], [([3], None, False)]),
    ("all_from_thread", [4], [([4], None, True)]),
    ("returned", [13], [([13], None, True)]),
    ("final_then_return", [9], [([9], None, True)]),
    ("error_then_final", "bad input", [(None, "bad input", False)]),
    ("empty_with_final", {}, [(None, None, True)]),
])
def test_one_response_then_the_final_flag(mock, case, answer, shown):
    assert unary(mock, case) == answer
    assert stream(mock, case) == shown


@pytest.mark.parametrize("case,first", [("two_sends", [5]), ("send_then_return", [7]), ("send_then_raise", [11])])
def test_a_response_without_the_flag_then_a_failed_execute_is_two_responses(mock, case, first):
    """The backend answers the failed execute with an error response too: ``infer``
    gets the frontends' error, a stream shows only the first response, not final."""
    assert unary(mock, case) == TWO
    assert stream(mock, case) == [(first, None, False)]


def test_the_final_flag_alone_first_is_the_stubs_error(mock):
    message = ("Failed to process the request(s) for model 'sender_unary_0_0', message: TritonModelException: "
               "Unable to send response. Non-decoupled model cannot send complete final before sending a response.")
    assert unary(mock, "final_first") == message
    assert stream(mock, "final_first") == [(None, message, True)]


def test_a_response_never_followed_by_the_flag_is_never_delivered(mock):
    """Triton holds it until the flag comes (for ever); the mock ends with its own error."""
    assert unary(mock, "never_final").startswith("mock_triton: model 'sender_unary' sent a response")
    [(outputs, error, _)] = stream(mock, "never_final")
    assert outputs is None and error.startswith("mock_triton: ")



@pytest.mark.parametrize("case,got", [
    ("final_alone", {"early": True, "OUT": [2]}),
    # a BLS caller gets the response when it is sent, not when the final flag comes
    ("final_from_thread", {"early": True, "OUT": [3]}),
    ("never_final", {"early": True, "OUT": [14]}),
    ("returned", {"early": True, "OUT": [13]}),
])
def test_a_bls_caller_gets_the_response_as_it_is_sent(mock, case, got):
    import json

    assert json.loads(mock.infer("sender_caller", _case(case))["OUT"][0]) == got
