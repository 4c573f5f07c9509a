"""The circuit breaker (runtime/bls/downstream.py) with a fake clock, alone and in front of the engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.runtime.bls.downstream import CircuitBreaker
from orchestrator.runtime.bls.health import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    STATE_VALUES,
    CircuitState,
    classify,
    stub_is_dead,
)
from orchestrator.runtime.errors import Cause, DownstreamError, UnavailableError
from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.request import Work
from orchestrator.runtime.routing.policy import parse_policy
from orchestrator.runtime.routing.settings import BreakerSettings
from tests.helpers import FakeBLS

DEAD = "model 'm' failed: Stub process 'm_0_0' is not healthy."


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def make(**kw):
    events, unhealthy = [], []
    clock = Clock()
    breaker = CircuitBreaker(
        BreakerSettings(**kw), on_change=lambda m, a, b, why: events.append((m, a, b)),
        on_unhealthy=unhealthy.append, clock=clock,
    )
    return breaker, clock, events, unhealthy


def test_error_texts_and_codes_are_classified():
    """Core r24.10 and python_backend r24.10 texts; a 2.51 BLS error's code is always
    INTERNAL, so only another code (from a stub that passes it on) decides alone."""
    assert stub_is_dead(DEAD) and classify(DEAD) is Cause.STUB_DEAD
    assert classify(DEAD, "INTERNAL") is Cause.STUB_DEAD
    assert classify("model 'c' failed: Request for unknown model: 'c' has no available versions") is Cause.NOT_READY
    assert classify("model 'c' failed: Request for unknown model: 'c' is not found") is Cause.NOT_READY
    assert classify("model 'c' failed: Model 'c' version 1 is not at ready state") is Cause.NOT_READY
    assert classify("model 'c' failed: Failed to process the request(s) for model 'c': ValueError: boom") is None
    assert classify("boom", "INTERNAL") is None and classify("boom", None) is None
    assert classify("try later", "UNAVAILABLE") is Cause.NOT_READY and classify("gone", "NOT_FOUND") is Cause.NOT_READY


async def guarded_call(breaker, model, make):
    """One call ``make()`` under ``breaker``, as ``Downstream`` makes its BLS calls."""
    async with breaker.guard(model):
        return await make()


def test_circuit_states_and_their_gauge_values():
    """The ``orchestrator_circuit_state`` values (docs: 0 closed, 1 open, 2 half-open) and the
    transition counter's labels."""
    assert [(s.value, s.gauge) for s in CircuitState] == [("closed", 0), ("open", 1), ("half_open", 2)]
    assert STATE_VALUES == {CLOSED: 0, OPEN: 1, HALF_OPEN: 2} and CLOSED == "closed"


def test_the_breaker_raises_unavailable_for_a_model_that_cannot_serve_and_internal_otherwise():
    b, _, _, _ = make(consecutive_failures=3)

    async def fails(message):
        raise DownstreamError(message)

    with pytest.raises(UnavailableError) as info:
        asyncio.run(guarded_call(b, "m", lambda: fails("model 'm' failed: Model 'm' version 1 is not at ready state")))
    assert info.value.cause is Cause.NOT_READY and info.value.code == "UNAVAILABLE" and b.state("m") == OPEN
    with pytest.raises(DownstreamError) as plain:
        asyncio.run(guarded_call(b, "n", lambda: fails("model 'n' failed: boom")))
    assert not isinstance(plain.value, UnavailableError) and plain.value.code == "INTERNAL" and b.state("n") == CLOSED
    dead, _, _, unhealthy = make(consecutive_failures=3)
    with pytest.raises(UnavailableError) as stub:
        asyncio.run(guarded_call(dead, "m", lambda: fails(DEAD)))
    assert stub.value.cause is Cause.STUB_DEAD and unhealthy == ["m"]


def test_a_fallback_whose_options_cannot_serve_is_unavailable():
    """All options unavailable: UNAVAILABLE; one of them failed otherwise: INTERNAL."""
    policy = parse_policy({"version": 1, "inline": {"postprocess": True},
                           "root": {"kind": "fallback", "nodes": [{"kind": "model", "model": "fast"},
                                                                  {"kind": "model", "model": "accurate"}]}})
    work = Work(["good film"], np.full(1, 0.5, np.float32), {})

    def engine(errors):
        async def infer(model, inputs, parameters, request_id, alone, options=None):
            if model not in errors:  # the tokenizer
                return await FakeBLS()(model, inputs, parameters, request_id, alone)
            raise errors[model]
        return Engine(policy, infer)

    down = UnavailableError("model 'fast' is unavailable", Cause.CIRCUIT_OPEN)
    with pytest.raises(UnavailableError) as info:
        asyncio.run(engine({"fast": down, "accurate": UnavailableError("x", Cause.NOT_READY)}).run([work]))
    assert info.value.cause is Cause.NOT_READY and info.value.code == "UNAVAILABLE"
    with pytest.raises(DownstreamError) as mixed:
        asyncio.run(engine({"fast": down, "accurate": DownstreamError("model 'accurate' failed")}).run([work]))
    assert type(mixed.value) is DownstreamError and mixed.value.code == "INTERNAL"


def test_consecutive_failures_open_then_probe_closes():
    b, clock, events, _ = make(consecutive_failures=3, open_s=5)
    for _ in range(2):
        b.before_call("m")
        b.on_failure("m", "boom")
    b.before_call("m")
    b.on_success("m")  # a success resets the count
    for _ in range(3):
        b.before_call("m")
        b.on_failure("m", "boom")
    assert b.state("m") == OPEN and events == [("m", CLOSED, OPEN)]
    with pytest.raises(DownstreamError, match=r"model 'm' is unavailable \(circuit open, next probe in 5.0 s; last error: boom\)") as info:
        b.before_call("m")
    assert isinstance(info.value, UnavailableError) and info.value.cause is Cause.CIRCUIT_OPEN
    assert info.value.code == "UNAVAILABLE"
    clock.t += 5
    assert b.state("m") == HALF_OPEN
    b.before_call("m")  # the single probe
    with pytest.raises(DownstreamError, match="a probe call is in flight"):
        b.before_call("m")
    b.on_success("m")
    assert b.state("m") == CLOSED and events[-2:] == [("m", OPEN, HALF_OPEN), ("m", HALF_OPEN, CLOSED)]


def test_a_failed_probe_opens_again():
    b, clock, events, _ = make(consecutive_failures=1, open_s=2)
    b.before_call("m")
    b.on_failure("m", "boom")
    clock.t += 2
    b.before_call("m")
    b.on_failure("m", "boom again")
    assert b.state("m") == OPEN
    with pytest.raises(DownstreamError, match="last error: boom again"):
        b.before_call("m")


def test_a_dead_stub_opens_at_once_and_asks_for_a_reload_once():
    b, clock, events, unhealthy = make(consecutive_failures=5)
    b.before_call("m")
    b.on_failure("m", DEAD)
    assert b.state("m") == OPEN and unhealthy == ["m"]
    b.half_open("m")  # the reload succeeded: the next call probes
    b.before_call("m")
    b.on_failure("m", DEAD)
    assert unhealthy == ["m", "m"] and b.state("m") == OPEN
    b.on_failure("m", DEAD)  # already open: no new reload request
    assert unhealthy == ["m", "m"]


def test_an_unloaded_model_probes_as_soon_as_it_is_ready():
    ready = {"m": False}
    clock = Clock()
    b = CircuitBreaker(BreakerSettings(open_s=60), ready_check=lambda m: ready[m], clock=clock)
    b.before_call("m")
    b.on_failure("m", "model 'm' failed: Request for unknown model: 'm' is not found")
    with pytest.raises(DownstreamError):
        b.before_call("m")
    ready["m"] = True
    with pytest.raises(DownstreamError):  # checked at most every 0.5 s
        b.before_call("m")
    clock.t += 0.5
    b.before_call("m")  # ready again: the probe goes through long before 60 s
    b.on_success("m")
    assert b.state("m") == CLOSED


def test_breaker_in_front_of_the_engine_fails_fast_into_the_fallback():
    """After the fast model's circuit opens, the fallback answers without calling it."""
    policy = parse_policy({"version": 1, "inline": {"postprocess": True}, "circuit_breaker": {"consecutive_failures": 2},
                           "root": {"kind": "fallback", "nodes": [{"kind": "model", "model": "fast"},
                                                                  {"kind": "model", "model": "accurate"}]}})
    fake = FakeBLS(fail={"fast"})
    breaker = CircuitBreaker(policy.breaker)

    async def guarded(model, inputs, parameters, request_id, alone, options=None):
        return await guarded_call(breaker, model, lambda: fake(model, inputs, parameters, request_id, alone))

    engine = Engine(policy, guarded)
    work = Work(["good film"], np.full(1, 0.5, np.float32), {})
    for _ in range(4):
        [result] = asyncio.run(engine.run([work]))
        assert result.routes == ["accurate"]
    assert fake.models_called().count("fast") == 2  # then the circuit is open
    assert breaker.state("fast") == OPEN and breaker.state("accurate") == CLOSED


def _cancelled_calls(breaker, model, count):
    async def hang():
        await asyncio.sleep(10)

    async def one():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(guarded_call(breaker, model, hang), 0.001)

    for _ in range(count):
        asyncio.run(one())


def test_a_node_timeout_is_not_its_models_failure_unless_the_policy_says_so():
    """Five calls cancelled by a node's timeout leave the model's circuit closed for the
    other nodes; with count_timeouts they open it after consecutive_failures."""
    breaker, _, events, _ = make(consecutive_failures=3)
    _cancelled_calls(breaker, "m", 5)
    assert breaker.state("m") == CLOSED and events == []
    breaker.before_call("m")  # another node's call goes through
    counting, _, events, _ = make(consecutive_failures=3, count_timeouts=True)
    _cancelled_calls(counting, "m", 3)
    assert counting.state("m") == OPEN and events == [("m", CLOSED, OPEN)]
    with pytest.raises(UnavailableError, match="last error: the call was cancelled"):
        counting.before_call("m")


def test_a_cancelled_probe_lets_the_next_call_probe():
    breaker, clock, _, _ = make(consecutive_failures=1, open_s=5.0)
    breaker.on_failure("m", "boom")
    clock.t += 6
    _cancelled_calls(breaker, "m", 1)  # the probe, cancelled: no verdict
    assert breaker.state("m") == HALF_OPEN
    breaker.before_call("m")  # the next call probes instead of failing fast
    breaker.on_success("m")
    assert breaker.state("m") == CLOSED


def test_count_timeouts_is_a_policy_key():
    policy = parse_policy({"version": 1, "circuit_breaker": {"count_timeouts": True},
                           "root": {"kind": "model", "model": "fast"}})
    assert policy.breaker.count_timeouts is True
    assert parse_policy({"version": 1, "root": {"kind": "model", "model": "fast"}}).breaker.count_timeouts is False
