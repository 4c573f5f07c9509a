"""The pure parts of the router-instances benchmark (``lab.bench.instances``):
its plan, the per-round ratios, the section make bench keeps, and the variant it adds."""

from __future__ import annotations

import numpy as np
import pytest

from lab.bench import instances as I
from lab.bench.report import INSTANCES_END, INSTANCES_START, KEPT_SECTIONS
from tests.helpers import REPO


def test_the_plan_rotates_the_model_order_each_round():
    specs = I.plan(2, concurrencies=(1, 64))
    assert [(s.model, s.concurrency, s.round) for s in specs] == [
        ("ensemble", 1, 0), ("router", 1, 0), ("router_x2", 1, 0), ("ensemble", 64, 0), ("router", 64, 0), ("router_x2", 64, 0),
        ("router", 1, 1), ("router_x2", 1, 1), ("ensemble", 1, 1), ("router", 64, 1), ("router_x2", 64, 1), ("ensemble", 64, 1)]
    assert len(I.plan(I.ROUNDS)) == I.ROUNDS * len(I.CONCURRENCIES) * len(I.MODELS)


def m(model, c, r, thr, p50):
    return {"model": model, "concurrency": c, "round": r, "throughput": thr, "p50_ms": p50, "p99_ms": 2 * p50}


def test_ratios_are_medians_of_same_round_ratios_and_failures_are_left_out():
    ms = [m("ensemble", 16, 0, 100.0, 10.0), m("router", 16, 0, 200.0, 5.0), m("router_x2", 16, 0, 300.0, 4.0),
          m("ensemble", 16, 1, 50.0, 20.0), m("router", 16, 1, 150.0, 10.0), m("router_x2", 16, 1, 150.0, 10.0),
          m("ensemble", 16, 2, 100.0, 10.0), m("router", 16, 2, 100.0, 10.0), {**m("router_x2", 16, 2, 1.0, 1.0), "error": "x"}]
    s = I.summarize(ms)["16"]
    assert s["models"]["router"] == {"throughput": 150.0, "p50_ms": 10.0, "p99_ms": 20.0, "rounds": 3}
    assert s["models"]["router_x2"]["rounds"] == 2  # the failed one is left out
    assert s["ratios"]["router"] == {"throughput_vs_ensemble": 2.0, "p50_vs_ensemble": 0.5}  # rounds: 2, 3, 1 / 0.5, 0.5, 1
    assert s["ratios"]["router_x2"]["throughput_vs_router"] == pytest.approx(1.25)  # rounds 1.5 and 1.0
    assert s["ratios"]["router_x2"]["throughput_vs_ensemble"] == pytest.approx(3.0)  # rounds 3.0 and 3.0
    assert "throughput_vs_ensemble" not in s["ratios"]["ensemble"]


def test_the_section_is_kept_by_make_bench_and_lists_every_cell():
    assert (INSTANCES_START, INSTANCES_END) in KEPT_SECTIONS
    ms = [m(model, c, 0, 100.0, 5.0) for c in (1, 4) for model in I.MODELS]
    r = {"started_utc": "2026-11-26 23:55", "machine": {"cores": 2, "cpu_model": "cpu"}, "load_before": [0.3],
         "load_max_during": 2.0, "rounds": 1, "instances": 2, "quick": True, "measurements": ms, "summary": I.summarize(ms)}
    text = I.render_section(r)
    assert text.startswith(INSTANCES_START) and text.endswith(INSTANCES_END)
    assert "| 4 | `router_x2` | 100.0 | 5.0 | 10.0 | 1.0x | 1.0x | 1.0x | 1.0x |" in text
    assert "`--quick` run" in text


def test_the_variant_changes_only_the_instance_count(tmp_path):
    from orchestrator.tooling.repository import read_config

    repo = I.make_instances_repository(tmp_path / "repo")
    two, one = read_config(repo / "router_x2" / "config.pbtxt"), read_config(REPO / "router" / "config.pbtxt")
    assert two.instance_group[0].count == I.INSTANCES and one.instance_group[0].count == 1
    two.instance_group[0].count, two.name = 1, "router"
    assert two == one
    assert (repo / "router_x2" / "policy.yaml").read_text() == (REPO / "router" / "policy.yaml").read_text()


def test_the_flush_variant_changes_only_the_timing_sample(tmp_path):
    from orchestrator.runtime.metrics import SAMPLE_PARAMETER, timing_sample
    from orchestrator.runtime.request import config_parameters
    from orchestrator.tooling.repository import read_config

    repo = I.make_flush_repository(tmp_path / "repo")
    every, shipped = read_config(repo / "router_all_timings" / "config.pbtxt"), read_config(REPO / "router" / "config.pbtxt")
    assert every.parameters[SAMPLE_PARAMETER].string_value == "all"
    assert SAMPLE_PARAMETER not in shipped.parameters
    del every.parameters[SAMPLE_PARAMETER]
    every.name = "router"
    assert every == shipped
    from google.protobuf.json_format import MessageToDict

    assert timing_sample(config_parameters(MessageToDict(read_config(repo / "router_all_timings" / "config.pbtxt"),
                                                         preserving_proto_field_name=True))) is None


def test_the_flush_section_names_its_variant_and_per_round_ratios():
    from lab.bench.report import FLUSH_END, FLUSH_START

    cmp = I.COMPARISONS["flush"]
    assert (FLUSH_START, FLUSH_END) in KEPT_SECTIONS
    ms = [m("ensemble", 1, r, 100.0, 4.0) for r in range(2)] + [m("router", 1, 0, 100.0, 4.0), m("router", 1, 1, 200.0, 2.0),
                                                                 m("router_all_timings", 1, 0, 90.0, 5.0), m("router_all_timings", 1, 1, 150.0, 3.0)]
    per = I.per_round_ratios(ms, cmp.variant)
    assert per == {"1": {"throughput": [0.9, 0.75], "p50": [1.25, 1.5]}}
    r = {"started_utc": "2026-11-27 02:10", "machine": {"cores": 2, "cpu_model": "cpu"}, "load_before": [0.3],
         "load_max_during": 2.0, "rounds": 2, "quick": False, "comparison": "flush", "measurements": ms,
         "summary": I.summarize(ms), "per_round_ratios": per}
    text = I.render_section(r)
    assert text.startswith(FLUSH_START) and text.endswith(FLUSH_END)
    assert "make bench-flush" in text and "--compare flush" in text and "`router_all_timings`" in text
    assert "c=1 throughput 0.9, 0.75, p50 1.25, 1.5" in text
    assert [s.model for s in I.plan(1, cmp.concurrencies, cmp.models)] == ["ensemble", "router", "router_all_timings"] * 2


def test_the_median_interval_is_the_order_statistics_one_and_judges_the_goal():
    # 15 values: the distribution-free 95% interval of the median is the 4th..12th smallest
    values = [1.0 + i / 100 for i in range(15)][::-1]
    assert I.median_interval(values) == pytest.approx((1.07, 1.03, 1.11))
    assert I.median_interval([1.0]) is None
    few = I.median_interval([1.0, 1.1, 1.2])  # too few for 95%: no interval, not decided
    assert few[0] == pytest.approx(1.1) and np.isnan(few[1]) and I.judge(few, 1.05) == "not decided"
    assert I.judge((1.0, 0.98, 1.05), 1.05) == "met"  # the high end at the bound is within it
    assert I.judge((1.1, 1.051, 1.2), 1.05) == "not met"
    assert I.judge((1.04, 1.0, 1.06), 1.05) == "not decided" and I.judge((1.1, 1.05, 1.2), 1.05) == "not decided"
    assert I.judge(None, 1.05) == "not decided" and I.judge([1.1, None, None], 1.05) == "not decided"
    # five rounds (bench-flush's): a median but no 95% interval, stored as None, not NaN
    five = [m(model, 1, r, 100.0, 4.0 + r / 10) for r in range(5) for model in ("ensemble", "router")]
    assert I.summarize(five)["1"]["p50_vs_ensemble_interval"]["router"] == [1.0, None, None]


def test_the_single_comparison_judges_its_goal_by_the_interval(tmp_path):
    from lab.bench.plan import VARIANTS
    from lab.bench.report import SINGLE_END, SINGLE_START

    cmp = I.COMPARISONS["single"]
    assert (SINGLE_START, SINGLE_END) in KEPT_SECTIONS
    assert cmp.variant == "router_single" and cmp.concurrencies == (1,) and cmp.rounds == I.SINGLE_ROUNDS == 15
    repo = I.make_single_repository(tmp_path / "repo")
    assert (repo / "router_single" / "config.pbtxt").is_file() and "router_bls" not in {p.name for p in repo.iterdir()}
    assert VARIANTS["router_single"]["base"] == "router"
    # per round: ensemble p50 4.0 ms, router_single 4.0 * (1.10 .. 1.24): every ratio past the bound
    ms = [m("ensemble", 1, r, 100.0, 4.0) for r in range(15)] + [m("router", 1, r, 90.0, 5.0) for r in range(15)] \
        + [m("router_single", 1, r, 95.0, 4.0 * (1.10 + r / 100)) for r in range(15)]
    summary = I.summarize(ms)
    low, high = summary["1"]["p50_vs_ensemble_interval"]["router_single"][1:]
    assert (low, high) == pytest.approx((1.13, 1.21))
    r = {"started_utc": "2026-11-27 05:20", "machine": {"cores": 2, "cpu_model": "cpu"}, "load_before": [0.3],
         "load_max_during": 2.0, "rounds": 15, "quick": False, "comparison": "single", "measurements": ms,
         "summary": summary, "per_round_ratios": I.per_round_ratios(ms, cmp.variant)}
    text = I.render_section(r)
    assert text.startswith(SINGLE_START) and text.endswith(SINGLE_END) and "--compare single" in text
    assert "c=1 `router_single` p50 / ensemble: median of 15 per-round ratios 1.17x, 95% interval 1.13x to 1.21x" in text
    assert "at most 1.05x the ensemble's: **not met** by this run" in text
    # the same run with every ratio at 1.0: met
    ms = [x if x["model"] != "router_single" else {**x, "p50_ms": 4.0} for x in ms]
    assert "**met** by this run" in I.render_section({**r, "measurements": ms, "summary": I.summarize(ms)})
    # a failed ensemble measurement leaves that round out of the pairs the median is of
    ms[0] = {**ms[0], "error": "x"}
    assert "median of 14 per-round ratios" in I.render_section({**r, "measurements": ms, "summary": I.summarize(ms)})
