"""The router's queue-delay estimate (``runtime.serving.router.QueueDelay``, what admission
control reads), driven by a fake clock: no server; and the cascade's overload mode, removed,
refused by name with what replaces it."""

from __future__ import annotations

import pytest

from orchestrator.runtime.errors import PolicyError
from orchestrator.runtime.routing.policy import parse_policy
from orchestrator.runtime.serving.router import QueueDelay


def test_a_policy_with_the_removed_overload_mode_is_refused_saying_what_replaces_it():
    doc = {"version": 1, "root": {"kind": "cascade", "margin": 0.2, "overload": {"target_ms": 20, "cap_ms": 100},
                                  "stages": [{"kind": "model", "model": "fast"}, {"kind": "model", "model": "accurate"}]}}
    with pytest.raises(PolicyError, match=r"root\.overload: the cascade's overload mode was removed: use `budget` .* `admission`"):
        parse_policy(doc)
    del doc["root"]["overload"]
    assert parse_policy(doc).root.kind == "cascade"


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
