"""Tests of lab.bench: input data, perf_analyzer CSV/export parsing, ratios, goals,
the benchmark repository, the report, and one real perf_analyzer run against the embedded
server (skipped, with the reason, only when perf_analyzer cannot be installed)."""

from __future__ import annotations

import json

import pytest
import yaml

from lab.bench.cli import main
from lab.bench.goals import compute_ratios, evaluate_goals, paired_ratios, ratio
from lab.bench.measurement import (
    accuracy_summary,
    combine_rounds,
    expected_latency_ms,
    input_data_json,
    latency_summary,
    length_sets,
    write_input_data,
)
from lab.bench.perf_analyzer import parse_perf_csv, perf_analyzer_command, window_stats
from lab.bench.plan import GRID_MODELS, GRID_ROUNDS, SINGLE_CLASSIFIER_ROOT, BenchError, PASettings, Spec, bench_plan
from lab.bench.report import WHAT_WE_TRIED_END, WHAT_WE_TRIED_START, render_report
from lab.bench.run import write_outputs
from lab.bench.variants import make_bench_repository
from orchestrator.tooling.repository import check_repository, get_parameter, read_config
from tests.helpers import bench_grid, bench_results

# Recorded from a real run here: perf_analyzer 2.41.0 -f against `ensemble` (gRPC, c=1),
# then with --verbose-csv (adds Avg latency, request/response, response wait) at c=2, b=4.
RECORDED_CSV = """\
Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency
1,188.322,6,0,2,65,3888,1767,3,4403,8176,9570,16064
"""
RECORDED_VERBOSE_CSV = """\
Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency,request/response,response wait
2,228.803,7,15176,2,75,18050,1518,3,32498,59407,63998,80109,34833,10,34791
"""


# ---------------------------------------------------------------------------------------
# input data


def test_input_data_json_one_entry_per_text_with_batch1_shapes():
    texts = ["A gorgeous, witty film.", "Pas mal du tout — ünïcode ✓", 'quotes " and \\ backslash']
    doc = input_data_json(texts, threshold=0.5)
    assert len(doc["data"]) == 3
    for entry, text in zip(doc["data"], texts):
        assert entry == {"TEXT": {"content": [text], "shape": [1]}, "THRESHOLD": {"content": [0.5], "shape": [1]}}


def test_write_input_data_round_trips_utf8(tmp_path):
    texts = ["naïve ☕ review", "second"]
    path = write_input_data(tmp_path / "in.json", texts, threshold=0.25)
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert [e["TEXT"]["content"][0] for e in doc["data"]] == texts
    assert {e["THRESHOLD"]["content"][0] for e in doc["data"]} == {0.25}


@pytest.mark.parametrize("texts, threshold", [([], 0.5), (["x"], 1.5), (["x"], -0.1)])
def test_input_data_json_rejects_bad_input(texts, threshold):
    with pytest.raises(ValueError):
        input_data_json(texts, threshold)


def test_length_sets_select_by_tokens_and_join_long_texts():
    texts = [f"t{i}" for i in range(10)]
    lengths = [10, 60, 12, 100, 100, 8, 50, 140, 20, 90]
    bounds = {"short": (1, 16), "medium": (48, 128), "long": (200, 300)}
    sets = length_sets(texts, lengths, n=2, bounds=bounds)
    assert sets["short"] == ["t0", "t2"]  # first n within bounds, in order
    assert sets["medium"] == ["t1", "t3"]
    # joins consecutive texts until >= 200 tokens (2 shared special tokens per join)
    assert sets["long"] == ["t0 t1 t2 t3 t4", "t5 t6 t7 t8"]
    for joined in sets["long"]:
        parts = joined.split()
        total = sum(lengths[int(p[1:])] for p in parts) - 2 * (len(parts) - 1)
        assert 200 <= total <= 300


def test_length_sets_drop_joins_over_the_upper_bound_and_refuse_empty_sets():
    bounds = {"short": (1, 100), "medium": (1, 500), "long": (100, 200)}
    texts = ["t0", "t1", "t2", "t3", "t4"]
    sets = length_sets(texts, [60, 60, 150, 60, 60], n=5, bounds=bounds,
                             join_length=lambda t: 300 if "t2" in t else 118)  # the tokenizer's count decides
    assert sets["long"] == ["t0 t1", "t3 t4"]
    with pytest.raises(ValueError, match="long"):
        length_sets(["a", "b", "c"], [10, 400, 10], n=5, bounds=bounds)


# ---------------------------------------------------------------------------------------
# perf_analyzer output


def test_parse_perf_csv_recorded_sample_in_ms():
    (row,) = parse_perf_csv(RECORDED_CSV)
    assert row["concurrency"] == 1
    assert row["throughput"] == pytest.approx(188.322)
    assert (row["p50_ms"], row["p90_ms"], row["p95_ms"], row["p99_ms"]) == pytest.approx((4.403, 8.176, 9.570, 16.064))
    assert row["avg_ms"] is None
    assert row["components_us"]["Server Compute Infer"] == 3888


def test_parse_perf_csv_verbose_and_trailing_sections():
    text = RECORDED_VERBOSE_CSV + "\nServer metrics\nGPU,Utilization\n"
    (row,) = parse_perf_csv(text)
    assert row["avg_ms"] == pytest.approx(34.833)
    assert row["throughput"] == pytest.approx(228.803)


@pytest.mark.parametrize("text", ["", "Concurrency,Inferences/Second\n1,3\n", RECORDED_CSV.splitlines()[0] + "\n"])
def test_parse_perf_csv_errors(text):
    with pytest.raises(BenchError):
        parse_perf_csv(text)


def test_window_stats_counts_completions_per_window():
    s = 1_000_000_000  # ns
    export = {"experiments": [{
        "experiment": {"mode": "concurrency", "value": 1},
        "window_boundaries": [0, s, 2 * s],
        "requests": [
            {"timestamp": 0, "response_timestamps": [10_000_000]},            # 10 ms, window 0
            {"timestamp": 10_000_000, "response_timestamps": [30_000_000]},   # 20 ms, window 0
            {"timestamp": s - 5_000_000, "response_timestamps": [s + 5_000_000]},  # window 1
            {"timestamp": s + 10_000_000, "response_timestamps": []},          # never answered
        ],
    }]}
    w = window_stats(export, batch_size=4)
    assert w["windows"] == 2
    assert w["window_throughput"] == pytest.approx([8.0, 4.0])
    assert w["window_p50_ms"] == pytest.approx([15.0, 10.0])
    assert w["throughput_spread_pct"] == pytest.approx(100.0)
    with pytest.raises(BenchError):
        window_stats({"experiments": []})


def test_perf_analyzer_command_has_the_benchmark_flags():
    spec = Spec("grid", "router", "held_out", 16, 4)
    cmd = perf_analyzer_command("/x/perf_analyzer", spec, "127.0.0.1:9", "in.json", "o.csv", "o.json",
                                      PASettings(measurement_interval_ms=3000, stability_percentage=20, max_trials=5))
    joined = " ".join(cmd)
    for part in ("-m router", "-u 127.0.0.1:9", "-i grpc", "--input-data in.json", "-b 4", "--concurrency-range 16",
                 "--measurement-interval 3000", "--stability-percentage 20", "--max-trials 5", "-f o.csv",
                 "--profile-export-file o.json"):
        assert part in joined
    cmd = perf_analyzer_command("pa", spec, "u", "i", "c", "e", PASettings(), stability=("1000", "3"), interval_ms=777)
    assert "--stability-percentage 1000 --max-trials 3" in " ".join(cmd) and "--measurement-interval 777" in " ".join(cmd)


def test_window_length_grows_with_latency_within_bounds():
    s = PASettings(measurement_interval_ms=3000, latencies_per_window=10, max_interval_ms=10000)
    assert s.interval_for(None) == 3000
    assert s.interval_for(100.0) == 3000
    assert s.interval_for(500.0) == 5000
    assert s.interval_for(5000.0) == 10000


def test_expected_latency_from_littles_law_then_warmup():
    spec = Spec("grid", "m", "d", 16)
    done = [{"model": "m", "dataset": "d", "batch_size": 1, "concurrency": 1, "throughput": 100.0, "p50_ms": 9.0, "error": None}]
    assert expected_latency_ms(spec, done, {}) == pytest.approx(160.0)
    assert expected_latency_ms(spec, [], {("m", "d"): 5.0}) == pytest.approx(80.0)
    assert expected_latency_ms(spec, [], {}) is None


def test_bench_plan_covers_grid_and_sweeps():
    plan = bench_plan()
    grid = [s for s in plan if s.section == "grid"]
    assert {(s.model, s.concurrency) for s in grid} == {(m, c) for m in GRID_MODELS for c in (1, 4, 16)}
    n = len(GRID_MODELS)
    assert [s.model for s in grid[:n]] == list(GRID_MODELS)  # interleaved within a concurrency
    for c in (1, 4, 16):  # rounds: every model once per round, rounds back to back
        level = [(s.round, s.model) for s in grid if s.concurrency == c]
        rounds = GRID_ROUNDS.get(c, 1)
        assert level == [(r, m) for r in range(rounds) for m in GRID_MODELS]
    assert GRID_ROUNDS[1] >= 3
    quick = [s for s in bench_plan(quick=True) if s.section == "grid"]
    assert len(quick) == len(GRID_MODELS) * 3 and {s.round for s in quick} == {0}
    assert {s.dataset for s in plan if s.section == "length"} == {"short", "medium", "long"}
    assert sorted(s.batch_size for s in plan if s.section == "batch") == [1, 4, 16]


# ---------------------------------------------------------------------------------------
# ratios and goals


def test_ratio():
    assert ratio(3.0, 2.0) == 1.5
    for a, b in ((None, 1.0), (1.0, None), (1.0, 0.0), (float("nan"), 1.0), (1.0, -2.0)):
        assert ratio(a, b) is None


def test_compute_ratios_and_goals():
    meas = bench_grid({
        ("ensemble", 1): (200.0, 5.0), ("router_single", 1): (180.0, 5.4), ("router", 1): (150.0, 6.0),
        ("ensemble_pad512", 1): (10.0, 90.0),
        ("ensemble", 16): (400.0, 40.0), ("router_single", 16): (390.0, 41.0), ("router", 16): (100.0, 160.0),
        ("ensemble_pad512", 16): (20.0, 800.0), ("hand_bls", 1): (190.0, 5.2), ("hand_bls", 16): (400.0, 40.0),
    })
    meas.append({"section": "grid", "model": "router", "concurrency": 16, "error": "boom"})  # ignored
    acc = {"ensemble": {"accuracy_pct": 80.0}, "router": {"accuracy_pct": 79.5}}
    raw = {"classifier": {"p50_ms": 2.0}, "classifier_pad512": {"p50_ms": 45.0}, "classifier_fast": {"p50_ms": 0.5}}
    r = compute_ratios(meas, acc, raw)
    assert r["router_single_p50_c1_vs_ensemble"] == pytest.approx(1.08)
    assert r["router_single_throughput_c16_vs_ensemble"] == pytest.approx(0.975)
    assert r["router_throughput_c16_vs_ensemble_pad512"] == pytest.approx(5.0)
    assert r["router_throughput_c16_vs_ensemble"] == pytest.approx(0.25)
    assert r["ensemble_throughput_c16_vs_ensemble_pad512"] == pytest.approx(20.0)
    assert r["router_accuracy_points_vs_ensemble"] == pytest.approx(-0.5)
    assert r["ensemble_p50_c1_vs_raw"] == pytest.approx(2.5)
    assert r["ensemble_pad512_p50_c1_vs_raw"] == pytest.approx(2.0)
    assert r["router_p50_c1_vs_raw"] == pytest.approx(12.0)
    assert r["router_single_p50_c1_vs_hand_bls"] == pytest.approx(5.4 / 5.2)
    assert r["router_single_throughput_c16_vs_hand_bls"] == pytest.approx(0.975)
    goals = {g["key"]: g for g in evaluate_goals(r)}
    assert all(g["met"] for g in goals.values())
    r2 = dict(r, router_single_p50_c1_vs_ensemble=1.2, router_accuracy_points_vs_ensemble=-1.5,
              router_throughput_c16_vs_ensemble_pad512=None)
    goals = {g["key"]: g["met"] for g in evaluate_goals(r2)}
    assert goals == {
        "router_single_p50_c1_vs_ensemble": False,
        "router_single_throughput_c16_vs_ensemble": True,
        "router_single_p50_c1_vs_hand_bls": True,
        "router_single_throughput_c16_vs_hand_bls": True,
        "router_throughput_c16_vs_ensemble_pad512": None,
        "router_accuracy_points_vs_ensemble": False,
    }


def _round(model, r, p50, thr=100.0, stable=True, error=None, c=1):
    return {"section": "grid", "model": model, "dataset": "held_out", "concurrency": c, "batch_size": 1, "round": r,
            "throughput": thr, "p50_ms": p50, "p90_ms": 2 * p50, "p95_ms": 3 * p50, "p99_ms": 4 * p50,
            "stable": stable, "error": error, "throughput_spread_pct": 5.0 + r, "wall_s": 10.0, "load_1min": 1.0 + r,
            "command": f"pa round {r}", "interval_ms": 3000}


def test_combine_rounds_takes_medians_and_keeps_the_rounds():
    meas = [_round("ensemble", 0, 3.0, 300), _round("router_single", 0, 3.3, 280),
            _round("ensemble", 1, 2.0, 310), _round("router_single", 1, 2.4, 290, stable=False),
            _round("ensemble", 2, 4.0, 290), _round("router_single", 2, 9.9, 100, error="boom"),
            _round("ensemble", 0, 30.0, 500, c=16)]
    out = combine_rounds(meas)
    assert [(m["model"], m["concurrency"]) for m in out] == [("ensemble", 1), ("router_single", 1), ("ensemble", 16)]
    ens, single, c16 = out
    assert ens["p50_ms"] == 3.0 and ens["throughput"] == 300 and ens["p99_ms"] == 12.0 and ens["stable"] is True
    assert [m["round"] for m in ens["rounds"]] == [0, 1, 2] and ens["wall_s"] == 30.0 and ens["load_1min"] == 3.0
    assert ens["throughput_spread_pct"] == 7.0 and ens["command"] == "pa round 0"
    # the failed round is left out of the medians; one unstable round makes the level unstable
    assert single["p50_ms"] == pytest.approx(2.85) and single["stable"] is False and single["error"] is None
    assert "rounds" not in c16 and c16["p50_ms"] == 30.0
    all_failed = combine_rounds([_round("x", 0, 1.0, error="a"), _round("x", 1, 1.0, error="b")])[0]
    assert all_failed["error"] == "b" and "p50_ms" not in all_failed
    # paired ratios: per round, skipping rounds where either failed; the goal is their median
    assert paired_ratios(out, "router_single", "ensemble", "p50_ms", concurrency=1) == pytest.approx([1.1, 1.2])
    assert paired_ratios(out, "ensemble", "ensemble", "p50_ms", concurrency=16) == [1.0]
    r = compute_ratios(out, {}, {})
    assert r["router_single_p50_c1_vs_ensemble"] == pytest.approx(1.15)
    assert r["router_single_p50_c1_vs_ensemble_rounds"] == pytest.approx([1.1, 1.2])


def test_accuracy_summary_counts_routes():
    s = accuracy_summary([1, 0, 1, 0], [True, False, False, False], ["a", "b", "a", "a"])
    assert s == {"n": 4, "correct": 3, "accuracy_pct": 75.0, "routes": {"a": 3, "b": 1}}


def test_latency_summary():
    s = latency_summary([1.0, 2.0, 3.0, 4.0], rows=8)
    assert s["p50_ms"] == pytest.approx(2.5)
    assert s["throughput"] == pytest.approx(8 / 0.010)  # rows per second of summed call time


# ---------------------------------------------------------------------------------------
# the benchmark repository


def test_make_bench_repository_adds_the_variants(tmp_path):
    repo = make_bench_repository(tmp_path / "repo")
    tok = read_config(repo / "tokenizer_pad512" / "config.pbtxt")
    assert tok.name == "tokenizer_pad512"
    assert get_parameter(tok, "padding") == "max_length" and get_parameter(tok, "max_length") == "512"
    # everything else is the base's
    base = read_config(repo / "tokenizer" / "config.pbtxt")
    for key in ("padding", "max_length"):
        tok.parameters[key].string_value = base.parameters[key].string_value
    tok.name = "tokenizer"
    assert tok == base
    assert (repo / "tokenizer_pad512" / "1" / "vocab.txt").is_file()
    ens = read_config(repo / "ensemble_pad512" / "config.pbtxt")
    assert ens.name == "ensemble_pad512"
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["tokenizer_pad512", "classifier", "postprocess"]
    single = repo / "router_single"
    assert read_config(single / "config.pbtxt").name == "router_single"
    # the originals are untouched
    assert get_parameter(read_config(repo / "tokenizer" / "config.pbtxt"), "padding") == "longest"
    assert read_config(repo / "ensemble" / "config.pbtxt").ensemble_scheduling.step[0].model_name == "tokenizer"
    assert not list(repo.rglob("__pycache__"))
    # the copy is a valid repository: names, model.py files, ensemble steps against their models
    configs = check_repository(repo)
    assert repo / "ensemble_pad512" / "config.pbtxt" in configs


def test_router_single_policy_sends_every_text_to_classifier(tmp_path):
    policy = pytest.importorskip("orchestrator.runtime.routing.policy")
    repo = make_bench_repository(tmp_path / "repo")
    name = get_parameter(read_config(repo / "router_single" / "config.pbtxt"), "policy")
    parsed = policy.load_policy(repo / "router_single" / name)
    assert parsed.models() == ["classifier"]  # no classifier_fast; tokenizer inline, heads in-process
    bls = policy.load_policy(repo / "router_single_bls" / name)
    assert set(bls.models()) == {"tokenizer", "classifier"}  # the same tree, tokenizer through BLS
    assert bls.root == parsed.root
    single = yaml.safe_load((repo / "router_single" / name).read_text())
    base = yaml.safe_load((repo / "router" / name).read_text())
    assert single["root"] == SINGLE_CLASSIFIER_ROOT
    # the default policy's other settings are kept
    assert {k: v for k, v in single.items() if k not in ("root", "description")} == \
        {k: v for k, v in base.items() if k not in ("root", "description")}


def test_policy_root_variant_needs_a_policy_parameter(tmp_path):
    with pytest.raises(BenchError, match="variant r2 .*'policy' parameter"):
        make_bench_repository(tmp_path / "a", variants={"r2": {"base": "tokenizer", "policy_root": {}}})
    with pytest.raises(BenchError, match="variant r3 .*invalid policy"):
        make_bench_repository(tmp_path / "b", variants={"r3": {"base": "router", "policy_root": {"kind": "nope"}}})


def test_variant_errors_name_the_variant(tmp_path):
    with pytest.raises(BenchError, match="variant t2 .*'nope'"):
        make_bench_repository(tmp_path / "a", variants={"t2": {"base": "tokenizer", "parameters": {"nope": "1"}}})
    with pytest.raises(BenchError, match="variant x .*missing"):
        make_bench_repository(tmp_path / "b", variants={"x": {"base": "missing"}})
    with pytest.raises(BenchError, match="variant e2 .*model_name 'nope'"):
        make_bench_repository(tmp_path / "c", variants={"e2": {"base": "ensemble", "replace_models": {"nope": "x"}}})
    with pytest.raises(BenchError, match="already exists"):
        make_bench_repository(tmp_path / "c")


def test_variant_parameters_change_only_their_key(tmp_path):
    """A variant's parameter replaces that key's value only (not a key it prefixes)."""
    source = tmp_path / "src"
    (source / "m" / "1").mkdir(parents=True)
    (source / "m" / "1" / "model.py").write_text("")
    (source / "m" / "config.pbtxt").write_text(
        'name: "m"\nbackend: "python"\n'
        'parameters { key: "a" value: { string_value: "1" } }\nparameters { key: "ab" value: { string_value: "2" } }\n')
    repo = make_bench_repository(tmp_path / "repo", source, {"m2": {"base": "m", "parameters": {"a": "9"}}})
    config = read_config(repo / "m2" / "config.pbtxt")
    assert config.name == "m2"
    assert {k: v.string_value for k, v in config.parameters.items()} == {"a": "9", "ab": "2"}
    assert get_parameter(read_config(repo / "m" / "config.pbtxt"), "a") == "1"


# ---------------------------------------------------------------------------------------
# the report


def test_render_report_has_goals_tables_machine_and_placeholder():
    results = bench_results()
    text = render_report(results)
    assert "python -m lab.bench --out docs" in text and "Test CPU, 2 cores" in text and "2.51.0" in text
    assert results["ratios"]["router_single_p50_c1_vs_ensemble"] == pytest.approx(2 / 3)
    assert "| router (single-classifier) p50 latency at c=1 within 1.10x of ensemble | 0.67x | <= 1.10x | **met** |" in text
    assert "| default router accuracy within 1 point of the accurate classifier (ensemble) | -1.00 points | >= -1 points | **met** |" in text
    assert "failed: Thread [0] had error: boom" in text
    assert "no (3-window fallback)" in text
    assert "classifier_fast: 7" in text
    assert WHAT_WE_TRIED_START in text and WHAT_WE_TRIED_END in text
    block = text[text.index(WHAT_WE_TRIED_START):text.index(WHAT_WE_TRIED_END)]
    rows = [line for line in block.splitlines() if line.startswith("|")]
    assert len(rows) == 2  # header and separator only: no invented rows


def test_render_report_shows_the_rounds_and_the_paired_ratio():
    results = bench_results()
    meas = [m for m in results["measurements"] if not (m["section"] == "grid" and m["concurrency"] == 1)]
    rounds = [_round(m, r, p, 100.0) for r, ps in enumerate([(3.0, 3.3), (2.0, 2.4), (4.0, 4.0)])
              for m, p in zip(("ensemble", "router_single"), ps)]
    meas = combine_rounds(rounds) + meas
    ratios = compute_ratios(meas, results["accuracy"], results["raw"])
    results.update(measurements=meas, ratios=ratios, goals=evaluate_goals(ratios), plan={"grid_rounds": {1: 3}})
    text = render_report(results)
    assert "1.10x (median of 3 rounds: 1.10x, 1.20x, 1.00x) | <= 1.10x | **met** |" in text
    assert "| `router_single` | 1 | 100.0 | 3.30 | 6.60 | 13.20 | 1.00x | 1.10x | yes | 7% |" in text
    assert "| `router_single` | 1 | 3.30 | 2.40 | 4.00 |" in text
    assert "concurrency 1 in 3 such rounds" in text


def test_render_report_keeps_a_filled_what_we_tried_block():
    first = render_report(bench_results())
    filled = first.replace("|---|---|---|---|---|---|", "|---|---|---|---|---|---|\n| batching BLS calls | 1.05x | 0.97x | 4.1x | -0.2 | yes |")
    again = render_report(bench_results(), existing=filled)
    assert "| batching BLS calls | 1.05x | 0.97x | 4.1x | -0.2 | yes |" in again


def test_write_outputs_writes_report_json_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    report = write_outputs(bench_results(), tmp_path)
    assert report == tmp_path / "benchmarks.md"
    assert json.loads((tmp_path / "bench" / "results.json").read_text())["machine"]["cpu_model"] == "Test CPU"
    for name in ("latency", "throughput", "length", "batch"):
        assert (tmp_path / "bench" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_from_results_rerenders(tmp_path):
    pytest.importorskip("matplotlib")
    src = tmp_path / "results.json"
    src.write_text(json.dumps(bench_results()))
    assert main(["--from-results", str(src), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "benchmarks.md").is_file()
    assert main(["--from-results", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")]) == 1


# ---------------------------------------------------------------------------------------
# a real perf_analyzer run against the embedded server
