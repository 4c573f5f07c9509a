"""Ensembles on the real Triton 2.51 and the mock agree (output order, unproduced outputs,
produced dtypes, ``max_batch_size: 0`` reshapes), and routers made by ``orchestrator
migrate`` answer byte-identically to their ensembles: dtype, shape, bytes, the same outputs
present, in the same order."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.testing.mock.ensemble import response_order
from orchestrator.tooling.server import TritonServer
from tests.mock.test_mock_ensemble import MANY_ORDER, write_repository

pytestmark = pytest.mark.server

CLIENTS = {"http": httpclient, "grpc": grpcclient}


def infer(server, protocol, model, inputs, outputs=None, parameters=None):
    """One request; ``[(name, array)]`` in the response's order."""
    tc = CLIENTS[protocol]
    client = tc.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    try:
        tensors = []
        for name, value in inputs.items():
            dtype = "BYTES" if value.dtype == np.object_ else {"bool": "BOOL"}.get(value.dtype.name,
                                                                                   value.dtype.name.upper())
            dtype = {"FLOAT32": "FP32", "FLOAT64": "FP64", "FLOAT16": "FP16"}.get(dtype, dtype)
            tensors.append(tc.InferInput(name, list(value.shape), dtype))
            tensors[-1].set_data_from_numpy(value)
        requested = [tc.InferRequestedOutput(n) for n in outputs] if outputs else None
        result = client.infer(model, tensors, outputs=requested, parameters=parameters)
        response = result.get_response()
        names = [o["name"] for o in response["outputs"]] if protocol == "http" else [o.name for o in response.outputs]
        return [(n, result.as_numpy(n)) for n in names]
    finally:
        client.close()


@pytest.fixture(scope="module")
def ensembles(tmp_path_factory):
    repo = write_repository(tmp_path_factory.mktemp("ensembles"))
    with TritonServer(repo, models=["fan", "many_out"]) as server:
        yield server, repo


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_answers_in_the_order_of_the_rule(ensembles, protocol):
    server, _ = ensembles
    x = {"X": np.array([1.0], np.float32)}
    assert [n for n, _ in infer(server, protocol, "many_out", x)] == response_order(MANY_ORDER)
    some = [MANY_ORDER[3], MANY_ORDER[0], MANY_ORDER[7]]
    assert [n for n, _ in infer(server, protocol, "many_out", x, some)] == [n for n in response_order(MANY_ORDER)
                                                                          if n in some]
    assert [n for n, _ in infer(server, protocol, "fan", {"X": np.ones(3, np.float32)})] == ["MID", "ALPHA", "ZETA"]


def test_the_mock_answers_as_triton(ensembles):
    server, repo = ensembles
    x = np.array([1.0, 2.0, 3.0], np.float32)
    cases = [({}, None), ({"as_f64": True}, None), ({"skip_b": True}, ["ZETA", "ALPHA"]), ({}, ["ZETA", "MID"])]
    with MockTriton(repo, strict_outputs=False) as mock:
        mock.load("fan")
        for parameters, outputs in cases:
            real = infer(server, "http", "fan", {"X": x}, outputs, parameters)
            mocked = mock.infer("fan", {"X": x}, outputs=outputs, parameters=parameters)
            assert [n for n, _ in real] == list(mocked), parameters
            for name, value in real:
                assert (value.dtype, value.shape, value.tobytes()) == (
                    mocked[name].dtype, mocked[name].shape, mocked[name].tobytes()), (parameters, name)
        with pytest.raises(InferenceServerException, match="expected 1 inputs but got 0 inputs") as real_error:
            infer(server, "http", "fan", {"X": x}, None, {"skip_b": True})
        with pytest.raises(InferError, match="expected 1 inputs but got 0 inputs"):
            mock.infer("fan", {"X": x}, parameters={"skip_b": True})
        assert "plus_one" in str(real_error.value)
