"""``execution.pipeline.PipelineRun`` with a fake BLS call: rows grouped per callee and
packed into calls of its max_batch_size, cases tried in order (a row takes the first that
holds), tensors scattered back by row index, fills, per-request errors, and a merged call
that fails retried per request."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.runtime.errors import DownstreamError, PolicyError, RequestCancelled
from orchestrator.runtime.execution.pipeline import PipelineRun, Req, plan_lists
from orchestrator.runtime.routing.pipeline import read_pipeline
from orchestrator.runtime.routing.pipeline_plan import bind_pipeline, switch_exports, with_batches
from orchestrator.runtime.routing.tensors import router_spec

CONFIG = {"name": "r", "max_batch_size": 16,
          "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
          "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}]}


def step(model):
    return {"kind": "step", "model": model, "inputs": {"IN": "X"}, "outputs": {"OUT": "Y"}}


SWITCH = {"outputs": ["Y"], "steps": [{
    "kind": "switch", "name": "sw", "scope": "row",
    "cases": [{"when": {"tensor": "X", "op": "gt", "value": 10}, "then": [step("big")]},
              {"when": {"tensor": "X", "op": "gt", "value": 5}, "then": [step("mid")]}],
    "fill": {"Y": -1}}]}


class Fake:
    """A BLS call: model ``m`` answers ``OUT = IN * factor[m]``; records (model, rows)."""

    FACTOR = {"big": 100, "mid": 10}

    def __init__(self, fail_once=()):
        self.calls, self.fail_once = [], set(fail_once)

    async def __call__(self, model, inputs, params, request_id, alone, options, outputs, several):
        self.calls.append((model, [int(v) for v in inputs["IN"].reshape(-1)]))
        if model in self.fail_once:
            self.fail_once.discard(model)
            raise DownstreamError(f"model '{model}' failed: once")
        if any(int(v) == 13 for v in inputs["IN"].reshape(-1)):
            raise DownstreamError(f"model '{model}' failed: unlucky row")
        return {"OUT": (inputs["IN"] * self.FACTOR[model]).astype(np.int32)}


def run(pipeline, requests, fake, batch=4):
    spec = router_spec(CONFIG)
    bound = with_batches(bind_pipeline(read_pipeline(pipeline), spec), {"big": batch, "mid": batch})
    plans, fills = plan_lists(bound.steps, spec)
    reqs = [Req({"X": np.array(r, dtype=np.int32).reshape(-1, 1)}, len(r)) for r in requests]
    asyncio.run(PipelineRun(bound.steps, spec, fake, lambda: 0.0, None, fills, plans, switch_exports(bound)).run(reqs))
    return reqs


def values(req):
    return req.tensors["Y"].reshape(-1).tolist()


def test_a_row_takes_the_first_case_that_holds_and_results_go_back_to_their_rows():
    fake = Fake()
    [a, b] = run(SWITCH, [[11, 6, 1, 12], [7, 20]], fake)
    assert values(a) == [1100, 60, -1, 1200] and values(b) == [70, 2000]
    assert a.tensors["Y"].dtype == np.int32 and a.tensors["Y"].shape == (4, 1)
    # one call per callee for the rows of both requests, rows in request then row order
    assert sorted(fake.calls) == [("big", [11, 12, 20]), ("mid", [6, 7])]


def test_calls_hold_at_most_the_callees_max_batch_size_keeping_requests_whole_where_they_fit():
    fake = Fake()
    run(SWITCH, [[11, 12], [13 + 1, 15, 16], [17]], fake, batch=4)
    assert [rows for m, rows in fake.calls if m == "big"] == [[11, 12], [14, 15, 16, 17]]


def test_a_failed_merged_call_is_retried_per_request_and_only_the_failing_request_fails():
    fake = Fake()
    ok, bad = run(SWITCH, [[11, 6], [13, 7]], fake)
    assert ok.error is None and values(ok) == [1100, 60]
    assert isinstance(bad.error, DownstreamError) and "step 'big'" in str(bad.error) and "unlucky row" in str(bad.error)


def test_a_transient_failure_of_a_merged_call_is_answered_by_the_retries():
    fake = Fake(fail_once={"mid"})
    a, b = run(SWITCH, [[6], [7]], fake)
    assert (a.error, b.error) == (None, None) and values(a) == [60] and values(b) == [70]


def test_a_request_past_its_deadline_or_cancelled_stops_before_the_next_step():
    from orchestrator.runtime.errors import DeadlineExceeded

    spec = router_spec(CONFIG)
    bound = with_batches(bind_pipeline(read_pipeline(SWITCH), spec), {"big": 4, "mid": 4})
    plans, fills = plan_lists(bound.steps, spec)
    late = Req({"X": np.array([[11]], dtype=np.int32)}, 1, deadline=5.0)
    cancelled = Req({"X": np.array([[12]], dtype=np.int32)}, 1, is_cancelled=lambda: True, started=True)
    fine = Req({"X": np.array([[13 - 2]], dtype=np.int32)}, 1, deadline=20.0)
    fake = Fake()
    asyncio.run(PipelineRun(bound.steps, spec, fake, lambda: 10.0, None, fills, plans, switch_exports(bound)).run([late, cancelled, fine]))
    assert isinstance(late.error, DeadlineExceeded) and "before step 'big'" in str(late.error)
    assert isinstance(cancelled.error, RequestCancelled)
    assert fine.error is None and values(fine) == [1100] and fake.calls == [("big", [11])]


def test_cancellation_is_asked_only_after_a_request_had_a_downstream_call():
    chain = {"outputs": ["Y"], "steps": [
        {"kind": "step", "name": "first", "model": "mid", "inputs": {"IN": "X"}, "outputs": {"OUT": "T"}},
        {"kind": "step", "name": "second", "model": "big", "inputs": {"IN": "T"}, "outputs": {"OUT": "Y"}}]}
    spec = router_spec(CONFIG)
    bound = with_batches(bind_pipeline(read_pipeline(chain), spec), {"big": 4, "mid": 4})
    plans, fills = plan_lists(bound.steps, spec)
    asked = []

    def is_cancelled():  # the client cancels while the first step runs
        asked.append(len(fake.calls))
        return len(fake.calls) > 0

    req = Req({"X": np.array([[2]], dtype=np.int32)}, 1, is_cancelled=is_cancelled)
    fake = Fake()
    asyncio.run(PipelineRun(bound.steps, spec, fake, lambda: 0.0, None, fills, plans, switch_exports(bound)).run([req]))
    assert asked == [1], "asked once: before the second step, never before the first (an IPC round trip per ask)"
    assert isinstance(req.error, RequestCancelled) and "before step 'second'" in str(req.error)
    assert fake.calls == [("mid", [2])]


def test_a_tensor_only_its_branch_reads_needs_no_fill_and_stays_inside():
    chain = {"outputs": ["Y"], "steps": [{
        "kind": "switch", "name": "sw", "scope": "row",
        "cases": [{"when": {"tensor": "X", "op": "gt", "value": 10},
                   "then": [{"kind": "step", "model": "mid", "inputs": {"IN": "X"}, "outputs": {"OUT": "T"}},
                            {"kind": "step", "model": "big", "inputs": {"IN": "T"}, "outputs": {"OUT": "Y"}}]}],
        "fill": {"Y": 0}}]}
    fake = Fake()
    [req] = run(chain, [[11, 1, 12]], fake)
    assert values(req) == [11000, 0, 12000] and "T" not in req.tensors
    assert fake.calls == [("mid", [11, 12]), ("big", [110, 120])]
    read_outside = dict(chain, steps=chain["steps"] + [{"kind": "step", "name": "later", "model": "mid", "inputs": {"IN": "T"}, "outputs": {"OUT": "Z"}}])
    with pytest.raises(PolicyError, match="'T' is not written when no case is taken"):
        bind_pipeline(read_pipeline(read_outside), router_spec(CONFIG))


class Odd(Fake):
    """``mid`` answers FP64; ``big`` one row too many for 20."""

    async def __call__(self, model, inputs, params, request_id, alone, options, outputs, several):
        out = await super().__call__(model, inputs, params, request_id, alone, options, outputs, several)
        if model == "mid":
            return {"OUT": out["OUT"].astype(np.float64)}
        return {"OUT": np.concatenate([out["OUT"], out["OUT"][:1]])} if 20 in inputs["IN"] else out


def test_branches_that_disagree_or_a_model_that_answers_other_rows_fail_that_request_only():
    a, b, c = run(SWITCH, [[11, 6], [20], [12]], Odd(), batch=1)  # one call per row
    assert "switch 'sw': its branches wrote 'Y' as float64[1] and int32[1]" in str(a.error)
    assert "step 'big': model 'big' answered OUT with shape [2, 1] for 1 rows" in str(b.error)
    assert c.error is None and values(c) == [1200]


def test_a_switch_inside_a_branch_sees_only_its_rows():
    nested = {"outputs": ["Y"], "steps": [{
        "kind": "switch", "name": "outer", "scope": "row",
        "cases": [{"when": {"tensor": "X", "op": "gt", "value": 5}, "then": [{
            "kind": "switch", "name": "inner", "scope": "row",
            "cases": [{"when": {"tensor": "X", "op": "gt", "value": 10}, "then": [step("big")]}],
            "default": [step("mid")]}]}],
        "fill": {"Y": 0}}]}
    fake = Fake()
    [req] = run(nested, [[1, 11, 6, 2, 20]], fake)
    assert values(req) == [0, 1100, 60, 0, 2000]
    assert sorted(fake.calls) == [("big", [11, 20]), ("mid", [6])]


def test_a_step_falls_back_to_the_next_model_for_the_requests_whose_call_failed():
    policy = {"outputs": ["Y"], "steps": [dict(step("big"), fallback=["mid"])]}
    fake = Fake(fail_once={"big"})
    [a] = run(policy, [[1, 2]], fake)
    assert a.error is None and values(a) == [10, 20]
    assert fake.calls == [("big", [1, 2]), ("mid", [1, 2])]
    fake = Fake()
    ok, bad = run(policy, [[1], [13]], fake)  # 13 fails in both models: its request fails, naming the last
    assert values(ok) == [100] and "step 'big' failed: model 'mid' failed: unlucky row" in str(bad.error)


def test_a_failed_call_of_several_requests_is_no_verdict_on_the_circuit_unless_the_model_cannot_serve():
    from orchestrator.runtime.bls.downstream import CircuitBreaker
    from orchestrator.runtime.bls.health import CircuitState
    from orchestrator.runtime.errors import Cause, UnavailableError
    from orchestrator.runtime.routing.settings import BreakerSettings

    async def fail(breaker, neutral, exc):
        with pytest.raises(type(exc)):
            async with breaker.guard("m", neutral=neutral):
                raise exc

    breaker = CircuitBreaker(BreakerSettings(consecutive_failures=1))
    asyncio.run(fail(breaker, True, DownstreamError("model 'm' failed: bad row")))
    assert breaker.state("m") is CircuitState.CLOSED  # the per-request retries decide
    asyncio.run(fail(breaker, True, UnavailableError("model 'm' is not ready", Cause.NOT_READY)))
    assert breaker.state("m") is CircuitState.OPEN
    other = CircuitBreaker(BreakerSettings(consecutive_failures=1))
    asyncio.run(fail(other, False, DownstreamError("model 'm' failed: bad row")))
    assert other.state("m") is CircuitState.OPEN
