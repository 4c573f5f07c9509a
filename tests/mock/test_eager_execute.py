"""The router's execute with its first step outside the event loop (``serving.router.run_eagerly``)
against the same execute under ``loop.run_until_complete``: for one policy and the same
requests both give the same outputs, the same errors (code and text) and the same counters.
The inputs cover what the fast path must not change: errors, long (chunked) texts, empty
texts, request parameters, per-request thresholds, several requests per execute, request
timeouts, and policies whose runs wait (branches side by side, batches split into
concurrent calls), which go on in a task after the first step."""

from __future__ import annotations

import asyncio
import shutil

import pytest
import yaml

from orchestrator.runtime.serving import router as router_module
from orchestrator.testing.mock import MockTriton
from orchestrator.testing.mock import requests as mock_requests
from tests.helpers import LONG_TEXT as LONG
from tests.helpers import MIXED_TEXTS as TEXTS
from tests.helpers import REPO, add_router_variant, executes_answered
from tests.helpers import text_request as request

SINGLE = "eager_single"  # sequence: empty texts answered alone, every other text chunked to one classifier
SPLIT = "eager_split"  # the shipped policy with BLS calls of at most 2 rows: concurrent calls
TIMED = "eager_timed"  # a node with timeout_ms: never eager
ROUTERS = ("router", SINGLE, SPLIT)

SINGLE_ROOT = {
    "kind": "sequence", "name": "main", "steps": [
        {"kind": "switch", "name": "guard", "cases": [
            {"when": {"empty": True}, "then": {"kind": "constant", "name": "empty", "probability": 0.5, "verdict": False}},
        ]},
        {"kind": "chunk", "name": "chunk_accurate", "window": 128, "stride": 96, "aggregation": "length_weighted_mean",
         "node": {"kind": "model", "name": "accurate", "model": "classifier"}},
    ],
}

@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    repo = tmp_path_factory.mktemp("eager") / "model_repository"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns("__pycache__"))
    shipped = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    add_router_variant(repo, SINGLE, {**shipped, "root": SINGLE_ROOT})
    add_router_variant(repo, SPLIT, {**shipped, "bls_max_batch_size": 2})
    add_router_variant(repo, TIMED, {**shipped, "root": {**SINGLE_ROOT, "timeout_ms": 60000}})
    with MockTriton(repo) as m:
        for name in ("tokenizer", "classifier", "classifier_fast", *ROUTERS, TIMED):
            m.load(name)
        yield m


#: Executes (each a list of requests, one execute): every case above.
EXECUTES = [
    [request(TEXTS[:1])],
    [request([TEXTS[1]], 0.2)],
    [request([""])],
    [request([LONG])],
    [request(TEXTS, [0.1, 0.9, 0.5, 0.5, 0.3, 0.7])],
    [request(TEXTS[:2], parameters={"route": "fast"})],
    [request(TEXTS[:2], parameters={"route": "accurate"})],
    [request(TEXTS[:1], parameters={"describe_policy": True})],
    [request(TEXTS[:1], 1.5)],  # INVALID_ARG: a threshold over 1
    [request(TEXTS[:1], parameters={"route": "nowhere"})],  # INVALID_ARG: a route the policy does not offer
    [request(TEXTS[:1], parameters={"unknown": 1})],  # INVALID_ARG: not a parameter of the router
    [request(TEXTS[:2]), request([LONG, ""], 0.4), request(TEXTS[2:4], 0.6, {"route": "fast"})],
    [request(TEXTS[:1]), request(TEXTS[:1], float("nan")), request(TEXTS[1:3])],
    [request([t]) for t in TEXTS],
]


def answers(mock, model, eager, monkeypatch, executes=EXECUTES):
    instance = mock.instance(model)
    monkeypatch.setattr(instance, "eager", eager)
    return executes_answered(mock, model, executes)


@pytest.mark.parametrize("model", ROUTERS)
def test_eager_and_loop_answer_alike(mock, model, monkeypatch):
    eager = answers(mock, model, True, monkeypatch)
    loop = answers(mock, model, False, monkeypatch)
    assert eager == loop
    assert sum(1 for a in eager if isinstance(a, tuple)) >= 4  # the error cases answered as errors, by both
    assert any(isinstance(a, dict) and b"chunked" in a["ROUTE"][0][0][0] for a in eager)  # a long text went through windows


def test_eager_and_loop_count_alike(mock, monkeypatch):
    """The counters one pass adds, eager and not, are the same."""
    series = [("orchestrator_requests_total", "outcome", "success"), ("orchestrator_requests_total", "outcome", "error"),
              ("orchestrator_texts_total", "route", "classifier"), ("orchestrator_texts_total", "route", "empty"),
              ("orchestrator_chunked_texts_total", "node", "chunk_accurate")]

    def counts():
        mock.instance(SINGLE).metrics.flush()
        return {k: mock.metric(k[0], {"router": SINGLE, k[1]: k[2]}) or 0.0 for k in series}

    before = counts()
    answers(mock, SINGLE, True, monkeypatch)
    middle = counts()
    answers(mock, SINGLE, False, monkeypatch)
    after = counts()
    assert {k: middle[k] - before[k] for k in before} == {k: after[k] - middle[k] for k in before}
    assert middle[series[2]] > before[series[2]] and middle[series[4]] > before[series[4]]


def test_request_timeouts_alike(mock, monkeypatch):
    """A request timeout: the calls' timeout on both paths; over at once: UNAVAILABLE on both."""
    for budget in (30_000_000, 1):
        monkeypatch.setattr(mock_requests.InferenceRequest, "timeout", lambda self, b=budget: b)
        for model in (SINGLE, "router"):
            assert answers(mock, model, True, monkeypatch, EXECUTES[:5]) == answers(mock, model, False, monkeypatch, EXECUTES[:5])
    assert answers(mock, SINGLE, True, monkeypatch, EXECUTES[:1])[0][:2] == ("error", "UNAVAILABLE")


def test_a_policy_with_a_node_timeout_never_runs_eagerly(mock):
    assert mock.instance(SINGLE).eager and mock.instance("router").eager
    assert not mock.instance(TIMED).eager


def test_a_run_that_waits_goes_on_in_a_task(mock, monkeypatch):
    """Split into concurrent calls (async_exec), the run waits: its first step ran outside the
    loop, the rest in one task on the router's loop, in the same context."""
    tasks = []
    real = router_module.run_eagerly

    def spy(loop, coro):
        make = loop.create_task
        monkeypatch.setattr(loop, "create_task", lambda c, **kw: tasks.append(kw.get("context")) or make(c, **kw))
        try:
            return real(loop, coro)
        finally:
            monkeypatch.setattr(loop, "create_task", make)

    monkeypatch.setattr(router_module, "run_eagerly", spy)
    monkeypatch.setattr(mock.instance(SPLIT), "eager", True)
    mock.infer_batch(SPLIT, [request(TEXTS[:1])])
    assert tasks == []  # one text, one call: no task at all
    mock.infer_batch(SPLIT, [request(TEXTS[:3])])
    assert len(tasks) >= 2 and tasks[-1] is not None  # the calls side by side, then the rest: a task in the first step's context


def test_run_eagerly_without_a_wait_and_with_one():
    loop = asyncio.new_event_loop()
    try:
        async def plain():
            return asyncio.get_running_loop() is loop

        async def waits():
            await asyncio.sleep(0)
            fut = loop.create_future()
            loop.call_soon(fut.set_result, 7)
            return await fut, asyncio.current_task() is not None

        async def fails():
            await asyncio.sleep(0)
            raise ValueError("boom")

        assert router_module.run_eagerly(loop, plain()) is True
        assert router_module.run_eagerly(loop, waits()) == (7, True)
        with pytest.raises(ValueError, match="boom"):
            router_module.run_eagerly(loop, fails())
        assert asyncio.events._get_running_loop() is None  # marked running only during the first step
    finally:
        loop.close()


def test_a_node_timeout_always_runs_inside_a_task(mock, monkeypatch):
    """``asyncio.wait_for`` (a node's ``timeout_ms``) needs a current task on Python 3.12: the
    router whose policy has one runs every execute in a task."""
    seen = []
    real = asyncio.wait_for

    async def spy(fut, timeout):
        seen.append(asyncio.current_task() is not None)
        return await real(fut, timeout)

    monkeypatch.setattr(asyncio, "wait_for", spy)
    mock.infer_batch(TIMED, [request(TEXTS[:1]), request(TEXTS[1:3])])
    assert seen and all(seen)


def test_a_cancelled_task_cancels_the_coroutine_where_it_waits():
    """The rest of an eagerly stepped coroutine (``_Resume``) gets its task's cancellation at
    its own ``await``, as a coroutine run by the task itself would: here at a bare yield
    (``asyncio.sleep(0)``), where no future carries the cancellation."""
    loop = asyncio.new_event_loop()
    try:
        got = []

        async def waits():
            try:
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                got.append("resumed")
            except asyncio.CancelledError:
                got.append("cancelled")
                raise

        coro = waits()
        pending = coro.send(None)
        task = loop.create_task(router_module._finish(router_module._Resume(coro, pending)))
        loop.call_soon(task.cancel)  # after the task's first step
        with pytest.raises(asyncio.CancelledError):
            loop.run_until_complete(task)
        assert got == ["cancelled"]
    finally:
        loop.close()


def test_run_eagerly_inside_a_running_loop_is_refused_as_before():
    outer, loop = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        async def plain():
            return 1

        async def inside():
            coro = plain()
            with pytest.raises(RuntimeError):
                router_module.run_eagerly(loop, coro)
            coro.close()
            return asyncio.get_running_loop() is outer

        assert outer.run_until_complete(inside()) is True  # the outer loop still the running one
    finally:
        outer.close()
        loop.close()
