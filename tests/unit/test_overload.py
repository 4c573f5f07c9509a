"""The overload mode of a cascade (``nodes.cascade.overload_margin``, ``keep_for_load``) and
the router's queue-delay estimate (``runtime.serving.router.QueueDelay``), driven by a fake clock and
a fixed delay: no server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.routing.nodes.cascade import OVERLOAD_METRIC, Overload, overload_margin
from orchestrator.runtime.routing.policy import describe as describe_policy
from orchestrator.runtime.routing.policy import parse_policy
from orchestrator.runtime.serving.request import Work
from orchestrator.runtime.serving.router import QueueDelay
from tests.helpers import FakeBLS, expected_logit, ids_of, sig
from tests.unit.test_shadow import RecordingMetrics

# good - bad from -3 to 3: fast probabilities at every distance from 0.5
TEXTS = ["good good good", "good good", "good", "film", "bad", "bad bad", "bad bad bad", "good bad"]
MARGIN = 0.45
TARGET, CAP = 20.0, 100.0


class FixedDelay:
    """Stands in for ``QueueDelay``: the delay the test sets."""

    def __init__(self, ms: float):
        self.ms = ms

    def delay_ms(self) -> float:
        return self.ms


def model(name):
    return {"kind": "model", "name": name, "model": name}


def cascade_doc(overload=True, margin=MARGIN):
    root = {"kind": "cascade", "name": "cas", "margin": margin, "stages": [model("fast"), model("accurate")]}
    if overload:
        root["overload"] = {"target_ms": TARGET, "cap_ms": CAP}
    return {"version": 1, "root": root}


def run(delay_ms, overload=True):
    fake, metrics = FakeBLS(), RecordingMetrics()
    engine = Engine(parse_policy(cascade_doc(overload)), fake, metrics)
    engine.queue_delay_ms = FixedDelay(delay_ms).delay_ms
    [result] = asyncio.run(engine.run([Work(list(TEXTS), np.full(len(TEXTS), 0.5, np.float32), {}, "")]))
    return result, fake, metrics


def distance(text):
    return abs(sig(expected_logit("fast", ids_of(text))) - 0.5)


def escalated_rows(fake):
    return sum(c["rows"] for c in fake.calls if c["model"] == "accurate")


def expected_routes(margin):
    """Independently of the engine: unsure at ``margin`` -> accurate; unsure at the full
    margin only -> fast:overload; else fast."""
    out = []
    for t in TEXTS:
        d = distance(t)
        out.append("accurate" if d < margin else "fast:overload" if d < MARGIN else "fast")
    return out


def test_the_texts_cover_several_distances():
    assert len({round(distance(t), 6) for t in TEXTS}) >= 4
    assert sum(distance(t) < MARGIN for t in TEXTS) >= 4


@pytest.mark.parametrize("delay", [0.0, TARGET / 2, TARGET])
def test_at_or_below_the_target_nothing_changes(delay):
    with_mode, fake, metrics = run(delay)
    without, plain_fake, _ = run(delay, overload=False)
    assert with_mode.routes == without.routes == expected_routes(MARGIN)
    np.testing.assert_array_equal(with_mode.probabilities, without.probabilities)
    assert escalated_rows(fake) == escalated_rows(plain_fake) == sum(distance(t) < MARGIN for t in TEXTS)
    assert metrics.count(OVERLOAD_METRIC, node="cas") == 0


def test_above_the_target_fewer_texts_escalate_the_most_unsure_last():
    delay = TARGET + 0.6 * (CAP - TARGET)
    margin = MARGIN * 0.4
    result, fake, metrics = run(delay)
    assert result.routes == expected_routes(margin)
    full = sum(distance(t) < MARGIN for t in TEXTS)
    escalated = sum(distance(t) < margin for t in TEXTS)
    assert 0 < escalated < full  # the texts chosen make this a real middle case
    assert escalated_rows(fake) == escalated
    # every escalated text is more unsure than every text kept for load
    kept = [distance(t) for t, r in zip(TEXTS, result.routes) if r == "fast:overload"]
    sent = [distance(t) for t, r in zip(TEXTS, result.routes) if r == "accurate"]
    assert max(sent) < min(kept)
    assert metrics.count(OVERLOAD_METRIC, node="cas") == full - escalated == len(kept)
    assert metrics.count("orchestrator_escalations_total", node="cas") == escalated


@pytest.mark.parametrize("delay", [CAP, CAP * 10])
def test_at_and_after_the_cap_no_text_escalates(delay):
    result, fake, metrics = run(delay)
    assert escalated_rows(fake) == 0
    full = sum(distance(t) < MARGIN for t in TEXTS)
    assert result.routes == ["fast:overload" if distance(t) < MARGIN else "fast" for t in TEXTS]
    assert metrics.count(OVERLOAD_METRIC, node="cas") == full
    # the answers are the first stage's, unchanged
    np.testing.assert_allclose(result.probabilities.reshape(-1), [sig(expected_logit("fast", ids_of(t))) for t in TEXTS],
                               rtol=1e-6)


def test_without_overload_a_huge_delay_changes_nothing():
    result, fake, metrics = run(1e6, overload=False)
    assert result.routes == expected_routes(MARGIN)
    assert metrics.count(OVERLOAD_METRIC, node="cas") == 0


def test_overload_margin_boundaries():
    o = Overload(target_ms=10.0, cap_ms=30.0)
    assert overload_margin(0.2, o, 10.0) == 0.2  # delay == target: unchanged (<=)
    assert 0.0 < overload_margin(0.2, o, 10.0 + 1e-9) < 0.2  # just above: shrinks (>)
    assert overload_margin(0.2, o, 20.0) == pytest.approx(0.1)
    assert overload_margin(0.2, o, 30.0 - 1e-9) > 0.0
    assert overload_margin(0.2, o, 30.0) == 0.0  # delay == cap: nothing escalates (>=)
    assert overload_margin(0.2, None, 1e9) == 0.2


def test_policy_refuses_a_cap_not_above_the_target_and_describes_the_mode():
    doc = cascade_doc()
    doc["root"]["overload"] = {"target_ms": 50, "cap_ms": 50}
    with pytest.raises(PolicyError, match=r"root.overload.cap_ms: 50 must be greater than target_ms 50"):
        parse_policy(doc)
    doc["root"]["overload"] = {"target_ms": 50}
    with pytest.raises(PolicyError, match="cap_ms"):
        parse_policy(doc)
    assert "overload=20..100ms" in describe_policy(parse_policy(cascade_doc()))


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_queue_delay_estimate_follows_back_to_back_executes_and_forgets_idle_ones():
    clock = Clock()  # binary fractions of a second: exact sums
    q = QueueDelay(clock, busy_gap_s=0.25, smoothing=0.5)
    assert q.begin() == 0.0 and q.delay_ms() == 0.0  # first execute: nothing known
    clock.t += 1.0
    q.end()
    clock.t += 0.125  # next execute right after: its oldest request waited since the last start
    assert q.begin() == 0.5625  # EWMA: 0 + 0.5 * (1.125 - 0)
    clock.t += 0.5
    q.end()
    clock.t += 0.25  # exactly the busy gap still counts as busy (<=)
    assert q.begin() == 0.65625  # 0.5625 + 0.5 * (0.75 - 0.5625)
    assert q.delay_ms() == 656.25
    clock.t += 0.5
    q.end()
    clock.t += 0.25 + 2 ** -10  # just over the gap: the instance sat idle, the sample is 0
    assert q.begin() == 0.328125
    q.end()
    q.end()  # a second end without begin changes nothing
    clock.t += 8.0
    assert q.begin() == 0.1640625


def test_queue_delay_refuses_bad_settings():
    with pytest.raises(ValueError, match="smoothing"):
        QueueDelay(smoothing=0.0)
    with pytest.raises(ValueError, match="busy_gap_s"):
        QueueDelay(busy_gap_s=-1.0)
