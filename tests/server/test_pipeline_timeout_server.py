"""A pipeline step's ``timeout_ms`` in the embedded Triton 2.51, as on the mock: a call past
it is cut (the model's execute goes on; the router stops waiting), the request answered
UNAVAILABLE naming the step, the fallback answers in its place, the circuit counts it only
with ``count_timeouts``; a request's own timeout, when sooner, cuts the call too."""

from __future__ import annotations

import time

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.mock.test_pipeline_timeout_mock import SLOW_S, feat
from tests.pipeline_repo import TIMED_MS, make_pipeline_repository
from tests.server.test_tensor_pipeline_server import infer

pytestmark = pytest.mark.server

MODELS = ["second", "sleeper", "timed", "timed_fallback", "timed_counting"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from orchestrator.tooling.server import TritonServer

    repo = make_pipeline_repository(tmp_path_factory.mktemp("timed") / "model_repository")
    with TritonServer(repo, models=MODELS, model_config_name=None) as srv:
        yield srv


def timed(server, model, inputs, **kwargs):
    """(the answer or the error's text, seconds it took)."""
    began = time.monotonic()
    try:
        return infer(server, model, inputs, **kwargs), time.monotonic() - began
    except InferenceServerException as exc:
        return str(exc), time.monotonic() - began


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_slow_call_is_cut_and_the_request_fails_naming_the_step(server, protocol):
    got, took = timed(server, "timed", feat(SLOW_S), protocol=protocol)
    assert isinstance(got, str) and f"step 'sleeper' timed out after {TIMED_MS} ms: model 'sleeper' did not answer" in got
    assert ("[503]" in got if protocol == "http" else "StatusCode.UNAVAILABLE" in got), got
    assert took < SLOW_S - 0.3, took
    time.sleep(SLOW_S)  # the cut call still runs in the model: Triton does not stop an execute
    got, _ = timed(server, "timed", feat(0.0), protocol=protocol)  # the circuit stayed closed
    assert not isinstance(got, str) and got["OUT"].tolist() == [[3.0, 4.0]], got
    assert server.is_ready()


def test_a_cut_call_is_answered_by_the_fallback(server):
    time.sleep(SLOW_S)
    got, took = timed(server, "timed_fallback", feat(SLOW_S, rows=2))
    assert not isinstance(got, str) and got["OUT"].tolist() == [[2.0, 3.0], [2.0, 3.0]], got
    assert took < SLOW_S - 0.3, took


def test_with_count_timeouts_a_cut_call_opens_the_circuit(server):
    time.sleep(SLOW_S)
    got, _ = timed(server, "timed_counting", feat(SLOW_S))
    assert isinstance(got, str) and "timed out" in got, got
    got, took = timed(server, "timed_counting", feat(0.0))
    assert isinstance(got, str) and "circuit" in got.lower() and "[503]" in got, got
    assert took < 0.5, took


def test_the_requests_own_timeout_when_sooner_cuts_the_call(server):
    time.sleep(SLOW_S)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = feat(SLOW_S)["FEAT"]
        item = grpcclient.InferInput("FEAT", list(x.shape), "FP32")
        item.set_data_from_numpy(x)
        began = time.monotonic()
        with pytest.raises(InferenceServerException, match="request timeout expired during step 'sleeper'") as err:
            client.infer("timed", [item], timeout=100_000)  # microseconds: 0.1 s, sooner than the step's 300 ms
        assert time.monotonic() - began < SLOW_S - 0.3 and err.value.status() == "StatusCode.UNAVAILABLE"
    finally:
        client.close()
