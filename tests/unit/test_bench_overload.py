"""The pure parts of the overload benchmark (``lab.bench.overload``): the
rate plan, Poisson arrivals, one level's summary, the goal, the section and its place in
benchmarks.md."""

from __future__ import annotations

import pytest
import yaml

from lab.bench.overload import (
    Record,
    goal,
    poisson_arrivals,
    rate_plan,
    render_section,
    summarize,
)
from lab.bench.plan import BenchError
from lab.bench.report import OVERLOAD_END, OVERLOAD_START, render_report, replace_section
from tests.helpers import REPO


def test_rate_plan_is_multiples_of_the_capacity():
    assert rate_plan(100.0) == [{"multiplier": 1.0, "rate": 100.0}, {"multiplier": 2.0, "rate": 200.0},
                                {"multiplier": 4.0, "rate": 400.0}]
    assert rate_plan(33.333, (0.5,)) == [{"multiplier": 0.5, "rate": 16.67}]
    for bad in (0, -1.0, float("nan"), float("inf"), None):
        with pytest.raises(BenchError, match="capacity"):
            rate_plan(bad)


def test_poisson_arrivals_are_deterministic_increasing_and_at_the_rate():
    a = poisson_arrivals(200.0, 30.0, seed=3)
    assert a == poisson_arrivals(200.0, 30.0, seed=3) and a != poisson_arrivals(200.0, 30.0, seed=4)
    assert all(x < y for x, y in zip(a, a[1:])) and 0 < a[0] and a[-1] < 30.0
    assert len(a) == pytest.approx(6000, rel=0.05)  # 5 % is over 3 standard deviations (sqrt(6000) = 77)
    with pytest.raises(BenchError):
        poisson_arrivals(0.0, 1.0, seed=1)


def records():
    return [
        Record(0.0, 0.010, "OK", 1, True, "classifier_fast"),
        Record(0.0, 0.020, "OK", 0, True, "classifier_fast:overload"),
        Record(0.0, 0.030, "OK", 0, False, "classifier"),
        Record(0.0, 0.001, "UNAVAILABLE", 1, message="[request id: x] Exceeds maximum queue size"),
        Record(0.0, 0.002, "INTERNAL", 1, message="boom"),
        Record(0.0, 2.0, "UNFINISHED", 1),
    ]


def test_summarize_counts_every_outcome_and_bounds_the_percentiles():
    s = summarize(records(), window_s=2.0)
    assert (s["sent"], s["answered"], s["refused"], s["errors"], s["unfinished"]) == (6, 3, 1, 1, 1)
    assert s["throughput"] == 1.5
    assert s["accuracy_pct"] == pytest.approx(66.67)
    assert s["overload_share_pct"] == pytest.approx(33.3) and s["escalated_share_pct"] == pytest.approx(33.3)
    assert s["p50_ms"] == 25.0  # 10, 20, 30 and the unfinished one's 2000
    assert s["answered_p99_ms"] == pytest.approx(29.8)
    assert s["p99_lower_bound"] is True  # the unfinished request is in the p99
    assert s["codes"] == {"INTERNAL": 1, "OK": 3, "UNAVAILABLE": 1, "UNFINISHED": 1}
    assert s["refusal_messages"] == ["[request id: x] Exceeds maximum queue size"]
    empty = summarize([], 1.0)
    assert empty["p99_ms"] is None and empty["accuracy_pct"] is None and empty["throughput"] == 0.0


def results():
    level = lambda m: {"multiplier": m, "rate": 100.0 * m, "models": {  # noqa: E731
        name: summarize(records(), 2.0) for name in ("ensemble", "router", "router_queue", "router_timeout", "router_two")}}
    r = {"started_utc": "2026-11-23 23:00", "machine": {"cores": 2, "cpu_model": "cpu"}, "load_start": [1.0],
         "load_end": [2.0], "quick": True, "models": ["ensemble", "router", "router_queue", "router_timeout", "router_two"],
         "level_s": 5.0, "grace_s": 5.0,
         "capacity": {"concurrency": 8, "throughput": 100.0, "answered": 500, "seconds": 5.0},
         "unloaded": {m: {"p50_ms": 5.0, "p99_ms": 10.0, "accuracy_pct": 80.0} for m in ("ensemble", "router", "router_queue", "router_timeout", "router_two")},
         "levels": [level(1.0), level(2.0), level(4.0)]}
    r["goals"] = [goal(r, m) for m in ("router", "router_queue", "router_timeout", "router_two")]
    return r


def test_goal_is_the_4x_p99_over_the_unloaded_p99():
    r = results()
    p99 = r["levels"][-1]["models"]["router_queue"]["p99_ms"]
    assert r["goals"][1] == {"model": "router_queue", "ratio": round(p99 / 10.0, 2), "bound": 3.0, "met": False,
                             "stalled": False}
    assert goal(r, "router")["ratio"] == round(p99 / 10.0, 2)
    r["unloaded"]["router_queue"]["p99_ms"] = None
    assert goal(r, "router_queue")["met"] is None


def test_the_section_has_every_level_and_model_and_is_kept_by_make_bench(tmp_path):
    section = render_section(results())
    assert section.startswith(OVERLOAD_START) and section.endswith(OVERLOAD_END)
    assert section.count("| `router_queue` |") == 4  # unloaded + 3 levels
    assert "| 4x | `router` | 400.0 | 6 | 1.5 |" in section and "&ge; " in section
    assert section.count("**not met**") == 4 and "`router_two`'s p99" in section and "a stall" not in section
    stalled = results()
    stalled["unloaded"]["router"]["p99_ms"] = 503.0  # 100x its p50 of 5 ms
    stalled["goals"] = [goal(stalled, "router")]
    assert stalled["goals"][0]["met"] is None and stalled["goals"][0]["stalled"] is True
    assert "not judged (its unloaded p99, 503.0 ms, is over 10x its p50, 5.0 ms" in render_section(stalled)
    report = tmp_path / "benchmarks.md"
    report.write_text("# Benchmarks\n\nbody\n")
    replace_section(report, f"{OVERLOAD_START}\nfirst\n{OVERLOAD_END}", OVERLOAD_START, OVERLOAD_END)
    replace_section(report, section, OVERLOAD_START, OVERLOAD_END)
    text = report.read_text()
    assert text.count(OVERLOAD_START) == 1 and section in text and "first" not in text and "body" in text
    from tests.helpers import bench_results  # a complete results.json of `make bench`

    assert section in render_report(bench_results(), existing=text)


def test_the_queue_variants_add_the_recommended_policy_and_change_nothing_else(tmp_path):
    from lab.bench.overload import TIMEOUT_QUEUE, set_queue_policy
    from orchestrator.tooling.repository import QUEUE_POLICY, read_config

    shipped = read_config(REPO / "router" / "config.pbtxt")
    assert not shipped.dynamic_batching.HasField("default_queue_policy")  # none on 2.51 (docs/guides/reliability.md)
    for fields, size, timeout in (({}, QUEUE_POLICY["max_queue_size"], QUEUE_POLICY["default_timeout_microseconds"]),
                                  (TIMEOUT_QUEUE, 1024, 40000)):
        path = tmp_path / "config.pbtxt"
        path.write_text((REPO / "router" / "config.pbtxt").read_text())
        set_queue_policy(path, fields)
        changed = read_config(path)
        q = changed.dynamic_batching.default_queue_policy
        assert (q.max_queue_size, q.default_timeout_microseconds) == (size, timeout)
        assert q.allow_timeout_override and q.timeout_action == q.REJECT
        assert (changed.dynamic_batching.priority_levels, changed.dynamic_batching.default_priority_level) == (2, 2)
        changed.dynamic_batching.ClearField("default_queue_policy")
        changed.dynamic_batching.priority_levels = changed.dynamic_batching.default_priority_level = 0
        assert changed == shipped
    bare = tmp_path / "bare.pbtxt"
    bare.write_text('name: "m"\nbackend: "python"\nmax_batch_size: 4\n')
    with pytest.raises(BenchError, match="no dynamic_batching"):
        set_queue_policy(bare, TIMEOUT_QUEUE)


def test_the_two_instance_variant_changes_only_the_count(tmp_path):
    from lab.bench.overload import set_instances
    from orchestrator.tooling.repository import read_config

    path = tmp_path / "config.pbtxt"
    path.write_text((REPO / "router" / "config.pbtxt").read_text())
    set_instances(path, 2)
    changed, shipped = read_config(path), read_config(REPO / "router" / "config.pbtxt")
    assert changed.instance_group[0].count == 2 and shipped.instance_group[0].count == 1
    changed.instance_group[0].count = 1
    assert changed == shipped


def test_the_answered_requests_goal_is_their_p99_at_2x_and_4x_with_none_lost():
    from lab.bench.overload import goal_answered

    r = results()
    for lv in r["levels"]:
        x = lv["models"]["router"]
        x.update(answered_p99_ms=30.0, unfinished=0, errors=0, refused=7)
    r["levels"][0]["models"]["router"]["answered_p99_ms"] = 900.0  # 1x is not judged
    g = goal_answered(r, "router")
    assert g == {"model": "router", "ratios": {"2x": 3.0, "4x": 3.0}, "bound": 3.0, "lost": 0, "refused": 14, "met": True,
                 "stalled": False}
    r["levels"][2]["models"]["router"]["answered_p99_ms"] = 30.1  # over 3x at 4x
    assert goal_answered(r, "router")["met"] is False
    r["levels"][2]["models"]["router"]["answered_p99_ms"] = 20.0
    r["levels"][1]["models"]["router"]["unfinished"] = 1  # one request unanswered: not met, however fast
    assert goal_answered(r, "router")["met"] is False and goal_answered(r, "router")["lost"] == 1
    r["unloaded"]["router"]["p99_ms"] = 51.0  # over 10x its p50 of 5 ms: a stall, the bound means nothing
    stalled = goal_answered(r, "router")
    assert stalled["met"] is None and stalled["stalled"] is True
    r["unloaded"]["router"]["p99_ms"] = None
    assert goal_answered(r, "router")["met"] is None
    r["goals_answered"] = [g]
    assert "- Goal, answered requests: at 2x and 4x, `router`'s p99 of answered requests at most 3x its unloaded p99, none " \
           "lost: 2x 3.0x, 4x 3.0x; 14 refused, 0 unfinished or failed; **met**." in render_section(r)


def test_the_admission_variant_adds_only_the_admission_key(tmp_path):
    from lab.bench.overload import ADMISSION, make_overload_repository
    from orchestrator.runtime.routing.policy import parse_policy

    shipped = yaml.safe_load((REPO / "router" / "policy.yaml").read_text())
    repo = make_overload_repository(tmp_path / "repo", shipped)
    variant = yaml.safe_load((repo / "router_admit" / "policy.yaml").read_text())
    assert variant["admission"] == ADMISSION and parse_policy(variant).admission is not None
    variant.pop("admission"), variant.pop("description"), shipped.pop("description")
    assert variant == shipped
