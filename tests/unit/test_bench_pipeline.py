"""The pure parts of the pipeline benchmark (``lab.bench.pipeline``): the plan, the input
data, the skipping pipeline's cost model, the three goals' decisions, the repository it
serves and its section."""

from __future__ import annotations

import pytest
import yaml

from lab.bench import pipeline as P
from lab.bench.report import KEPT_SECTIONS, PIPELINE_END, PIPELINE_START
from orchestrator.tooling.repository import read_config


def m(model, c, r, thr, p50, error=None):
    return {"model": model, "concurrency": c, "round": r, "throughput": thr, "p50_ms": p50, "p99_ms": 2 * p50, "error": error}


def rounds_of(n, hand=100.0, migrated=96.0, ens_p50=10.0, mig_p50=10.5, skip=None, spread=0.0, floor_p50=12.0, front_p50=13.0):
    """``n`` rounds: c_first 2 ms, c_second 6 ms, overhead 2 ms (skip_never 100/s): predicted 1/7 ms = 142.86/s."""
    out = []
    for r in range(n):
        wobble = 1.0 + spread * ((r % 3) - 1)
        out += [m("migrated", 16, r, migrated * wobble, 30.0), m("hand_pipeline", 16, r, hand, 30.0),
                m("ensemble", 16, r, 90.0, 30.0), m("migrated", 1, r, 50.0, mig_p50 * wobble),
                m("ensemble", 1, r, 50.0, ens_p50), m("hand_pipeline", 1, r, 50.0, 9.0),
                m("tokenizer", 16, r, 500.0, 5.0), m("classifier", 16, r, 1000.0 / 6, 5.0),
                m("skip_never", 16, r, 100.0, 5.0), m("skip_half", 16, r, skip if skip is not None else 1000.0 / 7, 5.0),
                m("migrated_serial", 16, r, 80.0, 40.0), m("hand_serial", 16, r, 100.0, 32.0),
                m("hand_ensemble", 1, r, 50.0, floor_p50), m("migrated_whole", 1, r, 50.0, front_p50),
                m("hand_ensemble", 16, r, 90.0, 30.0), m("migrated_whole", 16, r, 85.0, 30.0)]
    return out


def test_the_plan_rotates_the_models_each_round():
    specs = P.plan(3)
    assert len(specs) == 3 * (5 * 2 + 4 + 2)
    first = [(s.model, s.concurrency) for s in specs if s.round == 0]
    side = ["ensemble", "migrated", "hand_pipeline", "hand_ensemble", "migrated_whole"]
    assert first[:10] == [(x, 1) for x in side] + [(x, 16) for x in side]
    assert [s.model for s in specs if s.round == 1 and s.section == "pipeline"][:5] == side[1:] + side[:1]
    assert [s.model for s in specs if s.round == 1 and s.section == "cost"] == ["skip_never", "tokenizer", "classifier", "skip_half"]
    assert all(s.concurrency == 16 for s in specs if s.section in ("cost", "serial"))
    assert [s.model for s in specs if s.section == "serial"] == ["migrated_serial", "hand_serial", "hand_serial",
                                                                 "migrated_serial", "migrated_serial", "hand_serial"]
    assert {s.model: s.dataset for s in specs} == {"ensemble": "texts", "migrated": "texts", "hand_pipeline": "texts",
                                                  "hand_ensemble": "texts", "migrated_whole": "texts",
                                                  "skip_half": "texts", "skip_never": "texts", "tokenizer": "text_only",
                                                  "classifier": "tokens", "migrated_serial": "texts", "hand_serial": "texts"}


def test_the_split_is_the_median_token_count_and_the_share_the_texts_above_it():
    assert P.length_split([3, 5, 8, 9]) == (6, 0.5)
    assert P.length_split([4, 4, 4, 10]) == (4, 0.25)  # ties at the median stay below it
    with pytest.raises(ValueError):
        P.length_split([])


def test_the_skip_cost_model_on_known_inputs():
    c = P.skip_cost_model(t_first=500.0, t_second=1000.0 / 6, t_never=100.0, t_skip=130.0)
    assert c["c_first"] == pytest.approx(0.002) and c["c_second"] == pytest.approx(0.006)
    assert c["overhead"] == pytest.approx(0.002)
    assert c["predicted"] == pytest.approx(1 / 0.007) and c["ratio"] == pytest.approx(130.0 * 0.007)
    assert P.skip_cost_model(500.0, 1000.0 / 6, 100.0, 100.0, share=1.0)["ratio"] == pytest.approx(1.0)
    assert P.skip_cost_model(100.0, 100.0, 1000.0, 10.0)["predicted"] is None  # a negative overhead larger than the rest
    with pytest.raises(ValueError):
        P.skip_cost_model(0.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        P.skip_cost_model(1.0, 1.0, 1.0, 1.0, share=1.5)


def test_round_cost_models_need_every_model_in_a_round():
    ms = rounds_of(2) + [m("skip_half", 16, 2, 100.0, 5.0), m("tokenizer", 16, 3, 100.0, 5.0, error="x")]
    assert [r["round"] for r in P.round_cost_models(ms)] == [0, 1]
    assert P.cost_medians(ms) == {"share": 0.5, "c_first_ms": 2.0, "c_second_ms": 6.0, "overhead_ms": 2.0, "predicted": 142.9,
                                  "measured": 142.9}
    assert P.cost_medians([]) is None


def test_the_share_answered_comes_from_tritons_counts_and_feeds_the_cost_model():
    assert P.second_share({"skip_half": 10, "classifier": 100}, {"skip_half": 110, "classifier": 130}) == 0.3
    assert P.second_share({"skip_half": 10, "classifier": 100}, {"skip_half": 10, "classifier": 100}) is None
    ms = rounds_of(1)
    next(x for x in ms if x["model"] == "skip_half")["second_share"] = 0.25
    (r,) = P.round_cost_models(ms)
    assert r["share"] == 0.25 and r["predicted"] == pytest.approx(1 / (0.002 + 0.25 * 0.006 + 0.002))
    assert P.round_cost_models(rounds_of(1))[0]["share"] == 0.5  # no reading: the input data's share


def test_goals_met_not_met_and_undecided_with_rounds_to_decide():
    g = P.goals(rounds_of(8))
    assert g["throughput_c16_vs_hand"]["verdict"] == "met" and g["throughput_c16_vs_hand"]["median"] == 0.96
    assert g["p50_c1_vs_ensemble"]["verdict"] == "met" and g["p50_c1_vs_ensemble"]["per_round"] == [1.05] * 8
    assert g["skip_vs_cost_model"]["verdict"] == "met" and g["skip_vs_cost_model"]["median"] == 1.0
    assert g["serial_c16_vs_hand"]["verdict"] == "not met" and g["serial_c16_vs_hand"]["median"] == 0.8
    assert g["floor_p50_c1_vs_ensemble"]["verdict"] == "not met" and g["floor_p50_c1_vs_ensemble"]["median"] == 1.2
    assert g["whole_p50_c1_vs_ensemble"]["per_round"] == [1.3] * 8
    assert P.goals(rounds_of(8, floor_p50=10.5))["floor_p50_c1_vs_ensemble"]["verdict"] == "met"
    bad = P.goals(rounds_of(8, migrated=90.0, mig_p50=12.0, skip=100.0))
    assert [bad[k]["verdict"] for k in ("throughput_c16_vs_hand", "p50_c1_vs_ensemble", "skip_vs_cost_model")] == [
        "not met"] * 3
    close = P.goals(rounds_of(8, migrated=95.0, spread=0.05))  # the median on the goal, the interval across it
    assert close["throughput_c16_vs_hand"]["verdict"] == "not decided"
    few = P.goals(rounds_of(3))  # under 6 rounds: no interval, 6 would decide
    assert few["throughput_c16_vs_hand"]["verdict"] == "not decided"
    assert few["throughput_c16_vs_hand"]["rounds_needed"] == 6
    empty = P.goals([])["p50_c1_vs_ensemble"]
    assert (empty["n"], empty["median"], empty["verdict"], empty["per_round"]) == (0, None, "not decided", [])


def test_the_benchmark_repository_serves_the_models_side_by_side(tmp_path):
    repo = P.make_pipeline_repository(tmp_path / "repo", 21)
    assert read_config(repo / "migrated" / "config.pbtxt").max_batch_size == read_config(
        repo / "ensemble" / "config.pbtxt").max_batch_size
    migrated = yaml.safe_load((repo / "migrated" / "policy.yaml").read_text())
    hand = read_config(repo / "hand_pipeline" / "config.pbtxt")
    assert [s["model"] for s in migrated["pipeline"]["steps"]] == ["tokenizer", "classifier", "postprocess"]
    assert hand.name == "hand_pipeline" and hand.HasField("dynamic_batching")  # as the migrated router
    assert read_config(repo / "migrated" / "config.pbtxt").HasField("dynamic_batching")
    serial = read_config(repo / "hand_serial" / "config.pbtxt")
    assert serial.name == "hand_serial" and not serial.HasField("dynamic_batching")
    assert not read_config(repo / "migrated_serial" / "config.pbtxt").HasField("dynamic_batching")
    assert (repo / "hand_serial" / "1" / "model.py").read_text() == (repo / "hand_pipeline" / "1" / "model.py").read_text()
    assert [(i.name, list(i.dims)) for i in hand.input] == [("TEXT", [1]), ("THRESHOLD", [1])]
    floor = read_config(repo / "hand_ensemble" / "config.pbtxt")
    assert floor.name == "hand_ensemble" and floor.HasField("dynamic_batching")
    assert "model_name=\"ensemble\"" in (repo / "hand_ensemble" / "1" / "model.py").read_text()
    whole = yaml.safe_load((repo / "migrated_whole" / "policy.yaml").read_text())
    assert [(s["model"], s["inputs"], s["outputs"]) for s in whole["pipeline"]["steps"]] == [
        ("ensemble", {"TEXT": "TEXT", "THRESHOLD": "THRESHOLD"}, {"PROBABILITIES": "PROBABILITIES", "VERDICTS": "VERDICTS"})]
    assert read_config(repo / "migrated_whole" / "config.pbtxt").HasField("dynamic_batching")
    skip = yaml.safe_load((repo / "skip_half" / "policy.yaml").read_text())
    assert skip["pipeline"]["steps"][1]["when"] == {"shape": {"tensor": "input_ids", "dim": -1, "op": "gt", "value": 21}}
    assert skip["pipeline"]["steps"][1]["omit"] == ["logits"] and skip["pipeline"]["steps"][1]["scope"] == "request"
    assert "when" not in yaml.safe_load((repo / "skip_never" / "policy.yaml").read_text())["pipeline"]["steps"][1]
    from orchestrator.tooling.cli import main
    for name in ("skip_half", "skip_never", "migrated", "migrated_serial", "migrated_whole"):
        assert main(["policy", "check", str(repo / name / "policy.yaml"), "--repo", str(repo)]) == 0, name


def test_the_section_renders_the_goals_and_is_kept_across_runs():
    r = {"command": P.COMMAND, "started_utc": "2026-01-01 00:00", "machine": {"cores": 2, "cpu_model": "x"},
         "load_before": [1.0], "load_max_during": 2.0, "rounds": 8, "window_ms": 1000, "quick": True,
         "measurements": rounds_of(8), "split": 21, "share": 0.5, "goals": P.goals(rounds_of(8)), "cost_medians": P.cost_medians(rounds_of(8))}
    text = P.render_section(r)
    assert text.startswith(PIPELINE_START) and text.endswith(PIPELINE_END) and (PIPELINE_START, PIPELINE_END) in KEPT_SECTIONS
    assert "`--quick` run" in text
    assert "| 16 | `migrated` | 96.0 | 30.0 | 60.0 |" in text
    assert "`migrated` throughput at c=16 at least 0.95x `hand_pipeline`'s: median 0.96x over 8 rounds" in text
    assert "| 0.5 | 2.0 | 6.0 | 2.0 | 142.9 | 142.9 |" in text
    assert "**met**" in text
    assert "the second step for texts of more than 21 tokens: 0.5 of the held-out texts" in text
    assert "| `migrated_serial` | 80.0 | 40.0 |" in text
    assert "`migrated_serial` throughput at least 0.95x `hand_serial`'s: median 0.8x over 8 rounds" in text
    assert "`hand_ensemble` (one BLS call to the ensemble, nothing else: the floor of any Python-backend model in front of it) " \
           "p50 at c=1 against the same goal: median 1.2x over 8 rounds" in text
    assert "| 1 | `migrated_whole` | 50.0 | 13.0 | 26.0 |" in text
