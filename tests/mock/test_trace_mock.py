"""Trace context through the router on the in-process mock: every BLS call the router makes
for a traced request carries that request's ``trace()``, so Triton spawns the call's trace
as a child of it (python_backend r24.10 ``RequestExecutor``); a call batching rows of
several requests is traced under one of them (``request.call_trace``). The mock records
each traced request as Triton's trace file names it (``TraceRecord``: id, parent_id)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from orchestrator.testing.mock import InferenceRequest, MockTriton, Tensor, TraceRecord
from tests.helpers import REPO

MODELS = ("tokenizer", "classifier", "classifier_fast", "router")


def inputs(texts, threshold=0.5):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    return {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), threshold, np.float32)}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "model_repository"
    shutil.copytree(REPO, path, ignore=shutil.ignore_patterns("__pycache__"))
    return path


def children(mock, parent):
    return [t for t in mock.traces if t.parent_id == parent]


def test_every_bls_call_of_a_routed_request_is_a_child_of_its_trace(repo):
    with MockTriton(repo, models=MODELS, trace_rate=1) as mock:
        mock.infer("router", inputs(["A gorgeous, witty film."]), request_id="r1")
        mock.infer("router", inputs(["plain"]), request_id="r2")
        roots = [t for t in mock.traces if t.parent_id == 0]
        assert [(t.model, t.request_id) for t in roots] == [("router", "r1"), ("router", "r2")]
        for root in roots:
            calls = children(mock, root.id)
            assert calls and {c.model for c in calls} <= {"classifier_fast", "classifier", "tokenizer"}
            assert "classifier_fast" in {c.model for c in calls}  # the cascade's first stage
            assert {c.request_id for c in calls} == {root.request_id}
        # every trace is the router's or a child of a router's trace: none is lost or orphaned
        assert len(mock.traces) == len(roots) + sum(len(children(mock, r.id)) for r in roots)


def test_a_call_batching_two_requests_is_traced_under_the_first(repo):
    """triton mode: no trace has a context, so the first request's trace goes; the second
    request's trace gets no child (it says nothing wrong, it only shows the router)."""
    with MockTriton(repo, models=MODELS, trace_rate=1) as mock:
        mock.reset_calls()
        mock.infer_batch("router", [{"inputs": inputs(["great fun"]), "request_id": "a"},
                                    {"inputs": inputs(["dull and long"]), "request_id": "b"}])
        assert mock.calls_to("router") == [(1, 1)]  # one execute: the calls batch both
        first, second = [t for t in mock.traces if t.parent_id == 0]
        assert (first.request_id, second.request_id) == ("a", "b")
        calls = children(mock, first.id)
        assert calls and all(c.request_id == "a,b" for c in calls)
        assert children(mock, second.id) == []


def test_opentelemetry_mode_prefers_the_sampled_request_of_a_batch(repo):
    """rate=2: only the second request is sampled; its trace has a context (traceparent),
    so the batched calls carry it although the first request comes first."""
    with MockTriton(repo, models=MODELS, trace_rate=2, trace_mode="opentelemetry") as mock:
        mock.infer_batch("router", [{"inputs": inputs(["great fun"]), "request_id": "a"},
                                    {"inputs": inputs(["dull and long"]), "request_id": "b"}])
        [root] = [t for t in mock.traces if t.parent_id == 0]
        assert root.request_id == "b"
        assert children(mock, root.id) and len(mock.traces) == 1 + len(children(mock, root.id))


def test_without_tracing_no_call_is_traced(repo):
    with MockTriton(repo, models=MODELS) as mock:
        mock.infer("router", inputs(["A gorgeous, witty film."]))
        assert mock.traces == []


def test_the_mock_trace_mirrors_the_stubs(repo):
    """``InferenceTrace()`` (the stub's default) has no context and spawns nothing; a sampled
    request's trace has a traceparent in opentelemetry mode only, its children the same
    trace id and their own span id."""
    with MockTriton(repo, models=("classifier_fast",), trace_rate=1, trace_mode="opentelemetry") as mock:
        ids = np.array([[2, 310, 3]], np.int64)
        request = InferenceRequest(model_name="classifier_fast", inputs=[Tensor("input_ids", ids), Tensor("attention_mask", np.ones_like(ids))],
                                   requested_output_names=[])
        assert request.trace().get_context() is None
        assert not request.exec().has_error() and mock.traces == []
        parent = type(request.trace())._traced(7, 7, opentelemetry=True)
        traced = InferenceRequest(model_name="classifier_fast", inputs=[Tensor("input_ids", ids), Tensor("attention_mask", np.ones_like(ids))],
                                  requested_output_names=[], trace=parent, request_id="x")
        assert not traced.exec().has_error()
        [child] = mock.traces
        assert child == TraceRecord(child.id, 7, "classifier_fast", "x")
        assert json.loads(parent.get_context()) == {"traceparent": f"00-{7:032x}-{7:016x}-01"}
    with pytest.raises(ValueError, match="trace_mode must be"):
        MockTriton(repo, trace_mode="jaeger")
