"""Admission control in the router (runtime/serving/admission.py, runtime/serving/router.py) on the
in-process mock: an execute beyond what fits in ``admission.max_wait_ms`` runs its first
requests and answers the others UNAVAILABLE at once, each request exactly one response,
the admitted ones answered as the shipped router answers them, and the refusals counted."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import yaml

from orchestrator.runtime.routing.settings import AdmissionSettings
from orchestrator.runtime.serving.admission import Admission
from orchestrator.runtime.serving.router import QueueDelay
from orchestrator.testing.mock import InferError, MockTriton
from tests.helpers import REPO, add_router_variant

VARIANT = "router_admission_test"
TEXTS = [f"review {i}: " + ("a gorgeous, witty film." if i % 2 else "not worth the ticket.") for i in range(8)]


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("admission") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    document["admission"] = {"max_wait_ms": 50}
    add_router_variant(repo, VARIANT, document)
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "classifier_fast", "router", VARIANT):
            m.load(name)
        yield m


def inputs(text):
    return {"TEXT": np.array([[text.encode()]], dtype=np.object_), "THRESHOLD": np.full((1, 1), 0.5, np.float32)}


def shed(mock):
    return mock.metric("orchestrator_shed_requests_total", {"router": VARIANT}) or 0.0


def test_an_execute_over_the_bound_runs_its_first_requests_and_refuses_the_rest_once_each(mock):
    router = mock.loaded(VARIANT).instance
    assert isinstance(router.admission, Admission)
    router.admission = Admission(AdmissionSettings(max_wait_ms=50))
    router.admission.ran(1, 0.020)  # 20 ms per request (one size seen): two fit in 50 ms
    router.load = QueueDelay()  # no queue delay: the router has been idle
    before = shed(mock)
    out = mock.infer_batch(VARIANT, [{"inputs": inputs(t), "request_id": f"r{i}"} for i, t in enumerate(TEXTS)])
    assert len(out) == len(TEXTS)
    expected = [mock.infer("router", inputs(t)) for t in TEXTS[:2]]
    for got, want in zip(out[:2], expected):  # the first two, in arrival order, answered as the shipped router
        assert not isinstance(got, InferError), got
        np.testing.assert_array_equal(got["PROBABILITIES"], want["PROBABILITIES"])
        assert got["ROUTE"][0, 0] == want["ROUTE"][0, 0]
    for got in out[2:]:
        assert isinstance(got, InferError)
        assert got.code == "UNAVAILABLE"
        assert got.message.startswith("router: overloaded: this request would wait past the router's "
                                      "admission.max_wait_ms (50 ms;")
        assert "an execute of 2 estimated at 40.0 ms" in got.message
    router.metrics.flush()
    assert shed(mock) - before == len(TEXTS) - 2
    assert router.admission.cost() != (0.0, 0.02)  # the admitted requests' execute was measured


def test_under_the_bound_every_request_runs(mock):
    router = mock.loaded(VARIANT).instance
    router.admission = Admission(AdmissionSettings(max_wait_ms=1000))
    router.admission.ran(1, 0.001)
    out = mock.infer_batch(VARIANT, [inputs(t) for t in TEXTS])
    assert not [o for o in out if isinstance(o, InferError)]


def test_the_shipped_router_has_no_admission_and_never_sheds(mock):
    router = mock.loaded("router").instance
    assert router.admission is None
    out = mock.infer_batch("router", [inputs(t) for t in TEXTS])
    assert not [o for o in out if isinstance(o, InferError)]
