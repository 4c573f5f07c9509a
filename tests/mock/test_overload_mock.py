"""The router's recommended queue policy (``repository.QUEUE_POLICY``, on a copy of the
shipped router: the shipped config has none, docs/guides/reliability.md "Overload") in the
in-process mock: the policy's keys parse through Triton's model_config definitions, a request
that finds the queue full is refused at once with a retryable UNAVAILABLE while the queued
ones are answered, and the router marks each execute on its queue-delay estimate (what
admission control reads); a policy that still holds the removed overload mode is refused."""

from __future__ import annotations

import shutil
import threading
import time

import numpy as np
import pytest
import yaml

from orchestrator.runtime.serving.router import QueueDelay
from orchestrator.testing.mock import InferError, MockTriton
from orchestrator.testing.mock.execution import max_queue_size
from orchestrator.tooling.repository import add_queue_policy
from tests.helpers import QUEUE_VARIANT, REPO, add_router_variant

VARIANT = "router_overload_test"
QUEUED = QUEUE_VARIANT


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("overload") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    document = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    # the default route's cascade with margin 1: every text escalates, at any load
    cascade = document["root"]["steps"][1]["default"]["default"]["nodes"][0]
    assert cascade["kind"] == "cascade"
    cascade.update(margin=1.0)
    add_router_variant(repo, VARIANT, document)
    queued = add_router_variant(repo, QUEUED, yaml.safe_load((REPO / "router" / "policy.yaml").read_text()))
    add_queue_policy(queued / "config.pbtxt")
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "classifier_fast", "router", QUEUED, VARIANT):
            m.load(name)
        yield m


def inputs(texts, threshold=0.5):
    t = np.array([s.encode() for s in texts], dtype=np.object_).reshape(-1, 1)
    return {"TEXT": t, "THRESHOLD": np.full((len(texts), 1), threshold, np.float32)}


def test_the_recommended_queue_policy_parses_and_applies(mock):
    assert "default_queue_policy" not in (mock.loaded("router").config.get("dynamic_batching") or {})
    router = mock.loaded(QUEUED)
    batching = router.config["dynamic_batching"]
    assert int(batching["priority_levels"]) == 2
    assert int(batching["default_priority_level"]) == 2
    assert max_queue_size(router) == 16


def test_a_request_that_finds_the_queue_full_is_refused_at_once_and_the_queued_ones_are_answered(mock):
    router = mock.loaded(QUEUED)
    limit = max_queue_size(router)
    results = {}

    def send(i):
        try:
            results[i] = mock.infer(QUEUED, inputs([f"text number {i}, a fine film"]), request_id=f"r{i}")
        except InferError as exc:
            results[i] = exc

    router.lock.acquire()  # the instance is busy: requests queue
    try:
        threads = [threading.Thread(target=send, args=(i,)) for i in range(limit)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while router.queued < limit and time.monotonic() < deadline:
            time.sleep(0.01)
        assert router.queued == limit
        start = time.monotonic()
        send(limit)  # one more: the queue is full
        assert time.monotonic() - start < 1.0  # refused at once, not after a wait
        refused = results[limit]
        assert isinstance(refused, InferError)
        assert refused.code == "UNAVAILABLE"
        assert refused.message == f"[request id: r{limit}] Exceeds maximum queue size"
    finally:
        router.lock.release()
    for t in threads:
        t.join(30)
    assert router.queued == 0
    for i in range(limit):  # every queued request answered, none lost
        assert not isinstance(results[i], Exception), results[i]
        assert results[i]["PROBABILITIES"].shape == (1, 1)
        assert results[i]["ROUTE"][0, 0].decode() in {"classifier", "classifier_fast", "chunked:classifier"}


class StepClock:
    """A clock the test sets."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_the_router_marks_each_execute_and_its_cascade_escalates_at_any_load(mock):
    router = mock.loaded(VARIANT).instance
    clock = StepClock()
    router.load = QueueDelay(clock)
    texts = ["A gorgeous, witty film.", "Not worth the ticket."]
    first = mock.infer(VARIANT, inputs(texts))
    assert [r.decode() for r in first["ROUTE"].reshape(-1)] == ["classifier", "classifier"]  # margin 1: all escalate
    # the next execute starts 1 ms after the previous one's end, 201 ms after its start
    router.load = QueueDelay(clock)
    clock.t = 10.0
    router.load.begin()
    clock.t = 10.2
    router.load.end()
    clock.t = 10.201
    loaded = mock.infer(VARIANT, inputs(texts))  # the oldest waited 201 ms: estimate 100.5 ms
    assert router.load.delay_ms() == pytest.approx(100.5)
    assert [r.decode() for r in loaded["ROUTE"].reshape(-1)] == ["classifier", "classifier"]  # no overload mode


def test_the_queue_timeout_is_the_recommended_default_or_a_shorter_client_timeout(mock):
    router = mock.loaded(QUEUED)
    policy = router.config["dynamic_batching"]["default_queue_policy"]
    assert policy["timeout_action"] == "REJECT" and policy["allow_timeout_override"] is True
    assert int(policy["default_timeout_microseconds"]) == 5_000_000
