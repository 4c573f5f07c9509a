"""The same router cases against the in-process mock and the real server: they must agree.

This keeps the mock honest: the fast unit tests that use it are only as good as this
agreement. Outputs must match (probabilities within 1e-5, verdicts and routes equal); a
case that errors must error on both, with the same model-side message. The second part
runs the fixture models of tests/fixtures/mock/like_triton (the stub's API case by case:
request timeouts, versions, metric families, arguments, load errors, helper modules,
logs, the response sender, DLPack) on both.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from orchestrator.testing.mock import InferError, LoadError, MockTriton
from orchestrator.tooling.modeling import data
from orchestrator.tooling.server import TritonServer
from tests.mock.test_mock_like_triton import LIKE_TRITON, MODELS, probe_input, x_input

pytestmark = pytest.mark.server


def _cases():
    held = data.held_out_texts(n=24, seed=7)
    long_text = " ".join(data.held_out_texts(n=30, corpus="movie_reviews", seed=3))
    ok = [
        ("short texts", held[:8], 0.5),
        ("mixed with empty and long", [held[8], "", long_text, "   ", held[9]], 0.5),
        ("threshold 0 never escalates positives", held[10:16], 0.0),
        ("threshold 0.9", held[16:24], 0.9),
        ("only empty", ["", " "], 0.3),
    ]
    bad = [
        ("invalid UTF-8", [b"fine", b"\xff\xfe bad"], 0.5, "TEXT[1]: invalid UTF-8"),
        ("NaN threshold", ["x"], float("nan"), "THRESHOLD[0] = nan"),
        ("threshold above 1", ["x", "y"], 1.5, "THRESHOLD[0] = 1.5"),
    ]
    return ok, bad


OK_CASES, BAD_CASES = _cases()


def _arrays(texts, threshold):
    t = np.array([s.encode() if isinstance(s, str) else s for s in texts], dtype=np.object_).reshape(-1, 1)
    return {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), threshold, dtype=np.float32)}


def _server(triton, model, arrays):
    client = httpclient.InferenceServerClient(triton.http_url)
    try:
        inputs = []
        for name, arr in arrays.items():
            inputs.append(httpclient.InferInput(name, list(arr.shape), "BYTES" if arr.dtype == np.object_ else "FP32"))
            inputs[-1].set_data_from_numpy(arr)
        r = client.infer(model, inputs)
        return {n: r.as_numpy(n) for n in ("PROBABILITIES", "VERDICTS", "ROUTE")}
    finally:
        client.close()


@pytest.fixture(scope="module")
def mock(test_repository):
    with MockTriton(test_repository) as m:
        for name in ("tokenizer", "classifier", "classifier_fast", "postprocess", "router", "router_accurate", "router_bls", "router_strict"):
            m.load(name)
        yield m


@pytest.mark.parametrize("model", ["router", "router_accurate", "router_bls"])
@pytest.mark.parametrize("case,texts,threshold", OK_CASES, ids=[c[0] for c in OK_CASES])
def test_outputs_agree(triton, mock, model, case, texts, threshold):
    arrays = _arrays(texts, threshold)
    real = _server(triton, model, arrays)
    fake = mock.infer(model, arrays)
    np.testing.assert_allclose(fake["PROBABILITIES"], real["PROBABILITIES"], atol=1e-5)
    assert fake["VERDICTS"].tolist() == real["VERDICTS"].tolist()
    assert [r for r in fake["ROUTE"].reshape(-1)] == [r for r in real["ROUTE"].reshape(-1)]


@pytest.mark.parametrize("case,texts,threshold,needle", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_errors_agree(triton, mock, case, texts, threshold, needle):
    arrays = _arrays(texts, threshold)
    with pytest.raises(InferenceServerException) as real:
        _server(triton, "router", arrays)
    with pytest.raises(InferError) as fake:
        mock.infer("router", arrays)
    with pytest.raises(InferError) as fake_bls:
        mock.infer("router_bls", arrays)
    assert fake_bls.value.message == fake.value.message
    assert needle in str(real.value) and needle in fake.value.message
    assert fake.value.message in str(real.value)


@pytest.mark.parametrize("model", ["router", "router_bls"])
def test_batched_requests_agree_and_bls_calls_are_batched(triton, mock, model):
    """Several requests in one execute: one tokenizer call (none when inline), one call per
    classifier, no postprocess call (the router applies the heads itself)."""
    texts = data.held_out_texts(n=12, seed=11)
    requests = [_arrays(texts[i : i + 3], 0.5) for i in range(0, 12, 3)]
    mock.reset_calls()
    results = mock.infer_batch(model, requests)
    calls = {c.model: 0 for c in mock.calls}
    for c in mock.calls:
        calls[c.model] += 1
    bls = 1 if model == "router_bls" else 0
    assert calls[model] == 1 and calls["classifier_fast"] == 1 and calls.get("classifier", 0) <= 1
    assert calls.get("tokenizer", 0) == bls and calls.get("postprocess", 0) == 0
    for arrays, fake in zip(requests, results):
        real = _server(triton, model, arrays)
        np.testing.assert_allclose(fake["PROBABILITIES"], real["PROBABILITIES"], atol=1e-5)
        assert [r for r in fake["ROUTE"].reshape(-1)] == [r for r in real["ROUTE"].reshape(-1)]


def test_downstream_failure_is_isolated_in_the_mock(mock):
    """The mock's fault injection: a failing classifier fails only requests that reach it
    (router_strict, no fallbacks); the shipped router answers them from classifier."""
    empty_only = _arrays(["", " "], 0.5)
    needs_model = _arrays(["a fine film"], 0.5)
    healthy = mock.infer("router", {**needs_model}, parameters={"route": "accurate"})
    mock.set_failure("classifier_fast", "injected failure")
    try:
        strict = mock.infer_batch("router_strict", [empty_only, needs_model])
        shipped = mock.infer_batch("router", [empty_only, needs_model])
    finally:
        mock.clear_faults()
    assert [r.decode() for r in strict[0]["ROUTE"].reshape(-1)] == ["empty", "empty"]
    assert isinstance(strict[1], InferError) and "model 'classifier_fast' failed" in strict[1].message
    assert [r.decode() for r in shipped[1]["ROUTE"].reshape(-1)] == ["classifier"]
    np.testing.assert_allclose(shipped[1]["PROBABILITIES"], healthy["PROBABILITIES"], atol=1e-6)


# ----------------------------------------------------------------------------- the stub's API, case by case
# The fixture models of tests/fixtures/mock/like_triton on a server of their own (some of
# these uses of the stub are rough on Triton 2.51; a crash must not take the session's
# server down) and on the mock, from the same copy, so file paths in messages agree.

def _first_lines(node):
    """The probe's answer with exception texts cut to their first line (pybind11 lists
    the signature and the arguments after it, in its own words)."""
    if isinstance(node, dict):
        return {k: (v.splitlines()[0] if k == "message" and v else _first_lines(v)) for k, v in node.items()}
    return node


@pytest.fixture(scope="module")
def like_triton(tmp_path_factory):
    repo = tmp_path_factory.mktemp("like_triton") / "repo"
    shutil.copytree(LIKE_TRITON, repo)
    with TritonServer(repo, models=list(MODELS), model_config_name=None) as server:
        with MockTriton(repo, model_config_name=None, models=MODELS) as mock:
            client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
            yield server, client, mock
            client.close()


def _real_probe(client, case):
    inputs = [httpclient.InferInput("CASE", [1], "BYTES")]
    inputs[0].set_data_from_numpy(probe_input(case)["CASE"])
    return json.loads(client.infer("probe", inputs).as_numpy("OUT")[0])


def _mock_probe(mock, case):
    return json.loads(mock.infer("probe", probe_input(case))["OUT"][0])


def _real_x(client, model, version=""):
    inputs = [httpclient.InferInput("X", [1], "INT32")]
    inputs[0].set_data_from_numpy(x_input()["X"])
    try:
        result = client.infer(model, inputs, model_version=version)
    except InferenceServerException as exc:
        return {"error": exc.message()}
    return {name["name"]: result.as_numpy(name["name"]).tolist() for name in result.get_response()["outputs"]}


def _mock_x(mock, model, version=""):
    try:
        result = mock.infer(model, x_input(), model_version=version)
    except InferError as exc:
        return {"error": exc.message}
    return {name: array.tolist() for name, array in result.items()}


# One case per kind of difference the mock had. Not probed here, because they bring the
# real 2.51 server (or the probe's stub) down: Tensor.from_dlpack of a numpy array, a
# metric family name used again with another kind, pb_utils.load_model of a failing model.
PROBE_CASES = [
    "timeout:slow", "timeout:slow_plain", "timeout:slow_nodefault", "timeout:idle",
    "versions",
    "metrics:shared", "metrics:deleted",
    "arguments", "memory",
    "dlpack:of_tensor", "dlpack:transposed", "dlpack:column_slice", "dlpack:numpy_transposed",
]


@pytest.mark.parametrize("case", PROBE_CASES)
def test_the_stub_api_agrees(like_triton, case):
    _, client, mock = like_triton
    real, fake = _real_probe(client, case), _mock_probe(mock, case)
    if case.startswith("timeout:"):  # the sleep echoed back is a float32 of the time slept
        assert json_rounded(fake) == json_rounded(real)
    else:
        assert _first_lines(fake) == _first_lines(real)


def json_rounded(node):
    if isinstance(node, dict):
        return {k: json_rounded(v) for k, v in node.items()}
    if isinstance(node, list):
        return [json_rounded(v) for v in node]
    return round(node, 5) if isinstance(node, float) else node


def test_load_errors_agree(like_triton):
    """Through the repository API (pb_utils.load_model of a failing model is not probed:
    it brings the 2.51 server down more often than not)."""
    _, client, mock = like_triton
    with pytest.raises(InferenceServerException) as real:
        client.load_model("bad_init")
    with pytest.raises(LoadError) as fake:
        mock.load("bad_init")
    assert str(fake.value) == real.value.message()
    real_row = next(r for r in client.get_model_repository_index() if r["name"] == "bad_init")
    fake_row = next(r for r in mock.repository_index() if r["name"] == "bad_init")
    assert fake_row == real_row


def test_versions_agree_for_clients(like_triton):
    _, client, mock = like_triton
    for version in ("", "1", "2", "3"):
        assert _mock_x(mock, "versioned", version) == _real_x(client, "versioned", version)
        assert mock.is_model_ready("versioned", version) == client.is_model_ready("versioned", version)
    real_rows = [(r["version"], r["state"]) for r in client.get_model_repository_index() if r["name"] == "versioned"]
    assert [(r["version"], r["state"]) for r in mock.repository_index() if r["name"] == "versioned"] == real_rows


@pytest.mark.parametrize("model", ["helper_a", "helper_b", "late_sender", "send_then_raise"])
def test_models_answer_alike(like_triton, model):
    """Own helper modules per model; a response sent after execute returned, or before it
    raised, answers the request."""
    _, client, mock = like_triton
    assert _mock_x(mock, model) == _real_x(client, model)


def test_verbose_logs_are_dropped_by_both(like_triton):
    server, client, mock = like_triton
    assert _real_probe(client, "log") == _mock_probe(mock, "log")
    server_log = server.log_path.read_text()
    assert "probe log INFO line" in server_log and "probe log VERBOSE" not in server_log
    kept = [(r.level, r.message) for r in mock.logs if r.model == "probe"]
    assert ("INFO", "probe log INFO line") in kept and not any(level == "VERBOSE" for level, _ in kept)
