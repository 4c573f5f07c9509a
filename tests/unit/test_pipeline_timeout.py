"""A pipeline step's ``timeout_ms`` with a fake BLS call on the real clock: the call carries
the sooner of it and the request's deadline as its BLS timeout, is cut then (its requests
fail DeadlineExceeded naming the step, or go to the fallback), a cut merged call is not
retried per request, the circuit breaker counts the cut only with ``count_timeouts``, and
``cut_after`` needs no current task (Python 3.12's ``asyncio.wait_for`` does)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from orchestrator.runtime.errors import DeadlineExceeded, PolicyError
from orchestrator.runtime.execution.pipeline import PipelineRun, Req, cut_after, plan_lists
from orchestrator.runtime.routing.pipeline import read_pipeline
from orchestrator.runtime.routing.pipeline_plan import bind_pipeline, describe_pipeline, switch_exports, with_batches
from orchestrator.runtime.routing.tensors import router_spec

CONFIG = {"name": "r", "max_batch_size": 16,
          "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
          "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}]}


def pipeline(**extra):
    return {"outputs": ["Y"], "steps": [{"kind": "step", "model": "slow", "inputs": {"IN": "X"}, "outputs": {"OUT": "Y"},
                                         **extra}]}


class Fake:
    """Model ``slow`` answers after SLOW seconds, ``fast`` at once: ``OUT = IN + 1``; records
    (model, rows, alone, timeout_us)."""

    SLOW = 1.0

    def __init__(self):
        self.calls = []

    async def __call__(self, model, inputs, params, request_id, alone, options, outputs, several):
        self.calls.append((model, [int(v) for v in inputs["IN"].reshape(-1)], alone, options.timeout_us))
        if model == "slow":
            await asyncio.sleep(self.SLOW)
        return {"OUT": (inputs["IN"] + 1).astype(np.int32)}


def run(policy, reqs, fake):
    spec = router_spec(CONFIG)
    bound = with_batches(bind_pipeline(read_pipeline(policy), spec), {"slow": 4, "fast": 4})
    plans, fills = plan_lists(bound.steps, spec)
    began = time.monotonic()
    asyncio.run(PipelineRun(bound.steps, spec, fake, time.monotonic, None, fills, plans, switch_exports(bound)).run(reqs))
    return time.monotonic() - began


def req(*rows, timeout_s=None):
    return Req({"X": np.array(rows, dtype=np.int32).reshape(-1, 1)}, len(rows),
               deadline=None if timeout_s is None else time.monotonic() + timeout_s)


def test_a_call_past_the_steps_time_is_cut_and_its_request_fails_naming_the_step():
    fake = Fake()
    a = req(1)
    took = run(pipeline(timeout_ms=50), [a], fake)
    assert took < 0.5, took
    assert isinstance(a.error, DeadlineExceeded) and a.error.code == "UNAVAILABLE"
    assert str(a.error) == "step 'slow' timed out after 50 ms: model 'slow' did not answer in time"
    assert fake.calls == [("slow", [1], False, 50000)]  # async_exec, and the step's time as its BLS timeout


def test_the_requests_deadline_when_sooner_cuts_it_and_says_so():
    fake = Fake()
    a = req(1, timeout_s=0.05)
    took = run(pipeline(timeout_ms=5000), [a], fake)
    assert took < 0.5, took
    assert isinstance(a.error, DeadlineExceeded) and "request timeout expired during step 'slow'" in str(a.error)
    assert 0 < fake.calls[0][3] <= 50000


def test_a_call_in_time_answers_and_a_step_without_timeout_is_not_cut():
    fake = Fake()
    Fake.SLOW = 0.05
    try:
        a, b = req(1), req(2, timeout_s=30)
        run(pipeline(timeout_ms=2000), [a], fake)
        run(pipeline(), [b], fake)
    finally:
        Fake.SLOW = 1.0
    assert a.error is None and a.tensors["Y"].tolist() == [[2]]
    assert b.error is None and b.tensors["Y"].tolist() == [[3]]
    assert fake.calls[0][3] == 2000000 and fake.calls[1][2] is True and 29e6 < fake.calls[1][3] <= 30e6


def test_a_cut_call_goes_to_the_fallback_with_the_same_limit():
    fake = Fake()
    a = req(1)
    run(pipeline(timeout_ms=50, fallback=["fast"]), [a], fake)
    assert a.error is None and a.tensors["Y"].tolist() == [[2]]
    assert [(m, t) for m, _, _, t in fake.calls] == [("slow", 50000), ("fast", 50000)]


def test_a_cut_merged_call_is_not_retried_per_request():
    fake = Fake()
    a, b = req(1), req(2)
    took = run(pipeline(timeout_ms=50), [a, b], fake)
    assert took < 0.5 and len(fake.calls) == 1 and fake.calls[0][1] == [1, 2]
    assert all(isinstance(r.error, DeadlineExceeded) and "step 'slow' timed out" in str(r.error) for r in (a, b))


@pytest.mark.parametrize("count", [False, True])
def test_the_circuit_counts_a_cut_call_only_with_count_timeouts(count):
    from orchestrator.runtime.bls.downstream import CircuitBreaker
    from orchestrator.runtime.bls.health import CircuitState
    from orchestrator.runtime.routing.settings import BreakerSettings

    breaker = CircuitBreaker(BreakerSettings(consecutive_failures=1, count_timeouts=count))

    async def guarded(model, inputs, params, request_id, alone, options, outputs, several):
        async with breaker.guard(model, neutral=several):
            await asyncio.sleep(1.0)
        return {}

    a = req(1)
    run(pipeline(timeout_ms=30), [a], guarded)
    assert isinstance(a.error, DeadlineExceeded)
    assert breaker.state("slow") is (CircuitState.OPEN if count else CircuitState.CLOSED)


def test_cut_after_needs_no_current_task():
    async def slow():
        await asyncio.sleep(1.0)

    loop = asyncio.new_event_loop()
    try:
        coro = cut_after(slow(), 0.02)
        future = loop.create_future()  # drive ``coro`` by hand, as a caller that is no task
        done = []

        def step(_=None):
            try:
                yielded = coro.send(None)
            except StopIteration:
                done.append("returned")
                future.set_result(None)
                return
            except asyncio.TimeoutError:
                done.append("cut")
                future.set_result(None)
                return
            yielded.add_done_callback(step)

        loop.call_soon(step)
        began = time.monotonic()
        loop.run_until_complete(future)
        assert done == ["cut"] and time.monotonic() - began < 0.5
    finally:
        loop.close()


def test_timeout_ms_is_read_checked_and_described():
    p = read_pipeline(pipeline(timeout_ms=250))
    assert p.step_nodes()[0].timeout_ms == 250.0
    assert "step [slow] slow(X->IN) -> OUT->Y timeout=250ms" in describe_pipeline(p)
    for bad in (0, -1, "fast", True):
        with pytest.raises(PolicyError, match=r"pipeline.steps\[0\].timeout_ms"):
            read_pipeline(pipeline(timeout_ms=bad))


def test_policy_check_and_the_schema_take_timeout_ms(tmp_path, capsys):
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    from orchestrator.runtime.routing.policy_docs import json_schema
    from orchestrator.tooling.cli import main
    from tests.pipeline_repo import TIMED_MS, make_pipeline_repository

    repo = make_pipeline_repository(tmp_path / "repo")
    path = repo / "timed" / "policy.yaml"
    assert main(["policy", "check", str(path)]) == 0
    assert f"step [sleeper] sleeper(FEAT->FEAT) -> OUT->OUT timeout={TIMED_MS}ms" in capsys.readouterr().out
    document = yaml.safe_load(path.read_text())
    validator = jsonschema.Draft7Validator(json_schema())
    assert validator.is_valid(document)
    document["pipeline"]["steps"][0]["timeout_ms"] = 0
    assert not validator.is_valid(document)
    path.write_text(yaml.safe_dump(document))
    assert main(["policy", "check", str(path)]) == 1
    assert "pipeline.steps[0].timeout_ms" in capsys.readouterr().err
