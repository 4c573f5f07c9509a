"""python_backend's own examples (``ORCHESTRATOR_PYTHON_BACKEND_SRC``) on the embedded Triton
2.51 and on the mock: the same answers, errors, completed configurations and metric series
(tests/server/test_mock_agrees_decoupled.py covers examples/decoupled and bls_decoupled,
tests/server/test_mock_agrees_instance_kind.py examples/instance_kind)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.tooling.server import TritonServer
from tests.upstream_examples import needs_upstream, upstream_repository

pytestmark = [pytest.mark.server, needs_upstream]
NAMES = ["add_sub", "pytorch", "nobatch_auto_complete", "batch_auto_complete", "bls_sync", "bls_async", "custom_metrics"]
A = np.float32([1.5, 2, 3, 4])
B = np.float32([0.5, 1, 1, -1])


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    repo = upstream_repository(tmp_path_factory.mktemp("upstream") / "repo", names=set(NAMES))
    with TritonServer(repo, models=NAMES, model_config_name=None) as server:
        with MockTriton(repo, model_config_name=None, models=NAMES) as mock:
            client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
            yield server, client, mock
            client.close()


def _real(client, model, inputs):
    request = []
    for name, array in inputs.items():
        request.append(httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
        request[-1].set_data_from_numpy(array)
    try:
        result = client.infer(model, request)
    except InferenceServerException as exc:
        return {"error": exc.message().split("\n")[0]}
    return {o["name"]: result.as_numpy(o["name"]).tolist() for o in result.get_response()["outputs"]}


def _mock(mock, model, inputs):
    try:
        return {k: v.tolist() for k, v in mock.infer(model, inputs).items()}
    except InferError as exc:
        return {"error": exc.message.split("\n")[0]}


CASES = [
    ("add_sub", {"INPUT0": A, "INPUT1": B}),
    ("add_sub", {"INPUT0": A[:3], "INPUT1": B[:3]}),
    ("add_sub", {"INPUT0": A}),
    ("nobatch_auto_complete", {"INPUT0": A, "INPUT1": B}),
    ("batch_auto_complete", {"INPUT0": np.stack([A, B]), "INPUT1": np.stack([B, A])}),
    ("batch_auto_complete", {"INPUT0": A, "INPUT1": B}),
    ("bls_async", {"INPUT0": A, "INPUT1": B}),
    *[("bls_sync", {"INPUT0": A, "INPUT1": B, "MODEL_NAME": np.array([m], dtype=object)})
      for m in (b"add_sub", b"pytorch", b"nope")],
    ("custom_metrics", {"INPUT0": A, "INPUT1": B}),
]


@pytest.mark.parametrize("model,inputs", CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_answers_and_errors_agree(both, model, inputs):
    _, client, mock = both
    assert _mock(mock, model, inputs) == _real(client, model, inputs)


@pytest.mark.parametrize("model", ["nobatch_auto_complete", "batch_auto_complete", "add_sub", "bls_sync", "custom_metrics"])
def test_completed_configurations_agree(both, model):
    _, client, mock = both
    real, fake = client.get_model_config(model), mock.model_config(model)
    diff = {k: (fake.get(k), real.get(k)) for k in set(fake) | set(real) if fake.get(k) != real.get(k)}
    assert not diff, diff


def test_custom_metrics_series_agree(both):
    server, client, mock = both
    inputs = {"INPUT0": A, "INPUT1": B}
    _real(client, "custom_metrics", inputs)
    _mock(mock, "custom_metrics", inputs)
    labels = {"model": "custom_metrics", "version": "1"}
    real = [(name, dict(have)) for (name, have), v in server.metrics().items()
            if name == "requests_process_latency_ns" and v > 0]
    assert real == [("requests_process_latency_ns", labels)]
    assert mock.metric("requests_process_latency_ns", labels) > 0
    assert list(mock.metrics()["requests_process_latency_ns"]) == [frozenset(labels.items())]
