"""``execution.pipeline.PipelineRun`` with a fake BLS call: rows grouped per callee and
packed into calls of its max_batch_size, cases tried in order (a row takes the first that
holds), tensors scattered back by row index, fills, per-request errors, and a merged call
that fails retried per request."""

from __future__ import annotations

import asyncio

import numpy as np

from orchestrator.runtime.errors import DownstreamError
from orchestrator.runtime.execution.pipeline import PipelineRun, Req, plan_lists
from orchestrator.runtime.routing.pipeline import bind_pipeline, read_pipeline, with_batches
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

    async def __call__(self, model, inputs, params, request_id, alone, options, outputs):
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
    asyncio.run(PipelineRun(bound.steps, spec, fake, lambda: 0.0, None, fills, plans).run(reqs))
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
