"""The same router cases against the in-process mock and the real server: they must agree.

This keeps the mock honest: the fast unit tests that use it are only as good as this
agreement. Outputs must match (probabilities within 1e-5, verdicts and routes equal); a
case that errors must error on both, with the same model-side message.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.tooling.modeling import data

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
