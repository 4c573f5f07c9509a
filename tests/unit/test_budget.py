"""The escalation budget of a cascade (``nodes.cascade.EscalationBudget``, ``distances``):
the controller on fixed distances, and the engine on fixed texts and thresholds with a fake
clock, while the unsure fraction of the traffic doubles. No server.

The tolerance stated (docs/guides/reliability.md "Escalation budget"): the escalated share of the
window never exceeds ``max_escalation_rate`` (exact), and once the unsure traffic is over
the budget it uses at least ``max_escalation_rate - 0.02`` of it on average (window 200
texts, batches of 8).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.execution.engine import Engine
from orchestrator.runtime.request import Work
from orchestrator.runtime.routing.heads import BINARY, MULTICLASS, MULTILABEL, Head
from orchestrator.runtime.routing.nodes.cascade import BUDGET_METRIC, MARGIN_GAUGE, RATE_GAUGE, Budget, EscalationBudget, distances
from orchestrator.runtime.routing.policy import describe as describe_policy
from orchestrator.runtime.routing.policy import parse_policy
from tests.helpers import FakeBLS, expected_logit, ids_of, sig
from tests.unit.test_shadow import RecordingMetrics

RATE, WINDOW, BATCH, MARGIN = 0.10, 200, 8, 0.1
TOLERANCE = 0.02  # the budget's use below the rate once the traffic is over it, on average


def shifted_distances(seed=0, n=2000):
    """Distances of ``2 n`` texts: in the first half 8% are unsure at :data:`MARGIN`
    (``d < MARGIN``), in the second half 16% (the unsure fraction doubles); exact counts
    per block of 25, shuffled, so every window sees the shift the same way."""
    rng = np.random.default_rng(seed)
    out = []
    for unsure_per_25 in (2, 4):
        for _ in range(n // 25):
            block = np.concatenate([rng.uniform(0.0, MARGIN, unsure_per_25), rng.uniform(MARGIN, 0.45, 25 - unsure_per_25)])
            out.extend(rng.permutation(block))
    return np.array(out)


def windows_ending_at_batches(escalated, window=WINDOW, batch=BATCH):
    esc = np.asarray(escalated, dtype=float)
    return np.array([esc[max(0, e - window):e].mean() for e in range(batch, len(esc) + 1, batch)])


def drive(controller, d, cap=MARGIN, batch=BATCH):
    """Feed ``d`` in batches; returns (escalated bool per text, margin per batch, rates)."""
    escalated, margins, rates = [], [], []
    for i in range(0, len(d), batch):
        part = d[i:i + batch]
        allowed, rate = controller.plan(part.tolist(), cap, float(i))
        m = min(cap, allowed)
        escalated += list(part < m)
        margins.append(m)
        rates.append(rate)
    return np.array(escalated), margins, rates


# ----------------------------------------------------------------------------- distances


@pytest.mark.parametrize("head", [
    Head(BINARY, ("positive",)),
    Head(MULTICLASS, ("a", "b", "c", "d")),
    Head(MULTILABEL, ("x", "y", "z")),
])
def test_distance_below_a_margin_is_exactly_the_heads_unsure(head):
    rng = np.random.default_rng(1)
    p = rng.uniform(size=(500, head.columns))
    if head.kind == MULTICLASS:
        p /= p.sum(axis=1, keepdims=True)
    t = rng.uniform(0.2, 0.8, size=(500, head.columns if head.kind == MULTILABEL else 1))
    d = distances(head, p, t)
    for m in (0.0, 0.01, 0.05, 0.1, 0.3, 1.0, float(np.median(d))):
        np.testing.assert_array_equal(d < m, head.unsure(p, t, m))


# ----------------------------------------------------------------------------- the controller


def test_the_shifted_traffic_doubles_the_unsure_fraction():
    d = shifted_distances()
    assert (d[:2000] < MARGIN).mean() == pytest.approx(0.08)
    assert (d[2000:] < MARGIN).mean() == pytest.approx(0.16)
    # without a budget the cascade escalates all of them: over the budget after the shift
    over = windows_ending_at_batches(d < MARGIN)
    assert over[len(over) // 2 + WINDOW // BATCH:].min() > RATE


def test_the_budget_holds_while_the_unsure_fraction_doubles():
    d = shifted_distances()
    escalated, margins, rates = drive(EscalationBudget(Budget(RATE, WINDOW)), d)
    shares = windows_ending_at_batches(escalated)
    assert shares.max() <= RATE + 1e-12  # never over the budget, any window, from the first text
    np.testing.assert_allclose(rates, shares)  # the gauge is the window's share
    after = escalated[2000 + WINDOW:]  # the second half, once its window is all shifted traffic
    assert RATE - TOLERANCE <= after.mean() <= RATE
    # before the shift the budget rarely binds: most of the unsure texts escalate
    assert escalated[WINDOW:2000].sum() >= 0.85 * (d[WINDOW:2000] < MARGIN).sum()
    # the margin is never above the cascade's own, and falls after the shift
    assert max(margins) <= MARGIN
    assert np.mean(margins[len(margins) // 2 + WINDOW // BATCH:]) < np.mean(margins[WINDOW // BATCH:len(margins) // 2])


def test_kept_texts_are_always_surer_than_escalated_ones_of_their_batch():
    d = shifted_distances(seed=4)
    escalated, margins, _ = drive(EscalationBudget(Budget(RATE, WINDOW)), d)
    for b, m in enumerate(margins):
        part, esc = d[b * BATCH:(b + 1) * BATCH], escalated[b * BATCH:(b + 1) * BATCH]
        np.testing.assert_array_equal(esc, part < m)
        kept = part[(part < MARGIN) & ~esc]
        if kept.size and esc.any():
            assert part[esc].max() < kept.min()


def test_the_controller_is_deterministic():
    d = shifted_distances(seed=2)
    a = drive(EscalationBudget(Budget(RATE, WINDOW)), d)
    b = drive(EscalationBudget(Budget(RATE, WINDOW)), d)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] == b[1]


def test_a_fresh_controller_escalates_nothing_until_the_rate_allows_one():
    c = EscalationBudget(Budget(0.25, 100))
    assert c.plan([0.2, 0.3, 0.3], 0.5, 0.0) == (0.2, 0.0)  # 3 texts: floor(0.75) = 0 escalations
    allowed, rate = c.plan([0.01], 0.5, 0.0)  # 4 texts: one, and 0.01 is the window's most unsure
    assert allowed == 0.2 and rate == 0.25
    # the quantile: a batch's text is escalated only when it is among the window's most unsure
    assert c.plan([0.25, 0.25, 0.25, 0.25], 0.5, 0.0) == (0.25, 0.125)  # 8 texts, 2 allowed: d_3 = 0.25, none below


def test_the_window_in_seconds_forgets_old_escalations():
    c = EscalationBudget(Budget(0.5, 1000, window_s=10.0))
    assert c.plan([0.01, 0.02], 0.5, 0.0)[1] == 0.5  # one of two escalates: 0.01
    allowed, rate = c.plan([0.01, 0.02], 0.5, 5.0)
    assert rate == 0.5 and 0.01 < allowed <= 0.02  # 4 texts, 2 allowed, 1 used: the batch gets one
    allowed, rate = c.plan([0.01, 0.02], 0.5, 100.0)  # the first four left the window
    assert rate == 0.5 and 0.01 < allowed <= 0.02
    # without window_s they would still count: 6 texts, 3 allowed, 2 used
    d = EscalationBudget(Budget(0.5, 1000))
    for t in (0.0, 5.0):
        d.plan([0.01, 0.02], 0.5, t)
    assert d.plan([0.01, 0.02], 0.5, 100.0) == (pytest.approx(0.02), 0.5)


def test_a_budget_of_one_changes_nothing():
    d = shifted_distances(seed=3)
    escalated, margins, _ = drive(EscalationBudget(Budget(1.0, WINDOW)), d)
    np.testing.assert_array_equal(escalated, d < MARGIN)


# ----------------------------------------------------------------------------- through the engine


def model(name):
    return {"kind": "model", "name": name, "model": name}


def cascade_doc(budget=None):
    root = {"kind": "cascade", "name": "cas", "margin": MARGIN, "stages": [model("fast"), model("accurate")]}
    if budget is not None:
        root["budget"] = budget
    return {"version": 1, "root": root}


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


P_FILM = sig(expected_logit("fast", ids_of("film")))  # every text is "film": its threshold sets its distance


def thresholds_for(d, seed=0):
    """Thresholds at distance ``d`` from the fast model's probability of "film", on either side."""
    side = np.where(np.random.default_rng(seed).uniform(size=len(d)) < 0.5, -1.0, 1.0)
    return (P_FILM + side * d).astype(np.float32)


def run_stream(doc, thresholds, batch=BATCH):
    fake, metrics, clock = FakeBLS(), RecordingMetrics(), Clock()
    engine = Engine(parse_policy(doc), fake, metrics, clock=clock)
    routes = []
    for i in range(0, len(thresholds), batch):
        clock.t = i * 0.01
        t = thresholds[i:i + batch]
        [result] = asyncio.run(engine.run([Work(["film"] * len(t), t.reshape(-1, 1), {}, "")]))
        routes += result.routes
    return routes, fake, metrics


def test_the_engine_holds_the_budget_end_to_end_and_says_so():
    t = thresholds_for(shifted_distances(n=1000))
    d = np.abs(P_FILM - t.astype(np.float64))  # the distances the engine sees (float32 thresholds)
    plain, _, _ = run_stream(cascade_doc(), t)
    assert [r == "accurate" for r in plain] == list(d < MARGIN)  # without a budget: every unsure text
    routes, fake, metrics = run_stream(cascade_doc({"max_escalation_rate": RATE, "window": WINDOW}), t)
    escalated = np.array([r == "accurate" for r in routes])
    assert set(routes) == {"fast", "fast:budget", "accurate"}
    assert windows_ending_at_batches(escalated).max() <= RATE
    assert RATE - TOLERANCE <= escalated[1000 + WINDOW:].mean()
    kept = np.array([r == "fast:budget" for r in routes])
    np.testing.assert_array_equal(kept | escalated, d < MARGIN)  # kept: unsure at the margin, not escalated
    assert metrics.count(BUDGET_METRIC, node="cas") == kept.sum()
    assert metrics.count("orchestrator_escalations_total", node="cas") == escalated.sum()
    assert sum(c["rows"] for c in fake.calls if c["model"] == "accurate") == escalated.sum()
    assert metrics.gauges[(RATE_GAUGE, (("node", "cas"),))] == pytest.approx(escalated[-WINDOW:].mean())
    assert 0.0 <= metrics.gauges[(MARGIN_GAUGE, (("node", "cas"),))] <= MARGIN


def test_policy_reads_describes_and_refuses_a_budget():
    p = parse_policy(cascade_doc({"max_escalation_rate": 0.05, "window": 500, "window_s": 60}))
    assert p.root.budget == Budget(0.05, 500, 60.0)
    assert "budget=0.05 of the last 500 texts within 60s" in describe_policy(p)
    assert parse_policy(cascade_doc({"max_escalation_rate": 0.05})).root.budget.window == 1000
    for bad, where in [({"max_escalation_rate": 1.5}, "budget.max_escalation_rate"), ({}, "budget.max_escalation_rate"),
                       ({"max_escalation_rate": 0.1, "window": 0}, "budget.window"),
                       ({"max_escalation_rate": 0.1, "window_s": 0}, "budget.window_s"),
                       ({"max_escalation_rate": 0.1, "rate": 1}, "budget")]:
        with pytest.raises(PolicyError, match=where.replace(".", r"\.")):
            parse_policy(cascade_doc(bad))


def test_a_batch_larger_than_the_window_is_decided_whole_within_the_budget():
    c = EscalationBudget(Budget(0.25, 4))
    allowed, rate = c.plan([0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08], 0.5, 0.0)
    assert allowed == 0.03 and rate == 0.25  # 8 texts in the window for this batch: 2 escalate
    allowed, rate = c.plan([0.5, 0.5], 0.5, 1.0)  # then the window is 4 again
    assert rate == 0.0


def test_a_nan_distance_is_never_unsure_and_keeps_the_window_sorted():
    c = EscalationBudget(Budget(0.5, 4))
    assert c.plan([float("nan"), 0.1], 0.5, 0.0) == (float("inf"), 0.5)  # 0.1 escalates, the NaN never
    assert c.plan([0.2, 0.3], 0.5, 0.0) == (0.3, 0.5)
    assert c.plan([0.05, 0.4], 0.5, 0.0) == (0.3, 0.5)  # the NaN left the window without breaking it
