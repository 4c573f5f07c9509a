"""The router's error model on the mock (runtime/errors.py): one Triton code per failure
kind (UNAVAILABLE for a model that cannot serve, INTERNAL for a model that failed), the
per-request retries of a failed batch never calling a model that cannot serve again, and
the ``orchestrator_circuit_state`` gauge's values. Each router gets a fresh mock: the
circuits a test opens stay open."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import yaml

from orchestrator.testing.mock import InferenceRequest, InferError, MockTriton
from tests.helpers import REPO, STRICT_VARIANT, add_router_variant, without_fallbacks

TEXTS = ["A gorgeous, witty film.", "Not worth the ticket.", "plain"]
DEAD = "Stub process 'classifier_0_0' is not healthy."
SHADOW_VARIANT = "router_shadow"


@pytest.fixture
def mock(tmp_path):
    repo = tmp_path / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    document["root"] = without_fallbacks(document["root"])
    document.setdefault("circuit_breaker", {})["watch_stubs"] = False
    document["circuit_breaker"]["reload_unhealthy"] = False
    add_router_variant(repo, STRICT_VARIANT, document)
    shadow = {**document, "root": {"kind": "shadow", "name": "sh", "primary": {"kind": "model", "model": "classifier_fast"},
                                   "candidate": {"kind": "model", "model": "classifier"}}}
    shadow.pop("request_parameters", None)
    add_router_variant(repo, SHADOW_VARIANT, shadow)
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "classifier_fast", STRICT_VARIANT, SHADOW_VARIANT):
            m.load(name)
        yield m


def inputs(texts):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    return {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), 0.5, np.float32)}


def request(route, rid):
    return {"inputs": inputs(TEXTS), "parameters": {"route": route}, "request_id": rid}


@pytest.fixture
def bls_calls(monkeypatch):
    """The model names of every BLS request the router builds."""
    seen = []
    original = InferenceRequest.__init__

    def record(self, *args, **kwargs):
        seen.append(kwargs.get("model_name"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(InferenceRequest, "__init__", record)
    return seen


def gauge(mock, model, want=None, router=STRICT_VARIANT):
    """The model's ``orchestrator_circuit_state`` once the router's 0.5 s metric flush has
    reached ``want`` (or 3 s passed); at once when ``want`` is None."""
    deadline = time.monotonic() + (0.0 if want is None else 3.0)
    while True:
        value = mock.metric("orchestrator_circuit_state", {"router": router, "model": model})
        if value == want or time.monotonic() >= deadline:
            return value
        time.sleep(0.05)


def test_a_failing_model_is_internal_and_its_circuit_stays_closed(mock):
    mock.fail_next("classifier", "injected")
    with pytest.raises(InferError) as err:
        mock.infer(STRICT_VARIANT, inputs(TEXTS), parameters={"route": "accurate"})
    assert err.value.code == "INTERNAL"
    assert err.value.message == "router: model 'classifier' failed: injected"
    time.sleep(0.6)  # a flush
    assert gauge(mock, "classifier") == 0  # one failure of 3 (consecutive_failures)


def test_an_unloaded_model_is_unavailable_and_not_called_by_the_retries(mock, bls_calls):
    """The batch fails; each request is retried alone: the one that does not need the
    unloaded model is answered, the other gets UNAVAILABLE from the open circuit with no
    second call."""
    assert gauge(mock, "classifier", 0) == 0 and gauge(mock, "classifier_fast", 0) == 0
    mock.unload("classifier")
    first, second = mock.infer_batch(STRICT_VARIANT, [request("fast", "a"), request("accurate", "b")])
    assert not isinstance(first, InferError)
    assert [r.decode() for r in first["ROUTE"].reshape(-1)] == ["classifier_fast"] * 3
    assert isinstance(second, InferError) and second.code == "UNAVAILABLE"
    assert second.message.startswith("router: model 'classifier' is unavailable (circuit open")
    assert "Model 'classifier' is not ready." in second.message  # the BLS error it failed with
    assert bls_calls.count("classifier") == 1  # the batch's call; the retry failed fast
    assert gauge(mock, "classifier", 1) == 1 and gauge(mock, "classifier_fast") == 0  # open: 1, closed: 0


def test_a_dead_stub_is_unavailable_at_once(mock, bls_calls):
    """python_backend's text for a dead stub (2.51 gives every BLS error the code
    INTERNAL, so the text decides): UNAVAILABLE on the first failure."""
    mock.fail_next("classifier", DEAD)
    with pytest.raises(InferError) as err:
        mock.infer(STRICT_VARIANT, inputs(TEXTS), parameters={"route": "accurate"})
    assert err.value.code == "UNAVAILABLE"
    assert err.value.message == f"router: model 'classifier' failed: {DEAD}"
    assert gauge(mock, "classifier", 1) == 1
    with pytest.raises(InferError) as again:  # the circuit is open: no call
        mock.infer(STRICT_VARIANT, inputs(TEXTS), parameters={"route": "accurate"})
    assert again.value.code == "UNAVAILABLE" and "circuit open" in again.value.message
    assert bls_calls.count("classifier") == 1



def test_a_code_the_stub_passes_on_is_read_by_name():
    """2.51 gives every BLS error the code INTERNAL (the mock too); a stub that passes the
    callee's code on would be read by the code's name."""
    from orchestrator.runtime.bls.downstream import _code_name
    from orchestrator.testing.mock import pb_utils

    def code(name):
        return _code_name(pb_utils, pb_utils.TritonError("x", getattr(pb_utils.TritonError, name)))

    assert [code(n) for n in ("UNAVAILABLE", "NOT_FOUND", "INTERNAL", "CANCELLED")] == ["UNAVAILABLE", "NOT_FOUND", "INTERNAL", None]
    assert _code_name(pb_utils, object()) is None  # a stub whose errors have no code()


def test_shadow_candidates_have_circuit_breakers_of_their_own(mock):
    """A failing candidate opens only its own circuit: the primary's breakers (the ones
    the ``orchestrator_circuit_state`` gauge shows) stay closed."""
    def errors():  # the candidate's failures, counted by the shadow worker
        series = mock.metrics().get("orchestrator_shadow_errors_total", {})
        return sum(v for labels, v in series.items() if ("router", SHADOW_VARIANT) in labels)

    mock.set_failure("classifier", "injected")
    try:
        for k in range(5):  # consecutive_failures is 3
            out = mock.infer(SHADOW_VARIANT, inputs(TEXTS[:1]), request_id=f"s{k}")
            assert [r.decode() for r in out["ROUTE"].reshape(-1)] == ["classifier_fast"]
            deadline = time.monotonic() + 3.0  # the candidate runs in the background: one at a time
            while errors() < k + 1 and time.monotonic() < deadline:
                time.sleep(0.02)
        assert errors() == 5.0
    finally:
        mock.clear_faults()
    time.sleep(0.6)  # a metric flush
    assert gauge(mock, "classifier", router=SHADOW_VARIANT) == 0 and gauge(mock, "classifier_fast", router=SHADOW_VARIANT) == 0
