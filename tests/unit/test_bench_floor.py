"""The pure parts of the floor benchmark (``lab.bench.floor``): the hand-written BLS model
copied into the benchmark repository, the plan, the classifier inputs, the escalation rate,
the cascade's cost model, the goals' decisions, load time and the section."""

from __future__ import annotations

import json

import pytest

from lab.bench import floor as F
from lab.bench import floor_goals as G
from lab.bench.plan import VARIANTS, BenchError
from lab.bench.report import FLOOR_END, FLOOR_START, KEPT_SECTIONS
from lab.bench.variants import copy_source_model, make_bench_repository
from orchestrator.tooling.repository import read_config
from tests.helpers import ROOT


def test_hand_bls_is_copied_from_lab_bench_into_the_benchmark_repository(tmp_path):
    assert VARIANTS["hand_bls"] == {"source": "lab/bench/hand_bls"}
    repo = make_bench_repository(tmp_path / "repo", variants={"hand_bls": VARIANTS["hand_bls"],
                                                               "floor2": VARIANTS["hand_bls"]})
    assert read_config(repo / "hand_bls" / "config.pbtxt").name == "hand_bls"
    assert (repo / "hand_bls" / "1" / "model.py").read_bytes() == (ROOT / "lab/bench/hand_bls/1/model.py").read_bytes()
    assert read_config(repo / "floor2" / "config.pbtxt").name == "floor2"  # renamed like any copy
    assert not (repo / "hand_bls" / "1" / "__pycache__").exists()
    with pytest.raises(BenchError, match="not found"):
        copy_source_model("x", tmp_path / "nowhere", tmp_path / "x")
    with pytest.raises(BenchError, match="already has a model"):
        copy_source_model("hand_bls", "lab/bench/hand_bls", repo / "hand_bls")


def test_the_floor_repository_has_its_variants(tmp_path):
    from orchestrator.runtime.routing import policy as P
    from orchestrator.tooling import tune as T

    repo = F.make_floor_repository(tmp_path / "repo")
    assert (repo / "hand_bls" / "config.pbtxt").is_file() and (repo / "router_single" / "config.pbtxt").is_file()
    assert not (repo / "router_bls").exists()
    outputs = [o.name for o in read_config(repo / "router_single_no_route" / "config.pbtxt").output]
    assert outputs == [o.name for o in read_config(repo / "router_single" / "config.pbtxt").output if o.name != "ROUTE"]
    same = [P.load_policy(repo / m / "policy.yaml") for m in ("router_single_no_route", "router_single")]
    assert same[0].root == same[1].root
    with pytest.raises(BenchError, match="no output 'NOPE'"):
        make_bench_repository(tmp_path / "r3", variants={"x": {"base": "router", "drop_outputs": ["NOPE"]}})
    shipped = (ROOT / "model_repository" / "router" / "policy.yaml").read_text()
    (served,) = T.cascades(P.load_policy(ROOT / "model_repository" / "router" / "policy.yaml"))
    for name in F.ESCALATION_VARIANTS:  # copies of the shipped router: its policy, its margin
        assert read_config(repo / name / "config.pbtxt").name == name
        (cascade,) = T.cascades(P.load_policy(repo / name / "policy.yaml"))
        assert cascade.margin == served.margin and (repo / name / "policy.yaml").read_text() == shipped
    with pytest.raises(BenchError, match="no cascade node named 'nope'"):
        make_bench_repository(tmp_path / "r2", variants={"x": {"base": "router", "cascade_margins": {"nope": 0.5}}})


def test_the_plan_rotates_the_models_and_adds_the_classifiers_at_c16():
    specs = F.floor_plan(2)
    first = [(s.model, s.concurrency, s.dataset) for s in specs if s.round == 0]
    assert first[:5] == [(m, 1, "held_out") for m in F.FLOOR_MODELS]
    assert first[-5:-3] == [("classifier_fast", 16, "tokens"), ("classifier", 16, "tokens")]
    assert first[-3:] == [(F.LOW_SHARE, 16, "share_low"), (F.MID_SHARE, 16, "share_mid"), (F.HIGH_SHARE, 16, "share_high")]
    second = [s.model for s in specs if s.round == 1]
    assert second[:5] == ["router", "router_single", "hand_bls", "router_single_no_route", "ensemble"]
    assert second[-5:] == ["classifier", "classifier_fast", F.MID_SHARE, F.HIGH_SHARE, F.LOW_SHARE]
    assert len(specs) == 2 * (len(F.FLOOR_MODELS) * 2 + 5)


def test_classifier_inputs_are_padded_to_the_longest_of_each_group():
    data = F.classifier_input_json([[101, 7, 102], [101, 102], [101, 5, 6, 7, 102]], pad_id=0, group=2)["data"]
    assert [d["input_ids"]["shape"] for d in data] == [[3], [3], [5]]
    assert data[1]["input_ids"]["content"] == [101, 102, 0]
    assert data[1]["attention_mask"]["content"] == [1, 1, 0]
    assert data[2]["attention_mask"]["content"] == [1] * 5
    with pytest.raises(ValueError):
        F.classifier_input_json([])
    with pytest.raises(ValueError):
        F.classifier_input_json([[1], []])


def test_escalation_counts_routes_by_model():
    e = F.escalation(["classifier_fast", "classifier", "classifier", "empty", "chunked:classifier_fast:windows=1/3",
                      "chunked:classifier:degraded", "constant"])
    assert e == {"texts": 7, "empty": 1, "fast": 2, "accurate": 3, "other": 1, "e": 0.6}
    assert F.escalation(["empty"])["e"] is None


def test_the_cost_model_on_known_inputs():
    # c_fast 1 ms, c_accurate 4 ms, router_single 5 ms/text -> overhead 1 ms; e 0.25 -> 1 + 1 + 1 = 3 ms
    c = F.cost_model(t_fast=1000.0, t_accurate=250.0, t_single=200.0, t_router=300.0, e=0.25)
    assert c["c_fast"] == pytest.approx(0.001) and c["c_accurate"] == pytest.approx(0.004)
    assert c["overhead"] == pytest.approx(0.001)
    assert c["predicted"] == pytest.approx(1000.0 / 3)
    assert c["ratio"] == pytest.approx(0.9)
    with pytest.raises(ValueError):
        F.cost_model(0.0, 1.0, 1.0, 1.0, 0.5)
    with pytest.raises(ValueError):
        F.cost_model(1.0, 1.0, 1.0, 1.0, 1.5)


def test_the_per_stage_cost_model_on_known_inputs():
    # c_fast 1 ms, c_accurate 4 ms; escalating none 2 ms/text -> o_first 1 ms; escalating all 8 ms -> o_escalated 2 ms
    c = F.stage_cost_model(t_fast=1000.0, t_accurate=250.0, t_shares=[500.0, 125.0], t_router=270.0, e=0.25,
                           shares=(0.0, 1.0))
    assert c["o_first"] == pytest.approx(0.001) and c["o_escalated"] == pytest.approx(0.002)
    assert c["q_escalated"] == 0.0  # two shares fit a line
    assert c["predicted"] == pytest.approx(1000.0 / 3.5)  # 1 + 1 + 0.25 * (4 + 2) ms
    assert c["ratio"] == pytest.approx(270.0 * 0.0035)
    # the prediction is the time per text interpolated between the two routers
    assert 1 / c["predicted"] == pytest.approx(0.75 / 500.0 + 0.25 / 125.0)
    with pytest.raises(ValueError):
        F.stage_cost_model(1.0, 1.0, [0.0, 1.0, 1.0], 1.0, 0.5)
    with pytest.raises(ValueError):
        F.stage_cost_model(1.0, 1.0, [1.0, 1.0, 1.0], 1.0, -0.1)
    # the same router measured at 10%, 40% and 70% escalated (2 + s * 6 ms) gives the same parts, no curvature
    c2 = F.stage_cost_model(1000.0, 250.0, [1000.0 / 2.6, 1000.0 / 4.4, 1000.0 / 6.2], 270.0, 0.25)
    assert c2["o_first"] == pytest.approx(0.001) and c2["o_escalated"] == pytest.approx(0.002)
    assert c2["q_escalated"] == pytest.approx(0.0, abs=1e-12) and c2["predicted"] == pytest.approx(c["predicted"])
    # a router whose cost per text bends (2 + 6 s - 3 s^2 ms): the three shares recover the curvature and the
    # prediction at e is on the curve, where the line through 10% and 70% alone is 6% cheaper (3.11 against 3.31 ms)
    bent = [1000.0 / (2 + 6 * s - 3 * s * s) for s in F.ESCALATION_SHARES]
    c3 = F.stage_cost_model(1000.0, 250.0, bent, 270.0, 0.25)
    assert c3["q_escalated"] == pytest.approx(-0.003) and c3["o_escalated"] == pytest.approx(0.002)
    assert 1 / c3["predicted"] == pytest.approx((2 + 6 * 0.25 - 3 * 0.0625) / 1000.0)
    line = F.stage_cost_model(1000.0, 250.0, [bent[0], bent[2]], 270.0, 0.25, shares=(0.1, 0.7))
    assert line["q_escalated"] == 0.0 and 1 / line["predicted"] < 1 / c3["predicted"]
    for bad in ((0.5, 0.5, 0.5), (-0.1, 0.5, 0.7), (0.2, 0.5, 1.2), (0.1, 0.7)):
        with pytest.raises(ValueError, match="shares"):
            F.stage_cost_model(1.0, 1.0, [1.0, 1.0, 1.0], 1.0, 0.5, shares=bad)


def test_the_share_lists_mix_escalated_texts_into_fast_ones_at_each_share():
    routes = ["classifier_fast"] * 6 + ["classifier"] * 3 + ["empty"]
    low, high = F.share_lists(routes, (0.1, 0.7))
    assert len(low["texts"]) == len(high["texts"]) == 10
    assert low["share"] == 0.1 and high["share"] == 0.7
    assert set(low["texts"]) <= set(range(9)) and 9 not in high["texts"]  # never the empty text
    assert [routes[i] for i in high["texts"]].count("classifier") == 7
    assert F.share_lists(routes)[0]["share"] == F.ESCALATION_SHARES[0]
    with pytest.raises(ValueError):
        F.share_lists(["classifier_fast"] * 4, (0.1, 0.7))  # nothing escalated to mix in


def m(model, c, r, thr, p50, error=None):
    return {"model": model, "concurrency": c, "round": r, "throughput": thr, "p50_ms": p50, "p99_ms": 2 * p50, "error": error}


def rounds_of(n, ratio=0.9):
    out = []
    for r in range(n):
        out += [m("classifier_fast", 16, r, 1000.0, 10.0), m("classifier", 16, r, 250.0, 40.0),
                m("router_single", 16, r, 200.0, 50.0), m("router", 16, r, 1000.0 / 3 * ratio, 30.0),
                m("ensemble", 16, r, 250.0, 40.0), m("hand_bls", 16, r, 210.0, 48.0),
                m(F.LOW_SHARE, 16, r, 1000.0 / 2.5, 10.0), m(F.MID_SHARE, 16, r, 1000.0 / 4.0, 25.0),
                m(F.HIGH_SHARE, 16, r, 1000.0 / 5.5, 40.0),
                m("router_single", 1, r, 100.0, 10.0 + r * 0.01), m("hand_bls", 1, r, 110.0, 10.0),
                m("ensemble", 1, r, 100.0, 10.0), m("router", 1, r, 100.0, 10.0)]
    return out


def test_round_cost_models_and_summary_need_every_model_in_a_round():
    ms = rounds_of(3) + [m("classifier", 16, 3, 250.0, 40.0)]  # round 3 lacks the others
    rs = F.round_cost_models(ms, 0.25)
    assert [r["round"] for r in rs] == [0, 1, 2]
    s = F.cost_summary(ms, 0.25, (0.1, 0.4, 0.7))
    # per stage: 2.5 ms at 10%, 4 ms at 40%, 5.5 ms at 70%: slope 5 ms, o_first 2.5 - 0.5 - 1 = 1 ms,
    # o_escalated 5 - 4 = 1 ms, no curvature: 1 + 1 + 0.25 * 5 = 3.25 ms a text
    assert [r["round"] for r in F.round_stage_cost_models(ms, 0.25, (0.1, 0.4, 0.7))] == [0, 1, 2]
    with pytest.raises(ValueError, match="one per router"):
        F.round_stage_cost_models(ms, 0.25, (0.1, 0.7))
    assert s["shares"] == [0.1, 0.4, 0.7]
    assert s["median"] == {"c_fast_ms": 1.0, "c_accurate_ms": 4.0, "o_first_ms": 1.0, "o_escalated_ms": 1.0,
                           "q_escalated_ms": 0.0, "predicted": 307.7, "measured": 300.0}
    assert s["goal"]["per_round"] == [0.975] * 3
    assert s["line"]["median"] == s["median"] and s["line"]["goal"]["per_round"] == [0.975] * 3  # straight: the same
    old = s["one_constant"]
    assert old["median"] == {"c_fast_ms": 1.0, "c_accurate_ms": 4.0, "overhead_ms": 1.0, "predicted": 333.3, "measured": 300.0}
    assert old["goal"]["per_round"] == [0.9, 0.9, 0.9]
    assert s["router_vs_ensemble_c16"] == pytest.approx(1.2)
    assert F.cost_summary(ms, None)["median"] is None


def test_the_curvature_is_fitted_beside_the_line_through_the_ends():
    # 2.5 ms at 10%, 4.4 ms at 40% (the line: 4.0), 5.5 ms at 70%: the cost bends, so at e = 0.25 the curve
    # (3.55 ms a text) is dearer than the line (3.25 ms) and the router measured at 3.5 ms meets it
    ms = [x for x in rounds_of(3) if x["model"] not in (F.MID_SHARE, "router")]
    ms += [m(F.MID_SHARE, 16, r, 1000.0 / 4.4, 25.0) for r in range(3)] + [m("router", 16, r, 1000.0 / 3.5, 30.0) for r in range(3)]
    s = F.cost_summary(ms, 0.25, (0.1, 0.4, 0.7))
    assert s["median"]["q_escalated_ms"] == pytest.approx(-4.444, abs=1e-3)  # 0.4 ms over the line at 40%: -0.4 / 0.3^2
    curve, line = s["goal"]["per_round"][0], s["line"]["goal"]["per_round"][0]
    assert line == round(3.25 / 3.5, 3) and curve == round(3.55 / 3.5, 3) and curve > line
    assert s["line"]["median"]["q_escalated_ms"] == 0.0
    text = "\n".join(F.render_floor({**results(3), "measurements": ms, "cost": s}))
    assert "| line (10% and 70% only) | 1.0 | 4.0 | 0.25 | 1.0 + e * 1.0 | 307.7 | 285.7 | 0.929x |" in text
    assert "+ e^2 * -4.444 |" in text and "The line through the lowest and highest share alone" in text


def test_a_run_is_summarized_again_without_measuring(tmp_path):
    import json

    r = results()
    r["shares"] = [0.1, 0.4, 0.7]
    r["cost"] = {"e": 0.25}  # as an older checkout left it: summarized again from the measurements
    (tmp_path / "floor.json").write_text(json.dumps(r))
    out = F.summarize(tmp_path / "floor.json", tmp_path / "docs", "python -m lab.bench.instances --summarize X")
    assert out["cost"]["median"]["predicted"] == 285.7 and out["measurements"] == r["measurements"]  # e 0.3: 3.5 ms
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "Summarized again by `python -m lab.bench.instances --summarize X`" in page
    assert json.loads((tmp_path / "docs" / "bench" / "floor.json").read_text())["summarized"].endswith("--summarize X")


def test_pair_ratios_leave_out_failures_and_unpaired_rounds():
    ms = [m("a", 1, 0, 10.0, 2.0), m("b", 1, 0, 5.0, 1.0), m("a", 1, 1, 10.0, 2.0), m("b", 1, 1, 5.0, 1.0, error="x"),
          m("a", 1, 2, 9.0, 3.0)]
    assert F.pair_ratios(ms, "a", "b", 1, "p50_ms") == [2.0]
    assert F.pair_ratios(ms, "a", "b", 16, "p50_ms") == []


def test_decisions_at_least_and_at_most():
    assert F.judge_at_least((1.0, 0.96, 1.1), 0.95) == "met"
    assert F.judge_at_least((0.9, 0.85, 0.94), 0.95) == "not met"
    assert F.judge_at_least((0.95, 0.9, 1.0), 0.95) == "not decided"
    assert F.judge_at_least(None, 0.95) == "not decided"
    met = F.decide([1.0, 1.01, 1.02, 0.99, 1.0, 1.01, 1.0, 1.02], 1.05, at_most=True)
    assert met["verdict"] == "met" and met["rounds_needed"] is None and met["n"] == 8
    few = F.decide([1.0, 1.01, 1.02], 1.05, at_most=True)  # under 6 rounds: no interval
    assert few["verdict"] == "not decided" and few["low"] is None and few["rounds_needed"] == 6
    wide = F.decide([0.9, 1.0, 1.1, 0.95, 1.05, 1.2, 0.97, 1.03], 1.06, at_most=True)
    assert wide["verdict"] == "not decided" and wide["rounds_needed"] > 8
    # never fewer rounds than the run had: they did not decide it
    assert F.rounds_to_decide([1.09, 2.16, 1.24, 1.21, 1.18, 1.33, 0.89, 1.32, 1.08, 1.0], 1.05, True) > 10
    assert F.rounds_to_decide([1.0, 1.0], 1.0, True) is None  # the median on the goal: never
    assert F.rounds_to_decide([1.0], 2.0, True) is None


def test_the_floor_goals_read_router_single_over_hand_bls():
    g = F.floor_goals(rounds_of(8))
    assert g["p50_c1"]["per_round"][0] == 1.0 and g["p50_c1"]["verdict"] == "met"  # at most 1.007 <= 1.05
    assert g["throughput_c16"]["median"] == pytest.approx(0.952, abs=1e-3)  # 200 / 210
    assert g["throughput_c16"]["verdict"] == "met"


def test_the_goals_alone_pair_the_two_models_in_alternating_order_and_judge_what_was_measured():
    specs = G.goals_plan(3, (16,))
    assert [(s.model, s.concurrency, s.round) for s in specs] == [
        ("router_single", 16, 0), ("hand_bls", 16, 0), ("hand_bls", 16, 1), ("router_single", 16, 1),
        ("router_single", 16, 2), ("hand_bls", 16, 2)]
    assert [(s.model, s.concurrency) for s in G.goals_plan(1)] == [
        ("router_single", 1), ("hand_bls", 1), ("router_single", 16), ("hand_bls", 16)]
    assert [s.model for s in G.goals_plan(2, (1,), also=("router_single_no_metrics",))] == [
        "router_single", "router_single_no_metrics", "hand_bls", "hand_bls", "router_single_no_metrics", "router_single"]
    both = rounds_of(8) + [m("router_single_no_metrics", 1, r, 100.0, 9.0) for r in range(8)]
    v = G.variant_ratios(both, ("router_single_no_metrics",), (1,))
    assert list(v) == ["router_single_no_metrics"] and list(v["router_single_no_metrics"]) == ["p50_c1"]
    assert v["router_single_no_metrics"]["p50_c1"]["per_round"] == [0.9] * 8
    only16 = [m for m in rounds_of(8) if m["concurrency"] == 16]
    goals = G.goals_of(only16, (16,))
    assert list(goals) == ["throughput_c16"] and goals["throughput_c16"]["verdict"] == "met"
    text = G.render_goals({"rounds": 8, "command": "python -m lab.bench.instances --compare floor --goals-only",
                           "floor_goals": goals})
    assert "throughput_c16: median 0.952x over 8 rounds" in text and "**met**" in text


def test_load_summary_ratios_to_postprocess_and_goal():
    recs = [{"model": "postprocess", "seconds": s} for s in (1.0, 2.0, 3.0)] + \
           [{"model": "router", "seconds": s} for s in (3.0, 4.0, 5.0)] + [{"model": "tokenizer", "seconds": 2.8}]
    s = F.load_summary(recs)
    assert s["postprocess"] == {"median_s": 2.0, "min_s": 1.0, "max_s": 3.0, "n": 3, "vs_postprocess": 1.0}
    assert s["router"]["vs_postprocess"] == 2.0 and s["router"]["met"] is False
    assert s["tokenizer"]["vs_postprocess"] == 1.4 and s["tokenizer"]["met"] is True


def test_read_repair_from_a_soak_report(tmp_path):
    path = tmp_path / "report.json"
    assert F.read_repair(path) is None
    path.write_text(json.dumps({"command": "python -m lab.soak", "date_utc": "d", "machine": {"loadavg": [1, 2, 3]}}))
    assert F.read_repair(path) is None  # a report from before the downtime was recorded
    path.write_text(json.dumps({"command": "c", "date_utc": "d", "machine": {"loadavg": [1, 2, 3]},
                                "router_repair": {"reload_s": 6.0, "first_answer_after_s": 0.5, "downtime_s": 1.2, "errors": 0}}))
    assert F.read_repair(path)["downtime_s"] == 1.2 and F.read_repair(path)["loadavg"] == [1, 2, 3]


def results(n=8):
    ms = rounds_of(n)
    return {"command": F.COMMAND, "started_utc": "2026-01-01 00:00", "machine": {"cores": 2, "cpu_model": "cpu"},
            "load_before": [1.0, 2.0, 3.0], "load_max_during": 4.0, "rounds": n, "window_ms": 1000, "quick": False,
            "stack": None, "measurements": ms + [m("router", 1, 0, 1.0, 1.0, error="boom")],
            "escalation": {"texts": 10, "empty": 0, "fast": 7, "accurate": 3, "other": 0, "e": 0.3},
            "floor_goals": F.floor_goals(ms), "cost": F.cost_summary(ms, 0.25),
            "load_time": {"rounds": 3, "load_during": [1.0, 2.0], "summary": F.load_summary(
                [{"model": "postprocess", "seconds": 2.0}, {"model": "router", "seconds": 2.5}])},
            "repair": {"source": "r.json", "command": "python -m lab.soak --short", "date_utc": "d", "loadavg": [1, 1, 1],
                       "reload_s": 6.0, "first_answer_after_s": 0.5, "downtime_s": 1.2, "errors": 0}}


def test_the_section_is_kept_and_reports_every_part():
    assert (FLOOR_START, FLOOR_END) in KEPT_SECTIONS
    text = F.render_section(results())
    assert text.startswith(FLOOR_START) and text.endswith(FLOOR_END)
    for needle in ("| 1 | `router_single` |", "| 16 | `hand_bls` |", "p50 at c=1 at most 1.05x", "**met**",
                   "| per stage | 1.0 | 4.0 | 0.25 | 1.0 + e * 1.0 | 307.7 | 300.0 | 0.975x |",
                   "| one constant | 1.0 | 4.0 | 0.25 | 1.0 | 333.3 | 300.0 | 0.9x |",
                   "The model before the parts (one constant), not judged: 0.9x", "Router / ensemble throughput at c=16",
                   "| `router` | 2.5 |", "1.25x", "**1.2 s**", "goal at most 3 s **met**", "1 measurement(s) failed",
                   "load average [1.0, 2.0, 3.0] before"):
        assert needle in text, needle


def test_the_section_says_what_is_undecided_and_what_is_missing():
    r = results(3)
    r.update(load_time=None, repair=None)
    text = F.render_section(r)
    assert "none (under 6 rounds)" in text and "**not decided**" in text and "about 6 rounds would decide it" in text
    assert "Load time not measured" in text and "no soak report" in text


def test_no_prediction_when_the_cost_is_not_positive():
    c = F.cost_model(t_fast=1000.0, t_accurate=100.0, t_single=1000.0, t_router=300.0, e=0.0)  # overhead -9 ms
    assert c["predicted"] is None and c["ratio"] is None
    assert F.classifier_input_json([[1, 2, 3], [1]])["data"][1]["input_ids"]["shape"] == [1]  # default: unpadded


def test_the_soak_measures_the_router_reload_downtime():
    from lab.soak.ledger import Record
    from lab.soak.report import router_repair
    from lab.soak.workload import RequestSpec

    def rec(sent, done, outcome="ok"):
        return Record(RequestSpec(f"r{sent}", (0,), (0.5,), None, "http"), "router_reload", frozenset(), sent, done, outcome)

    assert router_repair([], None)["downtime_s"] is None
    # reload sent at 10, returned at 16; answers at 10.5, 12.0 (a 1.5 s gap), 15.0 (3.0 s), the first
    # request sent after the return answered at 16.4; one error meanwhile
    records = [rec(9.0, 10.5), rec(11.0, 12.0), rec(11.5, 15.0), rec(12.0, 12.5, "error"), rec(16.1, 16.4), rec(17.0, 17.2)]
    r = router_repair(records, (10.0, 16.0))
    assert r == {"reload_s": 6.0, "first_answer_after_s": 0.4, "downtime_s": 3.0, "errors": 1}
    assert router_repair([rec(9.0, 10.5)], (10.0, 16.0)) == {"reload_s": 6.0, "first_answer_after_s": None,
                                                             "downtime_s": None, "errors": None}



def test_the_servers_split_of_a_request_is_execute_less_the_downstream_time():
    before = {"router_single": {"count": 10, "queue": 5, "compute_input": 1, "compute_infer": 1_000_000, "compute_output": 2},
              "classifier": {"count": 10, "queue": 100, "compute_input": 200, "compute_infer": 300_000, "compute_output": 400}}
    after = {"router_single": {"count": 110, "queue": 9, "compute_input": 3, "compute_infer": 201_000_000, "compute_output": 7},
             "classifier": {"count": 110, "queue": 1_000_100, "compute_input": 1_000_200, "compute_infer": 100_300_000,
                            "compute_output": 1_000_400}}
    # 100 requests: execute 200 ms in all (2000 us each); the classifier 1 + 1 + 100 + 1 ms (1030 us each)
    assert F.server_split(before, after, "router_single") == {"requests": 100, "execute_us": 2000.0, "downstream_us": 1030.0,
                                                              "own_us": 970.0}
    assert F.server_split(before, before, "router_single") is None  # no request between them


def test_the_split_summary_pairs_the_rounds_and_renders():
    def m(model, r, own, c=1):
        return {"model": model, "round": r, "concurrency": c,
                "server_split": {"requests": 100, "execute_us": own + 1000, "downstream_us": 1000.0, "own_us": own}}

    ms = [m("router_single", r, 600.0 + r) for r in range(8)] + [m("hand_bls", r, 400.0) for r in range(7)]
    ms += [m("router_single", 0, 5000.0, c=16), {"model": "hand_bls", "round": 7, "concurrency": 1, "error": "x"}]
    s = F.split_summary(ms)
    assert s["models"]["router_single"] == {"execute_us": 1603.5, "downstream_us": 1000.0, "own_us": 603.5}
    assert s["models"]["hand_bls"]["own_us"] == 400.0
    d = s["own_difference_us"]
    assert d["n"] == 7 and d["per_round"] == [200.0 + r for r in range(7)] and d["median"] == 203.0  # round 7: no pair
    assert d["low"] is not None and d["low"] <= 203.0 <= d["high"]
    lines = "\n".join(F.render_split({"server_split": s}))
    assert "| `router_single` | 1603.5 | 1000.0 | 603.5 |" in lines and "median 203.0 us" in lines
    assert F.render_split({"server_split": F.split_summary([])}) == [] and F.render_split({}) == []
