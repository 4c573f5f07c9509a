"""The router adapter's cancellation and deadlines on the in-process mock
(docs/guides/reliability.md "Cancellation", "Deadlines"): a request cancelled after its first
stage gets exactly one CANCELLED response and no escalation while the other request of its
batch is escalated; the request's ``timeout()`` becomes its BLS calls' timeout and its
cascade answers from the first stage when the second cannot fit."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import yaml

from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.testing.mock import requests as mock_requests
from tests.helpers import REPO, add_router_variant, set_node_fields

# every text escalates: the second stage is always wanted
ACCURATE = "router_accurate"
UNCHECKED = "router_unchecked"  # the same with check_cancelled: false


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cancel") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__", "triton_env*", "env.pbtxt"))
    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    set_node_fields(document, {"cascade": {"margin": 1.0}})
    add_router_variant(repo, ACCURATE, document)
    add_router_variant(repo, UNCHECKED, dict(document, check_cancelled=False))
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "classifier_fast", ACCURATE, UNCHECKED):
            m.load(name)
        yield m


def request(texts, request_id):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    return {"inputs": {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), 0.5, np.float32)}, "request_id": request_id}


def counter(mock, family, **labels):
    return mock.metric(family, {"router": ACCURATE, **labels}) or 0.0


def settled(mock, family, want, **labels):
    """The counter once the router's 0.5 s metric flush reached ``want`` (or 3 s passed),
    then one more flush, so a double count would show."""
    deadline = time.monotonic() + 3.0
    while counter(mock, family, **labels) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.6)
    return counter(mock, family, **labels)


def test_a_cancelled_request_gets_one_cancelled_response_and_no_escalation(mock, monkeypatch):
    asked = []

    def is_cancelled(self):  # the client of request "gone" cancelled it once it was sent
        asked.append(self.request_id())
        return self.request_id() == "gone"

    monkeypatch.setattr(mock_requests.InferenceRequest, "is_cancelled", is_cancelled)
    sent = []
    real_init = mock_requests.InferenceRequest.__init__

    def recording_init(self, *args, **kwargs):  # the router's BLS requests: model and rows
        real_init(self, *args, **kwargs)
        ids = [t for t in kwargs.get("inputs", []) if t.name() == "input_ids"]
        if ids:
            sent.append((kwargs.get("model_name"), ids[0].as_numpy().shape[0], kwargs.get("request_id")))

    monkeypatch.setattr(mock_requests.InferenceRequest, "__init__", recording_init)
    before = counter(mock, "orchestrator_cancelled_requests_total")
    gone, kept = mock.infer_batch(ACCURATE, [request(["A fine film.", "Dull."], "gone"), request(["Good.", "Bad.", "Fine."], "kept")])
    assert isinstance(gone, InferError) and gone.code == "CANCELLED"
    assert gone.message == "router: the request was cancelled; no further stage ran for it"
    assert not isinstance(kept, InferError)
    assert [r.decode() for r in kept["ROUTE"].reshape(-1)] == ["classifier"] * 3
    assert sent == [("classifier_fast", 5, "gone,kept"), ("classifier", 3, "kept")]
    assert sorted(asked) == ["gone", "kept"]  # once each, before the second stage only
    assert settled(mock, "orchestrator_cancelled_requests_total", before + 1) == before + 1


def test_a_policy_that_never_asks_escalates_a_cancelled_request(mock, monkeypatch):
    asked = []

    def is_cancelled(self):
        asked.append(self.request_id())
        return True

    monkeypatch.setattr(mock_requests.InferenceRequest, "is_cancelled", is_cancelled)
    [out] = mock.infer_batch(UNCHECKED, [request(["A fine film.", "Dull."], "gone")])
    assert asked == [] and not isinstance(out, InferError)
    assert [r.decode() for r in out["ROUTE"].reshape(-1)] == ["classifier"] * 2


def test_the_request_timeout_is_the_budget_of_its_calls(mock, monkeypatch):
    monkeypatch.setattr(mock_requests.InferenceRequest, "timeout", lambda self: 30_000_000)  # 30 s
    timeouts = []
    real_init = mock_requests.InferenceRequest.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        if kwargs.get("model_name", "").startswith("classifier"):
            timeouts.append(kwargs.get("timeout", 0))

    monkeypatch.setattr(mock_requests.InferenceRequest, "__init__", recording_init)
    out = mock.infer_batch(ACCURATE, [request(["A fine film."], "t")])[0]
    assert [r.decode() for r in out["ROUTE"].reshape(-1)] == ["classifier"]
    assert len(timeouts) == 2 and all(25_000_000 < t <= 30_000_000 for t in timeouts) and timeouts[0] >= timeouts[1]


def test_a_budget_too_short_for_the_second_stage_answers_from_the_first(mock, monkeypatch):
    monkeypatch.setattr(mock_requests.InferenceRequest, "timeout", lambda self: 30_000_000)  # 30 s
    router = mock.loaded(ACCURATE).instance
    monkeypatch.setitem(router.engine.costs, "accurate_or_fast", 3600.0)  # the second stage "takes an hour"
    before = counter(mock, "orchestrator_deadline_texts_total", node="cascade")
    out = mock.infer(ACCURATE, request(["A fine film.", "Dull."], "short")["inputs"])
    assert [r.decode() for r in out["ROUTE"].reshape(-1)] == ["classifier_fast:deadline"] * 2
    assert settled(mock, "orchestrator_deadline_texts_total", before + 2, node="cascade") == before + 2


def test_a_request_answered_after_its_timeout_gets_unavailable(mock, monkeypatch):
    monkeypatch.setattr(mock_requests.InferenceRequest, "timeout", lambda self: 1)  # 1 us: over before the first answer
    before = counter(mock, "orchestrator_expired_requests_total")
    with pytest.raises(InferError) as err:
        mock.infer(ACCURATE, request(["A fine film."], "late")["inputs"])
    assert err.value.code == "UNAVAILABLE"
    assert err.value.message == "router: deadline exceeded: no stage answered within the request's timeout"
    assert settled(mock, "orchestrator_expired_requests_total", before + 1) == before + 1
