"""The pure parts of the tune check (``lab.bench.tune_check``): the choice of margins, the
router variant at a margin, the arithmetic of each point against tune's overhead and the
overheads measured at the other margins, the verdict and the section."""

from __future__ import annotations

import argparse
import json

import pytest

from lab.bench import tune_check as C
from lab.bench.plan import REPO, BenchError
from lab.bench.report import KEPT_SECTIONS, TUNE_CHECK_END, TUNE_CHECK_START, write_kept_outputs
from orchestrator.runtime.routing import policy as P
from orchestrator.tooling import tune as T
from orchestrator.tooling.repository import copy_model, read_config


def curve(rates):
    """Tune's points at margins 0, 0.005, ... with these escalation rates (two stages)."""
    return [{"margin": round(0.005 * i, 3), "escalation_rate": e, "reach": [1.0, e]} for i, e in enumerate(rates)]


def test_within_is_fifteen_percent_either_way():
    assert C.TOLERANCE == 0.15
    assert C.within(1.0) and C.within(0.85) and C.within(1.15)
    assert not C.within(0.849) and not C.within(1.151) and not C.within(0.31)


def test_the_chosen_margin_then_those_nearest_the_shares():
    pts = curve([0.0, 0.1, 0.15, 0.21, 0.3, 0.4, 0.55, 0.62, 0.7, 0.9])
    assert C.choose_margins(pts, 0.02) == [(0.02, "chosen"), (0.015, "near 0.2"), (0.035, "near 0.6")]
    # given the shares, a chosen point at 0.2's own rate: the next nearest rate, not the same one again
    pts = curve([0.0, 0.2, 0.2, 0.25, 0.6])
    assert C.choose_margins(pts, 0.005) == [(0.005, "chosen"), (0.015, "near 0.2"), (0.02, "near 0.6")]
    # ties: the smaller margin
    assert C.choose_margins(curve([0.125, 0.375, 0.625]), 0.01, shares=(0.25,)) == [(0.01, "chosen"), (0.0, "near 0.25")]
    # every rate alike: still distinct margins
    assert [m for m, _ in C.choose_margins(curve([0.5] * 4), 0.0)] == [0.0, 0.005, 0.01]
    with pytest.raises(BenchError, match="0.0123 is not a margin tune sweeps"):
        C.choose_margins(pts, 0.0123)


def test_given_margins_must_be_swept_distinct_and_at_least_two():
    pts = curve([0.0, 0.2, 0.4, 0.6])
    assert C.given_margins(pts, [0.015, 0.005], chosen=0.005) == [(0.015, "given"), (0.005, "chosen")]
    with pytest.raises(BenchError, match=r"0.007 is not a margin tune sweeps \(0 to 0.015 in steps of 0.005\)"):
        C.given_margins(pts, [0.005, 0.007], 0.0)
    with pytest.raises(BenchError, match="given twice"):
        C.given_margins(pts, [0.005, 0.005], 0.0)
    with pytest.raises(BenchError, match="at least two"):
        C.given_margins(pts, [0.005], 0.0)
    # tune's own grid: every margin it sweeps is accepted
    grid = [{"margin": m, "escalation_rate": 0.0, "reach": [1.0, 0.0]} for m in T.MARGINS]
    assert C.given_margins(grid, [0.295, 0.1, 0.45], 0.295)[0] == (0.295, "chosen")


def test_a_variant_serves_the_shipped_policy_at_another_margin(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_model(REPO / "router", repo / "router")
    name = C.write_margin_variant(repo, "cascade", 0.1)
    assert name == "router_margin_0_1" == C.variant_name(0.1)
    assert read_config(repo / name / "config.pbtxt").name == name
    (cascade,) = T.cascades(P.load_policy(repo / name / "policy.yaml"))
    assert cascade.name == "cascade" and cascade.margin == 0.1
    before = (repo / "router" / "policy.yaml").read_text().splitlines()
    after = (repo / name / "policy.yaml").read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and len(changed) == 1  # tune's editor: only the margin's line
    assert changed[0][1].strip() == "margin: 0.1  # lab.bench.tune_check: operating point 0.1"
    with pytest.raises(BenchError, match="no cascade node named 'nope'"):
        C.write_margin_variant(repo, "nope", 0.2)


def loop(throughput, requests=100, errors=0, model="router_margin_x"):
    return {"model": model, "throughput": throughput, "requests": requests, "errors": errors, "first_error": None}


COSTS = [0.002, 0.006]  # the fast stage 2 ms per text, the accurate one 6 ms
# tune's fit: 1 ms per text and 2 ms more per escalated text; the one constant its chosen run implied
TUNE_O = {"parts_s": [0.001, 0.002], "constant_s": 0.0015, "constant_margin": 0.3}


def two_points(measured_at_01=200.0):
    return [{"margin": 0.3, "role": "chosen", "escalation_rate": 0.5, "reach": [1.0, 0.5], "router": loop(1 / 0.007)},
            {"margin": 0.1, "role": "near 0.2", "escalation_rate": 0.2, "reach": [1.0, 0.2], "router": loop(measured_at_01)}]


def test_each_point_against_tunes_fitted_overhead_the_one_constant_and_each_other_points():
    chosen, other = C.checks(two_points(), COSTS, TUNE_O)
    # the chosen point: o = 1 + 0.5 * 2 = 2 ms, stages 2 + 0.5 * 6 = 5 ms: predicted 1 / 7 ms
    assert chosen["tune"]["overhead_s"] == pytest.approx(0.002) and chosen["tune"]["ratio"] == pytest.approx(1.0)
    assert chosen["tune"]["within"] is True and chosen["implied_overhead_s"] == pytest.approx(0.002)
    # the other: o = 1 + 0.2 * 2 = 1.4 ms, stages 3.2 ms: predicted 1 / 4.6 ms = 217.4, measured 200
    assert other["tune"]["predicted"] == pytest.approx(1 / 0.0046) and other["tune"]["ratio"] == pytest.approx(200 * 0.0046)
    assert other["implied_overhead_s"] == pytest.approx(0.005 - 0.0032)  # 1/200 less its stages there
    # the one constant (1.5 ms, implied by tune's run at 0.3): repeats at 0.3, a check of the old model at 0.1
    assert chosen["constant"]["same_margin"] is True and chosen["constant"]["ratio"] == pytest.approx(0.0065 / 0.007)
    assert other["constant"]["same_margin"] is False and other["constant"]["ratio"] == pytest.approx(200 * 0.0047)
    # each against the other's implied overhead
    (a,) = chosen["others"]
    assert a["overhead_margin"] == 0.1 and a["overhead_s"] == pytest.approx(0.0018)
    assert a["predicted"] == pytest.approx(1 / 0.0068) and a["ratio"] == pytest.approx(0.0068 / 0.007)
    (b,) = other["others"]
    assert b["overhead_margin"] == 0.3 and b["predicted"] == pytest.approx(1 / 0.0052)
    assert (chosen["measured"], chosen["requests"], chosen["errors"]) == (pytest.approx(1 / 0.007), 100, 0)
    # without tune's run of the chosen point there is no constant to compare with
    assert all("constant" not in r for r in C.checks(two_points(), COSTS, {"parts_s": [0.001, 0.002]}))


def test_a_point_not_measured_is_no_one_elses_overhead():
    points = two_points()
    points[1]["router"] = {**loop(0.0, requests=0, errors=3), "first_error": "InferenceServerException: boom"}
    ok, bad = C.checks(points, COSTS, TUNE_O)
    assert bad["error"] == "InferenceServerException: boom" and "tune" not in bad and "others" not in bad
    assert ok["others"] == []
    v = C.verdict([ok, bad])
    assert v["verdict"] == "not decided" and v["unmeasured_margins"] == [0.1]


def test_the_verdict_judges_the_fitted_model_at_every_point_and_counts_the_constant_beside_it():
    points = two_points() + [{"margin": 0.4, "role": "near 0.6", "escalation_rate": 0.6, "reach": [1.0, 0.6],
                              "router": loop(1 / 0.0082)}]  # o = 2.2 ms, stages 5.6 ms: exactly as predicted
    v = C.verdict(C.checks(points, COSTS, TUNE_O))
    assert (v["checks"], v["within"], v["verdict"]) == (3, 3, "met")
    # the constant at 0.1 and 0.4, and each point against the two others: 2 + 6, none at its own margin
    assert v["constant"]["checks"] == 8
    points[1]["router"] = loop(100.0)  # half the prediction at 0.1
    v = C.verdict(C.checks(points, COSTS, TUNE_O))
    assert v["verdict"] == "not met" and (v["checks"], v["within"]) == (3, 2)
    assert C.verdict([])["verdict"] == "not decided"


def results(duration=5.0, concurrency=16):
    rows = C.checks(two_points(measured_at_01=100.0), COSTS, TUNE_O)
    return {"command": C.COMMAND, "started_utc": "2026-01-01 00:00", "machine": {"cores": 2, "cpu_model": "x"},
            "load_before": [1.0, 1.0, 1.0], "load_max_during": 3.5, "concurrency": concurrency, "duration_s": duration, "warmup_s": 10.0,
            "data": "split:validation", "target": "noninferior:0.5", "texts": 1936, "tolerance": 0.15,
            "cascade": "cascade", "stages": ["classifier_fast", "classifier"], "stage_costs_s": COSTS,
            "tune": {**TUNE_O, "margin": 0.3, "chosen_margin": 0.3,
                     "lists": [{"share": 0.1, "throughput": 300.0}, {"share": 0.7, "throughput": 150.0}],
                     "chosen_run": {"throughput": 140.0, "predicted_throughput": 142.857, "measured_over_predicted": 0.98}},
            "points": rows, "verdict": C.verdict(rows)}


def test_the_section_renders_each_point_and_the_verdict_and_is_kept_across_runs(tmp_path):
    r = results()
    text = C.render_section(r)
    assert text.startswith(TUNE_CHECK_START) and text.endswith(TUNE_CHECK_END)
    assert (TUNE_CHECK_START, TUNE_CHECK_END) in KEPT_SECTIONS
    assert "load average [1.0, 1.0, 1.0] before, highest 3.5 during" in text and "16 clients for 5 s" in text
    assert "each router first warmed by 10 s of the same loop, untimed" in text
    assert "Short loops" not in text
    assert "`classifier_fast` 2.000 ms, `classifier` 6.000 ms" in text
    assert "o = 1.000 + e_2 * 2.000 ms per text, fitted" in text and "(10% escalated: 300.0 texts/s; 70% escalated" in text
    assert "chosen margin 0.3" in text and "measured/predicted 0.98" in text and "o = 1.500 ms." in text
    assert "| 0.3 | chosen | 0.500 | 2.000 | 142.9 | 142.9 | 1.000 | yes | 0.929 (same margin: repeats) | 2.000 |" in text
    assert "| 0.1 | near 0.2 | 0.200 | 1.400 | 217.4 | 100.0 | 0.460 | **no** | 0.470 | 6.800 |" in text
    assert "| 0.3 | 0.1 | 6.800 | 84.7 | 142.9 | 1.686 | **no** |" in text
    assert "| 0.1 | 0.3 | 2.000 | 192.3 | 100.0 | 0.520 | **no** |" in text
    assert "1 of 2 points: **not met**" in text and "(the model before the parts): 0 of 3 checks" in text
    assert "Short loops" in C.render_section(results(duration=1.0, concurrency=2))
    write_kept_outputs(tmp_path, "tune_check", r, text, TUNE_CHECK_START, TUNE_CHECK_END)
    write_kept_outputs(tmp_path, "tune_check", r, text, TUNE_CHECK_START, TUNE_CHECK_END)  # replaced, not appended
    assert (tmp_path / "benchmarks.md").read_text().count(TUNE_CHECK_START) == 1
    assert json.loads((tmp_path / "bench" / "tune_check.json").read_text())["verdict"]["verdict"] == "not met"


def test_a_point_not_measured_shows_in_the_section():
    r = results()
    r["points"][1] = {"margin": 0.1, "role": "near 0.2", "escalation_rate": 0.2, "reach": [1.0, 0.2], "measured": 0.0,
                      "requests": 0, "errors": 3, "error": "boom"}
    r["points"][0]["others"] = []
    r["verdict"] = C.verdict(r["points"])
    text = C.render_section(r)
    assert "| 0.1 | near 0.2 | 0.200 | n/a | n/a | not measured: boom |" in text
    assert "not decided (not measured: margins 0.1)" in text


def test_the_command_shows_what_differs_from_the_defaults():
    def ns(**kw):
        base = dict(margins=None, concurrency=16, duration=5.0, data=C.DATA, target=C.TARGET, long_texts=None, warmup=10.0)
        return argparse.Namespace(**{**base, **kw})

    assert C.command_line(ns()) == C.COMMAND
    assert C.command_line(ns(margins=[0.295, 0.1, 0.45], duration=1.0, concurrency=2, data="a b.tsv", warmup=0.0)) == (
        "python -m lab.bench.tune_check --margins 0.295 0.1 0.45 --concurrency 2 --duration 1 --data 'a b.tsv' --warmup 0")


def test_the_results_page_gives_the_command_with_its_defaults():
    from orchestrator.tooling import tune_throughput as TT
    from tests.helpers import ROOT

    text = " ".join((ROOT / "docs" / "results" / "benchmarks.md").read_text(encoding="utf-8").split())
    start = text.index("**`orchestrator tune --url` within 15% of what it then measures**")
    item = text[start:start + 1500]  # the goals list's item (whitespace joined)
    assert "`make bench-tune-check BENCH_OUT=docs/results` (`python -m lab.bench.tune_check`:" in item
    shares = " and ".join(f"{round(100 * s)}%" for s in C.SHARES)
    assert f"escalating nearest {shares} of the texts" in item
    assert f"{TT.CONCURRENCY} clients for {TT.DURATION_S:g} s" in item and f"within {100 * C.TOLERANCE:g}% or not" in item
    lists = " and ".join(f"{round(100 * s)}%" for s in TT.OVERHEAD_SHARES)
    assert f"two lists of the tuning texts, {lists} of them escalated at the served margin" in text
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "bench-tune-check: $(STAMP)\n\t$(PY) -m lab.bench.tune_check --out $(BENCH_OUT) $(BENCH_ARGS)\n" in makefile


def test_the_texts_measured_are_tunes_data_in_its_order(tmp_path):
    data = tmp_path / "val.tsv"
    data.write_text("label\ttext\n1\tgreat film\n0\tdull and long\n1\tloved it\n")
    assert C.tuning_texts(REPO / "router" / "policy.yaml", REPO, str(data)) == ["great film", "dull and long", "loved it"]
