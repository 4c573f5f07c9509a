"""Admission control's rule (runtime/serving/admission.py) and its policy key: which requests of an
execute run, the cost estimate it is based on, and the refusal text."""

from __future__ import annotations

import math

import pytest
import yaml

from orchestrator.runtime import errors
from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.policy import describe, parse_policy
from orchestrator.runtime.routing.settings import AdmissionSettings
from orchestrator.runtime.serving.admission import Admission
from tests.helpers import REPO


def admission(max_wait_ms=50.0, per_request_s=None):
    """An Admission whose measured cost is ``per_request_s`` per request and no fixed part."""
    a = Admission(AdmissionSettings(max_wait_ms=max_wait_ms))
    if per_request_s is not None:
        a.ran(1, per_request_s)
    return a


def test_every_request_runs_before_a_cost_is_measured():
    assert admission().cost() == (0.0, 0.0)
    assert admission().admit(64, wait_s=10.0) == 64
    assert admission().admit(0, wait_s=0.0) == 0


def test_it_admits_the_largest_count_that_ends_within_the_bound():
    a = admission(50.0, per_request_s=0.005)  # 5 ms per request
    assert a.admit(64, wait_s=0.0) == 10  # 10 * 5 ms = 50 ms: exactly the bound is admitted
    assert a.admit(64, wait_s=0.020) == 6  # 20 + 6 * 5 = 50 ms
    assert a.admit(64, wait_s=0.0201) == 5  # 20.1 + 6 * 5 > 50 ms
    assert a.admit(4, wait_s=0.0) == 4  # never more than it got


def test_it_always_runs_at_least_one_so_the_router_makes_progress():
    a = admission(50.0, per_request_s=0.005)
    assert a.admit(64, wait_s=0.049) == 1
    assert a.admit(64, wait_s=5.0) == 1
    assert admission(1.0, per_request_s=0.005).admit(64, wait_s=0.0) == 1  # one request alone is over the bound


def test_the_cost_is_a_line_through_the_executes_sizes_and_times():
    a = Admission(AdmissionSettings(max_wait_ms=50.0))
    for k in (1, 4, 2, 8, 16, 3):  # 10 ms fixed + 1 ms per request, exactly
        a.ran(k, 0.010 + 0.001 * k)
    fixed, per = a.cost()
    assert fixed == pytest.approx(0.010) and per == pytest.approx(0.001)
    # 10 ms waited + 10 ms fixed leaves 30 ms: 30 requests; one cost per request (11 ms at
    # one request... 26 ms at 16) would admit far fewer
    assert a.admit(64, wait_s=0.010) == 30
    assert a.admit(64, wait_s=0.041) == 1  # 41 + 10 + 1 > 50: still one


def test_one_size_only_gives_the_mean_cost_per_request():
    a = Admission(AdmissionSettings(max_wait_ms=50.0))
    for t in (0.020, 0.030):  # always 4 requests: no line can be fitted
        a.ran(4, t)
    fixed, per = a.cost()
    assert fixed == 0.0
    assert per == pytest.approx((0.9 * 0.020 + 0.030) / (0.9 * 4 + 4))  # the newer execute weighs more (FORGET)
    assert a.admit(64, wait_s=0.0) == math.floor(0.050 / per)


def test_executes_that_say_nothing_about_the_cost_are_ignored():
    a = admission(per_request_s=0.010)
    before = a.cost()
    a.ran(0, 1.0)  # ran no request
    a.ran(3, 0.0)  # took no time
    assert a.cost() == before


def test_a_line_falling_with_size_is_not_believed():
    a = Admission(AdmissionSettings(max_wait_ms=50.0))
    for k, t in ((1, 0.030), (8, 0.010)):  # bigger was faster (noise): no negative per-request cost
        a.ran(k, t)
    fixed, per = a.cost()
    assert fixed == 0.0 and per > 0.0


def test_the_refusal_names_the_key_the_bound_and_the_estimates():
    a = admission(40.0, per_request_s=0.0025)
    text = a.message(wait_s=0.0305, admitted=3)
    assert text.startswith("overloaded: ")
    for part in ("admission.max_wait_ms (40 ms", "estimated queue delay 30.5 ms", "an execute of 3 estimated at 7.5 ms",
                 "refused before any model ran", "retry"):
        assert part in text, part
    assert errors.Overloaded.code == "UNAVAILABLE"
    assert issubclass(errors.Overloaded, errors.RequestStopped)


def shipped():
    return yaml.safe_load((REPO / "router" / "policy.yaml").read_text())


def test_the_policy_key():
    doc = shipped()
    assert parse_policy(doc).admission is None  # absent: every request runs
    doc["admission"] = {"max_wait_ms": 40}
    policy = parse_policy(doc)
    assert policy.admission == AdmissionSettings(max_wait_ms=40.0)
    assert "admission: refuse what would wait over 40 ms (UNAVAILABLE)" in describe(policy)
    for bad, message in (({}, "policy.admission.max_wait_ms: required key is missing"),
                         ({"max_wait_ms": 0}, "policy.admission.max_wait_ms: must be > 0"),
                         ({"max_wait_ms": 40, "max_queue": 3}, "max_queue")):
        doc["admission"] = bad
        with pytest.raises(PolicyError) as err:
            parse_policy(doc)
        assert message in str(err.value)
