"""A pipeline step's ``timeout_ms`` served (mock): a call past it is cut and its request
answered UNAVAILABLE naming the step, well before the model finishes; a fallback answers in
its place; the step's circuit counts the cut only with ``count_timeouts``."""

from __future__ import annotations

import time

import numpy as np
import pytest

from orchestrator.testing.mock import InferError, MockTriton
from tests.pipeline_repo import MODELS, TIMED_MS, make_pipeline_repository

SLOW_S = 1.2  # sleeper's sleep for a slow row: well past TIMED_MS


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = make_pipeline_repository(tmp_path_factory.mktemp("pipelines") / "model_repository")
    with MockTriton(repo, model_config_name=None) as m:
        for name in MODELS:
            m.load(name)
        yield m


def feat(sleep_s: float, rows: int = 1) -> dict:
    x = np.tile(np.array([[1.0, 2.0, 0.0, sleep_s]], dtype=np.float32), (rows, 1))
    return {"FEAT": x}


def timed(mock, model, inputs, **kwargs):
    """(the answer or the InferError, seconds it took)."""
    began = time.monotonic()
    try:
        return mock.infer(model, inputs, **kwargs), time.monotonic() - began
    except InferError as exc:
        return exc, time.monotonic() - began


def test_a_slow_call_is_cut_and_the_request_fails_naming_the_step(mock):
    got, took = timed(mock, "timed", feat(SLOW_S))
    assert isinstance(got, InferError) and got.code == "UNAVAILABLE", got
    assert f"step 'sleeper' timed out after {TIMED_MS} ms: model 'sleeper' did not answer in time" in got.message
    assert took < SLOW_S - 0.3, took
    # the circuit stays closed (count_timeouts false): a quick request is answered, once sleeper is free
    time.sleep(SLOW_S)  # the cut call still runs in the model (Triton does not stop an execute)
    got, _ = timed(mock, "timed", feat(0.0))
    assert not isinstance(got, InferError), got
    assert got["OUT"].tolist() == [[3.0, 4.0]]


def test_a_cut_call_is_answered_by_the_fallback(mock):
    got, took = timed(mock, "timed_fallback", feat(SLOW_S, rows=2))
    assert not isinstance(got, InferError), got
    assert got["OUT"].tolist() == [[2.0, 3.0], [2.0, 3.0]]  # second's answer: FEAT[:, :2] + 1
    assert took < SLOW_S - 0.3, took


def test_with_count_timeouts_a_cut_call_opens_the_circuit(mock):
    got, _ = timed(mock, "timed_counting", feat(SLOW_S))
    assert isinstance(got, InferError) and "timed out" in got.message, got
    got, took = timed(mock, "timed_counting", feat(0.0))
    assert isinstance(got, InferError) and got.code == "UNAVAILABLE" and "circuit" in got.message.lower(), got
    assert took < 0.5, took  # failed fast, not queued behind the sleeping model
