"""Cancellation and deadlines in the policy engine (docs/guides/reliability.md "Cancellation",
"Deadlines"), driven by the fake BLS function on a fake clock: a downstream call advances
the clock by its model's cost instead of sleeping, so every boundary is exact (the costs
are powers of two: no rounding in the budgets)."""

from __future__ import annotations

import asyncio
from typing import Dict, List, Optional

import numpy as np
import pytest

from orchestrator.runtime.errors import DeadlineExceeded, DownstreamError, RequestCancelled
from orchestrator.runtime.execution.engine import COST_WEIGHT, Engine
from orchestrator.runtime.request import RequestContext, Result, Work
from orchestrator.runtime.routing.nodes.base import Item
from orchestrator.runtime.routing.policy import parse_policy
from tests.helpers import FakeBLS, expected_logit, ids_of, sig


class Clock:
    """A fake monotonic clock, seconds."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class TimedBLS(FakeBLS):
    """FakeBLS whose calls take ``cost[model]`` seconds of the fake clock each."""

    def __init__(self, clock: Clock, cost: Optional[Dict[str, float]] = None, fail=()):
        super().__init__(fail=fail)
        self.clock, self.cost = clock, cost or {}

    async def __call__(self, model, inputs, parameters, request_id, alone, options=None):
        self.clock.t += self.cost.get(model, 0.0)
        return await super().__call__(model, inputs, parameters, request_id, alone, options)


class Counts:
    """The engine's metrics sink: counter totals by (family, labels)."""

    def __init__(self):
        self.values: Dict[tuple, float] = {}

    def inc(self, family, value=1.0, **labels):
        key = (family, tuple(sorted(labels.items())))
        self.values[key] = self.values.get(key, 0.0) + value

    def observe(self, family, value, **labels):
        pass

    def record(self, counts, observations, gauges):
        for (family, labels), value in counts.items():
            self.inc(family, value, **dict(labels))

    def get(self, family, **labels) -> float:
        return self.values.get((family, tuple(sorted(labels.items()))), 0.0)


def model(name):
    return {"kind": "model", "name": name, "model": name}


def cascade(*names, margin=1.0):
    """A cascade over models ``names``; margin 1: every text escalates."""
    return {"version": 1, "root": {"kind": "cascade", "name": "cascade", "margin": margin, "stages": [model(n) for n in names]}}


def work(texts: List[str], request_id: str, **context) -> Work:
    return Work(list(texts), np.full(len(texts), 0.5, np.float32), {}, request_id, context=RequestContext(**context))


def deadlines_of(engine):
    """The deadlines a run of ``engine`` uses (its clock, its cost estimates)."""
    return engine.start(engine.infer, engine.models, engine.metrics).deadlines


def engine_for(doc, fake, clock) -> tuple:
    counts = Counts()
    return Engine(parse_policy(doc), fake, metrics=counts, clock=clock), counts


def probability(model_name: str, text: str) -> float:
    return sig(expected_logit(model_name, ids_of(text)))


# ----------------------------------------------------------------------------- cancellation


class Cancel:
    """A request's ``is_cancelled``: True once the fake BLS has made a call; records how
    many calls had been made each time it was asked."""

    def __init__(self, fake: FakeBLS, cancel: bool = True):
        self.fake, self.cancel, self.asked_after = fake, cancel, []

    def __call__(self) -> bool:
        self.asked_after.append(len(self.fake.calls))
        return self.cancel and bool(self.fake.calls)


def test_a_cancelled_request_gets_no_escalation_and_the_other_request_of_the_batch_does():
    clock = Clock()
    fake = TimedBLS(clock)
    engine, counts = engine_for(cascade("fast", "accurate"), fake, clock)
    cancel_a, ask_b = Cancel(fake), Cancel(fake, cancel=False)
    a = work(["good film", "bad plot"], "a", is_cancelled=cancel_a)
    b = work(["good bad", "plain words"], "b", is_cancelled=ask_b)
    got_a, got_b = asyncio.run(engine.run([a, b]))
    assert isinstance(got_a, RequestCancelled) and got_a.code == "CANCELLED"
    assert isinstance(got_b, Result) and got_b.routes == ["accurate", "accurate"]
    np.testing.assert_allclose(got_b.probabilities.reshape(-1), [probability("accurate", t) for t in b.texts], rtol=1e-6)
    # tokenizer and fast for both requests, then accurate for b's two texts only
    assert [(c["model"], c["rows"], c["request_id"]) for c in fake.calls] == [
        ("tokenizer", 4, "a,b"), ("fast", 4, "a,b"), ("accurate", 2, "b")]
    # asked once per request before the one later stage, never before the first call
    assert cancel_a.asked_after == [2] and ask_b.asked_after == [2]
    assert counts.get("orchestrator_cancelled_requests_total") == 1.0
    assert counts.get("orchestrator_escalations_total", node="cascade") == 2.0


def test_is_cancelled_is_asked_once_per_later_stage_and_not_again_once_true():
    clock = Clock()
    fake = TimedBLS(clock)
    engine, counts = engine_for(cascade("fast", "accurate", "third"), fake, clock)
    keep = Cancel(fake, cancel=False)
    [result] = asyncio.run(engine.run([work(["good bad"], "k", is_cancelled=keep)]))
    assert result.routes == ["third"] and keep.asked_after == [2, 3]  # before stage 2, before stage 3
    fake.calls.clear()
    stop = Cancel(fake)
    [result] = asyncio.run(engine.run([work(["good bad"], "s", is_cancelled=stop)]))
    assert isinstance(result, RequestCancelled) and stop.asked_after == [2]  # stage 3 not even considered
    assert fake.models_called() == ["tokenizer", "fast"]
    assert counts.get("orchestrator_cancelled_requests_total") == 1.0


def test_live_does_not_ask_a_request_that_had_no_downstream_call_yet():
    engine, _ = engine_for(cascade("fast", "accurate"), TimedBLS(Clock()), Clock())
    asked = []
    ctx = RequestContext(is_cancelled=lambda: asked.append(1) or True)
    item = Item(0, 0, "x", np.full(1, 0.5), {}, "", {}, ctx)
    assert deadlines_of(engine).live([item]) == [item] and asked == []
    ctx.started = True
    assert deadlines_of(engine).live([item, item]) == [] and asked == [1]  # one question for the request's two items
    assert deadlines_of(engine).live([item]) == [] and asked == [1]  # cancelled stays cancelled: not asked again


def test_a_request_known_to_be_cancelled_is_not_run_again():
    """The router's retry of a failed batch, one request at a time: a request found
    cancelled in the failed run is answered CANCELLED without a downstream call."""
    clock = Clock()
    fake = TimedBLS(clock)
    engine, counts = engine_for(cascade("fast", "accurate"), fake, clock)
    w = work(["good film"], "a")
    w.context.cancelled = True
    [result] = asyncio.run(engine.run([w]))
    assert isinstance(result, RequestCancelled) and fake.calls == []
    assert counts.get("orchestrator_cancelled_requests_total") == 1.0


# ----------------------------------------------------------------------------- deadlines


def test_each_call_carries_the_time_left_of_its_request_as_its_timeout():
    clock = Clock(10.0)
    fake = TimedBLS(clock, {"tokenizer": 0.125, "fast": 0.0625})
    engine, _ = engine_for({"version": 1, "root": model("fast")}, fake, clock)
    asyncio.run(engine.run([work(["good film"], "a", deadline=10.5)]))
    # the clock moves when a call is made: the tokenizer call left at 10.0, fast at 10.125
    assert [c["options"].timeout_us for c in fake.calls] == [500000, 375000]


def test_a_call_for_several_requests_gets_the_largest_budget_and_none_when_one_has_none():
    clock = Clock(0.0)
    fake = TimedBLS(clock)
    engine, _ = engine_for({"version": 1, "root": model("fast")}, fake, clock)
    asyncio.run(engine.run([work(["good"], "a", deadline=0.25), work(["bad"], "b", deadline=0.5)]))
    assert [c["options"].timeout_us for c in fake.calls] == [500000, 500000]
    fake.calls.clear()
    asyncio.run(engine.run([work(["good"], "a", deadline=0.25), work(["bad"], "b")]))
    assert [c["options"].timeout_us for c in fake.calls] == [0, 0]


@pytest.mark.parametrize("estimate,started", [(0.25, False), (0.125, True)])
def test_a_stage_whose_estimate_is_not_below_the_time_left_is_not_started(estimate, started):
    """After the first stage 0.25 s are left: an estimate of 0.25 s (ending exactly at the
    deadline) does not start the stage; 0.125 s does."""
    clock = Clock(0.0)
    fake = TimedBLS(clock, {"tokenizer": 0.125, "fast": 0.125})
    engine, counts = engine_for(cascade("fast", "accurate"), fake, clock)
    engine.costs["accurate"] = estimate
    [result] = asyncio.run(engine.run([work(["good bad", "plain"], "a", deadline=0.5)]))
    if started:
        assert fake.models_called() == ["tokenizer", "fast", "accurate"] and result.routes == ["accurate"] * 2
        assert counts.get("orchestrator_deadline_texts_total", node="cascade") == 0.0
    else:
        assert fake.models_called() == ["tokenizer", "fast"] and result.routes == ["fast:deadline"] * 2
        np.testing.assert_allclose(result.probabilities.reshape(-1), [probability("fast", t) for t in ("good bad", "plain")], rtol=1e-6)
        assert counts.get("orchestrator_deadline_texts_total", node="cascade") == 2.0
        assert counts.get("orchestrator_escalations_total", node="cascade") == 0.0


@pytest.mark.parametrize("cost,late", [(0.25, True), (0.125, False)])
def test_a_later_answer_at_or_after_the_deadline_never_reaches_the_response(cost, late):
    """Without an estimate the stage starts; an answer arriving exactly at the deadline
    is late: the first stage's answer stays, ROUTE ``fast:deadline``."""
    clock = Clock(0.0)
    fake = TimedBLS(clock, {"tokenizer": 0.125, "fast": 0.125, "accurate": cost})
    engine, counts = engine_for(cascade("fast", "accurate"), fake, clock)
    other = work(["good"], "other")  # no deadline: the same batch uses its late-for-a answer
    [result, kept] = asyncio.run(engine.run([work(["good bad"], "a", deadline=0.5), other]))
    assert fake.models_called() == ["tokenizer", "fast", "accurate"]
    assert kept.routes == ["accurate"]
    if late:
        assert result.routes == ["fast:deadline"]
        assert result.probabilities[0, 0] == pytest.approx(probability("fast", "good bad"), rel=1e-6)
        assert counts.get("orchestrator_deadline_texts_total", node="cascade") == 1.0
    else:
        assert result.routes == ["accurate"]
        assert result.probabilities[0, 0] == pytest.approx(probability("accurate", "good bad"), rel=1e-6)
    assert counts.get("orchestrator_expired_requests_total") == 0.0


def test_a_later_stage_that_fails_after_the_deadline_keeps_the_first_answer():
    """Triton's queue timeout ("Request timeout expired") of a late stage is a late answer."""
    clock = Clock(0.0)
    fake = TimedBLS(clock, {"fast": 0.125, "accurate": 0.5}, fail={"accurate"})
    engine, _ = engine_for(cascade("fast", "accurate"), fake, clock)
    [result] = asyncio.run(engine.run([work(["good bad"], "a", deadline=0.5)]))
    assert result.routes == ["fast:deadline"]
    # with time left the same failure is an error, as without a deadline
    clock.t, fake.cost["accurate"] = 0.0, 0.0
    with pytest.raises(DownstreamError):
        asyncio.run(engine.run([work(["good bad"], "a", deadline=0.5)]))


@pytest.mark.parametrize("doc", [cascade("fast", "accurate"), {"version": 1, "root": model("fast")}], ids=["cascade", "model"])
def test_a_request_whose_first_answer_came_after_its_deadline_gets_deadline_exceeded(doc):
    clock = Clock(0.0)
    fake = TimedBLS(clock, {"tokenizer": 0.125, "fast": 0.125})
    engine, counts = engine_for(doc, fake, clock)
    late, fine = work(["good bad"], "a", deadline=0.25), work(["good bad"], "b", deadline=0.375)
    got_late, got_fine = asyncio.run(engine.run([late, fine]))
    assert isinstance(got_late, DeadlineExceeded) and got_late.code == "UNAVAILABLE"
    assert isinstance(got_fine, Result)
    if "stages" in doc["root"]:  # a is not escalated (no time left), b is (0.125 s left, no estimate yet)
        assert got_fine.routes == ["accurate"]
        assert [(c["model"], c["request_id"]) for c in fake.calls][2:] == [("accurate", "b")]
    else:
        assert got_fine.routes == ["fast"]
    assert counts.get("orchestrator_expired_requests_total") == 1.0


def test_the_cost_estimate_is_an_exponentially_weighted_mean_of_the_engine_clock():
    clock = Clock(0.0)
    fake = TimedBLS(clock, {"fast": 0.25})
    engine, _ = engine_for({"version": 1, "root": model("fast")}, fake, clock)
    node = engine.policy.root
    assert deadlines_of(engine).estimate(node) == 0.0
    asyncio.run(engine.run([work(["good"], "a")]))
    assert deadlines_of(engine).estimate(node) == 0.25  # the first run, as it was
    fake.cost["fast"] = 0.5
    asyncio.run(engine.run([work(["good"], "a")]))
    assert deadlines_of(engine).estimate(node) == pytest.approx(0.25 + COST_WEIGHT * 0.25)


def test_remaining_affordable_and_late_boundaries():
    clock = Clock(1.0)
    engine, _ = engine_for(cascade("fast", "accurate"), TimedBLS(clock), clock)
    node = engine.policy.root
    engine.costs[node.name] = 0.5
    at = {d: Item(i, 0, "x", np.full(1, 0.5), {}, "", {}, RequestContext(deadline=d)) for i, d in enumerate([None, 1.5, 1.75, 1.0])}
    assert [deadlines_of(engine).remaining(it) for it in at.values()] == [None, 0.5, 0.75, 0.0]
    go, short = deadlines_of(engine).affordable(node, list(at.values()))
    assert [it.context.deadline for it in go] == [None, 1.75] and [it.context.deadline for it in short] == [1.5, 1.0]
    assert [it.context.deadline for it in deadlines_of(engine).late(list(at.values()))] == [1.0]  # now == deadline: late


def test_a_request_run_again_is_asked_first_and_not_run_when_cancelled():
    """The router's retry of a failed batch: the request had a downstream call, so the new
    run is its next stage and asks ``is_cancelled()`` once before any call."""
    clock = Clock()
    fake = TimedBLS(clock)
    engine, counts = engine_for(cascade("fast", "accurate"), fake, clock)
    asked = []
    w = work(["good film"], "a", is_cancelled=lambda: asked.append(1) or True)
    w.context.started = True
    [result] = asyncio.run(engine.run([w]))
    assert isinstance(result, RequestCancelled) and fake.calls == [] and asked == [1]
    assert counts.get("orchestrator_cancelled_requests_total") == 1.0


def test_a_request_whose_deadline_passed_before_the_run_is_not_run():
    clock = Clock(1.0)
    fake = TimedBLS(clock)
    engine, counts = engine_for(cascade("fast", "accurate"), fake, clock)
    gone, kept = asyncio.run(engine.run([work(["good film"], "a", deadline=1.0), work(["bad"], "b", deadline=1.5)]))
    assert isinstance(gone, DeadlineExceeded) and isinstance(kept, Result)
    assert [c["request_id"] for c in fake.calls] == ["b", "b", "b"]  # tokenizer, fast, accurate: b's only
    assert counts.get("orchestrator_expired_requests_total") == 1.0


# -- the chunk node's rounds (nodes/chunk.py classify_rounds): each round after the first is
# a later stage. Windows of 8 tokens at stride 6; text of 18 words: 3 disjoint windows.
# chunk_doc's stop_margin (never met by LONG) makes every round one window
# (nodes.chunk.next_windows), the structure these tests count; chunk_doc(margin=None) sends
# LONG's first two windows in one round (one window can never settle a mean of three).

def chunk_doc(margin=0.45):
    node = {"kind": "chunk", "name": "ch", "window": 8, "stride": 6, "stop_when_decided": True, "node": model("fast")}
    if margin is not None:
        node["stop_margin"] = margin
    return {"version": 1, "root": node}


LONG = " ".join(["x"] * 18)  # every window at logit 0.1: never decided before the last


def test_a_chunk_round_is_not_sent_for_a_cancelled_request_and_is_for_the_other():
    clock = Clock()
    fake = TimedBLS(clock)
    engine, counts = engine_for(chunk_doc(), fake, clock)
    cancel_a, ask_b = Cancel(fake), Cancel(fake, cancel=False)
    got_a, got_b = asyncio.run(engine.run([work([LONG], "a", is_cancelled=cancel_a), work([LONG], "b", is_cancelled=ask_b)]))
    assert isinstance(got_a, RequestCancelled) and isinstance(got_b, Result)
    assert got_b.routes == ["chunked:fast"]
    assert [(c["model"], c["rows"], c["request_id"]) for c in fake.calls] == [
        ("tokenizer", 2, "a,b"), ("fast", 2, "a,b"), ("fast", 1, "b"), ("fast", 1, "b")]
    assert cancel_a.asked_after == [2] and ask_b.asked_after == [2, 3]  # once per later round
    assert counts.get("orchestrator_cancelled_requests_total") == 1.0
    assert counts.get("orchestrator_chunks_skipped_total", node="ch", reason="cancelled") == 2.0


@pytest.mark.parametrize("deadline,rounds", [(0.625, 1), (0.75, 2)])
def test_a_chunk_round_whose_estimate_is_not_below_the_time_left_is_not_sent(deadline, rounds):
    """The tokenizer takes 0.125 s, each round 0.25 s (so the inner node's estimate is
    0.25 s after round 1). Deadline 0.625 s: 0.25 s left before round 2, not below the
    estimate: the text stops at one window (ROUTE says so, ``:deadline``). Deadline 0.75 s:
    round 2 is sent, then 0.125 s are left and round 3 is not."""
    clock = Clock()
    fake = TimedBLS(clock, {"tokenizer": 0.125, "fast": 0.25})
    engine, counts = engine_for(chunk_doc(), fake, clock)
    [result] = asyncio.run(engine.run([work([LONG], "a", deadline=deadline)]))
    assert [c["model"] for c in fake.calls] == ["tokenizer"] + ["fast"] * rounds
    assert result.routes == [f"chunked:fast:windows={rounds}/3:deadline"]
    assert result.probabilities[0, 0] == pytest.approx(probability("fast", " ".join(["x"] * 6)), rel=1e-6)
    assert counts.get("orchestrator_deadline_texts_total", node="ch") == 1.0
    assert counts.get("orchestrator_chunks_skipped_total", node="ch", reason="deadline") == 3.0 - rounds


def test_a_round_of_two_windows_counts_as_one_call_against_the_deadline():
    """stop_when_decided alone: round 1 sends LONG's first two windows in one call (0.25 s,
    answered at 0.375 s); with the deadline at 0.625 s the 0.25 s left are not below the
    estimate of another call, so the text stops at two windows of three."""
    clock = Clock()
    fake = TimedBLS(clock, {"tokenizer": 0.125, "fast": 0.25})
    engine, counts = engine_for(chunk_doc(margin=None), fake, clock)
    [result] = asyncio.run(engine.run([work([LONG], "a", deadline=0.625)]))
    assert [(c["model"], c["rows"]) for c in fake.calls] == [("tokenizer", 1), ("fast", 2)]
    assert result.routes == ["chunked:fast:windows=2/3:deadline"]
    assert result.probabilities[0, 0] == pytest.approx(probability("fast", " ".join(["x"] * 6)), rel=1e-6)
    assert counts.get("orchestrator_chunks_skipped_total", node="ch", reason="deadline") == 1.0


def test_a_chunk_round_answered_after_the_deadline_is_dropped():
    """Round 1 takes 0.125 s (the estimate), round 2 unexpectedly 0.5 s: it starts with
    0.25 s left and answers after the deadline, so the text keeps its first window's answer."""
    clock = Clock()

    class Slower(TimedBLS):
        async def __call__(self, model, inputs, parameters, request_id, alone, options=None):
            if model == "fast" and any(c["model"] == "fast" for c in self.calls):
                self.cost["fast"] = 0.5
            return await super().__call__(model, inputs, parameters, request_id, alone, options)

    fake = Slower(clock, {"tokenizer": 0.125, "fast": 0.125})
    engine, counts = engine_for(chunk_doc(), fake, clock)
    [result] = asyncio.run(engine.run([work([LONG], "a", deadline=0.5)]))
    assert [c["model"] for c in fake.calls] == ["tokenizer", "fast", "fast"]
    assert result.routes == ["chunked:fast:windows=1/3:deadline"]
    assert result.probabilities[0, 0] == pytest.approx(probability("fast", " ".join(["x"] * 6)), rel=1e-6)
    assert counts.get("orchestrator_expired_requests_total") == 0.0
